//! The matrix-unit product ([`GpuPass::MatrixTiles`]) as a kernel tree: each group computes a
//! `tile × tile` block of results with warps of `m16n8` fragments
//! ([`arrayjit_opt::schedule::gpu::matrix`] says which and why).
//!
//! - **Staging.** Each factor's tile (`tile` rows or columns by `depth` of `k`) is copied to
//!   shared memory by all invocations, neighbouring invocations reading neighbouring elements
//!   of the factor's contiguous axis (coalesced) and keeping that axis contiguous in shared
//!   memory, each row's 16-byte chunks swizzled (TF32 rows padded). Elements outside the
//!   factor are zero. 16-bit
//!   factors are copied as their bits, `f32` ones as they are (rounded to TF32 as fragments
//!   load): by 16-byte asynchronous copies where the factor's rows are whole 16-byte runs,
//!   else element by element. TF32 factors on warpgroups go through registers instead (16
//!   bytes a load where the rows are whole runs), each element rounded to TF32 on its way and
//!   stored `k`-major whichever axis of the factor is contiguous (transposed where that is
//!   the result side). Factors the tensor memory accelerator stages
//!   ([`MatrixTile::tensor_copy`]) are copied by invocation 0 alone: it arms the buffer's
//!   `mbarrier` (`aj_bar`) with the bytes of both factors' boxes, then issues one bulk tensor
//!   copy per box (the tile, or each 64-element block where the result side is contiguous),
//!   which lands swizzled and zero-filled past the factor's ends.
//! - **Pipeline.** `stages` buffers, copies `lookahead` depths ahead (`stages - 1`, or
//!   `stages - 2` where warpgroup products stay in flight for a step): the copies of the first
//!   `lookahead` depths are issued before the loop, one committed group each; each step waits
//!   until its depth's group has landed (`lookahead - 1` stay in flight), passes one barrier,
//!   issues (and commits) the copies of the depth `lookahead` ahead into the buffer multiplied
//!   `stages - lookahead` steps before (whose products every invocation has finished), then
//!   multiplies its own. With tensor copies, each invocation first waits on the buffer's
//!   `mbarrier` for the phase of its `step / stages`-th filling (the barriers initialized,
//!   for one arrival each, by invocation 0 before the first copies, behind a barrier).
//! - **Warpgroups** (sm_90, where the layout says so): no fragments in registers; each step
//!   fences the staged tiles for the asynchronous proxy before its barrier, then each
//!   warpgroup issues one `wgmma.mma_async` (`m64nNk16`) per 16 of depth on its 64 rows of the
//!   left factor and every column of the right, read from the staged tiles in their
//!   canonical layouts, commits them and, with at least 3 buffers, waits only for the
//!   previous step's (so one step's products run while the next step's barrier and copies
//!   are issued; the last are waited for after the loop), else for its own. Where copies go
//!   through registers, a step issues its products before its copies, whose loads then wait
//!   while the products run. A slice of a split reduction has at least one step, and its loop
//!   says so ([`Stmt::Repeat`]): ptxas serializes warpgroup products whose accumulators can
//!   reach the loop's end around them.
//! - **Fragments.** 16-bit fragments load by `ldmatrix` (transposed where the factor's `k` is
//!   not its contiguous axis); TF32 fragments load word by word at the positions the PTX ISA
//!   gives `m16n8k8`'s lanes.
//! - **Results** start from zero where the product overwrites them (its zeroing absorbed),
//!   else from their values, accumulate in `f32` registers, and are stored (rounded to the
//!   result's precision) once, under bounds tests; then the product's epilogue, if it has
//!   one, runs on each stored element.

use arrayjit_ir::Prec;
use arrayjit_opt::schedule::Gemm;
use arrayjit_opt::schedule::gpu::matrix::{
    FRAGMENT_COLS, FRAGMENT_ROWS, WARP_LANES, WARPGROUP_LANES, WARPGROUP_ROWS,
};
use arrayjit_opt::schedule::gpu::tensor_map::{TensorAxisRole, TensorMapShape};
use arrayjit_opt::schedule::gpu::{Epilogue, KSplit, MatrixKind, MatrixTile};

use super::build::{array, assign, let_, let_mut, range, thread_index, unrolled, var};
use super::tiles::{Factor, split_group_tile, store_partial, store_result};
use super::{Arith, At, Barrier, Expr, MatrixOp, Stmt, Ty};

/// One factor's staging: which axis of its tile is contiguous in shared memory (the
/// factor's own contiguous axis, or `k` where the layout says so), and how it is copied.
struct Staging<'a> {
    /// The factor.
    factor: Factor<'a>,
    /// Its shared array (all buffers).
    shared: &'static str,
    /// Copied by 16-byte asynchronous copies.
    async_copy: bool,
    /// `k` is the contiguous axis of the staged tile ([`MatrixTile::k_staged`]); where the
    /// factor's own is the result side, the copies transpose it.
    k_staged: bool,
    /// Elements are rounded to TF32 as they are staged ([`MatrixTile::rounds_while_staging`]).
    rounded: bool,
    /// Copies through registers read 16 bytes at a time ([`MatrixTile::runs_fit`]).
    vector: bool,
    /// Staged by the tensor memory accelerator: how it sees the factor, and the kernel
    /// parameter holding its tensor map ([`MatrixTile::tensor_copy`]).
    tensor: Option<(TensorMapShape, &'static str)>,
}

impl<'a> std::ops::Deref for Staging<'a> {
    type Target = Factor<'a>;
    fn deref(&self) -> &Factor<'a> {
        &self.factor
    }
}

impl<'a> Staging<'a> {
    /// The staging of factor `f` of `g` (1: left, 2: right) whose batch element starts at
    /// `base`.
    fn of(g: &'a Gemm, l: &MatrixTile, f: usize, base: Expr<'static>) -> Staging<'a> {
        Staging {
            factor: Factor::of(g, l.tile, f, base),
            shared: if f == 1 { "aj_sa" } else { "aj_sb" },
            async_copy: l.async_copy[f - 1],
            k_staged: l.k_staged(g, f),
            rounded: l.rounds_while_staging(),
            vector: l.rounds_while_staging() && l.runs_fit(g, f),
            tensor: l.tensor_copy[f - 1]
                .then(|| l.tensor_map(g, f))
                .flatten()
                .map(|m| (m, tensor_map_param(f))),
        }
    }

    /// Whether every invocation copies its share of this factor's tiles by 16-byte
    /// asynchronous copies (`cp.async`, waited for in committed groups).
    fn copied_async(&self) -> bool {
        self.async_copy && self.tensor.is_none()
    }

    /// The bulk tensor copies of this factor's tile of `k` from `aj_k0` into buffer `buf`,
    /// completing on its `mbarrier` (none where it is not tensor-mapped): one box, or one per
    /// 64-element block where the result side is its contiguous axis.
    fn tensor_copies(&self, l: &MatrixTile, buf: Expr<'static>) -> Vec<Stmt<'a>> {
        let Some((map, param)) = &self.tensor else {
            return Vec::new();
        };
        (0..l.tensor_boxes(map))
            .map(|block| {
                let side = block * WARPGROUP_ROWS;
                let coords = map
                    .axes
                    .iter()
                    .map(|axis| match axis.role {
                        TensorAxisRole::Reduction => var("aj_k0"),
                        TensorAxisRole::Side => self.origin.clone() + side,
                        TensorAxisRole::Batch(d) => var(&format!("aj_b{d}")),
                    })
                    .collect();
                Stmt::Matrix(MatrixOp::TensorCopy {
                    map: param,
                    dst: self.at(l, buf.clone(), Expr::from(side), Expr::Int(0)),
                    coords,
                    bar: Expr::item(BARRIERS, buf.clone()),
                })
            })
            .collect()
    }

    /// Elements of one row of the factor as copies read it: its contiguous axis's extent in
    /// the tile.
    fn inner(&self, l: &MatrixTile) -> usize {
        if self.k_inner { l.depth() } else { l.tile }
    }

    /// Elements of one staged row as laid out: the staged contiguous axis's extent, or one
    /// block of it where the result side is contiguous and the tile is staged in blocks
    /// ([`MatrixTile::side_block`]).
    fn row_len(&self, l: &MatrixTile) -> usize {
        if self.k_staged {
            l.depth()
        } else {
            l.side_block()
        }
    }

    /// Elements from one staged row to the next: the row and its padding.
    fn pitch(&self, l: &MatrixTile) -> usize {
        self.row_len(l) + l.padding()
    }

    /// The item of buffer `buf` at tile position (`side`, `k`): its row's 16-byte chunks
    /// swizzled ([`MatrixTile::swizzle`]).
    fn at(&self, l: &MatrixTile, buf: Expr<'a>, side: Expr<'a>, k: Expr<'a>) -> Expr<'a> {
        let block = l.side_block();
        let (row, col, first) = if self.k_staged {
            (side, k, buf * l.staged_elements())
        } else if block < l.tile {
            // Blocks of `block` result-side elements, each `depth` rows, one after another.
            let start = buf * l.staged_elements() + (side.clone() / block) * (l.depth() * block);
            (k, side % block, start)
        } else {
            (k, side, buf * l.staged_elements())
        };
        let (rows, chunks) = l.swizzle(self.row_len(l));
        let ce = l.copy_elements();
        let col = if chunks > 1 {
            let chunk = (col.clone() / ce).cmp(Arith::Xor, (row.clone() / rows) % chunks);
            chunk * ce + col % ce
        } else {
            col
        };
        Expr::item(self.shared, first + row * self.pitch(l) + col)
    }

    /// The statements that copy the tile of `k` from `aj_k0` into buffer `buf`: by 16-byte
    /// asynchronous copies where `l` says so for this factor, else element by element.
    /// Elements past the factor's end are zero; the bounds are tested only where they can be
    /// crossed: along the result side where its extent is not a multiple of the tile, along
    /// `k` unless `k_inside` (every copied depth lies within `g_k`). A 4096 product then
    /// copies without tests, which keeps the registers of the warpgroups' deep pipelines
    /// within what two groups per unit leave them.
    fn copy(
        &self,
        l: &MatrixTile,
        g_k: usize,
        k_inside: bool,
        buf: Expr<'static>,
    ) -> Vec<Stmt<'a>> {
        if self.tensor.is_some() {
            // One invocation issues them ([`tensor_issue`]).
            return Vec::new();
        }
        let (d, t) = (l.depth(), l.tile);
        let inner = self.inner(l);
        // Elements each invocation moves at a time.
        let run = if self.async_copy || self.vector {
            l.copy_elements()
        } else {
            1
        };
        let per_invocation = (t * d).div_ceil(run * l.threads() as usize);
        let side_extent = self.side.0;
        let (side_pos, k_pos) = if self.k_inner {
            (var("aj_eo"), var("aj_ei"))
        } else {
            (var("aj_ei"), var("aj_eo"))
        };
        let offset = || self.offset(var("aj_es"), var("aj_ek"));
        let side_test = (!side_extent.is_multiple_of(t)).then(|| var("aj_es").lt(side_extent));
        let k_test = (!k_inside).then(|| var("aj_ek").lt(g_k));
        let exists = || match (side_test.clone(), k_test.clone()) {
            (Some(s), Some(k)) => Some(s.and(k)),
            (s, k) => s.or(k),
        };
        let mut body = vec![
            let_("aj_e", Ty::Int, thread_index() + var("aj_q") * l.threads()),
            let_("aj_ei", Ty::Int, (var("aj_e") % (inner / run)) * run),
            let_("aj_eo", Ty::Int, var("aj_e") / (inner / run)),
            let_("aj_es", Ty::Index, self.origin.clone() + side_pos.clone()),
            let_("aj_ek", Ty::Index, var("aj_k0") + k_pos.clone()),
        ];
        if self.vector {
            // 16 bytes into registers (zero past the factor's end), each element rounded and
            // stored on its own: `k`-major rows take the run as it is, others transposed.
            let mut load = vec![Stmt::LoadVector {
                array: "aj_x".into(),
                first: Expr::Int(0),
                src: self.tn,
                offset: offset(),
                lanes: run,
            }];
            if let Some(e) = exists() {
                body.extend(
                    (0..run)
                        .map(|c| assign(Expr::item("aj_x", c.into()), Expr::Lit(Prec::F32, 0.0))),
                );
                load = vec![Stmt::If(e, load)];
            }
            body.extend(load);
            for c in 0..run as i64 {
                let (side, k) = if self.k_inner {
                    (side_pos.clone(), k_pos.clone() + c)
                } else {
                    (side_pos.clone() + c, k_pos.clone())
                };
                body.push(assign(
                    self.at(l, buf.clone(), side, k),
                    Expr::Tf32(Box::new(Expr::item("aj_x", c.into()))),
                ));
            }
            return vec![unrolled("aj_q", per_invocation, body)];
        }
        let dst = self.at(l, buf, side_pos, k_pos);
        if self.async_copy {
            // Past the factor's end nothing is read (and the address is the first element's).
            let (src, valid) = match exists() {
                Some(e) => (
                    Expr::Select(
                        Box::new(e.clone()),
                        Box::new(offset()),
                        Box::new(Expr::Int(0)),
                    ),
                    e,
                ),
                None => (offset(), Expr::Int(1)),
            };
            body.push(Stmt::Matrix(MatrixOp::CopyAsync {
                dst,
                src: Expr::Bits(self.tn, At::Flat(Box::new(src))),
                valid,
            }));
        } else {
            let at = At::Flat(Box::new(offset()));
            let (value, zero) = match l.kind {
                MatrixKind::Tf32 if self.rounded => {
                    (Expr::Tf32(Box::new(Expr::Elem(self.tn, at))), Expr::Int(0))
                }
                MatrixKind::Tf32 => (Expr::Elem(self.tn, at), Expr::Lit(Prec::F32, 0.0)),
                _ => (Expr::Bits(self.tn, at), Expr::Int(0)),
            };
            match exists() {
                Some(e) => body.extend([
                    let_mut("aj_v", staged_ty(l), zero),
                    Stmt::If(e, vec![assign(var("aj_v"), value)]),
                    assign(dst, var("aj_v")),
                ]),
                None => body.push(assign(dst, value)),
            }
        }
        vec![unrolled("aj_q", per_invocation, body)]
    }
}

/// The shared array of the buffers' `mbarrier`s where factors are tensor-mapped.
const BARRIERS: &str = "aj_bar";

/// The kernel parameter holding factor `f`'s tensor map (1: left, 2: right).
pub(crate) fn tensor_map_param(f: usize) -> &'static str {
    if f == 1 { "aj_tma" } else { "aj_tmb" }
}

/// Where factors are tensor-mapped: invocation 0 arms buffer `buf`'s `mbarrier` with the
/// bytes of both factors' copies of the tile of `k` from `aj_k0`, then issues them.
fn tensor_issue<'a>(
    l: &MatrixTile,
    g: &Gemm,
    a: &Staging<'a>,
    b: &Staging<'a>,
    buf: Expr<'static>,
) -> Vec<Stmt<'a>> {
    if a.tensor.is_none() && b.tensor.is_none() {
        return Vec::new();
    }
    let mut issue = vec![Stmt::Matrix(MatrixOp::ExpectBytes {
        bar: Expr::item(BARRIERS, buf.clone()),
        bytes: l.tensor_bytes_per_buffer(g),
    })];
    issue.extend(a.tensor_copies(l, buf.clone()));
    issue.extend(b.tensor_copies(l, buf));
    vec![Stmt::If(thread_index().equals(0i64), issue)]
}

/// The type of a staged factor element: the bits of a 16-bit one; an `f32` one as it is
/// (rounded to TF32 as fragments load), or on warpgroups the bits of its TF32 rounding.
fn staged_ty(l: &MatrixTile) -> Ty {
    match l.kind {
        MatrixKind::Tf32 if l.rounds_while_staging() => Ty::Word,
        MatrixKind::Tf32 => Ty::Compute(Prec::F32),
        MatrixKind::Bf16 | MatrixKind::F16 => Ty::Half,
    }
}

/// The matrix-unit product: the launch's groups and the tree (see the module documentation;
/// `None`: more groups than 32-bit group indices hold). `groups` are those the schedule
/// recorded. With `split`, its first kernel: each slice of the reduction by groups of its own,
/// from zero into the partial results (no epilogue then).
pub(super) fn matrix_tiled<'a>(
    g: &'a Gemm,
    l: &MatrixTile,
    groups: u64,
    epilogue: Option<&'a Epilogue>,
    split: Option<&'a KSplit>,
) -> Option<(u64, Vec<Stmt<'a>>)> {
    let (t, d) = (l.tile, l.depth());
    let (m, n, kk) = (g.m.extent, g.n.extent, g.k.extent);
    let (fm, fn_) = l.fragments();
    let (_, warps_n) = l.warp_grid();
    let (wr, wc) = (l.warp_rows(), l.warp_cols());
    let f32 = Ty::Compute(Prec::F32);
    let staged = staged_ty(l);
    let steps = kk.div_ceil(d);
    let (mut tree, [oc, oa, ob], launched) = split_group_tile(g, t, groups, steps, split, l.order)?;
    let a = Staging::of(g, l, 1, oa);
    let b = Staging::of(g, l, 2, ob);
    // The steps this group takes (all, or its slice's `aj_n` from `aj_s0`), and where step
    // `s` of them starts along the reduction.
    let count = || match split {
        None => Expr::from(steps),
        Some(_) => var("aj_n"),
    };
    let depth_at = |s: Expr<'static>| match split {
        None => s * d,
        Some(_) => (var("aj_s0") + s) * d,
    };
    let staged_len = l.stages * l.staged_elements();
    let tensor_mapped = a.tensor.is_some() || b.tensor.is_some();
    if l.dynamic_shared {
        // Both factors' buffers in the group's dynamic shared memory, each on a KiB boundary
        // (the warpgroup swizzles act on address bits up to 1 KiB).
        let b_offset = (l.shared_bytes() / 2).next_multiple_of(1024);
        let mut arrays = vec![
            ("aj_sa".to_string(), staged, 0),
            ("aj_sb".to_string(), staged, b_offset),
        ];
        let mut bytes = b_offset + l.shared_bytes() / 2;
        if tensor_mapped {
            // The buffers' mbarriers after them (8 bytes each, on an 8-byte boundary).
            arrays.push((BARRIERS.to_string(), Ty::Index, bytes));
            bytes += 8 * l.stages;
        }
        tree.push(Stmt::DynamicShared { arrays, bytes });
    } else {
        tree.extend([
            array("aj_sa", staged, staged_len, true),
            array("aj_sb", staged, staged_len, true),
        ]);
        if tensor_mapped {
            tree.push(array(BARRIERS, Ty::Index, l.stages, true));
        }
    }
    if a.vector || b.vector {
        // The 16 bytes a rounded copy reads at a time.
        tree.push(array("aj_x", f32, 4, false));
    }
    tree.extend([
        let_("aj_lane", Ty::Int, thread_index() % WARP_LANES),
        // The lane's group of four and its place in it (`groupID`, `threadID_in_group`).
        let_("aj_gq", Ty::Int, var("aj_lane") / 4i64),
        let_("aj_tq", Ty::Int, var("aj_lane") % 4i64),
        array("aj_acc", f32, l.accumulators(), false),
    ]);
    if l.warpgroups {
        // The warpgroup (64 rows each) and the warp within it (16 rows each).
        tree.extend([
            let_("aj_wg", Ty::Int, thread_index() / WARPGROUP_LANES),
            let_("aj_w4", Ty::Int, (thread_index() / WARP_LANES) % 4i64),
        ]);
    } else {
        tree.extend([
            let_("aj_wm", Ty::Int, (thread_index() / WARP_LANES) / warps_n),
            let_("aj_wn", Ty::Int, (thread_index() / WARP_LANES) % warps_n),
            array("aj_fa", Ty::Word, fm * 4, false),
            array("aj_fb", Ty::Word, fn_ * 2, false),
        ]);
    }
    // Accumulator `aj_r` (of fragment (aj_i, aj_j) on warps): its result element and whether
    // it exists. A warpgroup lane's accumulator `r` is at row 16 · warp + g + 8 ((r / 2) % 2)
    // of its warpgroup's 64, column 8 (r / 4) + 2 t + r % 2.
    let acc = || {
        if l.warpgroups {
            Expr::item("aj_acc", var("aj_r"))
        } else {
            Expr::item(
                "aj_acc",
                (var("aj_i") * fn_ + var("aj_j")) * 4i64 + var("aj_r"),
            )
        }
    };
    let position = || {
        let (row, col) = if l.warpgroups {
            (
                var("aj_wg") * WARPGROUP_ROWS
                    + var("aj_w4") * 16i64
                    + var("aj_gq")
                    + ((var("aj_r") / 2i64) % 2i64) * 8i64,
                (var("aj_r") / 4i64) * 8i64 + var("aj_tq") * 2i64 + var("aj_r") % 2i64,
            )
        } else {
            (
                var("aj_wm") * wr
                    + var("aj_i") * FRAGMENT_ROWS
                    + var("aj_gq")
                    + (var("aj_r") / 2i64) * 8i64,
                var("aj_wn") * wc
                    + var("aj_j") * FRAGMENT_COLS
                    + var("aj_tq") * 2i64
                    + var("aj_r") % 2i64,
            )
        };
        vec![
            let_("aj_row", Ty::Index, var("aj_tm") * t + row),
            let_("aj_col", Ty::Index, var("aj_tn") * t + col),
        ]
    };
    let in_c = || var("aj_row").lt(m).and(var("aj_col").lt(n));
    let c_at = || {
        At::Flat(Box::new(
            oc.clone() + var("aj_row") * g.m.strides[0] + var("aj_col") * g.n.strides[0],
        ))
    };
    let each_accumulator = |body| {
        if l.warpgroups {
            unrolled("aj_r", l.accumulators(), body)
        } else {
            unrolled(
                "aj_i",
                fm,
                vec![unrolled("aj_j", fn_, vec![unrolled("aj_r", 4, body)])],
            )
        }
    };
    let mut start = position();
    start.push(assign(acc(), Expr::Lit(Prec::F32, 0.0)));
    if !g.overwrite && split.is_none() {
        start.push(Stmt::If(
            in_c(),
            vec![assign(acc(), Expr::Elem(&g.out, c_at()))],
        ));
    }
    tree.push(each_accumulator(start));
    if tensor_mapped {
        // One invocation makes each buffer's mbarrier expect its one arrival (the one that
        // arms it with its copies' bytes), fenced for the accelerator; the barrier then lets
        // every invocation wait on them.
        let init = (0..l.stages)
            .map(|s| {
                Stmt::Matrix(MatrixOp::BarrierInit {
                    bar: Expr::item(BARRIERS, Expr::from(s)),
                })
            })
            .chain([Stmt::Matrix(MatrixOp::BarrierInitFence)])
            .collect();
        tree.push(Stmt::If(thread_index().equals(0i64), init));
        tree.push(Stmt::Barrier(Barrier::Shared));
    }
    // The first `lookahead` depths in flight, one group of copies each (empty past the last
    // depth, so that the waits count the same however short `k` is).
    let stages = l.stages;
    let lookahead = l.lookahead();
    // Every copied depth lies within `k` where `k` is a multiple of the depth and the group
    // takes every step, at least `lookahead` of them (the first copies are then all real; a
    // slice of a split reduction may be shorter).
    let k_inside = split.is_none() && kk.is_multiple_of(d) && steps >= lookahead;
    let any_async = a.copied_async() || b.copied_async();
    let commit = || Stmt::Matrix(MatrixOp::CommitCopies);
    for s in 0..lookahead {
        let first = |k0: Expr<'static>| {
            let mut first = vec![let_("aj_k0", Ty::Index, k0)];
            first.extend(a.copy(l, kk, k_inside, Expr::from(s)));
            first.extend(b.copy(l, kk, k_inside, Expr::from(s)));
            first.extend(tensor_issue(l, g, &a, &b, Expr::from(s)));
            first
        };
        match split {
            None if s < steps => tree.push(Stmt::Block(first(Expr::from(s * d)))),
            None => {}
            Some(_) => tree.push(Stmt::If(
                Expr::from(s).lt(var("aj_n")),
                first(depth_at(Expr::from(s))),
            )),
        }
        if any_async {
            tree.push(commit());
        }
    }
    // Each step: wait for this depth's copies (the later ones stay in flight), one barrier
    // (every invocation has also finished multiplying the buffer about to be refilled: the
    // previous step's, or where warpgroup products stay in flight for a step, the one before),
    // the copies of the depth `lookahead` ahead, then multiply this one.
    let mut step = Vec::new();
    if tensor_mapped {
        // This buffer's copies have landed: the phase of its `aj_s / stages`-th filling.
        step.push(Stmt::Matrix(MatrixOp::BarrierWait {
            bar: Expr::item(BARRIERS, var("aj_s") % stages),
            parity: (var("aj_s") / stages) % 2i64,
        }));
    }
    if any_async {
        step.push(Stmt::Matrix(MatrixOp::WaitCopies {
            pending: lookahead - 1,
        }));
    }
    if l.warpgroups && (a.tensor.is_none() || b.tensor.is_none()) {
        // Warpgroup products read shared memory through the asynchronous proxy: what this
        // invocation copied or stored there is fenced for it before the barrier publishes it
        // (the accelerator's copies land through that proxy already).
        step.push(Stmt::Matrix(MatrixOp::FenceAsyncProxy));
    }
    step.push(Stmt::Barrier(Barrier::Shared));
    let ahead = || var("aj_s") + lookahead as i64;
    let mut next = vec![let_("aj_k0", Ty::Index, depth_at(ahead()))];
    next.extend(a.copy(l, kk, k_inside, ahead() % stages));
    next.extend(b.copy(l, kk, k_inside, ahead() % stages));
    next.extend(tensor_issue(l, g, &a, &b, ahead() % stages));
    let mut copies = vec![Stmt::If(ahead().lt(count()), next)];
    if any_async {
        // Always a group, empty near the end, so that the waits count the same.
        copies.push(commit());
    }
    let buf = || let_("aj_buf", Ty::Int, var("aj_s") % stages);
    if l.warpgroups {
        if l.async_copy.contains(&false) {
            // Element copies wait for their loads: the step's products are issued first and
            // run meanwhile. The buffer refilled is still one whose products every invocation
            // has waited for before the barrier.
            step.push(buf());
            step.extend(warpgroup_issue(l, &a, &b));
            step.extend(copies);
        } else {
            step.extend(copies);
            step.push(buf());
            step.extend(warpgroup_issue(l, &a, &b));
        }
        step.push(Stmt::Matrix(MatrixOp::WarpgroupWait {
            pending: l.products_in_flight(),
        }));
    } else {
        step.extend(copies);
        step.push(buf());
        step.push(unrolled(
            "aj_kf",
            d / l.kind.fragment_depth(),
            multiply(l, &a, &b),
        ));
    }
    match split {
        // A slice has at least one step: its loop runs the first before testing, so that
        // ptxas sees no path around the warpgroup products (else it serializes them).
        Some(k) if l.warpgroups && k.no_slice_is_empty(steps as u64) => {
            tree.push(Stmt::Repeat {
                var: "aj_s".into(),
                count: count(),
                body: step,
            });
        }
        _ => tree.push(range("aj_s", Ty::Int, 0i64, count(), 1, step)),
    }
    if any_async {
        tree.push(Stmt::Matrix(MatrixOp::WaitCopies { pending: 0 }));
    }
    if l.products_in_flight() > 0 {
        // The last step's products, before their accumulators are read.
        tree.push(Stmt::Matrix(MatrixOp::WarpgroupWait { pending: 0 }));
    }
    let mut finish = position();
    match split {
        None => finish.push(store_result(g, &oc, acc(), epilogue)),
        Some(k) => finish.push(store_partial(g, t, groups, k, acc())),
    }
    tree.push(each_accumulator(finish));
    Some((launched, tree))
}

/// The products of a step on warpgroups: fence the accumulators, one product per fragment
/// depth (`m64nNk16`, or `m64nNk8` for TF32) from buffer `aj_buf` (the warpgroup's 64 rows of
/// the left factor, every column of the right), and commit them. The step then waits for
/// those of the step before (or for these, where none stay in flight:
/// [`MatrixTile::products_in_flight`]).
fn warpgroup_issue<'a>(l: &MatrixTile, a: &Staging<'a>, b: &Staging<'a>) -> Vec<Stmt<'a>> {
    let fd = l.kind.fragment_depth();
    let k0 = || var("aj_kf") * fd;
    let product = Stmt::Matrix(MatrixOp::WarpgroupMultiply {
        kind: l.kind,
        n: l.tile,
        side_major: [!a.k_staged, !b.k_staged],
        depth: l.depth(),
        acc: Expr::item("aj_acc", Expr::Int(0)),
        a: a.at(l, var("aj_buf"), var("aj_wg") * WARPGROUP_ROWS, k0()),
        b: b.at(l, var("aj_buf"), Expr::Int(0), k0()),
    });
    vec![
        Stmt::Matrix(MatrixOp::WarpgroupFence),
        unrolled("aj_kf", l.depth() / fd, vec![product]),
        Stmt::Matrix(MatrixOp::WarpgroupCommit),
    ]
}

/// One fragment depth (`aj_kf`) of a step: the warp's fragments of both factors from buffer
/// `aj_buf`, then every fragment product.
fn multiply<'a>(l: &MatrixTile, a: &Staging<'a>, b: &Staging<'a>) -> Vec<Stmt<'a>> {
    let (fm, fn_) = l.fragments();
    let (wr, wc) = (l.warp_rows(), l.warp_cols());
    let fd = l.kind.fragment_depth();
    let k0 = || var("aj_kf") * fd;
    let buf = || var("aj_buf");
    let row_of = |i: &str| var("aj_wm") * wr + var(i) * FRAGMENT_ROWS;
    let col_of = |j: &str| var("aj_wn") * wc + var(j) * FRAGMENT_COLS;
    let mut out = Vec::new();
    match l.kind {
        MatrixKind::Bf16 | MatrixKind::F16 => {
            // Lane `l` gives a row of matrix `l / 8`: row `l % 8` of it.
            let lane_row = || var("aj_lane") % 8i64;
            let sel_lo = || (var("aj_lane") / 8i64) % 2i64;
            let sel_hi = || var("aj_lane") / 16i64;
            // Left factor: matrices (rows +0, k +0), (rows +8, k +0), (rows +0, k +8),
            // (rows +8, k +8) are words 0 to 3 of the `m16k16` fragment.
            let a_row = a.at(
                l,
                buf(),
                row_of("aj_i") + sel_lo() * 8i64 + lane_row_if(a.k_inner, lane_row()),
                k0() + sel_hi() * 8i64 + lane_row_if(!a.k_inner, lane_row()),
            );
            out.push(unrolled(
                "aj_i",
                fm,
                vec![Stmt::Matrix(MatrixOp::Load {
                    words: Expr::item("aj_fa", var("aj_i") * 4i64),
                    row: a_row,
                    trans: !a.k_inner,
                })],
            ));
            // Right factor, two column fragments at a time: matrices (cols +0, k +0),
            // (cols +0, k +8), (cols +8, k +0), (cols +8, k +8) are words 0, 1 of fragment
            // `aj_j` and 0, 1 of `aj_j + 1`.
            let b_row = b.at(
                l,
                buf(),
                col_of("aj_j") + sel_hi() * 8i64 + lane_row_if(b.k_inner, lane_row()),
                k0() + sel_lo() * 8i64 + lane_row_if(!b.k_inner, lane_row()),
            );
            out.push(Stmt::For {
                var: "aj_j".into(),
                ty: Ty::Int,
                from: Expr::Int(0),
                cond: var("aj_j").lt(fn_),
                next: var("aj_j") + 2i64,
                unroll: true,
                binds: None,
                body: vec![Stmt::Matrix(MatrixOp::Load {
                    words: Expr::item("aj_fb", var("aj_j") * 2i64),
                    row: b_row,
                    trans: !b.k_inner,
                })],
            });
        }
        MatrixKind::Tf32 => {
            // `m16n8k8`: word w of the left fragment is (row g + 8 (w % 2), k t + 4 (w / 2)),
            // word w of the right one (k t + 4 w, column g).
            let g = || var("aj_gq");
            let tq = || var("aj_tq");
            let a_words = (0..4i64)
                .map(|w| {
                    assign(
                        Expr::item("aj_fa", var("aj_i") * 4i64 + w),
                        Expr::Tf32(Box::new(a.at(
                            l,
                            buf(),
                            row_of("aj_i") + g() + (w % 2) * 8,
                            k0() + tq() + (w / 2) * 4,
                        ))),
                    )
                })
                .collect();
            out.push(unrolled("aj_i", fm, a_words));
            let b_words = (0..2i64)
                .map(|w| {
                    assign(
                        Expr::item("aj_fb", var("aj_j") * 2i64 + w),
                        Expr::Tf32(Box::new(b.at(
                            l,
                            buf(),
                            col_of("aj_j") + g(),
                            k0() + tq() + w * 4,
                        ))),
                    )
                })
                .collect();
            out.push(unrolled("aj_j", fn_, b_words));
        }
    }
    out.push(unrolled(
        "aj_i",
        fm,
        vec![unrolled(
            "aj_j",
            fn_,
            vec![Stmt::Matrix(MatrixOp::Multiply {
                kind: l.kind,
                acc: Expr::item("aj_acc", (var("aj_i") * fn_ + var("aj_j")) * 4i64),
                a: Expr::item("aj_fa", var("aj_i") * 4i64),
                b: Expr::item("aj_fb", var("aj_j") * 2i64),
            })],
        )],
    ));
    out
}

/// The lane's row within its 8 × 8 matrix, on the staged axis that is the matrix's row: the
/// contiguous axis's other one. `on_this_axis` says whether this axis is it.
fn lane_row_if(on_this_axis: bool, lane_row: Expr<'static>) -> Expr<'static> {
    if on_this_axis { lane_row } else { Expr::Int(0) }
}
