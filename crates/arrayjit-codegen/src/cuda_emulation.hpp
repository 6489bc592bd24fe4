/* The CUDA execution model on the CPU, for arrayjit's `cuda_emu` backend: the kernels the CUDA
 * renderer writes, compiled as C++ by the host compiler and run block after block on the
 * calling thread.
 *
 * - A pass without barriers runs its threads one after the other.
 * - A pass with barriers (`__syncthreads`, warp shuffles) runs its block's threads as fibers
 *   (ucontext) on their own guarded stacks: each runs until its next barrier, and a barrier
 *   releases when every thread of the block that has not returned reaches it, as on a GPU.
 * - `__shared__` memory is per block: thread-local static storage that the block's fibers
 *   share (blocks of one launch run one after another; launches on other threads have their
 *   own).
 * - Warp shuffles exchange values through a per-block table, between two yields, so every lane
 *   of the warp has written before any reads.
 *
 * Floats follow the host's IEEE arithmetic without contraction (compiled with
 * -ffp-contract=off, as NVRTC runs with --fmad=false). */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <unistd.h>
#include <type_traits>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static thread_local
#define __restrict__ __restrict

struct aj_dim3 {
  unsigned x, y, z;
};

static thread_local aj_dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline float __int_as_float(int x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }

typedef void (*aj_thunk)(void *const *args, const long long *statics);

enum aj_fiber_state { AJ_RUNS = 0, AJ_AT_BARRIER = 1, AJ_AT_WARP = 2, AJ_RETURNED = 3 };

struct aj_fiber {
  ucontext_t context;
  int state;
};

struct aj_block {
  ucontext_t scheduler;
  aj_fiber *fibers;
  unsigned current;
  unsigned threads;
  unsigned long long *exchange; /* one slot per thread, for warp shuffles */
  aj_thunk thunk;
  void *const *args;
  const long long *statics;
};

/* The block whose fibers run on this thread (null while a pass without barriers runs). */
static thread_local aj_block *aj_running_block = 0;

static void aj_fiber_main(void) {
  aj_block *b = aj_running_block;
  b->thunk(b->args, b->statics);
  b->fibers[b->current].state = AJ_RETURNED;
  /* Returning resumes `uc_link`, the scheduler. */
}

static inline void aj_yield(int state) {
  aj_block *b = aj_running_block;
  aj_fiber *f = &b->fibers[b->current];
  f->state = state;
  swapcontext(&f->context, &b->scheduler);
}

static inline void __syncthreads(void) {
  if (aj_running_block) aj_yield(AJ_AT_BARRIER);
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  (void)mask;
  aj_block *b = aj_running_block;
  if (!b) return value; /* one thread at a time: no lane to read from */
  /* Warps are runs of 32 threads in linear order (x fastest), as on a GPU. */
  unsigned linear = b->current;
  unsigned lane = linear % 32u;
  unsigned warp_base = linear - lane;
  unsigned long long slot = 0;
  memcpy(&slot, &value, sizeof value);
  b->exchange[linear] = slot;
  aj_yield(AJ_AT_WARP); /* every lane has written */
  T result = value;
  if (lane + delta < 32u && warp_base + lane + delta < b->threads) {
    slot = b->exchange[warp_base + lane + delta];
    memcpy(&result, &slot, sizeof result);
  }
  aj_yield(AJ_AT_WARP); /* every lane has read */
  return result;
}

/* Bytes of each fiber's stack, and the guard page below it. */
static const size_t AJ_STACK_BYTES = 256 * 1024;

/* Sets threadIdx from a thread's linear index in its block (x fastest). */
static inline void aj_set_thread(unsigned t) {
  threadIdx.x = t % blockDim.x;
  threadIdx.y = (t / blockDim.x) % blockDim.y;
  threadIdx.z = t / (blockDim.x * blockDim.y);
}

/* Sets blockIdx from a block's linear index in the grid (x fastest). */
static inline void aj_set_block(unsigned long long g) {
  blockIdx.x = (unsigned)(g % gridDim.x);
  blockIdx.y = (unsigned)((g / gridDim.x) % gridDim.y);
  blockIdx.z = (unsigned)(g / ((unsigned long long)gridDim.x * gridDim.y));
}

/* Runs a pass: a grid of `grid` blocks of `block` threads, as fibers when `barriers` (the pass
 * synchronizes its threads). Returns 0, or -1 when the fibers' stacks cannot be allocated. */
static int aj_launch_dims(aj_thunk thunk, void *const *args, const long long *statics,
                          aj_dim3 grid, aj_dim3 block_dims, int barriers) {
  blockDim = block_dims;
  gridDim = grid;
  unsigned threads = block_dims.x * block_dims.y * block_dims.z;
  unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
  if (!barriers) {
    for (unsigned long long g = 0; g < blocks; ++g) {
      aj_set_block(g);
      for (unsigned t = 0; t < threads; ++t) {
        aj_set_thread(t);
        thunk(args, statics);
      }
    }
    return 0;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t each = AJ_STACK_BYTES + page;
  size_t bytes = each * threads + sizeof(aj_fiber) * threads +
                 sizeof(unsigned long long) * threads + page;
  unsigned char *memory =
      (unsigned char *)mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return -1;
  int status = 0;
  for (unsigned t = 0; t < threads; ++t) {
    /* A stack overflow faults on the guard page instead of corrupting a neighbour. */
    if (mprotect(memory + each * t, page, PROT_NONE) != 0) status = -1;
  }
  aj_fiber *fibers = (aj_fiber *)(memory + each * threads);
  unsigned long long *exchange = (unsigned long long *)(fibers + threads);
  aj_block block;
  block.fibers = fibers;
  block.threads = threads;
  block.exchange = exchange;
  block.thunk = thunk;
  block.args = args;
  block.statics = statics;
  aj_block *outer = aj_running_block;
  aj_running_block = &block;
  for (unsigned long long g = 0; g < blocks && status == 0; ++g) {
    aj_set_block(g);
    for (unsigned t = 0; t < threads; ++t) {
      aj_fiber *f = &fibers[t];
      getcontext(&f->context);
      f->context.uc_stack.ss_sp = memory + each * t + page;
      f->context.uc_stack.ss_size = AJ_STACK_BYTES;
      f->context.uc_link = &block.scheduler;
      makecontext(&f->context, aj_fiber_main, 0);
      f->state = AJ_RUNS;
    }
    for (;;) {
      /* One round: every thread that may run runs to its next barrier or its return. */
      for (unsigned t = 0; t < threads; ++t) {
        if (fibers[t].state != AJ_RUNS) continue;
        block.current = t;
        aj_set_thread(t);
        swapcontext(&block.scheduler, &fibers[t].context);
      }
      /* Warp exchanges release at once; a block barrier once nothing else is pending. */
      int warps = 0, waiting = 0;
      for (unsigned t = 0; t < threads; ++t) {
        warps |= fibers[t].state == AJ_AT_WARP;
        waiting |= fibers[t].state == AJ_AT_BARRIER;
      }
      int release = warps ? AJ_AT_WARP : waiting ? AJ_AT_BARRIER : -1;
      if (release < 0) break;
      for (unsigned t = 0; t < threads; ++t)
        if (fibers[t].state == release) fibers[t].state = AJ_RUNS;
    }
  }
  aj_running_block = outer;
  munmap(memory, bytes);
  return status;
}

/* A one-dimensional launch: `blocks` blocks of `threads` threads. */
static int aj_launch(aj_thunk thunk, void *const *args, const long long *statics,
                     unsigned blocks, unsigned threads, int barriers) {
  aj_dim3 grid = {blocks, 1u, 1u};
  aj_dim3 block = {threads, 1u, 1u};
  return aj_launch_dims(thunk, args, statics, grid, block, barriers);
}

/* Calls a hand-written kernel from the buffers and statics arrays: each pointer parameter takes
 * the next buffer, each integer parameter the next static index. */
template <class P>
static inline P aj_source_arg(void *const *buffers, const long long *statics, unsigned *b,
                              unsigned *s) {
  if constexpr (std::is_pointer_v<P>) {
    return (P)buffers[(*b)++];
  } else {
    return (P)statics[(*s)++];
  }
}

template <class... P>
static inline void aj_call_source(void (*kernel)(P...), void *const *buffers,
                                  const long long *statics) {
  unsigned b = 0, s = 0;
  /* Braced initialization evaluates the arguments left to right. */
  struct aj_args {
    void (*kernel)(P...);
    aj_args(void (*k)(P...), P... a) : kernel(k) { k(a...); }
  };
  aj_args{kernel, aj_source_arg<P>(buffers, statics, &b, &s)...};
}
