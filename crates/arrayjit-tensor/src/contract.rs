//! Contractions, reductions and shape changes: einsum of one or two tensors (matmul is
//! `"ij,jk->ik"`), sums, means and maxima over axes, transposes and reshapes.

use std::sync::Arc;

use arrayjit_ir::{BinOp, EinsumGuard, Error, Prec, Result, UnOp};

use crate::tensor::{Rhs, Tensor, parse_spec};

fn letters(n: usize) -> String {
    (0..n).map(|i| (b'a' + i as u8) as char).collect()
}

/// Einsum letters of a shape and of what remains after reducing `axes`.
fn reduction_letters(op: &str, dims: &[usize], axes: &[usize]) -> Result<(String, String)> {
    check_axes(op, dims, axes)?;
    let all = letters(dims.len());
    let kept = all
        .chars()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, c)| c)
        .collect();
    Ok((all, kept))
}

fn check_axes(op: &str, dims: &[usize], axes: &[usize]) -> Result<()> {
    let mut seen = vec![false; dims.len()];
    for &a in axes {
        if a >= dims.len() {
            return Err(Error::BadAxis {
                what: op.into(),
                axis: i64::try_from(a).unwrap_or(i64::MAX),
                rank: dims.len(),
            });
        }
        if seen[a] {
            return Err(Error::ShapeMismatch {
                op: op.into(),
                shapes: vec![dims.to_vec()],
                detail: "an axis is named twice; name each axis once".into(),
            });
        }
        seen[a] = true;
    }
    Ok(())
}

impl Tensor {
    /// Einsum of one tensor (`"ij->j"` sums over `i`, `"ij->ji"` transposes) or of the product
    /// of two (`"ij,jk->ik"` is a matrix product); letters missing from the result are summed.
    pub fn einsum(spec: &str, inputs: &[&Tensor]) -> Result<Tensor> {
        let (lhs, rhs) = parse_spec(spec).ok_or_else(|| Error::ShapeMismatch {
            op: format!("einsum {spec:?}"),
            shapes: vec![],
            detail: "the spec needs `->`".into(),
        })?;
        match inputs {
            [a] => {
                let (ra, lhs2) = (rhs[0].clone(), lhs.clone());
                Tensor::einsum_op(
                    spec,
                    Rhs::Un(UnOp::Identity),
                    &[a],
                    BinOp::Add,
                    true,
                    "einsum",
                    Some(Arc::new(move |out, g| {
                        // Broadcast the gradient back over the summed letters.
                        let parent = &out.parents()[0];
                        Ok(vec![Some(broadcast_to(&lhs2, g, &ra, parent.dims())?)])
                    })),
                )
            }
            [a, b] => Tensor::product_in(spec, a, b, None),
            _ => Err(Error::ShapeMismatch {
                op: format!("einsum {spec:?}"),
                shapes: vec![],
                detail: format!("takes one or two tensors, {} were given", inputs.len()),
            }),
        }
    }

    /// The einsum of the product of two tensors, the result in precision `prec` (`None`:
    /// theirs promoted). Factors of one 16-bit float precision into an `f32` result
    /// accumulate in `f32` (on a GPU's matrix units). For 16-bit factors the incoming gradient
    /// is cast to their precision first and the gradient products accumulate in the result's
    /// precision, so the backward products of 16-bit factors are 16-bit products too.
    pub fn product_in(spec: &str, a: &Tensor, b: &Tensor, prec: Option<Prec>) -> Result<Tensor> {
        Tensor::guarded_product_in(spec, a, b, &[], prec)
    }

    /// The einsum of the product of two tensors summing only the terms where every guard holds
    /// (a guard `Σ coeff·letter + offset ≥ 0` over the spec's letters; see [`EinsumGuard`]).
    /// Result elements with no term left are 0. Causal attention's scores are
    /// `guarded_product("bthe,bshe->bhts", q, k, &[EinsumGuard::at_most('s', 't', 0)])`: the
    /// products above the diagonal are never computed, on a CPU whole register tiles of them.
    /// The gradients are the guarded products of the incoming gradient, so each guard letter
    /// must name an axis of at least two of the result and the two factors.
    pub fn guarded_product(
        spec: &str,
        a: &Tensor,
        b: &Tensor,
        guards: &[EinsumGuard],
    ) -> Result<Tensor> {
        Tensor::guarded_product_in(spec, a, b, guards, None)
    }

    /// [`Tensor::guarded_product`] with the result in precision `prec`, as
    /// [`Tensor::product_in`].
    pub fn guarded_product_in(
        spec: &str,
        a: &Tensor,
        b: &Tensor,
        guards: &[EinsumGuard],
        prec: Option<Prec>,
    ) -> Result<Tensor> {
        let (lhs, rhs) = parse_spec(spec).ok_or_else(|| Error::ShapeMismatch {
            op: format!("einsum {spec:?}"),
            shapes: vec![],
            detail: "the spec needs `->`".into(),
        })?;
        if rhs.len() != 2 {
            return Err(Error::ShapeMismatch {
                op: format!("einsum {spec:?}"),
                shapes: vec![],
                detail: format!("a product takes two operands, the spec names {}", rhs.len()),
            });
        }
        let (ra, rb) = (rhs[0].clone(), rhs[1].clone());
        for g in guards {
            for l in g.letters() {
                let named = [&lhs, &ra, &rb].iter().filter(|s| s.contains(l)).count();
                if named < 2 {
                    return Err(Error::ShapeMismatch {
                        op: format!("einsum {spec:?}"),
                        shapes: vec![a.dims().to_vec(), b.dims().to_vec()],
                        detail: format!(
                            "the guard {g} names {l:?}, which {} of the result and the factors; \
                             a guard letter must name an axis of at least two of them (so the \
                             gradients can be guarded too)",
                            if named == 0 {
                                "is in none"
                            } else {
                                "is in only one"
                            }
                        ),
                    });
                }
            }
        }
        let grad_guards = guards.to_vec();
        Tensor::einsum_op_guarded(
            spec,
            Rhs::Bin(BinOp::Mul),
            &[a, b],
            BinOp::Add,
            true,
            "einsum",
            Some(Arc::new(move |out, g| {
                let (a, b) = (&out.parents()[0], &out.parents()[1]);
                // 16-bit factors: the gradient is cast to their precision and the gradient
                // products accumulate as the forward one does (in the result's precision).
                let half = a.prec() == b.prec() && matches!(a.prec(), Prec::Bf16 | Prec::F16);
                let (g, acc) = if half {
                    (g.cast(a.prec())?, Some(out.prec()))
                } else {
                    (g.clone(), None)
                };
                let ga = contract_into(&lhs, &g, &rb, b, &ra, a.dims(), acc, &grad_guards)?;
                let gb = contract_into(&ra, a, &lhs, &g, &rb, b.dims(), acc, &grad_guards)?;
                Ok(vec![Some(ga), Some(gb)])
            })),
            prec,
            guards,
        )
    }

    /// The same values in precision `prec` (rounded to nearest, ties to even, when narrower);
    /// the gradient is cast back to this tensor's precision. The tensor itself where it is in
    /// `prec` already.
    pub fn cast(&self, prec: Prec) -> Result<Tensor> {
        if prec == self.prec() {
            return Ok(self.clone());
        }
        let l = letters(self.dims().len());
        Tensor::einsum_op_in(
            &format!("{l}->{l}"),
            Rhs::Un(UnOp::Identity),
            &[self],
            BinOp::Arg2,
            false,
            &format!("{}_as_{}", self.label(), prec.name()),
            Some(Arc::new(move |out, g| {
                Ok(vec![Some(g.cast(out.parents()[0].prec())?)])
            })),
            Some(prec),
        )
    }

    /// Matrix product of 2-D tensors (`[m, k] × [k, n] → [m, n]`).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        if self.dims().len() != 2 || other.dims().len() != 2 || self.dims()[1] != other.dims()[0] {
            return Err(Error::ShapeMismatch {
                op: "matmul".into(),
                shapes: vec![self.dims().to_vec(), other.dims().to_vec()],
                detail: format!(
                    "{:?} × {:?}: both must be 2-D and the inner sizes must agree",
                    self.dims(),
                    other.dims()
                ),
            });
        }
        Tensor::einsum("ik,kj->ij", &[self, other])
    }

    /// Sum over `axes` (removed from the shape).
    pub fn sum(&self, axes: &[usize]) -> Result<Tensor> {
        let (all, kept) = reduction_letters("sum", self.dims(), axes)?;
        Tensor::einsum(&format!("{all}->{kept}"), &[self])
    }

    /// Sum of every element (a scalar).
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&(0..self.dims().len()).collect::<Vec<_>>())
    }

    /// Mean over `axes` (removed from the shape).
    pub fn mean(&self, axes: &[usize]) -> Result<Tensor> {
        let n: usize = axes
            .iter()
            .map(|&a| self.dims().get(a).copied().unwrap_or(1))
            .product();
        self.sum(axes)?.scale(1.0 / n.max(1) as f64)
    }

    /// Mean of every element.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&(0..self.dims().len()).collect::<Vec<_>>())
    }

    /// Maximum over `axes` (removed from the shape); the gradient goes to every position that
    /// attains the maximum.
    pub fn max(&self, axes: &[usize]) -> Result<Tensor> {
        let (all, kept) = reduction_letters("max", self.dims(), axes)?;
        let (all2, kept2) = (all.clone(), kept.clone());
        Tensor::einsum_op(
            &format!("{all}->{kept}"),
            Rhs::Un(UnOp::Identity),
            &[self],
            BinOp::Max,
            true,
            "max",
            Some(Arc::new(move |out, g| {
                let a = &out.parents()[0];
                let spec = format!("{all2},{kept2}->{all2}");
                let c = out.detach();
                let mask = Tensor::einsum_op(
                    &spec,
                    Rhs::Bin(BinOp::Cmpeq),
                    &[a, &c],
                    BinOp::Arg2,
                    false,
                    "argmax",
                    None,
                )?;
                let ga = Tensor::einsum_op(
                    &spec,
                    Rhs::Bin(BinOp::Mul),
                    &[&mask, g],
                    BinOp::Arg2,
                    false,
                    "max_grad",
                    None,
                )?;
                Ok(vec![Some(ga)])
            })),
        )
    }

    /// Permutes axes: result axis `k` is input axis `perm[k]`.
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor> {
        let n = self.dims().len();
        if perm.len() != n {
            return Err(Error::ShapeMismatch {
                op: "transpose".into(),
                shapes: vec![self.dims().to_vec()],
                detail: format!("permutation {perm:?} for shape {:?}", self.dims()),
            });
        }
        check_axes("transpose", self.dims(), perm)?;
        let src = letters(n);
        let dst: String = perm.iter().map(|&p| src.as_bytes()[p] as char).collect();
        Tensor::einsum(&format!("{src}->{dst}"), &[self])
    }

    /// The same elements (row-major) in a new shape with the same number of elements.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        let n: usize = self.dims().iter().product();
        if dims.iter().product::<usize>() != n {
            return Err(Error::ShapeMismatch {
                op: "reshape".into(),
                shapes: vec![self.dims().to_vec(), dims.to_vec()],
                detail: format!(
                    "{:?} has {n} elements, {dims:?} has {}",
                    self.dims(),
                    dims.iter().product::<usize>()
                ),
            });
        }
        crate::views::reshape(self, dims)
    }

    /// Elements `start..start + len` along `axis` (PyTorch's `narrow`), as a view: nothing is
    /// copied when the optimizer inlines it. The gradient is zero outside the window.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        let dims = self.dims();
        if axis >= dims.len() || start.checked_add(len).is_none_or(|end| end > dims[axis]) {
            return Err(Error::ShapeMismatch {
                op: "narrow".into(),
                shapes: vec![dims.to_vec()],
                detail: format!(
                    "elements {start}..{} along axis {axis} of shape {dims:?} are out of range",
                    start.saturating_add(len)
                ),
            });
        }
        crate::views::narrow(self, axis, start, len)
    }
}

/// `x` (letters `xs`) broadcast to letters `to` with shape `dims` (letters of `to` missing from
/// `xs` are filled by repetition).
fn broadcast_to(xs: &str, x: &Tensor, to: &str, dims: &[usize]) -> Result<Tensor> {
    Tensor::broadcast_view(x, xs, to, dims)
}

/// `out[P] = Σ x[X] * y[Y]` over the terms where `guards` hold, with shape `dims` for `P`, in
/// precision `prec` (`None`: the factors' promoted); letters of `P` in neither `X` nor `Y`
/// (summed away in the forward pass) are filled by broadcasting. Every guard letter is in `X`
/// or `Y` ([`Tensor::guarded_product_in`] checks it).
#[allow(clippy::too_many_arguments)]
fn contract_into(
    xs: &str,
    x: &Tensor,
    ys: &str,
    y: &Tensor,
    p: &str,
    dims: &[usize],
    prec: Option<Prec>,
    guards: &[EinsumGuard],
) -> Result<Tensor> {
    let present: String = p
        .chars()
        .filter(|c| xs.contains(*c) || ys.contains(*c))
        .collect();
    let partial = Tensor::einsum_op_guarded(
        &format!("{xs},{ys}->{present}"),
        Rhs::Bin(BinOp::Mul),
        &[x, y],
        BinOp::Add,
        true,
        "einsum_grad",
        None,
        prec,
        guards,
    )?;
    if present.len() == p.len() {
        Ok(partial)
    } else {
        broadcast_to(&present, &partial, p, dims)
    }
}
