//! The one description of a kernel, whichever backend runs it: [`KernelInterface`] says how a
//! kernel is called (its buffers in order — arrays, merge buffer, scratch — and its static
//! indices), [`LaunchDims`] how a GPU launches it, and [`SourceKernel`] pairs the two for
//! kernels written by hand (the reference's `compile ~source_code` and `launch_kernel
//! ~global_dims ?local_dims`). Renderers produce interfaces, the runtime gathers buffers in
//! their order, and `arrayjit_backends::check_launch` checks every launch against them.
//!
//! # Calling conventions
//!
//! The buffers of an interface reach the kernel as:
//!
//! | backend | kernel signature | buffers | static indices | launch |
//! |---|---|---|---|---|
//! | `cc` (C) | `void f(void *const *args, const int64_t *statics, const aj_par *par)` | `args[i]`, in interface order | `statics[j]` | called once; `par` is the device's worker pool ([`PARALLEL_TYPEDEF`], the layout of `arrayjit_backends::cpu::worker_pool::ParallelHandle`) |
//! | `cuda`, `cuda_emu` | `extern "C" __global__ void f(T0 *a_0, ..., long long s0, ...)` | one pointer parameter each, in order | one `long long` each, after the buffers | each recorded GPU pass is a kernel of its own (`<symbol>_p<k>`), launched with its grid and block; source kernels with [`LaunchDims`] |
//! | `wgpu` (WGSL) | an entry point per pass | `@group(0) @binding(i)` | an `array<i32>` at the binding after the last buffer | workgroups; the shader declares `@workgroup_size` |
//!
//! `LoweredBackend::compile_source` in `arrayjit-backends` states what hand-written source must
//! export for each.

use arrayjit_ir::{DeviceLimit, Error, Result, StaticSymbol, Tnode};
use arrayjit_opt::Optimized;

/// The C declaration of the worker-pool handle every kernel receives as its third argument
/// (layout of `arrayjit_backends::cpu::worker_pool::ParallelHandle`).
pub const PARALLEL_TYPEDEF: &str = "typedef struct aj_par {\n  const void *pool;\n  void (*run)(const void *pool, void (*chunk)(void *ctx, int64_t index), void *ctx, int64_t chunks);\n  int64_t workers;\n} aj_par;\n\n";

/// How to call one rendered kernel: the one statement of the calling convention, produced by
/// [`KernelInterface::of`] and read by the renderer, the runtime that gathers the buffers, and
/// the launch check. Buffers go in this order: the arrays (materialized nodes by id), then the
/// merge buffer if the kernel reads one, then the scratch buffer if it needs one; static
/// indices are passed as values in the order of `statics`.
#[derive(Clone, Debug)]
pub struct KernelInterface {
    /// The routine's name.
    pub name: String,
    /// The C symbol of the kernel.
    pub symbol: String,
    /// The arrays passed in `args`, in order (materialized nodes by id).
    pub args: Vec<Tnode>,
    /// If set, the merge buffer holding this node is passed after the arrays.
    pub merge: Option<Tnode>,
    /// The static symbols passed in `statics`, in order.
    pub statics: Vec<StaticSymbol>,
    /// If non-zero, a scratch buffer of at least this many bytes is passed last.
    pub scratch_bytes: usize,
}

impl KernelInterface {
    /// The interface of a routine's kernel, exported as `symbol`.
    pub fn of(r: &Optimized, symbol: String) -> KernelInterface {
        KernelInterface {
            name: r.name.clone(),
            symbol,
            args: r.materialized_nodes(),
            merge: r.merge_node.clone(),
            statics: r.bindings.clone(),
            scratch_bytes: r.scratch.total_bytes(),
        }
    }

    /// The least size in bytes of every buffer a launch passes, in order.
    pub fn buffer_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self
            .args
            .iter()
            .chain(self.merge.iter())
            .map(|t| t.size_in_bytes())
            .collect();
        if self.scratch_bytes > 0 {
            sizes.push(self.scratch_bytes);
        }
        sizes
    }
}

/// The launch of a GPU kernel: blocks (CUDA) or workgroups (WGSL) in x, y, z, and threads per
/// block in x, y, z (CUDA; a WGSL shader declares its own `@workgroup_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    /// Blocks or workgroups in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
}

impl LaunchDims {
    /// One block of one thread.
    pub const SINGLE: LaunchDims = LaunchDims {
        grid: [1, 1, 1],
        block: [1, 1, 1],
    };

    /// A one-dimensional launch: `blocks` blocks of `threads` threads.
    pub fn linear(blocks: u32, threads: u32) -> LaunchDims {
        LaunchDims {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
        }
    }

    /// The launch covering `global` threads per axis with blocks of `block` threads (the
    /// reference's `launch_kernel ~global_dims ~local_dims`): `ceil(global / block)` blocks per
    /// axis, so a kernel must skip the threads past `global` when it is not a multiple of the
    /// block. A zero anywhere is an error.
    pub fn covering(global: [u32; 3], block: [u32; 3]) -> Result<LaunchDims> {
        if global.contains(&0) || block.contains(&0) {
            return Err(Error::BadValue {
                what: "launch dimensions".into(),
                value: format!("{global:?} threads in blocks of {block:?}"),
                expected: "every dimension at least 1".into(),
            });
        }
        Ok(LaunchDims {
            grid: [0, 1, 2].map(|a| global[a].div_ceil(block[a])),
            block,
        })
    }

    /// The block a backend picks when the caller gives none (`local_dims = None`): along x,
    /// as many threads as `global` needs there, at most `preferred` (itself at most the device's
    /// `max_threads`); one thread along y and z.
    pub fn default_block(global: [u32; 3], preferred: u32, max_threads: u32) -> [u32; 3] {
        [global[0].clamp(1, preferred.min(max_threads).max(1)), 1, 1]
    }

    /// CUDA's largest grid, in blocks per axis (every architecture from sm_30): 2³¹ − 1 in x,
    /// 65,535 in y and z.
    pub const CUDA_MAX_GRID: [u64; 3] = [(1 << 31) - 1, 65_535, 65_535];

    /// `Ok` when a launch of `grid` blocks per axis (counted without overflow) fits CUDA's
    /// grid ([`LaunchDims::CUDA_MAX_GRID`]); else a typed limit naming the kernel and axis.
    pub fn check_cuda_grid(kernel: &str, grid: [u64; 3]) -> Result<()> {
        let max = Self::CUDA_MAX_GRID;
        if let Some(axis) = (0..3).find(|&a| grid[a] > max[a]) {
            return Err(Error::limit_exceeded(
                "a CUDA device",
                format!("kernel {kernel}, launched as {grid:?} blocks,"),
                DeviceLimit::GridExtent(axis),
                grid[axis],
                max[axis],
                format!(
                    "launch at most {max:?} blocks: larger blocks, y and z folded into x, or \
                     (for a routine's pass) arrays split into parts one launch covers"
                ),
            ));
        }
        Ok(())
    }

    /// Like [`LaunchDims::check`], also against the device's largest block per axis and
    /// CUDA's largest grid.
    pub fn check_within(&self, kernel: &str, max_block: [u32; 3], max_threads: u64) -> Result<()> {
        self.check(kernel, max_threads)?;
        Self::check_cuda_grid(kernel, self.grid.map(u64::from))?;
        if let Some(axis) = (0..3).find(|&a| self.block[a] > max_block[a]) {
            return Err(Error::limit_exceeded(
                "the device",
                format!("kernel {kernel}, launched in blocks of {:?},", self.block),
                DeviceLimit::BlockExtent(axis),
                u64::from(self.block[axis]),
                u64::from(max_block[axis]),
                format!("launch blocks within {max_block:?}"),
            ));
        }
        Ok(())
    }

    /// Threads per block in all.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&d| d as u64).product()
    }

    /// Blocks in all.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&d| d as u64).product()
    }

    /// `Ok` when every dimension is at least 1 and a block has at most `max_threads` threads;
    /// else an error naming the kernel.
    pub fn check(&self, kernel: &str, max_threads: u64) -> Result<()> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(Error::BadValue {
                what: format!("launch of kernel {kernel}"),
                value: format!("{:?} blocks of {:?} threads", self.grid, self.block),
                expected: "every dimension at least 1".into(),
            });
        }
        if self.threads_per_block() > max_threads {
            return Err(Error::limit_exceeded(
                "the device",
                format!("kernel {kernel}, launched in blocks of {:?},", self.block),
                DeviceLimit::ThreadsPerBlock,
                self.threads_per_block(),
                max_threads,
                "launch smaller blocks",
            ));
        }
        Ok(())
    }
}

/// A hand-written kernel: how it is called and how a GPU launches it.
#[derive(Clone, Debug)]
pub struct SourceKernel {
    /// Its buffers (arrays, merge buffer, scratch) and static indices, and its exported
    /// symbol.
    pub interface: KernelInterface,
    /// Its launch on a GPU; CPU backends call the kernel once.
    pub launch: LaunchDims,
}

impl SourceKernel {
    /// A kernel for a CPU backend (called once: one block of one thread).
    pub fn cpu(interface: KernelInterface) -> SourceKernel {
        SourceKernel {
            interface,
            launch: LaunchDims::SINGLE,
        }
    }

    /// A kernel a GPU launches with `launch`.
    pub fn gpu(interface: KernelInterface, launch: LaunchDims) -> SourceKernel {
        SourceKernel { interface, launch }
    }
}

/// `Ok` when `symbol` can name a kernel in every backend's language (an identifier: ASCII
/// letters, digits and `_`, not starting with a digit); else an error saying so.
pub fn check_symbol(symbol: &str) -> Result<()> {
    let mut chars = symbol.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if starts_well && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(Error::BadValue {
            what: "kernel symbol".into(),
            value: symbol.into(),
            expected: "an identifier (ASCII letters, digits and _, not starting with a digit)"
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_dims_are_checked() {
        let d = LaunchDims {
            grid: [4, 2, 1],
            block: [32, 4, 1],
        };
        assert_eq!((d.blocks(), d.threads_per_block()), (8, 128));
        assert!(d.check("k", 1024).is_ok());
        let e = d.check("k", 64).unwrap_err();
        assert!(
            matches!(
                e,
                Error::LimitExceeded {
                    limit: DeviceLimit::ThreadsPerBlock,
                    needed: 128,
                    allowed: 64,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("needs 128 threads per block"), "{e}");
        let e = LaunchDims::linear(0, 32).check("k", 1024).unwrap_err();
        assert!(check_symbol("aj_k2").is_ok() && check_symbol("_x").is_ok());
        assert!(check_symbol("2k").is_err() && check_symbol("a-b").is_err());
        assert!(check_symbol("").is_err());
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
}
