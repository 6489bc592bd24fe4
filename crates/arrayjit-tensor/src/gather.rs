//! Integer ids and what they index: validated id inputs, gathers (`take`, embedding lookups)
//! with a scatter-add gradient, one-hot encodings, and index ramps and causal masks computed in
//! code (no host-made constants).
//!
//! Ids are stored as values of the id tensor's precision (`I32` by default) and truncated
//! toward zero where they are used. They are checked where they enter from the host
//! ([`Tensor::ids`], [`Tensor::set_ids`]): an id outside its range is an
//! [`Error::IndexOutOfBounds`] there. Ids computed in code are not checked on compiled
//! backends; an invalid one reads NaN (never memory outside the table), and the interpreter
//! reports it as an error.

use std::sync::Arc;

use arrayjit_ir::{
    Assignments, BinOp, Error, FetchOp, MemoryMode, MemoryType, OutOfBounds, Prec, Result, Tnode,
};

use crate::tensor::{Rhs, Tensor, einsum_letters};

fn check_ids(label: &str, ids: &[usize], upper: usize) -> Result<()> {
    if let Some((pos, id)) = ids.iter().enumerate().find(|(_, id)| **id >= upper) {
        return Err(Error::out_of_bounds(
            label,
            OutOfBounds::Id {
                id: *id as f64,
                position: Some(pos),
                table: upper,
            },
        ));
    }
    if upper > 1 << 24 {
        return Err(Error::BadValue {
            what: format!("{label}: the table size"),
            value: upper.to_string(),
            expected: "at most 2^24 rows (ids must be exact in f32 arithmetic)".into(),
        });
    }
    Ok(())
}

impl Tensor {
    /// Ids set on the host (`I32`, hosted, no gradient), each checked to lie in `0..upper`.
    pub fn ids(dims: &[usize], label: &str, ids: &[usize], upper: usize) -> Result<Tensor> {
        check_ids(label, ids, upper)?;
        let tn = Tnode::new(Prec::I32, dims, &[label])?;
        tn.host()
            .set_values(&ids.iter().map(|&i| i as f64).collect::<Vec<_>>())?;
        tn.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "tensor: ids set on the host, changed between steps",
        )?;
        Ok(Tensor::from_node(&tn))
    }

    /// Replaces the host values of an id tensor made by [`Tensor::ids`] (checked against
    /// `upper`); the runtime copies them to the device with `Context::from_host`.
    pub fn set_ids(&self, ids: &[usize], upper: usize) -> Result<()> {
        check_ids(&self.label(), ids, upper)?;
        self.node()
            .host()
            .set_values(&ids.iter().map(|&i| i as f64).collect::<Vec<_>>())
    }

    /// `0, 1, ..., n-1` as a vector of precision `prec`, computed in code.
    pub fn arange(prec: Prec, n: usize) -> Result<Tensor> {
        let tn = Tnode::new(prec, &[n], &[&format!("arange{n}")])?;
        let forward = Assignments::Fetch {
            array: tn.clone(),
            op: FetchOp::RangeOverOffsets,
        };
        Ok(Tensor::custom(tn, forward, vec![], None))
    }

    /// The `[n, n]` mask of the future for causal attention: `1` where column `j > i` (a query
    /// at position `i` must not see key `j`), else `0`; computed in code.
    pub fn causal_mask(prec: Prec, n: usize) -> Result<Tensor> {
        let positions = Tensor::arange(prec, n)?;
        Tensor::einsum_op(
            "i,j->ij",
            Rhs::Bin(BinOp::Cmplt),
            &[&positions, &positions],
            BinOp::Arg2,
            false,
            "causal_mask",
            None,
        )
    }

    /// One-hot encoding of ids: shape `ids.dims() + [classes]`, `1` where the last index equals
    /// the id (a row of zeros for an id outside `0..classes`), in precision `prec`.
    pub fn one_hot(ids: &Tensor, classes: usize, prec: Prec) -> Result<Tensor> {
        let lead = einsum_letters(0, ids.dims().len(), "one_hot")?;
        let class = einsum_letters(lead.len(), 1, "one_hot")?;
        let positions = Tensor::arange(prec, classes)?;
        Tensor::einsum_op(
            &format!("{lead},{class}->{lead}{class}"),
            Rhs::Bin(BinOp::Cmpeq),
            &[ids, &positions],
            BinOp::Arg2,
            false,
            "one_hot",
            None,
        )
    }

    /// NumPy's `take(self, ids, axis)`: slices of `self` along `axis` chosen by `ids`; the
    /// result's shape is `self`'s with axis `axis` replaced by `ids`'s shape. The gradient adds
    /// each slice's gradient into the row its id chose (a scatter-add, computed as a contraction
    /// with the ids' one-hot encoding, so repeated ids accumulate without write races).
    pub fn take(&self, ids: &Tensor, axis: usize) -> Result<Tensor> {
        let dims = self.dims();
        if axis >= dims.len() {
            return Err(Error::BadAxis {
                what: "take".into(),
                axis: i64::try_from(axis).unwrap_or(i64::MAX),
                rank: dims.len(),
            });
        }
        if ids.requires_grad() {
            return Err(Error::invalid(
                "take: ids carry no gradient; detach them first",
            ));
        }
        let mut out_dims = dims[..axis].to_vec();
        out_dims.extend_from_slice(ids.dims());
        out_dims.extend_from_slice(&dims[axis + 1..]);
        let value = Tnode::new(
            self.prec(),
            &out_dims,
            &[&format!("{}_taken", self.label())],
        )?;
        let forward = Assignments::Fetch {
            array: value.clone(),
            op: FetchOp::Gather {
                table: self.node().clone(),
                ids: ids.node().clone(),
                axis,
            },
        };
        let extent = dims[axis];
        let rank = dims.len();
        let id_rank = ids.dims().len();
        Ok(Tensor::custom(
            value,
            forward,
            vec![self.clone(), ids.clone()],
            Some(Arc::new(move |out, g| {
                let (table, ids) = (&out.parents()[0], &out.parents()[1]);
                let pre = einsum_letters(0, axis, "take")?;
                let row = einsum_letters(axis, 1, "take")?;
                let post = einsum_letters(axis + 1, rank - axis - 1, "take")?;
                let id_axes = einsum_letters(rank, id_rank, "take")?;
                let hot = Tensor::one_hot(ids, extent, g.prec())?;
                let grad = Tensor::einsum_op(
                    &format!("{id_axes}{row},{pre}{id_axes}{post}->{pre}{row}{post}"),
                    Rhs::Bin(BinOp::Mul),
                    &[&hot, g],
                    BinOp::Add,
                    true,
                    "scatter_add",
                    None,
                )?;
                debug_assert_eq!(grad.dims(), table.dims());
                Ok(vec![Some(grad), None])
            })),
        ))
    }

    /// An embedding lookup: rows of the `[vocabulary, width]` table `self` for each id, shape
    /// `ids.dims() + [width]`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.dims().len() != 2 {
            return Err(Error::ShapeMismatch {
                op: "embedding".into(),
                shapes: vec![self.dims().to_vec()],
                detail: format!(
                    "the table must be [vocabulary, width], got {:?}",
                    self.dims()
                ),
            });
        }
        self.take(ids, 0)
    }
}
