/* The machine's limits for arrayjit's benchmark table, measured in the same run: peak f32 FMA
 * throughput, triad bandwidth (a = b + s*c) and read bandwidth (a sum), on one thread and on
 * all of them. Built by `arrayjit bench` with the system C compiler (-O3 -march=native
 * -pthread). Prints `name value` lines. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef float vf __attribute__((vector_size(LANES * 4)));
#define ACC 12

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

typedef struct {
  int kind; /* 0 fma, 1 triad, 2 read */
  long n;   /* elements (or iterations for fma) */
  float *a, *b, *c;
  double result;
  double began, ended; /* this thread's own clock readings around its work */
  pthread_barrier_t *start;
} job;

static void *work(void *p) {
  job *j = p;
  pthread_barrier_wait(j->start);
  j->began = now();
  if (j->kind == 0) {
    /* 12 independent FMA chains in registers: enough to cover latency × ports everywhere. */
    vf m, c;
    for (int k = 0; k < LANES; k++) { m[k] = 0.999999f; c[k] = 1e-7f; }
    vf a0 = m, a1 = m * 2, a2 = m * 3, a3 = m * 4, a4 = m * 5, a5 = m * 6;
    vf a6 = m * 7, a7 = m * 8, a8 = m * 9, a9 = m * 10, a10 = m * 11, a11 = m * 12;
    for (long it = 0; it < j->n; it++) {
      a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c;
      a4 = a4 * m + c; a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c;
      a8 = a8 * m + c; a9 = a9 * m + c; a10 = a10 * m + c; a11 = a11 * m + c;
    }
    vf t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    float s = 0;
    for (int k = 0; k < LANES; k++) s += t[k];
    j->result = s;
  } else if (j->kind == 1) {
    float *restrict a = j->a, *restrict b = j->b, *restrict c = j->c;
    for (long i = 0; i < j->n; i++) a[i] = b[i] + 3.0f * c[i];
    j->result = a[j->n / 2];
  } else {
    const float *restrict a = j->a;
    float s[4 * LANES] = {0};
    long i = 0;
    for (; i + 4 * LANES <= j->n; i += 4 * LANES)
      for (int k = 0; k < 4 * LANES; k++) s[k] += a[i + k];
    float t = 0;
    for (int k = 0; k < 4 * LANES; k++) t += s[k];
    for (; i < j->n; i++) t += a[i];
    j->result = t;
  }
  j->ended = now();
  return NULL;
}

/* Best of `reps` timings of `kind` over `threads` threads, each on its slice. A run lasts from
 * the first worker's start to the last one's end, as the workers read the clock: the main
 * thread's own reading after the barrier could come after the workers had finished (with as
 * many workers as cores it may not run until they do), which read 1 µs runs. */
static double run(int kind, int threads, long n, float *a, float *b, float *c, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    pthread_t t[256];
    job jobs[256];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads + 1);
    long per = kind == 0 ? n : n / threads;
    for (int k = 0; k < threads; k++) {
      jobs[k] = (job){kind, per, a ? a + k * per : 0, b ? b + k * per : 0, c ? c + k * per : 0, 0, 0, 0, &start};
      pthread_create(&t[k], NULL, work, &jobs[k]);
    }
    pthread_barrier_wait(&start);
    for (int k = 0; k < threads; k++) pthread_join(t[k], NULL);
    double began = jobs[0].began, ended = jobs[0].ended;
    for (int k = 1; k < threads; k++) {
      if (jobs[k].began < began) began = jobs[k].began;
      if (jobs[k].ended > ended) ended = jobs[k].ended;
    }
    double dt = ended - began;
    pthread_barrier_destroy(&start);
    if (dt < best) best = dt;
  }
  return best;
}

int main(int argc, char **argv) {
  int all = argc > 1 ? atoi(argv[1]) : 1;
  if (all < 1 || all > 256) all = 1;
  /* Arrays of twice the last-level cache (argv[2], bytes), at least 128 MiB: memory, not cache. */
  long llc = argc > 2 ? atol(argv[2]) : 0;
  long fma_iters = 20000000;
  long n = 32L << 20;
  if (llc > 0 && 2 * llc / 4 > n) n = 2 * llc / 4;
  n = n / 256 * 256;
  float *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4), *c = aligned_alloc(64, n * 4);
  if (!a || !b || !c) { fprintf(stderr, "out of memory\n"); return 1; }
  for (long i = 0; i < n; i++) { a[i] = 0; b[i] = (float)(i & 1023); c[i] = 1.0f; }
  int counts[2] = {1, all};
  for (int k = 0; k < (all > 1 ? 2 : 1); k++) {
    int th = counts[k];
    const char *tag = k == 0 ? "1" : "all";
    double dt = run(0, th, fma_iters, 0, 0, 0, 3);
    printf("fma_gflops_%s %.2f\n", tag, 2.0 * ACC * LANES * fma_iters * th / dt / 1e9);
    dt = run(1, th, n, a, b, c, 3);
    printf("triad_gbs_%s %.2f\n", tag, 3.0 * 4 * n / dt / 1e9);
    dt = run(2, th, n, a, 0, 0, 3);
    printf("read_gbs_%s %.2f\n", tag, 4.0 * n / dt / 1e9);
  }
  if (all == 1) {
    printf("fma_gflops_all -1\ntriad_gbs_all -1\nread_gbs_all -1\n");
  }
  printf("simd_lanes %d\n", LANES);
  return 0;
}
