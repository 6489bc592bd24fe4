//! The GPU restructuring and planning of statements, on hand-built loop code.

use super::*;
use crate::schedule::{Schedule, ScheduleKind, ScheduleTuning};
use arrayjit_ir::indexing::{AxisIndex, Symbol};
use arrayjit_ir::low_level::ScopeId;
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};
use arrayjit_ir::ops::BinOp;
use arrayjit_ir::prec::Prec;
use arrayjit_ir::tnode::Tnode;

fn node(label: &str, dims: &[usize]) -> Tnode {
    Tnode::new(Prec::F32, dims, &[label]).unwrap()
}

fn for_(index: Symbol, to: i64, body: LowLevel) -> LowLevel {
    LowLevel::For {
        index,
        from: 0,
        to,
        body: Box::new(body),
    }
}

fn get(tn: &Tnode, syms: &[Symbol]) -> ScalarExpr {
    ScalarExpr::Get(
        tn.clone(),
        syms.iter().map(|&s| AxisIndex::Iterator(s)).collect(),
    )
}

fn set(tn: &Tnode, syms: &[Symbol], value: ScalarExpr) -> LowLevel {
    LowLevel::Set {
        tn: tn.clone(),
        idcs: syms.iter().map(|&s| AxisIndex::Iterator(s)).collect(),
        value,
    }
}

fn h100() -> GpuLimits {
    DeviceModel::h100().limits
}

/// `loss[] := (v: { v := 0; for i, j { v := v + x[i, j] } }) * 0.5` becomes an accumulation into
/// a local node run over the whole grid from 0 (the zeroing runs nothing), and the scaling on
/// one invocation.
#[test]
fn a_scoped_sum_in_a_scalar_statement_becomes_a_grid_reduction() {
    let x = node("x", &[300, 400]);
    let loss = node("loss", &[]);
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let id = ScopeId::fresh(Prec::F32);
    let scope = ScalarExpr::LocalScope {
        id,
        body: Box::new(LowLevel::Seq(vec![
            LowLevel::SetLocal(id, ScalarExpr::Constant(0.0)),
            for_(
                i,
                300,
                for_(
                    j,
                    400,
                    LowLevel::SetLocal(
                        id,
                        ScalarExpr::binop(BinOp::Add, ScalarExpr::GetLocal(id), get(&x, &[i, j])),
                    ),
                ),
            ),
        ])),
    };
    let stmt = set(
        &loss,
        &[],
        ScalarExpr::binop(BinOp::Mul, scope, ScalarExpr::Constant(0.5)),
    );
    assert!(analysis::operations(&stmt) >= 120_000);
    assert_eq!(longest_reduction(&stmt), 120_000);
    let (code, notes, made) = restructure(stmt, &h100(), &ScheduleTuning::default(), true);
    assert_eq!(made.len(), 1);
    assert!(made[0].modes().is_local());
    let stmts: Vec<&LowLevel> = match &code {
        LowLevel::Seq(items) => items.iter().collect(),
        s => vec![s],
    };
    assert_eq!(stmts.len(), 3, "{code}");
    assert!(
        notes
            .iter()
            .all(|n| n.as_deref().is_some_and(|n| n.contains("hoisted")))
    );
    let acc = Accumulation::detect(stmts[1]).expect("an accumulation over two loops");
    assert_eq!((acc.loops.len(), acc.len()), (2, 120_000));
    let schedules = gpu_schedules(&stmts, &h100(), &ScheduleTuning::default(), false);
    let pass = |k: usize| match &schedules[k].kind {
        ScheduleKind::Gpu(p) => p.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(pass(0), GpuPass::Nothing);
    match pass(1) {
        GpuPass::GridReduction {
            total,
            groups,
            chunk,
            start,
            partials,
            ..
        } => {
            assert_eq!(total, 120_000);
            assert!(groups >= 2 && groups * chunk >= total && (groups - 1) * chunk < total);
            assert_eq!(start, Some(0.0));
            assert_eq!(partials.dims(), &[groups as usize]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(pass(2), GpuPass::Single);
}

/// Two statements fused under a batch loop of 4 points, each with loops of its own, are
/// distributed into nests whose grids cover all their loops; the same nest on a device whose
/// invocations the 4 points already fill is left whole. A loop whose iterations depend on each
/// other is never distributed.
#[test]
fn a_fused_nest_under_a_small_loop_is_distributed_where_the_device_calls_for_it() {
    let x = node("x", &[4, 8, 64]);
    let y = node("y", &[4, 8, 64]);
    let z = node("z", &[4, 8, 64]);
    let (b, h, k, h2, k2) = (
        Symbol::fresh(),
        Symbol::fresh(),
        Symbol::fresh(),
        Symbol::fresh(),
        Symbol::fresh(),
    );
    let fused = for_(
        b,
        4,
        LowLevel::Seq(vec![
            for_(h, 8, for_(k, 64, set(&y, &[b, h, k], get(&x, &[b, h, k])))),
            for_(
                h2,
                8,
                for_(
                    k2,
                    64,
                    set(
                        &z,
                        &[b, h2, k2],
                        ScalarExpr::binop(BinOp::Mul, get(&y, &[b, h2, k2]), get(&y, &[b, h2, k2])),
                    ),
                ),
            ),
        ]),
    );
    let pieces = distribute_loop(&fused).expect("independent outer loop over a sequence");
    assert_eq!(pieces.len(), 2);
    // Without merging (loop fusion off), two nests.
    let (code, notes, _) = restructure(fused.clone(), &h100(), &ScheduleTuning::default(), false);
    let LowLevel::Seq(items) = &code else {
        panic!("not distributed: {code}");
    };
    assert_eq!(items.len(), 2);
    assert!(
        notes[0]
            .as_deref()
            .is_some_and(|n| n.contains("distributed"))
    );
    for item in items {
        let (grid, _) = grid_loops(item);
        assert_eq!(grid_total(&grid), 4 * 8 * 64);
    }
    // With it, the two pointwise pieces merge back into one nest of all three loops: one pass
    // whose grid covers them all.
    let (code, notes, _) = restructure(fused.clone(), &h100(), &ScheduleTuning::default(), true);
    assert!(matches!(code, LowLevel::For { .. }), "{code}");
    assert_eq!(grid_total(&grid_loops(&code).0), 4 * 8 * 64);
    let why = notes[0].as_deref().unwrap_or_default();
    assert!(
        why.contains("distributed") && why.contains("merged"),
        "{why}"
    );
    // Four groups of one invocation keep a 1-unit device with groups of one busy: whole.
    let tiny = GpuLimits {
        max_group_invocations: 1,
        compute_units: 1,
        ..h100()
    };
    let (kept, _, _) = restructure(fused, &tiny, &ScheduleTuning::default(), true);
    assert!(matches!(kept, LowLevel::For { .. }), "{kept}");
    // s[] accumulates across iterations: the loop is not independent.
    let s = node("s", &[]);
    let v = node("v", &[64]);
    let i = Symbol::fresh();
    let dependent = for_(
        i,
        64,
        LowLevel::Seq(vec![
            set(
                &s,
                &[],
                ScalarExpr::binop(BinOp::Add, get(&s, &[]), get(&v, &[i])),
            ),
            set(&v, &[i], get(&s, &[])),
        ]),
    );
    assert!(distribute_loop(&dependent).is_none());
    // One iteration of the same body distributes: its statements run once, in order, whether
    // in one nest or in two (fusion puts such a loop around consecutive scalar statements).
    let once = LowLevel::For {
        index: i,
        from: 0,
        to: 1,
        body: Box::new(LowLevel::Seq(vec![
            set(
                &s,
                &[],
                ScalarExpr::binop(BinOp::Add, get(&s, &[]), get(&v, &[i])),
            ),
            set(&v, &[i], get(&s, &[])),
        ])),
    };
    let pieces = distribute_loop(&once).expect("a loop of one iteration distributes");
    assert_eq!(pieces.len(), 2);
    assert!(
        pieces
            .iter()
            .all(|p| matches!(p, LowLevel::For { from: 0, to: 1, .. }))
    );
}

/// `c[i, j] += a[i, k] · b[k, j]` over `m × k × n`, in the factors' precision `prec` into a
/// result of precision `out`.
fn product(m: usize, k: usize, n: usize, prec: Prec, out: Prec) -> (LowLevel, [Tnode; 3]) {
    let a = Tnode::new(prec, &[m, k], &["a"]).unwrap();
    let b = Tnode::new(prec, &[k, n], &["b"]).unwrap();
    let c = Tnode::new(out, &[m, n], &["c"]).unwrap();
    let (i, j, l) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
    let stmt = for_(
        i,
        m as i64,
        for_(
            j,
            n as i64,
            for_(
                l,
                k as i64,
                set(
                    &c,
                    &[i, j],
                    ScalarExpr::binop(
                        BinOp::Add,
                        get(&c, &[i, j]),
                        ScalarExpr::binop(BinOp::Mul, get(&a, &[i, l]), get(&b, &[l, j])),
                    ),
                ),
            ),
        ),
    );
    (stmt, [a, b, c])
}

/// `y[i, j] := op(c[i', j'], bias[j])` over `c`'s shape, reading `c` at `(i, j)` or, when
/// `transposed`, at `(j, i)`.
fn pointwise_after(c: &Tnode, transposed: bool) -> (LowLevel, Tnode) {
    let dims = c.dims().to_vec();
    let y = node("y", &dims);
    let bias = node("bias", &[dims[1]]);
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let read = if transposed { [j, i] } else { [i, j] };
    let stmt = for_(
        i,
        dims[0] as i64,
        for_(
            j,
            dims[1] as i64,
            set(
                &y,
                &[i, j],
                ScalarExpr::binop(BinOp::Add, get(c, &read), get(&bias, &[j])),
            ),
        ),
    );
    (stmt, y)
}

/// A pointwise statement over a tiled product's result becomes its epilogue (and runs
/// nothing); one that reads another element of the result, or writes a factor, does not.
#[test]
fn pointwise_statements_after_tiled_products_become_their_epilogues() {
    let (mm, [_, _, c]) = product(256, 64, 256, Prec::F32, Prec::F32);
    for (transposed, expected) in [(false, true), (true, false)] {
        let (after, y) = pointwise_after(&c, transposed);
        let stmts = [&mm, &after];
        let s = gpu_schedules(&stmts, &h100(), &ScheduleTuning::default(), false);
        match &s[0].kind {
            ScheduleKind::Gpu(GpuPass::Tiles { epilogue, .. }) => {
                assert_eq!(epilogue.is_some(), expected, "{}", s[0].why);
                if let Some(e) = epilogue {
                    assert_eq!(e.iters.len(), 2);
                    assert!(matches!(&e.stmt, LowLevel::Set { tn, .. } if *tn == y));
                }
            }
            other => panic!("{other:?}"),
        }
        let absorbed = matches!(s[1].kind, ScheduleKind::Gpu(GpuPass::Nothing));
        assert_eq!(absorbed, expected, "{}", s[1].why);
    }
    // A statement writing a factor of the product (of the result's shape) is no epilogue.
    let (square, [a, _, c]) = product(128, 128, 128, Prec::F32, Prec::F32);
    let ScheduleKind::Gpu(GpuPass::Tiles { gemm, .. }) =
        gpu_schedule(&square, &h100(), &ScheduleTuning::default(), false).kind
    else {
        panic!("not tiled");
    };
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let into_factor = for_(i, 128, for_(j, 128, set(&a, &[i, j], get(&c, &[i, j]))));
    assert!(Epilogue::of(&gemm, &into_factor).is_none());
    let (fine, _) = pointwise_after(&c, false);
    assert!(Epilogue::of(&gemm, &fine).is_some());
}

/// Products of 16-bit factors (into their precision or f32) run on matrix units where the
/// device has them, f32 ones only where TF32 is allowed; tiles shrink to keep the device busy.
#[test]
fn matrix_units_take_sixteen_bit_products_and_tf32_only_when_allowed() {
    let plan = |prec: Prec, out: Prec, allow_tf32: bool, limits: GpuLimits, m: usize| {
        let (stmt, _) = product(m, 64, m, prec, out);
        gpu_schedule(&stmt, &limits, &ScheduleTuning::default(), allow_tf32).kind
    };
    let layout = |kind: ScheduleKind| match kind {
        ScheduleKind::Gpu(GpuPass::MatrixTiles { layout, .. }) => Some((layout.kind, layout.tile)),
        _ => None,
    };
    let h100 = h100();
    assert!(h100.matrix_units);
    assert_eq!(
        layout(plan(Prec::Bf16, Prec::Bf16, false, h100, 4096)),
        Some((MatrixKind::Bf16, 128))
    );
    assert_eq!(
        layout(plan(Prec::F16, Prec::F32, false, h100, 4096)),
        Some((MatrixKind::F16, 128))
    );
    // 1024²: 64 groups of 128-tiles, 256 of 64-tiles: fewer than 2 × 132; 32-tiles give 1024.
    assert_eq!(
        layout(plan(Prec::Bf16, Prec::Bf16, false, h100, 1024)),
        Some((MatrixKind::Bf16, 32))
    );
    assert_eq!(layout(plan(Prec::F32, Prec::F32, false, h100, 4096)), None);
    assert_eq!(
        layout(plan(Prec::F32, Prec::F32, true, h100, 4096)),
        Some((MatrixKind::Tf32, 128))
    );
    // No matrix units: no matrix-unit pass, whatever is allowed.
    let plain = GpuLimits {
        matrix_units: false,
        warpgroup_mma: false,
        ..h100
    };
    assert_eq!(
        layout(plan(Prec::Bf16, Prec::Bf16, true, plain, 4096)),
        None
    );
    assert_eq!(layout(plan(Prec::F32, Prec::F32, true, plain, 4096)), None);
}

/// Consecutive nests of the same loops around straight-line assignments merge into one pass
/// where each grid point's later statement reads only what the earlier one wrote at that point
/// (normalize, then cast); a read of another point (a transpose), other ranges, or a loop in
/// a body keep them apart. The merged nest computes what the two did, on the interpreter.
#[test]
fn pointwise_nests_of_the_same_loops_merge_into_one_pass() {
    let x = node("x", &[8, 8]);
    let y = node("y", &[8, 8]);
    let z = node("z", &[8, 8]);
    x.host()
        .set_values(&(0..64).map(f64::from).collect::<Vec<_>>())
        .unwrap();
    let nest = |out: &Tnode, from: &Tnode, transposed: bool, to: i64| {
        let (i, j) = (Symbol::fresh(), Symbol::fresh());
        let read = if transposed { [j, i] } else { [i, j] };
        for_(
            i,
            to,
            for_(
                j,
                8,
                set(
                    out,
                    &[i, j],
                    ScalarExpr::Binop(
                        BinOp::Add,
                        Box::new(get(from, &read)),
                        Box::new(ScalarExpr::Constant(1.0)),
                    ),
                ),
            ),
        )
    };
    // y = x + 1; z = y + 1: one nest.
    let (a, b) = (nest(&y, &x, false, 8), nest(&z, &y, false, 8));
    let merged = merged_pointwise(&a, &b).expect("merged");
    let (loops, body) = merged.perfect_nest();
    assert_eq!(loops.len(), 2);
    assert!(matches!(body, LowLevel::Seq(items) if items.len() == 2));
    let limits = h100();
    let (code, notes, _) = restructure(
        LowLevel::Seq(vec![a.clone(), b.clone()]),
        &limits,
        &ScheduleTuning::default(),
        true,
    );
    assert!(
        !matches!(&code, LowLevel::Seq(items) if items.len() > 1),
        "{code:?}"
    );
    assert!(notes[0].as_deref().is_some_and(|n| n.contains("merged")));
    let mut env = arrayjit_ir::interpret::InterpEnv::from_host_arrays(&code);
    env.run(&code, &[]).unwrap();
    let got = env.array(&z).unwrap().to_vec_f64().unwrap();
    assert_eq!(got, (0..64).map(|v| f64::from(v) + 2.0).collect::<Vec<_>>());
    // z reading y transposed needs every point of y first; other ranges; a loop in a body.
    assert!(merged_pointwise(&a, &nest(&z, &y, true, 8)).is_none());
    assert!(merged_pointwise(&a, &nest(&z, &y, false, 4)).is_none());
    let k = Symbol::fresh();
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let with_loop = for_(
        i,
        8,
        for_(j, 8, for_(k, 8, set(&z, &[i, j], get(&y, &[i, k])))),
    );
    assert!(merged_pointwise(&a, &with_loop).is_none());
}

/// Sums into two elements of one node run side by side (they touch different elements), the
/// statement adding them up after; a sum reading the other's element does not join it. The
/// zeroings their passes do move with them.
#[test]
fn independent_small_passes_join_and_dependent_ones_do_not() {
    let (x, y) = (node("x", &[500]), node("y", &[500]));
    let acc = node("acc", &[2]);
    let z = node("z", &[]);
    let at = |e: i64| vec![AxisIndex::Fixed(e)];
    let zero = |e: i64| LowLevel::Set {
        tn: acc.clone(),
        idcs: at(e),
        value: ScalarExpr::Constant(0.0),
    };
    let sum = |e: i64, of: &Tnode, plus: Option<i64>| {
        let i = Symbol::fresh();
        let mut value = ScalarExpr::binop(
            BinOp::Add,
            ScalarExpr::Get(acc.clone(), at(e)),
            get(of, &[i]),
        );
        if let Some(o) = plus {
            value = ScalarExpr::binop(BinOp::Add, value, ScalarExpr::Get(acc.clone(), at(o)));
        }
        for_(
            i,
            500,
            LowLevel::Set {
                tn: acc.clone(),
                idcs: at(e),
                value,
            },
        )
    };
    let total = LowLevel::Set {
        tn: z.clone(),
        idcs: vec![],
        value: ScalarExpr::binop(
            BinOp::Add,
            ScalarExpr::Get(acc.clone(), at(0)),
            ScalarExpr::Get(acc.clone(), at(1)),
        ),
    };
    let limits = h100();
    let joins = |stmts: &[LowLevel]| {
        let refs: Vec<&LowLevel> = stmts.iter().collect();
        let schedules = gpu_schedules(&refs, &limits, &ScheduleTuning::default(), false);
        joined_launches(&refs, &schedules, &limits)
    };
    let code = [
        zero(0),
        sum(0, &x, None),
        zero(1),
        sum(1, &y, None),
        total.clone(),
    ];
    let found = joins(&code);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].statements, vec![1, 3]);
    assert_eq!(found[0].threads, 256);
    // The second sum reads the first's element: it runs after it (its zeroing, a pass of its
    // own now, touches another element and may join the first sum).
    let code = [
        zero(0),
        sum(0, &x, None),
        zero(1),
        sum(1, &y, Some(0)),
        total,
    ];
    let found = joins(&code);
    assert!(
        found.iter().all(|j| !j.statements.contains(&3)),
        "{found:?}"
    );
    // No budget, no joining.
    let refs: Vec<&LowLevel> = code.iter().collect();
    let schedules = gpu_schedules(&refs, &limits, &ScheduleTuning::default(), false);
    let none = GpuLimits {
        joined_launch_parameters: 0,
        ..limits
    };
    assert!(joined_launches(&refs, &schedules, &none).is_empty());
}

/// `p = x + 1; q = Σ p; r = y + 1; s = Σ r; t = q + s; u = y + 1; v = p + 1`: as early as
/// possible, the scalings of `x` and `y` and `u` come first, then the sums with `v`, then `t`;
/// as late as possible, `u` and `v` wait until the end; sources first puts `u` at the front and
/// `v` at the end. Zeroings stay right before the sums that start from them. In program order
/// fewer passes meet than in the order of levels.
#[test]
fn passes_go_in_the_order_of_their_dependence_levels() {
    let (x, y) = (node("x", &[500]), node("y", &[500]));
    let (p, r) = (node("p", &[500]), node("r", &[500]));
    let (u, v) = (node("u", &[500]), node("v", &[500]));
    let (q, s, t) = (node("q", &[]), node("s", &[]), node("t", &[]));
    let scale = |out: &Tnode, of: &Tnode| {
        let i = Symbol::fresh();
        for_(
            i,
            500,
            set(
                out,
                &[i],
                ScalarExpr::binop(BinOp::Add, get(of, &[i]), ScalarExpr::Constant(1.0)),
            ),
        )
    };
    let sum = |out: &Tnode, of: &Tnode| {
        let i = Symbol::fresh();
        for_(
            i,
            500,
            set(
                out,
                &[],
                ScalarExpr::binop(BinOp::Add, get(out, &[]), get(of, &[i])),
            ),
        )
    };
    let zero = |out: &Tnode| set(out, &[], ScalarExpr::Constant(0.0));
    let code = [
        scale(&p, &x),
        zero(&q),
        sum(&q, &p),
        scale(&r, &y),
        zero(&s),
        sum(&s, &r),
        set(
            &t,
            &[],
            ScalarExpr::binop(BinOp::Add, get(&q, &[]), get(&s, &[])),
        ),
        scale(&u, &y),
        scale(&v, &p),
    ];
    let refs: Vec<&LowLevel> = code.iter().collect();
    let limits = h100();
    let schedules = gpu_schedules(&refs, &limits, &ScheduleTuning::default(), false);
    assert!(matches!(
        schedules[1].kind,
        ScheduleKind::Gpu(GpuPass::Nothing)
    ));
    let order = |placement| join::leveled_order(&refs, &schedules, placement);
    let earliest = order(join::Placement::Earliest);
    assert_eq!(earliest, vec![0, 3, 7, 1, 2, 4, 5, 8, 6]);
    assert_eq!(
        order(join::Placement::Latest),
        vec![0, 3, 1, 2, 4, 5, 6, 7, 8]
    );
    assert_eq!(
        order(join::Placement::SourcesFirst),
        vec![0, 3, 7, 1, 2, 4, 5, 6, 8]
    );
    let launches = |order: &[usize]| {
        let stmts: Vec<&LowLevel> = order.iter().map(|&i| refs[i]).collect();
        let scheds: Vec<Schedule> = order.iter().map(|&i| schedules[i].clone()).collect();
        let joined = joined_launches(&stmts, &scheds, &limits);
        let passes = scheds
            .iter()
            .filter(|s| !matches!(s.kind, ScheduleKind::Gpu(GpuPass::Nothing)))
            .count();
        passes - joined.iter().map(|j| j.statements.len() - 1).sum::<usize>()
    };
    // As early as possible: {p, r, u}, {q, s, v}, {t}.
    assert_eq!(launches(&earliest), 3);
    assert!(launches(&(0..code.len()).collect::<Vec<_>>()) > 3);
}

/// The forward pass of a causal attention of `prec` with `batch` × `heads` heads of `features`
/// over `time` positions, registered, and its loop nest (the lowering's last statement).
fn attention_nest(
    prec: Prec,
    batch: usize,
    heads: usize,
    time: usize,
    features: usize,
) -> (
    std::sync::Arc<arrayjit_ir::attention::AttentionOp>,
    LowLevel,
) {
    use arrayjit_ir::attention::{AttentionLayout, AttentionOp, AttentionSpec};
    let dims = [batch, heads, time, features];
    let input = |l| Tnode::new(prec, &dims, &[l]).unwrap();
    let (q, k, v) = (input("q"), input("k"), input("v"));
    let spec =
        AttentionSpec::new(&q, &k, &v, AttentionLayout::HeadsFirst, true, 0.125, None).unwrap();
    let out = Tnode::new(prec, &dims, &["out"]).unwrap();
    let lse = Tnode::new(spec.stats_prec(), &spec.row_dims(), &["lse"]).unwrap();
    let op = AttentionOp::forward(&spec, &out, &lse).unwrap().register();
    let LowLevel::Seq(stmts) = op.lower().unwrap() else {
        panic!("a sequence")
    };
    (op, stmts.last().cloned().unwrap())
}

/// A pass of fused attention runs as the GPU's attention pass, its block of keys the largest
/// (up to 64) whose rows fit the group's shared memory, its groups of 64 rows where they fill
/// the device, else of 32; heads too wide for registers or for a block of 8 in shared memory,
/// and a piece of the nest, stay loops, saying why.
#[test]
fn attention_passes_are_planned_from_the_limits() {
    let plan = |prec, batch, heads, time, features, limits: &GpuLimits| {
        let (_op, nest) = attention_nest(prec, batch, heads, time, features);
        GpuAttention::plan(&nest, limits).expect("a whole pass")
    };
    // GPT-2 small at T = 1024, batch 4: 48 heads × 16 blocks of 64 rows fill 264 groups; a
    // row's 64 features on 4 lanes of a warp.
    let (a, why) = plan(Prec::F32, 4, 12, 1024, 64, &h100()).unwrap();
    assert_eq!(
        (a.rows, a.lanes, a.threads(), a.block, a.groups(0)),
        (64, 4, 256, 64, 768),
        "{why}"
    );
    assert!(why.contains("FlashAttention-2"), "{why}");
    // One head: 64-row groups would be 16; groups of one warp (8 rows × 4 lanes) make 128.
    let (a, why) = plan(Prec::F32, 1, 1, 1024, 64, &h100()).unwrap();
    assert_eq!((a.rows, a.threads(), a.groups(0)), (8, 32, 128), "{why}");
    assert!(why.contains("fewer than the 264"), "{why}");
    // A dialect without shuffles (WGSL) runs one lane per row, as many rows per group.
    let one = a.with_one_lane();
    assert_eq!((one.rows, one.lanes, one.threads()), (32, 1, 32));
    // Features that 4 lanes do not divide take fewer lanes.
    let (a, _) = plan(Prec::F32, 4, 12, 256, 6, &h100()).unwrap();
    assert_eq!(a.lanes, 2);
    // Without subgroups (WebGPU's portable limits) one lane, groups of at least 32 rows.
    let (a, _) = plan(Prec::F32, 1, 1, 1024, 64, &GpuLimits::portable()).unwrap();
    assert_eq!((a.rows, a.lanes), (32, 1));
    // WebGPU's 16 KiB: 16 rows of 64 + 64 + 2 f32 features per step; bf16 inputs too.
    let (a, _) = plan(Prec::F32, 4, 12, 256, 64, &GpuLimits::portable()).unwrap();
    assert_eq!(a.block, 16);
    let (a, _) = plan(Prec::Bf16, 4, 12, 256, 128, &GpuLimits::portable()).unwrap();
    assert_eq!(a.block, 8);
    let why = plan(Prec::F64, 1, 1, 16, 128, &GpuLimits::portable()).unwrap_err();
    assert!(why.contains("do not fit"), "{why}");
    let why = plan(Prec::F32, 1, 1, 16, 256, &h100()).unwrap_err();
    assert!(why.contains("registers"), "{why}");
    // A piece of the nest (its per-row loops split off, as a renderer may for its binding
    // limit) is not the pass.
    let (_op, nest) = attention_nest(Prec::F32, 1, 2, 8, 4);
    let pieces = distribute_loop(&nest).expect("distributable");
    assert!(pieces.len() > 1);
    for p in &pieces {
        assert!(GpuAttention::plan(p, &h100()).is_none(), "{p:?}");
    }
    // The planner records the pass and keeps the nest whole.
    let (_op, nest) = attention_nest(Prec::F32, 2, 2, 40, 8);
    let (code, notes, _) = restructure(nest.clone(), &h100(), &ScheduleTuning::default(), true);
    assert_eq!(code, nest);
    assert!(notes.iter().all(Option::is_none));
    let s = gpu_schedule(&nest, &h100(), &ScheduleTuning::default(), false);
    assert!(
        matches!(s.kind, ScheduleKind::Gpu(GpuPass::Attention(_))),
        "{s}"
    );
}
