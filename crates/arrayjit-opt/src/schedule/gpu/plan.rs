//! A routine's GPU plan as data people can read: each pass's shape, its groups × invocations,
//! the independent work and the longest reduction its statement offers, its operations and
//! bytes, and an estimate of its time on a [`DeviceModel`] (compute units, clock, `f32` lanes,
//! memory bandwidth, launch cost). Made from the recorded schedules alone, so it needs no
//! device: the same plan is listed for a GPU at hand or a named one.
//!
//! **Estimate.** A pass of `ops` operations moving `bytes` on `P = groups × invocations`
//! invocations takes `max(ops / (min(P, lanes) · clock), bytes / (bandwidth · min(1, P /
//! (units · 512))), ops / P · 4 / clock)` plus one launch each: work spreads over the lanes it
//! can occupy, memory reaches its bandwidth only with enough invocations in flight, and each
//! invocation's share runs as a chain of at least 4 cycles an operation (divided by the
//! rate's excess over two operations a cycle on matrix units). Products count two
//! operations per lane and cycle (fused multiply-adds); products on matrix units count the
//! units' rate ([`DeviceModel::matrix_ops_per_unit_cycle`]) spread over the lanes. It is a floor, for comparing passes
//! and plans, not a promise.
//!
//! Passes joined into one launch ([`super::join`]) share it: the first part carries the
//! launch and the estimate of the whole — each part's time without its launch, weighted by
//! its share of the groups that keep the device busy, summed, and at least the longest part's
//! — the others are listed with no launch of their own.

use std::collections::HashSet;
use std::fmt;

use super::analysis::{
    Accumulation, grid_loops, independent_work, longest_reduction, operations, row_items,
};
use super::{GpuLimits, GpuPass, JoinedLaunch, RowRole};
use crate::schedule::{Schedule, ScheduleKind};
use arrayjit_ir::low_level::{LowLevel, ScalarExpr};

/// What the estimates assume of a GPU: its limits and its speeds.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceModel {
    /// A readable name, e.g. `"NVIDIA H100 SXM (sm_90)"`.
    pub name: String,
    /// The CUDA architecture (`sm_90`), where the model is of a CUDA device.
    pub arch: Option<String>,
    /// What passes may assume (planning uses these).
    pub limits: GpuLimits,
    /// Clock in GHz.
    pub clock_ghz: f64,
    /// `f32` lanes per compute unit (FP32 cores per SM).
    pub f32_lanes_per_unit: u32,
    /// Memory bandwidth in bytes per second.
    pub memory_bytes_per_s: f64,
    /// Cost of one launch in microseconds.
    pub launch_us: f64,
    /// Operations per cycle of one compute unit's matrix units on 16-bit factors (dense; half
    /// of it for TF32); 0 without matrix units.
    pub matrix_ops_per_unit_cycle: f64,
}

impl DeviceModel {
    fn cuda(name: &str, arch: &str, sms: usize, clock_ghz: f64, bandwidth_tb_s: f64) -> Self {
        DeviceModel {
            name: format!("{name} ({arch})"),
            arch: Some(arch.to_string()),
            limits: GpuLimits {
                compute_units: sms,
                ..GpuLimits::cuda_arch(arch).unwrap_or_else(GpuLimits::cuda_minimum)
            },
            clock_ghz,
            f32_lanes_per_unit: if arch == "sm_80" { 64 } else { 128 },
            memory_bytes_per_s: bandwidth_tb_s * 1e12,
            launch_us: 2.5,
            // Dense 16-bit tensor-core rate: 4096 operations per SM and cycle on sm_90
            // (989 TFLOP/s on an H100 SXM), 2048 on sm_80 (312 TFLOP/s on an A100).
            matrix_ops_per_unit_cycle: if arch == "sm_80" { 2048.0 } else { 4096.0 },
        }
    }

    /// NVIDIA H100 SXM: 132 SMs at 1.98 GHz, 128 FP32 lanes each, 3.35 TB/s (`sm_90`).
    pub fn h100() -> DeviceModel {
        DeviceModel::cuda("NVIDIA H100 SXM", "sm_90", 132, 1.98, 3.35)
    }

    /// NVIDIA H200: as the H100 with 4.8 TB/s (`sm_90`).
    pub fn h200() -> DeviceModel {
        DeviceModel::cuda("NVIDIA H200", "sm_90", 132, 1.98, 4.8)
    }

    /// NVIDIA A100 SXM: 108 SMs at 1.41 GHz, 64 FP32 lanes each, 2.0 TB/s (`sm_80`).
    pub fn a100() -> DeviceModel {
        DeviceModel::cuda("NVIDIA A100 SXM", "sm_80", 108, 1.41, 2.0)
    }

    /// The model of a device named `h100`, `h200`, `a100`, or of an architecture (`sm_90`:
    /// the H100, `sm_80`: the A100); `None` for another name.
    pub fn named(name: &str) -> Option<DeviceModel> {
        match name.to_ascii_lowercase().as_str() {
            "h100" | "sm_90" | "sm90" => Some(DeviceModel::h100()),
            "h200" => Some(DeviceModel::h200()),
            "a100" | "sm_80" | "sm80" => Some(DeviceModel::a100()),
            _ => None,
        }
    }

    /// The names [`DeviceModel::named`] knows.
    pub const NAMES: [&'static str; 5] = ["h100", "h200", "a100", "sm_90", "sm_80"];

    /// A device known only by its limits (speeds of an H100 scaled by its compute units), for
    /// plans of a device at hand.
    pub fn from_limits(name: &str, limits: GpuLimits) -> DeviceModel {
        DeviceModel {
            name: name.to_string(),
            arch: None,
            limits,
            ..DeviceModel::h100()
        }
    }

    fn units(&self) -> f64 {
        self.limits.compute_units.max(1) as f64
    }
}

/// One pass of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedPass {
    /// The top-level statement it runs.
    pub statement: usize,
    /// Its shape: `zero`, `tiles`, `matrix tiles`, `grid`, `rows`, `reduction`, `grid
    /// reduction`, `single`.
    pub shape: &'static str,
    /// Launches (2 for a grid reduction; 1 for the first part of a joined launch, 0 for its
    /// other parts).
    pub launches: u32,
    /// The statement whose launch runs this pass with others ([`super::join`]), if any.
    pub joined_into: Option<usize>,
    /// Groups of its (largest) launch.
    pub groups: u64,
    /// Invocations per group.
    pub threads: u32,
    /// Iterations of the statement's independent loops (see
    /// [`super::analysis::independent_work`]).
    pub independent: u64,
    /// The most steps one element of the statement accumulates.
    pub longest_reduction: u64,
    /// The most steps one group (or, in a grid pass, one invocation) reduces alone.
    pub reduced_by_one_group: u64,
    /// Operations (every loop iteration's assignments and arithmetic).
    pub ops: u64,
    /// Bytes of the arrays it touches (each once).
    pub bytes: u64,
    /// Estimated time on the device in microseconds (see the module's doc).
    pub estimate_us: f64,
    /// Why the pass has this shape.
    pub why: String,
}

impl PlannedPass {
    /// Invocations of its (largest) launch.
    pub fn invocations(&self) -> u64 {
        self.groups.saturating_mul(u64::from(self.threads))
    }
}

/// A routine's GPU passes on a device model.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuPlan {
    /// The routine.
    pub routine: String,
    /// The device model's name.
    pub device: String,
    /// The passes, in launch order (statements that run nothing are left out).
    pub passes: Vec<PlannedPass>,
}

/// Bytes of every node a statement touches, each once.
pub fn touched_bytes(stmt: &LowLevel) -> u64 {
    let mut seen = HashSet::new();
    stmt.nodes()
        .iter()
        .filter(|t| seen.insert(t.id()))
        .map(|t| t.size_in_bytes() as u64)
        .sum()
}

/// The longest reduction of a grid pass's inner statement: run by each invocation alone.
fn reduced_per_invocation(inner: &LowLevel) -> u64 {
    longest_reduction(inner)
}

impl GpuPlan {
    /// The plan of a routine's top-level statements and their recorded schedules (statements
    /// not scheduled as GPU passes are listed as `single`).
    pub fn of(
        routine: &str,
        statements: &[&LowLevel],
        schedules: &[Schedule],
        joined: &[JoinedLaunch],
        device: &DeviceModel,
    ) -> GpuPlan {
        let mut passes = Vec::new();
        for (k, (stmt, sched)) in statements.iter().zip(schedules).enumerate() {
            let stmt = stmt.unwrapped();
            let pass = match &sched.kind {
                ScheduleKind::Gpu(p) => p.clone(),
                _ => GpuPass::Single,
            };
            let (shape, groups, threads, by_one) = match &pass {
                GpuPass::Nothing => continue,
                GpuPass::Zero { elements, threads } => (
                    "zero",
                    elements.div_ceil(u64::from(*threads).max(1)),
                    *threads,
                    1,
                ),
                GpuPass::Tiles {
                    gemm,
                    groups,
                    split,
                    layout,
                    ..
                } => match split {
                    Some(k) => (
                        "split tiles",
                        *groups * k.slices,
                        super::TILE_THREADS,
                        (k.steps * layout.depth() as u64).max(k.slices),
                    ),
                    None => ("tiles", *groups, super::TILE_THREADS, gemm.k.extent as u64),
                },
                GpuPass::MatrixTiles {
                    gemm,
                    layout,
                    groups,
                    split,
                    ..
                } => match split {
                    Some(k) => (
                        "split matrix tiles",
                        *groups * k.slices,
                        layout.threads(),
                        (k.steps * layout.depth() as u64).max(k.slices),
                    ),
                    None => (
                        "matrix tiles",
                        *groups,
                        layout.threads(),
                        gemm.k.extent as u64,
                    ),
                },
                GpuPass::Grid { total, threads, .. } => {
                    let (_, inner) = grid_loops(stmt);
                    (
                        "grid",
                        total.div_ceil(u64::from(*threads).max(1)),
                        *threads,
                        reduced_per_invocation(&inner),
                    )
                }
                GpuPass::Rows { total, threads, .. } => {
                    let (_, inner) = grid_loops(stmt);
                    let items = row_items(&inner);
                    let by_one = items
                        .iter()
                        .map(|i| match &i.role {
                            RowRole::Reduce(r) => r.len(),
                            _ => longest_reduction(i.stmt),
                        })
                        .max()
                        .unwrap_or(1);
                    ("rows", *total, *threads, by_one)
                }
                GpuPass::Reduction { threads, .. } => (
                    "reduction",
                    1,
                    *threads,
                    Accumulation::detect(stmt).map_or(1, |r| r.len()),
                ),
                GpuPass::GridReduction {
                    groups,
                    chunk,
                    threads,
                    ..
                } => ("grid reduction", *groups, *threads, (*chunk).max(*groups)),
                GpuPass::Attention(a) => {
                    let d = a.spec().dims();
                    (
                        "attention",
                        a.groups(0),
                        a.threads(),
                        d.keys.max(d.queries) as u64,
                    )
                }
                GpuPass::Single => ("single", 1, 1, longest_reduction(stmt)),
            };
            let launches = pass.launches();
            // A guarded product computes only the terms its guard keeps, a multiply-add each.
            let ops = match pass.tiled_product() {
                Some(gemm) if gemm.guard.is_some() => gemm.flops(),
                _ => operations(stmt),
            };
            let bytes = touched_bytes(stmt);
            let mut planned = PlannedPass {
                statement: k,
                shape,
                launches,
                joined_into: None,
                groups,
                threads,
                independent: independent_work(stmt),
                longest_reduction: longest_reduction(stmt),
                reduced_by_one_group: by_one,
                ops,
                bytes,
                estimate_us: 0.0,
                why: sched.why.clone(),
            };
            planned.estimate_us = estimate_us(&planned, rate(stmt, &pass, device), device);
            passes.push(planned);
        }
        for launch in joined {
            join_estimates(&mut passes, launch, device);
        }
        GpuPlan {
            routine: routine.to_string(),
            device: device.name.clone(),
            passes,
        }
    }

    /// The estimated time of all passes, in microseconds.
    pub fn estimate_us(&self) -> f64 {
        self.passes.iter().map(|p| p.estimate_us).sum()
    }

    /// Launches in all.
    pub fn launches(&self) -> u32 {
        self.passes.iter().map(|p| p.launches).sum()
    }
}

/// Operations per lane and cycle a pass runs at: two on fused multiply-adds, the matrix units'
/// rate spread over the `f32` lanes for a matrix-unit product, else one.
fn rate(stmt: &LowLevel, pass: &GpuPass, device: &DeviceModel) -> f64 {
    let lanes = f64::from(device.f32_lanes_per_unit.max(1));
    match pass {
        GpuPass::MatrixTiles { layout, .. } if device.matrix_ops_per_unit_cycle > 0.0 => {
            let per_unit = match layout.kind {
                super::MatrixKind::Tf32 => device.matrix_ops_per_unit_cycle / 2.0,
                _ => device.matrix_ops_per_unit_cycle,
            };
            per_unit / lanes
        }
        GpuPass::Tiles { .. } | GpuPass::MatrixTiles { .. } => 2.0,
        _ if matches!(
            stmt.perfect_nest().1,
            LowLevel::Set {
                value: ScalarExpr::Ternop(..),
                ..
            }
        ) =>
        {
            2.0
        }
        _ => 1.0,
    }
}

/// Cycles one invocation takes per operation of its share at least (issue and dependency
/// latency of a chain of loads and arithmetic).
const SERIAL_CYCLES_PER_OP: f64 = 4.0;

/// Passes of a joined launch: the first part carries the launch and the estimate of the whole
/// (each part's time without its launch, spread over the device by its share of the groups
/// that keep it busy, and at least the longest part's), the others none.
fn join_estimates(passes: &mut [PlannedPass], launch: &JoinedLaunch, device: &DeviceModel) {
    let busy = device.limits.busy_groups().max(1) as f64;
    let mut parts: Vec<&mut PlannedPass> = passes
        .iter_mut()
        .filter(|p| launch.statements.contains(&p.statement))
        .collect();
    let Some(first) = parts.first().map(|p| p.statement) else {
        return;
    };
    let mut longest: f64 = 0.0;
    let mut spread = 0.0;
    for p in parts.iter_mut() {
        let own = (p.estimate_us - f64::from(p.launches) * device.launch_us).max(0.0);
        longest = longest.max(own);
        spread += own * (p.groups as f64 / busy).min(1.0);
        p.launches = 0;
        p.estimate_us = 0.0;
        p.joined_into = Some(first);
        if p.statement != first {
            p.why = format!("{}; runs in the launch of statement {first}", p.why);
        }
    }
    if let Some(lead) = parts.first_mut() {
        lead.launches = 1;
        lead.estimate_us = longest.max(spread) + device.launch_us;
        lead.why = format!("{}; {}", lead.why, launch.why);
    }
}

/// The estimate of the module's doc.
/// Cycles one depth step of a tiled `f32` product takes its group when few groups share a
/// compute unit (a global load's round trip, a barrier, the step's multiply-adds from shared
/// memory): about 1250 on an H200, read from the GPT step's weight-gradient products (64
/// groups of 16-tiles: 64 steps in 42 µs, 512 in 320 µs).
const TILE_STEP_CYCLES: f64 = 1250.0;
/// Groups of 16-tiles a compute unit runs at once, for [`TILE_STEP_CYCLES`]' waves.
const TILE_GROUPS_AT_ONCE: f64 = 4.0;

fn estimate_us(p: &PlannedPass, per_cycle: f64, device: &DeviceModel) -> f64 {
    let invocations = p.invocations().max(1) as f64;
    let lanes = device.units() * f64::from(device.f32_lanes_per_unit.max(1));
    let compute_s = p.ops as f64 / (invocations.min(lanes) * per_cycle * device.clock_ghz * 1e9);
    let in_flight = (invocations / (device.units() * 512.0)).min(1.0);
    let memory_s = p.bytes as f64 / (device.memory_bytes_per_s * in_flight);
    // One invocation's share runs as a chain: a few cycles per operation at least (fewer on
    // matrix units, whose instructions each do many operations).
    let chain = SERIAL_CYCLES_PER_OP / (per_cycle / 2.0).max(1.0);
    let serial_s = p.ops as f64 / invocations * chain / (device.clock_ghz * 1e9);
    // A tiled product's groups step through their share of the reduction in waves.
    let steps_s = if matches!(p.shape, "tiles" | "split tiles") {
        let waves = (p.groups as f64 / (device.units() * TILE_GROUPS_AT_ONCE)).ceil();
        let steps = (p.reduced_by_one_group as f64 / super::TILE_DEPTH as f64).ceil();
        waves * steps * TILE_STEP_CYCLES / (device.clock_ghz * 1e9)
    } else {
        0.0
    };
    compute_s.max(memory_s).max(serial_s).max(steps_s) * 1e6
        + f64::from(p.launches) * device.launch_us
}

impl fmt::Display for GpuPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "GPU plan of {} on {}: {} pass(es), {} launch(es), estimated {:.1} µs",
            self.routine,
            self.device,
            self.passes.len(),
            self.launches(),
            self.estimate_us()
        )?;
        writeln!(
            f,
            "{:>5} {:<14} {:>9} {:>7} {:>11} {:>9} {:>12} {:>12} {:>9}",
            "stmt", "shape", "groups", "threads", "independent", "reduce/1", "ops", "bytes", "µs"
        )?;
        for p in &self.passes {
            writeln!(
                f,
                "{:>5} {:<14} {:>9} {:>7} {:>11} {:>9} {:>12} {:>12} {:>9.2}  {}",
                p.statement,
                p.shape,
                p.groups,
                p.threads,
                p.independent,
                p.reduced_by_one_group,
                p.ops,
                p.bytes,
                p.estimate_us,
                p.why
            )?;
        }
        Ok(())
    }
}
