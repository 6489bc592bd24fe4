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

use arrayjit_ir::schedule::AttentionPlan;
use arrayjit_ir::{AttentionLayout, AttentionOp, Result};

use crate::c::kernel::{KernelRenderer, LIGHT_BEGIN, comment};

/// The helper unit's name (also the name of its translation unit).
const UNIT: &str = "aj_attention_f32";

/// The three functions' prototypes (hidden outside the library, like the product helper's).
fn signatures() -> String {
    let common = "const int64_t *d, int heads_first, int causal, float scale, int64_t bq, int64_t bk, const float *q, const float *k, const float *v";
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
  const int64_t *d; int heads_first, causal; float scale; int64_t bq, bk;
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

/* Forward: query rows [t0, t0 + rows) of (b, h). */
static void aj_att_forward_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5];
  const int64_t BQ = c->bq, BK = c->bk, nq = (Tq + BQ - 1) / BQ;
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
    for (int64_t j = 0; j < kn; ++j)
      for (int64_t e = 0; e < E; ++e) kt[e * BK + j] = kp[(k0 + j) * kst + e];
    for (int64_t i = 0; i < rows; ++i) {
      float *restrict si = s + i * BK;
      const float *restrict qi = qp + (t0 + i) * qst;
      for (int64_t j = 0; j < kn; ++j) si[j] = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        const float qe = qi[e];
        const float *restrict kte = kt + e * BK;
        for (int64_t j = 0; j < kn; ++j) si[j] += qe * kte[j];
      }
      /* Keys past the row (causal) take no part: at most the first of them is < kn. */
      const int64_t visible = c->causal ? (t0 + i + 1 - k0 < kn ? t0 + i + 1 - k0 : kn) : kn;
      float mx = m[i];
      for (int64_t j = 0; j < visible; ++j) { si[j] *= c->scale; mx = si[j] > mx ? si[j] : mx; }
      const float shrink = aj_att_exp(m[i] - mx);
      float sum = 0.0f;
      for (int64_t j = 0; j < visible; ++j) { const float p = aj_att_exp(si[j] - mx); si[j] = p; sum += p; }
      l[i] = l[i] * shrink + sum;
      m[i] = mx;
      float *restrict ai = acc + i * Ev;
      for (int64_t f = 0; f < Ev; ++f) ai[f] *= shrink;
      for (int64_t j = 0; j < visible; ++j) {
        const float p = si[j];
        const float *restrict vj = vp + (k0 + j) * vst;
        for (int64_t f = 0; f < Ev; ++f) ai[f] += p * vj[f];
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    float *restrict oi = op + (t0 + i) * ost;
    const float *restrict ai = acc + i * Ev;
    for (int64_t f = 0; f < Ev; ++f) oi[f] = ai[f] / l[i];
    c->lse[bh * Tq + t0 + i] = m[i] + logf(l[i]);
  }
}

/* Query gradient: rows [t0, t0 + rows) of (b, h). */
static void aj_att_grad_query_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5];
  const int64_t BQ = c->bq, BK = c->bk, nq = (Tq + BQ - 1) / BQ;
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
    for (int64_t j = 0; j < kn; ++j) {
      for (int64_t e = 0; e < E; ++e) kt[e * BK + j] = kp[(k0 + j) * kst + e];
      for (int64_t f = 0; f < Ev; ++f) vt[f * BK + j] = vp[(k0 + j) * vst + f];
    }
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = t0 + i;
      const int64_t visible = c->causal ? (t + 1 - k0 < kn ? t + 1 - k0 : kn) : kn;
      const float *restrict qi = qp + t * qst, *restrict goi = gop + t * ost;
      const float li = c->lse_in[bh * Tq + t], di = c->delta[bh * Tq + t];
      for (int64_t j = 0; j < visible; ++j) { p[j] = 0.0f; dp[j] = 0.0f; }
      for (int64_t e = 0; e < E; ++e) {
        const float qe = qi[e];
        const float *restrict kte = kt + e * BK;
        for (int64_t j = 0; j < visible; ++j) p[j] += qe * kte[j];
      }
      for (int64_t f = 0; f < Ev; ++f) {
        const float ge = goi[f];
        const float *restrict vtf = vt + f * BK;
        for (int64_t j = 0; j < visible; ++j) dp[j] += ge * vtf[j];
      }
      for (int64_t j = 0; j < visible; ++j) {
        const float w = aj_att_exp(p[j] * c->scale - li);
        p[j] = w * (dp[j] - di) * c->scale;
      }
      float *restrict ai = acc + i * E;
      for (int64_t j = 0; j < visible; ++j) {
        const float ds = p[j];
        const float *restrict kj = kp + (k0 + j) * kst;
        for (int64_t e = 0; e < E; ++e) ai[e] += ds * kj[e];
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t e = 0; e < E; ++e) gqp[(t0 + i) * qst + e] = acc[i * E + e];
}

/* Key and value gradients: keys [s0, s0 + keys) of (b, h). */
static void aj_att_grad_key_value_unit(const aj_att_ctx *c, int64_t u, float *buf) {
  const int64_t H = c->d[1], Tq = c->d[2], Tk = c->d[3], E = c->d[4], Ev = c->d[5];
  const int64_t BQ = c->bq, BK = c->bk, nk = (Tk + BK - 1) / BK;
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
  for (int64_t i = 0; i < keys * E; ++i) dk[i] = 0.0f;
  for (int64_t i = 0; i < keys * Ev; ++i) dv[i] = 0.0f;
  /* Causal: rows before the block's first key see none of its keys. */
  const int64_t tstart = c->causal ? (s0 / BQ) * BQ : 0;
  for (int64_t t0 = tstart; t0 < Tq; t0 += BQ) {
    const int64_t rn = Tq - t0 < BQ ? Tq - t0 : BQ;
    for (int64_t i = 0; i < rn; ++i) {
      for (int64_t e = 0; e < E; ++e) qt[e * BQ + i] = qp[(t0 + i) * qst + e];
      for (int64_t f = 0; f < Ev; ++f) got[f * BQ + i] = gop[(t0 + i) * ost + f];
    }
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t s = s0 + j;
      /* Causal: rows t >= s see key s. */
      const int64_t first = c->causal ? (s - t0 > 0 ? s - t0 : 0) : 0;
      if (first >= rn) continue;
      const float *restrict kj = kp + s * kst, *restrict vj = vp + s * vst;
      for (int64_t i = first; i < rn; ++i) { p[i] = 0.0f; dp[i] = 0.0f; }
      for (int64_t e = 0; e < E; ++e) {
        const float ke = kj[e];
        const float *restrict qte = qt + e * BQ;
        for (int64_t i = first; i < rn; ++i) p[i] += ke * qte[i];
      }
      for (int64_t f = 0; f < Ev; ++f) {
        const float ve = vj[f];
        const float *restrict gtf = got + f * BQ;
        for (int64_t i = first; i < rn; ++i) dp[i] += ve * gtf[i];
      }
      for (int64_t i = first; i < rn; ++i) {
        const float w = aj_att_exp(p[i] * c->scale - lse[t0 + i]);
        p[i] = w;
        dp[i] = w * (dp[i] - delta[t0 + i]) * c->scale;
      }
      float *restrict dvj = dv + j * Ev, *restrict dkj = dk + j * E;
      for (int64_t i = first; i < rn; ++i) {
        const float w = p[i], ds = dp[i];
        const float *restrict goi = gop + (t0 + i) * ost, *restrict qi = qp + (t0 + i) * qst;
        for (int64_t f = 0; f < Ev; ++f) dvj[f] += w * goi[f];
        for (int64_t e = 0; e < E; ++e) dkj[e] += ds * qi[e];
      }
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
  AJ_ATT_PROLOGUE(Tq, c->bq)
  float *op = c->out + b * osb + h * osh;
  const int64_t t0 = blk * c->bq, t1 = t0 + c->bq < Tq ? t0 + c->bq : Tq;
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
  AJ_ATT_PROLOGUE(Tq, c->bq)
  const float *gop = c->go + b * osb + h * osh;
  float *gqp = c->g1 + b * qsb + h * qsh;
  const int64_t t0 = blk * c->bq, t1 = t0 + c->bq < Tq ? t0 + c->bq : Tq;
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
  AJ_ATT_PROLOGUE(Tk, c->bk)
  const float *gop = c->go + b * osb + h * osh;
  float *gkp = c->g1 + b * ksb + h * ksh, *gvp = c->g2 + b * vsb + h * vsh;
  const int64_t s0 = blk * c->bk, s1 = s0 + c->bk < Tk ? s0 + c->bk : Tk;
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
  float *buf = (float *)malloc((size_t)job->buf_floats * sizeof(float));
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

__attribute__((visibility("hidden"))) void aj_attention_forward_f32(const int64_t *d, int heads_first, int causal, float scale, int64_t bq, int64_t bk, const float *q, const float *k, const float *v, float *out, float *lse, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, bq, bk, q, k, v, 0, 0, 0, out, lse, 0, 0, 0, 0 };
  c.units = d[0] * d[1] * ((d[2] + bq - 1) / bq);
  aj_att_run(&c, aj_att_forward_unit, aj_att_forward_rows, d[4] * bk + bq * bk + bq * d[5] + 2 * bq, par);
}

__attribute__((visibility("hidden"))) void aj_attention_grad_query_f32(const int64_t *d, int heads_first, int causal, float scale, int64_t bq, int64_t bk, const float *q, const float *k, const float *v, const float *go, const float *lse, const float *delta, float *gq, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, bq, bk, q, k, v, go, lse, delta, 0, 0, gq, 0, 0, 0 };
  c.units = d[0] * d[1] * ((d[2] + bq - 1) / bq);
  aj_att_run(&c, aj_att_grad_query_unit, aj_att_grad_query_rows, d[4] * bk + d[5] * bk + 2 * bk + bq * d[4], par);
}

__attribute__((visibility("hidden"))) void aj_attention_grad_key_value_f32(const int64_t *d, int heads_first, int causal, float scale, int64_t bq, int64_t bk, const float *q, const float *k, const float *v, const float *go, const float *lse, const float *delta, float *gk, float *gv, const aj_par *par) {
  aj_att_ctx c = { d, heads_first, causal, scale, bq, bk, q, k, v, go, lse, delta, 0, 0, gk, gv, 0, 0 };
  c.units = d[0] * d[1] * ((d[3] + bk - 1) / bk);
  aj_att_run(&c, aj_att_grad_key_value_unit, aj_att_grad_key_value_rows, d[4] * bq + d[5] * bq + 2 * bq + bk * d[4] + bk * d[5], par);
}
"#;

/// The helper unit: its exponential (the backends' branch-free `aj_exp_f32`, so the loops over
/// a block's scores vectorize), the passes, compiled at `-O2` with multiply-adds contracted
/// (as the product helper's micro-kernel is).
fn definition() -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{LIGHT_BEGIN}\n{}", crate::c::gemm::CONTRACT_FAST);
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
        let common = format!(
            "aj_att_d, {}, {}, {:e}f, {}, {}, {q}, {k}, {v}",
            i32::from(spec.layout == AttentionLayout::HeadsFirst),
            i32::from(spec.causal),
            spec.scale as f32,
            plan.block_queries,
            plan.block_keys,
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
