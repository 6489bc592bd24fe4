//! Golden tests of the generated C (insta snapshots) and determinism of rendering.

use arrayjit_codegen::{CSyntax, render_program};
use arrayjit_ir::{
    AccumRhs, Assignments, AxisIndex, AxisPadding, BinOp, FetchOp, MemoryMode, MemoryType, Operand,
    Padding, Prec, Projections, StaticSymbol, Symbol, TernOp, Tnode, UnOp,
};
use arrayjit_opt::schedule::GpuLimits;
use arrayjit_opt::{OptimizeSettings, optimize};

fn input(prec: Prec, dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(prec, dims, &[label]).unwrap();
    let n: usize = dims.iter().product();
    t.host().set_values(&vec![1.0; n]).unwrap();
    t
}

fn output(prec: Prec, dims: &[usize], label: &str) -> Tnode {
    let t = Tnode::new(prec, dims, &[label]).unwrap();
    t.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Nonconstant),
        "golden: result",
    )
    .unwrap();
    t
}

fn render(
    name: &str,
    program: &Assignments,
    bindings: &[StaticSymbol],
    settings: &OptimizeSettings,
) -> String {
    let opt = optimize(name, bindings, program, settings).unwrap();
    render_program(&CSyntax::c(), &[&opt]).unwrap().source
}

fn mlp_layer() -> Assignments {
    let w = input(Prec::F32, &[4, 3], "w");
    let x = input(Prec::F32, &[3], "x");
    let b = input(Prec::F32, &[4], "b");
    let wx = Tnode::new(Prec::F32, &[4], &["wx"]).unwrap();
    let pre = Tnode::new(Prec::F32, &[4], &["pre"]).unwrap();
    let y = output(Prec::F32, &[4], "y");
    Assignments::einsum(
        "ij,j->i",
        BinOp::Add,
        &wx,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(w), Operand::Node(x)),
        true,
    )
    .unwrap()
    .then(Assignments::pointwise_binop(&pre, BinOp::Add, &wx, &b))
    .then(Assignments::pointwise_unop(&y, UnOp::Relu, &pre))
}

#[test]
fn fused_mlp_layer() {
    insta::assert_snapshot!(render(
        "mlp_layer",
        &mlp_layer(),
        &[],
        &OptimizeSettings::default()
    ));
}

#[test]
fn rendering_is_deterministic() {
    let a = render("mlp_layer", &mlp_layer(), &[], &OptimizeSettings::default());
    let b = render("mlp_layer", &mlp_layer(), &[], &OptimizeSettings::default());
    assert_eq!(a, b);
}

#[test]
fn max_reduction_starts_from_negative_infinity() {
    let m = input(Prec::F32, &[5, 7], "m");
    let r = output(Prec::F32, &[5], "row_max");
    let p = Assignments::einsum(
        "ij->i",
        BinOp::Max,
        &r,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(m)),
        true,
    )
    .unwrap();
    insta::assert_snapshot!(render("row_max", &p, &[], &OptimizeSettings::default()));
}

/// Row maximum, then `m - max` over the same rows.
fn row_passes() -> Assignments {
    let m = input(Prec::F32, &[3, 40], "m");
    let r = Tnode::new(Prec::F32, &[3], &["row_max"]).unwrap();
    let e = output(Prec::F32, &[3, 40], "e");
    Assignments::einsum(
        "ij->i",
        BinOp::Max,
        &r,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(m.clone())),
        true,
    )
    .unwrap()
    .then(
        Assignments::einsum(
            "ij,i->ij",
            BinOp::Arg2,
            &e,
            AccumRhs::Binop(BinOp::Sub, Operand::Node(m), Operand::Node(r)),
            false,
        )
        .unwrap(),
    )
}

/// The row passes: one fused loop, the reduction over accumulators and the subtraction loop
/// each in a function of its own, called per row with the arrays as parameters.
#[test]
fn fused_row_passes_outline_their_loops() {
    let settings = OptimizeSettings {
        schedule: arrayjit_opt::schedule::ScheduleSettings {
            f32_lanes: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    insta::assert_snapshot!(render("row_passes", &row_passes(), &[], &settings));
}

/// The row passes split over the workers: the chunk function (whose signature the worker
/// pool fixes) unpacks the arrays from its context and passes them to its body, so that every
/// function with loops receives them as `restrict` parameters, which compilers honour (on
/// pointers loaded into locals they often do not, and version loops for aliasing).
#[test]
fn parallel_row_passes_take_their_arrays_as_parameters() {
    let settings = OptimizeSettings {
        schedule: arrayjit_opt::schedule::ScheduleSettings {
            f32_lanes: 4,
            min_parallel_work: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let src = render("parallel_row_passes", &row_passes(), &[], &settings);
    assert!(src.contains("_chunk0_body(const "), "{src}");
    assert!(
        !src.contains("restrict p0 = "),
        "no restrict-qualified locals: {src}"
    );
    insta::assert_snapshot!(src);
}

#[test]
fn half_precision_conversions() {
    let x = input(Prec::F16, &[8], "x16");
    let b = input(Prec::Bf16, &[8], "bias");
    let y = output(Prec::F16, &[8], "y16");
    let p = Assignments::pointwise_binop(&y, BinOp::Mul, &x, &b);
    insta::assert_snapshot!(render("half", &p, &[], &OptimizeSettings::default()));
}

#[test]
fn integer_division_and_conversion() {
    let a = input(Prec::I32, &[6], "a");
    let f = input(Prec::F32, &[6], "f");
    let q = Tnode::new(Prec::I32, &[6], &["q"]).unwrap();
    let y = output(Prec::I32, &[6], "y");
    let p = Assignments::pointwise_binop(&q, BinOp::Div, &a, &f)
        .then(Assignments::pointwise_binop(&y, BinOp::Mod, &q, &a));
    insta::assert_snapshot!(render("int_ops", &p, &[], &OptimizeSettings::default()));
}

#[test]
fn padded_convolution_over_a_static_batch() {
    let batch = StaticSymbol::new("batch", 4);
    let data = input(Prec::F32, &[4, 6], "data");
    let pad = Padding {
        axes: vec![AxisPadding { left: 1, right: 1 }],
        value: 0.0,
    };
    let x = Tnode::new_padded(Prec::F32, &[6], pad, &["x_padded"]).unwrap();
    let k = input(Prec::F32, &[3], "kernel");
    let y = output(Prec::F32, &[6], "conv");
    let (i, j) = (Symbol::fresh(), Symbol::fresh());
    let conv = Assignments::Accum {
        initialize_neutral: true,
        accum: BinOp::Add,
        lhs: y,
        rhs: AccumRhs::Binop(BinOp::Mul, Operand::Node(x.clone()), Operand::Node(k)),
        projections: Projections {
            product_space: vec![6, 3],
            product_iterators: vec![i, j],
            lhs_dims: vec![6],
            rhs_dims: vec![vec![6], vec![3]],
            project_lhs: vec![AxisIndex::Iterator(i)],
            project_rhs: vec![
                vec![AxisIndex::affine([(1, i), (1, j)], -1)],
                vec![AxisIndex::Iterator(j)],
            ],
            guards: Vec::new(),
            debug_info: "conv".into(),
        },
    };
    let p = Assignments::Fetch {
        array: x,
        op: FetchOp::Slice {
            batch: batch.clone(),
            sliced: data,
        },
    }
    .then(conv);
    insta::assert_snapshot!(render(
        "conv_batch",
        &p,
        &[batch],
        &OptimizeSettings::default()
    ));
}

#[test]
fn common_subexpressions_are_computed_once() {
    let x = input(Prec::F32, &[8], "x");
    let t = Tnode::new(Prec::F32, &[8], &["t"]).unwrap();
    let y = output(Prec::F32, &[8], "y");
    // t is read twice per element; allowing two visits inlines it twice, and CSE merges them.
    let p = Assignments::pointwise_unop(&t, UnOp::Tanh, &x).then(Assignments::pointwise_binop(
        &y,
        BinOp::Mul,
        &t,
        &t,
    ));
    let settings = OptimizeSettings {
        virtualize_max_visits: 2,
        ..Default::default()
    };
    let src = render("square_tanh", &p, &[], &settings);
    // The helper's definition, and one call: tanh is computed once per element.
    assert_eq!(src.matches("aj_tanh_f32(").count(), 2, "{src}");
    insta::assert_snapshot!(src);
}

#[test]
fn labels_cannot_inject_code() {
    let x = Tnode::new(Prec::F32, &[2], &["x */ system(\"rm -rf /\"); /*"]).unwrap();
    x.host().set_values(&[1.0, 2.0]).unwrap();
    let y = output(Prec::F32, &[2], "y\n#include <evil.h>");
    let p = Assignments::BlockComment(
        "comment */ evil(); /*".into(),
        Box::new(Assignments::pointwise_unop(&y, UnOp::Neg, &x)),
    );
    let src = render("name\"; evil(); \"", &p, &[], &OptimizeSettings::default());
    assert!(!src.contains("evil()"), "{src}");
    assert!(!src.contains("system("), "{src}");
    assert!(!src.contains("#include <evil.h>"), "{src}");
    assert_eq!(
        src.matches("*/").count(),
        src.matches("/*").count(),
        "{src}"
    );
}

#[test]
fn matmul_walks_memory_contiguously() {
    let a = input(Prec::F32, &[8, 16], "a");
    let b = input(Prec::F32, &[16, 4], "b");
    let c = output(Prec::F32, &[8, 4], "c");
    let p = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    let src = render("matmul", &p, &[], &OptimizeSettings::default());
    // Loops i, k, j: the innermost loop reads b and writes c contiguously.
    assert!(
        src.contains("p0[i0 * 4 + i2] = fmaf(p1[i0 * 16 + i1], p2[i1 * 4 + i2]"),
        "{src}"
    );
    insta::assert_snapshot!(src);
}

/// A matrix-vector product (a group per output reduces its row), a pointwise step, then a
/// sum (one group, fixed tree order).
fn layer_and_total() -> Assignments {
    let w = input(Prec::F32, &[4, 300], "w");
    let x = input(Prec::F32, &[300], "x");
    let wx = output(Prec::F32, &[4], "wx");
    let y = output(Prec::F32, &[4], "y");
    let total = output(Prec::F32, &[], "total");
    let xs = input(Prec::F32, &[1000], "xs");
    Assignments::einsum(
        "ij,j->i",
        BinOp::Add,
        &wx,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(w), Operand::Node(x)),
        true,
    )
    .unwrap()
    .then(Assignments::pointwise_unop(&y, UnOp::Relu, &wx))
    .then(
        Assignments::einsum(
            "i->",
            BinOp::Add,
            &total,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(xs)),
            true,
        )
        .unwrap(),
    )
}

#[test]
fn wgsl_passes_of_a_layer_and_a_total() {
    use arrayjit_codegen::wgsl::{WgslTarget, render_wgsl};
    let program = layer_and_total();
    let settings = OptimizeSettings::for_gpu(GpuLimits::portable());
    let opt = optimize("layer_total", &[], &program, &settings).unwrap();
    let kernel = render_wgsl(&opt, &WgslTarget::default()).unwrap();
    insta::assert_snapshot!(kernel.full_source());
}

#[test]
fn cuda_passes_of_a_layer_and_a_total() {
    let program = layer_and_total();
    let settings = OptimizeSettings::for_gpu(GpuLimits::cuda_minimum());
    let opt = optimize("layer_total", &[], &program, &settings).unwrap();
    let p = arrayjit_codegen::cuda::render_cuda(&[&opt]).unwrap();
    let shapes: Vec<String> = p.kernels[0]
        .passes
        .iter()
        .map(|p| format!("{}: {:?} {:?}", p.symbol, p.shape, p.launch_dims()))
        .collect();
    insta::assert_snapshot!(format!("/* {} */\n{}", shapes.join("; "), p.source));
}

#[test]
fn cuda_tiled_product() {
    let a = input(Prec::F32, &[64, 48], "a");
    let b = input(Prec::F32, &[48, 80], "b");
    let c = output(Prec::F32, &[64, 80], "c");
    let program = Assignments::einsum(
        "ik,kj->ij",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    let settings = OptimizeSettings::for_gpu(GpuLimits::cuda_minimum());
    let opt = optimize("product", &[], &program, &settings).unwrap();
    let p = arrayjit_codegen::cuda::render_cuda(&[&opt]).unwrap();
    insta::assert_snapshot!(p.source);
}

/// Statements that differ only in their arrays (two layers) render to one statement function,
/// called twice with different arrays; its text names no array.
#[test]
fn equal_statements_share_one_function() {
    // A total between the layers keeps their loops apart (otherwise they would be fused).
    let total = output(Prec::F32, &[], "total");
    let between = |y: &Tnode| {
        Assignments::einsum(
            "i->",
            BinOp::Add,
            &total,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(y.clone())),
            true,
        )
        .unwrap()
    };
    let x0 = input(Prec::F32, &[64], "x0");
    let y0 = output(Prec::F32, &[64], "y0");
    let x1 = input(Prec::F32, &[64], "x1");
    let y1 = output(Prec::F32, &[64], "y1");
    let p = Assignments::pointwise_unop(&y0, UnOp::Relu, &x0)
        .then(between(&y0))
        .then(Assignments::pointwise_unop(&y1, UnOp::Relu, &x1));
    let src = render("layers", &p, &[], &OptimizeSettings::default());
    // The kernel's calls: the first and the last are the two layers, with their own arrays.
    let calls: Vec<&str> = src
        .lines()
        .filter_map(|l| l.split("*/ ").nth(1))
        .filter(|c| c.starts_with("aj_st_"))
        .collect();
    assert_eq!(calls.len(), 4, "{src}");
    let name = |call: &str| call.split('(').next().unwrap_or_default().to_string();
    let (first, last) = (calls[0], calls[3]);
    assert_eq!(name(first), name(last), "{src}");
    assert!(first.contains("y0") && first.contains("x0"), "{src}");
    assert!(last.contains("y1") && last.contains("x1"), "{src}");
    let definition = format!(" void {}(", name(first));
    assert_eq!(src.matches(&definition).count(), 1, "{src}");
}

/// A program whose statement functions pass `UNIT_BYTES` of C is split into units of their
/// own (compiled in parallel): the kernels' unit declares them, each unit defines its share,
/// and every function is defined exactly once.
#[test]
fn large_programs_are_split_into_units() {
    // Many different statements: pointwise chains of different lengths over different shapes.
    let mut p = Assignments::Noop;
    for k in 0..400 {
        let n = 16 + k;
        let x = input(Prec::F32, &[n], &format!("x{k}"));
        let y = output(Prec::F32, &[n], &format!("y{k}"));
        p = p.then(Assignments::pointwise_binop(&y, BinOp::Add, &x, &x));
    }
    let opt = optimize("many", &[], &p, &OptimizeSettings::default()).unwrap();
    let program = render_program(&CSyntax::c(), &[&opt]).unwrap();
    let units: Vec<_> = program
        .units
        .iter()
        .filter(|u| u.name.starts_with("stmts"))
        .collect();
    assert!(units.len() >= 2, "{} units", units.len());
    let defined = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("__attribute__((visibility(\"hidden\"))) void aj_st_"))
            .filter(|l| l.ends_with('{'))
            .filter_map(|l| l.split(" void ").nth(1))
            .map(|rest| rest.split('(').next().unwrap_or_default().to_string())
            .collect()
    };
    let mut all: Vec<String> = units.iter().flat_map(|u| defined(&u.source)).collect();
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count, "a function defined twice");
    assert_eq!(count, 400, "one function per distinct statement");
    assert!(
        defined(&program.source).is_empty(),
        "definitions left in the kernels' unit"
    );
    let declared = program
        .source
        .lines()
        .filter(|l| {
            l.starts_with("__attribute__((visibility(\"hidden\"))) void aj_st_") && l.ends_with(';')
        })
        .count();
    assert_eq!(declared, 400);
}

/// A long sum of a whole array: the innermost loop in pairwise blocks over its accumulators,
/// the outer loop's totals in a cascade, then added to the element once (`c::pairwise`).
#[test]
fn long_sums_are_pairwise() {
    let m = input(Prec::F32, &[64, 8192], "m");
    let total = output(Prec::F32, &[], "total");
    let p = Assignments::einsum(
        "ij->",
        BinOp::Add,
        &total,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(m)),
        true,
    )
    .unwrap();
    insta::assert_snapshot!(render("total", &p, &[], &OptimizeSettings::default()));
}

/// A short row sum that the optimizer inlines into its one reader (a layer norm's mean): the
/// local sum runs over 16 accumulators, a lane loop that vectorizes, with its tail of 4 after
/// them (`c::pairwise::long_local_sum`), rather than one chain of additions.
#[test]
fn short_inlined_row_sums_run_over_accumulators() {
    let m = input(Prec::F32, &[8, 100], "m");
    let sums = Tnode::new(Prec::F32, &[8], &["sums"]).unwrap();
    let roots = output(Prec::F32, &[8], "roots");
    let p = Assignments::einsum(
        "ij->i",
        BinOp::Add,
        &sums,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(m)),
        true,
    )
    .unwrap()
    .then(Assignments::pointwise_unop(&roots, UnOp::Sqrt, &sums));
    let source = render("row_roots", &p, &[], &OptimizeSettings::default());
    assert!(
        source.contains(" + 16 <= 100; ") && source.contains(" < 100; ++"),
        "the inlined row sum is not over accumulators:\n{source}"
    );
    insta::assert_snapshot!(source);
}

/// `where` is a helper call, not C's `?:`: both values are read before the choice, so the loop
/// vectorizes as a blend (with `?:` the reads of each branch are conditional, and gcc kept
/// the loop scalar).
#[test]
fn where_reads_both_values_before_choosing() {
    let mask = input(Prec::F32, &[4, 64], "mask");
    let a = input(Prec::F32, &[4, 64], "a");
    let b = input(Prec::F32, &[4, 64], "b");
    let y = output(Prec::F32, &[4, 64], "y");
    let p = Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Arg2,
        lhs: y.clone(),
        rhs: AccumRhs::Ternop(
            TernOp::Where,
            Operand::Node(mask),
            Operand::Node(a),
            Operand::Node(b),
        ),
        projections: Projections::pointwise(y.dims(), 3),
    };
    let source = render("masked", &p, &[], &OptimizeSettings::default());
    assert!(
        source.contains("aj_where_f32(") && !source.contains(" != 0 ? ("),
        "where is not a helper call:\n{source}"
    );
    insta::assert_snapshot!(source);
}

/// A sum along the outer axis (a column sum): the rows in blocks of 128 into a row of block
/// sums, those rows added pairwise, then each column adds its sum once (`c::outer_sums`).
#[test]
fn column_sums_are_pairwise() {
    let m = input(Prec::F32, &[1024, 16], "m");
    let columns = output(Prec::F32, &[16], "columns");
    let p = Assignments::einsum(
        "ij->j",
        BinOp::Add,
        &columns,
        AccumRhs::Unop(UnOp::Identity, Operand::Node(m)),
        true,
    )
    .unwrap();
    insta::assert_snapshot!(render("columns", &p, &[], &OptimizeSettings::default()));
}

/// Rendering once and assembling often: the assembly with nothing imported is
/// `render_program`'s program, one importing some functions leaves exactly those out, and
/// assembling does not use the rendering up (the third assembly equals the first).
#[test]
fn one_rendering_assembles_into_programs_that_import_or_define() {
    let mut p = Assignments::Noop;
    for k in 0..6 {
        let n = 8 + k;
        let x = input(Prec::F32, &[n], &format!("x{k}"));
        let y = output(Prec::F32, &[n], &format!("y{k}"));
        p = p.then(Assignments::pointwise_binop(&y, BinOp::Mul, &x, &x));
    }
    let opt = optimize("six", &[], &p, &OptimizeSettings::default()).unwrap();
    let rendered = arrayjit_codegen::RenderedC::render(&CSyntax::c(), &[&opt]).unwrap();
    let full = rendered.assemble(&|_, _| false);
    let direct = render_program(&CSyntax::c(), &[&opt]).unwrap();
    assert_eq!(full.source, direct.source);
    assert_eq!(full.shared, direct.shared);
    assert_eq!(full.shared.defined.len(), 6);
    let take: Vec<String> = full.shared.defined[..2]
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    let importing = rendered.assemble(&|name, _| take.iter().any(|t| t == name));
    assert_eq!(importing.shared.imported, take);
    assert_eq!(importing.shared.defined, full.shared.defined[2..].to_vec());
    for name in &take {
        assert!(
            importing
                .source
                .contains(&format!("static void (*{name})(")),
            "{name} is not a pointer"
        );
        assert!(!importing.source.contains(&format!(" void {name}(")));
    }
    assert_eq!(rendered.assemble(&|_, _| false).source, full.source);
}
