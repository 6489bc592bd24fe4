//! The order in which the groups of a tiled product take their tiles of the result.
//!
//! Groups start in the order of their index, so the tiles taken at one time (one wave of the
//! device's resident groups) read the factor panels those tiles share from the L2 cache. Row
//! by row, a wave of a wide product spans a few tile rows and every tile column: it reads a
//! few panels of the left factor and the whole right factor. In **bands** of
//! [`TILE_BAND_ROWS`] tile rows, taken column by column within a band, a wave spans eight rows
//! and a fraction of the columns: on an H100 (132 units, two 128-tiles each) a wave of an
//! 8192 product reads 8 + 33 panels instead of 4 + 64, so the factors are read from device
//! memory fewer times (the "grouped" order of Triton's and CUTLASS's tile schedulers).

use std::fmt;

/// Tile rows per band where a product is banded.
pub const TILE_BAND_ROWS: usize = 8;

/// The order of a tiled product's tiles: row after row, or in bands of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileOrder {
    /// Tile rows per band: the band's tiles are taken column by column, its rows together
    /// (the last band takes the rows left). 1: row after row.
    pub band_rows: usize,
}

impl TileOrder {
    /// Row after row.
    pub const ROWS: TileOrder = TileOrder { band_rows: 1 };

    /// The order of a product of `tiles_m × tiles_n` tiles: bands of [`TILE_BAND_ROWS`] rows
    /// where both sides have more tiles than that (a product narrower than a band is read
    /// whole by any order), else row after row.
    pub fn for_tiles(tiles_m: usize, tiles_n: usize) -> TileOrder {
        if tiles_m > TILE_BAND_ROWS && tiles_n > TILE_BAND_ROWS {
            TileOrder {
                band_rows: TILE_BAND_ROWS,
            }
        } else {
            TileOrder::ROWS
        }
    }

    /// The row and column of tile `index` (below `tiles_m × tiles_n`) in this order; every
    /// tile has one index. The kernels compute the same with their own arithmetic.
    pub fn tile(&self, index: usize, tiles_m: usize, tiles_n: usize) -> (usize, usize) {
        let band = self.band_rows.max(1);
        let per_band = band * tiles_n;
        let first = index / per_band * band;
        let rows = band.min(tiles_m - first);
        let within = index % per_band;
        (first + within % rows, within / rows)
    }
}

impl fmt::Display for TileOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.band_rows > 1 {
            write!(
                f,
                "tiles taken in bands of {} rows, column by column (a wave of groups shares \
                 the factors' panels in L2)",
                self.band_rows
            )
        } else {
            f.write_str("tiles taken row by row")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_is_taken_once_in_either_order() {
        for (tiles_m, tiles_n) in [(1, 1), (3, 20), (9, 9), (17, 10), (16, 16), (25, 11)] {
            let order = TileOrder::for_tiles(tiles_m, tiles_n);
            let mut seen = vec![false; tiles_m * tiles_n];
            for index in 0..tiles_m * tiles_n {
                let (row, col) = order.tile(index, tiles_m, tiles_n);
                assert!(row < tiles_m && col < tiles_n, "{index}: ({row}, {col})");
                assert!(!std::mem::replace(&mut seen[row * tiles_n + col], true));
            }
        }
        // Banded: the first band's first column, then its second.
        let order = TileOrder::for_tiles(17, 10);
        assert_eq!(order.band_rows, TILE_BAND_ROWS);
        assert_eq!(order.tile(7, 17, 10), (7, 0));
        assert_eq!(order.tile(8, 17, 10), (0, 1));
        // The last band has one row: its tiles go along that row.
        assert_eq!(order.tile(160, 17, 10), (16, 0));
        assert_eq!(order.tile(169, 17, 10), (16, 9));
        assert_eq!(TileOrder::for_tiles(8, 100), TileOrder::ROWS);
    }
}
