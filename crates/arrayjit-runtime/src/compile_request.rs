//! What one compilation is asked to do ([`CompileRequest`], taken by
//! [`Backend::compile`](crate::backend::Backend::compile), the one way to compile): which
//! routines — assignments to optimize, or programs a backend already optimized
//! ([`Backend::optimize_in`](crate::backend::Backend::optimize_in)) — in which slots, with
//! which static index bindings and in which optimize context. What comes back is typed by how
//! the request was made: one routine gives a [`Code`], a batch a `Vec<Code>`, slots that may be
//! empty a `Vec<Option<Code>>`.
//!
//! Every request compiles its routines together, in order (one compiler run, one library),
//! each optimized in the request's optimize context, so later routines may inline what
//! earlier ones compute; a request without one uses a fresh context.

use std::sync::Arc;

use arrayjit_ir::{Assignments, Error, Result, StaticSymbol};
use arrayjit_opt::{OptimizeCtx, Optimized};

use crate::code::Code;

/// One slot's routine.
#[derive(Clone, Debug)]
pub(crate) enum RoutineSource<'a> {
    /// Assignments to optimize under a name.
    Assignments(&'a str, &'a Assignments),
    /// A program the backend already optimized.
    Optimized(Arc<Optimized>),
}

/// A compilation asked of [`Backend::compile`](crate::backend::Backend::compile): routines in
/// slots, their static index bindings (none unless given) and the optimize context (a fresh
/// one unless given). `Out` is what the compilation gives back, fixed by the constructor:
/// [`CompileRequest::routine`] a [`Code`], [`CompileRequest::batch`] and
/// [`CompileRequest::optimized`] a `Vec<Code>` in order, [`CompileRequest::slots`] a
/// `Vec<Option<Code>>` with the empty slots empty.
///
/// ```no_run
/// # use arrayjit_ir::{Assignments, StaticSymbol};
/// # use arrayjit_runtime::{Backend, CompileRequest, Context};
/// # fn f(backend: &Backend, ctx: &Context, fwd: &Assignments, bwd: &Assignments, i: StaticSymbol) -> arrayjit_ir::Result<()> {
/// let forward = backend.compile(CompileRequest::routine("forward", fwd))?;
/// let both = backend.compile(
///     CompileRequest::batch(&[("forward", fwd), ("backward", bwd)])
///         .bindings(std::slice::from_ref(&i))
///         .in_context(ctx.optimize_ctx()),
/// )?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CompileRequest<'a, Out = Code> {
    pub(crate) slots: Vec<Option<RoutineSource<'a>>>,
    pub(crate) bindings: &'a [StaticSymbol],
    pub(crate) ctx: Option<&'a OptimizeCtx>,
    gives: fn(Vec<Option<Code>>) -> Result<Out>,
}

impl<Out> std::fmt::Debug for CompileRequest<'_, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .slots
            .iter()
            .map(|s| match s {
                None => "-".to_string(),
                Some(RoutineSource::Assignments(name, _)) => (*name).to_string(),
                Some(RoutineSource::Optimized(o)) => o.name.clone(),
            })
            .collect();
        f.debug_struct("CompileRequest")
            .field("slots", &names)
            .field("bindings", &self.bindings)
            .field("in_context", &self.ctx.is_some())
            .finish()
    }
}

/// The internal error of a compilation that gave back another number of codes than its
/// request had slots (a defect, never the caller's).
fn miscounted(expected: usize, got: usize) -> Error {
    Error::Runtime {
        stream: "compile".into(),
        detail: format!(
            "a compilation of {expected} slot(s) gave {got} code(s): a defect of arrayjit; \
             please report it"
        ),
    }
}

impl<'a, Out> CompileRequest<'a, Out> {
    fn of(
        slots: Vec<Option<RoutineSource<'a>>>,
        gives: fn(Vec<Option<Code>>) -> Result<Out>,
    ) -> Self {
        CompileRequest {
            slots,
            bindings: &[],
            ctx: None,
            gives,
        }
    }

    /// The static index symbols the routines' loops may read, bound per run (none by default).
    pub fn bindings(mut self, bindings: &'a [StaticSymbol]) -> Self {
        self.bindings = bindings;
        self
    }

    /// Optimizes the routines in `ctx` (usually a context's,
    /// [`Context::optimize_ctx`](crate::context::Context::optimize_ctx)): virtual nodes that
    /// routines compiled earlier in it computed are inlined here too, instead of failing for
    /// want of an array (see [`OptimizeCtx`]). Programs already optimized keep the context
    /// they were optimized in.
    pub fn in_context(mut self, ctx: &'a OptimizeCtx) -> Self {
        self.ctx = Some(ctx);
        self
    }

    /// What the compilation gives back, from its codes slot by slot.
    pub(crate) fn give(&self, codes: Vec<Option<Code>>) -> Result<Out> {
        if codes.len() != self.slots.len() {
            return Err(miscounted(self.slots.len(), codes.len()));
        }
        (self.gives)(codes)
    }
}

impl<'a> CompileRequest<'a, Code> {
    /// One routine: `assignments` optimized and compiled under `name`.
    pub fn routine(name: &'a str, assignments: &'a Assignments) -> Self {
        CompileRequest::of(
            vec![Some(RoutineSource::Assignments(name, assignments))],
            |mut codes| codes.pop().flatten().ok_or_else(|| miscounted(1, 0)),
        )
    }
}

/// Every slot's code, in order (the slots are all filled).
fn all(codes: Vec<Option<Code>>) -> Result<Vec<Code>> {
    let n = codes.len();
    let got: Vec<Code> = codes.into_iter().flatten().collect();
    if got.len() == n {
        Ok(got)
    } else {
        Err(miscounted(n, got.len()))
    }
}

impl<'a> CompileRequest<'a, Vec<Code>> {
    /// Several routines compiled together (one compiler run), optimized in order; their codes
    /// in the same order.
    pub fn batch(routines: &[(&'a str, &'a Assignments)]) -> Self {
        CompileRequest::of(
            routines
                .iter()
                .map(|&(name, a)| Some(RoutineSource::Assignments(name, a)))
                .collect(),
            all,
        )
    }

    /// Programs this backend already optimized
    /// ([`Backend::optimize_in`](crate::backend::Backend::optimize_in)), rendered and compiled
    /// together, in order: the second half of a compilation whose arrays a context prepares
    /// meanwhile ([`Context::prepare_link`](crate::context::Context::prepare_link)). Their
    /// bindings and optimize context are the ones they were optimized with.
    pub fn optimized(programs: &[Arc<Optimized>]) -> Self {
        CompileRequest::of(
            programs
                .iter()
                .map(|o| Some(RoutineSource::Optimized(o.clone())))
                .collect(),
            all,
        )
    }
}

impl<'a> CompileRequest<'a, Vec<Option<Code>>> {
    /// Slots that may be empty (the reference's `compile_batch` over optional routines): an
    /// empty slot gives an empty code, the others compile together in one compiler run, in
    /// order.
    pub fn slots(slots: &[Option<(&'a str, &'a Assignments)>]) -> Self {
        CompileRequest::of(
            slots
                .iter()
                .map(|s| s.map(|(name, a)| RoutineSource::Assignments(name, a)))
                .collect(),
            Ok,
        )
    }
}
