//! The `f32` tiled product ([`GpuPass::Tiles`](arrayjit_opt::schedule::GpuPass::Tiles)) as a
//! kernel tree, in the layout [`arrayjit_opt::schedule::gpu::simt`] decides and explains:
//!
//! - **Staging.** Each factor's `depth × tile` tile is stored `[k][side]` in shared memory
//!   (rows padded); invocations read the factor along its contiguous axis, by 128-bit loads
//!   ([`Stmt::LoadVector`]) where the layout says so, else element by element, into
//!   registers, then store the registers into the staged tile.
//! - **Steps.** Double-buffered: the first depth is staged before the loop; each step loads
//!   the next depth into registers, multiplies the current buffer, stores the registers into
//!   the other buffer, and ends with one barrier. Single-buffered: load, store, barrier,
//!   multiply, barrier.
//! - **Multiplying** one `k` reads the invocation's runs of both factors (whole runs of 4:
//!   one 128-bit shared load each, where the compiler proves the alignment the layout gives)
//!   and updates every register; the `k` loop is unrolled where the depth is whole.
//! - **Results** start from zero where the product overwrites them (its zeroing absorbed),
//!   else from their values, and are stored once, under bounds tests; then the product's
//!   epilogue, if it has one, runs on each stored element.
//! - **Split reductions** ([`KSplit`]): the first kernel runs the tiles once per slice, each
//!   group taking its slice's depth steps from zero and storing its sums into its block of the
//!   partial results; the second (`lower::split_sums`) runs one invocation per result, adding the
//!   slices in order to the result's start, then storing it as above (shared with the
//!   matrix-unit products).

use arrayjit_ir::Prec;
use arrayjit_opt::schedule::Gemm;
use arrayjit_opt::schedule::gpu::{Epilogue, KSplit, SimtTile, TILE_THREADS};

use super::build::{array, assign, let_, range, thread_index, unrolled, var};
use super::tiles::{Factor, split_group_tile, store_partial, store_result};
use super::{At, Barrier, Expr, Stmt, Ty};

/// Elements of one 128-bit factor load.
const LANES: usize = arrayjit_opt::schedule::gpu::simt::RESULT_RUN;

/// One factor's staging.
struct Staging<'a> {
    /// The factor.
    factor: Factor<'a>,
    /// Its shared array (all buffers) and its registers for one depth.
    shared: &'static str,
    registers: &'static str,
    /// Elements each load reads: 4 (a 128-bit load) or 1.
    lanes: usize,
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
    fn of(g: &'a Gemm, l: &SimtTile, f: usize, base: Expr<'static>) -> Staging<'a> {
        let (shared, registers) = if f == 1 {
            ("aj_ta", "aj_pa")
        } else {
            ("aj_tb", "aj_pb")
        };
        Staging {
            factor: Factor::of(g, l.tile, f, base),
            shared,
            registers,
            lanes: if l.vector[f - 1] { LANES } else { 1 },
        }
    }

    /// The item of buffer `buf` at tile position (`k`, `side`).
    fn at(&self, l: &SimtTile, buf: Expr<'a>, k: Expr<'a>, side: Expr<'a>) -> Expr<'a> {
        Expr::item(
            self.shared,
            buf * l.staged_elements() + k * l.pitch() + side,
        )
    }

    /// Loads of one depth: `aj_q` of them per invocation, each of `lanes` elements.
    fn loads(&self, l: &SimtTile) -> usize {
        l.loads_per_invocation() / self.lanes
    }

    /// The tile position (`aj_sk`, `aj_ss`) of load `aj_q` of this invocation: neighbouring
    /// invocations take neighbouring runs of the factor's contiguous axis.
    fn position(&self, l: &SimtTile) -> Vec<Stmt<'a>> {
        let inner = if self.k_inner { l.depth() } else { l.tile } / self.lanes;
        let (k, side) = if self.k_inner {
            ((var("aj_e") % inner) * self.lanes, var("aj_e") / inner)
        } else {
            (var("aj_e") / inner, (var("aj_e") % inner) * self.lanes)
        };
        vec![
            let_("aj_e", Ty::Int, thread_index() + var("aj_q") * TILE_THREADS),
            let_("aj_sk", Ty::Int, k),
            let_("aj_ss", Ty::Int, side),
        ]
    }

    /// The statements reading the depth from `k0` into this factor's registers (zero outside
    /// the factor; a 128-bit load is whole or none, as the extents are multiples of 4).
    fn load(&self, l: &SimtTile, kk: usize, k0: Expr<'static>) -> Stmt<'a> {
        let mut body = self.position(l);
        body.extend([
            let_("aj_gs", Ty::Index, self.origin.clone() + var("aj_ss")),
            let_("aj_gk", Ty::Index, k0 + var("aj_sk")),
        ]);
        let exists = var("aj_gs").lt(self.side.0).and(var("aj_gk").lt(kk));
        let offset = self.offset(var("aj_gs"), var("aj_gk"));
        let first = var("aj_q") * self.lanes;
        let load = if self.lanes > 1 {
            Stmt::LoadVector {
                array: self.registers.to_string(),
                first: first.clone(),
                src: self.tn,
                offset,
                lanes: self.lanes,
            }
        } else {
            assign(
                Expr::item(self.registers, first.clone()),
                Expr::Elem(self.tn, At::Flat(Box::new(offset))),
            )
        };
        body.push(unrolled(
            "aj_c",
            self.lanes,
            vec![assign(
                Expr::item(self.registers, first + var("aj_c")),
                Expr::Lit(Prec::F32, 0.0),
            )],
        ));
        body.push(Stmt::If(exists, vec![load]));
        unrolled("aj_q", self.loads(l), body)
    }

    /// The statements storing this factor's registers into buffer `buf`.
    fn stash(&self, l: &SimtTile, buf: Expr<'static>) -> Stmt<'a> {
        let mut body = self.position(l);
        let (k, side) = if self.k_inner {
            (var("aj_sk") + var("aj_c"), var("aj_ss"))
        } else {
            (var("aj_sk"), var("aj_ss") + var("aj_c"))
        };
        body.push(unrolled(
            "aj_c",
            self.lanes,
            vec![assign(
                self.at(l, buf, k, side),
                Expr::item(self.registers, var("aj_q") * self.lanes + var("aj_c")),
            )],
        ));
        unrolled("aj_q", self.loads(l), body)
    }
}

/// Result `i` of an invocation along a side, relative to the tile: lane `lane`'s runs of
/// `run`, 16 · `run` apart.
fn in_tile(lane: &str, i: &str, l: &SimtTile) -> Expr<'static> {
    let w = l.run();
    if w == l.per_side() {
        var(lane) * w + var(i)
    } else {
        var(lane) * w + var(i) % w + (var(i) / w) * (16 * w)
    }
}

/// For a guarded product ([`Gemm::guard`]): the least and greatest value of the guard without
/// its depth term over the group's `tile × tile` results (`aj_gmin`, `aj_gmax`), and the
/// group's first and end depth step where it passes for some result (`aj_sf`, `aj_se`), within
/// `first..end`. Every invocation of the group computes the same bounds, so its barriers stay
/// uniform.
fn guard_steps(
    [gi, gj, gk, g0]: [i64; 4],
    t: usize,
    d: usize,
    first: Expr<'static>,
    end: Expr<'static>,
) -> Vec<Stmt<'static>> {
    let side = |name: &str| (var(name) * t, var(name) * t + (t as i64 - 1));
    let (rows, cols) = (side("aj_tm"), side("aj_tn"));
    // The least (`most` false) or greatest value of `c · x` for x in `lo..=hi`.
    let term = |c: i64, (lo, hi): (Expr<'static>, Expr<'static>), most: bool| match c {
        0 => Expr::Int(0),
        c if (c > 0) == most => hi * c,
        c => lo * c,
    };
    let bound =
        |most: bool| term(gi, rows.clone(), most) + term(gj, cols.clone(), most) + Expr::Int(g0);
    let select = |c: Expr<'static>, a: Expr<'static>, b: Expr<'static>| {
        Expr::Select(Box::new(c), Box::new(a), Box::new(b))
    };
    let max = |a: Expr<'static>, b: Expr<'static>| select(a.clone().lt(b.clone()), b, a);
    let min = |a: Expr<'static>, b: Expr<'static>| select(a.clone().lt(b.clone()), a, b);
    let d = d as i64;
    let (sf, se) = match gk {
        // Terms pass from depth -gmax on: from its step.
        1.. => {
            let from = Expr::Int(0) - var("aj_gmax");
            (
                max(first, select(from.clone().lt(0i64), Expr::Int(0), from / d)),
                end,
            )
        }
        // Terms pass up to depth gmax: to its step.
        ..=-1 => {
            let to = select(
                var("aj_gmax").lt(0i64),
                Expr::Int(0),
                var("aj_gmax") / d + 1i64,
            );
            (first, min(end, to))
        }
        0 => (first.clone(), select(var("aj_gmax").lt(0i64), first, end)),
    };
    vec![
        let_("aj_gmin", Ty::Index, bound(false)),
        let_("aj_gmax", Ty::Index, bound(true)),
        let_("aj_sf", Ty::Index, sf),
        let_("aj_se", Ty::Index, se),
    ]
}

/// The tiled `f32` product: the number of groups and the tree (`None`: more groups than a
/// launch of 32-bit group indices holds). With `split`, its first kernel: each slice of the
/// reduction by groups of its own, into the partial results (no epilogue then).
pub(super) fn simt_tiled<'a>(
    g: &'a Gemm,
    fused: bool,
    l: &SimtTile,
    epilogue: Option<&'a Epilogue>,
    split: Option<&'a KSplit>,
) -> Option<(u64, Vec<Stmt<'a>>)> {
    let d = l.depth();
    let f32 = Ty::Compute(Prec::F32);
    let t = l.tile;
    let r = l.per_side();
    let (m, n, kk) = (g.m.extent, g.n.extent, g.k.extent);
    let batch: usize = g.batch.iter().map(|d| d.extent).product();
    let groups = (m.div_ceil(t) * n.div_ceil(t) * batch) as u64;
    let steps = kk.div_ceil(d);
    // The group's slice and tile; the depth steps it takes, `aj_s0` up to `aj_s1`, where the
    // reduction is split.
    let (mut tree, [oc, oa, ob], launched) = split_group_tile(g, t, groups, steps, split, l.order)?;
    let a = Staging::of(g, l, 1, oa);
    let b = Staging::of(g, l, 2, ob);
    let c_at = || {
        At::Flat(Box::new(
            oc.clone() + var("aj_row") * g.m.strides[0] + var("aj_col") * g.n.strides[0],
        ))
    };
    let acc = || Expr::item("aj_acc", var("aj_i") * r + var("aj_j"));
    // The result element of register (aj_i, aj_j).
    let position = || {
        vec![
            let_(
                "aj_row",
                Ty::Index,
                var("aj_tm") * t + in_tile("aj_ty", "aj_i", l),
            ),
            let_(
                "aj_col",
                Ty::Index,
                var("aj_tn") * t + in_tile("aj_tx", "aj_j", l),
            ),
        ]
    };
    let in_c = || var("aj_row").lt(m).and(var("aj_col").lt(n));
    let registers = |body: Vec<Stmt<'a>>| unrolled("aj_i", r, vec![unrolled("aj_j", r, body)]);
    let mut start = position();
    start.push(assign(acc(), Expr::Lit(Prec::F32, 0.0)));
    // From the element's value, unless the product overwrites it (its zeroing absorbed) or
    // this is one slice of its reduction.
    if !g.overwrite && split.is_none() {
        start.push(Stmt::If(
            in_c(),
            vec![assign(acc(), Expr::Elem(&g.out, c_at()))],
        ));
    }
    // The guard's value at register (aj_i, aj_j) and depth `k`.
    let guard_at = |[gi, gj, gk, g0]: [i64; 4], k: Expr<'static>| {
        let row = var("aj_tm") * t + in_tile("aj_ty", "aj_i", l);
        let col = var("aj_tn") * t + in_tile("aj_tx", "aj_j", l);
        [(gi, row), (gj, col), (gk, k)]
            .into_iter()
            .filter(|(c, _)| *c != 0)
            .fold(Expr::Int(g0), |acc, (c, x)| acc + x * c)
    };
    // One `k` (`aj_kk`) of buffer `aj_buf`: the invocation's runs of both factors, then every
    // register (where `guarded`, only the terms where the guard passes).
    let one_k = |guarded: bool| {
        let update = assign(
            acc(),
            Expr::MulAdd {
                fused,
                acc: Box::new(acc()),
                x: Box::new(Expr::item("aj_x", var("aj_i"))),
                y: Box::new(Expr::item("aj_y", var("aj_j"))),
            },
        );
        let update = match g.guard {
            Some(guard) if guarded => Stmt::If(
                guard_at(guard, var("aj_k0") + var("aj_kk")).ge(0i64),
                vec![update],
            ),
            _ => update,
        };
        vec![
            array("aj_x", f32, r, false),
            array("aj_y", f32, r, false),
            unrolled(
                "aj_i",
                r,
                vec![assign(
                    Expr::item("aj_x", var("aj_i")),
                    a.at(l, var("aj_buf"), var("aj_kk"), in_tile("aj_ty", "aj_i", l)),
                )],
            ),
            unrolled(
                "aj_j",
                r,
                vec![assign(
                    Expr::item("aj_y", var("aj_j")),
                    b.at(l, var("aj_buf"), var("aj_kk"), in_tile("aj_tx", "aj_j", l)),
                )],
            ),
            registers(vec![update]),
        ]
    };
    // The depth from `aj_k0`: unrolled where it is whole.
    let multiply_as = |guarded: bool| {
        let whole = unrolled("aj_kk", d, one_k(guarded));
        if kk.is_multiple_of(d) {
            whole
        } else {
            let left = var("aj_k") - var("aj_k0");
            let partial = range("aj_kk", Ty::Int, 0i64, left.clone(), 1, one_k(guarded));
            Stmt::Block(vec![
                Stmt::If(left.clone().ge(d), vec![whole]),
                Stmt::If(left.lt(d), vec![partial]),
            ])
        }
    };
    // With a guard, a depth step where it passes for every element of the group's tile
    // multiplies as usual; one where it fails for some checks each term (the steps where it
    // fails for all are not taken, see `aj_sf` and `aj_se`).
    let multiply = || match g.guard {
        None => multiply_as(false),
        Some([_, _, gk, _]) => {
            let k_end = if gk > 0 {
                var("aj_k0")
            } else {
                var("aj_k0") + (d as i64 - 1)
            };
            let least = if gk == 0 {
                var("aj_gmin")
            } else {
                var("aj_gmin") + k_end * gk
            };
            Stmt::Block(vec![
                Stmt::If(least.clone().ge(0i64), vec![multiply_as(false)]),
                Stmt::If(least.lt(0i64), vec![multiply_as(true)]),
            ])
        }
    };
    tree.extend([
        array("aj_ta", f32, l.stages * l.staged_elements(), true),
        array("aj_tb", f32, l.stages * l.staged_elements(), true),
        let_("aj_tx", Ty::Int, thread_index() % 16i64),
        let_("aj_ty", Ty::Int, thread_index() / 16i64),
        let_("aj_k", Ty::Index, Expr::from(kk)),
        array("aj_acc", f32, r * r, false),
        array("aj_pa", f32, l.loads_per_invocation(), false),
        array("aj_pb", f32, l.loads_per_invocation(), false),
        registers(start),
    ]);
    let depth_of = |s: Expr<'static>| s * d;
    // The group's first and end step, and the buffer of step `aj_s` (the group's own count
    // from 0): the whole reduction's unless it is split.
    let (mut first, mut end) = match split {
        None => (Expr::Int(0), Expr::from(steps)),
        Some(_) => (var("aj_s0"), var("aj_s1")),
    };
    if let Some(guard) = g.guard {
        // Only the steps where the guard passes for some element of the tile.
        tree.extend(guard_steps(guard, t, d, first, end));
        (first, end) = (var("aj_sf"), var("aj_se"));
    }
    let first_depth = match (split, g.guard) {
        (None, None) => Expr::Int(0),
        _ => depth_of(first.clone()),
    };
    let counted = || match (split, g.guard) {
        (None, None) => var("aj_s"),
        (Some(_), None) => var("aj_s") - var("aj_s0"),
        (_, Some(_)) => var("aj_s") - var("aj_sf"),
    };
    if l.stages > 1 {
        // The first depth into buffer 0, then: load the next, multiply, store, one barrier.
        // (Buffers alternate from the group's first step.)
        tree.extend([
            a.load(l, kk, first_depth.clone()),
            b.load(l, kk, first_depth),
            a.stash(l, Expr::Int(0)),
            b.stash(l, Expr::Int(0)),
            Stmt::Barrier(Barrier::Shared),
        ]);
        let next = || (var("aj_s") + 1i64).lt(end.clone());
        let other = || (counted() + 1i64) % 2i64;
        let step = vec![
            let_("aj_buf", Ty::Int, counted() % 2i64),
            let_("aj_k0", Ty::Index, depth_of(var("aj_s"))),
            Stmt::If(
                next(),
                vec![
                    a.load(l, kk, depth_of(var("aj_s") + 1i64)),
                    b.load(l, kk, depth_of(var("aj_s") + 1i64)),
                ],
            ),
            multiply(),
            Stmt::If(next(), vec![a.stash(l, other()), b.stash(l, other())]),
            Stmt::Barrier(Barrier::Shared),
        ];
        tree.push(range("aj_s", Ty::Int, first.clone(), end.clone(), 1, step));
    } else {
        let step = vec![
            let_("aj_buf", Ty::Int, Expr::Int(0)),
            let_("aj_k0", Ty::Index, depth_of(var("aj_s"))),
            a.load(l, kk, var("aj_k0")),
            b.load(l, kk, var("aj_k0")),
            a.stash(l, Expr::Int(0)),
            b.stash(l, Expr::Int(0)),
            Stmt::Barrier(Barrier::Shared),
            multiply(),
            Stmt::Barrier(Barrier::Shared),
        ];
        tree.push(range("aj_s", Ty::Int, first.clone(), end.clone(), 1, step));
    }
    let mut finish = position();
    match split {
        None => finish.push(store_result(g, &oc, acc(), epilogue)),
        Some(k) => finish.push(store_partial(g, t, groups, k, acc())),
    }
    tree.push(registers(finish));
    Some((launched, tree))
}
