//! Which product helper a library gets: the guarded steps only where a product is guarded,
//! whatever the order its products are rendered in.

use std::collections::BTreeMap;

use arrayjit_ir::Prec;
use arrayjit_ir::schedule::Blocking;

use super::{GUARDS_DROPPED, ProductGuards, add_product_helper, gemm_definition, gemm_name};

const BLOCKING: Blocking = Blocking {
    mr: 4,
    nr: 8,
    mc: 64,
    kc: 32,
    nc: 64,
};

/// The helper's definition after adding products guarded as `guarded` says, in that order.
fn helper_after(guarded: &[bool]) -> String {
    let mut products = BTreeMap::new();
    for &g in guarded {
        let name = add_product_helper(&mut products, Prec::F32, &BLOCKING, g);
        assert_eq!(name, gemm_name(Prec::F32, &BLOCKING));
    }
    assert_eq!(products.len(), 1, "one unit per precision and blocking");
    products.into_values().next().unwrap().1
}

#[test]
fn a_guarded_product_keeps_the_whole_helper_in_any_order() {
    let whole = gemm_definition(Prec::F32, &BLOCKING, ProductGuards::Taken);
    assert!(!whole.contains(GUARDS_DROPPED));
    assert!(whole.contains("_guarded_tile("));
    for order in [
        &[true][..],
        &[false, true],
        &[true, false],
        &[false, false, true],
    ] {
        assert_eq!(helper_after(order), whole, "products guarded as {order:?}");
    }
}

#[test]
fn without_guarded_products_every_guard_is_dropped() {
    let dropped = helper_after(&[false, false]);
    assert_eq!(
        dropped,
        gemm_definition(Prec::F32, &BLOCKING, ProductGuards::Dropped)
    );
    // The entry point, the one-thread product and the block step each drop theirs (the chunk
    // passes its job's guard to the one-thread product).
    assert_eq!(dropped.matches(GUARDS_DROPPED).count(), 3);
    for f in [
        "_serial(",
        "_block(",
        "int64_t *guard, const aj_par *par) {",
    ] {
        let start = dropped
            .find(f)
            .unwrap_or_else(|| panic!("no {f} in the helper"));
        let body = &dropped[start..];
        let open = body.find('{').unwrap();
        let first_line = body[open + 1..].trim_start().lines().next().unwrap();
        assert!(
            first_line.contains(GUARDS_DROPPED),
            "{f} starts with {first_line:?}"
        );
    }
}
