//! Reverse-mode automatic differentiation: builds the forward program of a graph and the
//! backprop program that fills gradient nodes, as assignments.

use std::collections::{HashMap, HashSet};

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, Error, FetchOp, Operand, Projections, Result, Tnode, UnOp,
};

use crate::tensor::Tensor;

/// The tensors `outputs` depend on, parents before children, each once.
pub fn topological_order(outputs: &[&Tensor]) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Tensor, bool)> = outputs
        .iter()
        .rev()
        .map(|t| ((*t).clone(), false))
        .collect();
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.0.id) {
            continue;
        }
        stack.push((t.clone(), true));
        for p in t.parents().iter().rev() {
            if !seen.contains(&p.0.id) {
                stack.push((p.clone(), false));
            }
        }
    }
    order
}

/// Appends the forward assignments of the tensors in `order` not yet `emitted`.
fn emit(order: &[Tensor], emitted: &mut HashSet<usize>, out: &mut Vec<Assignments>) {
    for t in order {
        if emitted.insert(t.0.id) && t.0.forward != Assignments::Noop {
            out.push(t.0.forward.clone());
        }
    }
}

/// The assignments computing `outputs` (and everything they depend on), in order.
pub fn forward_program(outputs: &[&Tensor]) -> Assignments {
    let mut out = Vec::new();
    emit(&topological_order(outputs), &mut HashSet::new(), &mut out);
    Assignments::Seq(out)
}

/// A forward + backward program and the parameters whose gradients it computes.
pub struct GradProgram {
    /// Forward, then backprop.
    pub program: Assignments,
    /// The parameters reached from the loss; each has its gradient node set.
    pub params: Vec<Tensor>,
}

/// `grad[P] += contribution[C]`, summing over the contribution's extra and broadcast axes
/// (shapes aligned on their last axes). The first contribution to a gradient (`first`) starts
/// from zero instead of adding to the gradient's old value, so no gradient is zero-filled
/// before it is written.
fn accumulate_into(grad: &arrayjit_ir::Tnode, c: &Tensor, first: bool) -> Result<Assignments> {
    let (rp, rc) = (grad.dims().len(), c.dims().len());
    if rp > rc {
        return Err(Error::ShapeMismatch {
            op: "backprop".into(),
            shapes: vec![c.dims().to_vec(), grad.dims().to_vec()],
            detail: format!(
                "a gradient contribution of shape {:?} cannot flow into {} of shape {:?}",
                c.dims(),
                grad.debug_name(),
                grad.dims()
            ),
        });
    }
    let letters: String = (0..rc).map(|i| (b'a' + i as u8) as char).collect();
    let spec = format!("{letters}->{}", &letters[rc - rp..]);
    Ok(Assignments::Accum {
        initialize_neutral: first,
        accum: BinOp::Add,
        lhs: grad.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(c.node().clone())),
        projections: Projections::einsum_reduce_into(&spec, grad.dims(), &[c.dims()])?,
    })
}

/// Whether contribution `c` may become the gradient of `p` itself, written in place by the pass
/// that computes it, instead of being copied into a gradient node of `p`'s own: it is a pass's
/// own output that no loop would inline into the copy (a tensor computed by an attention pass,
/// or written by another tensor's pass, as the attention backward's key and value gradients
/// are), of `p`'s shape and precision, made by a backward closure (not a node of the forward
/// graph, nor a gradient, nor already some other tensor's gradient: `taken`).
fn may_become_gradient(p: &Tensor, c: &Tensor, taken: &HashSet<usize>) -> bool {
    c.kind() == crate::tensor::Kind::Computed
        && matches!(c.0.forward, Assignments::Noop | Assignments::Attention(_))
        && c.dims() == p.dims()
        && c.prec() == p.prec()
        && !taken.contains(&c.node().id())
}

/// The forward program of `loss` followed by backprop filling the gradient node of every tensor
/// between the parameters and the loss (the loss's gradient is 1 everywhere, i.e. a non-scalar
/// loss is summed).
///
/// A tensor whose gradient has one contribution, computed by a pass of its own (a custom
/// operation's gradient output, see `may_become_gradient`), takes that pass's output node as its
/// gradient: the pass writes it in place, where a copy into a separate gradient node would
/// read and write the whole array again and hold both (the fused attention's three gradients:
/// 36 MiB copied per pass at batch 4, 12 heads of 64, T = 1024; without the copies the
/// attention bench peaks 14% lower).
pub fn grad_program(loss: &Tensor) -> Result<GradProgram> {
    if !loss.requires_grad() {
        return Err(Error::NoGradient {
            node: loss.node().debug_name(),
            detail: "it does not depend on any parameter".into(),
        });
    }
    let order = topological_order(&[loss]);
    let mut stmts = Vec::new();
    let mut emitted = HashSet::new();
    emit(&order, &mut emitted, &mut stmts);
    // Nodes no contribution may take over as a gradient: the forward graph's and every
    // gradient's (the gradients that exist already, and each one as it is made or taken over).
    let mut taken: HashSet<usize> = order.iter().map(|t| t.node().id()).collect();
    taken.extend(order.iter().filter_map(|t| t.grad().map(Tnode::id)));
    // The contributions to each gradient, gathered first (children come before their parents
    // in reverse order, so a tensor's contributions are all known when its turn comes): a
    // gradient's first contribution writes it, later ones add to it, and only gradients with
    // none are zero-filled.
    let mut backprop: Vec<(Tensor, Tensor, bool)> = Vec::new();
    let mut received: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut became: HashSet<usize> = HashSet::new();
    for t in order.iter().rev() {
        if t.requires_grad()
            && t.0.id != loss.0.id
            && t.grad().is_none()
            && let Some([only]) = received.get(&t.0.id).map(Vec::as_slice)
        {
            let c = &backprop[*only].1;
            if may_become_gradient(t, c, &taken) && t.0.grad.set(c.node().clone()).is_ok() {
                became.insert(*only);
            }
        }
        if let Some(g) = t.grad() {
            taken.insert(g.id());
        }
        let Some(backward) = &t.0.backward else {
            continue;
        };
        let g = Tensor::from_node(t.grad_or_create()?);
        taken.insert(g.node().id());
        let contributions = backward(t, &g)?;
        for (p, c) in t.parents().iter().zip(contributions) {
            let Some(c) = c else { continue };
            if !p.requires_grad() {
                continue;
            }
            // The loss's own gradient is the seed; a contribution to it (a loss that feeds
            // itself cannot happen in a DAG) would add to the seed.
            let first = p.0.id != loss.0.id && !received.contains_key(&p.0.id);
            received.entry(p.0.id).or_default().push(backprop.len());
            backprop.push((p.clone(), c, first));
        }
    }
    for t in order.iter().filter(|t| t.requires_grad()) {
        let g = t.grad_or_create()?;
        let fill = if t.0.id == loss.0.id {
            Some(1.0)
        } else {
            (!received.contains_key(&t.0.id)).then_some(0.0)
        };
        if let Some(v) = fill {
            stmts.push(Assignments::Fetch {
                array: g.clone(),
                op: FetchOp::Constant(v),
            });
        }
    }
    for (i, (p, c, first)) in backprop.into_iter().enumerate() {
        emit(&topological_order(&[&c]), &mut emitted, &mut stmts);
        if !became.contains(&i) {
            stmts.push(accumulate_into(p.grad_or_create()?, &c, first)?);
        }
    }
    let params = order
        .iter()
        .filter(|t| t.kind() == crate::tensor::Kind::Parameter)
        .cloned()
        .collect();
    Ok(GradProgram {
        program: Assignments::Seq(stmts),
        params,
    })
}
