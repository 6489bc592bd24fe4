//! Per-CPU tuning of blocked products: `tune` times the candidate cache shares, stores the
//! fastest in the compile cache, and later backends block their products with it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::backends::cpu::tuning::{SharesSource, table_shares};
use arrayjit::backends::device_info::CpuInfo;
use arrayjit::opt::schedule::{Blocking, CacheShares, ScheduleKind, StreamFetch};
use arrayjit::prelude::*;
use arrayjit::runtime::TuneSettings;

/// A `sync_cc` backend with its own compile cache (and so its own store of choices).
fn cached_backend(cache: &std::path::Path) -> Backend {
    let mut config = CcConfig::from_env().unwrap();
    config.cache_dir = Some(cache.to_path_buf());
    Backend::from_lowered("sync_cc", Arc::new(cc::backend(config).unwrap()))
}

/// `c[m, n] = a[m, k] · b[k, n]` with small integer entries (exact in f32), and `c`.
fn product(m: usize, k: usize, n: usize) -> (Assignments, Tnode, Vec<f64>) {
    let c = common::hosted_output(&[m, n], "c");
    let (program, expected) = common::product_into(&c, m, k, n);
    (program, c, expected)
}

/// The blocking of the routine's blocked product, and its values after one run.
fn run_product(b: &Backend, m: usize, k: usize, n: usize) -> Blocking {
    let (program, c, expected) = product(m, k, n);
    let code = b
        .compile(CompileRequest::routine("product", &program))
        .unwrap();
    let stream = b.get_device(0).unwrap().new_stream().unwrap();
    let routine = Context::new(&stream).link(&code).unwrap();
    routine.run().unwrap();
    stream.await_work().unwrap();
    assert_eq!(c.host().get_values().unwrap(), expected);
    code.optimized()
        .schedules
        .iter()
        .find_map(|s| match &s.kind {
            ScheduleKind::Contraction(g) => Some(g.blocking),
            _ => None,
        })
        .expect("a blocked product")
}

/// The blocking `shares` give f32 products on this CPU.
fn expected_blocking(b: &Backend, shares: CacheShares) -> Blocking {
    let s = b.optimize_settings().schedule;
    Blocking::for_cpu(s.f32_lanes, s.vector_registers, 4, s.cache_bytes, shares)
}

#[test]
fn without_a_stored_choice_products_use_the_table_or_the_vendor_default() {
    let dir = tempfile::tempdir().unwrap();
    let b = cached_backend(dir.path());
    let expected = table_shares(CpuInfo::host());
    assert_eq!(b.lowered().cpu_shares(), expected);
    assert_eq!(b.optimize_settings().schedule.cache_shares, expected.shares);
    assert_eq!(
        run_product(&b, 70, 300, 90),
        expected_blocking(&b, expected.shares)
    );
}

#[test]
fn a_stored_choice_blocks_the_products_of_later_backends() {
    let dir = tempfile::tempdir().unwrap();
    let first = cached_backend(dir.path());
    // Shares no table entry uses, so the blocking shows where it came from.
    let odd = CacheShares {
        sliver_of_l1: 1,
        block_of_l2: 1,
        stream_fetch: StreamFetch::L1,
    };
    assert!(first.lowered().store_cpu_shares(odd).unwrap());
    let later = cached_backend(dir.path());
    let shares = later.lowered().cpu_shares();
    assert_eq!((shares.shares, shares.source), (odd, SharesSource::Stored));
    let blocking = run_product(&later, 70, 300, 90);
    assert_eq!(blocking, expected_blocking(&later, odd));
    assert_eq!(blocking.stream_fetch, StreamFetch::L1);
    // A backend with another cache does not see it.
    let other = tempfile::tempdir().unwrap();
    assert_ne!(
        cached_backend(other.path()).lowered().cpu_shares().source,
        SharesSource::Stored
    );
}

#[test]
fn tune_times_the_candidates_stores_the_winner_and_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = cached_backend(dir.path());
    let before = b.lowered().cpu_shares();
    let report = b
        .tune_cpu_products(&TuneSettings {
            tokens: 48,
            streamed_bytes: Some(1 << 20),
            ..TuneSettings::default()
        })
        .unwrap();
    let text = report.to_string();
    // The choice in use is timed first; every candidate is either timed or the same blocking
    // as one timed before it.
    assert_eq!(report.before, before, "{text}");
    assert_eq!(report.candidates[0].shares, before.shares, "{text}");
    assert_eq!(
        report.candidates.len(),
        CacheShares::SLIVER_CHOICES.len() * CacheShares::BLOCK_CHOICES.len()
            + usize::from(
                !CacheShares::SLIVER_CHOICES.contains(&before.shares.sliver_of_l1)
                    || !CacheShares::BLOCK_CHOICES.contains(&before.shares.block_of_l2)
            ),
        "{text}"
    );
    for c in &report.candidates {
        assert!(c.seconds.is_some_and(|s| s > 0.0), "{text}");
        assert!(
            c.note.starts_with("timed") || c.note.starts_with("the same code"),
            "{text}"
        );
    }
    // Every candidate of the blocks fetches at the level in use; then each level is timed
    // with the blocks chosen, the level in use first.
    assert!(
        report
            .candidates
            .iter()
            .all(|c| c.shares.stream_fetch == before.shares.stream_fetch),
        "{text}"
    );
    let levels: Vec<StreamFetch> = report
        .fetch_candidates
        .iter()
        .map(|c| c.shares.stream_fetch)
        .collect();
    assert_eq!(levels.len(), StreamFetch::CHOICES.len(), "{text}");
    assert_eq!(levels[0], before.shares.stream_fetch, "{text}");
    assert!(
        StreamFetch::CHOICES.iter().all(|l| levels.contains(l)),
        "{text}"
    );
    for c in &report.fetch_candidates {
        assert!(c.seconds.is_some_and(|s| s > 0.0), "{text}");
        assert_eq!(
            (c.shares.sliver_of_l1, c.shares.block_of_l2),
            (report.winner.sliver_of_l1, report.winner.block_of_l2),
            "{text}"
        );
    }
    // Two matrices of 768 × 3072 f32 at least, whatever the bytes asked.
    assert_eq!(report.streamed_bytes, (2 * 768 * 3072 * 4) as f64, "{text}");
    assert!(
        text.contains("stream_fetch=l1: ") && text.contains("GB/s"),
        "{text}"
    );
    assert!(
        report
            .fetch_candidates
            .iter()
            .any(|c| c.shares == report.winner)
    );
    assert!(report.stored, "{text}");
    assert!(text.contains("chosen: "), "{text}");
    // This backend uses the winner now, and a later one finds it stored.
    assert_eq!(b.optimize_settings().schedule.cache_shares, report.winner);
    let later = cached_backend(dir.path()).lowered().cpu_shares();
    assert_eq!(
        (later.shares, later.source),
        (report.winner, SharesSource::Stored)
    );
}

#[test]
fn a_spent_budget_keeps_the_choice_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let b = cached_backend(dir.path());
    let report = b
        .tune_cpu_products(&TuneSettings {
            tokens: 16,
            streamed_bytes: Some(1 << 20),
            time_budget: Duration::ZERO,
            ..TuneSettings::default()
        })
        .unwrap();
    assert_eq!(report.winner, report.before.shares);
    assert!(
        report.candidates[1..]
            .iter()
            .chain(&report.fetch_candidates[1..])
            .all(|c| c.seconds.is_none() && c.note.contains("budget")),
        "{report}"
    );
    // The first of each part is timed: the choice in use.
    assert!(report.candidates[0].seconds.is_some() && report.fetch_candidates[0].seconds.is_some());
}

#[test]
fn tuning_a_gpu_backend_says_what_tune_applies_to() {
    let b = arrayjit::backend("cuda_emu").unwrap();
    if b.check_available().is_err() {
        return;
    }
    let err = b
        .tune_cpu_products(&TuneSettings::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("sync_cc"), "{err}");
}
