/* What the harnesses of the CPU product helper share (benches/gemm/shapes.c, attention.c):
   the helper's entry (`gemm_entry`, printed by the `gemm_helper` example), a spinning pool of
   workers like the CPU backends', and a clock. `start_workers(argc, argv, usage)` reads WORKERS. */
#ifndef AJ_GEMM_BENCH_COMMON_H
#define AJ_GEMM_BENCH_COMMON_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define AJ_SPIN_PAUSE() __builtin_ia32_pause()
#else
#define AJ_SPIN_PAUSE() ((void)0)
#endif

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
    while ((g = atomic_load(&generation)) == seen) AJ_SPIN_PAUSE();
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
  while (atomic_load(&finished) != workers - 1) AJ_SPIN_PAUSE();
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Reads WORKERS from the command line and starts the pool's other threads; returns the pool
   handle for the helper (NULL for one worker), or exits with a usage message. */
static const aj_par *start_workers(int argc, char **argv, const char *usage) {
  static aj_par pool;
  workers = argc > 1 ? atol(argv[1]) : 1;
  if (workers < 1 || workers > MAX_WORKERS) {
    fprintf(stderr, "usage: %s (WORKERS from 1 to %d)\n", usage, MAX_WORKERS);
    exit(1);
  }
  for (int64_t w = 1; w < workers; ++w) {
    pthread_t t;
    if (pthread_create(&t, 0, worker, (void *)(intptr_t)w)) exit(1);
  }
  pool = (aj_par){0, run, workers};
  return workers > 1 ? &pool : 0;
}
#endif
