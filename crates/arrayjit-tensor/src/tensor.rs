//! Tensors: a value node, the assignment that computes it from its parents, and how gradients
//! flow back through it. Every operation is an einsum-like accumulation, so broadcasting,
//! contractions and reductions share one mechanism.
//!
//! Broadcasting follows NumPy: shapes are aligned on their last axes; an axis of size 1, or a
//! missing leading axis, stretches to the other operand's size.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, EinsumGuard, Error, FetchOp, MemoryMode, MemoryType, Operand,
    Prec, Projections, Result, StaticSymbol, TernOp, Tnode, UnOp,
};

use crate::init::Init;

/// How a tensor's gradient contributes to its parents' gradients: given the tensor and its
/// gradient, one optional contribution per parent (in the tensor's or the parent's shape;
/// contributions are summed over broadcast axes into the parent's gradient).
pub type BackwardFn = Arc<dyn Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// What a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A trainable parameter: hosted, gets a gradient.
    Parameter,
    /// Data set on the host.
    Input,
    /// Computed from other tensors.
    Computed,
}

pub(crate) struct Inner {
    pub id: usize,
    pub value: Tnode,
    pub forward: Assignments,
    pub parents: Vec<Tensor>,
    pub backward: Option<BackwardFn>,
    pub requires_grad: bool,
    pub kind: Kind,
    pub grad: OnceLock<Tnode>,
}

impl Drop for Inner {
    /// Drops the graph above this tensor without recursion: a chain of a million tensors would
    /// otherwise drop each parent inside its child's drop and overflow the stack. Parents whose
    /// last reference this was are taken apart here, in a loop.
    fn drop(&mut self) {
        let mut pending = std::mem::take(&mut self.parents);
        while let Some(tensor) = pending.pop() {
            if let Some(mut inner) = Arc::into_inner(tensor.0) {
                pending.append(&mut inner.parents);
            }
        }
    }
}

/// A tensor of the front end. Cloning is cheap and refers to the same tensor.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {:?})", self.0.value.debug_name(), self.dims())
    }
}

fn next_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// `n` distinct einsum letters starting at letter `from`, or a shape error for `op` when the
/// rank needs more letters than there are.
pub(crate) fn einsum_letters(from: usize, n: usize, op: &str) -> Result<String> {
    if from + n > LETTERS.len() {
        return Err(Error::ShapeMismatch {
            op: op.into(),
            shapes: vec![],
            detail: format!(
                "tensors of rank {} are not supported (at most {})",
                from + n,
                LETTERS.len()
            ),
        });
    }
    Ok(LETTERS[from..from + n].iter().map(|&c| c as char).collect())
}

/// Einsum letters for a rank, right-aligned to the `total` letters of a broadcast result.
fn aligned_letters(rank: usize, total: usize) -> Result<String> {
    // Callers pass the broadcast rank as `total`, which is never below an operand's rank.
    einsum_letters(total.saturating_sub(rank), rank, "broadcast")
}

/// The broadcast shape of two shapes, or a shape error naming both and the op.
pub fn broadcast_dims(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for k in 0..r {
        let da = if k + a.len() >= r {
            a[k + a.len() - r]
        } else {
            1
        };
        let db = if k + b.len() >= r {
            b[k + b.len() - r]
        } else {
            1
        };
        out[k] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op: op.to_string(),
                    shapes: vec![a.to_vec(), b.to_vec()],
                    detail: format!(
                        "shapes {a:?} and {b:?} do not broadcast (axis {k}: {da} vs {db})"
                    ),
                });
            }
        };
    }
    Ok(out)
}

/// The right-hand side of an einsum operation.
#[derive(Clone, Copy, Debug)]
pub enum Rhs {
    /// `op(x)` of one input.
    Un(UnOp),
    /// `op(x, y)` of two inputs.
    Bin(BinOp),
    /// `op(x, y, z)` of three inputs.
    Tern(TernOp),
}

impl Tensor {
    fn leaf(value: Tnode, kind: Kind, requires_grad: bool, forward: Assignments) -> Tensor {
        Tensor(Arc::new(Inner {
            id: next_id(),
            value,
            forward,
            parents: vec![],
            backward: None,
            requires_grad,
            kind,
            grad: OnceLock::new(),
        }))
    }

    /// Data set on the host (hosted, no gradient).
    pub fn input(prec: Prec, dims: &[usize], label: &str, values: &[f64]) -> Result<Tensor> {
        let tn = Tnode::new(prec, dims, &[label])?;
        tn.host().set_values(values)?;
        Ok(Tensor::leaf(tn, Kind::Input, false, Assignments::Noop))
    }

    /// Data on the host, all zeros (hosted, no gradient); filled in place, without a vector
    /// of values.
    pub fn zeros_input(prec: Prec, dims: &[usize], label: &str) -> Result<Tensor> {
        let tn = Tnode::new(prec, dims, &[label])?;
        // A new node's host array is made zero-filled (by the allocator, page by page as it is
        // touched); no device copy exists yet to tell.
        tn.host().with_mut(|_| Ok(()))?;
        Ok(Tensor::leaf(tn, Kind::Input, false, Assignments::Noop))
    }

    /// A trainable parameter initialized on the host by `init` (drawn from the counter-based
    /// RNG with `seed`; `stream` separates parameters).
    pub fn param(
        label: &str,
        dims: &[usize],
        init: Init,
        seed: u64,
        stream: u32,
    ) -> Result<Tensor> {
        Tensor::param_with_prec(label, Prec::F32, dims, init, seed, stream)
    }

    /// Like [`Tensor::param`] with an explicit precision.
    pub fn param_with_prec(
        label: &str,
        prec: Prec,
        dims: &[usize],
        init: Init,
        seed: u64,
        stream: u32,
    ) -> Result<Tensor> {
        let p = Tensor::param_undrawn(label, prec, dims)?;
        p.node()
            .host()
            .fill(|start, out| init.fill(dims, seed, stream, start, out))?;
        Ok(p)
    }

    /// A trainable parameter whose host array holds zeros: its values are drawn later
    /// ([`PendingDraws`](crate::init::PendingDraws)). The zeros cost no memory until written.
    pub(crate) fn param_undrawn(label: &str, prec: Prec, dims: &[usize]) -> Result<Tensor> {
        let tn = Tnode::new(prec, dims, &[label])?;
        tn.update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "tensor: a parameter, changed by training and read on the host",
        )?;
        // The host array exists from the start, whenever its values come.
        tn.host().with_mut(|_| Ok(()))?;
        Ok(Tensor::leaf(tn, Kind::Parameter, true, Assignments::Noop))
    }

    /// A tensor of the given shape filled with `value` (computed in code, usually inlined).
    pub fn full(prec: Prec, dims: &[usize], value: f64) -> Result<Tensor> {
        let tn = Tnode::new(prec, dims, &[&format!("{value}")])?;
        let forward = Assignments::Fetch {
            array: tn.clone(),
            op: FetchOp::Constant(value),
        };
        Ok(Tensor::leaf(tn, Kind::Computed, false, forward))
    }

    /// A scalar constant.
    pub fn scalar(value: f64) -> Result<Tensor> {
        Tensor::full(Prec::F32, &[], value)
    }

    /// Wraps an existing node as a leaf without gradient (e.g. a gradient node, or state).
    pub fn from_node(tn: &Tnode) -> Tensor {
        Tensor::leaf(tn.clone(), Kind::Input, false, Assignments::Noop)
    }

    /// Slice `batch` of `data` along its first axis (the batch index is bound per run).
    pub fn slice(data: &Tensor, batch: &StaticSymbol) -> Result<Tensor> {
        let dims = data.dims();
        if dims.is_empty() || dims[0] != batch.range {
            return Err(Error::ShapeMismatch {
                op: "slice".into(),
                shapes: vec![dims.to_vec()],
                detail: format!(
                    "slicing {:?} by a batch index with range {}: the first axis must have that size",
                    dims, batch.range
                ),
            });
        }
        let tn = Tnode::new(
            data.prec(),
            &dims[1..],
            &[&format!("{}_batch", data.label())],
        )?;
        let forward = Assignments::Fetch {
            array: tn.clone(),
            op: FetchOp::Slice {
                batch: batch.clone(),
                sliced: data.node().clone(),
            },
        };
        Ok(Tensor(Arc::new(Inner {
            id: next_id(),
            value: tn,
            forward,
            parents: vec![data.clone()],
            backward: None,
            requires_grad: false,
            kind: Kind::Computed,
            grad: OnceLock::new(),
        })))
    }

    /// A computed tensor with its own forward assignments (for operations that are not a single
    /// einsum).
    pub(crate) fn custom(
        value: Tnode,
        forward: Assignments,
        parents: Vec<Tensor>,
        backward: Option<BackwardFn>,
    ) -> Tensor {
        let requires_grad = backward.is_some() && parents.iter().any(|t| t.requires_grad());
        Tensor(Arc::new(Inner {
            id: next_id(),
            value,
            forward,
            parents,
            backward: if requires_grad { backward } else { None },
            requires_grad,
            kind: Kind::Computed,
            grad: OnceLock::new(),
        }))
    }

    /// The value node.
    pub fn node(&self) -> &Tnode {
        &self.0.value
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        self.0.value.dims()
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        self.0.value.prec()
    }

    /// The last part of the label.
    pub fn label(&self) -> String {
        self.0.value.label().last().cloned().unwrap_or_default()
    }

    /// What the tensor is.
    pub fn kind(&self) -> Kind {
        self.0.kind
    }

    /// Whether gradients flow into this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// The tensors this one is computed from.
    pub fn parents(&self) -> &[Tensor] {
        &self.0.parents
    }

    /// The gradient node, once a gradient program has been built for a loss depending on it.
    pub fn grad(&self) -> Option<&Tnode> {
        self.0.grad.get()
    }

    pub(crate) fn grad_or_create(&self) -> Result<&Tnode> {
        if let Some(g) = self.0.grad.get() {
            return Ok(g);
        }
        let g = Tnode::new(self.prec(), self.dims(), &["grad", &self.label()])?;
        Ok(self.0.grad.get_or_init(|| g))
    }

    /// The values on the host (the runtime brings them up to date first).
    pub fn values(&self) -> Result<Vec<f64>> {
        self.0.value.host().get_values()
    }

    /// The same values without gradient flow.
    pub fn detach(&self) -> Tensor {
        Tensor(Arc::new(Inner {
            id: next_id(),
            value: self.0.value.clone(),
            forward: Assignments::Noop,
            parents: vec![self.clone()],
            backward: None,
            requires_grad: false,
            kind: Kind::Computed,
            grad: OnceLock::new(),
        }))
    }

    /// The general operation: `out[C] = accum(out[C], rhs(inputs[A], ...))` for an einsum-like
    /// spec `"A,B->C"`; output dims come from the inputs (size-1 axes broadcast).
    pub fn einsum_op(
        spec: &str,
        rhs: Rhs,
        inputs: &[&Tensor],
        accum: BinOp,
        initialize_neutral: bool,
        label: &str,
        backward: Option<BackwardFn>,
    ) -> Result<Tensor> {
        Tensor::einsum_op_in(
            spec,
            rhs,
            inputs,
            accum,
            initialize_neutral,
            label,
            backward,
            None,
        )
    }

    /// [`Tensor::einsum_op`] with the result in precision `prec` (`None`: the inputs'
    /// precisions promoted): a cast, or a product of 16-bit factors accumulated in `f32`.
    #[allow(clippy::too_many_arguments)]
    pub fn einsum_op_in(
        spec: &str,
        rhs: Rhs,
        inputs: &[&Tensor],
        accum: BinOp,
        initialize_neutral: bool,
        label: &str,
        backward: Option<BackwardFn>,
        prec: Option<Prec>,
    ) -> Result<Tensor> {
        Tensor::einsum_op_guarded(
            spec,
            rhs,
            inputs,
            accum,
            initialize_neutral,
            label,
            backward,
            prec,
            &[],
        )
    }

    /// [`Tensor::einsum_op_in`] accumulating only the terms where every guard holds
    /// ([`arrayjit_ir::Projections::guards`], written with the spec's letters).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn einsum_op_guarded(
        spec: &str,
        rhs: Rhs,
        inputs: &[&Tensor],
        accum: BinOp,
        initialize_neutral: bool,
        label: &str,
        backward: Option<BackwardFn>,
        prec: Option<Prec>,
        guards: &[EinsumGuard],
    ) -> Result<Tensor> {
        let bad = |detail: String| Error::ShapeMismatch {
            op: format!("{label} ({spec})"),
            shapes: vec![],
            detail,
        };
        let (lhs_spec, rhs_specs) =
            parse_spec(spec).ok_or_else(|| bad("the spec needs `->`".into()))?;
        let arity = match rhs {
            Rhs::Un(_) => 1,
            Rhs::Bin(_) => 2,
            Rhs::Tern(_) => 3,
        };
        if inputs.len() != arity || rhs_specs.len() != arity {
            return Err(bad(format!(
                "the operation takes {arity} operand(s); the spec names {} and {} were given",
                rhs_specs.len(),
                inputs.len()
            )));
        }
        let mut dims = Vec::new();
        for c in lhs_spec.chars() {
            let mut extent = None;
            for (s, t) in rhs_specs.iter().zip(inputs) {
                if s.chars().count() != t.dims().len() {
                    return Err(bad(format!(
                        "operand spec {s:?} has {} axes but the operand has shape {:?}",
                        s.chars().count(),
                        t.dims()
                    )));
                }
                for (c2, &d) in s.chars().zip(t.dims()) {
                    if c2 == c {
                        extent = Some(extent.map_or(d, |e: usize| e.max(d)));
                    }
                }
            }
            dims.push(
                extent.ok_or_else(|| bad(format!("result axis {c:?} appears in no operand")))?,
            );
        }
        let prec = prec.unwrap_or_else(|| {
            inputs
                .iter()
                .map(|t| t.prec())
                .reduce(Prec::promote)
                .unwrap_or(Prec::F32)
        });
        let value = Tnode::new(prec, &dims, &[label])?;
        let input_dims: Vec<&[usize]> = inputs.iter().map(|t| t.dims()).collect();
        let projections = Projections::einsum_guarded(spec, &dims, &input_dims, guards)?;
        let ops: Vec<Operand> = inputs
            .iter()
            .map(|t| Operand::Node(t.node().clone()))
            .collect();
        let rhs_ir = match rhs {
            Rhs::Un(op) => AccumRhs::Unop(op, ops[0].clone()),
            Rhs::Bin(op) => AccumRhs::Binop(op, ops[0].clone(), ops[1].clone()),
            Rhs::Tern(op) => AccumRhs::Ternop(op, ops[0].clone(), ops[1].clone(), ops[2].clone()),
        };
        let forward = Assignments::Accum {
            initialize_neutral,
            accum,
            lhs: value.clone(),
            rhs: rhs_ir,
            projections,
        };
        let requires_grad = backward.is_some() && inputs.iter().any(|t| t.requires_grad());
        Ok(Tensor(Arc::new(Inner {
            id: next_id(),
            value,
            forward,
            parents: inputs.iter().map(|t| (*t).clone()).collect(),
            backward: if requires_grad { backward } else { None },
            requires_grad,
            kind: Kind::Computed,
            grad: OnceLock::new(),
        })))
    }

    /// `x` (letters `xs`) repeated along the letters of `to` that it lacks, to shape `dims`:
    /// `out[to] = x[xs]`, a view the optimizer inlines into its readers (a plain copy), so it
    /// costs neither memory nor a pass. No gradient flows through it (backward rules use it to
    /// spread a gradient over the axes a forward operation summed).
    pub(crate) fn broadcast_view(x: &Tensor, xs: &str, to: &str, dims: &[usize]) -> Result<Tensor> {
        let spec = format!("{xs}->{to}");
        let value = Tnode::new(x.prec(), dims, &["broadcast"])?;
        let projections = Projections::einsum(&spec, dims, &[x.dims()])?;
        let forward = Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Arg2,
            lhs: value.clone(),
            rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(x.node().clone())),
            projections,
        };
        Ok(Tensor(Arc::new(Inner {
            id: next_id(),
            value,
            forward,
            parents: vec![x.clone()],
            backward: None,
            requires_grad: false,
            kind: Kind::Computed,
            grad: OnceLock::new(),
        })))
    }

    /// A pointwise unary operation with its derivative rule.
    pub(crate) fn unary(
        &self,
        op: UnOp,
        label: &str,
        backward: Option<BackwardFn>,
    ) -> Result<Tensor> {
        let l = aligned_letters(self.dims().len(), self.dims().len())?;
        Tensor::einsum_op(
            &format!("{l}->{l}"),
            Rhs::Un(op),
            &[self],
            BinOp::Arg2,
            false,
            label,
            backward,
        )
    }

    /// A pointwise binary operation with broadcasting and its derivative rule.
    fn binary(
        &self,
        other: &Tensor,
        op: BinOp,
        label: &str,
        backward: Option<BackwardFn>,
    ) -> Result<Tensor> {
        let out = broadcast_dims(label, self.dims(), other.dims())?;
        let r = out.len();
        let spec = format!(
            "{},{}->{}",
            aligned_letters(self.dims().len(), r)?,
            aligned_letters(other.dims().len(), r)?,
            aligned_letters(r, r)?
        );
        Tensor::einsum_op(
            &spec,
            Rhs::Bin(op),
            &[self, other],
            BinOp::Arg2,
            false,
            label,
            backward,
        )
    }
}

/// Splits `"A,B->C"` into `("C", ["A", "B"])`.
pub(crate) fn parse_spec(spec: &str) -> Option<(String, Vec<String>)> {
    let (rhs, lhs) = spec.split_once("->")?;
    Some((
        lhs.trim().to_string(),
        rhs.split(',').map(|s| s.trim().to_string()).collect(),
    ))
}

pub(crate) fn bw(
    f: impl Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Option<BackwardFn> {
    Some(Arc::new(f))
}

/// Elementwise operations with gradients.
impl Tensor {
    /// `self + other` (broadcasting).
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Add,
            "add",
            bw(|_, g| Ok(vec![Some(g.clone()), Some(g.clone())])),
        )
    }

    /// `self - other` (broadcasting).
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Sub,
            "sub",
            bw(|_, g| Ok(vec![Some(g.clone()), Some(g.neg()?)])),
        )
    }

    /// `self * other` (broadcasting).
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Mul,
            "mul",
            bw(|out, g| {
                let (a, b) = (&out.parents()[0], &out.parents()[1]);
                Ok(vec![Some(g.mul(b)?), Some(g.mul(a)?)])
            }),
        )
    }

    /// `self / other` (broadcasting).
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Div,
            "div",
            bw(|out, g| {
                let b = &out.parents()[1];
                let ga = g.div(b)?;
                Ok(vec![Some(ga.clone()), Some(ga.mul(&out.detach())?.neg()?)])
            }),
        )
    }

    /// `self` to the power `other` (broadcasting; the base must be positive where the exponent's
    /// gradient is needed).
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Pow,
            "pow",
            bw(|out, g| {
                let (a, b) = (&out.parents()[0], &out.parents()[1]);
                let c = out.detach();
                let ga = g.mul(b)?.mul(&c)?.div(a)?;
                let gb = g.mul(&c)?.mul(&a.log()?)?;
                Ok(vec![Some(ga), Some(gb)])
            }),
        )
    }

    /// Elementwise maximum (broadcasting); the gradient goes to the larger operand (the first on
    /// ties).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Max,
            "max",
            bw(|out, g| {
                let (a, b) = (&out.parents()[0], &out.parents()[1]);
                let b_wins = a.cmplt(b)?;
                Ok(vec![Some(g.mul(&b_wins.not()?)?), Some(g.mul(&b_wins)?)])
            }),
        )
    }

    /// Elementwise minimum (broadcasting); the gradient goes to the smaller operand (the first on
    /// ties).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(
            other,
            BinOp::Min,
            "min",
            bw(|out, g| {
                let (a, b) = (&out.parents()[0], &out.parents()[1]);
                let b_wins = b.cmplt(a)?;
                Ok(vec![Some(g.mul(&b_wins.not()?)?), Some(g.mul(&b_wins)?)])
            }),
        )
    }

    /// `1` where `self < other`, else `0` (no gradient).
    pub fn cmplt(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinOp::Cmplt, "lt", None)
    }

    /// `1` where `self == other`, else `0` (no gradient).
    pub fn cmpeq(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinOp::Cmpeq, "eq", None)
    }

    /// `1` where `self == 0`, else `0` (no gradient).
    pub fn not(&self) -> Result<Tensor> {
        self.unary(UnOp::Not, "not", None)
    }

    /// `cond != 0 ? a : b`, broadcasting all three.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let ab = broadcast_dims("where", a.dims(), b.dims())?;
        let out = broadcast_dims("where", cond.dims(), &ab)?;
        let r = out.len();
        let spec = format!(
            "{},{},{}->{}",
            aligned_letters(cond.dims().len(), r)?,
            aligned_letters(a.dims().len(), r)?,
            aligned_letters(b.dims().len(), r)?,
            aligned_letters(r, r)?
        );
        Tensor::einsum_op(
            &spec,
            Rhs::Tern(TernOp::Where),
            &[cond, a, b],
            BinOp::Arg2,
            false,
            "where",
            bw(|out, g| {
                let c = &out.parents()[0];
                let zero = Tensor::scalar(0.0)?;
                Ok(vec![
                    None,
                    Some(Tensor::where_(c, g, &zero)?),
                    Some(Tensor::where_(c, &zero, g)?),
                ])
            }),
        )
    }

    /// `-self`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnOp::Neg, "neg", bw(|_, g| Ok(vec![Some(g.neg()?)])))
    }

    /// `max(self, 0)`.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Relu,
            "relu",
            bw(|out, g| {
                let a = &out.parents()[0];
                Ok(vec![Some(a.binary(
                    g,
                    BinOp::ReluGate,
                    "relu_gate",
                    None,
                )?)])
            }),
        )
    }

    /// `exp(self)`.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Exp,
            "exp",
            bw(|out, g| Ok(vec![Some(g.mul(&out.detach())?)])),
        )
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Log,
            "log",
            bw(|out, g| Ok(vec![Some(g.div(&out.parents()[0])?)])),
        )
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Sqrt,
            "sqrt",
            bw(|out, g| Ok(vec![Some(g.div(&out.detach())?.scale(0.5)?)])),
        )
    }

    /// `1 / self`.
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Recip,
            "recip",
            bw(|out, g| {
                let c = out.detach();
                Ok(vec![Some(g.mul(&c)?.mul(&c)?.neg()?)])
            }),
        )
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(
            UnOp::Tanh,
            "tanh",
            bw(|out, g| {
                let c = out.detach();
                let one_minus = Tensor::scalar(1.0)?.sub(&c.mul(&c)?)?;
                Ok(vec![Some(g.mul(&one_minus)?)])
            }),
        )
    }

    /// The logistic function `1 / (1 + exp(-self))`.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.neg()?.exp()?.add_scalar(1.0)?.recip()
    }

    /// `self * k`.
    pub fn scale(&self, k: f64) -> Result<Tensor> {
        self.mul(&Tensor::full(self.prec(), &[], k)?)
    }

    /// `self + k`.
    pub fn add_scalar(&self, k: f64) -> Result<Tensor> {
        self.add(&Tensor::full(self.prec(), &[], k)?)
    }
}

/// Arithmetic operators on tensor references, returning `Result` (a shape error is a value, not
/// a panic): `(&a + &b)?`, `(&a * &b)?`, `(-&a)?`.
macro_rules! tensor_operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, other: &Tensor) -> Result<Tensor> {
                self.$op(other)
            }
        }
    };
}
tensor_operator!(Add, add, add);
tensor_operator!(Sub, sub, sub);
tensor_operator!(Mul, mul, mul);
tensor_operator!(Div, div, div);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}
