//! The C backends' blocked attention helper ([`arrayjit_opt::schedule::AttentionPlan`]): one
//! translation unit with the two passes of fused attention in `f32` — the forward (an online
//! softmax over blocks of keys) and the backward (FlashAttention-2's order: per block of keys,
//! the blocks of query rows that see it, each block's weights recomputed from the saved
//! log-sum-exp) — and the call a statement makes.
//!
//! A unit is one batch element and head; units are spread over the device's workers in a
//! strided order. A unit transposes the operand its score products read across (the keys for
//! the forward, the queries and output gradient for the backward) once, then runs every block
//! product (`Q·Kᵀ`, `P·V`, `dO·Vᵀ`, `Pᵀ·dO`, `dSᵀ·Q`, `dS·K`) on the product helper's
//! micro-kernels on its own thread; the softmax steps between them are vectorized loops over a
//! block with fixed trip counts. Blocks a causal mask hides entirely are never visited. The
//! meaning is the pass's loops ([`arrayjit_ir::attention`]): the same products, maxima,
//! exponentials and sums, in another order.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrayjit_ir::{AttentionLayout, AttentionOp, Prec, Result};
use arrayjit_opt::schedule::{
    ATTENTION_BLOCK_KEYS, ATTENTION_BLOCK_QUERIES, AttentionPlan, Blocking,
};

use crate::c::attention_paths::AttentionPaths;
use crate::c::gemm;
use crate::c::kernel::{ATTENTION_HELPER_BEGIN, KernelRenderer, comment};

/// The helper's names for a blocking of the product helper: its unit and the three passes'
/// functions (`aj_attention_{forward,backward}_f32_<product>`).
fn names(b: &Blocking) -> (String, [String; 2]) {
    let product = gemm::gemm_name(Prec::F32, b);
    (
        format!("aj_attention_f32_{product}"),
        ["forward", "backward"].map(|pass| format!("aj_attention_{pass}_f32_{product}")),
    )
}

/// The dropout parameters of both passes: whether, the generator's key and stream, the
/// probability, the factor of kept weights, the step node.
const DROPOUT_PARAMS: &str =
    "int drop, uint64_t seed, uint32_t stream, float p, float kept, const uint32_t *step";

/// The mask parameters of both passes: the causal mask's offset (query `t` sees keys `s ≤ t +
/// off`; 0 without one) and the `[batch, keys]` bias added to the scores (null without one).
const MASK_PARAMS: &str = "int64_t off, const float *kbias";

/// The two functions' prototypes (hidden outside the library, like the product helper's).
fn signatures(b: &Blocking) -> String {
    let [fwd, bwd] = names(b).1;
    let common = format!(
        "const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v, {DROPOUT_PARAMS}, {MASK_PARAMS}"
    );
    format!(
        "__attribute__((visibility(\"hidden\"))) void {fwd}({common}, float *out, float *lse, const aj_par *par);\n\
         __attribute__((visibility(\"hidden\"))) void {bwd}({common}, const float *go, const float *lse, const float *delta, float *gq, float *gk, float *gv, const aj_par *par)"
    )
}

/// The passes in C (see the module doc). `d` is `[batch, heads, queries, keys, features,
/// value_features]`; arrays are `[batch, heads, time, features]` (`heads_first`) or `[batch,
/// time, heads, features]`, row statistics `[batch, heads, queries]`.
const BODY: &str = r#"
#include <stdlib.h>
#include <math.h>


typedef struct {
  const int64_t *d; int heads_first, causal; float scale;
  const float *q, *k, *v, *go, *lse_in, *delta;
  float *out, *lse, *g1, *g2, *g3;
  int64_t units, workers;
  /* dropout: drop where the draw at the weight's position is below p, keep × kept */
  int drop; uint64_t seed; uint32_t stream; float p, kept; const uint32_t *step;
  /* the causal mask's offset (query t sees keys s <= t + off), the [batch, keys] score bias */
  int64_t off; const float *kbias;
} aj_att_ctx;

/* Element strides of a [batch, heads, time, features] array in the layout. */
static void aj_att_strides(const aj_att_ctx *c, int64_t t, int64_t f, int64_t *sb, int64_t *sh, int64_t *st) {
  const int64_t h = c->d[1];
  if (c->heads_first) { *sb = h * t * f; *sh = t * f; *st = f; }
  else { *sb = t * h * f; *st = h * f; *sh = f; }
}

/* Vector-friendly pieces: fixed trip counts over a block, four rows or features per pass so
   each load and store of an accumulator row serves four multiply-adds, and maxima and sums over
   16 lanes (a float reduction in one accumulator would be a serial chain gcc may not
   reorder). */
#define AJ_ATT_LANES 16

/* The keys of a block of kn (at k0) that query row t sees: all of them, or (causal) those up to
   t, none before the block. */
static inline int64_t aj_att_visible(int causal, int64_t t, int64_t k0, int64_t kn) {
  const int64_t lim = causal ? t + 1 - k0 : kn;
  return lim < kn ? (lim > 0 ? lim : 0) : kn;
}

/* n rounded up to whole vectors of lanes, at most `cap`. */
static inline int64_t aj_att_whole_lanes(int64_t n, int64_t cap) {
  const int64_t w = (n + AJ_ATT_LANES - 1) / AJ_ATT_LANES * AJ_ATT_LANES;
  return w < cap ? w : cap;
}

static inline float aj_att_row_max(const float *restrict x, int n, float start) {
  float lane[AJ_ATT_LANES];
  for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] = start;
  for (int j0 = 0; j0 < n; j0 += AJ_ATT_LANES)
    for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] = x[j0 + l] > lane[l] ? x[j0 + l] : lane[l];
  /* The lanes combined as a tree (4 steps), not one after another (16 dependent steps); each
     step's width a constant, so the tree is four vector operations, not a loop. */
  for (int l = 0; l < 8; ++l) lane[l] = lane[l + 8] > lane[l] ? lane[l + 8] : lane[l];
  for (int l = 0; l < 4; ++l) lane[l] = lane[l + 4] > lane[l] ? lane[l + 4] : lane[l];
  for (int l = 0; l < 2; ++l) lane[l] = lane[l + 2] > lane[l] ? lane[l + 2] : lane[l];
  lane[0] = lane[1] > lane[0] ? lane[1] : lane[0];
  return lane[0] > start ? lane[0] : start;
}

/* The sum of 16 lanes, as a tree (the order the row sums have always had). */
static inline float aj_att_lanes_sum(float *lane) {
  for (int l = 0; l < 8; ++l) lane[l] += lane[l + 8];
  for (int l = 0; l < 4; ++l) lane[l] += lane[l + 4];
  for (int l = 0; l < 2; ++l) lane[l] += lane[l + 2];
  return lane[0] + lane[1];
}

/* A row's weights exp(x - mx) in place, zero from `visible` on (n, a multiple of 16, at most
   the block), and their sum: one pass, the sum over 16 lanes. */
static inline float aj_att_row_exp_sum(float *restrict x, int n, int visible, float mx) {
  float lane[AJ_ATT_LANES];
  for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] = 0.0f;
  for (int j0 = 0; j0 < n; j0 += AJ_ATT_LANES)
    for (int l = 0; l < AJ_ATT_LANES; ++l) {
      const float p = j0 + l < visible ? aj_att_exp(x[j0 + l] - mx) : 0.0f;
      x[j0 + l] = p;
      lane[l] += p;
    }
  return aj_att_lanes_sum(lane);
}

/* The block products on the product helper's micro-kernels: C = A · B over general strides,
   stored (ovw = 1) or added (ovw = 0), on this worker's thread. */
#define AJ_ATT_GEMM(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, ovw) \
  AJ_ATT_GEMM_NAME(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, ovw, (const int64_t *)0, (const aj_par *)0)

/* The pointers and strides of batch element b, head h. */
typedef struct {
  int64_t H, Tq, Tk, E, Ev, b, h, bh;
  int64_t qst, kst, vst, ost; /* row strides of q, k, v and the output (features contiguous) */
  int64_t qo, ko, vo, oo; /* offsets of (b, h) in them */
} aj_att_head;

static aj_att_head aj_att_head_of(const aj_att_ctx *c, int64_t bh) {
  aj_att_head a;
  a.H = c->d[1]; a.Tq = c->d[2]; a.Tk = c->d[3]; a.E = c->d[4]; a.Ev = c->d[5];
  a.bh = bh; a.h = bh % a.H; a.b = bh / a.H;
  int64_t sb, sh;
  aj_att_strides(c, a.Tq, a.E, &sb, &sh, &a.qst); a.qo = a.b * sb + a.h * sh;
  aj_att_strides(c, a.Tk, a.E, &sb, &sh, &a.kst); a.ko = a.b * sb + a.h * sh;
  aj_att_strides(c, a.Tk, a.Ev, &sb, &sh, &a.vst); a.vo = a.b * sb + a.h * sh;
  aj_att_strides(c, a.Tq, a.Ev, &sb, &sh, &a.ost); a.oo = a.b * sb + a.h * sh;
  return a;
}

/* The dropout factor of the weight of query t on key s: the draw of `Tensor::dropout` at the
   weight's position in [batch, heads, queries, keys]. */
static inline float aj_att_keep(const aj_att_ctx *c, const aj_att_head *a, int64_t t, int64_t s) {
  const uint64_t index = (uint64_t)((a->bh * a->Tq + t) * a->Tk + s);
  return aj_philox_uniform(c->seed, c->stream, index, *c->step) < c->p ? 0.0f : c->kept;
}

/* The row stride of a transposed array of `rows` columns: whole cache lines, and one line more,
   so that its rows do not all fall into the same L1 set. At a stride of T = 1024 floats (4 KiB)
   every row of a transpose's writes mapped to one set of the 12-way L1: the three transposes
   of a forward and backward pass took 11% of the attention's time on the Xeon (6/207). */
static inline int64_t aj_att_ld(int64_t rows) { return (rows + 15) / 16 * 16 + 16; }

/* rows × F of `src` (row stride `stride`) into dst[f * ld + t], ld = aj_att_ld(rows), in tiles
   of 16 rows: each tile's reads are 16 runs of F, its writes F runs of 16. */
static void aj_att_transpose(float *restrict dst, const float *src, int64_t stride, int64_t rows, int64_t F) {
  const int64_t ld = aj_att_ld(rows);
  for (int64_t t0 = 0; t0 < rows; t0 += 16) {
    const int64_t tn = rows - t0 < 16 ? rows - t0 : 16;
    for (int64_t f = 0; f < F; ++f)
      for (int64_t t = 0; t < tn; ++t) dst[f * ld + t0 + t] = src[(t0 + t) * stride + f];
  }
}

/* Whether a unit packs its keys and values once for all its blocks' products (their depths
   within the product helper's depth block, its key blocks whole panels). */
static inline int aj_att_packs(int64_t E, int64_t Ev) {
#ifdef AJ_ATT_NO_PACK /* to check the unpacked products: compile with -DAJ_ATT_NO_PACK */
  (void)E; (void)Ev;
  return 0;
#endif
  return E <= AJ_ATT_KC && Ev <= AJ_ATT_KC && AJ_ATT_BK <= AJ_ATT_KC && AJ_ATT_BQ <= AJ_ATT_KC
    && AJ_ATT_BK % AJ_ATT_NR == 0 && AJ_ATT_BQ % AJ_ATT_NR == 0;
}

/* Floats of a forward unit's keys: packed once (Kᵀ in panels, then each block of values), or
   transposed. */
static int64_t aj_att_forward_keys(int64_t Tk, int64_t E, int64_t Ev) {
  const int64_t blocks = (Tk + AJ_ATT_BK - 1) / AJ_ATT_BK;
  const int64_t packed = AJ_ATT_PACKED_SIZE(E, Tk) + blocks * AJ_ATT_PACKED_SIZE(AJ_ATT_BK, Ev);
  const int64_t transposed = E * aj_att_ld(Tk);
  return packed > transposed ? packed : transposed;
}

/* Forward of (b, h) = unit u: its keys and values packed once for the block products (or its
   keys transposed, where they cannot be), then each block of query rows against the blocks of
   keys it sees. */
static void aj_att_forward_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const aj_att_head a = aj_att_head_of(c, u);
  const int64_t Tq = a.Tq, Tk = a.Tk, E = a.E, Ev = a.Ev, BQ = AJ_ATT_BQ, BK = AJ_ATT_BK;
  const float *qp = c->q + a.qo, *kp = c->k + a.ko, *vp = c->v + a.vo;
  float *op = c->out + a.oo;
  const int64_t off = c->off;
  /* The keys some row sees: all, or (causal) up to the last row's (a cache's slots past the
     queries are never read). */
  const int64_t Tke = AJ_ATT_CAUSAL(c) && Tq + off < Tk ? Tq + off : Tk;
  const float *bias = AJ_ATT_KBIAS(c) ? AJ_ATT_KBIAS(c) + a.b * Tk : 0;
  const int64_t ldk = aj_att_ld(Tke);
  const int packed = AJ_ATT_PACKS(E, Ev);
  float *restrict kt = buf, *restrict s = kt + aj_att_forward_keys(Tk, E, Ev), *restrict acc = s + BQ * BK;
  float *restrict m = acc + BQ * Ev, *restrict l = m + BQ;
  float mnew[AJ_ATT_BQ], shrink[AJ_ATT_BQ];
  /* Packed: Kᵀ's panels (a key block's start at k0 / nr panels), then each key block's values. */
  float *restrict vpk = kt + (packed ? AJ_ATT_PACKED_SIZE(E, Tk) : 0);
  const int64_t kpanel = AJ_ATT_PACKED_SIZE(E, AJ_ATT_NR), vblock = AJ_ATT_PACKED_SIZE(BK, Ev);
  const float scale = c->scale;
  if (packed) {
    AJ_ATT_PACK(kt, kp, 1, a.kst, E, Tke);
    for (int64_t k0 = 0; k0 < Tke; k0 += BK)
      AJ_ATT_PACK(vpk + k0 / BK * vblock, vp + k0 * a.vst, a.vst, 1, Tke - k0 < BK ? Tke - k0 : BK, Ev);
  } else {
    aj_att_transpose(kt, kp, a.kst, Tke, E);
  }
  for (int64_t t0 = 0; t0 < Tq; t0 += BQ) {
    const int64_t rows = Tq - t0 < BQ ? Tq - t0 : BQ;
    for (int64_t i = 0; i < rows; ++i) { m[i] = -1e30f; l[i] = 0.0f; }
    for (int64_t i = 0; i < rows * Ev; ++i) acc[i] = 0.0f;
    const int64_t kend = AJ_ATT_CAUSAL(c) ? (t0 + rows + off < Tk ? t0 + rows + off : Tk) : Tk;
    for (int64_t k0 = 0; k0 < kend; k0 += BK) {
      const int64_t kn = kend - k0 < BK ? kend - k0 : BK;
      /* The rows of the values' packed block (its panels' depth). */
      const int64_t kb = Tke - k0 < BK ? Tke - k0 : BK;
      /* Where some rows see only the block's first keys (the causal diagonal), both products
         run in strips of rows, each over the keys its last row sees: the same sums without
         the hidden keys' terms (never read in S, zeros in P). */
      const int64_t strip = AJ_ATT_CAUSAL(c) && t0 + off + rows - k0 < kn ? AJ_ATT_STRIP : rows;
      /* S = Q_block · K_blockᵀ */
      for (int64_t r0 = 0; r0 < rows; r0 += strip) {
        const int64_t r1 = rows - r0 < strip ? rows : r0 + strip;
        const int64_t n = aj_att_visible(AJ_ATT_CAUSAL(c), t0 + off + r1 - 1, k0, kn);
        if (n <= 0) continue;
        const float *qs = qp + (t0 + r0) * a.qst;
        if (!packed || AJ_ATT_TIMES_PACKED(r1 - r0, n, E, qs, a.qst, 1, kt + k0 / AJ_ATT_NR * kpanel, s + r0 * BK, BK, 1, 1)) {
          if (packed) AJ_ATT_GEMM(r1 - r0, n, E, qs, a.qst, 1, kp + k0 * a.kst, 1, a.kst, s + r0 * BK, BK, 1, 1);
          else AJ_ATT_GEMM(r1 - r0, n, E, qs, a.qst, 1, kt + k0, ldk, 1, s + r0 * BK, BK, 1, 1);
        }
      }
      /* Three passes over the block's rows, so that no row waits on its own rescaling
         factor: each row's scaled scores and new maximum; the factors exp(m - m'), 16 rows to a
         vector; then each row's weights, sum and rescaled accumulator. */
      for (int64_t i = 0; i < rows; ++i) {
        float *restrict si = s + i * BK;
        /* Keys past the row (causal) or past the block take no part. */
        const int64_t visible = aj_att_visible(AJ_ATT_CAUSAL(c), t0 + off + i, k0, kn);
        if (visible == 0) {
          mnew[i] = m[i];
          continue;
        }
        /* The visible keys rounded up to whole vectors: past them a row holds exp(-1e30) = 0,
           which changes neither its maximum nor its sum (each lane adds exact zeros), so the
           exponentials stop there; the product reads the block's kn keys, zeroed beyond. A
           block of T = 64 keys is half of BK, and a causal row sees half of it on average. */
        const int64_t w = aj_att_whole_lanes(visible, BK);
        /* A whole row of a whole block (most rows): constant trip counts, no masks. */
        if (visible == BK) {
          if (bias) for (int j = 0; j < BK; ++j) si[j] = si[j] * scale + bias[k0 + j];
          else for (int j = 0; j < BK; ++j) si[j] *= scale;
          mnew[i] = aj_att_row_max(si, BK, m[i]);
          continue;
        }
        if (bias)
          for (int j = 0; j < (int)w; ++j) si[j] = j < (int)visible ? si[j] * scale + bias[k0 + j] : -1e30f;
        else
          for (int j = 0; j < (int)w; ++j) si[j] = j < (int)visible ? si[j] * scale : -1e30f;
        mnew[i] = aj_att_row_max(si, (int)w, m[i]);
      }
      for (int64_t i = 0; i < rows; ++i) shrink[i] = aj_att_exp(m[i] - mnew[i]);
      for (int64_t i = 0; i < rows; ++i) {
        float *restrict si = s + i * BK;
        const int64_t visible = aj_att_visible(AJ_ATT_CAUSAL(c), t0 + off + i, k0, kn);
        if (visible == 0) {
          for (int64_t j = 0; j < kn; ++j) si[j] = 0.0f;
          continue;
        }
        const int64_t w = aj_att_whole_lanes(visible, BK);
        const float mx = mnew[i], sh = shrink[i];
        const float sum = visible == BK ? aj_att_row_exp_sum(si, BK, BK, mx)
          : aj_att_row_exp_sum(si, (int)w, (int)visible, mx);
        for (int64_t j = w; j < kn; ++j) si[j] = 0.0f;
        l[i] = l[i] * sh + sum;
        m[i] = mx;
        float *restrict ai = acc + i * Ev;
        for (int64_t f = 0; f < Ev; ++f) ai[f] *= sh;
        /* Dropout weighs the values' sum only, not the row's sum. */
        if (AJ_ATT_DROP(c))
          for (int64_t j = 0; j < visible; ++j) si[j] *= aj_att_keep(c, &a, t0 + i, k0 + j);
      }
      /* acc += P · V_block */
      for (int64_t r0 = 0; r0 < rows; r0 += strip) {
        const int64_t r1 = rows - r0 < strip ? rows : r0 + strip;
        const int64_t n = aj_att_visible(AJ_ATT_CAUSAL(c), t0 + off + r1 - 1, k0, kn);
        if (n <= 0) continue;
        if (!packed || AJ_ATT_PANELS(r1 - r0, Ev, n, s + r0 * BK, BK, 1, vpk + k0 / BK * vblock, AJ_ATT_PACKED_SIZE(kb, AJ_ATT_NR), acc + r0 * Ev, Ev, 1, 0))
          AJ_ATT_GEMM(r1 - r0, Ev, n, s + r0 * BK, BK, 1, vp + k0 * a.vst, a.vst, 1, acc + r0 * Ev, Ev, 1, 0);
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      float *restrict oi = op + (t0 + i) * a.ost;
      const float *restrict ai = acc + i * Ev;
      const float inv = 1.0f / l[i];
      for (int64_t f = 0; f < Ev; ++f) oi[f] = ai[f] * inv;
      c->lse[a.bh * Tq + t0 + i] = m[i] + logf(l[i]);
    }
  }
}

/* Floats of a backward unit's queries: packed once (Qᵀ and dOᵀ in panels, each query block's
   rows of dO and Q, one key block's rows of K), or Qᵀ and dOᵀ transposed. */
static int64_t aj_att_backward_queries(int64_t Tq, int64_t E, int64_t Ev) {
  const int64_t blocks = (Tq + AJ_ATT_BQ - 1) / AJ_ATT_BQ;
  const int64_t packed = AJ_ATT_PACKED_SIZE(E, Tq) + AJ_ATT_PACKED_SIZE(Ev, Tq)
    + blocks * (AJ_ATT_PACKED_SIZE(AJ_ATT_BQ, Ev) + AJ_ATT_PACKED_SIZE(AJ_ATT_BQ, E))
    + AJ_ATT_PACKED_SIZE(AJ_ATT_BK, E);
  const int64_t transposed = (E + Ev) * aj_att_ld(Tq);
  return packed > transposed ? packed : transposed;
}

/* Backward of (b, h) = unit u (FlashAttention-2's order): per block of keys, per block of the
   query rows that see it, the transposed scores and weight gradients; the key and value
   gradients accumulate in the block's buffers, the query gradient in its rows of grad_q (this
   unit owns them). */
static void aj_att_backward_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const aj_att_head a = aj_att_head_of(c, u);
  const int64_t Tq = a.Tq, Tk = a.Tk, E = a.E, Ev = a.Ev, BQ = AJ_ATT_BQ, BK = AJ_ATT_BK;
  const float *qp = c->q + a.qo, *kp = c->k + a.ko, *vp = c->v + a.vo, *gop = c->go + a.oo;
  float *gqp = c->g1 + a.qo, *gkp = c->g2 + a.ko, *gvp = c->g3 + a.vo;
  const float *lse = c->lse_in + a.bh * Tq, *delta = c->delta + a.bh * Tq;
  const int64_t ldq = aj_att_ld(Tq);
  const int64_t off = c->off;
  const float *bias = AJ_ATT_KBIAS(c) ? AJ_ATT_KBIAS(c) + a.b * Tk : 0;
  const int packed = AJ_ATT_PACKS(E, Ev);
  float *restrict qt = buf, *restrict got = qt + E * ldq, *restrict st = buf + aj_att_backward_queries(Tq, E, Ev);
  float *restrict dpt = st + BK * BQ, *restrict dk = dpt + BK * BQ, *restrict dv = dk + BK * E;
  /* Packed: Qᵀ's and dOᵀ's panels (a query block's start at t0 / nr panels), each query
     block's rows of dO and of Q, and the current key block's rows of K. */
  const int64_t qpanel = AJ_ATT_PACKED_SIZE(E, AJ_ATT_NR), opanel = AJ_ATT_PACKED_SIZE(Ev, AJ_ATT_NR);
  const int64_t oblock = AJ_ATT_PACKED_SIZE(BQ, Ev), qblock = AJ_ATT_PACKED_SIZE(BQ, E);
  float *restrict qtp = buf, *restrict otp = qtp + AJ_ATT_PACKED_SIZE(E, Tq);
  float *restrict obp = otp + AJ_ATT_PACKED_SIZE(Ev, Tq);
  float *restrict qbp = obp + (Tq + BQ - 1) / BQ * oblock;
  float *restrict kbp = qbp + (Tq + BQ - 1) / BQ * qblock;
  float lq[AJ_ATT_BQ], dq[AJ_ATT_BQ];
  const float scale = c->scale;
  if (packed) {
    AJ_ATT_PACK(qtp, qp, 1, a.qst, E, Tq);
    AJ_ATT_PACK(otp, gop, 1, a.ost, Ev, Tq);
    for (int64_t t0 = 0; t0 < Tq; t0 += BQ) {
      const int64_t rn = Tq - t0 < BQ ? Tq - t0 : BQ;
      AJ_ATT_PACK(obp + t0 / BQ * oblock, gop + t0 * a.ost, a.ost, 1, rn, Ev);
      AJ_ATT_PACK(qbp + t0 / BQ * qblock, qp + t0 * a.qst, a.qst, 1, rn, E);
    }
  } else {
    aj_att_transpose(qt, qp, a.qst, Tq, E);
    aj_att_transpose(got, gop, a.ost, Tq, Ev);
  }
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t e = 0; e < E; ++e) gqp[t * a.qst + e] = 0.0f;
  for (int64_t s0 = 0; s0 < Tk; s0 += BK) {
    const int64_t keys = Tk - s0 < BK ? Tk - s0 : BK;
    for (int64_t i = 0; i < keys * E; ++i) dk[i] = 0.0f;
    for (int64_t i = 0; i < keys * Ev; ++i) dv[i] = 0.0f;
    if (packed) AJ_ATT_PACK(kbp, kp + s0 * a.kst, a.kst, 1, keys, E);
    /* Causal: rows before the block's first key's (t + off < s0) see none of its keys. */
    const int64_t tfirst = s0 - off > 0 ? s0 - off : 0;
    const int64_t tstart = AJ_ATT_CAUSAL(c) ? (tfirst < Tq ? tfirst / BQ * BQ : Tq) : 0;
    for (int64_t t0 = tstart; t0 < Tq; t0 += BQ) {
      const int64_t rn = Tq - t0 < BQ ? Tq - t0 : BQ;
      for (int64_t i = 0; i < BQ; ++i) {
        lq[i] = i < rn ? lse[t0 + i] : 0.0f;
        dq[i] = i < rn ? delta[t0 + i] : 0.0f;
      }
      /* Where some keys are seen only by the block's last rows (the causal diagonal), the
         products over query rows run in strips of keys, each from the first row (rounded down
         to a panel) that its first key sees; the query gradient's in strips of rows, each over
         the keys its last row sees. The same sums without the hidden pairs' terms (never read
         in Sᵀ and dPᵀ, zeros in P and dS). */
      const int64_t kstrip = AJ_ATT_CAUSAL(c) && s0 + keys - 1 > t0 + off ? AJ_ATT_STRIP : keys;
      const int64_t qstrip = AJ_ATT_CAUSAL(c) && t0 + off - s0 < keys - 1 ? AJ_ATT_STRIP : rn;
      /* Sᵀ = K_block · Q_blockᵀ, dPᵀ = V_block · dO_blockᵀ (row j: key s0 + j) */
      for (int64_t j0 = 0; j0 < keys; j0 += kstrip) {
        const int64_t j1 = keys - j0 < kstrip ? keys : j0 + kstrip;
        const int64_t c0 = AJ_ATT_CAUSAL(c) && s0 + j0 > t0 + off ? (s0 + j0 - t0 - off) / AJ_ATT_NR * AJ_ATT_NR : 0;
        if (c0 >= rn) continue;
        const float *ks = kp + (s0 + j0) * a.kst, *vs = vp + (s0 + j0) * a.vst;
        float *sts = st + j0 * BQ + c0, *dps = dpt + j0 * BQ + c0;
        if (!packed || AJ_ATT_TIMES_PACKED(j1 - j0, rn - c0, E, ks, a.kst, 1, qtp + (t0 + c0) / AJ_ATT_NR * qpanel, sts, BQ, 1, 1)) {
          if (packed) AJ_ATT_GEMM(j1 - j0, rn - c0, E, ks, a.kst, 1, qp + (t0 + c0) * a.qst, 1, a.qst, sts, BQ, 1, 1);
          else AJ_ATT_GEMM(j1 - j0, rn - c0, E, ks, a.kst, 1, qt + t0 + c0, ldq, 1, sts, BQ, 1, 1);
        }
        if (!packed || AJ_ATT_TIMES_PACKED(j1 - j0, rn - c0, Ev, vs, a.vst, 1, otp + (t0 + c0) / AJ_ATT_NR * opanel, dps, BQ, 1, 1)) {
          if (packed) AJ_ATT_GEMM(j1 - j0, rn - c0, Ev, vs, a.vst, 1, gop + (t0 + c0) * a.ost, 1, a.ost, dps, BQ, 1, 1);
          else AJ_ATT_GEMM(j1 - j0, rn - c0, Ev, vs, a.vst, 1, got + t0 + c0, ldq, 1, dps, BQ, 1, 1);
        }
      }
      /* The block's rows rounded up to whole vectors: the products read rn of them. */
      const int64_t rw = aj_att_whole_lanes(rn, BQ);
      for (int64_t j = 0; j < keys; ++j) {
        /* Causal: rows t + off >= s see key s. */
        const int64_t first = AJ_ATT_CAUSAL(c) ? (s0 + j - t0 - off > 0 ? s0 + j - t0 - off : 0) : 0;
        float *restrict sj = st + j * BQ, *restrict dj = dpt + j * BQ;
        /* Whole vectors of rows before the first that sees the key: zeros, no exponentials. */
        const int64_t i0 = first / AJ_ATT_LANES * AJ_ATT_LANES < rw ? first / AJ_ATT_LANES * AJ_ATT_LANES : rw;
        for (int64_t i = 0; i < i0; ++i) { sj[i] = 0.0f; dj[i] = 0.0f; }
        /* With a bias, the scores scaled and biased first (the key's bias is one number), and
           the exponentials below take them as they are. */
        float sc = scale;
        if (bias) {
          const float bj = bias[s0 + j];
          for (int64_t i = i0; i < rw; ++i) sj[i] = sj[i] * scale + bj;
          sc = 1.0f;
        }
        if (!AJ_ATT_DROP(c)) {
          /* 32-bit positions: one vector compare per 16 lanes for the masks, not two. */
          const int ifirst = (int)first, irn = (int)rn;
          /* Every row of a whole block sees the key (most keys): no masks. */
          if (first == 0 && rn == BQ) {
            for (int i = 0; i < BQ; ++i) {
              const float w = aj_att_exp(sj[i] * sc - lq[i]);
              sj[i] = w;
              dj[i] = w * (dj[i] - dq[i]) * scale;
            }
            continue;
          }
          for (int i = (int)i0; i < (int)rw; ++i) {
            const float w = aj_att_exp(sj[i] * sc - lq[i]);
            const int keep = i >= ifirst && i < irn;
            sj[i] = keep ? w : 0.0f;
            dj[i] = keep ? w * (dj[i] - dq[i]) * scale : 0.0f;
          }
        } else {
          /* P ⊙ keep for the values' gradient, dS = P ⊙ (dP ⊙ keep − Δ) for the rest. */
          for (int64_t i = i0; i < rw; ++i) {
            const int keep = i >= first && i < rn;
            const float w = aj_att_exp(sj[i] * sc - lq[i]);
            const float k = keep ? aj_att_keep(c, &a, t0 + i, s0 + j) : 0.0f;
            sj[i] = keep ? w * k : 0.0f;
            dj[i] = keep ? w * (dj[i] * k - dq[i]) * scale : 0.0f;
          }
        }
      }
      /* dV += Pᵀ · dO_block, dK += dSᵀ · Q_block (depths: the strip's query rows) */
      const int64_t qpanels = AJ_ATT_PACKED_SIZE(rn, AJ_ATT_NR);
      for (int64_t j0 = 0; j0 < keys; j0 += kstrip) {
        const int64_t j1 = keys - j0 < kstrip ? keys : j0 + kstrip;
        const int64_t c0 = AJ_ATT_CAUSAL(c) && s0 + j0 > t0 + off ? (s0 + j0 - t0 - off) / AJ_ATT_NR * AJ_ATT_NR : 0;
        if (c0 >= rn) continue;
        const float *sts = st + j0 * BQ + c0, *dps = dpt + j0 * BQ + c0;
        if (!packed || AJ_ATT_PANELS(j1 - j0, Ev, rn - c0, sts, BQ, 1, obp + t0 / BQ * oblock + c0 * AJ_ATT_NR, qpanels, dv + j0 * Ev, Ev, 1, 0))
          AJ_ATT_GEMM(j1 - j0, Ev, rn - c0, sts, BQ, 1, gop + (t0 + c0) * a.ost, a.ost, 1, dv + j0 * Ev, Ev, 1, 0);
        if (!packed || AJ_ATT_PANELS(j1 - j0, E, rn - c0, dps, BQ, 1, qbp + t0 / BQ * qblock + c0 * AJ_ATT_NR, qpanels, dk + j0 * E, E, 1, 0))
          AJ_ATT_GEMM(j1 - j0, E, rn - c0, dps, BQ, 1, qp + (t0 + c0) * a.qst, a.qst, 1, dk + j0 * E, E, 1, 0);
      }
      /* dQ_block += dS · K_block (depths: the keys the strip's last row sees) */
      for (int64_t i0 = 0; i0 < rn; i0 += qstrip) {
        const int64_t i1 = rn - i0 < qstrip ? rn : i0 + qstrip;
        const int64_t n = AJ_ATT_CAUSAL(c) && t0 + off + i1 - s0 < keys ? t0 + off + i1 - s0 : keys;
        if (n <= 0) continue;
        if (!packed || AJ_ATT_PANELS(i1 - i0, E, n, dpt + i0, 1, BQ, kbp, AJ_ATT_PACKED_SIZE(keys, AJ_ATT_NR), gqp + (t0 + i0) * a.qst, a.qst, 1, 0))
          AJ_ATT_GEMM(i1 - i0, E, n, dpt + i0, 1, BQ, kp + s0 * a.kst, a.kst, 1, gqp + (t0 + i0) * a.qst, a.qst, 1, 0);
      }
    }
    for (int64_t j = 0; j < keys; ++j) {
      for (int64_t e = 0; e < E; ++e) gkp[(s0 + j) * a.kst + e] = dk[j * E + e];
      for (int64_t f = 0; f < Ev; ++f) gvp[(s0 + j) * a.vst + f] = dv[j * Ev + f];
    }
  }
}

/* Without memory for a unit's buffers: the same passes row by row (key by key for the key
   and value gradients), accumulating in the result arrays themselves. Cold: gcc optimizes
   them for size, which takes a seventh off the unit's compile time. */
static __attribute__((cold)) float aj_att_dot(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

static __attribute__((cold)) void aj_att_forward_rows(const aj_att_ctx *c, int64_t u) {
  const aj_att_head a = aj_att_head_of(c, u);
  const float *qp = c->q + a.qo, *kp = c->k + a.ko, *vp = c->v + a.vo;
  float *op = c->out + a.oo;
  for (int64_t t = 0; t < a.Tq; ++t) {
    float *oi = op + t * a.ost, m = -1e30f, l = 0.0f;
    for (int64_t f = 0; f < a.Ev; ++f) oi[f] = 0.0f;
    const int64_t kend = AJ_ATT_CAUSAL(c) && t + 1 + c->off < a.Tk ? t + 1 + c->off : a.Tk;
    for (int64_t s = 0; s < kend; ++s) {
      const float sc = aj_att_dot(qp + t * a.qst, kp + s * a.kst, a.E) * c->scale
        + (AJ_ATT_KBIAS(c) ? AJ_ATT_KBIAS(c)[a.b * a.Tk + s] : 0.0f);
      const float mx = sc > m ? sc : m, shrink = aj_att_exp(m - mx), p = aj_att_exp(sc - mx);
      l = l * shrink + p;
      const float pk = AJ_ATT_DROP(c) ? p * aj_att_keep(c, &a, t, s) : p;
      for (int64_t f = 0; f < a.Ev; ++f) oi[f] = oi[f] * shrink + pk * vp[s * a.vst + f];
      m = mx;
    }
    for (int64_t f = 0; f < a.Ev; ++f) oi[f] /= l;
    c->lse[a.bh * a.Tq + t] = m + logf(l);
  }
}

static __attribute__((cold)) void aj_att_backward_rows(const aj_att_ctx *c, int64_t u) {
  const aj_att_head a = aj_att_head_of(c, u);
  const float *qp = c->q + a.qo, *kp = c->k + a.ko, *vp = c->v + a.vo, *gop = c->go + a.oo;
  float *gqp = c->g1 + a.qo, *gkp = c->g2 + a.ko, *gvp = c->g3 + a.vo;
  const float *lse = c->lse_in + a.bh * a.Tq, *delta = c->delta + a.bh * a.Tq;
  for (int64_t t = 0; t < a.Tq; ++t)
    for (int64_t e = 0; e < a.E; ++e) gqp[t * a.qst + e] = 0.0f;
  for (int64_t s = 0; s < a.Tk; ++s) {
    float *gk = gkp + s * a.kst, *gv = gvp + s * a.vst;
    for (int64_t e = 0; e < a.E; ++e) gk[e] = 0.0f;
    for (int64_t f = 0; f < a.Ev; ++f) gv[f] = 0.0f;
    for (int64_t t = AJ_ATT_CAUSAL(c) ? (s - c->off > 0 ? s - c->off : 0) : 0; t < a.Tq; ++t) {
      const float w = aj_att_exp(aj_att_dot(kp + s * a.kst, qp + t * a.qst, a.E) * c->scale
        + (AJ_ATT_KBIAS(c) ? AJ_ATT_KBIAS(c)[a.b * a.Tk + s] : 0.0f) - lse[t]);
      const float k = AJ_ATT_DROP(c) ? aj_att_keep(c, &a, t, s) : 1.0f;
      const float ds = w * (aj_att_dot(vp + s * a.vst, gop + t * a.ost, a.Ev) * k - delta[t]) * c->scale;
      for (int64_t f = 0; f < a.Ev; ++f) gv[f] += w * k * gop[t * a.ost + f];
      for (int64_t e = 0; e < a.E; ++e) {
        gk[e] += ds * qp[t * a.qst + e];
        gqp[t * a.qst + e] += ds * kp[s * a.kst + e];
      }
    }
  }
}

typedef void (*aj_att_unit_fn)(const aj_att_ctx *c, int64_t u, float *buf);
typedef void (*aj_att_rows_fn)(const aj_att_ctx *c, int64_t u);
typedef struct { const aj_att_ctx *c; aj_att_unit_fn unit; aj_att_rows_fn rows; int64_t buf_floats; } aj_att_job;

/* Worker `index` of `workers` runs units index, index + workers, ... (a causal mask makes
   later row blocks longer: striding gives each worker a like share). */
static void aj_att_chunk(void *ctx, int64_t index) {
  const aj_att_job *job = (const aj_att_job *)ctx;
#ifdef AJ_ATT_FORCE_ROWS /* to check the row-by-row passes: compile with -DAJ_ATT_FORCE_ROWS */
  float *buf = 0;
#else
  /* Whole cache lines: the packed panels in it are read by aligned vector loads. */
  float *buf = (float *)aligned_alloc(64, ((size_t)job->buf_floats * sizeof(float) + 63) / 64 * 64);
#endif
  for (int64_t u = index; u < job->c->units; u += job->c->workers) {
    if (buf) job->unit(job->c, u, buf); else job->rows(job->c, u);
  }
  free(buf);
}

static void aj_att_run(aj_att_ctx *c, aj_att_unit_fn unit, aj_att_rows_fn rows, int64_t buf_floats, const aj_par *par) {
  const int64_t w = par && par->workers > 1 ? par->workers : 1;
  c->workers = w < c->units ? w : c->units;
  if (c->workers < 1) c->workers = 1;
  aj_att_job job = { c, unit, rows, buf_floats };
  if (c->workers > 1) par->run(par->pool, aj_att_chunk, &job, c->workers); else aj_att_chunk(&job, 0);
}

__attribute__((visibility("hidden"))) void AJ_ATT_FORWARD(const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v, AJ_ATT_DROPOUT_PARAMS, AJ_ATT_MASK_PARAMS, float *out, float *lse, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, q, k, v, 0, 0, 0, out, lse, 0, 0, 0, 0, 0, drop, seed, stream, p, kept, step, off, kbias };
  c.units = d[0] * d[1];
  aj_att_run(&c, aj_att_forward_unit, aj_att_forward_rows, aj_att_forward_keys(d[3], d[4], d[5]) + AJ_ATT_BQ * AJ_ATT_BK + AJ_ATT_BQ * d[5] + 2 * AJ_ATT_BQ, par);
}

__attribute__((visibility("hidden"))) void AJ_ATT_BACKWARD(const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v, AJ_ATT_DROPOUT_PARAMS, AJ_ATT_MASK_PARAMS, const float *go, const float *lse, const float *delta, float *gq, float *gk, float *gv, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, q, k, v, go, lse, delta, 0, 0, gq, gk, gv, 0, 0, drop, seed, stream, p, kept, step, off, kbias };
  c.units = d[0] * d[1];
  aj_att_run(&c, aj_att_backward_unit, aj_att_backward_rows, aj_att_backward_queries(d[2], d[4], d[5]) + 2 * AJ_ATT_BK * AJ_ATT_BQ + AJ_ATT_BK * (d[4] + d[5]), par);
}
"#;

/// The helper unit for a blocking of the product helper: its exponential (the backends'
/// branch-free `aj_exp_f32`, so the loops over a block's scores vectorize), the product's
/// prototype (its unit is compiled beside this one), the passes. Compiled at `O2`
/// ([`ATTENTION_HELPER_BEGIN`]) with multiply-adds contracted, as the product helper is. The
/// features no pass of the library uses (`paths`) are constants of the unit.
fn definition(b: &Blocking, paths: AttentionPaths) -> String {
    let [fwd, bwd] = names(b).1;
    let mut s = String::new();
    let _ = writeln!(s, "{ATTENTION_HELPER_BEGIN}\n{}", gemm::CONTRACT_FAST);
    // The blocks are constants of the unit, so the loops over a block have fixed trip counts.
    let _ = writeln!(
        s,
        "#define AJ_ATT_BQ {ATTENTION_BLOCK_QUERIES}\n#define AJ_ATT_BK {ATTENTION_BLOCK_KEYS}"
    );
    let _ = writeln!(
        s,
        "#define AJ_ATT_GEMM_NAME {}\n#define AJ_ATT_FORWARD {fwd}\n#define AJ_ATT_BACKWARD {bwd}",
        gemm::gemm_name(Prec::F32, b)
    );
    let _ = writeln!(s, "{};", gemm::gemm_signature(Prec::F32, b));
    let g = gemm::gemm_name(Prec::F32, b);
    let hidden = "__attribute__((visibility(\"hidden\")))";
    let _ = writeln!(
        s,
        "{hidden} int64_t {g}_packed_size(int64_t K, int64_t N);\n{hidden} void {g}_pack(void *Bp, const float *B, int64_t rsB, int64_t csB, int64_t K, int64_t N);\n{hidden} int {g}_times_panels(int64_t M, int64_t N, int64_t K, const float *A, int64_t rsA, int64_t csA, const void *Bp, int64_t sb, float *C, int64_t rsC, int64_t csC, int ovw, int warm);\n#define AJ_ATT_PACKED_SIZE {g}_packed_size\n#define AJ_ATT_PACK {g}_pack\n#define AJ_ATT_PANELS(M, N, K, A, rsA, csA, Bp, sb, C, rsC, csC, ovw) {g}_times_panels(M, N, K, A, rsA, csA, Bp, sb, C, rsC, csC, ovw, 1)\n#define AJ_ATT_TIMES_PACKED(M, N, K, A, rsA, csA, Bp, C, rsC, csC, ovw) AJ_ATT_PANELS(M, N, K, A, rsA, csA, Bp, AJ_ATT_PACKED_SIZE(K, AJ_ATT_NR), C, rsC, csC, ovw)\n#define AJ_ATT_KC {}\n#define AJ_ATT_NR {}\n#define AJ_ATT_MR {}\n#define AJ_ATT_STRIP (2 * AJ_ATT_MR)",
        b.kc, b.nr, b.mr
    );
    let _ = writeln!(
        s,
        "#define AJ_ATT_DROPOUT_PARAMS {DROPOUT_PARAMS}\n#define AJ_ATT_MASK_PARAMS {MASK_PARAMS}"
    );
    let _ = writeln!(
        s,
        "{}",
        crate::c::syntax::helper_definition(
            crate::c::syntax::Helper::PhiloxUniform,
            &crate::c::syntax::CSyntax::c()
        )
    );
    let _ = writeln!(
        s,
        "#include <string.h>\nstatic inline float aj_att_exp(float x) {{\n  {}\n}}",
        crate::c::syntax::EXP_F32_BODY
    );
    let _ = writeln!(s, "{}", paths.macros());
    s.push_str(BODY);
    s
}

impl KernelRenderer<'_> {
    /// A pass of fused attention as a call of the blocked helper (whose unit joins
    /// `products`).
    pub(super) fn attention(
        &mut self,
        plan: &AttentionPlan,
        products: &mut BTreeMap<String, (String, String)>,
        out: &mut String,
    ) -> Result<()> {
        let b = &plan.blocking;
        if !b.is_usable() {
            return Err(arrayjit_ir::Error::Optimization {
                routine: "attention".into(),
                detail: format!("unusable blocking {b:?} for the attention helper's products"),
            });
        }
        let (unit, [fwd, bwd]) = names(b);
        // The passes call the product helper's packed entries, which reach no optional path.
        gemm::add_product_helper(products, Prec::F32, b, gemm::HelperPaths::NONE);
        let op = &plan.op;
        let spec = op.spec();
        let d = spec.dims();
        // The unit keeps the features some pass of the library uses (see `AttentionPaths`).
        let paths = AttentionPaths::of_pass(
            spec.dropout.is_some(),
            spec.key_bias.is_some(),
            spec.causal,
            (d.features, d.value_features),
            b,
        );
        let entry = products
            .entry(unit)
            .or_insert_with(|| (signatures(b), definition(b, paths)));
        let there = AttentionPaths::of_definition(&entry.1).unwrap_or(AttentionPaths::ALL);
        let both = there.union(paths);
        if both != there {
            entry.1 = definition(b, both);
        }
        let name = |t| self.node(t).map(str::to_string);
        let (q, k, v) = (name(&spec.q)?, name(&spec.k)?, name(&spec.v)?);
        if (plan.block_queries, plan.block_keys) != (ATTENTION_BLOCK_QUERIES, ATTENTION_BLOCK_KEYS)
        {
            return Err(arrayjit_ir::Error::Optimization {
                routine: "attention".into(),
                detail: format!(
                    "the attention helper runs blocks of {ATTENTION_BLOCK_QUERIES} × \
                     {ATTENTION_BLOCK_KEYS}, not {} × {}",
                    plan.block_queries, plan.block_keys
                ),
            });
        }
        // The dropout's draws as the loops make them: `u < p` in f32, kept weights × 1 / (1 − p).
        let dropout = match &spec.dropout {
            Some(dr) => format!(
                "1, {}ull, {}u, {:e}f, {:e}f, {}",
                dr.seed,
                dr.stream,
                dr.p as f32,
                if dr.p < 1.0 { 1.0 / (1.0 - dr.p) } else { 0.0 } as f32,
                name(&dr.step)?
            ),
            None => "0, 0ull, 0u, 0.0f, 1.0f, (const uint32_t *)0".to_string(),
        };
        // The causal offset is the static symbol's variable of the kernel (bound per run).
        let offset =
            match &spec.causal_offset {
                Some(o) => self.symbols.get(&o.symbol).cloned().ok_or_else(|| {
                    arrayjit_ir::Error::Render {
                        routine: self.routine.clone(),
                        language: "C".into(),
                        detail: format!(
                            "the attention's causal offset {} is not a static index of the routine \
                         (compile it with the symbol among the bindings)",
                            o.name
                        ),
                    }
                })?,
                None => "0".to_string(),
            };
        let bias = match &spec.key_bias {
            Some(b) => name(b)?,
            None => "(const float *)0".to_string(),
        };
        let common = format!(
            "aj_att_d, {}, {}, {:e}f, {q}, {k}, {v}, {dropout}, {offset}, {bias}",
            i32::from(spec.layout == AttentionLayout::HeadsFirst),
            i32::from(spec.causal),
            spec.scale as f32,
        );
        let call = match &**op {
            AttentionOp::Forward { out: o, lse, .. } => {
                format!("{fwd}({common}, {}, {}, par);", name(o)?, name(lse)?)
            }
            AttentionOp::Backward {
                lse,
                delta,
                grad_out,
                grad_q,
                grad_k,
                grad_v,
                ..
            } => format!(
                "{bwd}({common}, {}, {}, {}, {}, {}, {}, par);",
                name(grad_out)?,
                name(lse)?,
                name(delta)?,
                name(grad_q)?,
                name(grad_k)?,
                name(grad_v)?
            ),
        };
        let _ = writeln!(out, "  {}", comment(&plan.to_string()));
        let _ = writeln!(
            out,
            "  {{ static const int64_t aj_att_d[6] = {{{}, {}, {}, {}, {}, {}}};\n    {call}\n  }}",
            d.batch, d.heads, d.queries, d.keys, d.features, d.value_features
        );
        Ok(())
    }
}
