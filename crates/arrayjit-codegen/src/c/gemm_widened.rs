//! C for a product with one factor stored in `bf16` and everything else in `f32` (a model's
//! weights kept in `bf16`, see [`arrayjit_opt::schedule::Gemm::widened_factor`]): the `bf16`
//! factor is widened to `f32` as it is read, never copied whole.
//!
//! - One row of the result (a decoding step: `x · W`, `x · Eᵀ`): a row product in the two
//!   orders of the `f32` helper's (`gemm_row`), reading two vectors' worth of `bf16` as one
//!   vector of 32-bit lanes and widening the even elements by a shift and the odd ones by a
//!   mask, in registers, so the product reads 2 bytes per weight instead of 4.
//! - Otherwise the `f32` helper's blocked product ([`crate::c::gemm`]) on panels of the `bf16`
//!   factor widened as they are packed (`{name}_times_packed`, the packed product the attention
//!   helper uses too): B is read once per block of columns, as the `f32` helper reads it.
//! - A single column (`N = 1`) widens the column and runs the `f32` helper.
//!
//! With the narrow factor on the left, `C = A · B` runs as `Cᵀ = Bᵀ · Aᵀ` (the same sums). The
//! products carry no guard (the schedule takes a widened factor only unguarded). Each element's
//! sum has one order for a shape, whatever the workers.

use std::fmt::Write as _;

use arrayjit_ir::Prec;
use arrayjit_opt::schedule::{Blocking, FactorSide, StreamFetch};

use crate::c::gemm::{CONTRACT_END, CONTRACT_FAST, gemm_name, gemm_signature};
use crate::c::gemm_row::{ROW_BLOCK, column_prefetch, row_prefetch, write_lanes_sum};
use crate::c::kernel::{OPTIMIZE_END, PRODUCT_HELPER_BEGIN};
use crate::c::syntax::c_storage_type;

/// The unit's name for a product in `prec` with one factor in `narrow` (both entry points,
/// [`widened_entry`], live in it).
pub fn widened_unit(prec: Prec, narrow: Prec, b: &Blocking) -> String {
    format!("{}_w{}", gemm_name(prec, b), narrow.name())
}

/// The function a product with the `side` factor in `narrow` calls: the unit's name with `_a`
/// (left factor narrow) or `_b` (right factor narrow).
pub fn widened_entry(prec: Prec, narrow: Prec, b: &Blocking, side: FactorSide) -> String {
    let suffix = match side {
        FactorSide::Lhs => "a",
        FactorSide::Rhs => "b",
    };
    format!("{}_{suffix}", widened_unit(prec, narrow, b))
}

/// The prototypes of the unit's two entry points (one per line, the last without its `;`): as
/// [`gemm_signature`]'s function, with the narrow factor's pointer of its storage type.
pub fn widened_signatures(prec: Prec, narrow: Prec, b: &Blocking) -> String {
    let t = c_storage_type(prec);
    let n = c_storage_type(narrow);
    let hidden = "__attribute__((visibility(\"hidden\")))";
    let rest = format!(
        "{t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *guard, const aj_par *par)"
    );
    format!(
        "{hidden} void {}(int64_t M, int64_t N, int64_t K, const {n} *A, int64_t rsA, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {rest};\n{hidden} void {}(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {n} *B, int64_t rsB, int64_t csB, {rest}",
        widened_entry(prec, narrow, b, FactorSide::Lhs),
        widened_entry(prec, narrow, b, FactorSide::Rhs),
    )
}

/// The unit: the widening reads, the row product, the packing of widened panels, the
/// product over the workers and its two entry points. It calls the `f32` helper of the same
/// blocking ([`gemm_name`]), which must be linked beside it. `prec` must be `f32` and `narrow`
/// `bf16` (the only pair the schedule takes).
pub fn widened_definition(prec: Prec, narrow: Prec, b: &Blocking) -> String {
    debug_assert!(prec == Prec::F32 && narrow == Prec::Bf16);
    let t = c_storage_type(prec);
    let n = c_storage_type(narrow);
    let elem = prec.size_in_bytes();
    let lanes = (b.nr / 2).max(1);
    let vt = format!("aj_v{}{}", lanes, prec.name());
    let g = gemm_name(prec, b);
    let w = widened_unit(prec, narrow, b);
    let (entry_a, entry_b) = (
        widened_entry(prec, narrow, b, FactorSide::Lhs),
        widened_entry(prec, narrow, b, FactorSide::Rhs),
    );
    let (mr, nr, kc, nc) = (b.mr, b.nr, b.kc, b.nc);
    let hidden = "__attribute__((visibility(\"hidden\")))";
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#include <stdlib.h>\n{PRODUCT_HELPER_BEGIN}\n{CONTRACT_FAST}"
    );
    let _ = writeln!(
        s,
        "#ifndef AJ_{vt}_DEFINED\n#define AJ_{vt}_DEFINED\ntypedef {t} {vt} __attribute__((vector_size({}), aligned({elem})));\n#endif",
        lanes * elem
    );
    // The f32 helper's entry points this unit calls (defined in the helper's own unit).
    let _ = writeln!(
        s,
        "{};\n{hidden} int64_t {g}_packed_size(int64_t K, int64_t N);\n{hidden} int {g}_times_packed(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const void *Bpv, {t} *C, int64_t rsC, int64_t csC, int ovw);",
        gemm_signature(prec, b)
    );
    // bf16 is the high half of an f32. Two lanes' worth of bf16 (2L elements) read as L 32-bit
    // lanes hold the even elements in their low halves and the odd ones in their high halves:
    // widened by a shift and a mask, with no shuffle across lanes (gcc's widening of 16 u16
    // lanes took four shuffles a vector, and the row product ran at half the bytes per second).
    let _ = write!(
        s,
        "typedef uint32_t {w}_vu __attribute__((vector_size({vbytes}), aligned(2)));
static inline {t} {w}_one({n} h) {{ uint32_t u = (uint32_t)h << 16; {t} f; memcpy(&f, &u, sizeof f); return f; }}
/* The 2 x {lanes} elements at p: the even ones in *e, the odd ones in *o. */
static inline void {w}_pairs(const {n} *p, {vt} *e, {vt} *o) {{
  {w}_vu u; memcpy(&u, p, sizeof u);
  const {w}_vu lo = u << 16, hi = u & 0xffff0000u;
  memcpy(e, &lo, sizeof lo); memcpy(o, &hi, sizeof hi);
}}
",
        vbytes = lanes * 4,
    );
    write_widened_row(&mut s, &w, b.stream_fetch, (t, n, &vt, lanes));
    let _ = write!(
        s,
        "/* B's block of depths [pc, pc + kcb) and columns [jc, jc + ncb) widened into panels of {nr}
   columns, sb apart, zero-padded: the layout {g}_times_packed reads. */
static void {w}_pack_b({t} *restrict Bp, int64_t sb, const {n} *B, int64_t rsB, int64_t csB, int64_t jc, int64_t ncb, int64_t pc, int64_t kcb) {{
  const int64_t whole = csB == 1 ? ncb / {nr} * {nr} : 0;
  /* Rows of B contiguous: row by row, each row's part of the block read once, in order. */
  for (int64_t k = 0; k < kcb; ++k) {{
    const {n} *src = B + (pc + k) * rsB + jc;
    for (int64_t j0 = 0; j0 < whole; j0 += {nr}) {{
      {t} *dst = Bp + j0 / {nr} * sb + k * {nr};
      for (int64_t q = 0; q < {nr}; ++q) dst[q] = {w}_one(src[j0 + q]);
    }}
  }}
  for (int64_t j0 = whole; j0 < ncb; j0 += {nr}) {{
    {t} *dst = Bp + j0 / {nr} * sb;
    const int64_t width = ncb - j0 < {nr} ? ncb - j0 : {nr};
    for (int64_t j = 0; j < {nr}; ++j) {{
      if (j < width) {{
        const {n} *src = B + pc * rsB + (jc + j0 + j) * csB;
        for (int64_t k = 0; k < kcb; ++k) dst[k * {nr} + j] = {w}_one(src[k * rsB]);
      }} else {{
        for (int64_t k = 0; k < kcb; ++k) dst[k * {nr} + j] = 0;
      }}
    }}
  }}
}}
/* C (=, or += where !ovw) A · B on one thread. */
static void {w}_serial(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {n} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw) {{
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {{ {g}(M, N, 0, A, rsA, csA, (const {t} *)0, 0, 0, C, rsC, csC, ovw, 0, 0); return; }}
  if (M == 1 && {w}_row(N, K, A, csA, B, rsB, csB, C, csC, ovw)) return;
  static _Thread_local {t} *pack = 0;
  static _Thread_local size_t pack_len = 0;
  /* Depth blocks of equal depth (at most kc, a multiple of 8 where K is split), as the f32
     helper's. */
  const int64_t kblocks = (K + {kc} - 1) / {kc};
  const int64_t kcs = kblocks <= 1 ? K : ((K + kblocks - 1) / kblocks + 7) / 8 * 8;
  const int64_t ncr = N < {nc} ? N : {nc};
  /* A single column: widened whole; otherwise panels of a block of columns. */
  const size_t need = N == 1 ? (size_t)K : (size_t){g}_packed_size(kcs, ncr);
  if (need > pack_len) {{
    free(pack);
    pack = ({t} *)aligned_alloc(64, (need * sizeof({t}) + 63) / 64 * 64);
    pack_len = pack ? need : 0;
  }}
  if (pack && N == 1) {{
    for (int64_t k = 0; k < K; ++k) pack[k] = {w}_one(B[k * rsB]);
    {g}(M, 1, K, A, rsA, csA, pack, 1, 1, C, rsC, csC, ovw, 0, 0);
    return;
  }}
  /* {g}_times_packed refuses only for want of memory for A's slivers, the same need at
     every call: only the first can be refused, before anything is written. */
  int packed = pack != 0;
  for (int64_t jc = 0; packed && jc < N; jc += {nc}) {{
    const int64_t ncb = N - jc < {nc} ? N - jc : {nc};
    for (int64_t pc = 0; pc < K; pc += kcs) {{
      const int64_t kcb = K - pc < kcs ? K - pc : kcs;
      {w}_pack_b(pack, {g}_packed_size(kcb, {nr}), B, rsB, csB, jc, ncb, pc, kcb);
      if ({g}_times_packed(M, ncb, kcb, A + pc * csA, rsA, csA, pack, C + jc * csC, rsC, csC, ovw && pc == 0)) {{
        packed = 0;
        break;
      }}
    }}
  }}
  if (packed) return;
  /* No memory for packing: the plain loops. */
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {{
      {t} acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += A[i * rsA + k * csA] * {w}_one(B[k * rsB + j * csB]);
      C[i * rsC + j * csC] = ovw ? acc : C[i * rsC + j * csC] + acc;
    }}
}}
/* Over the device's workers: the longer side split into ranges of whole register tiles, one
   product per range, as the f32 helper splits. */
typedef struct {{ int64_t M, N, K; const {t} *A; int64_t rsA, csA; const {n} *B; int64_t rsB, csB; {t} *C; int64_t rsC, csC; int64_t split_n, per; int ovw; }} {w}_job;
static void {w}_chunk(void *ctx, int64_t index) {{
  const {w}_job *j = ({w}_job *)ctx;
  const int64_t lo = index * j->per, total = j->split_n ? j->N : j->M;
  const int64_t hi = lo + j->per < total ? lo + j->per : total;
  if (lo >= hi) return;
  if (j->split_n)
    {w}_serial(j->M, hi - lo, j->K, j->A, j->rsA, j->csA, j->B + lo * j->csB, j->rsB, j->csB, j->C + lo * j->csC, j->rsC, j->csC, j->ovw);
  else
    {w}_serial(hi - lo, j->N, j->K, j->A + lo * j->rsA, j->rsA, j->csA, j->B, j->rsB, j->csB, j->C + lo * j->rsC, j->rsC, j->csC, j->ovw);
}}
{hidden} void {entry_b}(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {n} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *guard, const aj_par *par) {{
  (void)guard; /* none: the schedule widens only unguarded products */
  const int64_t workers = par ? par->workers : 1;
  if (workers > 1 && (double)M * (double)N * (double)K >= 262144.0) {{
    const int64_t split_n = N >= M;
    const int64_t unit = split_n ? {nr} : {mr}, total = split_n ? N : M;
    const int64_t units = (total + unit - 1) / unit;
    const int64_t per = (units + workers - 1) / workers * unit;
    const int64_t chunks = (total + per - 1) / per;
    if (chunks > 1) {{
      {w}_job job = {{M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, split_n, per, ovw}};
      par->run(par->pool, {w}_chunk, &job, chunks);
      return;
    }}
  }}
  {w}_serial(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, ovw);
}}
/* The narrow factor on the left: C = A · B is C^T = B^T · A^T, the same sums. */
{hidden} void {entry_a}(int64_t M, int64_t N, int64_t K, const {n} *A, int64_t rsA, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *guard, const aj_par *par) {{
  {entry_b}(N, M, K, B, csB, rsB, A, csA, rsA, C, csC, rsC, ovw, guard, par);
}}
{CONTRACT_END}
{OPTIMIZE_END}
"
    );
    s
}

/// `{w}_row`: one row of A (f32) times B (bf16), as the `f32` helper's row product
/// ([`crate::c::gemm_row`]) in its two orders, with B read `2 × lanes` elements at a time and
/// widened into even and odd lanes ([`widened_definition`]'s `{w}_pairs`):
/// - rows of B contiguous: the accumulators of each `2 × lanes` columns hold the even columns,
///   then the odd ones, put back in order when stored;
/// - columns of B contiguous: A is copied once, its even and odd depths of each `2 × lanes`
///   apart, and each column's even and odd products summed in two vectors, added at the end.
///
/// B's lines are fetched into `fetch`. Each element's sum has one order for a shape, whatever
/// the workers.
fn write_widened_row(
    s: &mut String,
    w: &str,
    fetch: StreamFetch,
    (t, n, vt, lanes): (&str, &str, &str, usize),
) {
    let pair = 2 * lanes;
    write_lanes_sum(s, w, (t, vt, lanes));
    let (row_fetch, column_fetch) = (row_prefetch(fetch), column_prefetch(fetch));
    let _ = write!(
        s,
        "static int {w}_row(int64_t N, int64_t K, const {t} *A, int64_t csA, const {n} *B, int64_t rsB, int64_t csB, {t} *C, int64_t csC, int ovw) {{
  if (csB == 1 && rsB >= N) {{
    {t} acc[{ROW_BLOCK}] __attribute__((aligned(64)));
    for (int64_t jb = 0; jb < N; jb += {ROW_BLOCK}) {{
      const int64_t nb = N - jb < {ROW_BLOCK} ? N - jb : {ROW_BLOCK};
      const int64_t nv = nb / {pair} * {pair};
      memset(acc, 0, sizeof(acc));
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {{
        const {t} a0 = A[k * csA], a1 = A[(k + 1) * csA], a2 = A[(k + 2) * csA], a3 = A[(k + 3) * csA];
        const {n} *b0 = B + k * rsB + jb, *b1 = b0 + rsB, *b2 = b1 + rsB, *b3 = b2 + rsB;
        for (int64_t j = 0; j < nv; j += {pair}) {{
          {row_fetch}
          {vt} ce, co, e, o;
          memcpy(&ce, acc + j, sizeof ce); memcpy(&co, acc + j + {lanes}, sizeof co);
          {w}_pairs(b0 + j, &e, &o); ce += a0 * e; co += a0 * o;
          {w}_pairs(b1 + j, &e, &o); ce += a1 * e; co += a1 * o;
          {w}_pairs(b2 + j, &e, &o); ce += a2 * e; co += a2 * o;
          {w}_pairs(b3 + j, &e, &o); ce += a3 * e; co += a3 * o;
          memcpy(acc + j, &ce, sizeof ce); memcpy(acc + j + {lanes}, &co, sizeof co);
        }}
        for (int64_t j = nv; j < nb; ++j) {{
          {t} c = acc[j];
          c += a0 * {w}_one(b0[j]); c += a1 * {w}_one(b1[j]); c += a2 * {w}_one(b2[j]); c += a3 * {w}_one(b3[j]);
          acc[j] = c;
        }}
      }}
      for (; k < K; ++k) {{
        const {t} a = A[k * csA];
        const {n} *b = B + k * rsB + jb;
        for (int64_t j = 0; j < nv; j += {pair})
          for (int l = 0; l < {lanes}; ++l) {{
            acc[j + l] += a * {w}_one(b[j + 2 * l]);
            acc[j + {lanes} + l] += a * {w}_one(b[j + 2 * l + 1]);
          }}
        for (int64_t j = nv; j < nb; ++j) acc[j] += a * {w}_one(b[j]);
      }}
      {t} *c = C + jb * csC;
      /* Columns back in order: even ones first in each pair of vectors. */
      for (int64_t j = 0; j < nv; j += {pair})
        for (int l = 0; l < {lanes}; ++l) {{
          const {t} even = acc[j + l], odd = acc[j + {lanes} + l];
          if (ovw) {{ c[(j + 2 * l) * csC] = even; c[(j + 2 * l + 1) * csC] = odd; }}
          else {{ c[(j + 2 * l) * csC] += even; c[(j + 2 * l + 1) * csC] += odd; }}
        }}
      if (ovw) for (int64_t j = nv; j < nb; ++j) c[j * csC] = acc[j];
      else for (int64_t j = nv; j < nb; ++j) c[j * csC] += acc[j];
    }}
    return 1;
  }}
  if (rsB == 1 && csB >= K) {{
    /* A's even depths of each pair of vectors, then its odd ones, copied once per thread. */
    static _Thread_local {t} *row = 0;
    static _Thread_local size_t row_len = 0;
    const int64_t kv = K / {pair} * {pair};
    if ((size_t)K > row_len) {{
      free(row);
      row = ({t} *)aligned_alloc(64, ((size_t)K * sizeof({t}) + 63) / 64 * 64);
      row_len = row ? (size_t)K : 0;
    }}
    if (!row) return 0;
    for (int64_t k = 0; k < kv; k += {pair})
      for (int l = 0; l < {lanes}; ++l) {{
        row[k + l] = A[(k + 2 * l) * csA];
        row[k + {lanes} + l] = A[(k + 2 * l + 1) * csA];
      }}
    for (int64_t k = kv; k < K; ++k) row[k] = A[k * csA];
    int64_t j = 0;
    for (; j + 4 <= N; j += 4) {{
      const {n} *b0 = B + j * csB, *b1 = b0 + csB, *b2 = b1 + csB, *b3 = b2 + csB;
      {vt} s0 = {{0}}, s1 = {{0}}, s2 = {{0}}, s3 = {{0}}, t0 = {{0}}, t1 = {{0}}, t2 = {{0}}, t3 = {{0}};
      for (int64_t k = 0; k < kv; k += {pair}) {{
        {column_fetch}
        {vt} xe, xo, e, o;
        memcpy(&xe, row + k, sizeof xe); memcpy(&xo, row + k + {lanes}, sizeof xo);
        {w}_pairs(b0 + k, &e, &o); s0 += xe * e; t0 += xo * o;
        {w}_pairs(b1 + k, &e, &o); s1 += xe * e; t1 += xo * o;
        {w}_pairs(b2 + k, &e, &o); s2 += xe * e; t2 += xo * o;
        {w}_pairs(b3 + k, &e, &o); s3 += xe * e; t3 += xo * o;
      }}
      {t} r[4] = {{{w}_lanes_sum(s0 + t0), {w}_lanes_sum(s1 + t1), {w}_lanes_sum(s2 + t2), {w}_lanes_sum(s3 + t3)}};
      for (int64_t k = kv; k < K; ++k) {{
        r[0] += row[k] * {w}_one(b0[k]); r[1] += row[k] * {w}_one(b1[k]);
        r[2] += row[k] * {w}_one(b2[k]); r[3] += row[k] * {w}_one(b3[k]);
      }}
      for (int q = 0; q < 4; ++q) C[(j + q) * csC] = ovw ? r[q] : C[(j + q) * csC] + r[q];
    }}
    for (; j < N; ++j) {{
      const {n} *b = B + j * csB;
      {vt} s0 = {{0}}, t0 = {{0}};
      for (int64_t k = 0; k < kv; k += {pair}) {{
        {vt} xe, xo, e, o;
        memcpy(&xe, row + k, sizeof xe); memcpy(&xo, row + k + {lanes}, sizeof xo);
        {w}_pairs(b + k, &e, &o); s0 += xe * e; t0 += xo * o;
      }}
      {t} r = {w}_lanes_sum(s0 + t0);
      for (int64_t k = kv; k < K; ++k) r += row[k] * {w}_one(b[k]);
      C[j * csC] = ovw ? r : C[j * csC] + r;
    }}
    return 1;
  }}
  return 0;
}}
"
    );
}
