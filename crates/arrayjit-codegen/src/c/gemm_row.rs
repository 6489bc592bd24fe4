//! The product helper's one-row product (`{name}_row`): one row of A times B, each factor read
//! once, in C. The `f32`/`f64` helper ([`crate::c::gemm`]) and the helper whose matrix is
//! stored in `bf16` ([`crate::c::gemm_widened`]) render it alike, but for how an element or a
//! vector of B is read ([`RowFactor`]).

use std::fmt::Write as _;

/// Columns of C a row product accumulates at once (on the stack, in L1).
pub(crate) const ROW_BLOCK: usize = 2048;

/// How the row product reads its matrix B: the C type of its elements, and the expressions
/// reading one element and one vector (of the product's lanes, in its precision) at a pointer.
pub(crate) struct RowFactor {
    /// The C type B is stored in.
    pub stored: String,
    /// The function or macro reading one element as the product's precision, given the
    /// element (`x` → `f(x)`); empty when the element is read as it is.
    pub one: String,
    /// The function reading one vector at a pointer, given the pointer (`p` → `f(p)`).
    pub vector: String,
}

impl RowFactor {
    /// B stored in the product's own precision `t` (vector type `vt`): read as it is.
    pub fn same(t: &str, vt: &str) -> RowFactor {
        RowFactor {
            stored: t.to_string(),
            one: String::new(),
            vector: format!("*(const {vt} *)"),
        }
    }

    fn one(&self, element: &str) -> String {
        if self.one.is_empty() {
            element.to_string()
        } else {
            format!("{}({element})", self.one)
        }
    }

    fn vector(&self, at: &str) -> String {
        format!("{}({at})", self.vector)
    }
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
/// `(t, vt, lanes)`: the product's precision, its vector type and lanes. Each element's sum
/// has one order for a shape, whatever the workers. Returns 0 (nothing done) for other strides
/// or when A's copy cannot be had, and the blocked product runs.
pub(crate) fn write_single_row(
    s: &mut String,
    name: &str,
    (t, vt, lanes): (&str, &str, usize),
    b: &RowFactor,
) {
    let tb = &b.stored;
    let rows_step = [0, 1, 2, 3]
        .map(|r| format!("          c += a{r} * {};", b.vector(&format!("b{r} + j"))))
        .join("\n");
    let rows_rest = [0, 1, 2, 3]
        .map(|r| format!("c += a{r} * {};", b.one(&format!("b{r}[j]"))))
        .join(" ");
    let columns_step = [0, 1, 2, 3]
        .map(|r| format!("        s{r} += x * {};", b.vector(&format!("b{r} + k"))))
        .join("\n");
    let columns_rest = [0, 1, 2, 3]
        .map(|r| format!("r[{r}] += a[k] * {};", b.one(&format!("b{r}[k]"))))
        .join(" ");
    let one_b_j = b.one("b[j]");
    let one_b_k = b.one("b[k]");
    let vector_b_k = b.vector("b + k");
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
static int {name}_row(int64_t N, int64_t K, const {t} *A, int64_t csA, const {tb} *B, int64_t rsB, int64_t csB, {t} *C, int64_t csC, int ovw) {{
  if (csB == 1 && rsB >= N) {{
    {t} acc[{ROW_BLOCK}] __attribute__((aligned(64)));
    for (int64_t jb = 0; jb < N; jb += {ROW_BLOCK}) {{
      const int64_t nb = N - jb < {ROW_BLOCK} ? N - jb : {ROW_BLOCK};
      const int64_t nv = nb / {lanes} * {lanes};
      memset(acc, 0, sizeof(acc));
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {{
        const {t} a0 = A[k * csA], a1 = A[(k + 1) * csA], a2 = A[(k + 2) * csA], a3 = A[(k + 3) * csA];
        const {tb} *b0 = B + k * rsB + jb, *b1 = b0 + rsB, *b2 = b1 + rsB, *b3 = b2 + rsB;
        for (int64_t j = 0; j < nv; j += {lanes}) {{
          {vt} c = *({vt} *)(acc + j);
{rows_step}
          *({vt} *)(acc + j) = c;
        }}
        for (int64_t j = nv; j < nb; ++j) {{
          {t} c = acc[j];
          {rows_rest}
          acc[j] = c;
        }}
      }}
      for (; k < K; ++k) {{
        const {t} a = A[k * csA];
        const {tb} *b = B + k * rsB + jb;
        for (int64_t j = 0; j < nb; ++j) acc[j] += a * {one_b_j};
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
      const {tb} *b0 = B + j * csB, *b1 = b0 + csB, *b2 = b1 + csB, *b3 = b2 + csB;
      {vt} s0 = {{0}}, s1 = {{0}}, s2 = {{0}}, s3 = {{0}};
      for (int64_t k = 0; k < kv; k += {lanes}) {{
        const {vt} x = *(const {vt} *)(a + k);
{columns_step}
      }}
      {t} r[4] = {{{name}_lanes_sum(s0), {name}_lanes_sum(s1), {name}_lanes_sum(s2), {name}_lanes_sum(s3)}};
      for (int64_t k = kv; k < K; ++k) {{
        {columns_rest}
      }}
      for (int q = 0; q < 4; ++q) C[(j + q) * csC] = ovw ? r[q] : C[(j + q) * csC] + r[q];
    }}
    for (; j < N; ++j) {{
      const {tb} *b = B + j * csB;
      {vt} s0 = {{0}};
      for (int64_t k = 0; k < kv; k += {lanes}) s0 += *(const {vt} *)(a + k) * {vector_b_k};
      {t} r = {name}_lanes_sum(s0);
      for (int64_t k = kv; k < K; ++k) r += a[k] * {one_b_k};
      C[j * csC] = ovw ? r : C[j * csC] + r;
    }}
    return 1;
  }}
  return 0;
}}
"
    );
}
