//! Losses: mean squared error, hinge, softmax cross-entropy (on one-hot targets or on integer
//! ids over any leading axes).

use arrayjit_ir::{Error, Result};

use crate::tensor::Tensor;

fn same_shape(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(Error::ShapeMismatch {
            op: op.into(),
            shapes: vec![a.dims().to_vec(), b.dims().to_vec()],
            detail: format!(
                "predictions {:?} and targets {:?} differ",
                a.dims(),
                b.dims()
            ),
        });
    }
    Ok(())
}

/// Logits minus their row maximum (which is treated as a constant: the softmax does not depend
/// on it), for numerical stability.
fn shifted_logits(logits: &Tensor, with_grad: bool) -> Result<Tensor> {
    let row_max = logits.max(&[1])?.detach();
    let backward: Option<crate::tensor::BackwardFn> = if with_grad {
        Some(std::sync::Arc::new(|_, g| Ok(vec![Some(g.clone()), None])))
    } else {
        None
    };
    Tensor::einsum_op(
        "bk,b->bk",
        crate::tensor::Rhs::Bin(arrayjit_ir::BinOp::Sub),
        &[logits, &row_max],
        arrayjit_ir::BinOp::Arg2,
        false,
        "shifted_logits",
        backward,
    )
}

/// `mean((pred - target)²)`.
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    same_shape("mse", pred, target)?;
    let d = pred.sub(target)?;
    d.mul(&d)?.mean_all()
}

/// `mean(relu(1 - labels · scores))` for labels in `{-1, +1}`.
pub fn hinge(scores: &Tensor, labels: &Tensor) -> Result<Tensor> {
    same_shape("hinge", scores, labels)?;
    labels
        .mul(scores)?
        .neg()?
        .add_scalar(1.0)?
        .relu()?
        .mean_all()
}

/// Mean over the batch of `logsumexp(logits) - Σ one_hot · logits` for logits `[batch,
/// classes]` and one-hot targets of the same shape (computed stably: the row maximum is
/// subtracted first).
pub fn softmax_cross_entropy(logits: &Tensor, one_hot: &Tensor) -> Result<Tensor> {
    same_shape("softmax_cross_entropy", logits, one_hot)?;
    if logits.dims().len() != 2 {
        return Err(Error::ShapeMismatch {
            op: "softmax_cross_entropy".into(),
            shapes: vec![logits.dims().to_vec()],
            detail: format!("logits must be [batch, classes], got {:?}", logits.dims()),
        });
    }
    let shifted = shifted_logits(logits, true)?;
    let lse = shifted.exp()?.sum(&[1])?.log()?;
    let picked = one_hot.mul(&shifted)?.sum(&[1])?;
    lse.sub(&picked)?.mean_all()
}

/// Row-wise softmax of `[batch, classes]` logits.
pub fn softmax(logits: &Tensor) -> Result<Tensor> {
    let e = shifted_logits(logits, false)?.exp()?;
    let total = e.sum(&[1])?;
    Tensor::einsum_op(
        "bk,b->bk",
        crate::tensor::Rhs::Bin(arrayjit_ir::BinOp::Div),
        &[&e, &total],
        arrayjit_ir::BinOp::Arg2,
        false,
        "softmax",
        None,
    )
}

/// Mean over every leading position of `-log softmax(logits)[target]`, for logits
/// `[..., classes]` and integer targets of the leading shape `[...]` (e.g. `[batch, time,
/// vocabulary]` and `[batch, time]`). A target outside `0..classes` contributes no
/// log-probability (its one-hot row is zero); ids set with [`Tensor::ids`] are checked on entry.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let dims = logits.dims();
    let Some((&classes, lead)) = dims.split_last() else {
        return Err(Error::ShapeMismatch {
            op: "cross_entropy".into(),
            shapes: vec![],
            detail: "logits must have a class axis".into(),
        });
    };
    if targets.dims() != lead {
        return Err(Error::ShapeMismatch {
            op: "cross_entropy".into(),
            shapes: vec![lead.to_vec(), targets.dims().to_vec()],
            detail: format!(
                "logits {dims:?} need targets of shape {lead:?}, got {:?}",
                targets.dims()
            ),
        });
    }
    let positions: usize = lead.iter().product();
    let log_p = logits.log_softmax(dims.len() - 1)?;
    let hot = Tensor::one_hot(targets, classes, logits.prec())?;
    log_p
        .mul(&hot)?
        .sum_all()?
        .scale(-1.0 / positions.max(1) as f64)
}
