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
    // The program runs in parts: values computed from the gradients alone (`first`); the
    // step count's update and the scalars read after it (Adam's bias corrections); then, for
    // each parameter in turn, its state's updates, in place (`m *= β1; m += (1 - β1) g`: each
    // statement reads and writes the same element), its step, computed from the state as
    // updated, and its update, in place. No value computed from the state is read after the
    // state changes, so none needs an array of its own: the optimizer computes each inside
    // the loop that uses it. A parameter's statements are next to each other and run over the
    // same elements, so the optimizer fuses them into one pass that reads the gradient, the
    // state and the parameter once (with every state update first and every parameter update
    // after, the state was read twice: 9 accesses an element instead of 7).
    let mut first: Vec<Tensor> = Vec::new();
    let mut counter_writes: Vec<Assignments> = Vec::new();
    // Per parameter: its state's writes, its steps and its own writes.
    let mut per_param: Vec<(Vec<Assignments>, Vec<Tensor>, Vec<Assignments>)> = Vec::new();
    let step_count = match opt {
        Optimizer::Adam { .. } => {
            let t = Tensor::input(Prec::F32, &[], "adam_step", &[0.0])?;
            state_tensors.push(t.clone());
            let one = Tensor::scalar(1.0)?;
            counter_writes.push(pointwise(t.node(), BinOp::Add, &one)?);
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
        let mut state_writes: Vec<Assignments> = Vec::new();
        let mut steps: Vec<Tensor> = Vec::new();
        let mut param_writes: Vec<Assignments> = Vec::new();
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
        per_param.push((state_writes, steps, param_writes));
    }
    let computations = |tensors: &[Tensor], skip: &std::collections::BTreeSet<usize>| {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        topological_order(&refs)
            .into_iter()
            .filter(|t| t.kind() == crate::tensor::Kind::Computed && !skip.contains(&t.node().id()))
            .collect::<Vec<_>>()
    };
    let forward = |ts: Vec<Tensor>| {
        ts.into_iter()
            .map(|t| t.0.forward.clone())
            .filter(|a| *a != Assignments::Noop)
    };
    let before = computations(&first, &Default::default());
    let mut done: std::collections::BTreeSet<usize> =
        before.iter().map(|t| t.node().id()).collect();
    let mut stmts: Vec<Assignments> = forward(before).collect();
    stmts.extend(counter_writes);
    // The scalars every parameter's step reads, computed once after the step count's update and
    // before any parameter's statements, so that none sits between a parameter's state writes
    // and its own (where it would keep them from fusing).
    if let Some((bias1, bias2, keep)) = &adam_scalars {
        let mut shared = vec![bias1.clone(), bias2.clone()];
        shared.extend(keep.iter().cloned());
        let scalars = computations(&shared, &done);
        done.extend(scalars.iter().map(|t| t.node().id()));
        stmts.extend(forward(scalars));
    }
    for (state_writes, steps, param_writes) in per_param {
        stmts.extend(state_writes);
        let after = computations(&steps, &done);
        done.extend(after.iter().map(|t| t.node().id()));
        stmts.extend(forward(after));
        stmts.extend(param_writes);
    }
    Ok(Update {
        program: Assignments::Seq(stmts),
        lr: lr.node().clone(),
        state: state_tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::grad_program;
    use crate::init::Init;
    use arrayjit_ir::InterpEnv;

    /// The node each top-level statement of an update program writes, in order.
    fn written(program: &Assignments) -> Vec<Tnode> {
        let Assignments::Seq(stmts) = program else {
            panic!("an update program is a sequence");
        };
        stmts
            .iter()
            .filter_map(|s| match s {
                Assignments::Accum { lhs, .. } => Some(lhs.clone()),
                _ => None,
            })
            .collect()
    }

    /// Each parameter's moments and its own update are next to each other (so one pass over
    /// its elements does all three), and one AdamW step with clipping gives the hand-computed
    /// values.
    #[test]
    fn adamw_updates_each_parameter_with_its_state_in_one_run_of_statements() {
        let a = Tensor::param_with_prec("a", Prec::F32, &[2], Init::Constant(1.0), 0, 0).unwrap();
        let b = Tensor::param_with_prec("b", Prec::F32, &[3], Init::Constant(2.0), 0, 1).unwrap();
        // loss = 3 Σa + Σb²: the gradients are 3 (each of a) and 4 (each of b).
        let loss = a
            .sum_all()
            .unwrap()
            .scale(3.0)
            .unwrap()
            .add(&b.mul(&b).unwrap().sum_all().unwrap())
            .unwrap();
        let grads = grad_program(&loss).unwrap();
        let opt = Optimizer::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.5,
        };
        let update = update_program_clipped(&opt, &[a.clone(), b.clone()], Some(1.0)).unwrap();
        let order = written(&update.program);
        let label = |t: &Tnode| t.debug_name();
        let position = |name: &str| {
            order
                .iter()
                .position(|t| label(t).contains(name))
                .unwrap_or_else(|| panic!("nothing writes {name}"))
        };
        let last = |name: &str| {
            order
                .iter()
                .rposition(|t| label(t).contains(name))
                .unwrap_or_else(|| panic!("nothing writes {name}"))
        };
        // a's state and a, then b's state and b.
        assert!(position("adam_m_a") < last("adam_v_a"));
        assert!(last("adam_v_a") < position(a.node().debug_name().as_str()));
        assert!(last(a.node().debug_name().as_str()) < position("adam_m_b"));
        assert!(last("adam_v_b") < position(b.node().debug_name().as_str()));

        let program = grads.program.clone().then(update.program);
        let code = program.lower(&[]).unwrap();
        let mut env = InterpEnv::from_host_arrays(&code);
        env.run(&code, &[]).unwrap();
        // ‖g‖ = √(2·9 + 3·16) = √66; clipped g = g / (√66 + 1e-6). After one step the bias-
        // corrected moments are ĝ and ĝ², so Adam's step is lr · ĝ / (|ĝ| + eps) ≈ lr, and
        // the decay multiplies first by 1 - lr·λ = 0.95.
        let scale = 1.0 / (66f64.sqrt() + 1e-6);
        let step = |g: f64| {
            let g = g * scale;
            0.1 * g / ((g * g).sqrt() + 1e-8)
        };
        let want_a = 1.0 * 0.95 - step(3.0);
        let want_b = 2.0 * 0.95 - step(4.0);
        for (t, want) in [(&a, want_a), (&b, want_b)] {
            for got in env.array(t.node()).unwrap().to_vec_f64().unwrap() {
                assert!(
                    (got - want).abs() < 1e-5,
                    "{}: {got} != {want}",
                    label(t.node())
                );
            }
        }
    }
}
