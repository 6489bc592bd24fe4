//! What GPU passes may assume of a device ([`GpuLimits`]) and the constants the choice of
//! passes works with.

/// What GPU passes may assume of a device: read from its `DeviceInfo` by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLimits {
    /// The most invocations in one group (workgroup, block).
    pub max_group_invocations: u32,
    /// Shared (workgroup) memory one group may use, in bytes, as statically declared arrays.
    pub max_shared_bytes: usize,
    /// Shared memory one group may use where its kernel opts in to more than
    /// `max_shared_bytes` (CUDA's dynamic shared memory: 163 KiB on sm_80, 99 KiB on sm_86
    /// and sm_89, 227 KiB on sm_90); `max_shared_bytes` where the device has no opt-in.
    pub max_opt_in_shared_bytes: usize,
    /// Shared memory of one compute unit, which the groups resident on it divide; 0 when
    /// unknown.
    pub shared_bytes_per_unit: usize,
    /// Invocations that run in lock step (warp, subgroup); 0 when unknown.
    pub subgroup_size: u32,
    /// Units that run groups in parallel (SMs, compute units); 0 when unknown.
    pub compute_units: usize,
    /// The device multiplies warp-level matrix fragments (`mma.sync` and `ldmatrix`: NVIDIA
    /// tensor cores of compute capability 8.0 or later, or the CUDA emulation), so products of
    /// 16-bit factors (and `f32` ones as TF32, where allowed) run on them ([`super::matrix`]).
    pub matrix_units: bool,
    /// The device also multiplies warpgroup-wide fragments straight from shared memory
    /// (`wgmma.mma_async`: NVIDIA sm_90, compiled as `sm_90a`; the CUDA emulation), so the
    /// larger matrix-unit tiles of 16-bit factors use them ([`super::matrix`]).
    pub warpgroup_mma: bool,
    /// The most parameters (buffers and static indices) one launch may take for passes run
    /// together ([`super::join`]); 0: every pass launches on its own.
    pub joined_launch_parameters: usize,
}

/// Parameters a joined CUDA launch may take: 2 KiB of pointers and indices, half of what a
/// kernel's parameters may hold.
pub const CUDA_JOINED_LAUNCH_PARAMETERS: usize = 256;

impl GpuLimits {
    /// The limits every WebGPU device guarantees (256 invocations per workgroup, 16 KiB of
    /// workgroup memory), for rendering without a device at hand.
    pub fn portable() -> GpuLimits {
        GpuLimits {
            max_group_invocations: 256,
            max_shared_bytes: 16 << 10,
            max_opt_in_shared_bytes: 16 << 10,
            shared_bytes_per_unit: 0,
            subgroup_size: 0,
            compute_units: 0,
            matrix_units: false,
            warpgroup_mma: false,
            joined_launch_parameters: 0,
        }
    }

    /// The limits every CUDA device of compute capability 5.0 or later has (1024 threads per
    /// block, 48 KiB of static shared memory, warps of 32), for rendering CUDA without a
    /// device at hand.
    pub fn cuda_minimum() -> GpuLimits {
        GpuLimits {
            max_group_invocations: 1024,
            max_shared_bytes: 48 << 10,
            max_opt_in_shared_bytes: 48 << 10,
            shared_bytes_per_unit: 0,
            subgroup_size: 32,
            compute_units: 0,
            matrix_units: false,
            warpgroup_mma: false,
            joined_launch_parameters: CUDA_JOINED_LAUNCH_PARAMETERS,
        }
    }

    /// The limits of CUDA devices of architecture `sm_XY` (compute capability X.Y, with or
    /// without the `a` of arch-specific features) beyond [`GpuLimits::cuda_minimum`]: matrix
    /// units from `sm_80`, warpgroup matrix operations on `sm_90` (whose kernels then compile
    /// as `sm_90a`), and the architecture's opt-in shared memory per block and per SM (the
    /// CUDA programming guide's table of compute capabilities). `None` for a name that is not
    /// `sm_` and a number.
    pub fn cuda_arch(arch: &str) -> Option<GpuLimits> {
        let cc: u32 = arch
            .strip_prefix("sm_")?
            .trim_end_matches('a')
            .parse()
            .ok()?;
        // (opt-in per block, per SM) in KiB; from sm_80 each block reserves 1 KiB of the SM's.
        let (opt_in, per_unit) = match cc {
            70 | 72 => (96, 96),
            75 => (64, 64),
            80 | 87 => (163, 164),
            86 | 89 => (99, 100),
            90 => (227, 228),
            _ => (48, 0),
        };
        Some(GpuLimits {
            matrix_units: cc >= 80,
            warpgroup_mma: cc == 90,
            max_opt_in_shared_bytes: opt_in << 10,
            shared_bytes_per_unit: per_unit << 10,
            ..GpuLimits::cuda_minimum()
        })
    }

    /// Shared memory a tiled product's group may stage its factors in: as much as lets
    /// [`TILE_GROUPS_PER_UNIT`] groups share a compute unit (each also reserving
    /// [`GROUP_RESERVED_SHARED_BYTES`] of it), within the opt-in limit; all of the opt-in
    /// limit where the unit's memory is unknown; never less than `max_shared_bytes`.
    pub fn tile_shared_bytes(&self) -> usize {
        let share = match self.shared_bytes_per_unit {
            0 => usize::MAX,
            per_unit => (per_unit / TILE_GROUPS_PER_UNIT as usize)
                .saturating_sub(GROUP_RESERVED_SHARED_BYTES),
        };
        self.max_opt_in_shared_bytes
            .min(share)
            .max(self.max_shared_bytes)
    }

    /// Invocations per group of grid, row and reduction passes: the largest power of two up
    /// to 256 that the device allows.
    pub fn group_threads(&self) -> u32 {
        let cap = self.max_group_invocations.clamp(1, MAX_GROUP_THREADS);
        1 << (31 - cap.leading_zeros())
    }

    /// [`GpuLimits::group_threads`], or the power of two at most `tuned` (at least 1) where a
    /// tuning asks for fewer.
    pub fn tuned_group_threads(&self, tuned: Option<u32>) -> u32 {
        let most = self.group_threads();
        match tuned {
            Some(t) if t >= 1 && t < most => 1 << (31 - t.leading_zeros()),
            _ => most,
        }
    }

    /// Groups that keep the device busy: two per compute unit, or 256 when the device does
    /// not say how many units it has.
    pub fn busy_groups(&self) -> u64 {
        if self.compute_units > 0 {
            2 * self.compute_units as u64
        } else {
            256
        }
    }

    /// Invocations that keep the device busy: [`GpuLimits::busy_groups`] groups of `threads`.
    pub fn busy_invocations(&self, threads: u32) -> u64 {
        self.busy_groups() * u64::from(threads.max(1))
    }
}

/// The most invocations per group of grid, row and reduction passes.
pub const MAX_GROUP_THREADS: u32 = 256;
/// The fewest invocations per group that group reductions and row passes run on (below,
/// such statements run as grid or single-invocation passes).
pub const MIN_GROUP_THREADS: u32 = 64;
/// Invocations of a tiled product's group: 16 × 16.
pub const TILE_THREADS: u32 = 256;
/// The depth of the factors' tiles staged in shared memory (8 for 128-tiles:
/// [`super::SimtTile::depth`]).
pub const TILE_DEPTH: usize = 16;
/// Groups of a tiled product (on the `f32` lanes or the matrix units) that share a compute
/// unit at least: renderers ask the compiler to keep each invocation's registers within a
/// share that allows it (CUDA's `__launch_bounds__` minimum blocks), so one group's barriers
/// and loads overlap another's arithmetic.
pub const TILE_GROUPS_PER_UNIT: u32 = 2;
/// Shared memory of a compute unit that each resident group reserves beyond its own (the
/// CUDA runtime's, from sm_80 on).
pub const GROUP_RESERVED_SHARED_BYTES: usize = 1 << 10;
/// A reduction inside a grid gets a group of its own when it is at least this long ...
pub const ROW_REDUCTION_MIN: u64 = 256;
/// ... and there are at most this many grid points (beyond, one invocation per point keeps
/// every lane busy already).
pub const ROW_REDUCTION_MAX_ROWS: u64 = 1 << 14;
/// Statements under a grid too small to fill the device run as a row pass when one of them
/// offers at least this many invocations' work (a warp's).
pub const ROW_MIN_WIDTH: u64 = 32;
/// A reduction into one element of at least this many steps runs over the whole grid in two
/// phases (one group would take it alone).
pub const GRID_REDUCTION_MIN: u64 = 1 << 15;
/// Steps each invocation of a grid reduction's first phase takes at least (fewer groups,
/// fewer partials to combine).
pub const GRID_REDUCTION_STEPS_PER_INVOCATION: u64 = 8;
