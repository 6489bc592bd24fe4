//! Optimizers as assignments: SGD (momentum, weight decay) and Adam. Their state (velocities,
//! moments, step count) lives in hosted nodes initialized to zero; the learning rate is a hosted
//! scalar, so it can be changed between steps from the host.

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
    let mut computed: Vec<Tensor> = Vec::new();
    let mut writes: Vec<Assignments> = Vec::new();
    let step_count = match opt {
        Optimizer::Adam { .. } => {
            let t = Tensor::input(Prec::F32, &[], "adam_step", &[0.0])?;
            state_tensors.push(t.clone());
            let t_next = t.add_scalar(1.0)?;
            writes.push(pointwise(t.node(), BinOp::Arg2, &t_next)?);
            computed.push(t_next.clone());
            Some(t_next)
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
    for (p, g) in params.iter().zip(grads) {
        let g = match &clip {
            Some(scale) => g.mul(scale)?,
            None => g,
        };
        let w = p.detach();
        let step = match *opt {
            Optimizer::Sgd {
                momentum,
                weight_decay,
                ..
            } => {
                let g = if weight_decay != 0.0 {
                    g.add(&w.scale(weight_decay)?)?
                } else {
                    g
                };
                if momentum != 0.0 {
                    let v = state(&format!("velocity_{}", p.label()), p.node())?;
                    state_tensors.push(v.clone());
                    let v_next = v.scale(momentum)?.add(&g)?;
                    writes.push(pointwise(v.node(), BinOp::Arg2, &v_next)?);
                    computed.push(v_next.clone());
                    lr.mul(&v_next)?
                } else {
                    lr.mul(&g)?
                }
            }
            Optimizer::Adam {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => {
                let t = step_count.as_ref().expect("Adam has a step count");
                let m = state(&format!("adam_m_{}", p.label()), p.node())?;
                let v = state(&format!("adam_v_{}", p.label()), p.node())?;
                state_tensors.push(m.clone());
                state_tensors.push(v.clone());
                let m_next = m.scale(beta1)?.add(&g.scale(1.0 - beta1)?)?;
                let v_next = v.scale(beta2)?.add(&g.mul(&g)?.scale(1.0 - beta2)?)?;
                writes.push(pointwise(m.node(), BinOp::Arg2, &m_next)?);
                writes.push(pointwise(v.node(), BinOp::Arg2, &v_next)?);
                computed.push(m_next.clone());
                computed.push(v_next.clone());
                let bias1 = Tensor::scalar(1.0)?.sub(&Tensor::scalar(beta1)?.pow(t)?)?;
                let bias2 = Tensor::scalar(1.0)?.sub(&Tensor::scalar(beta2)?.pow(t)?)?;
                let m_hat = m_next.div(&bias1)?;
                let v_hat = v_next.div(&bias2)?;
                let adam = lr.mul(&m_hat.div(&v_hat.sqrt()?.add_scalar(eps)?)?)?;
                if weight_decay != 0.0 {
                    adam.add(&lr.mul(&w.scale(weight_decay)?)?)?
                } else {
                    adam
                }
            }
        };
        computed.push(step.clone());
        writes.push(pointwise(p.node(), BinOp::Sub, &step)?);
    }
    // Compute every new value first, then write state and parameters.
    let refs: Vec<&Tensor> = computed.iter().collect();
    let mut stmts: Vec<Assignments> = topological_order(&refs)
        .into_iter()
        .filter(|t| t.kind() == crate::tensor::Kind::Computed)
        .map(|t| t.0.forward.clone())
        .filter(|a| *a != Assignments::Noop)
        .collect();
    stmts.extend(writes);
    Ok(Update {
        program: Assignments::Seq(stmts),
        lr: lr.node().clone(),
        state: state_tensors,
    })
}
