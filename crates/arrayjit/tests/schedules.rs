//! Schedules on the CPU backends (issue "schedules as data"): a blocked contraction gives the
//! same bits whatever the number of workers of the device and whichever backend runs it, and
//! the worker count is a checked setting. The schedule search (item 6) times the heuristics
//! and variants, stores the winner next to the compile cache, and compiling with the search on
//! uses the stored choice — which changes how the kernel runs, never what it computes; a
//! damaged stored choice costs a new search, never a failure.

use std::sync::Arc;
use std::time::Duration;

use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::opt::schedule::{ScheduleKind, ScheduleTuning};
use arrayjit::prelude::*;
use arrayjit::runtime::{
    Backend, Code, RuntimeConfig, ScheduleChoice, SearchSettings, backend_with_config,
};

/// Deterministic fractional values (so summation order shows in the bits).
fn values(len: usize, seed: usize) -> Vec<f64> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f64 / 333.0 - 1.5)
        .collect()
}

/// `c = a · b` by the einsum `spec`, the factors `a` and `b` (dims and values) in f32, `c`
/// of `c_dims` hosted.
fn product_of(
    spec: &str,
    (a_dims, a_values): (&[usize], &[f64]),
    (b_dims, b_values): (&[usize], &[f64]),
    c_dims: &[usize],
) -> (Assignments, Tnode) {
    let a = Tnode::new(Prec::F32, a_dims, &["a"]).unwrap();
    a.host().set_values(a_values).unwrap();
    let b = Tnode::new(Prec::F32, b_dims, &["b"]).unwrap();
    b.host().set_values(b_values).unwrap();
    let c = Tnode::new(Prec::F32, c_dims, &["c"]).unwrap();
    c.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let program = Assignments::einsum(
        spec,
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    (program, c)
}

/// `c = a · b` for `[m, k] × [k, n]` with fractional values (so summation order matters).
fn product(m: usize, k: usize, n: usize) -> (Assignments, Tnode) {
    product_of(
        "ik,kj->ij",
        (&[m, k], &values(m * k, 1)),
        (&[k, n], &values(k * n, 2)),
        &[m, n],
    )
}

/// A CPU backend whose devices run `workers` workers.
fn backend_with_workers(name: &str, workers: usize) -> Backend {
    backend_with_config(
        name,
        &RuntimeConfig {
            workers_per_device: Some(workers),
            ..Default::default()
        },
    )
    .unwrap()
}

/// The product of [`product`]'s factors (rounded to f32, as the kernel reads them), in f64.
fn product_reference(m: usize, k: usize, n: usize) -> Vec<f64> {
    let f32s = |v: Vec<f64>| -> Vec<f64> { v.iter().map(|&x| x as f32 as f64).collect() };
    let (a, b) = (f32s(values(m * k, 1)), f32s(values(k * n, 2)));
    (0..m * n)
        .map(|e| (0..k).map(|p| a[e / n * k + p] * b[p * n + e % n]).sum())
        .collect()
}

fn run_with_workers(backend_name: &str, workers: usize) -> Vec<u32> {
    let (program, c) = product(257, 129, 193);
    let backend = backend_with_workers(backend_name, workers);
    let code = backend
        .compile(CompileRequest::routine("product", &program))
        .unwrap();
    assert!(
        code.optimized()
            .schedules
            .iter()
            .any(|s| matches!(s.kind, ScheduleKind::Contraction(_))),
        "{}",
        code.optimized().schedule_report()
    );
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    c.host()
        .get_values()
        .unwrap()
        .iter()
        .map(|&v| (v as f32).to_bits())
        .collect()
}

#[test]
fn blocked_contractions_give_the_same_bits_for_any_worker_count() {
    let reference = run_with_workers("sync_cc", 1);
    for (backend, workers) in [
        ("sync_cc", 2),
        ("sync_cc", 3),
        ("multicore_cc", 1),
        ("multicore_cc", 4),
    ] {
        assert!(
            run_with_workers(backend, workers) == reference,
            "{backend} with {workers} workers differs from one worker"
        );
    }
}

/// Rows `0..rows` of `c = a · b` for `a` of `m` rows (`[m, k]`, or `[k, m]` when
/// `column_major`), `b` `[k, n]`, with values that depend only on each element's row, column
/// and depth — so the first rows of a tall product and a short one are the same numbers — run
/// on `sync_cc` with one worker; with the blocking the product ran with.
fn leading_rows(
    m: usize,
    (k, n): (usize, usize),
    column_major: bool,
    rows: usize,
) -> (Vec<u32>, arrayjit::opt::schedule::Blocking) {
    let value = |i: usize, p: usize, seed: usize| {
        ((i * 7919 + p * 6007 + seed * 104_729) % 1000) as f64 / 333.0 - 1.5
    };
    let (a_dims, spec, a_values): ([usize; 2], _, Vec<f64>) = if column_major {
        let a = (0..k * m).map(|e| value(e % m, e / m, 1)).collect();
        ([k, m], "ki,kj->ij", a)
    } else {
        let a = (0..m * k).map(|e| value(e / k, e % k, 1)).collect();
        ([m, k], "ik,kj->ij", a)
    };
    let b_values: Vec<f64> = (0..k * n).map(|e| value(e % n, e / n, 2)).collect();
    let (program, c) = product_of(spec, (&a_dims, &a_values), (&[k, n], &b_values), &[m, n]);
    let backend = backend_with_workers("sync_cc", 1);
    let code = backend
        .compile(CompileRequest::routine("rows", &program))
        .unwrap();
    let blocking = code
        .optimized()
        .schedules
        .iter()
        .find_map(|s| match &s.kind {
            ScheduleKind::Contraction(g) => Some(g.blocking),
            _ => None,
        })
        .expect("a blocked product");
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    Context::new(&stream).link(&code).unwrap().run().unwrap();
    stream.await_work().unwrap();
    let bits = c.host().get_values().unwrap()[..rows * n]
        .iter()
        .map(|&v| (v as f32).to_bits())
        .collect();
    (bits, blocking)
}

/// The product's two loop orders (`c::gemm`: `A` packed once when all its rows are one `mc`
/// block, else again for every block of `nc` columns) sum every element alike: the first
/// rows of a product taller than `mc` (the second order) have the same bits as the same rows
/// computed alone (the first), over several `kc` and `nc` blocks, with `A` read in place and
/// with `A` packed from a column-major layout.
#[test]
fn both_loop_orders_of_a_product_give_the_same_bits() {
    for column_major in [false, true] {
        // A small product first, for the device's blocking.
        let (_, blocking) = leading_rows(12, (40, 40), column_major, 12);
        let (k, n) = (2 * blocking.kc + 3, blocking.nc + 40);
        let (short, _) = leading_rows(12, (k, n), column_major, 12);
        let (tall, tall_blocking) = leading_rows(blocking.mc + 5, (k, n), column_major, 12);
        assert_eq!(tall_blocking.mc, blocking.mc);
        assert!(
            short == tall,
            "column-major A: {column_major}: the first rows differ between the loop orders"
        );
        // And they are the product (to f32 accuracy), not merely the same.
        let value = |i: usize, p: usize, seed: usize| {
            (((i * 7919 + p * 6007 + seed * 104_729) % 1000) as f64 / 333.0 - 1.5) as f32 as f64
        };
        for (e, bits) in short.iter().enumerate() {
            let (i, j) = (e / n, e % n);
            let want: f64 = (0..k).map(|p| value(i, p, 1) * value(j, p, 2)).sum();
            let got = f64::from(f32::from_bits(*bits));
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()) * (k as f64).sqrt(),
                "element ({i}, {j}): {got} != {want}"
            );
        }
    }
}

#[test]
fn the_worker_count_is_a_checked_setting() {
    use std::ffi::OsString;
    for bad in ["0", "1025", "many"] {
        let lookup = |name: &str| (name == "ARRAYJIT_CPU_WORKERS").then(|| OsString::from(bad));
        let err = CcConfig::from_lookup(&lookup).unwrap_err().to_string();
        assert!(
            err.contains("ARRAYJIT_CPU_WORKERS") && err.contains(bad),
            "{err}"
        );
    }
    let lookup = |name: &str| (name == "ARRAYJIT_CPU_WORKERS").then(|| OsString::from("3"));
    assert_eq!(
        CcConfig::from_lookup(&lookup).unwrap().workers_per_device,
        Some(3)
    );
    assert!(
        backend_with_config(
            "multicore_cc",
            &RuntimeConfig {
                workers_per_device: Some(0),
                ..Default::default()
            }
        )
        .is_err()
    );
    let b = backend_with_workers("sync_cc", 2);
    assert!(
        b.debug_info().contains("of 2 worker(s)"),
        "{}",
        b.debug_info()
    );
}

/// A pointwise chain and a row reduction large enough to be split over the workers.
fn split_nests() -> (Assignments, Vec<Tnode>, Tnode) {
    let (rows, cols) = (601, 517);
    let x = Tnode::new(Prec::F32, &[rows, cols], &["x"]).unwrap();
    x.host()
        .set_values(
            &(0..rows * cols)
                .map(|i| ((i * 7919) % 1000) as f64 / 333.0 - 1.5)
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let y = Tnode::new(Prec::F32, &[rows, cols], &["y"]).unwrap();
    let row_sum = Tnode::new(Prec::F32, &[rows], &["row_sum"]).unwrap();
    for t in [&y, &row_sum] {
        t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
            .unwrap();
    }
    let program = Assignments::pointwise_unop(&y, UnOp::Tanh, &x)
        .then(Assignments::pointwise_binop(&y, BinOp::Mul, &y, &x))
        .then(
            Assignments::einsum(
                "ij->i",
                BinOp::Add,
                &row_sum,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(y.clone())),
                true,
            )
            .unwrap(),
        );
    (program, vec![y, row_sum], x)
}

#[test]
fn split_loops_agree_with_the_interpreter_for_any_worker_count() {
    let mut reference: Option<Vec<Vec<u32>>> = None;
    for workers in [1, 2, 3, 4] {
        let (program, results, _x) = split_nests();
        let unoptimized = program.lower(&[]).unwrap();
        let mut env = arrayjit::ir::InterpEnv::from_host_arrays(&unoptimized);
        env.run(&unoptimized, &[]).unwrap();
        let backend = backend_with_workers("multicore_cc", workers);
        let code = backend
            .compile(CompileRequest::routine("split", &program))
            .unwrap();
        let report = code.optimized().schedule_report();
        assert!(
            code.optimized()
                .schedules
                .iter()
                .any(|s| s.parallel.is_some()),
            "{report}"
        );
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        stream.await_work().unwrap();
        let mut bits = Vec::new();
        for r in &results {
            let (want, got) = (env.values(r).unwrap(), r.host().get_values().unwrap());
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 2e-5 * (1.0 + w.abs()),
                    "{w} vs {g}\n{report}"
                );
            }
            bits.push(
                got.iter()
                    .map(|&v| (v as f32).to_bits())
                    .collect::<Vec<_>>(),
            );
        }
        match &reference {
            None => reference = Some(bits),
            Some(first) => assert!(first == &bits, "{workers} workers differ from one"),
        }
    }
}

/// Full reductions of 300,001 elements: split into fixed blocks over the workers. Integer
/// values make the sum exact (equal to the interpreter's whatever the order); fractional values
/// check that the bits do not depend on the worker count.
#[test]
fn split_full_reductions_are_exact_and_independent_of_workers() {
    use arrayjit::opt::schedule::ScheduleKind;
    let n = 300_001;
    let mut bits_seen: Option<Vec<u32>> = None;
    for (backend_name, workers) in [
        ("sync_cc", 1),
        ("multicore_cc", 2),
        ("multicore_cc", 3),
        ("sync_cc", 4),
    ] {
        let ints = Tnode::new(Prec::F32, &[n], &["ints"]).unwrap();
        ints.host()
            .set_values(
                &(0..n)
                    .map(|i| ((i * 37) % 11) as f64 - 5.0)
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let fracs = Tnode::new(Prec::F32, &[n], &["fracs"]).unwrap();
        fracs
            .host()
            .set_values(
                &(0..n)
                    .map(|i| ((i * 7919) % 1000) as f64 / 777.0 - 0.6)
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let outs: Vec<Tnode> = ["sum_ints", "sum_fracs", "max_fracs"]
            .iter()
            .map(|l| {
                let t = Tnode::new(Prec::F32, &[], &[l]).unwrap();
                t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
                    .unwrap();
                t
            })
            .collect();
        let reduce = |out: &Tnode, op: BinOp, x: &Tnode| {
            Assignments::einsum(
                "i->",
                op,
                out,
                AccumRhs::Unop(UnOp::Identity, Operand::Node(x.clone())),
                true,
            )
            .unwrap()
        };
        let program = reduce(&outs[0], BinOp::Add, &ints)
            .then(reduce(&outs[1], BinOp::Add, &fracs))
            .then(reduce(&outs[2], BinOp::Max, &fracs));
        let backend = backend_with_workers(backend_name, workers);
        let code = backend
            .compile(CompileRequest::routine("sums", &program))
            .unwrap();
        let split = code
            .optimized()
            .schedules
            .iter()
            .filter(|s| matches!(&s.kind, ScheduleKind::Reduction(p) if p.blocks.is_some()))
            .count();
        assert_eq!(split, 3, "{}", code.optimized().schedule_report());
        // And the kernel really runs them as blocks over the workers: three calls of split
        // reductions (two of them may share one statement function), 5 partials each.
        let src = code.source();
        assert_eq!(
            src.matches("reduction split into blocks of").count(),
            3,
            "{src}"
        );
        assert!(
            src.lines()
                .any(|l| l.contains(" partial") && l.trim_end().ends_with("[5];")),
            "{src}"
        );
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        stream.await_work().unwrap();
        let exact: f64 = (0..n).map(|i| ((i * 37) % 11) as f64 - 5.0).sum();
        assert_eq!(outs[0].host().get_values().unwrap(), vec![exact]);
        let max = (0..n)
            .map(|i| (((i * 7919) % 1000) as f64 / 777.0 - 0.6) as f32)
            .fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(outs[2].host().get_values().unwrap(), vec![max as f64]);
        let bits = vec![(outs[1].host().get_values().unwrap()[0] as f32).to_bits()];
        match &bits_seen {
            None => bits_seen = Some(bits),
            Some(b) => assert_eq!(b, &bits, "{backend_name} with {workers} workers"),
        }
    }
}

/// Row sums and maxima over rows of 64 (the rows of attention scores) run over vector
/// accumulators on every SIMD width — on AVX-512, one vector of 16 where the default four would
/// not fit twice in the row — and agree with sums in f64 (integer values: exact) and the maxima.
#[test]
fn short_rows_are_reduced_over_vector_accumulators() {
    let (rows, len) = (300, 64);
    let x = Tnode::new(Prec::F32, &[rows, len], &["x"]).unwrap();
    let value = |i: usize| ((i * 37) % 11) as f64 - 5.0;
    x.host()
        .set_values(&(0..rows * len).map(value).collect::<Vec<_>>())
        .unwrap();
    let out = |label: &str| {
        let t = Tnode::new(Prec::F32, &[rows], &[label]).unwrap();
        t.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
            .unwrap();
        t
    };
    let (sums, maxima) = (out("sums"), out("maxima"));
    let reduce = |out: &Tnode, op: BinOp| {
        Assignments::einsum(
            "ik->i",
            op,
            out,
            AccumRhs::Unop(UnOp::Identity, Operand::Node(x.clone())),
            true,
        )
        .unwrap()
    };
    let program = reduce(&sums, BinOp::Add).then(reduce(&maxima, BinOp::Max));
    for name in ["sync_cc", "multicore_cc"] {
        let backend = arrayjit::backend(name).unwrap();
        let code = backend
            .compile(CompileRequest::routine("rows", &program))
            .unwrap();
        let opt = code.optimized();
        let lanes: Vec<usize> = opt
            .schedules
            .iter()
            .flat_map(|s| match &s.kind {
                ScheduleKind::Fused(parts) => parts.iter().map(|p| p.kind.clone()).collect(),
                kind => vec![kind.clone()],
            })
            .filter_map(|k| match k {
                ScheduleKind::Reduction(p) => Some(p.lanes),
                _ => None,
            })
            .collect();
        assert_eq!(lanes.len(), 2, "{name}: {}", opt.schedule_report());
        assert!(
            lanes.iter().all(|&l| (4..=len / 2).contains(&l)),
            "{name}: {lanes:?}\n{}",
            opt.schedule_report()
        );
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        Context::new(&stream).link(&code).unwrap().run().unwrap();
        stream.await_work().unwrap();
        let row = |r: usize| (r * len..(r + 1) * len).map(value);
        assert_eq!(
            sums.host().get_values().unwrap(),
            (0..rows).map(|r| row(r).sum()).collect::<Vec<f64>>()
        );
        assert_eq!(
            maxima.host().get_values().unwrap(),
            (0..rows)
                .map(|r| row(r).fold(f64::NEG_INFINITY, f64::max))
                .collect::<Vec<f64>>()
        );
    }
}

/// Schedules are plain data a caller can change: the renderer derives each one again from its
/// statement and refuses one that does not match, instead of emitting code that could reach
/// outside its arrays.
#[test]
fn schedules_that_do_not_match_their_code_are_refused() {
    use arrayjit::opt::schedule::Schedule;
    let backend = arrayjit::backend("sync_cc").unwrap();
    let (program, _c) = product(65, 33, 47);
    let code = backend
        .compile(CompileRequest::routine("product", &program))
        .unwrap();
    let good = code.optimized().clone();
    let lowered = backend.lowered();
    lowered
        .render(&[&good])
        .and_then(|p| lowered.compile(p))
        .unwrap();
    let at = good
        .schedules
        .iter()
        .position(|s| matches!(s.kind, ScheduleKind::Contraction(_)))
        .unwrap();
    let tampered = |f: &dyn Fn(&mut Schedule)| {
        let mut opt = good.clone();
        f(&mut opt.schedules[at]);
        let err = lowered
            .render(&[&opt])
            .and_then(|p| lowered.compile(p))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match its statement"), "{err}");
    };
    tampered(&|s| {
        if let ScheduleKind::Contraction(g) = &mut s.kind {
            g.m.strides[0] += 1;
        }
    });
    tampered(&|s| {
        if let ScheduleKind::Contraction(g) = &mut s.kind {
            g.m.extent *= 2;
        }
    });
    tampered(&|s| {
        if let ScheduleKind::Contraction(g) = &mut s.kind {
            g.blocking.mr = 0;
        }
    });
    tampered(&|s| s.kind = ScheduleKind::Absorbed);
    let mut fewer = good.clone();
    fewer.schedules.pop();
    assert!(
        lowered
            .render(&[&fewer])
            .and_then(|p| lowered.compile(p))
            .is_err()
    );
}

/// The scratch plan is checked the same way: a slot outside the scratch buffer is refused.
#[test]
fn a_scratch_slot_outside_the_buffer_is_refused() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    // Array contraction would keep one element of each local per iteration of the fused loop
    // (the case is pointwise): off, so that the locals live in the scratch pool.
    backend.set_optimize_settings(arrayjit::opt::OptimizeSettings {
        enable_contraction: false,
        ..backend.optimize_settings()
    });
    let case = arrayjit_testing::scratch_locals().unwrap();
    let code = backend
        .compile(CompileRequest::routine("scratch", &case.program))
        .unwrap();
    let mut opt = code.optimized().clone();
    assert!(
        !opt.scratch.slots.is_empty(),
        "the case uses the scratch pool"
    );
    let lowered = backend.lowered();
    lowered.compile(lowered.render(&[&opt]).unwrap()).unwrap();
    opt.scratch.slots[0].offset += opt.scratch.total_bytes();
    let lowered = backend.lowered();
    let err = lowered
        .render(&[&opt])
        .and_then(|p| lowered.compile(p))
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the scratch buffer"), "{err}");
}

/// A `sync_cc` backend with its own compile cache (and so its own store of choices), timing
/// candidates briefly.
fn searching_backend(cache: &std::path::Path) -> Backend {
    let mut config = CcConfig::from_env().unwrap();
    config.cache_dir = Some(cache.to_path_buf());
    let b = Backend::from_lowered("sync_cc", Arc::new(cc::backend(config).unwrap()));
    b.set_search_settings(SearchSettings {
        batch_time: Duration::from_millis(1),
        batches: 1,
        max_compiles: 4,
        ..SearchSettings::default()
    });
    b
}

fn run(b: &Backend, program: &Assignments, c: &Tnode) -> (Vec<f64>, Code) {
    let code = b
        .compile(CompileRequest::routine("product", program))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    (c.host().get_values().unwrap(), code)
}

fn assert_close(got: &[f64], expected: &[f64]) {
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
            "element {i}: {g} vs {e}"
        );
    }
}

/// The register-tile height of the routine's blocked product.
fn tile_rows(code: &Code) -> usize {
    code.optimized()
        .schedules
        .iter()
        .find_map(|s| match &s.kind {
            ScheduleKind::Contraction(g) => Some(g.blocking.mr),
            _ => None,
        })
        .expect("a blocked product")
}

#[test]
fn a_search_times_candidates_and_stores_the_winner() {
    let dir = tempfile::tempdir().unwrap();
    let b = searching_backend(dir.path());
    let (program, _) = product(67, 45, 71);
    let report = b.search_schedule("product", &program, &[]).unwrap();
    let text = report.to_string();
    assert_eq!(report.candidates[0].note, "the heuristics", "{text}");
    assert!(report.candidates[0].seconds.unwrap() > 0.0, "{text}");
    // The heuristics plus three compiled variants (the limit), some merely the same kernels.
    let compiled = report
        .candidates
        .iter()
        .filter(|c| c.note.starts_with("timed"))
        .count();
    assert_eq!(compiled, 3, "{text}");
    assert!(report.stored, "{text}");
    assert!(text.contains("winner: "), "{text}");
    // The store holds the winner, in the form it is parsed back from.
    let stored = b
        .lowered()
        .load_schedule_choice(&report.key)
        .unwrap()
        .unwrap();
    assert_eq!(ScheduleChoice::parse(&stored), Ok(report.winner));
}

#[test]
fn compiling_with_the_search_on_uses_the_stored_choice() {
    let dir = tempfile::tempdir().unwrap();
    let b = searching_backend(dir.path());
    let (program, c) = product(67, 45, 71);
    let expected = product_reference(67, 45, 71);
    let (heuristic_values, heuristic_code) = run(&b, &program, &c);
    assert_close(&heuristic_values, &expected);
    // Store a choice unlike the heuristics' under the routine's key (as a search would).
    let key = b.search_schedule("product", &program, &[]).unwrap().key;
    let rows = if tile_rows(&heuristic_code) == 3 {
        5
    } else {
        3
    };
    let choice = ScheduleChoice {
        tuning: ScheduleTuning {
            register_rows: Some(rows),
            block_scale_log2: [-1, -2, 0],
            reduction_vectors: 2,
            ..ScheduleTuning::default()
        },
        loop_fusion: true,
    };
    assert!(
        b.lowered()
            .store_schedule_choice(&key, &choice.to_string())
            .unwrap()
    );
    // Search off (the default here): the store is not consulted.
    b.set_schedule_search(Some(false));
    assert_eq!(
        tile_rows(&run(&b, &program, &c).1),
        tile_rows(&heuristic_code)
    );
    // Search on: the stored choice is used, and the product is still right.
    b.set_schedule_search(Some(true));
    let (tuned_values, tuned_code) = run(&b, &program, &c);
    assert_eq!(tile_rows(&tuned_code), rows);
    assert_close(&tuned_values, &expected);
}

#[test]
fn a_damaged_stored_choice_means_searching_again() {
    let dir = tempfile::tempdir().unwrap();
    let b = searching_backend(dir.path());
    let (program, c) = product(33, 40, 65);
    let expected = product_reference(33, 40, 65);
    let key = b.search_schedule("product", &program, &[]).unwrap().key;
    let path = dir.path().join("schedules").join(format!("{key}.txt"));
    std::fs::write(&path, "register_rows=99 nonsense").unwrap();
    b.set_schedule_search(Some(true));
    let (got, _) = run(&b, &program, &c);
    assert_close(&got, &expected);
    // The new search stored a valid choice again.
    let stored = std::fs::read_to_string(&path).unwrap();
    assert!(ScheduleChoice::parse(&stored).is_ok(), "{stored}");
}

#[test]
fn routines_without_knobs_compile_once() {
    // An elementwise routine: no product, no reduction; every variant renders the same source.
    let dir = tempfile::tempdir().unwrap();
    let b = searching_backend(dir.path());
    let x = Tnode::new(Prec::F32, &[1000], &["x"]).unwrap();
    x.host().set_values(&values(1000, 3)).unwrap();
    let y = Tnode::new(Prec::F32, &[1000], &["y"]).unwrap();
    y.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let program = Assignments::pointwise_unop(&y, UnOp::Relu, &x);
    let report = b.search_schedule("relu", &program, &[]).unwrap();
    assert!(
        report.candidates[1..]
            .iter()
            .all(|c| c.note == "the same kernels as an earlier candidate"),
        "{report}"
    );
    assert_eq!(report.speedup(), Some(1.0), "{report}");
}

/// A statement without loops holding several reductions — a gradient norm's sum of each
/// parameter's squares — gets each reduction as a statement of its own on the CPU backends,
/// into a one-element local, so that the reductions over arrays of the same shape render the
/// same code and are compiled once; the total agrees with the sums computed here (integer
/// values: exact in any order).
#[test]
fn reductions_in_a_statement_without_loops_compile_once_per_shape() {
    use arrayjit::tensor::{Tensor, forward_program};
    let values = |n: usize, seed: usize| -> Vec<f64> {
        (0..n).map(|i| ((i * seed) % 7) as f64 - 3.0).collect()
    };
    let shapes: [(&[usize], usize); 4] = [
        (&[64, 100], 3),
        (&[64, 100], 5),
        (&[300], 11),
        (&[64, 100], 13),
    ];
    let mut total = Tensor::scalar(0.0).unwrap();
    let mut expected = 0.0;
    for (i, (dims, seed)) in shapes.iter().enumerate() {
        let n: usize = dims.iter().product();
        let v = values(n, *seed);
        expected += v.iter().map(|x| x * x).sum::<f64>();
        let x = Tensor::input(Prec::F32, dims, &format!("x{i}"), &v).unwrap();
        total = total.add(&x.mul(&x).unwrap().sum_all().unwrap()).unwrap();
    }
    total
        .node()
        .update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    for name in ["sync_cc", "multicore_cc"] {
        let backend = arrayjit::backend(name).unwrap();
        let code = backend
            .compile(CompileRequest::routine(
                "norms",
                &forward_program(&[&total]),
            ))
            .unwrap();
        let opt = code.optimized();
        let hoisted = opt
            .schedules
            .iter()
            .filter(|s| s.why.contains("hoisted out of a statement without loops"))
            .count();
        // Per reduction its initialization and its nest, then the statement that adds them.
        assert_eq!(hoisted, 2 * shapes.len() + 1, "{}", opt.schedule_report());
        // Two distinct reductions (the three over 64 x 100 share one function), each defined
        // once: a statement function's definition names it with its parameters.
        let src = code.source();
        let definitions: std::collections::BTreeSet<&str> = src
            .lines()
            .filter(|l| l.contains("void aj_st_") && l.contains("const restrict p1"))
            .filter_map(|l| l.split("void ").nth(1)?.split('(').next())
            .collect();
        let calls = |f: &str| src.matches(&format!("{f}(")).count();
        let reductions: Vec<&str> = definitions
            .iter()
            .copied()
            .filter(|f| calls(f) >= 2)
            .collect();
        assert!(
            reductions.iter().any(|f| calls(f) == 4),
            "the three 64 x 100 reductions share one function: {definitions:?}\n{src}"
        );
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        stream.await_work().unwrap();
        assert_eq!(total.values().unwrap(), vec![expected], "{name}");
    }
}
