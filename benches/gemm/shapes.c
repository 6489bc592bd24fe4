/* Times the blocked product's C helper (`gemm_entry`, printed by the `gemm_helper` example) on
   the products of one GPT training step at the four sizes of `arrayjit bench`'s GPT size axis,
   each weighted by its calls per step, and on square matmuls. Usage: shapes WORKERS.
   Prints one line: per size, the products' time per step (ms) and rate (GFLOP/s), best of a
   few calls per shape. Two or more workers run on a spinning pool like the CPU backends'.
   Run by scripts/gemm-blocking.sh, which interleaves blockings to see through a noisy host. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct aj_par {
  const void *pool;
  void (*run)(const void *pool, void (*chunk)(void *ctx, int64_t index), void *ctx, int64_t chunks);
  int64_t workers;
} aj_par;
void gemm_entry(int64_t M, int64_t N, int64_t K, const float *A, int64_t rsA, int64_t csA,
                const float *B, int64_t rsB, int64_t csB, float *C, int64_t rsC, int64_t csC,
                int ovw, const int64_t *guard, const aj_par *par);

#define MAX_WORKERS 64
static void (*job_chunk)(void *, int64_t);
static void *job_ctx;
static int64_t job_chunks, workers = 1;
static atomic_long generation, finished;

/* Worker w runs chunks w, w + workers, ... of each new generation, then reports it done. */
static void *worker(void *arg) {
  const int64_t w = (int64_t)(intptr_t)arg;
  long seen = 0;
  for (;;) {
    long g;
    while ((g = atomic_load(&generation)) == seen) __builtin_ia32_pause();
    seen = g;
    for (int64_t i = w; i < job_chunks; i += workers) job_chunk(job_ctx, i);
    atomic_fetch_add(&finished, 1);
  }
  return 0;
}

static void run(const void *pool, void (*chunk)(void *, int64_t), void *ctx, int64_t chunks) {
  (void)pool;
  job_chunk = chunk, job_ctx = ctx, job_chunks = chunks;
  atomic_store(&finished, 0);
  atomic_fetch_add(&generation, 1);
  for (int64_t i = 0; i < chunks; i += workers) chunk(ctx, i);
  while (atomic_load(&finished) != workers - 1) __builtin_ia32_pause();
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct { int64_t M, N, K, rsA, csA, rsB, csB, calls; } shape;

/* The best time of `reps` calls of one product (row-major C). */
static double best_of(const shape *s, const float *A, const float *B, float *C, const aj_par *par, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    gemm_entry(s->M, s->N, s->K, A, s->rsA, s->csA, B, s->rsB, s->csB, C, s->N, 1, 1, 0, par);
    const double t = now() - t0;
    if (t < best) best = t;
  }
  return best;
}

int main(int argc, char **argv) {
  workers = argc > 1 ? atol(argv[1]) : 1;
  if (workers < 1 || workers > MAX_WORKERS) {
    fprintf(stderr, "usage: shapes WORKERS (1 to %d)\n", MAX_WORKERS);
    return 1;
  }
  for (int64_t w = 1; w < workers; ++w) {
    pthread_t t;
    if (pthread_create(&t, 0, worker, (void *)(intptr_t)w)) return 1;
  }
  const aj_par pool = {0, run, workers}, *par = workers > 1 ? &pool : 0;
  const size_t elems = 3072 * 3072;
  float *A = aligned_alloc(64, elems * 4), *B = aligned_alloc(64, elems * 4), *C = aligned_alloc(64, elems * 4);
  if (!A || !B || !C) return 1;
  for (size_t i = 0; i < elems; ++i) A[i] = (i % 7) * 0.1f, B[i] = (i % 5) * 0.1f, C[i] = 0;
  /* tokens, width, hidden width, layers of bench's GPT sizes d128, d256, d384, d768 */
  const int64_t sizes[4][4] = {{1024, 128, 512, 2}, {2048, 256, 1024, 4}, {2048, 384, 1536, 6}, {1024, 768, 3072, 12}};
  for (int z = 0; z < 4; ++z) {
    const int64_t n = sizes[z][0], d = sizes[z][1], f = sizes[z][2], layers = sizes[z][3];
    /* Per layer: q, k, v and the projection (forward, input gradient, weight gradient), then
       the two MLP products the same three ways. */
    const shape s[] = {
        {n, d, d, d, 1, d, 1, 4}, {n, d, d, d, 1, 1, d, 4}, {d, d, n, 1, d, d, 1, 4},
        {n, f, d, d, 1, f, 1, 1}, {n, f, d, d, 1, 1, d, 1}, {d, f, n, 1, d, f, 1, 1},
        {n, d, f, f, 1, d, 1, 1}, {n, d, f, f, 1, 1, f, 1}, {f, d, n, 1, f, d, 1, 1},
    };
    double total = 0, flops = 0;
    for (unsigned i = 0; i < sizeof s / sizeof s[0]; ++i) {
      total += best_of(&s[i], A, B, C, par, 5) * s[i].calls * layers;
      flops += 2.0 * s[i].M * s[i].N * s[i].K * s[i].calls * layers;
    }
    printf("d%ld %8.1f ms %6.1f GF/s   ", (long)d, total * 1e3, flops / total * 1e-9);
  }
  for (int64_t n = 512; n <= 2048; n *= 2) {
    const shape sq = {n, n, n, n, 1, n, 1, 1};
    const double t = best_of(&sq, A, B, C, par, n == 2048 ? 3 : 7);
    printf("mm%ld %7.2f ms %6.1f GF/s   ", (long)n, t * 1e3, 2.0 * n * n * n / t * 1e-9);
  }
  printf("\n");
  return 0;
}
