//! The bounds check every lowering makes of its accesses: each index of a node stays inside
//! the node (its margins included) for every value of the loop iterators and static symbols.

use crate::error::{Error, OutOfBounds, Result};
use crate::indexing::{AxisIndex, Symbol};
use crate::tnode::Tnode;

/// Checks that each index of an access to `tn` stays inside the node for every value of the
/// symbols, given the symbols' extents.
pub(crate) fn check_access(
    tn: &Tnode,
    idcs: &[AxisIndex],
    bounds: &impl Fn(Symbol) -> Option<usize>,
    what: &str,
) -> Result<()> {
    if idcs.len() != tn.dims().len() {
        return Err(Error::shape_mismatch(
            what,
            &[tn.dims()],
            format!(
                "{} has {} axes (dims {:?}) but is indexed with {} indices",
                tn.debug_name(),
                tn.dims().len(),
                tn.dims(),
                idcs.len()
            ),
        ));
    }
    let pads = tn.padding().map(|p| p.axes.clone());
    for (axis, (idx, &d)) in idcs.iter().zip(tn.dims()).enumerate() {
        let (left, right) = pads
            .as_ref()
            .map(|p| (p[axis].left as i64, p[axis].right as i64))
            .unwrap_or((0, 0));
        let (lo, hi) = idx
            .value_range(bounds)
            .map_err(|e| e.into_error(&tn.debug_name(), what))?;
        if lo < -left || hi > d as i64 - 1 + right {
            return Err(Error::IndexOutOfBounds {
                array: tn.debug_name(),
                problem: OutOfBounds::Axis {
                    axis,
                    lo,
                    hi,
                    min: -left,
                    max: d as i64 - 1 + right,
                },
                during: what.to_string(),
            });
        }
    }
    Ok(())
}
