//! A static check of loop code: every access stays inside its node's storage (margins of
//! padded nodes included) for every value of the loop iterators and static symbols, and every
//! symbol is bound. Compiled code does not check indices, so this check is what keeps
//! out-of-range accesses from ever reaching a backend.

use std::collections::HashMap;

use crate::error::{Error, OutOfBounds, Result};
use crate::indexing::{AxisIndex, StaticSymbol, Symbol};
use crate::low_level::{LowLevel, ScalarExpr};
use crate::tnode::Tnode;

/// Checks every access of `code`; `statics` gives the ranges of the static symbols.
pub fn check_bounds(code: &LowLevel, statics: &[StaticSymbol]) -> Result<()> {
    let mut ranges: HashMap<Symbol, (i64, i64)> = statics
        .iter()
        .map(|s| {
            (
                s.symbol,
                (0, i64::try_from(s.range).unwrap_or(i64::MAX) - 1),
            )
        })
        .collect();
    stmt(code, &mut ranges)
}

fn access(tn: &Tnode, idcs: &[AxisIndex], ranges: &HashMap<Symbol, (i64, i64)>) -> Result<()> {
    let dims = tn.dims();
    if idcs.len() != dims.len() {
        return Err(Error::out_of_bounds(
            tn.debug_name(),
            OutOfBounds::Rank {
                given: idcs.len(),
                rank: dims.len(),
            },
        ));
    }
    let pads = tn.padding().map(|p| p.axes.clone());
    for (a, idx) in idcs.iter().enumerate() {
        let (lo, hi) = idx
            .range_over(&|s| ranges.get(&s).copied())
            .map_err(|e| e.into_error(&tn.debug_name(), "checking the optimized code"))?;
        let (left, right) = pads
            .as_ref()
            .map(|p| (p[a].left as i64, p[a].right as i64))
            .unwrap_or((0, 0));
        if lo < -left || hi > dims[a] as i64 - 1 + right {
            return Err(Error::IndexOutOfBounds {
                array: tn.debug_name(),
                problem: OutOfBounds::Axis {
                    axis: a,
                    lo,
                    hi,
                    min: -left,
                    max: dims[a] as i64 - 1 + right,
                },
                during: "checking the optimized code".into(),
            });
        }
    }
    Ok(())
}

fn stmt(s: &LowLevel, ranges: &mut HashMap<Symbol, (i64, i64)>) -> Result<()> {
    match s {
        LowLevel::Seq(items) => items.iter().try_for_each(|i| stmt(i, ranges)),
        LowLevel::For {
            index,
            from,
            to,
            body,
        } => {
            if from >= to {
                return Ok(());
            }
            let prev = ranges.insert(*index, (*from, to - 1));
            let r = stmt(body, ranges);
            match prev {
                Some(p) => ranges.insert(*index, p),
                None => ranges.remove(index),
            };
            r
        }
        LowLevel::Set { tn, idcs, value } => {
            access(tn, idcs, ranges)?;
            expr(value, ranges)
        }
        LowLevel::SetLocal(_, value) => expr(value, ranges),
        LowLevel::Noop | LowLevel::Comment(_) | LowLevel::ZeroOut(_) => Ok(()),
    }
}

fn expr(e: &ScalarExpr, ranges: &mut HashMap<Symbol, (i64, i64)>) -> Result<()> {
    match e {
        ScalarExpr::Get(tn, idcs) | ScalarExpr::GetMerge(tn, idcs) => access(tn, idcs, ranges)?,
        ScalarExpr::LocalScope { body, .. } => stmt(body, ranges)?,
        ScalarExpr::Gather {
            symbol,
            extent,
            index,
            read,
        } => {
            expr(index, ranges)?;
            if *extent == 0 {
                return Err(Error::invalid(
                    "a gather selects from an empty axis: no index is valid",
                ));
            }
            let prev = ranges.insert(*symbol, (0, *extent as i64 - 1));
            let r = expr(read, ranges);
            match prev {
                Some(p) => ranges.insert(*symbol, p),
                None => ranges.remove(symbol),
            };
            return r;
        }
        ScalarExpr::EmbedIndex(i) | ScalarExpr::Random { index: i, .. } => {
            for s in i.symbols() {
                if !ranges.contains_key(&s) {
                    return Err(Error::StaticIndex {
                        symbol: s.to_string(),
                        detail: "an embedded index uses it but nothing binds it".into(),
                    });
                }
            }
        }
        _ => {}
    }
    let mut result = Ok(());
    e.for_each_child(|c| {
        if result.is_ok() {
            result = expr(c, ranges);
        }
    });
    result
}
