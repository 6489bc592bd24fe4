//! The GPU kernel tree: each kernel shape (zeroing, grid, rows, group reduction, tiled
//! product, fused attention, one invocation) is written once, in `lower`, as a small typed tree lowered from
//! the routine's recorded [`GpuPass`]; each GPU dialect (CUDA C, WGSL) prints that tree
//! through `KernelDialect`, which supplies its syntax (declarations, loops, barriers,
//! shuffles) and renders the parts that come from the IR (array elements in their storage
//! precision, the statements of a grid point, the step of an accumulation).
//!
//! Rules the tree keeps, whatever the dialect:
//! - integers are signed: `Ty::Int` for counters within a group, `Ty::Index` for anything
//!   that scales with an array (64-bit where the dialect has it);
//! - `aj_g` (the invocation's index in the launch), `aj_grp` (its group's) and `aj_t` (its
//!   index in the group) are defined by the dialect's entry point before the body;
//! - shared arrays are named by their element type, so a dialect that declares them once per
//!   module (WGSL) and one that declares them in the body (CUDA) print the same tree;
//! - global elements are read and written only under a bounds test (never a `select` that
//!   evaluates both sides).

mod attention;
mod build;
mod lower;
mod matrix;
pub(crate) use matrix::tensor_map_param;
mod pairwise;
mod simt;
mod tiles;

use std::fmt::Write as _;

use arrayjit_ir::{
    AxisIndex, BinOp, Error, LowLevel, Prec, Result, ScalarExpr, Symbol, Tnode, UnOp,
};
use arrayjit_opt::schedule::GpuPass;
use arrayjit_opt::schedule::gpu::{Accumulation, MatrixKind, Rest};

use crate::gpu_dialect::GpuDialect;

/// How a pass covers its statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassShape {
    /// One invocation per iteration of the statement's outer independent loops (their product).
    Grid(u64),
    /// One group reducing a loop into one element.
    Reduction,
    /// This many groups, each computing a tile of a matrix product.
    Tiles(u64),
    /// This many groups, each running one grid point's statements (one per grid point).
    Rows(u64),
    /// One invocation per element (or storage word) of a zeroed node.
    Zero(u64),
    /// One invocation for the whole statement.
    Single,
    /// A hand-written kernel's launch, as given ([`crate::kernel::SourceKernel`]).
    Given(crate::kernel::LaunchDims),
    /// This many groups running the passes of several statements side by side
    /// ([`arrayjit_opt::schedule::gpu::join`]); `barriers`: a part synchronizes its group.
    Joined {
        /// Groups of the launch, every part's together.
        groups: u64,
        /// A part waits at barriers (so every invocation of its group must run).
        barriers: bool,
    },
}

/// A pass's body printed in a dialect, with how to launch it.
pub(crate) struct PrintedPass {
    /// How the pass covers its statement.
    pub shape: PassShape,
    /// Invocations per group (1 for a single-invocation pass).
    pub threads: u32,
    /// The entry point's body (after the dialect's definitions of `aj_g`, `aj_grp`, `aj_t`).
    pub body: String,
    /// Bytes of dynamic shared memory its launch gives each group (0: none).
    pub dynamic_shared_bytes: usize,
}

/// Bytes of dynamic shared memory a kernel tree's groups use ([`Stmt::DynamicShared`] at its
/// top level).
pub(crate) fn dynamic_shared_bytes(tree: &[Stmt<'_>]) -> usize {
    tree.iter()
        .map(|s| match s {
            Stmt::DynamicShared { bytes, .. } => *bytes,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// Lowers a statement's recorded GPU pass to the kernel tree and prints its kernels in `d`'s
/// dialect, in launch order (none: the pass does nothing; two: a grid reduction's phases).
pub(crate) fn print_pass<D: KernelDialect>(
    d: &mut D,
    stmt: &LowLevel,
    pass: &GpuPass,
) -> Result<Vec<PrintedPass>> {
    let mut out = Vec::new();
    for k in 0..lower::kernel_count(pass) {
        out.extend(lower::print_kernel(d, stmt, pass, k)?);
    }
    Ok(out)
}

/// How many kernels a pass launches (see [`print_kernel`]).
pub(crate) fn kernel_count(pass: &GpuPass) -> usize {
    lower::kernel_count(pass)
}

/// Kernel `k` of a pass (of [`kernel_count`]) printed in `d`'s dialect, for a dialect that
/// keeps per-kernel state (the arrays a module binds).
pub(crate) fn print_kernel<D: KernelDialect>(
    d: &mut D,
    stmt: &LowLevel,
    pass: &GpuPass,
    k: usize,
) -> Result<Option<PrintedPass>> {
    lower::print_kernel(d, stmt, pass, k)
}

/// The type of a value of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    /// A counter within a group (a thread's index, an unrolled loop's): 32 bits.
    Int,
    /// A position in an array or a launch: 64 bits where the dialect has them.
    Index,
    /// Values of this precision's compute precision.
    Compute(Prec),
    /// A 32-bit word of a matrix fragment: two 16-bit factor elements, or one TF32 element.
    Word,
    /// A 16-bit factor element as stored (its bits), staged for the matrix units.
    Half,
}

/// A binary operation on integers (and the comparisons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Lt,
    Ge,
    Eq,
    Ne,
    And,
    /// Bitwise exclusive or (of non-negative counters).
    Xor,
}

impl Arith {
    fn symbol(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
            Arith::Rem => "%",
            Arith::Lt => "<",
            Arith::Ge => ">=",
            Arith::Eq => "==",
            Arith::Ne => "!=",
            Arith::And => "&&",
            Arith::Xor => "^",
        }
    }
}

/// Where a global element is.
#[derive(Clone)]
pub(crate) enum At<'a> {
    /// At the IR's logical indices (the dialect computes the offset).
    Indices(&'a [AxisIndex]),
    /// At a flat offset the tree computes.
    Flat(Box<Expr<'a>>),
}

/// An expression of the tree.
#[derive(Clone)]
pub(crate) enum Expr<'a> {
    /// A variable of the tree (or one the entry point defines).
    Var(String),
    /// An integer constant.
    Int(i64),
    /// A constant of a precision's compute precision.
    Lit(Prec, f64),
    /// An integer operation or comparison.
    Arith(Arith, Box<Expr<'a>>, Box<Expr<'a>>),
    /// `cond ? a : b`, both sides evaluated (only for values, never for loads).
    Select(Box<Expr<'a>>, Box<Expr<'a>>, Box<Expr<'a>>),
    /// An element of a local or shared array of the tree.
    Item(String, Box<Expr<'a>>),
    /// A global element, in its node's compute precision.
    Elem(&'a Tnode, At<'a>),
    /// The IR's binary operation in a compute precision.
    Combine(BinOp, Prec, Box<Expr<'a>>, Box<Expr<'a>>),
    /// `acc + x · y` in `f32`: with one rounding when `fused`, else two.
    MulAdd {
        fused: bool,
        acc: Box<Expr<'a>>,
        x: Box<Expr<'a>>,
        y: Box<Expr<'a>>,
    },
    /// `acc ⊕ v(i)` of an accumulation, with its iterator bound by an enclosing loop.
    Step(Accumulation<'a>, Box<Expr<'a>>),
    /// The value of the lane `offset` further down the subgroup.
    ShuffleDown(Box<Expr<'a>>, Box<Expr<'a>>),
    /// The value of the lane whose index is this lane's exclusive-or `mask` (a butterfly
    /// step: both lanes of a pair read each other's), every lane of the subgroup taking part.
    ShuffleXor(Box<Expr<'a>>, Box<Expr<'a>>),
    /// A global element's storage bits (a 16-bit factor element staged for the matrix units).
    Bits(&'a Tnode, At<'a>),
    /// An `f32` value rounded to TF32, as the word a matrix fragment holds.
    Tf32(Box<Expr<'a>>),
    /// The IR's unary operation in a compute precision.
    Unary(UnOp, Prec, Box<Expr<'a>>),
    /// An IR expression in a compute precision, its iterators bound to variables of the tree.
    Ir(Box<ScalarExpr>, Prec),
}

/// An operation of a warp on matrix fragments ([`arrayjit_opt::schedule::gpu::matrix`]): every
/// lane of the warp takes part.
pub(crate) enum MatrixOp<'a> {
    /// Four 8 × 8 matrices of 16-bit elements from a shared array into four fragment words
    /// (`ldmatrix .x4`): each lane gives the offset of one row (lanes 8·i to 8·i + 7 those of
    /// matrix i) and receives word i of matrix i's row `lane / 4`, elements `2 (lane % 4)`
    /// and the next; `trans` transposes each matrix.
    Load {
        /// The first of the four words: an item of a word array.
        words: Expr<'a>,
        /// The lane's row: an item of the shared array.
        row: Expr<'a>,
        /// Transpose each matrix.
        trans: bool,
    },
    /// Copies 16 bytes from a global array to a shared one without waiting (`cp.async`), or
    /// zeroes them where `valid` is false (nothing is read then).
    CopyAsync {
        /// The first shared element: an item of the shared array.
        dst: Expr<'a>,
        /// The first global element ([`Expr::Bits`]).
        src: Expr<'a>,
        /// Whether the source elements exist.
        valid: Expr<'a>,
    },
    /// Closes this invocation's asynchronous copies issued since the last commit into a group
    /// (`cp.async.commit_group`).
    CommitCopies,
    /// Waits until at most `pending` of this invocation's most recent committed groups of
    /// copies are still in flight (`cp.async.wait_group`); a barrier then publishes the landed
    /// copies to the group.
    WaitCopies {
        /// Groups that may stay in flight.
        pending: usize,
    },
    /// Makes this invocation's writes to shared memory (copies and stores) visible to the
    /// asynchronous proxy that warpgroup products read through
    /// (`fence.proxy.async.shared::cta`); a barrier then publishes them to the group.
    FenceAsyncProxy,
    /// Orders the warpgroup's accumulator registers before its products (`wgmma.fence`).
    WarpgroupFence,
    /// `acc += a · b` for one warpgroup, `m64nNk16` (`wgmma.mma_async`): `n / 2` `f32`
    /// accumulators per lane, both factors read from shared memory in their canonical
    /// layouts, described from their first elements.
    WarpgroupMultiply {
        /// The factors' kind (16-bit).
        kind: MatrixKind,
        /// Columns of the product (`N`).
        n: usize,
        /// Whether the left and the right factor are staged with the result side contiguous
        /// (the descriptor's transpose bits), else with `k` contiguous.
        side_major: [bool; 2],
        /// The staged depth of `k` (32 or 64): the row length of `k`-contiguous factors
        /// (64 or 128 bytes, with the swizzle of that width) and the rows of each 64-element
        /// block of result-side-contiguous ones.
        depth: usize,
        /// The first accumulator.
        acc: Expr<'a>,
        /// The left factor's first element (its 64 rows).
        a: Expr<'a>,
        /// The right factor's first element.
        b: Expr<'a>,
    },
    /// Closes the warpgroup's products issued since the last commit into a group
    /// (`wgmma.commit_group`).
    WarpgroupCommit,
    /// Waits until at most `pending` of the warpgroup's groups of products are in flight
    /// (`wgmma.wait_group`).
    WarpgroupWait {
        /// Groups that may stay in flight.
        pending: usize,
    },
    /// `acc += a · b` on one `m16n8` fragment: four `f32` accumulators, four words of the
    /// left factor and two of the right (items, each the first of its run).
    Multiply {
        /// The fragment kind.
        kind: MatrixKind,
        /// The first accumulator.
        acc: Expr<'a>,
        /// The left factor's first word.
        a: Expr<'a>,
        /// The right factor's first word.
        b: Expr<'a>,
    },
    /// Makes an `mbarrier` in shared memory expect one arrival per phase
    /// (`mbarrier.init.shared::cta.b64`); one invocation initializes it.
    BarrierInit {
        /// The barrier: an item of a shared array of 64-bit words.
        bar: Expr<'a>,
    },
    /// Makes initialized `mbarrier`s visible to the tensor memory accelerator
    /// (`fence.mbarrier_init.release.cluster`); a barrier then publishes them to the group.
    BarrierInitFence,
    /// Arrives at an `mbarrier` expecting the copies of its phase to bring `bytes`
    /// (`mbarrier.arrive.expect_tx`): the phase completes once they have landed.
    ExpectBytes {
        /// The barrier.
        bar: Expr<'a>,
        /// Bytes its phase's copies bring.
        bytes: usize,
    },
    /// A bulk tensor copy of one box of a tensor-mapped factor into shared memory
    /// (`cp.async.bulk.tensor`), completing on `bar`: elements past the factor's ends are
    /// zero, the box lands swizzled as the map says.
    TensorCopy {
        /// The kernel parameter holding the factor's tensor map.
        map: &'static str,
        /// The box's first shared element.
        dst: Expr<'a>,
        /// The box's first element's coordinates, one per axis of the map, innermost first.
        coords: Vec<Expr<'a>>,
        /// The barrier its bytes complete on.
        bar: Expr<'a>,
    },
    /// Waits until the phase of `bar` of this parity has completed
    /// (`mbarrier.try_wait.parity`, repeated): its copies have landed and are visible.
    BarrierWait {
        /// The barrier.
        bar: Expr<'a>,
        /// The phase's parity (0 or 1).
        parity: Expr<'a>,
    },
}

impl MatrixOp<'_> {
    /// An operation of sm_90's warpgroups (or of their asynchronous proxy).
    pub(crate) fn is_warpgroup(&self) -> bool {
        matches!(
            self,
            MatrixOp::FenceAsyncProxy
                | MatrixOp::WarpgroupFence
                | MatrixOp::WarpgroupMultiply { .. }
                | MatrixOp::WarpgroupCommit
                | MatrixOp::WarpgroupWait { .. }
                | MatrixOp::BarrierInit { .. }
                | MatrixOp::BarrierInitFence
                | MatrixOp::ExpectBytes { .. }
                | MatrixOp::TensorCopy { .. }
                | MatrixOp::BarrierWait { .. }
        )
    }
}

/// Which memory a barrier orders, besides stopping every invocation of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// The group's shared arrays.
    Shared,
    /// Global arrays (the statements of a row pass read what earlier ones stored).
    Global,
}

/// A statement of the tree.
pub(crate) enum Stmt<'a> {
    /// A variable, optionally bound to an IR iterator for the statements that follow.
    Let {
        name: String,
        ty: Ty,
        value: Expr<'a>,
        mutable: bool,
        binds: Option<Symbol>,
    },
    /// An array per invocation (`shared: false`) or per group (`shared: true`).
    Array {
        name: String,
        ty: Ty,
        len: usize,
        shared: bool,
    },
    /// Arrays per group in the group's dynamic shared memory (beyond what a group may declare
    /// statically; the launch gives `bytes` of it): each array's name, element type and byte
    /// offset (a multiple of 1024). Only at a kernel's top level.
    DynamicShared {
        arrays: Vec<(String, Ty, usize)>,
        bytes: usize,
    },
    /// `place = value` where `place` is a variable or an array item.
    Assign(Expr<'a>, Expr<'a>),
    /// Stores a value of the node's compute precision as a global element.
    Store(&'a Tnode, At<'a>, Expr<'a>),
    /// Zeroes element (or storage word) `index` of a node.
    Zero(&'a Tnode, Expr<'a>),
    /// `for (var = from; cond; var = next) body`, the variable bound to an IR iterator in the
    /// body when `binds` says so; `unroll` asks the dialect to unroll it fully.
    For {
        var: String,
        ty: Ty,
        from: Expr<'a>,
        cond: Expr<'a>,
        next: Expr<'a>,
        unroll: bool,
        binds: Option<Symbol>,
        body: Vec<Stmt<'a>>,
    },
    /// `for (var = 0; var < count; ++var) body` where `count` is at least 1: the dialect may
    /// run the body once before the first test (a `do … while`), which tells its compiler
    /// there is no path around the body (ptxas serializes warpgroup products whose
    /// accumulators reach the loop's end around them).
    Repeat {
        var: String,
        count: Expr<'a>,
        body: Vec<Stmt<'a>>,
    },
    /// `if (cond) body`.
    If(Expr<'a>, Vec<Stmt<'a>>),
    /// A nested scope.
    Block(Vec<Stmt<'a>>),
    /// Leaves the entry point.
    Return,
    /// Waits for every invocation of the group.
    Barrier(Barrier),
    /// An IR statement, rendered by the dialect with the bindings in scope.
    Source(&'a LowLevel),
    /// A warp's operation on matrix fragments.
    Matrix(MatrixOp<'a>),
    /// Reads `lanes` neighbouring elements of a global array from flat `offset` (a multiple
    /// of `lanes` within the array, whose start is 16-byte aligned) into items `first`,
    /// `first + 1`, … of a local array: one wide load where the dialect has it (CUDA's
    /// 128-bit loads of `f32`), else one load per element.
    LoadVector {
        /// The local array.
        array: String,
        /// Its first item read into.
        first: Expr<'a>,
        /// The global array.
        src: &'a Tnode,
        /// The first element's flat offset.
        offset: Expr<'a>,
        /// Elements read.
        lanes: usize,
    },
}

/// What a GPU dialect supplies to print the kernel tree: its syntax, and the rendering of the
/// parts that come from the IR (which it shares with its statements).
pub(crate) trait KernelDialect {
    /// The dialect's strings (barriers, shared declarations, subgroup width).
    fn syntax(&self) -> &'static GpuDialect;
    /// The routine's name and the language, for errors.
    fn routine(&self) -> (&str, &'static str);
    /// The type's name.
    fn ty(&self, ty: Ty) -> &'static str;
    /// An integer constant.
    fn int(&self, v: i64) -> String;
    /// The declaration of a variable.
    fn declare(&self, name: &str, ty: Ty, mutable: bool, value: &str) -> String;
    /// The declaration of an array per invocation.
    fn local_array(&self, name: &str, ty: Ty, len: usize) -> String;
    /// Declares a shared array: in the body (returns it) or for the module (returns `None`).
    fn shared_array(&mut self, name: &str, ty: Ty, len: usize) -> Result<Option<String>>;
    /// Declares arrays in the group's dynamic shared memory of `bytes` (see
    /// [`Stmt::DynamicShared`]); an error in a dialect without it (no plan asks for it there:
    /// its devices' opt-in limit is their static one).
    fn dynamic_shared(&mut self, arrays: &[(String, Ty, usize)], bytes: usize) -> Result<String> {
        let _ = (arrays, bytes);
        let (routine, language) = self.routine();
        Err(Error::Render {
            routine: routine.to_string(),
            language: language.into(),
            detail: "dynamic shared memory, which this language does not have".into(),
        })
    }
    /// A loop's header, up to and including its opening brace.
    fn for_header(&self, var: &str, ty: Ty, from: &str, cond: &str, next: &str) -> String;
    /// The opening and the closing of an `int` loop that runs its body once before testing
    /// `var < count` ([`Stmt::Repeat`]), where the dialect has one; else it is a `for` loop.
    fn at_least_once(&self, var: &str, count: &str) -> Option<(String, String)> {
        let _ = (var, count);
        None
    }
    /// What asks the compiler to unroll the next loop, if the dialect has it.
    fn unroll(&self) -> Option<&'static str>;
    /// `cond ? a : b`.
    fn select(&self, cond: &str, a: &str, b: &str) -> String;
    /// `acc + x · y` in `f32`, fused or rounded twice.
    fn mul_add(&self, fused: bool, acc: &str, x: &str, y: &str) -> String;
    /// The subgroup shuffle down (only where [`GpuDialect::subgroup`] is set).
    fn shuffle_down(&self, value: &str, offset: &str) -> String;
    /// The subgroup shuffle by exclusive-or of the lane index (only where
    /// [`GpuDialect::subgroup`] is set).
    fn shuffle_xor(&self, value: &str, mask: &str) -> String;
    /// A barrier.
    fn barrier(&self, b: Barrier) -> &'static str;
    /// A constant of `p`'s compute precision.
    fn literal(&self, p: Prec, v: f64) -> String;
    /// A node's array name (marking it used).
    fn node(&mut self, tn: &Tnode) -> Result<String>;
    /// The flat offset of logical indices of a node.
    fn offset(&mut self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<String>;
    /// Element `offset` of array `name` stored in `stored`, in compute precision `to`.
    fn load(&mut self, name: &str, offset: &str, stored: Prec, to: Prec) -> String;
    /// The statement storing `value` (compute precision) as element `offset` of `name`.
    fn store(&mut self, name: &str, offset: &str, stored: Prec, value: &str) -> String;
    /// The elements (or storage words) a zeroing of `tn` covers.
    fn zero_extent(&self, tn: &Tnode) -> u64;
    /// The statement zeroing element (or word) `index` of `tn`.
    fn zero(&mut self, tn: &Tnode, index: &str) -> Result<String>;
    /// The IR's binary operation in compute precision `cp`.
    fn combine(&mut self, op: BinOp, cp: Prec, a: &str, b: &str) -> String;
    /// The IR's unary operation in compute precision `cp`.
    fn unary(&mut self, op: UnOp, cp: Prec, a: &str) -> String;
    /// The IR's fused multiply-add `a · b + c` in compute precision `cp`.
    fn fma(&mut self, cp: Prec, a: &str, b: &str, c: &str) -> String;
    /// Binds an IR iterator to a variable of the tree.
    fn bind(&mut self, sym: Symbol, name: &str);
    /// Ends a binding.
    fn unbind(&mut self, sym: Symbol);
    /// An IR expression in compute precision `prec` (declarations go to `prelude`).
    fn ir_expr(
        &mut self,
        e: &ScalarExpr,
        prec: Prec,
        depth: usize,
        prelude: &mut String,
    ) -> Result<String>;
    /// An IR statement.
    fn ir_stmt(&mut self, s: &LowLevel, depth: usize, out: &mut String) -> Result<()>;
    /// The statement reading `lanes` elements of array `name` (stored in `stored`) from
    /// `offset` into the local items from `place` on, as one wide load; `None` where the
    /// dialect has none for them (the tree then reads element by element).
    fn load_vector(
        &mut self,
        place: &str,
        name: &str,
        offset: &str,
        stored: Prec,
        lanes: usize,
    ) -> Option<String> {
        let _ = (place, name, offset, stored, lanes);
        None
    }
    /// Element `offset` of array `name` as its storage bits.
    fn bits(&mut self, name: &str, offset: &str) -> String;
    /// An `f32` value rounded to a TF32 fragment word (an error where the dialect has no
    /// matrix units).
    fn tf32(&mut self, value: &str) -> Result<String>;
    /// The statement of a warp's matrix operation, given its operands as places (an error
    /// where the dialect has no matrix units).
    fn matrix(&mut self, op: &MatrixOp<'_>, places: &[String]) -> Result<String>;
}

/// `acc ⊕ v(i)` (or `fma(a, b, acc)`) of an accumulation, in the element's compute precision,
/// with its iterator bound: the one step every dialect's accumulations print.
pub(crate) fn accumulation_step<D: KernelDialect + ?Sized>(
    d: &mut D,
    r: &Accumulation<'_>,
    acc: &str,
    depth: usize,
    prelude: &mut String,
) -> Result<String> {
    let p = r.tn.prec();
    let cp = p.compute_prec();
    Ok(match r.rest {
        Rest::One(v) => {
            let v = d.ir_expr(v, p, depth, prelude)?;
            d.combine(r.combine, cp, acc, &v)
        }
        Rest::Product(a, b) => {
            let a = d.ir_expr(a, p, depth, prelude)?;
            let b = d.ir_expr(b, p, depth, prelude)?;
            d.fma(cp, &a, &b, acc)
        }
    })
}

/// Prints statements at `depth`.
fn print_stmts<D: KernelDialect>(
    d: &mut D,
    stmts: &[Stmt<'_>],
    depth: usize,
    out: &mut String,
) -> Result<()> {
    for s in stmts {
        print_stmt(d, s, depth, out)?;
    }
    Ok(())
}

fn print_stmt<D: KernelDialect>(
    d: &mut D,
    s: &Stmt<'_>,
    depth: usize,
    out: &mut String,
) -> Result<()> {
    let pad = "  ".repeat(depth);
    // Declarations an IR expression needs go before the statement that uses it.
    let mut prelude = String::new();
    match s {
        Stmt::Let {
            name,
            ty,
            value,
            mutable,
            binds,
        } => {
            let v = print_bare(d, value, depth, &mut prelude)?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}{}", d.declare(name, *ty, *mutable, &v));
            if let Some(sym) = binds {
                d.bind(*sym, name);
            }
        }
        Stmt::Array {
            name,
            ty,
            len,
            shared,
        } => {
            let decl = if *shared {
                d.shared_array(name, *ty, *len)?
            } else {
                Some(d.local_array(name, *ty, *len))
            };
            if let Some(decl) = decl {
                let _ = writeln!(out, "{pad}{decl}");
            }
        }
        Stmt::DynamicShared { arrays, bytes } => {
            for line in d.dynamic_shared(arrays, *bytes)?.lines() {
                let _ = writeln!(out, "{pad}{line}");
            }
        }
        Stmt::Assign(place, value) => {
            let v = print_bare(d, value, depth, &mut prelude)?;
            let p = print_expr(d, place, depth, &mut prelude)?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}{p} = {v};");
        }
        Stmt::Store(tn, at, value) => {
            let v = print_expr(d, value, depth, &mut prelude)?;
            let name = d.node(tn)?;
            let offset = print_at(d, tn, at, depth, &mut prelude)?;
            out.push_str(&prelude);
            let store = d.store(&name, &offset, tn.prec(), &v);
            let _ = writeln!(out, "{pad}{store}");
        }
        Stmt::Zero(tn, index) => {
            let i = print_expr(d, index, depth, &mut prelude)?;
            let zero = d.zero(tn, &i)?;
            let _ = writeln!(out, "{pad}{zero}");
        }
        Stmt::For {
            var,
            ty,
            from,
            cond,
            next,
            unroll,
            binds,
            body,
        } => {
            let from = print_bare(d, from, depth, &mut prelude)?;
            let cond = print_bare(d, cond, depth, &mut prelude)?;
            let next = print_bare(d, next, depth, &mut prelude)?;
            out.push_str(&prelude);
            if *unroll && let Some(pragma) = d.unroll() {
                let _ = writeln!(out, "{pad}{pragma}");
            }
            let _ = writeln!(out, "{pad}{}", d.for_header(var, *ty, &from, &cond, &next));
            if let Some(sym) = binds {
                d.bind(*sym, var);
            }
            print_stmts(d, body, depth + 1, out)?;
            if let Some(sym) = binds {
                d.unbind(*sym);
            }
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Repeat { var, count, body } => {
            let count = print_bare(d, count, depth, &mut prelude)?;
            out.push_str(&prelude);
            let (open, close) = d.at_least_once(var, &count).unwrap_or_else(|| {
                let next = format!("{var} + 1");
                let cond = format!("{var} < {count}");
                (d.for_header(var, Ty::Int, "0", &cond, &next), "}".into())
            });
            let _ = writeln!(out, "{pad}{open}");
            print_stmts(d, body, depth + 1, out)?;
            let _ = writeln!(out, "{pad}{close}");
        }
        Stmt::If(cond, body) => {
            let c = print_bare(d, cond, depth, &mut prelude)?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}if ({c}) {{");
            print_stmts(d, body, depth + 1, out)?;
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Block(body) => {
            let _ = writeln!(out, "{pad}{{");
            print_stmts(d, body, depth + 1, out)?;
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Return => {
            let _ = writeln!(out, "{pad}return;");
        }
        Stmt::Barrier(b) => {
            let _ = writeln!(out, "{pad}{}", d.barrier(*b));
        }
        Stmt::Source(stmt) => d.ir_stmt(stmt, depth, out)?,
        Stmt::Matrix(op) => {
            let operands: Vec<&Expr<'_>> = match op {
                MatrixOp::Load { words, row, .. } => vec![words, row],
                MatrixOp::Multiply { acc, a, b, .. } => vec![acc, a, b],
                MatrixOp::CopyAsync { dst, src, valid } => vec![dst, src, valid],
                MatrixOp::WarpgroupMultiply { acc, a, b, .. } => vec![acc, a, b],
                MatrixOp::BarrierInit { bar } | MatrixOp::ExpectBytes { bar, .. } => vec![bar],
                MatrixOp::BarrierWait { bar, parity } => vec![bar, parity],
                MatrixOp::TensorCopy {
                    dst, coords, bar, ..
                } => std::iter::once(dst)
                    .chain(coords)
                    .chain(std::iter::once(bar))
                    .collect(),
                MatrixOp::BarrierInitFence
                | MatrixOp::CommitCopies
                | MatrixOp::WaitCopies { .. }
                | MatrixOp::FenceAsyncProxy
                | MatrixOp::WarpgroupFence
                | MatrixOp::WarpgroupCommit
                | MatrixOp::WarpgroupWait { .. } => vec![],
            };
            let places = operands
                .into_iter()
                .map(|e| print_expr(d, e, depth, &mut prelude))
                .collect::<Result<Vec<_>>>()?;
            out.push_str(&prelude);
            let _ = writeln!(out, "{pad}{}", d.matrix(op, &places)?);
        }
        Stmt::LoadVector {
            array,
            first,
            src,
            offset,
            lanes,
        } => {
            let place = print_expr(d, &Expr::item(array, first.clone()), depth, &mut prelude)?;
            let name = d.node(src)?;
            let at = print_bare(d, offset, depth, &mut prelude)?;
            out.push_str(&prelude);
            match d.load_vector(&place, &name, &at, src.prec(), *lanes) {
                Some(load) => {
                    let _ = writeln!(out, "{pad}{load}");
                }
                None => {
                    for c in 0..*lanes {
                        let each = Stmt::Assign(
                            Expr::item(array, first.clone() + c),
                            Expr::Elem(src, At::Flat(Box::new(offset.clone() + c))),
                        );
                        print_stmt(d, &each, depth, out)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn print_at<D: KernelDialect>(
    d: &mut D,
    tn: &Tnode,
    at: &At<'_>,
    depth: usize,
    prelude: &mut String,
) -> Result<String> {
    match at {
        At::Indices(idcs) => d.offset(tn, idcs),
        At::Flat(e) => print_expr(d, e, depth, prelude),
    }
}

/// An expression where the text around it delimits it: an operation without its parentheses.
fn print_bare<D: KernelDialect>(
    d: &mut D,
    e: &Expr<'_>,
    depth: usize,
    prelude: &mut String,
) -> Result<String> {
    let text = print_expr(d, e, depth, prelude)?;
    Ok(match e {
        Expr::Arith(..) => text[1..text.len() - 1].to_string(),
        _ => text,
    })
}

fn print_expr<D: KernelDialect>(
    d: &mut D,
    e: &Expr<'_>,
    depth: usize,
    prelude: &mut String,
) -> Result<String> {
    Ok(match e {
        Expr::Var(name) => name.clone(),
        Expr::Int(v) => d.int(*v),
        Expr::Lit(p, v) => d.literal(*p, *v),
        Expr::Arith(op, a, b) => {
            let (a, b) = (
                print_expr(d, a, depth, prelude)?,
                print_expr(d, b, depth, prelude)?,
            );
            format!("({a} {} {b})", op.symbol())
        }
        Expr::Select(c, a, b) => {
            let (c, a, b) = (
                print_expr(d, c, depth, prelude)?,
                print_expr(d, a, depth, prelude)?,
                print_expr(d, b, depth, prelude)?,
            );
            d.select(&c, &a, &b)
        }
        Expr::Item(name, i) => format!("{name}[{}]", print_bare(d, i, depth, prelude)?),
        Expr::Elem(tn, at) => {
            let name = d.node(tn)?;
            let offset = print_at(d, tn, at, depth, prelude)?;
            d.load(&name, &offset, tn.prec(), tn.prec().compute_prec())
        }
        Expr::Combine(op, cp, a, b) => {
            let (a, b) = (
                print_expr(d, a, depth, prelude)?,
                print_expr(d, b, depth, prelude)?,
            );
            d.combine(*op, *cp, &a, &b)
        }
        Expr::MulAdd { fused, acc, x, y } => {
            let (acc, x, y) = (
                print_expr(d, acc, depth, prelude)?,
                print_expr(d, x, depth, prelude)?,
                print_expr(d, y, depth, prelude)?,
            );
            d.mul_add(*fused, &acc, &x, &y)
        }
        Expr::Step(r, acc) => {
            let acc = print_expr(d, acc, depth, prelude)?;
            accumulation_step(d, r, &acc, depth, prelude)?
        }
        Expr::ShuffleDown(v, s) => {
            let (v, s) = (
                print_expr(d, v, depth, prelude)?,
                print_expr(d, s, depth, prelude)?,
            );
            d.shuffle_down(&v, &s)
        }
        Expr::ShuffleXor(v, m) => {
            let (v, m) = (
                print_expr(d, v, depth, prelude)?,
                print_expr(d, m, depth, prelude)?,
            );
            d.shuffle_xor(&v, &m)
        }
        Expr::Bits(tn, at) => {
            let name = d.node(tn)?;
            let offset = print_at(d, tn, at, depth, prelude)?;
            d.bits(&name, &offset)
        }
        Expr::Tf32(v) => {
            let v = print_bare(d, v, depth, prelude)?;
            d.tf32(&v)?
        }
        Expr::Unary(op, cp, a) => {
            let a = print_bare(d, a, depth, prelude)?;
            d.unary(*op, *cp, &a)
        }
        Expr::Ir(e, prec) => d.ir_expr(e, *prec, depth, prelude)?,
    })
}
