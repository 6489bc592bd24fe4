/* Times the blocked product's C helper (`gemm_entry`, printed by the `gemm_helper` example) on
   the products of one GPT training step at the four sizes of `arrayjit bench`'s GPT size axis,
   each weighted by its calls per step, and on square matmuls. Usage: shapes WORKERS.
   Prints one line: per size, the products' time per step (ms) and rate (GFLOP/s), best of a
   few calls per shape. Two or more workers run on a spinning pool like the CPU backends'.
   Run by scripts/gemm-blocking.sh, which interleaves blockings to see through a noisy host. */
#include "common.h"

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
  const aj_par *par = start_workers(argc, argv, "shapes WORKERS");
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
