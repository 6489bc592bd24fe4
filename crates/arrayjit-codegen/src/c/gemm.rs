//! C for blocked matrix products (the contraction schedule): a packed, cache-blocked product
//! `C[M, N] += A[M, K] · B[K, N]` over general strides, with a register-blocked micro-kernel
//! written with GCC/Clang vector extensions whose width and tile come from the schedule (and so
//! from the device's SIMD width and registers). Any operand layout (transposes, batch axes) is
//! packed into the micro-kernel's order, with zero padding at the edges.
//!
//! Reduction order is fixed by the blocking and the depth: the depth `K` is split into
//! `⌈K / kc⌉` blocks of equal depth (a multiple of 8, the last one shorter by the rest), and for
//! each element the blocks are summed in order, each block sequentially. Results depend only on
//! the schedule and the product's shape, never on timing or the number of workers. (Equal
//! blocks: a depth a little over `kc` runs as two halves, not a whole block and a short one
//! whose pass over `C` carries few terms.)
//!
//! The loops run in one of two orders, which pack different amounts and sum alike: `nc`
//! columns at a time, then `kc`, packing `B` once and `A` again for every block of columns
//! (BLIS's order); or, when all of `A`'s rows are one `mc` block, `kc` first, packing `A` once
//! per `kc` block. The second is what a weight gradient (`Xᵀ·dY`, a column-major `A` of 768
//! rows) needs: on a 2-core EPYC it ran 4–6% faster (768×3072×1024: 99–100 → 103–104 GFLOP/s,
//! the same bits).
//!
//! A guarded product (`guard`, see [`arrayjit_opt::schedule::Gemm::guard`]) sums only the terms
//! where an affine condition on the row, column and depth holds, skipping whole register tiles
//! and depth ranges; `write_guarded_tile` says how a tile that crosses the guard runs.

use crate::c::gemm_micro::write_micro_kernels;
pub use crate::c::gemm_paths::HelperPaths;
use crate::c::gemm_paths::{GUARDS_DROPPED, ONE_ROW_DROPPED};
use crate::c::gemm_row::write_single_row;
use crate::c::kernel::{OPTIMIZE_END, PRODUCT_HELPER_BEGIN};
use crate::c::syntax::c_storage_type;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrayjit_ir::Prec;
use arrayjit_opt::schedule::{Blocking, StreamFetch};

/// Contraction of `a * b + c` into fused multiply-adds, on from here (gcc: until the
/// `OPTIMIZE_END` that pops [`PRODUCT_HELPER_BEGIN`]'s options; clang: until
/// [`CONTRACT_END`]). The product's sums are written for it (the micro-kernel's
/// `c += a * b`), where generated statements, compiled with `-ffp-contract=off`, fuse only what
/// the loop IR says (so that fusing loops or inlining never changes their bits).
pub(crate) const CONTRACT_FAST: &str = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC optimize (\"fp-contract=fast\")\n#elif defined(__clang__)\n#pragma clang fp contract(fast)\n#endif";
/// Ends [`CONTRACT_FAST`] for clang (back to the backends' `off`).
pub(crate) const CONTRACT_END: &str = "#ifdef __clang__\n#pragma clang fp contract(off)\n#endif";

/// Slivers of A's rows up to which a product of one block of rows reads a row-major B in
/// place instead of packing it (`{name}_block_in_place`): few enough that each panel of B,
/// read from memory once, is used by few slivers, so that packing it cost a large share.
const IN_PLACE_SLIVERS: usize = 8;

/// Adds the product helper for `prec` and `b` to a library's product units (by name: their
/// prototype and definition) for a product reaching `paths`, or widens the one there to the
/// paths either reaches. Returns the helper's name.
pub(crate) fn add_product_helper(
    products: &mut BTreeMap<String, (String, String)>,
    prec: Prec,
    b: &Blocking,
    paths: HelperPaths,
) -> String {
    let name = gemm_name(prec, b);
    let unit = products
        .entry(name.clone())
        .or_insert_with(|| (gemm_signature(prec, b), gemm_definition(prec, b, paths)));
    let there = HelperPaths::of_definition(&unit.1);
    let both = there.union(paths);
    if both != there {
        unit.1 = gemm_definition(prec, b, both);
    }
    name
}

/// The C function name of the product for a precision and blocking: its tile and blocks, and
/// `_fetch_l1` where it fetches streamed operands into L1 (the default, L2, adds nothing, so
/// the names of helpers compiled before the level was tuned still hold).
pub fn gemm_name(prec: Prec, b: &Blocking) -> String {
    let fetch = match b.stream_fetch {
        StreamFetch::L2 => "",
        StreamFetch::L1 => "_fetch_l1",
    };
    format!(
        "aj_gemm_{}_{}x{}_{}_{}_{}{fetch}",
        prec.name(),
        b.mr,
        b.nr,
        b.mc,
        b.kc,
        b.nc
    )
}

/// The product function's prototype: a function of the library (hidden outside it), so that
/// its definition can live in a translation unit of its own, compiled in parallel with the
/// kernels and cached apart from them.
pub fn gemm_signature(prec: Prec, b: &Blocking) -> String {
    let t = c_storage_type(prec);
    format!(
        "__attribute__((visibility(\"hidden\"))) void {}(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *guard, const aj_par *par)",
        gemm_name(prec, b)
    )
}

/// The product for a precision and blocking as a standalone translation unit that also
/// defines `gemm_entry`, with the product function's signature: what the harnesses of
/// `benches/gemm` link with (`scripts/gemm-blocking.sh`, through the `gemm_helper` example),
/// to time blockings and versions of the helper outside the runtime.
pub fn standalone_unit(prec: Prec, b: &Blocking) -> String {
    let t = c_storage_type(prec);
    format!(
        "#include <stdint.h>\n#include <string.h>\n#include <math.h>\n\
         typedef struct aj_par {{ const void *pool; void (*run)(const void *pool, void (*chunk)(void *ctx, int64_t index), void *ctx, int64_t chunks); int64_t workers; }} aj_par;\n\
         {}\n\
         void gemm_entry(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *guard, const aj_par *par) {{ {}(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, ovw, guard, par); }}\n",
        gemm_definition(prec, b, HelperPaths::ALL)
            .replace("__attribute__((visibility(\"hidden\"))) ", ""),
        gemm_name(prec, b)
    )
}

/// The definition of the product function (and its micro-kernel and vector type), for a
/// precision of `f32` or `f64`. Call it as
/// `name(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, overwrite, guard, par)` (`overwrite`:
/// store the product instead of adding it to `C`; `guard`: `NULL`, or the four coefficients
/// `gi, gj, gk, g0` of [`arrayjit_opt::schedule::Gemm::guard`]) with the kernel's worker-pool
/// handle (`NULL` runs on the calling thread). Only the paths of `paths` are kept: without
/// `guarded` a guard passed is ignored, without `one_row` a product of one row runs blocked
/// (a renderer adds its products with the crate's `add_product_helper`, which keeps every path
/// its products can reach).
pub fn gemm_definition(prec: Prec, b: &Blocking, paths: HelperPaths) -> String {
    let signature = gemm_signature(prec, b);
    // Without guarded products, every function that takes a guard drops it first: gcc folds
    // the guarded branches away and never compiles the guard's steps, which are unreferenced.
    let drop_guard = |g: &str| {
        if paths.guarded {
            String::new()
        } else {
            format!("  {g} = 0; /* {GUARDS_DROPPED} */\n")
        }
    };
    let (drop_g, drop_guard_arg) = (drop_guard("g"), drop_guard("guard"));
    // Without a product that can run as one row, its tests are false from the start: gcc
    // folds them and never compiles `{name}_row`.
    let one_row = if paths.one_row {
        String::new()
    } else {
        format!("0 /* {ONE_ROW_DROPPED} */ && ")
    };
    let t = c_storage_type(prec);
    let elem = prec.size_in_bytes();
    let lanes = (b.nr / 2).max(1);
    let vt = format!("aj_v{}{}", lanes, prec.name());
    let name = gemm_name(prec, b);
    let (mr, nr, mc, kc, nc) = (b.mr, b.nr, b.mc, b.kc, b.nc);
    let in_place_rows = IN_PLACE_SLIVERS * mr;
    let mut s = String::new();
    let _ = writeln!(s, "#include <stdlib.h>");
    // The micro-kernel is explicit vector code: gcc's loop transformations add nothing to it
    // but compile time; `PRODUCT_HELPER_BEGIN` keeps it as written, with the register
    // allocation its accumulators need. Its `c += a * b` must be one fused multiply-add, which
    // the backends' `-ffp-contract=off` forbids in generated statements (see `CONTRACT_FAST`):
    // contraction is on for this unit.
    let _ = writeln!(s, "{PRODUCT_HELPER_BEGIN}\n{CONTRACT_FAST}");
    let _ = writeln!(
        s,
        "#ifndef AJ_{vt}_DEFINED\n#define AJ_{vt}_DEFINED\ntypedef {t} {vt} __attribute__((vector_size({}), aligned({elem})));\n#endif",
        lanes * elem
    );
    write_micro_kernels(&mut s, &name, (t, &vt), b);
    write_pack_across(&mut s, &name, (t, elem), b.stream_fetch);
    write_pack_strides(&mut s, &name, elem, b);
    write_guarded_tile(&mut s, &name, (t, &vt), elem, b);
    write_block_steps(&mut s, &name, t, elem, b, &drop_g);
    // Whether rows of A are read in place by the micro-kernel: a row-major A, unless its row
    // stride is a multiple of 4 KiB (then all rows of a sliver fall into one L1 set and evict
    // each other, so it is packed).
    let _ = writeln!(
        s,
        "static inline int {name}_direct(int64_t rsA, int64_t csA) {{ return csA == 1 && (rsA * (int64_t)sizeof({t})) % 4096 != 0; }}"
    );
    write_single_row(&mut s, &name, b.stream_fetch, (t, &vt, lanes));
    // The blocked product on one thread.
    let _ = write!(
        s,
        "static void {name}_serial(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const {t} *B, int64_t rsB, int64_t csB, {t} *C, int64_t rsC, int64_t csC, int ovw, const int64_t *g) {{
{drop_g}  if (M <= 0 || N <= 0) return;
  if (K <= 0) {{
    if (ovw) {name}_zero_tile(C, rsC, csC, M, N);
    return;
  }}
  /* One row (or one column) of C: a matrix-vector product, each factor read once (see
     {name}_row); a single column is the row of C^T = B^T A^T. */
  if ({one_row}!g && M == 1 && {name}_row(N, K, A, csA, B, rsB, csB, C, csC, ovw)) return;
  if ({one_row}!g && N == 1 && {name}_row(M, K, B, rsB, A, csA, rsA, C, rsC, ovw)) return;
  /* One row under a guard of the columns alone or the depth alone (a decoding step's scores
     and weighted sum): the guard is a range of columns, or of depths, and the row product
     runs over it; columns with no term left are zeroed where the product overwrites. */
  if ({one_row}g && M == 1 && (g[1] == 0 || g[2] == 0)) {{
    int64_t j0 = 0, j1 = N, k0 = 0, k1 = K;
    int64_t *lo = g[2] == 0 ? &j0 : &k0, *hi = g[2] == 0 ? &j1 : &k1;
    const int64_t c = g[2] == 0 ? g[1] : g[2], extent = g[2] == 0 ? N : K;
    if (c == 0) {{ if (g[3] < 0) *hi = 0; }}
    else if (c < 0) {{ const int64_t last = g[3] / -c; *hi = g[3] < 0 ? 0 : last + 1 < extent ? last + 1 : extent; }}
    else {{ const int64_t first = (-g[3] + c - 1) / c; *lo = g[3] >= 0 ? 0 : first < extent ? first : extent; }}
    if (j1 < j0) j1 = j0;
    if (k1 < k0) k1 = k0;
    if (ovw) {{
      for (int64_t j = 0; j < j0; ++j) C[j * csC] = 0;
      for (int64_t j = j1; j < N; ++j) C[j * csC] = 0;
    }}
    if (j1 > j0 && k1 > k0) {{
      if ({name}_row(j1 - j0, k1 - k0, A + k0 * csA, csA, B + k0 * rsB + j0 * csB, rsB, csB, C + j0 * csC, csC, ovw)) return;
    }} else {{
      if (ovw) for (int64_t j = j0; j < j1; ++j) C[j * csC] = 0;
      return;
    }}
    /* Other strides: the blocked product below. The zeroing above is rewritten the same. */
  }}
  /* Packing buffers, kept per thread and grown as needed. */
  static _Thread_local {t} *pack = 0;
  static _Thread_local size_t pack_len = 0;
  const int64_t mcr = (M < {mc} ? (M + {mr} - 1) / {mr} * {mr} : {mc});
  const int64_t ncr = (N < {nc} ? (N + {nr} - 1) / {nr} * {nr} : {nc});
  /* Depth blocks of equal depth (at most kc, a multiple of 8 where K is split). */
  const int64_t kblocks = (K + {kc} - 1) / {kc};
  const int64_t kcs = kblocks <= 1 ? K : ((K + kblocks - 1) / kblocks + 7) / 8 * 8;
  const size_t slivers = (size_t)(mcr / {mr}) * (size_t){name}_sliver(kcs);
  const size_t need = slivers + (size_t)(ncr / {nr}) * (size_t){name}_panel(kcs);
  if (need > pack_len) {{
    free(pack);
    size_t bytes = (need * sizeof({t}) + 63) / 64 * 64;
    pack = ({t} *)aligned_alloc(64, bytes);
    pack_len = pack ? need : 0;
  }}
  if (!pack) {{
    /* No memory for packing: the plain loops, in the same per-element order. */
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {{
        {t} acc = 0;
        for (int64_t k = 0; k < K; ++k)
          if (!g || g[0] * i + g[1] * j + g[2] * k + g[3] >= 0) acc += A[i * rsA + k * csA] * B[k * rsB + j * csB];
        C[i * rsC + j * csC] = ovw ? acc : C[i * rsC + j * csC] + acc;
      }}
    return;
  }}
  {t} *const Ap = pack, *const Bp = pack + slivers;
  /* A guard of the depth and the rows alone (mask 1) or the columns alone (mask 2): where the
     other factor's block is finite, the elements of the guarded side where the guard fails
     are zeroed (a band of A per sliver, in place in packed B) and a tile runs the
     micro-kernel over every depth where any of its elements passes (see
     {name}_guarded_tile). */
  const int mask = !g || g[2] == 0 ? 0 : g[1] == 0 ? 1 : g[0] == 0 ? 2 : 0;
  const int direct = {name}_direct(rsA, csA);
  int finite_a = 0, masked = 0;
  if (M <= {mc}) {{
    /* All of A is one block of rows: packed once per kc block, not again for every block
       of N columns (the same packing of B, the same sums in the same order). Where its rows
       are few and B is row-major, B is read in place ({name}_block_in_place). */
    const int in_place = !g && csB == 1 && M <= {in_place_rows} && N >= 2 * {nr};
    for (int64_t pc = 0; pc < K; pc += kcs) {{
      const int64_t kcb = K - pc < kcs ? K - pc : kcs;
      {name}_pack_a(Ap, A, rsA, csA, 0, M, pc, kcb, direct);
      if (in_place) {{
        {name}_block_in_place(A, rsA, Ap, B, rsB, Bp, C, rsC, csC, M, N, pc, kcb, direct, ovw && pc == 0);
        continue;
      }}
      if (mask == 2) finite_a = {name}_finite_a(A, rsA, csA, 0, M, pc, kcb);
      for (int64_t jc = 0; jc < N; jc += {nc}) {{
        const int64_t ncb = N - jc < {nc} ? N - jc : {nc};
        {name}_pack_b(Bp, B, rsB, csB, jc, ncb, pc, kcb);
        if (mask) masked = {name}_mask_b(Bp, jc, ncb, pc, kcb, g, mask, finite_a);
        {name}_block(A, rsA, Ap, Bp, {name}_panel(kcb), C, rsC, csC, 0, M, jc, ncb, pc, kcb, direct, ovw, g, masked, 0);
      }}
    }}
    return;
  }}
  for (int64_t jc = 0; jc < N; jc += {nc}) {{
    const int64_t ncb = N - jc < {nc} ? N - jc : {nc};
    for (int64_t pc = 0; pc < K; pc += kcs) {{
      const int64_t kcb = K - pc < kcs ? K - pc : kcs;
      {name}_pack_b(Bp, B, rsB, csB, jc, ncb, pc, kcb);
      /* Whether all of A's rows are finite at these depths, for mask 2. */
      if (mask == 2) finite_a = {name}_finite_a(A, rsA, csA, 0, M, pc, kcb);
      if (mask) masked = {name}_mask_b(Bp, jc, ncb, pc, kcb, g, mask, finite_a);
      for (int64_t ic = 0; ic < M; ic += {mc}) {{
        const int64_t mcb = M - ic < {mc} ? M - ic : {mc};
        {name}_pack_a(Ap, A, rsA, csA, ic, mcb, pc, kcb, direct);
        {name}_block(A, rsA, Ap, Bp, {name}_panel(kcb), C, rsC, csC, ic, mcb, jc, ncb, pc, kcb, direct, ovw, g, masked, 0);
      }}
    }}
  }}
}}
"
    );
    // For a helper that multiplies many blocks by one factor packed once (the attention
    // helper's keys and values): the packed size, the packing, and the product with packed
    // panels, all on the product's own micro-kernels and order.
    let _ = write!(
        s,
        "/* The floats a K × N block of B takes packed in panels (K at most kc). */
__attribute__((visibility(\"hidden\"))) int64_t {name}_packed_size(int64_t K, int64_t N) {{ return (N + {nr} - 1) / {nr} * {name}_panel(K); }}
/* B's K × N block (K at most kc) packed into Bp, in panels of {nr} columns. */
__attribute__((visibility(\"hidden\"))) void {name}_pack(void *Bp, const {t} *B, int64_t rsB, int64_t csB, int64_t K, int64_t N) {{ {name}_pack_b(({t} *)Bp, B, rsB, csB, 0, N, 0, K); }}
/* {name}_times_packed over the first K depths of panels packed deeper, sb elements apart
   (Bpv points at the first panel's depth to start from: a packed block's rows k0.. are at
   k0 * {nr}), for a product whose terms past K (or before the start) are known zeros: a causal
   attention's diagonal blocks. `warm`: A and C are in cache (no prefetches). */
__attribute__((visibility(\"hidden\"))) int {name}_times_panels(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const void *Bpv, int64_t sb, {t} *C, int64_t rsC, int64_t csC, int ovw, int warm) {{
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0) {{
    if (ovw) {name}_zero_tile(C, rsC, csC, M, N);
    return 0;
  }}
  if (K > {kc}) return 1;
  static _Thread_local {t} *slivers = 0;
  static _Thread_local size_t slivers_len = 0;
  const int64_t mcr = M < {mc} ? (M + {mr} - 1) / {mr} * {mr} : {mc};
  const size_t need = (size_t)(mcr / {mr}) * (size_t){name}_sliver(K);
  if (need > slivers_len) {{
    free(slivers);
    slivers = ({t} *)aligned_alloc(64, (need * sizeof({t}) + 63) / 64 * 64);
    slivers_len = slivers ? need : 0;
  }}
  if (!slivers) return 1;
  const {t} *Bp = (const {t} *)Bpv;
  /* Warm, a column-major A's whole slivers are read in place too (their columns' runs of mr
     elements, lda = csA apart: the attention's transposed score gradients), not packed. */
  const int direct = {name}_direct(rsA, csA) ? 1
    : warm && rsA == 1 && csA != 1 && (csA * (int64_t)sizeof({t})) % 4096 != 0 ? 2 : 0;
  for (int64_t ic = 0; ic < M; ic += {mc}) {{
    const int64_t mcb = M - ic < {mc} ? M - ic : {mc};
    {name}_pack_a(slivers, A, rsA, csA, ic, mcb, 0, K, direct);
    for (int64_t jc = 0; jc < N; jc += {nc}) {{
      const int64_t ncb = N - jc < {nc} ? N - jc : {nc};
      {name}_block(A, direct == 2 ? csA : rsA, slivers, Bp + jc / {nr} * sb, sb, C, rsC, csC, ic, mcb, jc, ncb, 0, K, direct, ovw, 0, 0, warm);
    }}
  }}
  return 0;
}}
/* C (=, or += where !ovw) A · B for B packed by {name}_pack (K at most kc): the products, sums
   and order of {name}_serial. 1 (nothing done) where K exceeds kc or the partial slivers of A
   cannot be packed for want of memory; the caller then multiplies unpacked. */
__attribute__((visibility(\"hidden\"))) int {name}_times_packed(int64_t M, int64_t N, int64_t K, const {t} *A, int64_t rsA, int64_t csA, const void *Bpv, {t} *C, int64_t rsC, int64_t csC, int ovw) {{
  return {name}_times_panels(M, N, K, A, rsA, csA, Bpv, {name}_panel(K), C, rsC, csC, ovw, 0);
}}
"
    );
    // Over the device's workers: the larger of M and N split into ranges of whole register
    // tiles, one product per range (its guard shifted to the range's first row or column).
    // Every element is computed by one range with the same blocking and order, so results do
    // not depend on the number of workers.
    let _ = write!(
        s,
        "typedef struct {{ int64_t M, N, K; const {t} *A; int64_t rsA, csA; const {t} *B; int64_t rsB, csB; {t} *C; int64_t rsC, csC; int64_t split_n, per; int ovw; const int64_t *guard; }} {name}_job;
static void {name}_chunk(void *ctx, int64_t index) {{
  const {name}_job *j = ({name}_job *)ctx;
  const int64_t lo = index * j->per, total = j->split_n ? j->N : j->M;
  const int64_t hi = lo + j->per < total ? lo + j->per : total;
  if (lo >= hi) return;
  int64_t g[4] = {{0, 0, 0, 0}};
  if (j->guard) {{
    g[0] = j->guard[0]; g[1] = j->guard[1]; g[2] = j->guard[2];
    g[3] = j->guard[3] + (j->split_n ? j->guard[1] : j->guard[0]) * lo;
  }}
  if (j->split_n)
    {name}_serial(j->M, hi - lo, j->K, j->A, j->rsA, j->csA, j->B + lo * j->csB, j->rsB, j->csB, j->C + lo * j->csC, j->rsC, j->csC, j->ovw, j->guard ? g : 0);
  else
    {name}_serial(hi - lo, j->N, j->K, j->A + lo * j->rsA, j->rsA, j->csA, j->B, j->rsB, j->csB, j->C + lo * j->rsC, j->rsC, j->csC, j->ovw, j->guard ? g : 0);
}}
{signature} {{
{drop_guard_arg}  /* A column-major C is the row-major C^T = B^T A^T: the same products summed in the same
     order, but stored by whole vectors (the guard's row and column terms swapped). */
  if (rsC == 1 && csC != 1) {{
    const int64_t swapped[4] = {{guard ? guard[1] : 0, guard ? guard[0] : 0, guard ? guard[2] : 0, guard ? guard[3] : 0}};
    {name}(N, M, K, B, csB, rsB, A, csA, rsA, C, csC, rsC, ovw, guard ? swapped : 0, par);
    return;
  }}
  const int64_t workers = par ? par->workers : 1;
  if (workers > 1 && (double)M * (double)N * (double)K >= 262144.0) {{
    /* The longer side is split; but where A's rows are read in place (never packed), the
       columns are split wherever their register tiles divide evenly enough, so that each
       worker packs only its part of B (split by rows, every worker would pack all of B). */
    const int64_t column_tiles = (N + {nr} - 1) / {nr};
    const int64_t split_n = N >= M || ({name}_direct(rsA, csA) && (column_tiles % workers == 0 || column_tiles >= 8 * workers));
    const int64_t unit = split_n ? {nr} : {mr}, total = split_n ? N : M;
    const int64_t units = (total + unit - 1) / unit;
    const int64_t per = (units + workers - 1) / workers * unit;
    const int64_t chunks = (total + per - 1) / per;
    if (chunks > 1) {{
      {name}_job job = {{M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, split_n, per, ovw, guard}};
      par->run(par->pool, {name}_chunk, &job, chunks);
      return;
    }}
  }}
  {name}_serial(M, N, K, A, rsA, csA, B, rsB, csB, C, rsC, csC, ovw, guard);
}}
{CONTRACT_END}
{OPTIMIZE_END}
"
    );
    s
}

/// The strides of packed slivers of A and panels of B (`{name}_sliver`, `{name}_panel`), in
/// elements: see their comment.
fn write_pack_strides(s: &mut String, name: &str, elem: usize, b: &Blocking) {
    let (mr, nr, line) = (b.mr, b.nr, 64 / elem);
    let _ = write!(
        s,
        "/* Elements from one packed sliver of A (mr × kcb) to the next, and from one packed panel of
   B (kcb × nr) to the next: whole cache lines, an odd number of them, so that a packing
   loop that writes one line into every sliver (or panel) in turn spreads its writes over
   all of L1's sets. Back to back, slivers of 12 × 512 (24 KiB) and panels of 512 × 32 (64
   KiB) all began in the same set: packing a column-major A evicted its own half-written
   lines, and a weight gradient's product ran 15–20% slower at depth blocks of 512 than of
   344 or 688. */
static inline int64_t {name}_sliver(int64_t kcb) {{ return (({mr} * kcb + {line} - 1) / {line} | 1) * {line}; }}
static inline int64_t {name}_panel(int64_t kcb) {{ return (({nr} * kcb + {line} - 1) / {line} | 1) * {line}; }}
"
    );
}

/// The three steps of the blocked product, as functions of the library's unit so that both
/// loop orders of `{name}_serial` share them: `{name}_pack_b` packs a `kc × nc` block of `B`
/// in panels of `nr` columns, `{name}_pack_a` an `mc × kc` block of `A` in slivers of `mr` rows
/// (leaving the full slivers read in place when `direct`), and `{name}_block` runs the
/// micro-kernel over every sliver and panel of the two blocks.
fn write_block_steps(s: &mut String, name: &str, t: &str, elem: usize, b: &Blocking, drop_g: &str) {
    let (mr, nr) = (b.mr, b.nr);
    // Elements per 64-byte cache line.
    let line = 64 / elem;
    let micro = format!("{name}_micro");
    let _ = write!(
        s,
        "static void {name}_pack_b({t} *restrict Bp, const {t} *B, int64_t rsB, int64_t csB, int64_t jc, int64_t ncb, int64_t pc, int64_t kcb) {{
  /* In panels of nr columns, reading along whichever axis is contiguous. */
  const int64_t sb = {name}_panel(kcb);
  const int64_t whole = csB == 1 ? ncb / {nr} * {nr} : 0;
  /* A row-major B's whole panels: row by row, each row's part of the block read once, in
     order, and copied with a constant length per panel (vector moves, not a string move).
     Panel by panel, every panel re-read the rows, rsB apart: a strided walk the prefetchers
     follow badly (the weight gradients' packing ran at a few GB/s). */
  for (int64_t k = 0; k < kcb; ++k)
    for (int64_t j0 = 0; j0 < whole; j0 += {nr})
      memcpy(Bp + j0 / {nr} * sb + k * {nr}, B + (pc + k) * rsB + jc + j0, sizeof({t}) * {nr});
  for (int64_t j0 = whole; j0 < ncb; j0 += {nr}) {{
    {t} *dst = Bp + j0 / {nr} * sb;
    const int64_t w = ncb - j0 < {nr} ? ncb - j0 : {nr};
    if (csB == 1) {{
      for (int64_t k = 0; k < kcb; ++k) {{
        memcpy(dst + k * {nr}, B + (pc + k) * rsB + jc + j0, (size_t)w * sizeof({t}));
        for (int64_t j = w; j < {nr}; ++j) dst[k * {nr} + j] = 0;
      }}
    }} else if (rsB != 1) {{
      for (int64_t k = 0; k < kcb; ++k) {{
        const {t} *src = B + (pc + k) * rsB + (jc + j0) * csB;
        int64_t j = 0;
        for (; j < w; ++j) dst[k * {nr} + j] = src[j * csB];
        for (; j < {nr}; ++j) dst[k * {nr} + j] = 0;
      }}
    }} else {{
      {name}_pack_across(dst, {nr}, B + pc + (jc + j0) * csB, csB, w, kcb);
    }}
  }}
}}
static void {name}_pack_a({t} *restrict Ap, const {t} *A, int64_t rsA, int64_t csA, int64_t ic, int64_t mcb, int64_t pc, int64_t kcb, int direct) {{
  /* In slivers of mr rows, reading along whichever axis is contiguous. A column-major A's
     whole slivers: depth by depth, each column's part of the block read once, in order (as a
     row-major B's panels, see pack_b). */
  const int64_t whole = rsA == 1 && csA != 1 && direct != 2 ? mcb / {mr} * {mr} : 0;
  const int64_t sa = {name}_sliver(kcb);
  for (int64_t k = 0; k < kcb; ++k)
    for (int64_t i0 = 0; i0 < whole; i0 += {mr})
      memcpy(Ap + i0 / {mr} * sa + k * {mr}, A + (ic + i0) + (pc + k) * csA, sizeof({t}) * {mr});
  for (int64_t i0 = whole; i0 < mcb; i0 += {mr}) {{
    {t} *dst = Ap + i0 / {mr} * sa;
    const int64_t h = mcb - i0 < {mr} ? mcb - i0 : {mr};
    if (direct && h == {mr}) continue; /* read in place by the micro-kernel */
    if (csA == 1) {{
      {name}_pack_across(dst, {mr}, A + (ic + i0) * rsA + pc, rsA, h, kcb);
    }} else if (rsA != 1) {{
      for (int64_t i = 0; i < {mr}; ++i) {{
        if (i < h) {{
          const {t} *src = A + (ic + i0 + i) * rsA + pc * csA;
          for (int64_t k = 0; k < kcb; ++k) dst[k * {mr} + i] = src[k * csA];
        }} else {{
          for (int64_t k = 0; k < kcb; ++k) dst[k * {mr} + i] = 0;
        }}
      }}
    }} else {{
      /* The last, partial sliver of a column-major A (its whole ones are packed above). */
      for (int64_t k = 0; k < kcb; ++k) {{
        const {t} *src = A + (ic + i0) + (pc + k) * csA;
        int64_t i = 0;
        for (; i < h; ++i) dst[k * {mr} + i] = src[i];
        for (; i < {mr}; ++i) dst[k * {mr} + i] = 0;
      }}
    }}
  }}
}}
static void {name}_block(const {t} *A, int64_t rsA, const {t} *Ap, const {t} *Bp, int64_t sb, {t} *C, int64_t rsC, int64_t csC, int64_t ic, int64_t mcb, int64_t jc, int64_t ncb, int64_t pc, int64_t kcb, int direct, int ovw, const int64_t *g, int masked, int warm) {{
{drop_g}  /* Each sliver of A (mr × kc, in L1) meets every panel of the B block (kc × nc, in L2),
     which stream through in order; panels are sb elements apart (at least {name}_panel(kcb):
     a caller may multiply by the first depths of panels packed deeper). `direct`: 0, A is
     packed in Ap; 1, its whole slivers' rows are read in place (rsA apart); 2, its whole
     slivers' columns are (rsA is then A's column stride). `warm`: A and C are in cache
     already (the attention helper's blocks), so nothing is prefetched. */
  const int64_t sa = {name}_sliver(kcb);
  for (int64_t i0 = 0; i0 < mcb; i0 += {mr}) {{
    /* A guard of rows and depth: the sliver's band of depths where only some rows pass,
       zeroed where the guard fails, for every panel. */
    {t} band[{mr} * {mr}];
    if (masked == 1) {name}_band_a(band, A + (ic + i0) * rsA, rsA, Ap + i0 / {mr} * sa, ic + i0, mcb - i0 < {mr} ? mcb - i0 : {mr}, pc, kcb, direct && mcb - i0 >= {mr}, g);
    /* The next sliver's rows, where they are read in place, are fetched into L2 while this
       sliver runs, a share of their lines before each panel; and the next tile of C before
       each tile is stored. Without them, each sliver of a product with few panels (a causal
       attention's, 2 to 8) waited on its first panel's reads from memory, and each tile on
       its stores: its two products ran 5–14% slower from a cold cache. */
    const int64_t next_rows = !warm && direct == 1 && mcb - i0 - {mr} >= {mr} ? {mr} : 0;
    const int64_t lines = (kcb + {line} - 1) / {line}, to_fetch = next_rows * lines;
    const int64_t per_panel = (to_fetch + (ncb + {nr} - 1) / {nr} - 1) / ((ncb + {nr} - 1) / {nr});
    /* The next line to fetch: row fr of the next sliver, its line fl (counted: a division of
       a running count per line took 40% of this function's time). */
    int64_t fr = 0, fl = 0;
    for (int64_t j0 = 0; j0 < ncb; j0 += {nr}) {{
      for (int64_t e = 0; e < per_panel && fr < next_rows; ++e) {{
        __builtin_prefetch(A + (ic + i0 + {mr} + fr) * rsA + pc + fl * {line}, 0, 1);
        if (++fl == lines) fl = 0, ++fr;
      }}
      const int64_t h = mcb - i0 < {mr} ? mcb - i0 : {mr}, w = ncb - j0 < {nr} ? ncb - j0 : {nr};
      {t} *const ct = C + (ic + i0) * rsC + (jc + j0) * csC;
      const int64_t next_w = ncb - j0 - {nr} < {nr} ? ncb - j0 - {nr} : {nr};
      if (csC == 1 && !warm)
        for (int64_t r = 0; r < h; ++r)
          for (int64_t q = 0; q < next_w; q += {line}) __builtin_prefetch(ct + r * rsC + {nr} + q, 1, 3);
      if (g)
        {name}_guarded_tile(A + (ic + i0) * rsA, rsA, Ap + i0 / {mr} * sa, Bp + j0 / {nr} * sb, ct, rsC, csC, ic + i0, h, jc + j0, w, pc, kcb, direct && h == {mr}, ovw && pc == 0, g, masked, band);
      else if (direct == 1 && h == {mr})
        {micro}_rows(kcb, A + (ic + i0) * rsA + pc, rsA, Bp + j0 / {nr} * sb, ct, rsC, csC, h, w, ovw && pc == 0);
      else if (direct == 2 && h == {mr})
        {micro}_cols(kcb, A + (ic + i0) + pc * rsA, rsA, Bp + j0 / {nr} * sb, ct, rsC, csC, h, w, ovw && pc == 0);
      else
        {name}_micro_packed(kcb, Ap + i0 / {mr} * sa, Bp + j0 / {nr} * sb, ct, rsC, csC, h, w, ovw && pc == 0);
    }}
  }}
}}
/* One block of A's rows (packed in Ap, or read in place where `direct`) times B's depths
   [pc, pc + kcb), B read in place (row-major, rows rsB apart), every column: panel by panel,
   each against every sliver, the next panel's lines fetched while the first sliver's product
   runs; a last, partial panel packed into Bp. The products and order of {name}_block on packed
   panels, without packing B: where A's rows are few, packing B (a read from memory and a
   write, then the product's read) cost about as much as 40% of the product's arithmetic
   (GPT-2's 64-row prefill products ran at 97-100 GFLOP/s on the Xeon 6/207). */
static void {name}_block_in_place(const {t} *A, int64_t rsA, const {t} *Ap, const {t} *B, int64_t rsB, {t} *Bp, {t} *C, int64_t rsC, int64_t csC, int64_t mcb, int64_t N, int64_t pc, int64_t kcb, int direct, int ovw) {{
  const int64_t sa = {name}_sliver(kcb), whole = N / {nr} * {nr};
  for (int64_t j0 = 0; j0 < N; j0 += {nr}) {{
    const int64_t w = N - j0 < {nr} ? N - j0 : {nr};
    const {t} *const b = B + pc * rsB + j0;
    if (w < {nr}) {name}_pack_b(Bp, B, rsB, 1, j0, w, pc, kcb);
    for (int64_t i0 = 0; i0 < mcb; i0 += {mr}) {{
      const int64_t h = mcb - i0 < {mr} ? mcb - i0 : {mr};
      {t} *const ct = C + i0 * rsC + j0 * csC;
      /* The next whole panel's lines, once (during the first sliver's product). */
      const int64_t pf = i0 == 0 && j0 + {nr} < whole ? {nr} : 0;
      if (w < {nr}) {{
        if (direct && h == {mr}) {micro}_rows(kcb, A + i0 * rsA + pc, rsA, Bp, ct, rsC, csC, h, w, ovw);
        else {name}_micro_packed(kcb, Ap + i0 / {mr} * sa, Bp, ct, rsC, csC, h, w, ovw);
      }} else if (direct && h == {mr}) {{
        {micro}_rows_bd(kcb, A + i0 * rsA + pc, rsA, rsB, pf, b, ct, rsC, csC, h, w, ovw);
      }} else {{
        {micro}_bd(kcb, Ap + i0 / {mr} * sa, rsB, pf, b, ct, rsC, csC, h, w, ovw);
      }}
    }}
  }}
}}
"
    );
}

/// The steps of a guarded product (see [`arrayjit_opt::schedule::Gemm::guard`]).
///
/// `{name}_guarded_tile` runs one register tile's terms at depths `pc..pc + kcb`. The guard is
/// affine, so its least and greatest value over the tile's rows and columns bound where it
/// passes: a tile it rules out runs nothing (and is zeroed where its first block overwrites);
/// one it keeps whole runs the micro-kernel as usual.
///
/// - A guard of the depth and one side (`gi` or `gj` zero), where the other factor's block is
///   finite (`{name}_finite`): the guarded side's elements where the guard fails are zeroed —
///   in packed `B`'s panels (`{name}_mask_b`), or in a copy of each sliver's band of `A`
///   (`{name}_band_a`, so `A`'s rows can still be read in place) — and the tile runs the
///   micro-kernel over every depth where any of its elements passes: a skipped term adds
///   `0 · x = 0` exactly (only the sign of a zero sum may differ from skipping it).
/// - Otherwise the depths where every element passes run through the micro-kernel, and the few
///   where only some do (fewer than the tile's rows plus columns) are summed per row in two
///   vectors, each product masked by its bits to the columns where the guard passes, so a
///   skipped product's infinity or NaN never reaches the sum.
/// - A guard without a depth term (`gk = 0`) runs the micro-kernel whole into a local tile and
///   stores the run of columns each row keeps.
fn write_guarded_tile(
    s: &mut String,
    name: &str,
    (t, vt): (&str, &str),
    elem: usize,
    b: &Blocking,
) {
    let (mr, nr) = (b.mr, b.nr);
    let lanes = (nr / 2).max(1);
    let vi = format!("{name}_vmask");
    let int = if elem == 8 { "int64_t" } else { "int32_t" };
    let micro = format!("{name}_micro");
    let columns: Vec<String> = (0..lanes).map(|q| q.to_string()).collect();
    let columns = columns.join(", ");
    let _ = write!(
        s,
        "typedef {int} {vi} __attribute__((vector_size({vbytes})));
/* Whether `rows` runs of `n` contiguous elements, `rs` apart, are all finite: x · 0 is 0 for
   a finite x, NaN otherwise. */
static int {name}_finite(const {t} *x, int64_t rs, int64_t rows, int64_t n) {{
  {vt} v0 = {{0}};
  {t} s0 = 0;
  for (int64_t r = 0; r < rows; ++r) {{
    const {t} *const p = x + r * rs;
    int64_t q = 0;
    for (; q + {lanes} <= n; q += {lanes}) {{ {vt} v; memcpy(&v, p + q, sizeof v); v0 += v * 0; }}
    for (; q < n; ++q) s0 += p[q] * 0;
  }}
  for (int l = 0; l < {lanes}; ++l) s0 += v0[l];
  return s0 == 0;
}}
static int {name}_finite_a(const {t} *A, int64_t rsA, int64_t csA, int64_t ic, int64_t mcb, int64_t pc, int64_t kcb) {{
  if (csA == 1) return {name}_finite(A + ic * rsA + pc, rsA, mcb, kcb);
  if (rsA == 1) return {name}_finite(A + ic + pc * csA, csA, kcb, mcb);
  return 0;
}}
/* For a guard of depth and one side: the depths of [pc, end) where every element whose
   guard value without its depth term lies in [rmin, rmax] passes ([d[0], d[1])) and where
   only some do ([d[2], d[3])). */
static inline void {name}_depths(int64_t rmin, int64_t rmax, int64_t gk, int64_t pc, int64_t end, int64_t d[4]) {{
#define AJ_CLAMP(x) ((x) < pc ? pc : (x) > end ? end : (x))
  if (gk > 0) {{ d[0] = AJ_CLAMP(-rmin); d[1] = end; d[2] = AJ_CLAMP(-rmax); d[3] = d[0]; }}
  else {{ d[0] = pc; d[1] = AJ_CLAMP(rmin + 1); d[2] = d[1]; d[3] = AJ_CLAMP(rmax + 1); }}
#undef AJ_CLAMP
}}
/* Mask 2: zeroes the elements of packed B where the guard fails, in each panel's band, where
   `finite_a`; returns the tiles' mode (2, or 0 for the exact path). Mask 1: the mode is 1
   where B's block is finite. */
static int {name}_mask_b({t} *Bp, int64_t jc, int64_t ncb, int64_t pc, int64_t kcb, const int64_t *g, int mask, int finite_a) {{
  const int64_t sb = {name}_panel(kcb);
  if (mask == 1) return {name}_finite(Bp, sb, (ncb + {nr} - 1) / {nr}, {nr} * kcb) ? 1 : 0;
  if (!finite_a) return 0;
  for (int64_t j0 = 0; j0 < ncb; j0 += {nr}) {{
    const int64_t w = ncb - j0 < {nr} ? ncb - j0 : {nr};
    const int64_t ra = g[1] * (jc + j0) + g[3], rb = g[1] * (jc + j0 + w - 1) + g[3];
    int64_t d[4];
    {name}_depths(ra < rb ? ra : rb, ra < rb ? rb : ra, g[2], pc, pc + kcb, d);
    for (int64_t k = d[2]; k < d[3]; ++k)
      for (int64_t q = 0; q < w; ++q)
        if (g[1] * (jc + j0 + q) + g[2] * k + g[3] < 0) Bp[j0 / {nr} * sb + (k - pc) * {nr} + q] = 0;
  }}
  return 2;
}}
/* Mask 1: a sliver's band (the depths where only some of its rows pass), packed as a sliver
   and zeroed where the guard fails. */
static void {name}_band_a({t} *band, const {t} *Ar, int64_t rsA, const {t} *ap, int64_t i, int64_t h, int64_t pc, int64_t kcb, int rows, const int64_t *g) {{
  const int64_t ra = g[0] * i + g[3], rb = g[0] * (i + h - 1) + g[3];
  int64_t d[4];
  {name}_depths(ra < rb ? ra : rb, ra < rb ? rb : ra, g[2], pc, pc + kcb, d);
  for (int64_t k = d[2]; k < d[3]; ++k)
    for (int64_t r = 0; r < {mr}; ++r)
      band[(k - d[2]) * {mr} + r] = r < h && g[0] * (i + r) + g[2] * k + g[3] >= 0 ? (rows ? Ar[r * rsA + k] : ap[(k - pc) * {mr} + r]) : 0;
}}
/* Zeroes an h × w block of C (a tile, or all of C for a product without depth): by vectors
   where its rows are contiguous and a tile wide (a strided scalar loop,
   and then a string store per row, took a quarter of a causal attention's scores product,
   more than half of whose tiles are skipped). */
static inline void {name}_zero_tile({t} *c, int64_t rsC, int64_t csC, int64_t h, int64_t w) {{
  const {vt} z = {{0}};
  if (csC == 1 && w == {nr})
    for (int64_t r = 0; r < h; ++r) {{ memcpy(c + r * rsC, &z, sizeof z); memcpy(c + r * rsC + {lanes}, &z, sizeof z); }}
  else for (int64_t r = 0; r < h; ++r) for (int64_t q = 0; q < w; ++q) c[r * rsC + q * csC] = 0;
}}
static void {name}_guarded_tile(const {t} *Ar, int64_t rsA, const {t} *ap, const {t} *bp, {t} *c, int64_t rsC, int64_t csC, int64_t i, int64_t h, int64_t j, int64_t w, int64_t pc, int64_t kcb, int rows, int first, const int64_t *g, int masked, const {t} *band) {{
  /* The guard's least and greatest value over the tile's rows and columns (its depth term
     apart): the bounds of r in `r + gk * k >= 0`. */
  const int64_t rmin = g[3] + (g[0] < 0 ? g[0] * (i + h - 1) : g[0] * i) + (g[1] < 0 ? g[1] * (j + w - 1) : g[1] * j);
  const int64_t rmax = g[3] + (g[0] < 0 ? g[0] * i : g[0] * (i + h - 1)) + (g[1] < 0 ? g[1] * j : g[1] * (j + w - 1));
  const int64_t end = pc + kcb;
  const {vi} q0 = {{{columns}}}, q1 = q0 + {lanes};
  if (g[2] == 0 && rmin < 0 && rmax >= 0) {{
    /* Some elements pass at every depth, the others at none: per row, the run of columns
       [lo, hi) it keeps. */
    {t} tile[{mr} * {nr}];
    if (rows) {micro}_rows(kcb, Ar + pc, rsA, bp, tile, {nr}, 1, {mr}, {nr}, 1);
    else {micro}(kcb, ap, bp, tile, {nr}, 1, {mr}, {nr}, 1);
    for (int64_t r = 0; r < h; ++r) {{
      const int64_t rest = g[0] * (i + r) + g[1] * j + g[3];
      int64_t lo = 0, hi = {nr};
      if (g[1] > 0) lo = -rest < 0 ? 0 : (-rest > {nr} ? {nr} : -rest);
      else if (g[1] < 0) hi = rest + 1 < 0 ? 0 : (rest + 1 > {nr} ? {nr} : rest + 1);
      else if (rest < 0) hi = 0;
      const {int} l = ({int})lo, u = ({int})hi;
      {vt} t0, t1;
      memcpy(&t0, tile + r * {nr}, sizeof t0); memcpy(&t1, tile + r * {nr} + {lanes}, sizeof t1);
      t0 = ({vt})(({vi})t0 & ((q0 >= l) & (q0 < u)));
      t1 = ({vt})(({vi})t1 & ((q1 >= l) & (q1 < u)));
      {t} *const cr = c + r * rsC;
      if (csC == 1 && w == {nr}) {{
        /* Zeros where the row is not kept: stored when overwriting, added (a no-op) else. */
        if (!first) {{
          {vt} c0, c1;
          memcpy(&c0, cr, sizeof c0); memcpy(&c1, cr + {lanes}, sizeof c1);
          t0 += c0; t1 += c1;
        }}
        memcpy(cr, &t0, sizeof t0); memcpy(cr + {lanes}, &t1, sizeof t1);
      }} else {{
        {t} row[{nr}];
        memcpy(row, &t0, sizeof t0); memcpy(row + {lanes}, &t1, sizeof t1);
        for (int64_t q = 0; q < w; ++q) cr[q * csC] = first ? row[q] : cr[q * csC] + row[q];
      }}
    }}
    return;
  }}
  if (masked) {{
    int64_t d[4];
    {name}_depths(rmin, rmax, g[2], pc, end, d);
    /* Mask 2: every depth where any element passes, at once (B zeroed where it fails). Mask
       1: those where all pass, then the band from its zeroed copy. */
    const int64_t d0 = masked == 2 && d[2] < d[0] ? d[2] : d[0], d1 = masked == 2 && d[3] > d[1] ? d[3] : d[1];
    if (d1 > d0) {{
      if (rows) {micro}_rows(d1 - d0, Ar + d0, rsA, bp + (d0 - pc) * {nr}, c, rsC, csC, h, w, first);
      else {micro}(d1 - d0, ap + (d0 - pc) * {mr}, bp + (d0 - pc) * {nr}, c, rsC, csC, h, w, first);
    }}
    if (masked == 1 && d[3] > d[2]) {{
      {micro}(d[3] - d[2], band, bp + (d[2] - pc) * {nr}, c, rsC, csC, h, w, first && d1 <= d0);
    }} else if (d1 <= d0 && first) {{
      {name}_zero_tile(c, rsC, csC, h, w);
    }}
    return;
  }}
  /* Every element's terms pass at depths [f0, f1); some elements' at [p0, p1). */
  int64_t d[4] = {{pc, rmax < 0 ? pc : end, pc, pc}};
  if (g[2] != 0) {name}_depths(rmin, rmax, g[2], pc, end, d);
  const int64_t f0 = d[0], f1 = d[1], p0 = d[2], p1 = d[3];
  if (f1 > f0) {{
    if (rows) {micro}_rows(f1 - f0, Ar + f0, rsA, bp + (f0 - pc) * {nr}, c, rsC, csC, h, w, first);
    else {micro}(f1 - f0, ap + (f0 - pc) * {mr}, bp + (f0 - pc) * {nr}, c, rsC, csC, h, w, first);
  }}
  const int onto = !(first && f1 <= f0);
  if (p1 <= p0) {{
    if (!onto) {name}_zero_tile(c, rsC, csC, h, w);
    return;
  }}
  /* Per depth and row, the guard passes on one run of columns [lo, hi) (all or none without a
     column term). */
  for (int64_t r = 0; r < h; ++r) {{
    {vt} s0 = {{0}}, s1 = {{0}};
    for (int64_t k = p0; k < p1; ++k) {{
      const int64_t rest = g[0] * (i + r) + g[1] * j + g[2] * k + g[3];
      int64_t lo = 0, hi = {nr};
      if (g[1] > 0) lo = -rest > 0 ? -rest : 0;
      else if (g[1] < 0) hi = rest + 1 < {nr} ? rest + 1 : {nr};
      else if (rest < 0) hi = 0;
      if (lo >= hi) continue;
      const {t} ar = rows ? Ar[r * rsA + k] : ap[(k - pc) * {mr} + r];
      const {t} *const bk = bp + (k - pc) * {nr};
      {vt} t0, t1;
      memcpy(&t0, bk, sizeof t0); memcpy(&t1, bk + {lanes}, sizeof t1);
      t0 *= ar; t1 *= ar;
      if (lo > 0 || hi < {nr}) {{
        const {int} l = ({int})lo, u = ({int})hi;
        t0 = ({vt})(({vi})t0 & ((q0 >= l) & (q0 < u)));
        t1 = ({vt})(({vi})t1 & ((q1 >= l) & (q1 < u)));
      }}
      s0 += t0; s1 += t1;
    }}
    {t} row[{nr}];
    memcpy(row, &s0, sizeof s0); memcpy(row + {lanes}, &s1, sizeof s1);
    {t} *const cr = c + r * rsC;
    for (int64_t q = 0; q < w; ++q) cr[q * csC] = onto ? cr[q * csC] + row[q] : row[q];
  }}
}}
",
        vbytes = lanes * elem
    );
}

/// `{name}_pack_across(dst, width, src, stride, rows, depth)`: `rows` (at most `width`) runs
/// of `depth` contiguous elements, `stride` apart, packed across — `dst[k * width + i] =
/// src[i * stride + k]` — with rows `rows..width` zero. That is how a row-major `A` sliver or a
/// column-major `B` panel is packed. Four rows at a time go through 4 × 4 transposes in vector
/// registers (4 loads, 8 shuffles, 4 stores per 16 elements) where the compiler has
/// `__builtin_shufflevector` (clang, gcc 12 and later); element by element otherwise. On a
/// 2-core Xeon the products whose `A` is packed this way (rows 4 KiB apart) went from 107–111
/// to 131–133 GFLOP/s on one core. Out of line: one copy serves both call sites (inlined
/// twice it added a tenth to the helper's compile time, for no measurable speed). Rows far
/// apart are fetched into `fetch`.
fn write_pack_across(s: &mut String, name: &str, (t, elem): (&str, usize), fetch: StreamFetch) {
    let v4 = format!("{name}_v4");
    let l = fetch.locality();
    let _ = write!(
        s,
        "#ifdef __has_builtin
#if __has_builtin(__builtin_shufflevector)
#define AJ_{name}_SHUFFLE 1
#endif
#endif
#ifdef AJ_{name}_SHUFFLE
typedef {t} {v4} __attribute__((vector_size({v4_bytes}), aligned({elem})));
#endif
static __attribute__((noinline)) void {name}_pack_across({t} *restrict dst, int64_t width, const {t} *restrict src, int64_t stride, int64_t rows, int64_t depth) {{
  int64_t i = 0;
#ifdef AJ_{name}_SHUFFLE
  for (; i + 4 <= rows; i += 4) {{
    const {t} *const s0 = src + i * stride, *const s1 = s0 + stride, *const s2 = s1 + stride, *const s3 = s2 + stride;
    int64_t k = 0;
    for (; k + 4 <= depth; k += 4) {{
      /* The same line of the rows two groups on (rows far apart, read from L3 or memory: a
         transpose of attention's keys read 3 GB/s without it), into the CPU's level for
         streamed operands. */
      if (i + 12 <= rows && (k & 15) == 0) {{
        const {t} *const ahead = s0 + 8 * stride + k;
        __builtin_prefetch(ahead, 0, {l}); __builtin_prefetch(ahead + stride, 0, {l});
        __builtin_prefetch(ahead + 2 * stride, 0, {l}); __builtin_prefetch(ahead + 3 * stride, 0, {l});
      }}
      {v4} r0, r1, r2, r3;
      memcpy(&r0, s0 + k, sizeof r0); memcpy(&r1, s1 + k, sizeof r1); memcpy(&r2, s2 + k, sizeof r2); memcpy(&r3, s3 + k, sizeof r3);
      const {v4} t0 = __builtin_shufflevector(r0, r1, 0, 4, 1, 5), t1 = __builtin_shufflevector(r0, r1, 2, 6, 3, 7);
      const {v4} t2 = __builtin_shufflevector(r2, r3, 0, 4, 1, 5), t3 = __builtin_shufflevector(r2, r3, 2, 6, 3, 7);
      const {v4} o0 = __builtin_shufflevector(t0, t2, 0, 1, 4, 5), o1 = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
      const {v4} o2 = __builtin_shufflevector(t1, t3, 0, 1, 4, 5), o3 = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
      memcpy(dst + k * width + i, &o0, sizeof o0); memcpy(dst + (k + 1) * width + i, &o1, sizeof o1);
      memcpy(dst + (k + 2) * width + i, &o2, sizeof o2); memcpy(dst + (k + 3) * width + i, &o3, sizeof o3);
    }}
    for (; k < depth; ++k) {{
      dst[k * width + i] = s0[k]; dst[k * width + i + 1] = s1[k];
      dst[k * width + i + 2] = s2[k]; dst[k * width + i + 3] = s3[k];
    }}
  }}
#endif
  for (; i < rows; ++i)
    for (int64_t k = 0; k < depth; ++k) dst[k * width + i] = src[i * stride + k];
  for (; i < width; ++i)
    for (int64_t k = 0; k < depth; ++k) dst[k * width + i] = 0;
}}
",
        v4_bytes = 4 * elem
    );
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
