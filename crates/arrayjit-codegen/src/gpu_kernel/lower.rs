//! The kernel shapes, each written once as a kernel tree lowered from a [`GpuPass`]:
//!
//! - **Zeroing**: one invocation per element (or storage word).
//! - **Grid**: the loops whose iterations are independent become one invocation each; the rest
//!   of the nest runs in the invocation, in program order.
//! - **Rows**: one group per grid point: its reductions run as group reductions (below), its
//!   independent loops stride over the invocations, anything else runs on invocation 0, with a
//!   barrier between statements (later statements read what earlier ones stored).
//! - **Group reduction**: strided shares combined in loop order, then a fixed tree in shared
//!   memory; where the dialect has subgroup shuffles, the tree's last levels run by shuffles
//!   within the first subgroup, combining the same pairs (so the bits are the same).
//! - **Tiled product** (`super::simt`): `tile × tile` results per group of 16 × 16
//!   invocations (`tile / 16` squared each, in runs of 4 neighbours), both factors staged
//!   `[k][side]` in shared memory, double-buffered where that fits, read by 128-bit loads where
//!   their strides allow; each element starts from its value and adds its products in the
//!   order of `k`, fused where the statement fuses them: the bits of the loop nest.
//! - **Matrix-unit product** (`super::matrix`): warps of `mma.sync` fragments, or sm_90's
//!   warpgroups, over a pipeline of staged tiles.
//! - **One invocation**: anything else.

use arrayjit_ir::{Error, LowLevel, Prec, Result};
use arrayjit_opt::schedule::gpu::{
    Accumulation, GpuPass, GridLoop, MAX_GROUP_THREADS, RowRole, TILE_THREADS, row_items,
};

use super::build::{
    array, assign, bound_to, group_index, launch_index, let_, let_mut, range, thread_index, var,
};
use super::pairwise::accumulated_steps;
use super::tiles::split_sums;
use super::{Arith, At, Barrier, Expr, KernelDialect, PassShape, PrintedPass, Stmt, Ty};
use crate::gpu_dialect::grid_inner;

fn render_err<D: KernelDialect>(d: &D, detail: &str) -> Error {
    let (routine, language) = d.routine();
    Error::Render {
        routine: routine.to_string(),
        language: language.into(),
        detail: detail.into(),
    }
}

/// How many kernels a pass launches: none for a pass that does nothing, two for a grid
/// reduction and a split product (their phases), else one.
pub(super) fn kernel_count(pass: &GpuPass) -> usize {
    pass.launches() as usize
}

/// Lowers kernel `k` of the pass (see [`kernel_count`]) and prints it (see the module's doc
/// for the shapes).
pub(super) fn print_kernel<D: KernelDialect>(
    d: &mut D,
    stmt: &LowLevel,
    pass: &GpuPass,
    k: usize,
) -> Result<Option<PrintedPass>> {
    if let GpuPass::Attention(a) = pass {
        return super::attention::print_kernel(d, a, k);
    }
    if let GpuPass::GridReduction {
        total,
        groups,
        chunk,
        threads,
        partials,
        start,
    } = pass
    {
        let r = Accumulation::detect(stmt).ok_or_else(|| {
            render_err(d, "a grid reduction pass for a statement that is not one")
        })?;
        if r.len() != *total {
            return Err(render_err(
                d,
                "a grid reduction pass whose steps are not the statement's",
            ));
        }
        let subgroup = d.syntax().subgroup;
        let (tree, shape) = match k {
            0 => (
                partial_reductions(&r, *chunk, *threads, subgroup, partials),
                PassShape::Rows(*groups),
            ),
            1 => (
                combined_partials(&r, *groups, *threads, subgroup, partials, *start),
                PassShape::Reduction,
            ),
            _ => return Ok(None),
        };
        let mut body = String::new();
        super::print_stmts(d, &tree, 1, &mut body)?;
        return Ok(Some(PrintedPass {
            shape,
            threads: *threads,
            body,
            dynamic_shared_bytes: 0,
        }));
    }
    let split_product = match pass {
        GpuPass::Tiles {
            gemm,
            epilogue,
            split: Some(split),
            ..
        }
        | GpuPass::MatrixTiles {
            gemm,
            epilogue,
            split: Some(split),
            ..
        } => Some((gemm, epilogue, split)),
        _ => None,
    };
    if let Some((gemm, epilogue, split)) = split_product {
        let too_many = || render_err(d, "a product with more tiles than a launch holds");
        let (shape, threads, tree) = match (k, pass) {
            (0, GpuPass::Tiles { fused, layout, .. }) => {
                let (groups, tree) =
                    super::simt::simt_tiled(gemm, *fused, layout, None, Some(split))
                        .ok_or_else(too_many)?;
                (PassShape::Tiles(groups), TILE_THREADS, tree)
            }
            (0, GpuPass::MatrixTiles { layout, groups, .. }) => {
                let (launched, tree) =
                    super::matrix::matrix_tiled(gemm, layout, *groups, None, Some(split))
                        .ok_or_else(too_many)?;
                (PassShape::Tiles(launched), layout.threads(), tree)
            }
            (1, _) => {
                let (total, tree) = split_sums(gemm, split, epilogue.as_ref());
                (PassShape::Grid(total), MAX_GROUP_THREADS, tree)
            }
            _ => return Ok(None),
        };
        let mut body = String::new();
        super::print_stmts(d, &tree, 1, &mut body)?;
        return Ok(Some(PrintedPass {
            shape,
            threads,
            body,
            dynamic_shared_bytes: super::dynamic_shared_bytes(&tree),
        }));
    }
    if k == 0 {
        print_one(d, stmt, pass)
    } else {
        Ok(None)
    }
}

fn print_one<D: KernelDialect>(
    d: &mut D,
    stmt: &LowLevel,
    pass: &GpuPass,
) -> Result<Option<PrintedPass>> {
    let mut body = String::new();
    let (routine, language) = {
        let (r, l) = d.routine();
        (r.to_string(), l)
    };
    let subgroup = d.syntax().subgroup;
    let mut dynamic_shared_bytes = 0;
    let (shape, threads) = match pass {
        // Attention passes print in `super::attention` (above).
        GpuPass::Nothing | GpuPass::GridReduction { .. } | GpuPass::Attention(_) => {
            return Ok(None);
        }
        GpuPass::Zero { threads, .. } => {
            let LowLevel::ZeroOut(tn) = stmt else {
                return Err(render_err(d, "a zeroing pass for another statement"));
            };
            let n = d.zero_extent(tn);
            let tree = vec![Stmt::If(
                launch_index().lt(n),
                vec![Stmt::Zero(tn, launch_index())],
            )];
            super::print_stmts(d, &tree, 1, &mut body)?;
            (PassShape::Zero(n), *threads)
        }
        GpuPass::Tiles {
            gemm,
            fused,
            layout,
            epilogue,
            ..
        } => {
            let (groups, tree) =
                super::simt::simt_tiled(gemm, *fused, layout, epilogue.as_ref(), None).ok_or_else(
                    || render_err(d, "a product with more tiles than a launch holds"),
                )?;
            super::print_stmts(d, &tree, 1, &mut body)?;
            (PassShape::Tiles(groups), TILE_THREADS)
        }
        GpuPass::MatrixTiles {
            gemm,
            layout,
            groups,
            epilogue,
            ..
        } => {
            let (_, tree) =
                super::matrix::matrix_tiled(gemm, layout, *groups, epilogue.as_ref(), None)
                    .ok_or_else(|| {
                        render_err(d, "a product with more tiles than a launch holds")
                    })?;
            super::print_stmts(d, &tree, 1, &mut body)?;
            dynamic_shared_bytes = super::dynamic_shared_bytes(&tree);
            (PassShape::Tiles(*groups), layout.threads())
        }
        GpuPass::Grid {
            grid,
            total,
            threads,
        } => {
            let inner = grid_inner(&routine, language, stmt, grid)?;
            let mut tree = grid_point(launch_index(), *total, grid);
            tree.push(Stmt::Source(&inner));
            super::print_stmts(d, &tree, 1, &mut body)?;
            (PassShape::Grid(*total), *threads)
        }
        GpuPass::Rows {
            grid,
            total,
            threads,
        } => {
            let inner = grid_inner(&routine, language, stmt, grid)?;
            // One group per grid point: the test depends on the group only, so every
            // invocation of a group that goes on reaches every barrier.
            let mut tree = grid_point(group_index(), *total, grid);
            for (pos, item) in row_items(&inner).into_iter().enumerate() {
                let scope = match item.role {
                    RowRole::Reduce(r) => reduction(&r, *threads, subgroup, None),
                    RowRole::Strided {
                        index,
                        from,
                        to,
                        body,
                    } => {
                        let j = format!("aj_j{pos}");
                        let strided = range(
                            &j,
                            Ty::Index,
                            thread_index() + from,
                            to,
                            *threads as i64,
                            vec![Stmt::Source(body)],
                        );
                        vec![bound_to(strided, index)]
                    }
                    RowRole::Lead => vec![Stmt::If(
                        thread_index().equals(0i64),
                        vec![Stmt::Source(item.stmt)],
                    )],
                };
                tree.push(Stmt::Block(scope));
                tree.push(Stmt::Barrier(Barrier::Global));
            }
            super::print_stmts(d, &tree, 1, &mut body)?;
            (PassShape::Rows(*total), *threads)
        }
        GpuPass::Reduction { threads, start } => {
            let r = Accumulation::detect(stmt)
                .ok_or_else(|| render_err(d, "a reduction pass for a statement that is not one"))?;
            let tree = reduction(&r, *threads, subgroup, *start);
            super::print_stmts(d, &tree, 1, &mut body)?;
            (PassShape::Reduction, *threads)
        }
        GpuPass::Single => {
            let tree = vec![
                Stmt::If(launch_index().cmp(Arith::Ne, 0i64), vec![Stmt::Return]),
                Stmt::Source(stmt),
            ];
            super::print_stmts(d, &tree, 1, &mut body)?;
            (PassShape::Single, 1)
        }
    };
    Ok(Some(PrintedPass {
        shape,
        threads,
        body,
        dynamic_shared_bytes,
    }))
}

/// Leaves unless `point` (an invocation's or a group's index) is one of the grid's `total`
/// points, and binds the grid loops' iterators to its digits (innermost fastest).
fn grid_point<'a>(point: Expr<'a>, total: u64, grid: &[GridLoop]) -> Vec<Stmt<'a>> {
    let mut tree = vec![
        Stmt::If(point.clone().ge(total), vec![Stmt::Return]),
        let_mut("aj_r", Ty::Index, point),
    ];
    for (pos, GridLoop { iter, from, to }) in grid.iter().enumerate().rev() {
        tree.push(Stmt::Let {
            name: format!("aj_p{pos}"),
            ty: Ty::Index,
            value: Expr::Int(*from) + var("aj_r") % (to - from),
            mutable: false,
            binds: Some(*iter),
        });
        tree.push(assign(var("aj_r"), var("aj_r") / (to - from)));
    }
    tree
}

/// A group of `threads` (a power of two) reduces the accumulation into its element: strided
/// shares in loop order (pairwise where long: see `pairwise`), then a fixed tree (see
/// [`group_tree`]).
fn reduction<'a>(
    r: &Accumulation<'a>,
    threads: u32,
    subgroup: Option<u32>,
    start: Option<f64>,
) -> Vec<Stmt<'a>> {
    let cp = r.tn.prec().compute_prec();
    let steps = accumulated_steps(r, (Expr::Int(0), Expr::from(r.len()), r.len()), threads);
    group_tree(
        cp,
        r.combine,
        threads,
        subgroup,
        steps,
        store_into(r, start),
    )
}

/// What invocation 0 does with a reduction's result `v`: the element becomes `element ⊕ v`,
/// or `start ⊕ v` where the element was just set to the constant `start`.
fn store_into<'a>(r: &Accumulation<'a>, start: Option<f64>) -> impl Fn(Expr<'a>) -> Stmt<'a> {
    let cp = r.tn.prec().compute_prec();
    let (tn, op, idcs) = (r.tn, r.combine, r.idcs);
    move |v| {
        let before = match start {
            Some(c) => Expr::Lit(cp, c),
            None => Expr::Elem(tn, At::Indices(idcs)),
        };
        Stmt::Store(
            tn,
            At::Indices(idcs),
            Expr::Combine(op, cp, Box::new(before), Box::new(v)),
        )
    }
}

/// A grid reduction's first phase: group `g` reduces steps `g · chunk` up to `(g + 1) ·
/// chunk` (or the last step) and stores the result as element `g` of `partials`.
fn partial_reductions<'a>(
    r: &Accumulation<'a>,
    chunk: u64,
    threads: u32,
    subgroup: Option<u32>,
    partials: &'a arrayjit_ir::Tnode,
) -> Vec<Stmt<'a>> {
    let cp = r.tn.prec().compute_prec();
    let total = r.len();
    let mut tree = vec![
        let_("aj_lo", Ty::Index, group_index() * chunk),
        let_(
            "aj_hi",
            Ty::Index,
            Expr::Select(
                Box::new((var("aj_lo") + chunk).lt(total)),
                Box::new(var("aj_lo") + chunk),
                Box::new(Expr::from(total)),
            ),
        ),
    ];
    let steps = accumulated_steps(r, (var("aj_lo"), var("aj_hi"), chunk), threads);
    tree.extend(group_tree(
        cp,
        r.combine,
        threads,
        subgroup,
        steps,
        move |v| Stmt::Store(partials, At::Flat(Box::new(group_index())), v),
    ));
    tree
}

/// A grid reduction's second phase: one group combines the `groups` partial results in order
/// (strided shares, then the fixed tree), and the element with the result.
fn combined_partials<'a>(
    r: &Accumulation<'a>,
    groups: u64,
    threads: u32,
    subgroup: Option<u32>,
    partials: &'a arrayjit_ir::Tnode,
    start: Option<f64>,
) -> Vec<Stmt<'a>> {
    let cp = r.tn.prec().compute_prec();
    let op = r.combine;
    let steps = range(
        "aj_i",
        Ty::Index,
        thread_index(),
        groups,
        threads as i64,
        vec![assign(
            var("aj_acc"),
            Expr::Combine(
                op,
                cp,
                Box::new(var("aj_acc")),
                Box::new(Expr::Elem(partials, At::Flat(Box::new(var("aj_i"))))),
            ),
        )],
    );
    group_tree(cp, op, threads, subgroup, steps, store_into(r, start))
}

/// A group's reduction: `aj_acc` starts at the neutral element, `steps` (run by each
/// invocation) fill it, then the shares combine in a fixed tree in shared memory, its last
/// levels by subgroup shuffles where the dialect has them and the group holds two subgroups;
/// invocation 0 runs `sink` on the result.
fn group_tree<'a>(
    cp: Prec,
    op: arrayjit_ir::BinOp,
    threads: u32,
    subgroup: Option<u32>,
    steps: Stmt<'a>,
    sink: impl Fn(Expr<'a>) -> Stmt<'a>,
) -> Vec<Stmt<'a>> {
    let ty = Ty::Compute(cp);
    let red = format!("aj_red_{}", cp.name());
    let slot = |i: Expr<'a>| Expr::item(&red, i);
    let combine = |a: Expr<'a>, b: Expr<'a>| Expr::Combine(op, cp, Box::new(a), Box::new(b));
    let store_with = |v: Expr<'a>| Stmt::If(thread_index().equals(0i64), vec![sink(v)]);
    let shuffles = subgroup.filter(|w| threads >= 2 * w);
    let mut tree = vec![
        array(&red, ty, threads as usize, true),
        let_mut("aj_acc", ty, Expr::Lit(cp, op.neutral_element())),
        steps,
        assign(slot(thread_index()), var("aj_acc")),
        Stmt::Barrier(Barrier::Shared),
        Stmt::For {
            var: "aj_s".into(),
            ty: Ty::Int,
            from: Expr::from(threads / 2),
            cond: var("aj_s").ge(shuffles.unwrap_or(1)),
            next: var("aj_s") / 2i64,
            unroll: false,
            binds: None,
            body: vec![
                Stmt::If(
                    thread_index().lt(var("aj_s")),
                    vec![assign(
                        slot(thread_index()),
                        combine(slot(thread_index()), slot(thread_index() + var("aj_s"))),
                    )],
                ),
                Stmt::Barrier(Barrier::Shared),
            ],
        },
    ];
    match shuffles {
        // Lane `l` combines its value with lane `l + s`'s, as the shared levels combine slots
        // `l` and `l + s`. The shuffled value is held in a variable first: every lane must run
        // the shuffle, whatever the combination evaluates.
        Some(w) => tree.push(Stmt::If(
            thread_index().lt(w),
            vec![
                let_mut("aj_v", ty, slot(thread_index())),
                Stmt::For {
                    var: "aj_s".into(),
                    ty: Ty::Int,
                    from: Expr::from(w / 2),
                    cond: var("aj_s").ge(1i64),
                    next: var("aj_s") / 2i64,
                    unroll: false,
                    binds: None,
                    body: vec![
                        let_(
                            "aj_o",
                            ty,
                            Expr::ShuffleDown(Box::new(var("aj_v")), Box::new(var("aj_s"))),
                        ),
                        assign(var("aj_v"), combine(var("aj_v"), var("aj_o"))),
                    ],
                },
                store_with(var("aj_v")),
            ],
        )),
        None => tree.push(store_with(slot(Expr::Int(0)))),
    }
    tree
}
