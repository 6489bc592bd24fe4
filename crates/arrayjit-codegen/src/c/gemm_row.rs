//! The product helper's one-row product (`{name}_row`): one row of A times B, each factor read
//! once, in C (the helper whose matrix is stored in `bf16`, [`crate::c::gemm_widened`], has its
//! own, reading the matrix in pairs of lanes, with the same prefetches).

use std::fmt::Write as _;

use arrayjit_opt::schedule::StreamFetch;

/// Columns of C a row product accumulates at once (on the stack, in L1).
pub(crate) const ROW_BLOCK: usize = 2048;

/// In the order with rows of B contiguous, each vector's step fetches the same columns of the
/// next four rows (`b0..b3` and `j` in scope) into `level`. The rows are `rsB` apart, so the
/// hardware's prefetchers, which follow one stream per page, see four short streams per step:
/// on the Xeon (6/207) a decoding step's `bf16` products of 768 × 3072 ran in 0.29 ms with
/// fetches into L1 against 0.34–0.40 ms without (weights beyond the cache, alternated runs).
/// Which level is faster differs between CPUs ([`StreamFetch`]).
pub(crate) fn row_prefetch(level: StreamFetch) -> String {
    four_fetches(level, |r| format!("b{r} + j + 4 * rsB"))
}

/// In the order with columns of B contiguous, each vector's step fetches the same depths of the
/// columns eight ahead (`b0..b3` and `k` in scope) into `level`: two groups of four ahead.
/// Four columns read in step, each a few cache lines long, are four streams in one or two
/// pages, which the hardware's prefetchers follow badly: on the Xeon (6/207) a tied head of
/// 50257 × 768 `bf16` weights read 3–6 ms with fetches into L1 against 8–12 ms without
/// (alternated runs).
pub(crate) fn column_prefetch(level: StreamFetch) -> String {
    four_fetches(level, |c| format!("b{c} + k + 8 * csB"))
}

/// Fetches for reading of `address(0..4)` into `level`, on one line.
fn four_fetches(level: StreamFetch, address: impl Fn(usize) -> String) -> String {
    let l = level.locality();
    (0..4)
        .map(|i| format!("__builtin_prefetch({}, 0, {l});", address(i)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `{name}_lanes_sum`: the sum of a vector's lanes as a tree, for the row products' dot
/// products (`(t, vt, lanes)`: the precision, its vector type and lanes).
pub(crate) fn write_lanes_sum(s: &mut String, name: &str, (t, vt, lanes): (&str, &str, usize)) {
    let _ = write!(
        s,
        "/* The sum of a vector's lanes, as a tree (halves added until one is left). */
static inline {t} {name}_lanes_sum({vt} v) {{
  {t} x[{lanes}];
  memcpy(x, &v, sizeof(x));
  for (int w = {lanes} / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) x[i] += x[i + w];
  return x[0];
}}
"
    );
}

/// `{name}_row`: the product of one row of A by B (`C[0, j] = Σ_k A[k] · B[k, j]`), reading
/// each factor once, where the blocked product would pack B (a copy of all of it, then the copy
/// read again): a decoding step's products are such rows, and their time is that of reading
/// the weights. Two orders, by which of B's strides is 1:
/// - rows of B contiguous (`x · W` with `W` `[in, out]`): each row of B scaled by `A[k]` and
///   added into accumulators of up to [`ROW_BLOCK`] columns, four rows a step, `k` in order;
/// - columns of B contiguous (`x · Eᵀ`, a tied output head): one dot product per column, four
///   columns at a time, in vectors of lanes summed as a tree at the end.
///
/// `(t, vt, lanes)`: the product's precision, its vector type and lanes; `fetch`: the level
/// B's lines are fetched into. Each element's sum has one order for a shape, whatever the
/// workers. Returns 0 (nothing done) for other strides or when A's copy cannot be had, and the
/// blocked product runs.
pub(crate) fn write_single_row(
    s: &mut String,
    name: &str,
    fetch: StreamFetch,
    (t, vt, lanes): (&str, &str, usize),
) {
    write_lanes_sum(s, name, (t, vt, lanes));
    let (row_fetch, column_fetch) = (row_prefetch(fetch), column_prefetch(fetch));
    let _ = write!(
        s,
        "static int {name}_row(int64_t N, int64_t K, const {t} *A, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {t} *C, int64_t csC, int ovw) {{
  if (csB == 1 && rsB >= N) {{
    {t} acc[{ROW_BLOCK}] __attribute__((aligned(64)));
    for (int64_t jb = 0; jb < N; jb += {ROW_BLOCK}) {{
      const int64_t nb = N - jb < {ROW_BLOCK} ? N - jb : {ROW_BLOCK};
      const int64_t nv = nb / {lanes} * {lanes};
      memset(acc, 0, sizeof(acc));
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {{
        const {t} a0 = A[k * csA], a1 = A[(k + 1) * csA], a2 = A[(k + 2) * csA], a3 = A[(k + 3) * csA];
        const {t} *b0 = B + k * rsB + jb, *b1 = b0 + rsB, *b2 = b1 + rsB, *b3 = b2 + rsB;
        for (int64_t j = 0; j < nv; j += {lanes}) {{
          {row_fetch}
          {vt} c = *({vt} *)(acc + j);
          c += a0 * *(const {vt} *)(b0 + j);
          c += a1 * *(const {vt} *)(b1 + j);
          c += a2 * *(const {vt} *)(b2 + j);
          c += a3 * *(const {vt} *)(b3 + j);
          *({vt} *)(acc + j) = c;
        }}
        for (int64_t j = nv; j < nb; ++j) {{
          {t} c = acc[j];
          c += a0 * b0[j]; c += a1 * b1[j]; c += a2 * b2[j]; c += a3 * b3[j];
          acc[j] = c;
        }}
      }}
      for (; k < K; ++k) {{
        const {t} a = A[k * csA];
        const {t} *b = B + k * rsB + jb;
        for (int64_t j = 0; j < nb; ++j) acc[j] += a * b[j];
      }}
      {t} *c = C + jb * csC;
      if (ovw) for (int64_t j = 0; j < nb; ++j) c[j * csC] = acc[j];
      else for (int64_t j = 0; j < nb; ++j) c[j * csC] += acc[j];
    }}
    return 1;
  }}
  if (rsB == 1 && csB >= K) {{
    /* A contiguous: in place, else copied once per thread. */
    static _Thread_local {t} *row = 0;
    static _Thread_local size_t row_len = 0;
    const {t} *a = A;
    if (csA != 1) {{
      if ((size_t)K > row_len) {{
        free(row);
        row = ({t} *)aligned_alloc(64, ((size_t)K * sizeof({t}) + 63) / 64 * 64);
        row_len = row ? (size_t)K : 0;
      }}
      if (!row) return 0;
      for (int64_t k = 0; k < K; ++k) row[k] = A[k * csA];
      a = row;
    }}
    const int64_t kv = K / {lanes} * {lanes};
    int64_t j = 0;
    for (; j + 4 <= N; j += 4) {{
      const {t} *b0 = B + j * csB, *b1 = b0 + csB, *b2 = b1 + csB, *b3 = b2 + csB;
      {vt} s0 = {{0}}, s1 = {{0}}, s2 = {{0}}, s3 = {{0}};
      for (int64_t k = 0; k < kv; k += {lanes}) {{
        {column_fetch}
        const {vt} x = *(const {vt} *)(a + k);
        s0 += x * *(const {vt} *)(b0 + k);
        s1 += x * *(const {vt} *)(b1 + k);
        s2 += x * *(const {vt} *)(b2 + k);
        s3 += x * *(const {vt} *)(b3 + k);
      }}
      {t} r[4] = {{{name}_lanes_sum(s0), {name}_lanes_sum(s1), {name}_lanes_sum(s2), {name}_lanes_sum(s3)}};
      for (int64_t k = kv; k < K; ++k) {{
        r[0] += a[k] * b0[k]; r[1] += a[k] * b1[k]; r[2] += a[k] * b2[k]; r[3] += a[k] * b3[k];
      }}
      for (int q = 0; q < 4; ++q) C[(j + q) * csC] = ovw ? r[q] : C[(j + q) * csC] + r[q];
    }}
    for (; j < N; ++j) {{
      const {t} *b = B + j * csB;
      {vt} s0 = {{0}};
      for (int64_t k = 0; k < kv; k += {lanes}) s0 += *(const {vt} *)(a + k) * *(const {vt} *)(b + k);
      {t} r = {name}_lanes_sum(s0);
      for (int64_t k = kv; k < K; ++k) r += a[k] * b[k];
      C[j * csC] = ovw ? r : C[j * csC] + r;
    }}
    return 1;
  }}
  return 0;
}}
"
    );
}
