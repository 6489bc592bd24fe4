//! The pieces every tiled product shares (SIMT tiles, matrix-unit tiles, split sums): the
//! factors as a group stages them, the group's tile of results, partial sums of a split
//! depth and their combination, batch offsets, and the result's store with its epilogue.

use arrayjit_ir::{BinOp, Prec, Tnode};
use arrayjit_opt::schedule::Gemm;
use arrayjit_opt::schedule::gpu::{Epilogue, KSplit, TileOrder};

use super::build::{assign, group_index, launch_index, let_, let_mut, range, var};
use super::{At, Expr, Stmt, Ty};

/// Stores `value` as the result element (`aj_row`, `aj_col`) of a tiled product whose batch
/// element starts at `oc`, where it exists, then runs the product's epilogue on it.
pub(super) fn store_result<'a>(
    g: &'a Gemm,
    oc: &Expr<'static>,
    value: Expr<'a>,
    epilogue: Option<&'a Epilogue>,
) -> Stmt<'a> {
    let flat = oc.clone() + var("aj_row") * g.m.strides[0] + var("aj_col") * g.n.strides[0];
    let mut store = vec![Stmt::Store(&g.out, At::Flat(Box::new(flat.clone())), value)];
    if let Some(e) = epilogue {
        store.extend(epilogue_stmts(e, &g.out, flat));
    }
    let exists = var("aj_row")
        .lt(g.m.extent)
        .and(var("aj_col").lt(g.n.extent));
    Stmt::If(exists, store)
}

/// A product's epilogue for the result element at flat offset `flat` of `out`, just stored:
/// the epilogue's iterators bound to the element's index on each axis, then its assignment.
pub(super) fn epilogue_stmts<'a>(
    e: &'a Epilogue,
    out: &Tnode,
    flat: Expr<'static>,
) -> Vec<Stmt<'a>> {
    let dims = out.dims();
    let mut stmts = vec![let_("aj_ef", Ty::Index, flat)];
    for (k, &sym) in e.iters.iter().enumerate() {
        let stride: usize = dims[k + 1..].iter().product();
        stmts.push(Stmt::Let {
            name: format!("aj_ex{k}"),
            ty: Ty::Index,
            value: (var("aj_ef") / stride) % dims[k],
            mutable: false,
            binds: Some(sym),
        });
    }
    stmts.push(Stmt::Source(&e.stmt));
    stmts
}

/// One factor of a tiled product as a group stages it: where its batch element starts, its
/// result-side axis and `k` axis, the group's tile origin on the result side, and whether `k`
/// is the axis its group reads along (its contiguous one).
pub(super) struct Factor<'a> {
    /// The factor.
    pub tn: &'a Tnode,
    /// The batch element's offset in the factor.
    pub base: Expr<'static>,
    /// Extent and stride of its result-side axis (rows of the left factor, columns of the
    /// right).
    pub side: (usize, usize),
    /// Stride of its `k` axis.
    pub k_stride: usize,
    /// The tile's origin on the result-side axis (`aj_tm · tile` or `aj_tn · tile`).
    pub origin: Expr<'static>,
    /// `k` is its contiguous axis (else the result side is).
    pub k_inner: bool,
}

impl<'a> Factor<'a> {
    /// Factor `f` of `g` (1: left, 2: right) in `tile`-tiles, its batch element at `base`.
    pub fn of(g: &'a Gemm, tile: usize, f: usize, base: Expr<'static>) -> Factor<'a> {
        let (tn, side, tile_var) = if f == 1 {
            (&g.lhs, &g.m, "aj_tm")
        } else {
            (&g.rhs, &g.n, "aj_tn")
        };
        Factor {
            tn,
            base,
            side: (side.extent, side.strides[f]),
            k_stride: g.k.strides[f],
            origin: var(tile_var) * tile,
            k_inner: arrayjit_opt::schedule::gpu::simt::k_contiguous(g, f),
        }
    }

    /// The flat offset of its element at result-side position `side` and `k` position `k`
    /// (both within the whole factor).
    pub fn offset(&self, side: Expr<'static>, k: Expr<'static>) -> Expr<'static> {
        self.base.clone() + side * self.side.1 + k * self.k_stride
    }
}

/// The start of a tiled product's group: leave if past the last tile, then the tile's
/// position (`aj_tm`, `aj_tn`: its row and column among the tiles of side `t`, in `order`, as
/// [`TileOrder::tile`] computes it) and the batch element's offset in the result and each
/// factor.
pub(super) fn group_tile<'a>(
    g: &Gemm,
    t: usize,
    groups: u64,
    index: Expr<'static>,
    order: TileOrder,
) -> (Vec<Stmt<'a>>, [Expr<'static>; 3]) {
    let (tiles_m, tiles_n) = (g.m.extent.div_ceil(t), g.n.extent.div_ceil(t));
    let mut tree = vec![Stmt::If(index.clone().ge(groups), vec![Stmt::Return])];
    if order.band_rows > 1 {
        // The tile within its batch element, its band's first row and rows (the last band
        // has the rows left), then its place in the band, column by column.
        let band = order.band_rows;
        let per_band = band * tiles_n;
        tree.extend([
            let_("aj_ti", Ty::Index, index.clone() % (tiles_m * tiles_n)),
            let_("aj_tf", Ty::Index, var("aj_ti") / per_band * band),
            let_mut("aj_tr", Ty::Index, Expr::from(band)),
            Stmt::If(
                Expr::from(tiles_m).lt(var("aj_tf") + band),
                vec![assign(var("aj_tr"), Expr::from(tiles_m) - var("aj_tf"))],
            ),
            let_("aj_tw", Ty::Index, var("aj_ti") % per_band),
            let_(
                "aj_tm",
                Ty::Index,
                var("aj_tf") + var("aj_tw") % var("aj_tr"),
            ),
            let_("aj_tn", Ty::Index, var("aj_tw") / var("aj_tr")),
        ]);
    } else {
        tree.extend([
            let_("aj_tn", Ty::Index, index.clone() % tiles_n),
            let_("aj_tm", Ty::Index, (index.clone() / tiles_n) % tiles_m),
        ]);
    }
    tree.push(let_mut("aj_bt", Ty::Index, index / (tiles_n * tiles_m)));
    let (batch, offsets) = batch_offsets(g, "aj_bt");
    tree.extend(batch);
    (tree, offsets)
}

/// The group's place in a product of `groups` groups of `t`-tiles (see [`group_tile`]),
/// `steps` depth steps long; where its reduction is split, first its slice: `aj_sl`, its
/// group among the tiles `aj_gt`, and its steps `aj_s0` up to `aj_s1` (`aj_n` of them).
/// Returns the tree, the result's and factors' offsets, and the launch's groups (`None`: more
/// than 32-bit group indices hold).
pub(super) fn split_group_tile<'a>(
    g: &Gemm,
    t: usize,
    groups: u64,
    steps: usize,
    split: Option<&KSplit>,
    order: TileOrder,
) -> Option<(Vec<Stmt<'a>>, [Expr<'static>; 3], u64)> {
    let launched = groups.checked_mul(split.map_or(1, |k| k.slices))?;
    if launched > u32::MAX as u64 {
        return None;
    }
    let Some(k) = split else {
        let (tree, offsets) = group_tile(g, t, groups, group_index(), order);
        return Some((tree, offsets, launched));
    };
    let mut tree = vec![
        Stmt::If(group_index().ge(launched), vec![Stmt::Return]),
        let_("aj_sl", Ty::Index, group_index() / groups),
        let_("aj_gt", Ty::Index, group_index() % groups),
        let_("aj_s0", Ty::Int, var("aj_sl") * k.steps),
        let_mut("aj_s1", Ty::Int, var("aj_s0") + k.steps),
        Stmt::If(
            Expr::from(steps).lt(var("aj_s1")),
            vec![assign(var("aj_s1"), Expr::from(steps))],
        ),
        let_("aj_n", Ty::Int, var("aj_s1") - var("aj_s0")),
    ];
    let (rest, offsets) = group_tile(g, t, groups, var("aj_gt"), order);
    tree.extend(rest);
    Some((tree, offsets, launched))
}

/// Stores `value` as the partial sum of result (`aj_row`, `aj_col`) of the group's slice
/// (`aj_sl`, its tile group `aj_gt` among `groups` of `t`-tiles) into the split's partial
/// results, where the result exists.
pub(super) fn store_partial<'a>(
    g: &Gemm,
    t: usize,
    groups: u64,
    split: &'a KSplit,
    value: Expr<'a>,
) -> Stmt<'a> {
    let (m, n) = (g.m.extent as i64, g.n.extent as i64);
    let tiles = (g.m.extent.div_ceil(t) * g.n.extent.div_ceil(t)) as i64;
    let flat =
        ((var("aj_sl") * (groups as i64 / tiles) + var("aj_gt") / tiles) * m + var("aj_row")) * n
            + var("aj_col");
    let exists = var("aj_row").lt(m).and(var("aj_col").lt(n));
    Stmt::If(
        exists,
        vec![Stmt::Store(
            &split.partials,
            At::Flat(Box::new(flat)),
            value,
        )],
    )
}

/// The second kernel of a split product: one invocation per result (batch element, row,
/// column: `total` of them) adds the slices' partial sums in slice order to the result's
/// start, then stores it and runs the epilogue.
pub(super) fn split_sums<'a>(
    g: &'a Gemm,
    split: &'a KSplit,
    epilogue: Option<&'a Epilogue>,
) -> (u64, Vec<Stmt<'a>>) {
    let (m, n) = (g.m.extent as i64, g.n.extent as i64);
    let batch: i64 = g.batch.iter().map(|d| d.extent as i64).product();
    let total = (batch * m * n) as u64;
    let block = batch * m * n;
    let mut tree = vec![
        Stmt::If(launch_index().ge(total), vec![Stmt::Return]),
        let_("aj_col", Ty::Index, launch_index() % n),
        let_("aj_row", Ty::Index, (launch_index() / n) % m),
        let_mut("aj_bt", Ty::Index, launch_index() / (m * n)),
    ];
    let (batch_tree, [oc, ..]) = batch_offsets(g, "aj_bt");
    tree.extend(batch_tree);
    let f32 = Ty::Compute(Prec::F32);
    let start = if g.overwrite {
        Expr::Lit(Prec::F32, 0.0)
    } else {
        let at = oc.clone() + var("aj_row") * g.m.strides[0] + var("aj_col") * g.n.strides[0];
        Expr::Elem(&g.out, At::Flat(Box::new(at)))
    };
    tree.push(let_mut("aj_v", f32, start));
    let slice = Expr::Elem(
        &split.partials,
        At::Flat(Box::new(var("aj_sl") * block + launch_index())),
    );
    tree.push(range(
        "aj_sl",
        Ty::Index,
        0i64,
        split.slices as i64,
        1,
        vec![assign(
            var("aj_v"),
            Expr::Combine(
                BinOp::Add,
                Prec::F32,
                Box::new(var("aj_v")),
                Box::new(slice),
            ),
        )],
    ));
    tree.push(store_result(g, &oc, var("aj_v"), epilogue));
    (total, tree)
}

/// The batch element whose flat index (last batch axis fastest) the mutable variable `flat`
/// holds (consumed): one index per batch axis, and where the element starts in the result and
/// in each factor.
pub(super) fn batch_offsets<'a>(g: &Gemm, flat: &str) -> (Vec<Stmt<'a>>, [Expr<'static>; 3]) {
    let mut tree = Vec::new();
    let mut offsets: [Expr<'static>; 3] = [Expr::Int(0), Expr::Int(0), Expr::Int(0)];
    for (d, dim) in g.batch.iter().enumerate().rev() {
        let b = format!("aj_b{d}");
        tree.push(let_(&b, Ty::Index, var(flat) % dim.extent));
        tree.push(assign(var(flat), var(flat) / dim.extent));
        for (o, stride) in offsets.iter_mut().zip(dim.strides) {
            if stride != 0 {
                *o = o.clone() + var(&b) * stride;
            }
        }
    }
    (tree, offsets)
}
