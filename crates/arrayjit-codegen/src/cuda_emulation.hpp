/* The CUDA execution model on the CPU, for arrayjit's `cuda_emu` backend: the kernels the CUDA
 * renderer writes, compiled as C++ by the host compiler and run block after block on the
 * calling thread.
 *
 * - A pass without barriers runs its threads one after the other.
 * - A pass with barriers (`__syncthreads`, warp shuffles) runs its block's threads as fibers
 *   on their own guarded stacks (kept from launch to launch): each runs until its next
 *   barrier, and a barrier releases when every thread of the block that has not returned
 *   reaches it, as on a GPU. Fibers switch by swapping stack pointers on x86-64, by ucontext
 *   elsewhere.
 * - `__shared__` memory is per block: thread-local static storage that the block's fibers
 *   share (blocks of one launch run one after another; launches on other threads have their
 *   own).
 * - Warp shuffles exchange values through a per-block table, between two yields, so every lane
 *   of the warp has written before any reads.
 *
 * - Matrix-unit operations (`ldmatrix`, `mma.sync`) are warp collectives on the same table:
 *   each lane publishes its operands (a row address, its fragment words), and after every lane
 *   of the warp has, each computes its own results from the lanes that hold them, in the
 *   fragment layouts of the PTX ISA. A fragment product adds its terms in the order of `k`
 *   (the hardware's order is its own: results agree to f32 rounding of the sums).
 * - Asynchronous copies (`cp.async`) land when a `cp.async.wait_group` requires them, not
 *   before, so a pipeline that reads a buffer too early fails here as on a GPU.
 * - Bulk tensor copies (sm_90's tensor memory accelerator) land when a thread waits on the
 *   mbarrier they complete on, not before; a wait that can never complete (a phase armed
 *   with more bytes than its copies bring, or never armed) ends the launch with an error
 *   where a GPU would hang.
 *
 * Floats follow the host's IEEE arithmetic without contraction (compiled with
 * -ffp-contract=off, as NVRTC runs with --fmad=false). */
#define AJ_CUDA_EMULATION 1
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <unistd.h>
#include <type_traits>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __restrict__ __restrict
#define __grid_constant__

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

/* Switching fibers. On x86-64, a switch saves the callee-saved registers and the floating-point
 * control words on the fiber's own stack and swaps stack pointers (no system call); elsewhere
 * it is ucontext's swapcontext, which also saves the signal mask (a system call per switch). */
#if defined(__x86_64__)
#define AJ_FAST_SWITCH 1
/* aj_fiber_switch(save, to): stores the current stack pointer in *save and resumes the fiber
 * (or scheduler) whose stack pointer is `to`. */
extern "C" void aj_fiber_switch(void **save, void *to) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".globl aj_fiber_switch\n"
        ".hidden aj_fiber_switch\n"
        ".type aj_fiber_switch, @function\n"
        "aj_fiber_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size aj_fiber_switch, .-aj_fiber_switch\n");
#else
#define AJ_FAST_SWITCH 0
#endif

struct aj_fiber {
#if AJ_FAST_SWITCH
  void *sp;
#else
  ucontext_t context;
#endif
  int state;
};

struct aj_block {
#if AJ_FAST_SWITCH
  void *scheduler_sp;
#else
  ucontext_t scheduler;
#endif
  aj_fiber *fibers;
  unsigned current;
  unsigned threads;
  unsigned long long *exchange; /* one slot per thread for warp shuffles, then four per thread
                                   for matrix operations */
  aj_thunk thunk;
  void *const *args;
  const long long *statics;
};

/* The block whose fibers run on this thread (null while a pass without barriers runs). */
static thread_local aj_block *aj_running_block = 0;

/* From the running fiber back to the scheduler. */
static inline void aj_to_scheduler(aj_block *b, aj_fiber *f) {
#if AJ_FAST_SWITCH
  aj_fiber_switch(&f->sp, b->scheduler_sp);
#else
  swapcontext(&f->context, &b->scheduler);
#endif
}

/* From the scheduler to fiber `f`. */
static inline void aj_to_fiber(aj_block *b, aj_fiber *f) {
#if AJ_FAST_SWITCH
  aj_fiber_switch(&b->scheduler_sp, f->sp);
#else
  swapcontext(&b->scheduler, &f->context);
#endif
}

static void aj_fiber_main(void) {
  aj_block *b = aj_running_block;
  b->thunk(b->args, b->statics);
  b->fibers[b->current].state = AJ_RETURNED;
#if AJ_FAST_SWITCH
  aj_to_scheduler(b, &b->fibers[b->current]);
  __builtin_trap(); /* a returned fiber is never resumed */
#endif
  /* (ucontext) Returning resumes `uc_link`, the scheduler. */
}

/* Makes `f` start at aj_fiber_main on the stack [stack, stack + size) (16-byte aligned top). */
static inline void aj_fiber_start(aj_block *b, aj_fiber *f, unsigned char *stack, size_t size) {
#if AJ_FAST_SWITCH
  (void)b;
  unsigned long long *top = (unsigned long long *)((uintptr_t)(stack + size) & ~(uintptr_t)15);
  /* As aj_fiber_switch leaves a stack: control words, r15..r12, rbx, rbp, then the address it
   * returns to; above it a null return address for aj_fiber_main (entered as if called). */
  unsigned int control[2] = {0, 0};
  __asm__ volatile("stmxcsr %0\n  fnstcw %1" : "=m"(control[0]), "=m"(control[1]));
  top[-1] = 0;
  top[-2] = (unsigned long long)(uintptr_t)&aj_fiber_main;
  for (int r = 3; r <= 8; ++r) top[-r] = 0;
  memcpy(&top[-9], control, 8);
  f->sp = &top[-9];
#else
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = stack;
  f->context.uc_stack.ss_size = size;
  f->context.uc_link = &b->scheduler;
  makecontext(&f->context, aj_fiber_main, 0);
#endif
}

static inline void aj_yield(int state) {
  aj_block *b = aj_running_block;
  aj_fiber *f = &b->fibers[b->current];
  f->state = state;
  aj_to_scheduler(b, f);
}

static inline void __syncthreads(void) {
  if (aj_running_block) aj_yield(AJ_AT_BARRIER);
}

/* A warp shuffle: every lane writes `value`, then reads the one lane `from_lane(lane)` of its
   warp wrote (its own value where that lane is outside the warp or the block). */
template <class T, class F>
static inline T aj_shfl(T value, F from_lane) {
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
  unsigned from = from_lane(lane);
  if (from < 32u && warp_base + from < b->threads) {
    slot = b->exchange[warp_base + from];
    memcpy(&result, &slot, sizeof result);
  }
  aj_yield(AJ_AT_WARP); /* every lane has read */
  return result;
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  (void)mask;
  return aj_shfl(value, [delta](unsigned lane) { return lane + delta; });
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  (void)mask;
  return aj_shfl(value, [lane_mask](unsigned lane) { return lane ^ (unsigned)lane_mask; });
}

/* The running lane's four matrix-operation slots, the warp's first lane, and the lane. */
static inline unsigned long long *aj_matrix_slots(unsigned *base, unsigned *lane) {
  aj_block *b = aj_running_block;
  unsigned linear = b->current;
  *lane = linear % 32u;
  *base = linear - *lane;
  return b->exchange + b->threads;
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8i + r gives row r of matrix i;
 * word i of each lane is row lane / 4 of matrix i, elements 2 (lane % 4) and the next (the
 * lower one in the low half); transposed, column lane / 4, rows 2 (lane % 4) and the next. */
static inline void aj_ldmatrix_any(uint32_t *r, const void *p, int trans) {
  unsigned base, lane;
  unsigned long long *x = aj_matrix_slots(&base, &lane);
  x[4 * (base + lane)] = (unsigned long long)(uintptr_t)p;
  aj_yield(AJ_AT_WARP); /* every lane has given its row */
  for (unsigned i = 0; i < 4; ++i) {
    const uint16_t *row0, *row1;
    unsigned c0, c1;
    if (!trans) {
      row0 = row1 = (const uint16_t *)(uintptr_t)x[4 * (base + 8 * i + lane / 4)];
      c0 = 2 * (lane % 4);
      c1 = c0 + 1;
    } else {
      row0 = (const uint16_t *)(uintptr_t)x[4 * (base + 8 * i + 2 * (lane % 4))];
      row1 = (const uint16_t *)(uintptr_t)x[4 * (base + 8 * i + 2 * (lane % 4) + 1)];
      c0 = c1 = lane / 4;
    }
    r[i] = (uint32_t)row0[c0] | ((uint32_t)row1[c1] << 16);
  }
  aj_yield(AJ_AT_WARP); /* every lane has read */
}
static inline void aj_ldmatrix_x4(uint32_t *r, const void *p) { aj_ldmatrix_any(r, p, 0); }
static inline void aj_ldmatrix_x4_trans(uint32_t *r, const void *p) { aj_ldmatrix_any(r, p, 1); }

static inline float aj_emu_bits_to_float(uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* The value of a 16-bit element: bf16 (kind 0) or IEEE half (kind 1). */
static inline float aj_emu_half(uint32_t h, int kind) {
  if (kind == 0) return aj_emu_bits_to_float(h << 16);
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1fu) bits = sign | 0x7f800000u | (mant << 13);
  else if (exp != 0) bits = sign | ((exp + 112u) << 23) | (mant << 13);
  else if (mant == 0) bits = sign;
  else {
    uint32_t e = 0;
    while (!(mant & 0x400u)) { mant <<= 1; e++; }
    bits = sign | ((113u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return aj_emu_bits_to_float(bits);
}

/* mma.sync.aligned.{m16n8k16 (kind 0: bf16, 1: f16), m16n8k8 (kind 2: tf32)}.row.col.f32:
 * d[0..4] += A · B on the warp's fragments. Lane l (group g = l / 4, t = l % 4) holds
 * - 16-bit A: words (row g, k 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8), two elements each;
 *   B: words (k 2t, col g), (2t + 8, g);
 * - TF32 A: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); B: (t, g), (t + 4, g);
 * - D: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). */
static inline void aj_mma_any(float *d, const uint32_t *a, const uint32_t *b, int kind) {
  unsigned base, lane;
  unsigned long long *x = aj_matrix_slots(&base, &lane);
  unsigned long long *mine = x + 4 * (base + lane);
  mine[0] = (unsigned long long)a[0] | ((unsigned long long)a[1] << 32);
  mine[1] = (unsigned long long)a[2] | ((unsigned long long)a[3] << 32);
  mine[2] = (unsigned long long)b[0] | ((unsigned long long)b[1] << 32);
  aj_yield(AJ_AT_WARP); /* every lane has given its fragments */
  unsigned depth = kind == 2 ? 8u : 16u;
  float out[4];
  for (unsigned e = 0; e < 4; ++e) {
    unsigned row = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
    float acc = d[e];
    for (unsigned k = 0; k < depth; ++k) {
      float av, bv;
      if (kind == 2) {
        unsigned aw = (k >= 4 ? 2u : 0u) + (row >= 8 ? 1u : 0u), bw = k >= 4 ? 1u : 0u;
        unsigned long long *al = x + 4 * (base + (row % 8) * 4 + k % 4);
        unsigned long long *bl = x + 4 * (base + col * 4 + k % 4);
        av = aj_emu_bits_to_float((uint32_t)(al[aw / 2] >> (32 * (aw % 2))));
        bv = aj_emu_bits_to_float((uint32_t)(bl[2] >> (32 * bw)));
      } else {
        unsigned aw = (k >= 8 ? 2u : 0u) + (row >= 8 ? 1u : 0u), bw = k >= 8 ? 1u : 0u;
        unsigned long long *al = x + 4 * (base + (row % 8) * 4 + (k % 8) / 2);
        unsigned long long *bl = x + 4 * (base + col * 4 + (k % 8) / 2);
        uint32_t aword = (uint32_t)(al[aw / 2] >> (32 * (aw % 2)));
        uint32_t bword = (uint32_t)(bl[2] >> (32 * bw));
        av = aj_emu_half((aword >> (16 * (k % 2))) & 0xffffu, kind);
        bv = aj_emu_half((bword >> (16 * (k % 2))) & 0xffffu, kind);
      }
      acc = acc + av * bv;
    }
    out[e] = acc;
  }
  aj_yield(AJ_AT_WARP); /* every lane has read */
  for (unsigned e = 0; e < 4; ++e) d[e] = out[e];
}
static inline void aj_mma_bf16(float *d, const uint32_t *a, const uint32_t *b) { aj_mma_any(d, a, b, 0); }
static inline void aj_mma_f16(float *d, const uint32_t *a, const uint32_t *b) { aj_mma_any(d, a, b, 1); }
static inline void aj_mma_tf32(float *d, const uint32_t *a, const uint32_t *b) { aj_mma_any(d, a, b, 2); }

/* Warpgroup products (wgmma.mma_async, sm_90: m64nNk16 of 16-bit factors, kinds 0 and 1;
 * m64nNk8 of TF32 ones, kind 2) read from shared memory: each lane computes its own
 * accumulators (lane l of warp w of the warpgroup holds, for r < N/2, row 16w + l/4 +
 * 8((r/2)%2), column 8(r/4) + 2(l%4) + r%2), from the factors' canonical layouts decoded from
 * their first elements as the descriptors the CUDA code builds describe them, for a staged
 * depth d of e-byte elements (e·d = 64 or 128): `k` contiguous: rows of e·d bytes, 8-row
 * groups 8e·d bytes apart, the swizzle of the row's width (64 bytes: address bits 4-5 ^= bits
 * 7-8; 128 bytes: bits 4-6 ^= bits 7-9); result side contiguous (16-bit factors only): 128-byte
 * rows of 64 elements, 8-row groups 1024 bytes apart, 64-element blocks 128d bytes apart, the
 * 128-byte swizzle. A TF32 element's low 13 bits are not read (the kernels round while staging).
 * The swizzles act on addresses, as the hardware's do: staged arrays start on
 * 1 KiB boundaries. A product runs when a wgmma.wait_group requires it (as late as the PTX ISA
 * lets the hardware read its operands and write its accumulators), not when issued: a kernel
 * that refills a buffer, or touches the accumulators, before waiting for the products that
 * read them computes with the wrong values here too. Each thread of a block has its queue of
 * products (see the asynchronous copies below). */
static inline void aj_fence_async_proxy(void) {}
static inline void aj_wgmma_fence(void) {}

/* Bytes of one staged element of a warpgroup factor of `kind`. */
static inline unsigned aj_wgmma_element_bytes(int kind) { return kind == 2 ? 4u : 2u; }

/* The value of element (mn, k) of a warpgroup factor of `kind` whose first staged element is
 * at `p`. */
static inline float aj_wgmma_element(const void *p, int kind, int side_major, unsigned depth,
                                     unsigned mn, unsigned k) {
  const uintptr_t e = aj_wgmma_element_bytes(kind);
  uintptr_t a = (uintptr_t)p;
  if (!side_major) {
    const uintptr_t row = e * depth;
    a += (mn % 8) * row + (mn / 8) * 8u * row + k * e;
    a ^= ((a >> 7) & (row / 16u - 1u)) << 4;
  } else {
    a += (mn % 64) * 2 + (mn / 64) * 128u * depth + (k % 8) * 128 + (k / 8) * 1024;
    a ^= ((a >> 7) & 7u) << 4;
  }
  if (kind == 2) {
    uint32_t w;
    memcpy(&w, (const void *)a, 4);
    return aj_emu_bits_to_float(w & 0xffffe000u);
  }
  uint16_t h;
  memcpy(&h, (const void *)a, 2);
  return aj_emu_half(h, kind);
}

static inline void aj_emu_wgmma_run(float *d, const void *a, const void *b, int kind, unsigned n,
                                    int a_side_major, int b_side_major, unsigned depth) {
  aj_block *blk = aj_running_block;
  unsigned linear = blk ? blk->current : 0;
  unsigned lane = linear % 32u, warp = (linear % 128u) / 32u;
  /* TF32 factors are only `k`-major: any other layout makes every result NaN. */
  const int valid = kind != 2 || (!a_side_major && !b_side_major);
  const unsigned kdepth = kind == 2 ? 8u : 16u;
  for (unsigned r = 0; r < n / 2; ++r) {
    unsigned row = 16 * warp + lane / 4 + 8 * ((r / 2) % 2);
    unsigned col = 8 * (r / 4) + 2 * (lane % 4) + r % 2;
    float acc = d[r];
    for (unsigned k = 0; k < kdepth; ++k)
      acc = acc + aj_wgmma_element(a, kind, a_side_major, depth, row, k) *
                      aj_wgmma_element(b, kind, b_side_major, depth, col, k);
    d[r] = valid ? acc : NAN;
  }
}

/* Operations that complete in committed groups (cp.async copies, wgmma products), per thread
 * of a block (indexed by its linear index in the block): an operation completes
 * (`Op::complete`) when a wait for its group requires it, as late as the PTX ISA allows, or,
 * past N in flight on one thread, the oldest early. Where the queues cannot be allocated,
 * operations complete when issued. */
enum { AJ_MAX_BLOCK_THREADS = 1024 };
template <class Op, unsigned N>
struct aj_group_queue {
  unsigned committed, count;
  Op ops[N];
};
template <class Op, unsigned N>
struct aj_group_queues {
  aj_group_queue<Op, N> *queues = 0;
  ~aj_group_queues() { free(queues); }
  /* Thread `t`'s queue, or null. */
  aj_group_queue<Op, N> *of(unsigned t) {
    if (!queues)
      queues = (aj_group_queue<Op, N> *)calloc(AJ_MAX_BLOCK_THREADS, sizeof(aj_group_queue<Op, N>));
    return queues ? &queues[t % AJ_MAX_BLOCK_THREADS] : 0;
  }
  aj_group_queue<Op, N> *mine() {
    aj_block *b = aj_running_block;
    return of(b ? b->current : 0);
  }
  void issue(Op o) {
    aj_group_queue<Op, N> *q = mine();
    if (!q) {
      o.complete();
      return;
    }
    if (q->count == N) {
      q->ops[0].complete();
      memmove(q->ops, q->ops + 1, (N - 1) * sizeof(Op));
      q->count--;
    }
    o.group = q->committed;
    q->ops[q->count++] = o;
  }
  void commit() {
    aj_group_queue<Op, N> *q = mine();
    if (q) q->committed++;
  }
  /* Completes, in order, every operation of a committed group older than the `pending` most
   * recent ones. */
  void wait(unsigned pending) {
    aj_group_queue<Op, N> *q = mine();
    if (!q) return;
    unsigned keep = 0;
    for (unsigned i = 0; i < q->count; ++i) {
      Op *o = &q->ops[i];
      if (o->group < q->committed && q->committed - o->group > pending) o->complete();
      else q->ops[keep++] = *o;
    }
    q->count = keep;
  }
  /* Thread `t` of a new block starts with nothing in flight. */
  void reset(unsigned t) {
    if (!queues) return;
    aj_group_queue<Op, N> *q = of(t);
    if (q) q->committed = q->count = 0;
  }
};

/* The shared memory the block's products in flight read, by range, with how many products
 * read each: an asynchronous copy into one of them is a race (the kernel refills a buffer
 * before waiting for the products that read it), which the launch reports (status -2). */
enum { AJ_OPERANDS_IN_FLIGHT = 64 };
struct aj_operand_range {
  uintptr_t lo, hi;
  unsigned uses;
};
static thread_local aj_operand_range aj_in_flight[AJ_OPERANDS_IN_FLIGHT];
static thread_local unsigned aj_in_flight_count = 0;
static thread_local int aj_race = 0;

/* The bytes a factor of `kind` and `rows` rows (of the result side) spans from its first
 * staged element. */
static inline uintptr_t aj_wgmma_span(int kind, int side_major, unsigned depth, unsigned rows) {
  return side_major ? ((rows - 1) / 64) * 128u * depth + 2048u
                    : ((rows + 7) / 8) * 8u * aj_wgmma_element_bytes(kind) * depth;
}
static inline void aj_operand_use(const void *p, int kind, int side_major, unsigned depth,
                                  unsigned rows, int add) {
  uintptr_t lo = (uintptr_t)p, hi = lo + aj_wgmma_span(kind, side_major, depth, rows);
  for (unsigned i = 0; i < aj_in_flight_count; ++i) {
    aj_operand_range *r = &aj_in_flight[i];
    if (r->lo != lo || r->hi != hi) continue;
    if (add) {
      r->uses++;
    } else if (--r->uses == 0) {
      *r = aj_in_flight[--aj_in_flight_count];
    }
    return;
  }
  if (add && aj_in_flight_count < AJ_OPERANDS_IN_FLIGHT)
    aj_in_flight[aj_in_flight_count++] = aj_operand_range{lo, hi, 1};
}
static inline void aj_check_copy_into(const void *dst, uintptr_t bytes) {
  uintptr_t lo = (uintptr_t)dst, hi = lo + bytes;
  for (unsigned i = 0; i < aj_in_flight_count; ++i)
    if (lo < aj_in_flight[i].hi && aj_in_flight[i].lo < hi) aj_race = 1;
}

/* A warpgroup product in flight: it runs, and releases its operands, when completed. */
struct aj_wgmma_op {
  float *d;
  const void *a, *b;
  int kind, a_side_major, b_side_major;
  unsigned n, depth, group;
  void complete() const {
    aj_emu_wgmma_run(d, a, b, kind, n, a_side_major, b_side_major, depth);
    aj_operand_use(a, kind, a_side_major, depth, 64, 0);
    aj_operand_use(b, kind, b_side_major, depth, n, 0);
  }
};
static thread_local aj_group_queues<aj_wgmma_op, 16> aj_wgmmas;

/* A block's thread starts with no products in flight. */
static inline void aj_wgmma_reset(unsigned t) {
  aj_in_flight_count = 0;
  aj_wgmmas.reset(t);
}
static inline void aj_emu_wgmma(float *d, const void *a, const void *b, int kind, unsigned n,
                                int a_side_major, int b_side_major, unsigned depth) {
  aj_operand_use(a, kind, a_side_major, depth, 64, 1);
  aj_operand_use(b, kind, b_side_major, depth, n, 1);
  aj_wgmmas.issue(aj_wgmma_op{d, a, b, kind, a_side_major, b_side_major, n, depth, 0});
}
static inline void aj_wgmma_commit(void) { aj_wgmmas.commit(); }
static inline void aj_wgmma_wait(unsigned pending) { aj_wgmmas.wait(pending); }

/* cp.async.cg.shared.global with 16 bytes (or none, zero-filled), commit_group and
 * wait_group, as the PTX ISA orders them: a copy lands only when a wait_group says its group
 * must have (or, past 32 copies of one thread, the oldest lands early), so a kernel that
 * reads a buffer before waiting for it reads stale data here too. */
struct aj_async_copy {
  void *dst;
  const void *src;
  int valid;
  unsigned group;
  void complete() const {
    if (valid) memcpy(dst, src, 16);
    else memset(dst, 0, 16);
  }
};
static thread_local aj_group_queues<aj_async_copy, 32> aj_copies;

static inline void aj_copy_async16(void *dst, const void *src, int valid) {
  aj_check_copy_into(dst, 16);
  aj_copies.issue(aj_async_copy{dst, src, valid, 0});
}
static inline void aj_commit_copies(void) { aj_copies.commit(); }
static inline void aj_wait_copies(unsigned pending) { aj_copies.wait(pending); }

/* The tensor memory accelerator (sm_90). A tensor map is the emulation's own struct (on a GPU
 * the backend encodes the driver's from the same fields): the factor's first byte, its axes
 * innermost first (extents, strides in bytes, the box a copy moves) and the swizzle its boxes
 * land with. A copy writes its box's elements one after another from its first shared
 * element (innermost axis fastest), each 16-byte chunk's address bits 4 and up XORed with
 * bits 7 and up within the swizzle's span (64 bytes: bits 4-5 ^= 7-8; 128: bits 4-6 ^= 7-9),
 * zeros for elements past the factor's ends (or before its start). */
struct aj_tensor_map {
  const unsigned char *base;
  unsigned element_bytes, rank, swizzle_bytes;
  unsigned long long dims[5], strides[5];
  unsigned boxes[5];
};

/* An mbarrier (by its address in shared memory): the arrivals a phase expects, those it has,
 * the bytes it still waits for, and the phases completed. */
struct aj_mbar_state {
  const void *bar;
  unsigned expected, arrived, completed;
  long long tx;
};
enum { AJ_MBARRIERS = 32, AJ_TENSOR_COPIES = 64, AJ_MBAR_POLLS = 100000 };
struct aj_tensor_copy {
  void *dst;
  aj_tensor_map map;
  long long coords[5];
  const void *bar;
};
static thread_local aj_mbar_state aj_mbars[AJ_MBARRIERS];
static thread_local unsigned aj_mbar_count = 0;
static thread_local aj_tensor_copy aj_tensor_copies[AJ_TENSOR_COPIES];
static thread_local unsigned aj_tensor_copy_count = 0;
static thread_local int aj_stuck = 0;

/* A new block has no barriers and no copies in flight. */
static inline void aj_tensor_reset(void) {
  aj_mbar_count = 0;
  aj_tensor_copy_count = 0;
}
static inline aj_mbar_state *aj_mbar_of(const void *bar) {
  for (unsigned i = 0; i < aj_mbar_count; ++i)
    if (aj_mbars[i].bar == bar) return &aj_mbars[i];
  return 0;
}
static inline void aj_mbar_init(long long *bar) {
  aj_mbar_state *m = aj_mbar_of(bar);
  if (!m) {
    if (aj_mbar_count == AJ_MBARRIERS) {
      aj_stuck = 1;
      return;
    }
    m = &aj_mbars[aj_mbar_count++];
  }
  *m = aj_mbar_state{bar, 1u, 0u, 0u, 0};
}
static inline void aj_mbar_init_fence(void) {}
/* The phase completes once every arrival it expects has come and its bytes have landed. */
static inline void aj_mbar_try_complete(aj_mbar_state *m) {
  if (m->arrived >= m->expected && m->tx == 0) {
    m->completed++;
    m->arrived = 0;
  }
}
static inline void aj_mbar_expect(long long *bar, unsigned bytes) {
  aj_mbar_state *m = aj_mbar_of(bar);
  if (!m) {
    aj_stuck = 1; /* arrives at a barrier never initialized */
    return;
  }
  m->tx += bytes;
  m->arrived++;
  aj_mbar_try_complete(m);
}
static inline void aj_tensor_land(const aj_tensor_copy *c) {
  const aj_tensor_map *t = &c->map;
  unsigned long long elements = 1;
  for (unsigned d = 0; d < t->rank; ++d) elements *= t->boxes[d];
  const uintptr_t span_chunks = t->swizzle_bytes / 16u;
  for (unsigned long long i = 0; i < elements; ++i) {
    unsigned long long rest = i, offset = 0;
    int inside = 1;
    for (unsigned d = 0; d < t->rank; ++d) {
      long long at = c->coords[d] + (long long)(rest % t->boxes[d]);
      rest /= t->boxes[d];
      inside &= at >= 0 && (unsigned long long)at < t->dims[d];
      offset += (unsigned long long)(at < 0 ? 0 : at) * t->strides[d];
    }
    uintptr_t a = (uintptr_t)c->dst + i * t->element_bytes;
    if (span_chunks > 1) a ^= ((a >> 7) & (span_chunks - 1u)) << 4;
    if (inside) memcpy((void *)a, t->base + offset, t->element_bytes);
    else memset((void *)a, 0, t->element_bytes);
  }
  aj_mbar_state *m = aj_mbar_of(c->bar);
  if (m) {
    m->tx -= (long long)(elements * t->element_bytes);
    aj_mbar_try_complete(m);
  }
}
/* Lands (in order) the copies in flight that complete on `bar` (all where null). */
static inline void aj_tensor_land_on(const void *bar) {
  unsigned keep = 0;
  for (unsigned i = 0; i < aj_tensor_copy_count; ++i) {
    if (!bar || aj_tensor_copies[i].bar == bar) aj_tensor_land(&aj_tensor_copies[i]);
    else aj_tensor_copies[keep++] = aj_tensor_copies[i];
  }
  aj_tensor_copy_count = keep;
}
static inline void aj_tma_load(void *dst, const aj_tensor_map *map, const long long *coords,
                               long long *bar) {
  unsigned long long bytes = map->element_bytes;
  for (unsigned d = 0; d < map->rank; ++d) bytes *= map->boxes[d];
  aj_check_copy_into(dst, (uintptr_t)bytes);
  if (aj_tensor_copy_count == AJ_TENSOR_COPIES) {
    /* The oldest lands early. */
    aj_tensor_land(&aj_tensor_copies[0]);
    memmove(aj_tensor_copies, aj_tensor_copies + 1, (AJ_TENSOR_COPIES - 1) * sizeof(aj_tensor_copy));
    aj_tensor_copy_count--;
  }
  aj_tensor_copy *c = &aj_tensor_copies[aj_tensor_copy_count++];
  c->dst = dst;
  c->map = *map;
  for (unsigned d = 0; d < 5; ++d) c->coords[d] = d < map->rank ? coords[d] : 0;
  c->bar = bar;
}
static inline void aj_tma_load_1d(void *dst, const aj_tensor_map *m, int c0, long long *bar) {
  const long long c[1] = {c0};
  aj_tma_load(dst, m, c, bar);
}
static inline void aj_tma_load_2d(void *dst, const aj_tensor_map *m, int c0, int c1, long long *bar) {
  const long long c[2] = {c0, c1};
  aj_tma_load(dst, m, c, bar);
}
static inline void aj_tma_load_3d(void *dst, const aj_tensor_map *m, int c0, int c1, int c2,
                                  long long *bar) {
  const long long c[3] = {c0, c1, c2};
  aj_tma_load(dst, m, c, bar);
}
static inline void aj_tma_load_4d(void *dst, const aj_tensor_map *m, int c0, int c1, int c2, int c3,
                                  long long *bar) {
  const long long c[4] = {c0, c1, c2, c3};
  aj_tma_load(dst, m, c, bar);
}
static inline void aj_tma_load_5d(void *dst, const aj_tensor_map *m, int c0, int c1, int c2, int c3,
                                  int c4, long long *bar) {
  const long long c[5] = {c0, c1, c2, c3, c4};
  aj_tma_load(dst, m, c, bar);
}
/* Waits until the phase of `bar` of this parity has completed (the current phase's parity is
 * the completed phases' count's): lands the copies completing on it, and yields to the
 * block's other threads while an arrival is still to come. */
static inline void aj_mbar_wait(long long *bar, unsigned parity) {
  for (unsigned polls = 0;; ++polls) {
    aj_mbar_state *m = aj_mbar_of(bar);
    if (!m || polls == AJ_MBAR_POLLS || !aj_running_block) {
      aj_stuck = 1;
      return;
    }
    if ((m->completed & 1u) != (parity & 1u)) return;
    aj_tensor_land_on(bar);
    if ((m->completed & 1u) != (parity & 1u)) return;
    aj_yield(AJ_AT_WARP);
  }
}

/* cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero. */
static inline uint32_t aj_tf32(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0x7f800000u) return x; /* infinities and NaNs as they are */
  return (x + 0x1000u) & 0xffffe000u;
}

/* Bytes of each fiber's stack, and the guard page below it. */
static const size_t AJ_STACK_BYTES = 256 * 1024;

/* The memory of a launch's fibers on this thread — each thread's guard page and stack, then
 * the fibers and the exchange table — kept from launch to launch and grown when a launch has
 * more threads (guard pages are protected once, when it is made). Null when it cannot be
 * allocated. */
struct aj_fiber_pool {
  unsigned char *memory = 0;
  size_t bytes = 0;
  unsigned threads = 0;
  ~aj_fiber_pool() {
    if (memory) munmap(memory, bytes);
  }
};
static thread_local aj_fiber_pool aj_pool;

static unsigned char *aj_fiber_memory(unsigned threads, size_t page) {
  if (aj_pool.memory && aj_pool.threads >= threads) return aj_pool.memory;
  if (aj_pool.memory) munmap(aj_pool.memory, aj_pool.bytes);
  aj_pool.memory = 0;
  size_t each = AJ_STACK_BYTES + page;
  size_t bytes = each * threads + sizeof(aj_fiber) * threads +
                 sizeof(unsigned long long) * 5 * threads + page;
  unsigned char *memory =
      (unsigned char *)mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return 0;
  for (unsigned t = 0; t < threads; ++t) {
    /* A stack overflow faults on the guard page instead of corrupting a neighbour. */
    if (mprotect(memory + each * t, page, PROT_NONE) != 0) {
      munmap(memory, bytes);
      return 0;
    }
  }
  aj_pool.memory = memory;
  aj_pool.bytes = bytes;
  aj_pool.threads = threads;
  return memory;
}

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
  unsigned char *memory = aj_fiber_memory(threads, page);
  if (!memory) return -1;
  int status = 0;
  /* After every stack of the pool (which may hold more threads than this launch). */
  aj_fiber *fibers = (aj_fiber *)(memory + each * aj_pool.threads);
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
      aj_fiber_start(&block, f, memory + each * t + page, AJ_STACK_BYTES);
      f->state = AJ_RUNS;
      aj_wgmma_reset(t);
    }
    aj_tensor_reset();
    for (;;) {
      /* One round: every thread that may run runs to its next barrier or its return. */
      for (unsigned t = 0; t < threads; ++t) {
        if (fibers[t].state != AJ_RUNS) continue;
        block.current = t;
        aj_set_thread(t);
        aj_to_fiber(&block, &fibers[t]);
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
  if (aj_race) {
    aj_race = 0;
    return -2;
  }
  if (aj_stuck) {
    aj_stuck = 0;
    return -3;
  }
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
