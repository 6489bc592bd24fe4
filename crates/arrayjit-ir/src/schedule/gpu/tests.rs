//! The GPU restructuring and planning of statements, on hand-built loop code.

use super::*;
use crate::indexing::{AxisIndex, Symbol};
use crate::low_level::ScopeId;
use crate::ops::BinOp;

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
    let (code, notes, made) = restructure(stmt, &h100(), &ScheduleTuning::default());
    assert_eq!(made.len(), 1);
    assert!(made[0].is_local());
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
    let (code, notes, _) = restructure(fused.clone(), &h100(), &ScheduleTuning::default());
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
    // Four groups of one invocation keep a 1-unit device with groups of one busy: whole.
    let tiny = GpuLimits {
        max_group_invocations: 1,
        compute_units: 1,
        ..h100()
    };
    let (kept, _, _) = restructure(fused, &tiny, &ScheduleTuning::default());
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
}
