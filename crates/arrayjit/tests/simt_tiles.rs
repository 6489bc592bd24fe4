//! The GPU's tiled `f32` product ([`arrayjit::opt::schedule::gpu::simt`]) in every variant —
//! 16-, 32-, 64- and 128-tiles, one and two buffers, factors read by 128-bit loads and element by
//! element, along `k` and along the result side — agrees with the interpreter on every GPU
//! backend here (`cuda_emu`, `wgpu`, `cuda`), and on `cuda_emu` and `cuda` bit for bit with
//! values whose sums round: the tiles keep the optimized loop's order of summation (fused
//! multiply-adds in the order of `k`).

use std::collections::BTreeSet;

use arrayjit::ir::{AccumRhs, Assignments, BinOp, MemoryMode, MemoryType, Operand, Prec, Tnode};
use arrayjit::opt::OptimizeSettings;
use arrayjit::opt::schedule::gpu::SimtTile;
use arrayjit::opt::schedule::{GpuPass, ScheduleKind};
use arrayjit::runtime::{CompileRequest, Context};
use arrayjit_testing::{check_case, simt_product_cases};

/// The SIMT layouts of a routine's schedules.
fn layouts(schedules: &[arrayjit::opt::schedule::Schedule]) -> Vec<SimtTile> {
    schedules
        .iter()
        .filter_map(|s| match &s.kind {
            ScheduleKind::Gpu(GpuPass::Tiles { layout, .. }) => Some(*layout),
            _ => None,
        })
        .collect()
}

/// `base` (a backend's settings) with the tile tuned to `tile` and, where `one_buffer`,
/// shared memory just short of two buffers of it.
fn settings(base: &OptimizeSettings, tile: usize, one_buffer: bool) -> Option<OptimizeSettings> {
    let mut s = base.clone();
    let limits = s.schedule.gpu.as_mut()?;
    if one_buffer {
        limits.max_shared_bytes = limits.max_shared_bytes.min(SimtTile::bytes(tile, 2) - 4);
    }
    s.schedule.tuning.gpu_tile = Some(tile);
    Some(s)
}

#[test]
fn every_simt_variant_agrees_with_the_interpreter() {
    let mut ran = 0;
    for b in arrayjit_testing::all_backends_under_test().unwrap() {
        let original = b.optimize_settings();
        let mut seen = BTreeSet::new();
        for tile in [16, 32, 64, 128] {
            for one_buffer in [false, true] {
                let Some(s) = settings(&original, tile, one_buffer) else {
                    continue;
                };
                b.set_optimize_settings(s);
                for case in simt_product_cases().unwrap() {
                    let code = b
                        .compile(CompileRequest::routine(&case.name, &case.program))
                        .unwrap();
                    let found = layouts(&code.optimized().schedules);
                    assert_eq!(found.len(), 1, "{}: {}", case.name, b.name());
                    let l = found[0];
                    if l.tile != tile {
                        // The device's own limits leave no room for this tile.
                        continue;
                    }
                    seen.insert((l.tile, l.stages, l.vector, l.order.band_rows > 1));
                    check_case(&case, &b).unwrap_or_else(|e| {
                        panic!("{}: {tile}-tiles, {} buffer(s): {e}", b.name(), l.stages)
                    });
                }
            }
        }
        b.set_optimize_settings(original);
        if seen.is_empty() {
            continue;
        }
        ran += 1;
        eprintln!("{}: {seen:?}", b.name());
        // Every tile in both pipelines; 128-bit loads on and off on both factors.
        for tile in [16, 32, 64, 128] {
            for stages in [1, 2] {
                assert!(
                    seen.iter().any(|s| s.0 == tile && s.1 == stages),
                    "{}: {tile}-tiles with {stages} buffer(s) never ran: {seen:?}",
                    b.name()
                );
            }
        }
        for f in 0..2 {
            for v in [false, true] {
                assert!(seen.iter().any(|s| s.2[f] == v), "{}: {seen:?}", b.name());
            }
        }
        // Tiles taken row by row and in bands of rows (the 16-tiles of the widest case).
        for banded in [false, true] {
            assert!(seen.iter().any(|s| s.3 == banded), "{}: {seen:?}", b.name());
        }
    }
    if ran == 0 {
        eprintln!("skipped: no GPU backend here");
    }
}

/// Values whose products and sums round in `f32`.
fn rounding_values(len: usize, seed: f64) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f64 * 0.7 + seed).sin() * 1.37).powi(3) as f32)
        .collect()
}

/// `c = a · b`, `[m, k] · [k, n]`, with [`rounding_values`] (seeds 0.3 and 1.1).
fn rounding_product(m: usize, k: usize, n: usize) -> (Assignments, Tnode) {
    let node = |dims: &[usize], label: &str, seed: f64| {
        let t = Tnode::new(Prec::F32, dims, &[label]).unwrap();
        let len: usize = dims.iter().product();
        let values: Vec<f64> = rounding_values(len, seed)
            .iter()
            .map(|&v| v.into())
            .collect();
        t.host().set_values(&values).unwrap();
        t
    };
    let a = node(&[m, k], "a", 0.3);
    let b = node(&[k, n], "b", 1.1);
    let c = Tnode::new(Prec::F32, &[m, n], &["c"]).unwrap();
    c.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "compared")
        .unwrap();
    let program = Assignments::einsum(
        "mk,kn->mn",
        BinOp::Add,
        &c,
        AccumRhs::Binop(BinOp::Mul, Operand::Node(a), Operand::Node(b)),
        true,
    )
    .unwrap();
    (program, c)
}

#[test]
fn simt_tiles_keep_the_bits_of_the_loop_on_cuda() {
    let backends: Vec<_> = arrayjit_testing::all_backends_under_test()
        .unwrap()
        .into_iter()
        .filter(|b| b.name() == "cuda_emu" || b.name() == "cuda")
        .collect();
    if backends.is_empty() {
        eprintln!("skipped: neither cuda_emu nor cuda is available here");
    }
    for b in backends {
        same_bits_in_every_tile(&b);
    }
}

/// The rounding product in 16-, 32-, 64- and 128-tiles on `b`, bit for bit against the loop.
fn same_bits_in_every_tile(b: &arrayjit::runtime::Backend) {
    let (m, k, n) = (140, 200, 132);
    let (av, bv) = (rounding_values(m * k, 0.3), rounding_values(k * n, 1.1));
    // The optimized loop nest: each element from zero, fused multiply-adds in the order of
    // `k` (and, to show the values do round, `k` backwards).
    let summed = |order: &dyn Fn() -> Box<dyn Iterator<Item = usize>>| -> Vec<u32> {
        (0..m * n)
            .map(|e| {
                order()
                    .fold(0f32, |acc, kk| {
                        av[(e / n) * k + kk].mul_add(bv[kk * n + e % n], acc)
                    })
                    .to_bits()
            })
            .collect()
    };
    let want = summed(&|| Box::new(0..k));
    assert_ne!(want, summed(&|| Box::new((0..k).rev())));
    let original = b.optimize_settings();
    for tile in [16, 32, 64, 128] {
        b.set_optimize_settings(settings(&original, tile, false).unwrap());
        let (program, c) = rounding_product(m, k, n);
        let code = b
            .compile(CompileRequest::routine("rounding", &program))
            .unwrap();
        let fused = code.optimized().schedules.iter().any(|s| {
            matches!(&s.kind, ScheduleKind::Gpu(GpuPass::Tiles { layout, fused: true, .. })
                if layout.tile == tile)
        });
        assert!(fused, "{}", code.optimized().schedule_report());
        let stream = b.get_device(0).unwrap().new_stream().unwrap();
        let routine = Context::new(&stream).link(&code).unwrap();
        routine.run().unwrap();
        routine.context().to_host(&c).unwrap();
        let got: Vec<u32> = c
            .host()
            .array()
            .unwrap()
            .to_vec_f64()
            .unwrap()
            .iter()
            .map(|&g| (g as f32).to_bits())
            .collect();
        let differ = want.iter().zip(&got).filter(|(w, g)| w != g).count();
        assert_eq!(
            differ,
            0,
            "{}: {tile}-tiles: {differ} elements differ in bits",
            b.name()
        );
    }
    b.set_optimize_settings(original);
}
