//! The C backends' blocked attention helper ([`arrayjit_ir::schedule::AttentionPlan`]): one
//! translation unit with the three passes of fused attention in `f32` — the forward (online
//! softmax over blocks of keys), the query gradient and the key and value gradients (each
//! block's weights recomputed from the saved log-sum-exp) — and the call a statement makes.
//!
//! Each pass works on units of one batch element, one head and one block of rows (query rows,
//! or keys for the key-value pass), spread over the device's workers in a strided order so
//! that the triangle of a causal mask gives each worker a like share. A block of scores is
//! computed against keys packed transposed (features × keys), so the innermost loops run over
//! keys or features contiguously and vectorize; blocks a causal mask hides entirely are never
//! visited. The meaning is the pass's loops ([`arrayjit_ir::attention`]): the same products,
//! maxima, exponentials and sums, in another order.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrayjit_ir::schedule::{ATTENTION_BLOCK_KEYS, ATTENTION_BLOCK_QUERIES, AttentionPlan};
use arrayjit_ir::{AttentionLayout, AttentionOp, Result};

use crate::c::kernel::{KernelRenderer, LIGHT_BEGIN, comment};

/// The helper unit's name (also the name of its translation unit).
const UNIT: &str = "aj_attention_f32";

/// The three functions' prototypes (hidden outside the library, like the product helper's).
fn signatures() -> String {
    let common = "const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v";
    format!(
        "__attribute__((visibility(\"hidden\"))) void aj_attention_forward_f32({common}, float *out, float *lse, const aj_par *par);\n\
         __attribute__((visibility(\"hidden\"))) void aj_attention_grad_query_f32({common}, const float *go, const float *lse, const float *delta, float *gq, const aj_par *par);\n\
         __attribute__((visibility(\"hidden\"))) void aj_attention_grad_key_value_f32({common}, const float *go, const float *lse, const float *delta, float *gk, float *gv, const aj_par *par)"
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
  float *out, *lse, *g1, *g2;
  int64_t units, workers;
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

static inline float aj_att_row_max(const float *restrict x, int64_t n, float start) {
  float lane[AJ_ATT_LANES];
  for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] = start;
  for (int64_t j0 = 0; j0 < n; j0 += AJ_ATT_LANES)
    for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] = x[j0 + l] > lane[l] ? x[j0 + l] : lane[l];
  float m = start;
  for (int l = 0; l < AJ_ATT_LANES; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
}

static inline float aj_att_row_sum(const float *restrict x, int64_t n) {
  float lane[AJ_ATT_LANES];
  for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] = 0.0f;
  for (int64_t j0 = 0; j0 < n; j0 += AJ_ATT_LANES)
    for (int l = 0; l < AJ_ATT_LANES; ++l) lane[l] += x[j0 + l];
  float s = 0.0f;
  for (int l = 0; l < AJ_ATT_LANES; ++l) s += lane[l];
  return s;
}

/* out[j] = Σ_e a[e] · bt[e * BK + j] for j < BK (bt packed transposed, zero past its keys). */
static inline void aj_att_scores(float *restrict out, const float *restrict a, const float *restrict bt, int64_t E) {
  for (int64_t j = 0; j < AJ_ATT_BK; ++j) out[j] = 0.0f;
  int64_t e = 0;
  for (; e + 4 <= E; e += 4) {
    const float a0 = a[e], a1 = a[e + 1], a2 = a[e + 2], a3 = a[e + 3];
    const float *restrict b0 = bt + e * AJ_ATT_BK, *restrict b1 = b0 + AJ_ATT_BK, *restrict b2 = b1 + AJ_ATT_BK, *restrict b3 = b2 + AJ_ATT_BK;
    for (int64_t j = 0; j < AJ_ATT_BK; ++j) out[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
  }
  for (; e < E; ++e) {
    const float a0 = a[e];
    const float *restrict b0 = bt + e * AJ_ATT_BK;
    for (int64_t j = 0; j < AJ_ATT_BK; ++j) out[j] += a0 * b0[j];
  }
}

/* The same over a block of query rows: out[i] = Σ_e a[e] · bt[e * BQ + i], i < BQ. */
static inline void aj_att_scores_q(float *restrict out, const float *restrict a, const float *restrict bt, int64_t E) {
  for (int64_t i = 0; i < AJ_ATT_BQ; ++i) out[i] = 0.0f;
  int64_t e = 0;
  for (; e + 4 <= E; e += 4) {
    const float a0 = a[e], a1 = a[e + 1], a2 = a[e + 2], a3 = a[e + 3];
    const float *restrict b0 = bt + e * AJ_ATT_BQ, *restrict b1 = b0 + AJ_ATT_BQ, *restrict b2 = b1 + AJ_ATT_BQ, *restrict b3 = b2 + AJ_ATT_BQ;
    for (int64_t i = 0; i < AJ_ATT_BQ; ++i) out[i] += a0 * b0[i] + a1 * b1[i] + a2 * b2[i] + a3 * b3[i];
  }
  for (; e < E; ++e) {
    const float a0 = a[e];
    const float *restrict b0 = bt + e * AJ_ATT_BQ;
    for (int64_t i = 0; i < AJ_ATT_BQ; ++i) out[i] += a0 * b0[i];
  }
}

/* acc[f] += Σ_j w[j] · rows[j * stride + f] over j < n, f < F. */
static inline void aj_att_mix(float *restrict acc, const float *restrict w, const float *rows, int64_t stride, int64_t n, int64_t F) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
    const float *restrict r0 = rows + j * stride, *restrict r1 = r0 + stride, *restrict r2 = r1 + stride, *restrict r3 = r2 + stride;
    for (int64_t f = 0; f < F; ++f) acc[f] += w0 * r0[f] + w1 * r1[f] + w2 * r2[f] + w3 * r3[f];
  }
  for (; j < n; ++j) {
    const float w0 = w[j];
    const float *restrict r0 = rows + j * stride;
    for (int64_t f = 0; f < F; ++f) acc[f] += w0 * r0[f];
  }
}

/* Packs rows [0, n) of `src` (row stride `stride`, F features) transposed into dst[f * B + j],
   zero for j in [n, B). */
static inline void aj_att_pack_t(float *restrict dst, const float *src, int64_t stride, int64_t n, int64_t F, int64_t B) {
  for (int64_t f = 0; f < F; ++f)
    for (int64_t j = n; j < B; ++j) dst[f * B + j] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float *restrict r = src + j * stride;
    for (int64_t f = 0; f < F; ++f) dst[f * B + j] = r[f];
  }
}

/* Forward: query rows [t0, t0 + rows) of (b, h). */
static void aj_att_forward_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5];
  const int64_t BQ = AJ_ATT_BQ, BK = AJ_ATT_BK, nq = (Tq + BQ - 1) / BQ;
  const int64_t qb = u % nq, bh = u / nq, h = bh % H, b = bh / H;
  int64_t qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, osb, osh, ost;
  aj_att_strides(c, Tq, E, &qsb, &qsh, &qst);
  aj_att_strides(c, Tk, E, &ksb, &ksh, &kst);
  aj_att_strides(c, Tk, Ev, &vsb, &vsh, &vst);
  aj_att_strides(c, Tq, Ev, &osb, &osh, &ost);
  const float *qp = c->q + b * qsb + h * qsh, *kp = c->k + b * ksb + h * ksh, *vp = c->v + b * vsb + h * vsh;
  float *op = c->out + b * osb + h * osh;
  const int64_t t0 = qb * BQ, rows = Tq - t0 < BQ ? Tq - t0 : BQ;
  float *restrict kt = buf, *restrict s = kt + E * BK, *restrict acc = s + BQ * BK;
  float *restrict m = acc + BQ * Ev, *restrict l = m + BQ;
  for (int64_t i = 0; i < rows; ++i) { m[i] = -1e30f; l[i] = 0.0f; }
  for (int64_t i = 0; i < rows * Ev; ++i) acc[i] = 0.0f;
  const int64_t kend = c->causal ? (t0 + rows < Tk ? t0 + rows : Tk) : Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    const int64_t kn = kend - k0 < BK ? kend - k0 : BK;
    aj_att_pack_t(kt, kp + k0 * kst, kst, kn, E, BK);
    for (int64_t i = 0; i < rows; ++i) {
      float *restrict si = s + i * BK;
      aj_att_scores(si, qp + (t0 + i) * qst, kt, E);
      /* Keys past the row (causal) or past the block take no part. */
      const int64_t lim = c->causal ? t0 + i + 1 - k0 : kn;
      const int64_t visible = lim < kn ? (lim > 0 ? lim : 0) : kn;
      if (visible == 0) continue;
      const float scale = c->scale;
      for (int64_t j = 0; j < BK; ++j) si[j] = j < visible ? si[j] * scale : -1e30f;
      const float mx = aj_att_row_max(si, BK, m[i]);
      const float shrink = aj_att_exp(m[i] - mx);
      for (int64_t j = 0; j < BK; ++j) { const float p = aj_att_exp(si[j] - mx); si[j] = j < visible ? p : 0.0f; }
      l[i] = l[i] * shrink + aj_att_row_sum(si, BK);
      m[i] = mx;
      float *restrict ai = acc + i * Ev;
      for (int64_t f = 0; f < Ev; ++f) ai[f] *= shrink;
      aj_att_mix(ai, si, vp + k0 * vst, vst, visible, Ev);
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    float *restrict oi = op + (t0 + i) * ost;
    const float *restrict ai = acc + i * Ev;
    const float inv = 1.0f / l[i];
    for (int64_t f = 0; f < Ev; ++f) oi[f] = ai[f] * inv;
    c->lse[bh * Tq + t0 + i] = m[i] + logf(l[i]);
  }
}

/* Query gradient: rows [t0, t0 + rows) of (b, h). */
static void aj_att_grad_query_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5];
  const int64_t BQ = AJ_ATT_BQ, BK = AJ_ATT_BK, nq = (Tq + BQ - 1) / BQ;
  const int64_t qb = u % nq, bh = u / nq, h = bh % H, b = bh / H;
  int64_t qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, osb, osh, ost;
  aj_att_strides(c, Tq, E, &qsb, &qsh, &qst);
  aj_att_strides(c, Tk, E, &ksb, &ksh, &kst);
  aj_att_strides(c, Tk, Ev, &vsb, &vsh, &vst);
  aj_att_strides(c, Tq, Ev, &osb, &osh, &ost);
  const float *qp = c->q + b * qsb + h * qsh, *kp = c->k + b * ksb + h * ksh, *vp = c->v + b * vsb + h * vsh;
  const float *gop = c->go + b * osb + h * osh;
  float *gqp = c->g1 + b * qsb + h * qsh;
  const int64_t t0 = qb * BQ, rows = Tq - t0 < BQ ? Tq - t0 : BQ;
  float *restrict kt = buf, *restrict vt = kt + E * BK, *restrict p = vt + Ev * BK;
  float *restrict dp = p + BK, *restrict acc = dp + BK;
  for (int64_t i = 0; i < rows * E; ++i) acc[i] = 0.0f;
  const int64_t kend = c->causal ? (t0 + rows < Tk ? t0 + rows : Tk) : Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    const int64_t kn = kend - k0 < BK ? kend - k0 : BK;
    aj_att_pack_t(kt, kp + k0 * kst, kst, kn, E, BK);
    aj_att_pack_t(vt, vp + k0 * vst, vst, kn, Ev, BK);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = t0 + i;
      const int64_t lim = c->causal ? t + 1 - k0 : kn;
      const int64_t visible = lim < kn ? (lim > 0 ? lim : 0) : kn;
      if (visible == 0) continue;
      const float li = c->lse_in[bh * Tq + t], di = c->delta[bh * Tq + t], scale = c->scale;
      aj_att_scores(p, qp + t * qst, kt, E);
      aj_att_scores(dp, gop + t * ost, vt, Ev);
      for (int64_t j = 0; j < BK; ++j) {
        const float w = aj_att_exp(p[j] * scale - li);
        p[j] = j < visible ? w * (dp[j] - di) * scale : 0.0f;
      }
      aj_att_mix(acc + i * E, p, kp + k0 * kst, kst, visible, E);
    }
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t e = 0; e < E; ++e) gqp[(t0 + i) * qst + e] = acc[i * E + e];
}

/* Key and value gradients: keys [s0, s0 + keys) of (b, h). */
static void aj_att_grad_key_value_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5];
  const int64_t BQ = AJ_ATT_BQ, BK = AJ_ATT_BK, nk = (Tk + BK - 1) / BK;
  const int64_t kb = u % nk, bh = u / nk, h = bh % H, b = bh / H;
  int64_t qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, osb, osh, ost;
  aj_att_strides(c, Tq, E, &qsb, &qsh, &qst);
  aj_att_strides(c, Tk, E, &ksb, &ksh, &kst);
  aj_att_strides(c, Tk, Ev, &vsb, &vsh, &vst);
  aj_att_strides(c, Tq, Ev, &osb, &osh, &ost);
  const float *qp = c->q + b * qsb + h * qsh, *kp = c->k + b * ksb + h * ksh, *vp = c->v + b * vsb + h * vsh;
  const float *gop = c->go + b * osb + h * osh;
  float *gkp = c->g1 + b * ksb + h * ksh, *gvp = c->g2 + b * vsb + h * vsh;
  const float *lse = c->lse_in + bh * Tq, *delta = c->delta + bh * Tq;
  const int64_t s0 = kb * BK, keys = Tk - s0 < BK ? Tk - s0 : BK;
  float *restrict qt = buf, *restrict got = qt + E * BQ, *restrict p = got + Ev * BQ;
  float *restrict dp = p + BQ, *restrict dk = dp + BQ, *restrict dv = dk + BK * E;
  float lq[AJ_ATT_BQ], dq[AJ_ATT_BQ];
  for (int64_t i = 0; i < keys * E; ++i) dk[i] = 0.0f;
  for (int64_t i = 0; i < keys * Ev; ++i) dv[i] = 0.0f;
  /* Causal: rows before the block's first key see none of its keys. */
  const int64_t tstart = c->causal ? (s0 < Tq ? s0 / BQ * BQ : Tq) : 0;
  for (int64_t t0 = tstart; t0 < Tq; t0 += BQ) {
    const int64_t rn = Tq - t0 < BQ ? Tq - t0 : BQ;
    aj_att_pack_t(qt, qp + t0 * qst, qst, rn, E, BQ);
    aj_att_pack_t(got, gop + t0 * ost, ost, rn, Ev, BQ);
    for (int64_t i = 0; i < BQ; ++i) {
      lq[i] = i < rn ? lse[t0 + i] : 0.0f;
      dq[i] = i < rn ? delta[t0 + i] : 0.0f;
    }
    const float scale = c->scale;
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t s = s0 + j;
      /* Causal: rows t >= s see key s. */
      const int64_t first = c->causal ? (s - t0 > 0 ? s - t0 : 0) : 0;
      if (first >= rn) continue;
      aj_att_scores_q(p, kp + s * kst, qt, E);
      aj_att_scores_q(dp, vp + s * vst, got, Ev);
      for (int64_t i = 0; i < BQ; ++i) {
        const float w = aj_att_exp(p[i] * scale - lq[i]);
        const int keep = i >= first && i < rn;
        p[i] = keep ? w : 0.0f;
        dp[i] = keep ? w * (dp[i] - dq[i]) * scale : 0.0f;
      }
      aj_att_mix(dv + j * Ev, p + first, gop + (t0 + first) * ost, ost, rn - first, Ev);
      aj_att_mix(dk + j * E, dp + first, qp + (t0 + first) * qst, qst, rn - first, E);
    }
  }
  for (int64_t j = 0; j < keys; ++j) {
    for (int64_t e = 0; e < E; ++e) gkp[(s0 + j) * kst + e] = dk[j * E + e];
    for (int64_t f = 0; f < Ev; ++f) gvp[(s0 + j) * vst + f] = dv[j * Ev + f];
  }
}

/* Without memory for a block's buffers (a few KiB per worker): the same pass row by row
   (key by key for the key-value pass), accumulating in the result arrays themselves. */
#define AJ_ATT_PROLOGUE(nblocks_of, B) \
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5]; \
  const int64_t nb = (nblocks_of + (B) - 1) / (B); \
  const int64_t blk = u % nb, bh = u / nb, h = bh % H, b = bh / H; \
  int64_t qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, osb, osh, ost; \
  aj_att_strides(c, Tq, E, &qsb, &qsh, &qst); \
  aj_att_strides(c, Tk, E, &ksb, &ksh, &kst); \
  aj_att_strides(c, Tk, Ev, &vsb, &vsh, &vst); \
  aj_att_strides(c, Tq, Ev, &osb, &osh, &ost); \
  const float *qp = c->q + b * qsb + h * qsh, *kp = c->k + b * ksb + h * ksh, *vp = c->v + b * vsb + h * vsh;

static float aj_att_dot(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

static void aj_att_forward_rows(const aj_att_ctx *c, int64_t u) {
  AJ_ATT_PROLOGUE(Tq, AJ_ATT_BQ)
  float *op = c->out + b * osb + h * osh;
  const int64_t t0 = blk * AJ_ATT_BQ, t1 = t0 + AJ_ATT_BQ < Tq ? t0 + AJ_ATT_BQ : Tq;
  for (int64_t t = t0; t < t1; ++t) {
    float *oi = op + t * ost, m = -1e30f, l = 0.0f;
    for (int64_t f = 0; f < Ev; ++f) oi[f] = 0.0f;
    const int64_t kend = c->causal && t + 1 < Tk ? t + 1 : Tk;
    for (int64_t s = 0; s < kend; ++s) {
      const float sc = aj_att_dot(qp + t * qst, kp + s * kst, E) * c->scale;
      const float mx = sc > m ? sc : m, shrink = aj_att_exp(m - mx), p = aj_att_exp(sc - mx);
      l = l * shrink + p;
      for (int64_t f = 0; f < Ev; ++f) oi[f] = oi[f] * shrink + p * vp[s * vst + f];
      m = mx;
    }
    for (int64_t f = 0; f < Ev; ++f) oi[f] /= l;
    c->lse[bh * Tq + t] = m + logf(l);
  }
}

static void aj_att_grad_query_rows(const aj_att_ctx *c, int64_t u) {
  AJ_ATT_PROLOGUE(Tq, AJ_ATT_BQ)
  const float *gop = c->go + b * osb + h * osh;
  float *gqp = c->g1 + b * qsb + h * qsh;
  const int64_t t0 = blk * AJ_ATT_BQ, t1 = t0 + AJ_ATT_BQ < Tq ? t0 + AJ_ATT_BQ : Tq;
  for (int64_t t = t0; t < t1; ++t) {
    float *gi = gqp + t * qst;
    for (int64_t e = 0; e < E; ++e) gi[e] = 0.0f;
    const int64_t kend = c->causal && t + 1 < Tk ? t + 1 : Tk;
    for (int64_t s = 0; s < kend; ++s) {
      const float w = aj_att_exp(aj_att_dot(qp + t * qst, kp + s * kst, E) * c->scale - c->lse_in[bh * Tq + t]);
      const float ds = w * (aj_att_dot(gop + t * ost, vp + s * vst, Ev) - c->delta[bh * Tq + t]) * c->scale;
      for (int64_t e = 0; e < E; ++e) gi[e] += ds * kp[s * kst + e];
    }
  }
}

static void aj_att_grad_key_value_rows(const aj_att_ctx *c, int64_t u) {
  AJ_ATT_PROLOGUE(Tk, AJ_ATT_BK)
  const float *gop = c->go + b * osb + h * osh;
  float *gkp = c->g1 + b * ksb + h * ksh, *gvp = c->g2 + b * vsb + h * vsh;
  const int64_t s0 = blk * AJ_ATT_BK, s1 = s0 + AJ_ATT_BK < Tk ? s0 + AJ_ATT_BK : Tk;
  for (int64_t s = s0; s < s1; ++s) {
    float *gk = gkp + s * kst, *gv = gvp + s * vst;
    for (int64_t e = 0; e < E; ++e) gk[e] = 0.0f;
    for (int64_t f = 0; f < Ev; ++f) gv[f] = 0.0f;
    for (int64_t t = c->causal ? s : 0; t < Tq; ++t) {
      const float w = aj_att_exp(aj_att_dot(kp + s * kst, qp + t * qst, E) * c->scale - c->lse_in[bh * Tq + t]);
      const float ds = w * (aj_att_dot(vp + s * vst, gop + t * ost, Ev) - c->delta[bh * Tq + t]) * c->scale;
      for (int64_t f = 0; f < Ev; ++f) gv[f] += w * gop[t * ost + f];
      for (int64_t e = 0; e < E; ++e) gk[e] += ds * qp[t * qst + e];
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
  float *buf = (float *)malloc((size_t)job->buf_floats * sizeof(float));
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

__attribute__((visibility("hidden"))) void aj_attention_forward_f32(const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v, float *out, float *lse, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, q, k, v, 0, 0, 0, out, lse, 0, 0, 0, 0 };
  c.units = d[0] * d[1] * ((d[2] + AJ_ATT_BQ - 1) / AJ_ATT_BQ);
  aj_att_run(&c, aj_att_forward_unit, aj_att_forward_rows, d[4] * AJ_ATT_BK + AJ_ATT_BQ * AJ_ATT_BK + AJ_ATT_BQ * d[5] + 2 * AJ_ATT_BQ, par);
}

__attribute__((visibility("hidden"))) void aj_attention_grad_query_f32(const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v, const float *go, const float *lse, const float *delta, float *gq, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, q, k, v, go, lse, delta, 0, 0, gq, 0, 0, 0 };
  c.units = d[0] * d[1] * ((d[2] + AJ_ATT_BQ - 1) / AJ_ATT_BQ);
  aj_att_run(&c, aj_att_grad_query_unit, aj_att_grad_query_rows, d[4] * AJ_ATT_BK + d[5] * AJ_ATT_BK + 2 * AJ_ATT_BK + AJ_ATT_BQ * d[4], par);
}

__attribute__((visibility("hidden"))) void aj_attention_grad_key_value_f32(const int64_t *d, int heads_first, int causal, float scale, const float *q, const float *k, const float *v, const float *go, const float *lse, const float *delta, float *gk, float *gv, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, q, k, v, go, lse, delta, 0, 0, gk, gv, 0, 0 };
  c.units = d[0] * d[1] * ((d[3] + AJ_ATT_BK - 1) / AJ_ATT_BK);
  aj_att_run(&c, aj_att_grad_key_value_unit, aj_att_grad_key_value_rows, d[4] * AJ_ATT_BQ + d[5] * AJ_ATT_BQ + 2 * AJ_ATT_BQ + AJ_ATT_BK * d[4] + AJ_ATT_BK * d[5], par);
}
"#;

/// The helper unit: its exponential (the backends' branch-free `aj_exp_f32`, so the loops over
/// a block's scores vectorize), the passes, compiled at `-O2` with multiply-adds contracted
/// (as the product helper's micro-kernel is).
fn definition() -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{LIGHT_BEGIN}\n{}", crate::c::gemm::CONTRACT_FAST);
    // The blocks are constants of the unit, so the loops over a block have fixed trip counts.
    let _ = writeln!(
        s,
        "#define AJ_ATT_BQ {ATTENTION_BLOCK_QUERIES}\n#define AJ_ATT_BK {ATTENTION_BLOCK_KEYS}"
    );
    let _ = writeln!(
        s,
        "#include <string.h>\nstatic inline float aj_att_exp(float x) {{\n  {}\n}}",
        crate::c::syntax::EXP_F32_BODY
    );
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
        products
            .entry(UNIT.to_string())
            .or_insert_with(|| (signatures(), definition()));
        let op = &plan.op;
        let spec = op.spec();
        let d = spec.dims();
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
        let common = format!(
            "aj_att_d, {}, {}, {:e}f, {q}, {k}, {v}",
            i32::from(spec.layout == AttentionLayout::HeadsFirst),
            i32::from(spec.causal),
            spec.scale as f32,
        );
        let call = match &**op {
            AttentionOp::Forward { out: o, lse, .. } => format!(
                "aj_attention_forward_f32({common}, {}, {}, par);",
                name(o)?,
                name(lse)?
            ),
            AttentionOp::GradQuery {
                lse,
                delta,
                grad_out,
                grad_q,
                ..
            } => format!(
                "aj_attention_grad_query_f32({common}, {}, {}, {}, {}, par);",
                name(grad_out)?,
                name(lse)?,
                name(delta)?,
                name(grad_q)?
            ),
            AttentionOp::GradKeyValue {
                lse,
                delta,
                grad_out,
                grad_k,
                grad_v,
                ..
            } => format!(
                "aj_attention_grad_key_value_f32({common}, {}, {}, {}, {}, {}, par);",
                name(grad_out)?,
                name(lse)?,
                name(delta)?,
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
