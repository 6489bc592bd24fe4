//! Optimizers as assignments: SGD (momentum, weight decay) and Adam. Their state (velocities,
//! moments, step count) lives in hosted nodes initialized to zero; the learning rate is a hosted
//! scalar, so it can be changed between steps from the host. State and parameters are updated
//! in place (`m *= β1; m += (1 - β1) g`, then the parameter's step from `m` as updated), so the
//! update needs no arrays of its own: one pass over a parameter's elements updates it and its
//! state. AdamW's decoupled decay multiplies the parameter by `1 - lr λ` before the Adam step,
//! as PyTorch's `AdamW` does.

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, Error, Operand, Prec, Projections, Result, Tnode, UnOp,
};

use crate::autodiff::topological_order;
use crate::tensor::Tensor;

/// An optimizer and its settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// `v = μ v + (g + λ w); w -= lr · v` (plain SGD when `momentum` is 0).
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum μ.
        momentum: f64,
        /// Weight decay λ.
        weight_decay: f64,
    },
    /// Adam with bias correction; weight decay is decoupled (`w -= lr · λ · w`).
    Adam {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator epsilon.
        eps: f64,
        /// Decoupled weight decay λ.
        weight_decay: f64,
    },
}

impl Optimizer {
    /// Adam with the usual defaults and the given learning rate.
    pub fn adam(lr: f64) -> Optimizer {
        Optimizer::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    fn lr(&self) -> f64 {
        match *self {
            Optimizer::Sgd { lr, .. } | Optimizer::Adam { lr, .. } => lr,
        }
    }
}

/// The update step: its assignments and the hosted learning-rate node.
pub struct Update {
    /// Run after backprop, in the same routine.
    pub program: Assignments,
    /// The learning rate; set its value on the host to change it.
    pub lr: Tnode,
    /// The optimizer's state (step count, velocities or moments), hosted: save it with the
    /// parameters to resume training exactly.
    pub state: Vec<Tensor>,
}

fn state(label: &str, like: &Tnode) -> Result<Tensor> {
    Tensor::zeros_input(like.prec(), like.dims(), label)
}

fn pointwise(dst: &Tnode, accum: BinOp, src: &Tensor) -> Result<Assignments> {
    if dst.dims() != src.dims() {
        return Err(Error::ShapeMismatch {
            op: "optimizer update".into(),
            shapes: vec![dst.dims().to_vec(), src.dims().to_vec()],
            detail: format!(
                "{} is {:?} but its update is {:?}",
                dst.debug_name(),
                dst.dims(),
                src.dims()
            ),
        });
    }
    Ok(Assignments::Accum {
        initialize_neutral: false,
        accum,
        lhs: dst.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(src.node().clone())),
        projections: Projections::pointwise(dst.dims(), 1),
    })
}

/// The update program for `params`, whose gradients were built by
/// [`crate::autodiff::grad_program`].
pub fn update_program(opt: &Optimizer, params: &[Tensor]) -> Result<Update> {
    update_program_clipped(opt, params, None)
}

/// Like [`update_program`], with the gradients first scaled down, when `max_norm` is given, so
/// that their global L2 norm (over every parameter) is at most `max_norm`:
/// `g · min(1, max_norm / (‖g‖ + 1e-6))`.
pub fn update_program_clipped(
    opt: &Optimizer,
    params: &[Tensor],
    max_norm: Option<f64>,
) -> Result<Update> {
    if let Some(m) = max_norm
        && !(m > 0.0 && m.is_finite())
    {
        return Err(Error::BadValue {
            what: "gradient clipping norm".into(),
            value: m.to_string(),
            expected: "a positive finite number".into(),
        });
    }
    let lr = Tensor::input(Prec::F32, &[], "learning_rate", &[opt.lr()])?;
    let mut state_tensors: Vec<Tensor> = Vec::new();
    // The program runs in four parts: values computed from the gradients alone (`first`); the
    // state's updates, in place (`m *= β1; m += (1 - β1) g`: each statement reads and writes
    // the same element); the parameters' steps, computed from the state as updated (`steps`);
    // the parameters' updates, in place. No value computed from the state is read after the
    // state changes, so none needs an array of its own: the optimizer computes each inside
    // the loop that uses it, and one pass over a parameter's elements updates it and its state.
    let mut first: Vec<Tensor> = Vec::new();
    let mut state_writes: Vec<Assignments> = Vec::new();
    let mut steps: Vec<Tensor> = Vec::new();
    let mut param_writes: Vec<Assignments> = Vec::new();
    let step_count = match opt {
        Optimizer::Adam { .. } => {
            let t = Tensor::input(Prec::F32, &[], "adam_step", &[0.0])?;
            state_tensors.push(t.clone());
            let one = Tensor::scalar(1.0)?;
            state_writes.push(pointwise(t.node(), BinOp::Add, &one)?);
            first.push(one);
            // Read by the steps, after its update: the step count including this step.
            Some(t)
        }
        Optimizer::Sgd { .. } => None,
    };
    let grads = params
        .iter()
        .map(|p| {
            p.grad()
                .map(Tensor::from_node)
                .ok_or_else(|| Error::NoGradient {
                    node: p.node().debug_name(),
                    detail: "build the gradient program first".into(),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let clip = match max_norm {
        Some(max_norm) => {
            let mut total = Tensor::scalar(0.0)?;
            for g in &grads {
                total = total.add(&g.mul(g)?.sum_all()?)?;
            }
            let norm = total.sqrt()?.add_scalar(1e-6)?;
            let ratio = Tensor::scalar(max_norm)?.div(&norm)?;
            Some(ratio.minimum(&Tensor::scalar(1.0)?)?)
        }
        None => None,
    };
    // Adam's scalars, shared by every parameter: the bias corrections of step t (read after
    // t's update) and the decoupled decay's factor.
    let adam_scalars = match (*opt, &step_count) {
        (
            Optimizer::Adam {
                beta1,
                beta2,
                weight_decay,
                ..
            },
            Some(t),
        ) => {
            let bias1 = Tensor::scalar(1.0)?.sub(&Tensor::scalar(beta1)?.pow(t)?)?;
            let bias2 = Tensor::scalar(1.0)?.sub(&Tensor::scalar(beta2)?.pow(t)?)?;
            let keep = (weight_decay != 0.0)
                .then(|| Tensor::scalar(1.0)?.sub(&lr.scale(weight_decay)?))
                .transpose()?;
            Some((bias1, bias2, keep))
        }
        _ => None,
    };
    for (p, g) in params.iter().zip(grads) {
        // The clipped gradient, a node of its own for each use, so that each is read once per
        // element and computed where it is used (one node read three times would be kept in
        // an array the size of the parameter).
        let clipped = || match &clip {
            Some(scale) => g.mul(scale),
            None => Ok(g.clone()),
        };
        let w = p.detach();
        let (prec, dims) = (p.node().prec(), p.node().dims().to_vec());
        // `dst *= k` for a constant `k`, in place (the constant is computed in `first`).
        let scale_in_place =
            |dst: &Tensor, k: f64, first: &mut Vec<Tensor>| -> Result<Assignments> {
                let k = Tensor::full(prec, &dims, k)?;
                let write = pointwise(dst.node(), BinOp::Mul, &k)?;
                first.push(k);
                Ok(write)
            };
        match *opt {
            Optimizer::Sgd {
                momentum,
                weight_decay,
                ..
            } => {
                let g = if weight_decay != 0.0 {
                    clipped()?.add(&w.scale(weight_decay)?)?
                } else {
                    clipped()?
                };
                let step = if momentum != 0.0 {
                    let v = state(&format!("velocity_{}", p.label()), p.node())?;
                    state_tensors.push(v.clone());
                    // v = μ v + g, in place; the step reads v as updated.
                    state_writes.push(scale_in_place(&v, momentum, &mut first)?);
                    state_writes.push(pointwise(v.node(), BinOp::Add, &g)?);
                    first.push(g);
                    lr.mul(&v)?
                } else {
                    lr.mul(&g)?
                };
                param_writes.push(pointwise(p.node(), BinOp::Sub, &step)?);
                steps.push(step);
            }
            Optimizer::Adam {
                beta1, beta2, eps, ..
            } => {
                let (bias1, bias2, keep) = adam_scalars.as_ref().expect("Adam has its scalars");
                let m = state(&format!("adam_m_{}", p.label()), p.node())?;
                let v = state(&format!("adam_v_{}", p.label()), p.node())?;
                state_tensors.push(m.clone());
                state_tensors.push(v.clone());
                // m = β1 m + (1 - β1) g and v = β2 v + (1 - β2) g², in place.
                let m_add = clipped()?.scale(1.0 - beta1)?;
                let v_add = clipped()?.mul(&clipped()?)?.scale(1.0 - beta2)?;
                state_writes.push(scale_in_place(&m, beta1, &mut first)?);
                state_writes.push(pointwise(m.node(), BinOp::Add, &m_add)?);
                state_writes.push(scale_in_place(&v, beta2, &mut first)?);
                state_writes.push(pointwise(v.node(), BinOp::Add, &v_add)?);
                first.push(m_add);
                first.push(v_add);
                let m_hat = m.div(bias1)?;
                let v_hat = v.div(bias2)?;
                let adam = lr.mul(&m_hat.div(&v_hat.sqrt()?.add_scalar(eps)?)?)?;
                if let Some(keep) = keep {
                    // Decoupled decay, w -= lr λ w, as w *= 1 - lr λ before the Adam step.
                    let keep = Tensor::full(prec, &dims, 1.0)?.mul(keep)?;
                    param_writes.push(pointwise(p.node(), BinOp::Mul, &keep)?);
                    steps.push(keep);
                }
                param_writes.push(pointwise(p.node(), BinOp::Sub, &adam)?);
                steps.push(adam);
            }
        }
    }
    let computations = |tensors: &[Tensor], skip: &std::collections::BTreeSet<usize>| {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        topological_order(&refs)
            .into_iter()
            .filter(|t| t.kind() == crate::tensor::Kind::Computed && !skip.contains(&t.node().id()))
            .collect::<Vec<_>>()
    };
    let before = computations(&first, &Default::default());
    let done = before.iter().map(|t| t.node().id()).collect();
    let after = computations(&steps, &done);
    let forward = |ts: Vec<Tensor>| {
        ts.into_iter()
            .map(|t| t.0.forward.clone())
            .filter(|a| *a != Assignments::Noop)
    };
    let mut stmts: Vec<Assignments> = forward(before).collect();
    stmts.extend(state_writes);
    stmts.extend(forward(after));
    stmts.extend(param_writes);
    Ok(Update {
        program: Assignments::Seq(stmts),
        lr: lr.node().clone(),
        state: state_tensors,
    })
}
