//! The `f32` tiled product on a GPU's scalar lanes (SIMT): how a group of [`TILE_THREADS`]
//! (16 × 16) invocations lays out its `tile × tile` results, stages its factors and overlaps
//! their loads with its arithmetic.
//!
//! **Results.** Each invocation holds `tile / 16` × `tile / 16` results in registers, in runs
//! of up to [`RESULT_RUN`] neighbours along each side: invocation (`ty`, `tx`) owns rows
//! `ty · run + i % run + (i / run) · 16 · run` (and likewise columns with `tx`). A warp thus
//! covers a compact block of the tile (warp tiling), and each step reads an invocation's
//! factor values as whole runs of 4 neighbours in shared memory — one 128-bit load each.
//!
//! **Staging.** Both factors' tiles are staged [`SimtTile::depth`] deep ([`TILE_DEPTH`], or
//! 8 for 128-tiles, whose 64 results per invocation leave registers for only 8 · 128 staged
//! elements in flight without spilling at two groups per unit) with `k` as the outer
//! axis (`[k][side]`, each row padded by [`TILE_PADDING`] elements: the left factor is
//! transposed while staged, and the padding spreads those stores over the banks while keeping
//! every run 16-byte aligned). Invocations read each factor along its contiguous axis
//! (coalesced): by 128-bit loads of 4 elements where the factor's contiguous axis has stride 1
//! and its extent, its other stride and its batch strides are multiples of 4 (each load then
//! starts on a 16-byte boundary — every array starts on one, as the CUDA backends' pools
//! ensure), else element by element. Elements outside a factor are zero.
//!
//! **Pipelining.** Where two buffers of both tiles fit the device's shared memory, the next
//! depth of both factors is loaded into registers while the current one is multiplied from
//! shared memory, then stored into the other buffer: one barrier per step. Otherwise one
//! buffer, loaded then multiplied, with a barrier after each.
//!
//! **Precision.** Each result starts from its value (or from zero where the product
//! overwrites it) and adds its products in the order of `k`, fused where the statement fuses
//! them: the bits of the loop nest, whatever the layout.

use std::fmt;

use super::{TILE_DEPTH, TILE_THREADS, TileOrder};
use crate::schedule::Gemm;
use arrayjit_ir::prec::Prec;

/// Elements of padding after each staged row of a factor's tile (16 bytes of `f32`).
pub const TILE_PADDING: usize = 4;
/// The most neighbouring results an invocation holds along each side of the tile, and the
/// elements of one 128-bit factor load.
pub const RESULT_RUN: usize = 4;
/// Buffers of the factors' tiles where they fit: the next depth loads while this one
/// multiplies.
pub const SIMT_STAGES: usize = 2;

/// How a group of an `f32` tiled product is laid out (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtTile {
    /// Results per side of the group's tile: 16, 32, 64 or 128.
    pub tile: usize,
    /// Buffers of the staged factor tiles: 2 (loads overlap arithmetic) or 1.
    pub stages: usize,
    /// Whether the left and the right factor are read by 128-bit loads of 4 elements
    /// ([`SimtTile::vector_fits`]), else element by element.
    pub vector: [bool; 2],
    /// The order in which groups take their tiles.
    pub order: TileOrder,
}

impl SimtTile {
    /// The layout of `tile`-tiles for `gemm` within `max_shared_bytes` of shared memory: two
    /// buffers where they fit, else one; `None` where not even one fits.
    pub fn new(gemm: &Gemm, tile: usize, max_shared_bytes: usize) -> Option<SimtTile> {
        let stages = [SIMT_STAGES, 1]
            .into_iter()
            .find(|&s| SimtTile::bytes(tile, s) <= max_shared_bytes)?;
        let mut t = SimtTile {
            tile,
            stages,
            vector: [false; 2],
            order: TileOrder::for_tiles(gemm.m.extent.div_ceil(tile), gemm.n.extent.div_ceil(tile)),
        };
        t.vector = [1, 2].map(|f| t.vector_fits(gemm, f));
        Some(t)
    }

    /// The depth of `tile`-tiles: [`TILE_DEPTH`], or 8 for 128-tiles (see the module
    /// documentation). Either way the group loads whole runs: `tile × depth` is a multiple of
    /// its [`TILE_THREADS`].
    pub fn depth_of(tile: usize) -> usize {
        if tile >= 128 { 8 } else { TILE_DEPTH }
    }

    /// The depth of the staged factor tiles.
    pub fn depth(&self) -> usize {
        SimtTile::depth_of(self.tile)
    }

    /// Shared memory of `stages` buffers of both factors' `tile`-tiles.
    pub fn bytes(tile: usize, stages: usize) -> usize {
        stages * 2 * SimtTile::depth_of(tile) * (tile + TILE_PADDING) * 4
    }

    /// Shared memory of a group.
    pub fn shared_bytes(&self) -> usize {
        SimtTile::bytes(self.tile, self.stages)
    }

    /// Results an invocation holds along each side of the tile.
    pub fn per_side(&self) -> usize {
        self.tile / 16
    }

    /// Neighbouring results an invocation holds along each side (a run).
    pub fn run(&self) -> usize {
        self.per_side().min(RESULT_RUN)
    }

    /// Elements of one staged row (`k` fixed): the tile's side plus the padding.
    pub fn pitch(&self) -> usize {
        self.tile + TILE_PADDING
    }

    /// Elements of one buffer of one factor's staged tile.
    pub fn staged_elements(&self) -> usize {
        self.depth() * self.pitch()
    }

    /// Elements of one factor each invocation loads per depth: the tile's `tile × depth`
    /// spread over the group.
    pub fn loads_per_invocation(&self) -> usize {
        (self.tile * self.depth()).div_ceil(TILE_THREADS as usize)
    }

    /// Whether factor `f` (1: left, 2: right, as in [`super::super::Dim::strides`]) is read
    /// by 128-bit loads: stored in `f32`, its contiguous axis of stride 1 with an extent, an
    /// other stride and batch strides that are multiples of 4, and each invocation loading
    /// whole runs of 4.
    pub fn vector_fits(&self, gemm: &Gemm, f: usize) -> bool {
        let c = RESULT_RUN;
        let (tn, side) = if f == 1 {
            (&gemm.lhs, &gemm.m)
        } else {
            (&gemm.rhs, &gemm.n)
        };
        let (inner, outer) = if k_contiguous(gemm, f) {
            (&gemm.k, side)
        } else {
            (side, &gemm.k)
        };
        tn.prec() == Prec::F32
            && self.loads_per_invocation().is_multiple_of(c)
            && inner.strides[f] == 1
            && inner.extent.is_multiple_of(c)
            && outer.strides[f].is_multiple_of(c)
            && gemm.batch.iter().all(|b| b.strides[f].is_multiple_of(c))
    }
}

/// Whether factor `f` of `gemm` has `k` as its contiguous axis (its `k` stride is the smaller
/// one), so invocations read it along `k`.
pub fn k_contiguous(gemm: &Gemm, f: usize) -> bool {
    let side = if f == 1 { &gemm.m } else { &gemm.n };
    gemm.k.strides[f] <= side.strides[f]
}

impl fmt::Display for SimtTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let buffers = if self.stages > 1 {
            "double-buffered (the next depth loads while this one multiplies)"
        } else {
            "one buffer"
        };
        let loads = match self.vector {
            [true, true] => "both factors read by 128-bit loads",
            [true, false] => "the left factor read by 128-bit loads, the right element by element",
            [false, true] => "the right factor read by 128-bit loads, the left element by element",
            [false, false] => "factors read element by element",
        };
        write!(
            f,
            "factor tiles {} deep in shared memory, {buffers}, {loads}; {} x {} results per \
             invocation in runs of {}; {}",
            self.depth(),
            self.per_side(),
            self.per_side(),
            self.run(),
            self.order
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_the_tile_once() {
        for tile in [16, 32, 64, 128] {
            let t = SimtTile {
                tile,
                stages: 2,
                vector: [false; 2],
                order: TileOrder::ROWS,
            };
            let (r, w) = (t.per_side(), t.run());
            let mut seen = vec![0; tile];
            for lane in 0..16 {
                for i in 0..r {
                    seen[lane * w + i % w + (i / w) * 16 * w] += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{tile}: {seen:?}");
            // The group loads each depth in whole shares.
            assert_eq!((tile * t.depth()) % TILE_THREADS as usize, 0);
            assert_eq!(
                t.loads_per_invocation() * TILE_THREADS as usize,
                tile * t.depth()
            );
            // Runs of 4 start on 16-byte boundaries of the staged rows.
            if w == RESULT_RUN {
                assert_eq!(t.pitch() % RESULT_RUN, 0);
            }
        }
        assert_eq!(SimtTile::bytes(128, 2), 2 * 2 * 8 * 132 * 4);
        assert_eq!(SimtTile::bytes(64, 2), 2 * 2 * 16 * 68 * 4);
        // Two double-buffered 128-tiles share 100 KiB of an SM; WebGPU's 16 KiB take one
        // buffer of 64-tiles.
        assert!(2 * SimtTile::bytes(128, 2) <= 100 << 10);
        assert!(SimtTile::bytes(64, 1) <= 16 << 10 && SimtTile::bytes(64, 2) > 16 << 10);
    }
}
