//! Guarded products ([`arrayjit::ir::Projections::guards`]) on the CPU backends at sizes that
//! cross every cache block: rows beyond one `mc` block, depths beyond one `kc` block, columns
//! beyond one `nc` block. Each orientation of the guard (on the result's rows and columns, on
//! the depth and the rows either way, on the depth and the columns, on all three, on a
//! column-major result) gives the same bits for 1, 2 and 3 workers, and agrees with an `f64`
//! reference that skips the guarded terms.

use arrayjit::ir::EinsumGuard;
use arrayjit::opt::schedule::{Blocking, ScheduleKind};
use arrayjit::prelude::*;
use arrayjit::runtime::{Backend, Context, RuntimeConfig, backend_with_config};

fn backend_with_workers(workers: usize) -> Backend {
    backend_with_config(
        "multicore_cc",
        &RuntimeConfig {
            workers_per_device: Some(workers),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Deterministic fractional values, exact in `f32`.
fn value(flat: usize, seed: usize) -> f64 {
    (((flat * 7919 + seed * 104_729) % 1000) as f64 / 256.0 - 1.9) as f32 as f64
}

/// The letters' sizes of a case.
struct Sizes<'a>(&'a [(char, usize)]);

impl Sizes<'_> {
    fn of(&self, c: char) -> usize {
        self.0.iter().find(|(l, _)| *l == c).map_or(1, |(_, s)| *s)
    }
    fn dims(&self, letters: &str) -> Vec<usize> {
        letters.chars().map(|c| self.of(c)).collect()
    }
}

/// The guarded product `c = a ·spec· b` over `sizes`, run on `backend`: the result's bits and
/// the blocking its schedule chose.
fn run(
    backend: &Backend,
    spec: &str,
    sizes: &Sizes,
    guard: &EinsumGuard,
) -> (Vec<u32>, Option<Blocking>) {
    let (inputs, out) = spec.split_once("->").unwrap();
    let (l, r) = inputs.split_once(',').unwrap();
    let factor = |letters: &str, label: &str, seed: usize| {
        let dims = sizes.dims(letters);
        let t = Tnode::new(Prec::F32, &dims, &[label]).unwrap();
        let n: usize = dims.iter().product();
        t.host()
            .set_values(&(0..n).map(|i| value(i, seed)).collect::<Vec<_>>())
            .unwrap();
        t
    };
    let (a, b) = (factor(l, "a", 1), factor(r, "b", 2));
    let c = Tnode::new(Prec::F32, &sizes.dims(out), &["c"]).unwrap();
    c.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test: result")
        .unwrap();
    let program = Assignments::einsum_guarded(
        spec,
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
        std::slice::from_ref(guard),
    )
    .unwrap();
    let code = backend
        .compile(CompileRequest::routine("guarded", &program))
        .unwrap();
    let blocking = code
        .optimized()
        .schedules
        .iter()
        .find_map(|s| match &s.kind {
            ScheduleKind::Contraction(g) => {
                assert!(g.guard.is_some(), "{g}");
                Some(g.blocking)
            }
            _ => None,
        });
    let stream = backend.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    let bits = c
        .host()
        .get_values()
        .unwrap()
        .into_iter()
        .map(|v| (v as f32).to_bits())
        .collect();
    (bits, blocking)
}

/// The `f64` reference: `c[out] = Σ a[l] · b[r]` over the terms where the guard holds.
fn reference(spec: &str, sizes: &Sizes, guard: &EinsumGuard) -> Vec<f64> {
    let (inputs, out) = spec.split_once("->").unwrap();
    let (l, r) = inputs.split_once(',').unwrap();
    let mut letters: Vec<char> = Vec::new();
    for c in out.chars().chain(l.chars()).chain(r.chars()) {
        if !letters.contains(&c) {
            letters.push(c);
        }
    }
    let extents: Vec<usize> = letters.iter().map(|&c| sizes.of(c)).collect();
    let flat = |word: &str, at: &[usize]| {
        word.chars().fold(0, |acc, c| {
            let p = letters.iter().position(|&x| x == c).unwrap();
            acc * sizes.of(c) + at[p]
        })
    };
    let mut c = vec![0.0; sizes.dims(out).iter().product()];
    let total: usize = extents.iter().product();
    let mut at = vec![0usize; letters.len()];
    for mut x in 0..total {
        for p in (0..letters.len()).rev() {
            at[p] = x % extents[p];
            x /= extents[p];
        }
        let g: i64 = guard.offset
            + guard
                .terms
                .iter()
                .map(|(k, letter)| k * at[letters.iter().position(|x| x == letter).unwrap()] as i64)
                .sum::<i64>();
        if g >= 0 {
            c[flat(out, &at)] += value(flat(l, &at), 1) * value(flat(r, &at), 2);
        }
    }
    c
}

#[test]
fn guarded_products_cross_every_block_and_agree_for_any_worker_count() {
    let causal = EinsumGuard::at_most('s', 't', 0);
    // The device's blocking, from a small guarded product.
    let (_, blocking) = run(
        &backend_with_workers(1),
        "te,se->ts",
        &Sizes(&[('t', 40), ('s', 40), ('e', 30)]),
        &causal,
    );
    let b = blocking.expect("a guarded product is blocked");
    let (long, short) = (b.mc.max(b.kc).max(b.nc) + 5, 40);
    let three_terms = EinsumGuard {
        terms: vec![(1, 't'), (-1, 's'), (-1, 'e')],
        statics: Vec::new(),
        offset: 30,
    };
    for (spec, guard) in [
        ("te,se->ts", &causal),
        ("ts,se->te", &causal),
        ("ts,te->se", &causal),
        ("te,ts->es", &causal),
        ("te,se->st", &causal),
        ("ts,se->te", &three_terms),
    ] {
        let sizes = Sizes(&[('t', long), ('s', long), ('e', short)]);
        let want = reference(spec, &sizes, guard);
        let (one, _) = run(&backend_with_workers(1), spec, &sizes, guard);
        for workers in [2, 3] {
            let (many, _) = run(&backend_with_workers(workers), spec, &sizes, guard);
            assert!(
                one == many,
                "{spec} where {guard}: 1 and {workers} workers differ"
            );
        }
        for (e, (bits, want)) in one.iter().zip(&want).enumerate() {
            let got = f64::from(f32::from_bits(*bits));
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()) * (long as f64).sqrt(),
                "{spec} where {guard}: element {e}: {got} != {want}"
            );
        }
    }
}
