//! Which product helper a library gets: every path one of its products can reach, whatever
//! the order its products are rendered in, and no other.

use std::collections::BTreeMap;

use arrayjit_ir::Prec;
use arrayjit_opt::schedule::{Blocking, StreamFetch};

use super::{HelperPaths, add_product_helper, gemm_definition, gemm_name};
use crate::c::gemm_paths::{GUARDS_DROPPED, ONE_ROW_DROPPED};

const BLOCKING: Blocking = Blocking {
    mr: 12,
    nr: 32,
    mc: 96,
    kc: 64,
    nc: 128,
    stream_fetch: StreamFetch::L2,
};

/// The helper's definition after adding products reaching `paths`, in that order.
fn helper_after(paths: &[HelperPaths]) -> String {
    let mut products = BTreeMap::new();
    for &p in paths {
        let name = add_product_helper(&mut products, Prec::F32, &BLOCKING, p);
        assert_eq!(name, gemm_name(Prec::F32, &BLOCKING));
    }
    assert_eq!(products.len(), 1, "one unit per precision and blocking");
    products.into_values().next().unwrap().1
}

const GUARDED: HelperPaths = HelperPaths {
    guarded: true,
    one_row: false,
};
const ONE_ROW: HelperPaths = HelperPaths {
    guarded: false,
    one_row: true,
};

#[test]
fn a_library_keeps_every_path_one_of_its_products_reaches_in_any_order() {
    use HelperPaths as P;
    let cases: [(&[HelperPaths], HelperPaths); 7] = [
        (&[P::NONE], P::NONE),
        (&[P::NONE, P::NONE], P::NONE),
        (&[GUARDED], GUARDED),
        (&[P::NONE, GUARDED], GUARDED),
        (&[GUARDED, P::NONE], GUARDED),
        (&[ONE_ROW, P::NONE, GUARDED], P::ALL),
        (&[P::NONE, GUARDED, ONE_ROW, P::NONE], P::ALL),
    ];
    for (order, expected) in cases {
        assert_eq!(
            helper_after(order),
            gemm_definition(Prec::F32, &BLOCKING, expected),
            "products reaching {order:?}"
        );
    }
}

#[test]
fn the_whole_helper_has_every_path() {
    let whole = gemm_definition(Prec::F32, &BLOCKING, HelperPaths::ALL);
    assert!(!whole.contains(GUARDS_DROPPED) && !whole.contains(ONE_ROW_DROPPED));
    assert!(whole.contains("_guarded_tile(") && whole.contains("_row("));
}

#[test]
fn without_a_path_its_entries_are_dropped_at_their_start() {
    let none = gemm_definition(Prec::F32, &BLOCKING, HelperPaths::NONE);
    // The entry point, the one-thread product and the block step each drop their guard (the
    // chunk passes its job's guard to the one-thread product).
    assert_eq!(none.matches(GUARDS_DROPPED).count(), 3);
    for f in [
        "_serial(",
        "_block(",
        "int64_t *guard, const aj_par *par) {",
    ] {
        let start = none
            .find(f)
            .unwrap_or_else(|| panic!("no {f} in the helper"));
        let body = &none[start..];
        let open = body.find('{').unwrap();
        let first_line = body[open + 1..].trim_start().lines().next().unwrap();
        assert!(
            first_line.contains(GUARDS_DROPPED),
            "{f} starts with {first_line:?}"
        );
    }
    // Every call of the one-row product sits behind a test that is false from its start.
    let calls = none.matches("_row(").count() - 1; // less the definition
    assert_eq!(calls, 3);
    assert_eq!(
        none.matches(&format!("0 /* {ONE_ROW_DROPPED} */ && "))
            .count(),
        3
    );
}

#[test]
fn a_product_reaches_one_row_where_it_or_its_last_range_of_a_split_is_one_row() {
    let of = |m, n| HelperPaths::of_product(m, n, false, &BLOCKING).one_row;
    // Whole tiles, or remainders other than one: never one row.
    assert!(!of(1024, 128));
    assert!(!of(62, 1024));
    assert!(!of(24, 64));
    // One row or column, either way round.
    assert!(of(1, 512));
    assert!(of(512, 1));
    // A split's last range: 13 rows (12 + 1), 33 columns (32 + 1), or a transposed product's.
    assert!(of(13, 64));
    assert!(of(64, 33));
    assert!(of(33, 64));
    assert!(of(64, 25)); // 25 = 2 · 12 + 1, as rows of the transpose
    // Tiles of one row: any split can leave one.
    let thin = Blocking { mr: 1, ..BLOCKING };
    assert!(HelperPaths::of_product(64, 64, false, &thin).one_row);
    // Guards pass through.
    assert!(HelperPaths::of_product(64, 64, true, &BLOCKING).guarded);
}

#[test]
fn streamed_operands_are_fetched_into_the_blocking_s_level() {
    let l1 = Blocking {
        stream_fetch: StreamFetch::L1,
        ..BLOCKING
    };
    assert_eq!(
        gemm_name(Prec::F32, &BLOCKING),
        "aj_gemm_f32_12x32_96_64_128"
    );
    assert_eq!(
        gemm_name(Prec::F32, &l1),
        "aj_gemm_f32_12x32_96_64_128_fetch_l1"
    );
    // Every fetch of a streamed operand (the row products' B, B read in place, rows packed
    // across) at the level's locality, none at the other's.
    for (b, level, other) in [(BLOCKING, 2, 3), (l1, 3, 2)] {
        let def = gemm_definition(Prec::F32, &b, HelperPaths::ALL)
            + &crate::c::gemm_widened::widened_definition(Prec::F32, Prec::Bf16, &b);
        for fetch in [
            format!("__builtin_prefetch(b0 + j + 4 * rsB, 0, {level});"),
            format!("__builtin_prefetch(b3 + k + 8 * csB, 0, {level});"),
            format!("__builtin_prefetch(b + k * ldb + pf, 0, {level});"),
            format!("__builtin_prefetch(ahead + stride, 0, {level});"),
        ] {
            assert!(def.contains(&fetch), "{fetch} missing");
        }
        for fetch in [
            format!("rsB, 0, {other})"),
            format!("csB, 0, {other})"),
            format!("pf, 0, {other})"),
            format!("stride, 0, {other})"),
        ] {
            assert!(!def.contains(&fetch), "{fetch} present");
        }
    }
}
