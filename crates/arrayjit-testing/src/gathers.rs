//! Gathers (data-dependent reads) in the conformance corpus: embedding lookups along the first
//! axis with repeated, boundary and fractional ids, a gather along a middle axis with integer
//! ids, a gather from a computed table and by computed ids (both candidates for inlining), and
//! a batch of ids chosen by a static index.

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, FetchOp, Operand, Prec, Result, StaticSymbol, Tnode, UnOp,
};

use super::case::{Case, case, output};

fn values(prec: Prec, dims: &[usize], label: &str, f: impl Fn(usize) -> f64) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    let n: usize = dims.iter().product();
    t.host().set_values(&(0..n).map(f).collect::<Vec<_>>())?;
    Ok(t)
}

fn gather(array: &Tnode, table: &Tnode, ids: &Tnode, axis: usize) -> Assignments {
    Assignments::Fetch {
        array: array.clone(),
        op: FetchOp::Gather {
            table: table.clone(),
            ids: ids.clone(),
            axis,
        },
    }
}

/// An embedding lookup: rows of a `[7, 5]` table by a `[3, 4]` grid of ids that repeat, hit
/// both ends of the table, and are fractional (truncated toward zero).
fn embedding_lookup(prec: Prec) -> Result<Case> {
    let table = values(prec, &[7, 5], "table", |i| i as f64 * 0.5 - 8.0)?;
    let ids = [0.0, 6.0, 3.0, 3.0, 1.0, 2.7, 6.0, 0.0, 5.0, 4.0, 0.9, 2.0];
    let ids = values(Prec::F32, &[3, 4], "ids", |i| ids[i])?;
    let out = output(prec, &[3, 4, 5], "embedded")?;
    Ok(case(
        &format!("gather_embedding_{prec}"),
        gather(&out, &table, &ids, 0),
        vec![out],
    ))
}

/// A gather along the middle axis of a `[3, 6, 4]` table by integer ids.
fn middle_axis() -> Result<Case> {
    let table = values(Prec::F64, &[3, 6, 4], "table", |i| {
        (i * 7 % 23) as f64 - 11.0
    })?;
    let ids = values(Prec::I32, &[2], "ids", |i| [5.0, 1.0][i])?;
    let out = output(Prec::F64, &[3, 2, 4], "taken")?;
    Ok(case(
        "gather_middle_axis",
        gather(&out, &table, &ids, 1),
        vec![out],
    ))
}

/// A gather from a table computed in the same routine (`tanh` of an input) by ids computed
/// there too (`2 * raw`), followed by a pointwise use: the optimizer may inline either.
fn computed_table_and_ids() -> Result<Case> {
    let x = values(Prec::F32, &[4, 3], "x", |i| i as f64 / 3.0 - 2.0)?;
    let table = Tnode::new(Prec::F32, &[4, 3], &["tanh_table"])?;
    let raw = values(Prec::F32, &[5], "raw", |i| [0.0, 1.5, 0.5, 1.0, 1.5][i])?;
    let two = values(Prec::F32, &[5], "two", |_| 2.0)?;
    let ids = Tnode::new(Prec::F32, &[5], &["ids"])?;
    let picked = Tnode::new(Prec::F32, &[5, 3], &["picked"])?;
    let out = output(Prec::F32, &[5, 3], "scaled")?;
    let program = Assignments::pointwise_unop(&table, UnOp::Tanh, &x)
        .then(Assignments::pointwise_binop(&ids, BinOp::Mul, &raw, &two))
        .then(gather(&picked, &table, &ids, 0))
        .then(Assignments::einsum(
            "ij,ij->ij",
            BinOp::Arg2,
            &out,
            AccumRhs::Binop(
                BinOp::Add,
                Operand::Node(picked.clone()),
                Operand::Node(picked),
            ),
            false,
        )?);
    Ok(case("gather_computed_table_and_ids", program, vec![out]))
}

/// Batches of ids chosen by a static index (a training loop's minibatch), each embedded and
/// summed over its positions into a running total, over three runs.
fn batched_ids() -> Result<Case> {
    let batch = StaticSymbol::new("batch", 3);
    let table = values(Prec::F32, &[5, 2], "table", |i| i as f64 + 0.25)?;
    let all_ids = values(Prec::F32, &[3, 4], "all_ids", |i| ((i * 3) % 5) as f64)?;
    let ids = Tnode::new(Prec::F32, &[4], &["batch_ids"])?;
    let rows = Tnode::new(Prec::F32, &[4, 2], &["rows"])?;
    let total = output(Prec::F32, &[2], "total")?;
    total.host().set_values(&[0.0, 0.0])?;
    let program = Assignments::Fetch {
        array: ids.clone(),
        op: FetchOp::Slice {
            batch: batch.clone(),
            sliced: all_ids,
        },
    }
    .then(gather(&rows, &table, &ids, 0))
    .then(Assignments::einsum(
        "ij->j",
        BinOp::Add,
        &total,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(rows)),
        false,
    )?);
    let mut c = case("gather_batched_ids", program, vec![total]);
    c.bindings = vec![batch];
    c.runs = vec![vec![0], vec![2], vec![1]];
    Ok(c)
}

/// The gather cases.
pub(super) fn gather_cases() -> Result<Vec<Case>> {
    Ok(vec![
        embedding_lookup(Prec::F32)?,
        embedding_lookup(Prec::F64)?,
        middle_axis()?,
        computed_table_and_ids()?,
        batched_ids()?,
    ])
}
