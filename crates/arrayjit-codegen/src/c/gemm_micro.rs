//! The product helper's micro-kernels (`crate::c::gemm`): one register tile of `mr × nr`
//! accumulators per call, in the variants the helper's loops pick (a packed sliver of A, A's
//! rows or columns read in place, B read in place, and narrower kernels for a last, partial
//! sliver), each summing every element in the same order, and the tile's store into `C`.

use std::fmt::Write as _;

use arrayjit_opt::schedule::Blocking;

/// Writes the micro-kernels `{name}_micro*` and `{name}_micro_packed` of a helper of element type
/// `t` and vector type `vt` (half a tile's row).
pub(crate) fn write_micro_kernels(s: &mut String, name: &str, (t, vt): (&str, &str), b: &Blocking) {
    let micro = format!("{name}_micro");
    let (mr, nr) = (b.mr, b.nr);
    let lanes = (nr / 2).max(1);
    // The micro-kernel: an mr × nr tile in 2·mr vector accumulators; one variant reads a
    // packed sliver of A (`a[k * mr + r]`), the other rows of a row-major A in place
    // (`a[r * lda + k]`), which saves packing when A's rows are contiguous. Both sum in the
    // same order, so they give the same bits. Each starts on a cache line (`aligned(64)`), so
    // its loop's place in the instruction cache does not move with the code linked before it:
    // on the Xeon (6/207) the attention helper's forward and backward ran 273–277 ms or
    // 292–297 ms by where its unit's code happened to end (a comment's worth of difference).
    //
    // The `_bd` variants read B in place too (rows `ldb` apart, for one block of A's rows
    // against a row-major B: see `{name}_block_in_place`), and fetch the same depths of the
    // next panel (`pf` elements on: the panel's width, or 0 for no new lines) while they run,
    // into the CPU's level for streamed operands (`Blocking::stream_fetch`, as the row
    // products' fetches; with L2, GPT-2 small's prefill in chunks of 64 on an AMD EPYC (Zen 4)
    // took 132 ms for 8 tokens and 690 ms for 300 against 145 and 760 with L1).
    //
    // `_r8` and `_r4` run a packed sliver's first 8 or 4 rows only: the last, partial sliver of
    // a block whose rows are not a multiple of mr (a 128-row attention block ends in 8 rows of
    // 12; the full kernel spent a third of that sliver's multiply-adds on zeros).
    let locality = b.stream_fetch.locality();
    let in_place_fetch = format!(
        "    __builtin_prefetch(b + k * ldb + pf, 0, {locality}); __builtin_prefetch(b + k * ldb + pf + 64 / sizeof(*b), 0, {locality});\n"
    );
    let packed_at = format!("k * {mr} + {{r}}");
    let mut variants = vec![
        ("", "", packed_at.clone(), format!("k * {nr}"), "", mr),
        (
            "_rows",
            ", int64_t lda",
            "{r} * lda + k".to_string(),
            format!("k * {nr}"),
            "",
            mr,
        ),
        (
            "_cols",
            ", int64_t lda",
            "k * lda + {r}".to_string(),
            format!("k * {nr}"),
            "",
            mr,
        ),
        (
            "_bd",
            ", int64_t ldb, int64_t pf",
            packed_at.clone(),
            "k * ldb".to_string(),
            in_place_fetch.as_str(),
            mr,
        ),
        (
            "_rows_bd",
            ", int64_t lda, int64_t ldb, int64_t pf",
            "{r} * lda + k".to_string(),
            "k * ldb".to_string(),
            in_place_fetch.as_str(),
            mr,
        ),
    ];
    for (suffix, rows) in [("_r8", 8), ("_r4", 4)] {
        if rows < mr {
            variants.push((suffix, "", packed_at.clone(), format!("k * {nr}"), "", rows));
        }
    }
    for (suffix, extra, a_at, b_at, fetch, rows) in variants {
        let _ = writeln!(
            s,
            "static inline __attribute__((aligned(64))) void {micro}{suffix}(int64_t kc, const {t} *restrict a{extra}, const {t} *restrict b, {t} *c, int64_t rsC, int64_t csC, int64_t mr, int64_t nr, int ovw) {{"
        );
        for r in 0..rows {
            let _ = writeln!(s, "  {vt} c{r}_0 = {{0}}, c{r}_1 = {{0}};");
        }
        let _ = writeln!(s, "  for (int64_t k = 0; k < kc; ++k) {{");
        s.push_str(fetch);
        let _ = writeln!(
            s,
            "    const {vt} b0 = *(const {vt} *)(b + {b_at}), b1 = *(const {vt} *)(b + {b_at} + {lanes});"
        );
        for r in 0..rows {
            let at = a_at.replace("{r}", &r.to_string());
            let _ = writeln!(
                s,
                "    {{ const {t} ar = a[{at}]; c{r}_0 += ar * b0; c{r}_1 += ar * b1; }}"
            );
        }
        let _ = writeln!(s, "  }}");
        write_tile_store(s, t, vt, rows, nr, lanes);
    }
    // A packed sliver of `mr` rows (at most the tile's) on the narrowest kernel that holds them.
    let mut dispatch = String::new();
    for rows in [4usize, 8] {
        if rows < mr {
            let _ = write!(
                dispatch,
                "if (mr <= {rows}) {micro}_r{rows}(kc, a, b, c, rsC, csC, mr, nr, ovw); else "
            );
        }
    }
    let _ = writeln!(
        s,
        "static inline void {name}_micro_packed(int64_t kc, const {t} *restrict a, const {t} *restrict b, {t} *c, int64_t rsC, int64_t csC, int64_t mr, int64_t nr, int ovw) {{\n  {dispatch}{micro}(kc, a, b, c, rsC, csC, mr, nr, ovw);\n}}"
    );
}

/// The end of a micro-kernel: the tile of accumulators stored into (or added to) `C`.
fn write_tile_store(s: &mut String, t: &str, vt: &str, mr: usize, nr: usize, lanes: usize) {
    let _ = writeln!(s, "  if (mr == {mr} && nr == {nr} && csC == 1 && ovw) {{");
    for r in 0..mr {
        let _ = writeln!(
            s,
            "    *({vt} *)(c + {r} * rsC) = c{r}_0; *({vt} *)(c + {r} * rsC + {lanes}) = c{r}_1;"
        );
    }
    let _ = writeln!(s, "  }} else if (mr == {mr} && nr == {nr} && csC == 1) {{");
    for r in 0..mr {
        let _ = writeln!(
            s,
            "    *({vt} *)(c + {r} * rsC) += c{r}_0; *({vt} *)(c + {r} * rsC + {lanes}) += c{r}_1;"
        );
    }
    let _ = writeln!(s, "  }} else {{");
    let _ = writeln!(s, "    {t} tile[{}];", mr * nr);
    for r in 0..mr {
        let _ = writeln!(
            s,
            "    memcpy(tile + {}, &c{r}_0, sizeof c{r}_0); memcpy(tile + {}, &c{r}_1, sizeof c{r}_1);",
            r * nr,
            r * nr + lanes
        );
    }
    let _ = writeln!(
        s,
        "    if (ovw) {{ for (int64_t i = 0; i < mr; ++i) for (int64_t j = 0; j < nr; ++j) c[i * rsC + j * csC] = tile[i * {nr} + j]; }}\n    else {{ for (int64_t i = 0; i < mr; ++i) for (int64_t j = 0; j < nr; ++j) c[i * rsC + j * csC] += tile[i * {nr} + j]; }}"
    );
    let _ = writeln!(s, "  }}\n}}");
}
