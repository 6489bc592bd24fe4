//! What an out-of-bounds index got wrong ([`OutOfBounds`], carried by
//! [`super::Error::IndexOutOfBounds`]), and the one check of a multi-index against dims that
//! arrays and nodes share ([`OutOfBounds::check_index`]).

use std::fmt;

/// Which index lay outside what, as data: a caller can tell a wrong number of axes from an
/// index past an axis's end, a byte range past a buffer's end or an id past its table.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum OutOfBounds {
    /// The index names `given` axes; the array has `rank`.
    Rank {
        /// Axes in the index.
        given: usize,
        /// Axes of the array.
        rank: usize,
    },
    /// Along `axis`, indices `lo..=hi` are used, but only `min..=max` exist (a padded node's
    /// margins count: `min` is minus its left padding).
    Axis {
        /// The axis.
        axis: usize,
        /// The least index used.
        lo: i64,
        /// The greatest index used.
        hi: i64,
        /// The least index that exists.
        min: i64,
        /// The greatest index that exists.
        max: i64,
    },
    /// Flat element `index` of an array of `len` elements.
    Element {
        /// The flat index.
        index: usize,
        /// Elements in the array.
        len: usize,
    },
    /// The range `start..end` of something that holds `size` (in `unit`s).
    Range {
        /// The first unit of the range.
        start: usize,
        /// One past the last unit of the range (may overflow: then `usize::MAX`).
        end: usize,
        /// Units held.
        size: usize,
        /// What the numbers count.
        unit: RangeUnit,
    },
    /// An id used as an index (a gather, an embedding), outside `0..table`.
    Id {
        /// The id.
        id: f64,
        /// Its position among the ids, where known.
        position: Option<usize>,
        /// Rows of the table it selects from.
        table: usize,
    },
    /// An index expression whose value, for some values of its symbols, does not fit 64-bit
    /// arithmetic.
    Overflow {
        /// The index, printed.
        index: String,
    },
}

/// What the numbers of [`OutOfBounds::Range`] (and of a size mismatch) count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeUnit {
    /// Bytes of a buffer or pool.
    Bytes,
    /// Elements of an array.
    Elements,
}

impl fmt::Display for RangeUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RangeUnit::Bytes => "bytes",
            RangeUnit::Elements => "elements",
        })
    }
}

impl OutOfBounds {
    /// The first way `index` misses an array of `dims` (row-major, every index from 0): a
    /// wrong number of axes, or the first axis it passes the end of; `None` when it fits.
    pub fn check_index(index: &[usize], dims: &[usize]) -> Option<OutOfBounds> {
        if index.len() != dims.len() {
            return Some(OutOfBounds::Rank {
                given: index.len(),
                rank: dims.len(),
            });
        }
        let axis = index.iter().zip(dims).position(|(i, d)| i >= d)?;
        let at = i64::try_from(index[axis]).unwrap_or(i64::MAX);
        Some(OutOfBounds::Axis {
            axis,
            lo: at,
            hi: at,
            min: 0,
            max: dims[axis] as i64 - 1,
        })
    }

    /// The range `start..start + len` of something holding `size`, as an [`OutOfBounds::Range`]
    /// (an end that overflows is `usize::MAX`).
    pub fn range(start: usize, len: usize, size: usize, unit: RangeUnit) -> OutOfBounds {
        OutOfBounds::Range {
            start,
            end: start.saturating_add(len),
            size,
            unit,
        }
    }

    /// The end of `start..start + len` when it lies within `0..size`, else the
    /// [`OutOfBounds::Range`] saying it does not (the one check of every byte or element
    /// range: views of pools, writes, copies).
    pub fn range_end(
        start: usize,
        len: usize,
        size: usize,
        unit: RangeUnit,
    ) -> Result<usize, OutOfBounds> {
        start
            .checked_add(len)
            .filter(|&end| end <= size)
            .ok_or_else(|| OutOfBounds::range(start, len, size, unit))
    }
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutOfBounds::Rank { given, rank } => write!(
                f,
                "an index of {given} axes for an array of {rank}; give one index per axis"
            ),
            OutOfBounds::Axis {
                axis,
                lo,
                hi,
                min,
                max,
            } => {
                if lo == hi {
                    write!(f, "index {lo} along axis {axis}")?;
                } else {
                    write!(f, "indices {lo}..={hi} along axis {axis}")?;
                }
                write!(f, ", which allows {min}..={max}")
            }
            OutOfBounds::Element { index, len } => {
                write!(f, "flat element {index} of an array of {len} elements")
            }
            OutOfBounds::Range {
                start,
                end,
                size,
                unit,
            } => write!(f, "{unit} {start}..{end} of {size} {unit}"),
            OutOfBounds::Id {
                id,
                position,
                table,
            } => {
                write!(f, "id {id}")?;
                if let Some(p) = position {
                    write!(f, " at position {p}")?;
                }
                write!(
                    f,
                    " is outside 0..{table}; ids must index the table they select from"
                )
            }
            OutOfBounds::Overflow { index } => write!(
                f,
                "index {index} overflows 64-bit arithmetic for some values of its symbols; use \
                 coefficients and offsets that fit the array's dims"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_index_names_the_first_miss() {
        assert_eq!(OutOfBounds::check_index(&[1, 2], &[2, 3]), None);
        assert_eq!(
            OutOfBounds::check_index(&[1], &[2, 3]),
            Some(OutOfBounds::Rank { given: 1, rank: 2 })
        );
        assert_eq!(
            OutOfBounds::check_index(&[1, 3], &[2, 3]),
            Some(OutOfBounds::Axis {
                axis: 1,
                lo: 3,
                hi: 3,
                min: 0,
                max: 2
            })
        );
        assert_eq!(OutOfBounds::range_end(2, 6, 8, RangeUnit::Bytes), Ok(8));
        assert_eq!(
            OutOfBounds::range_end(usize::MAX, 2, 8, RangeUnit::Bytes),
            Err(OutOfBounds::range(usize::MAX, 2, 8, RangeUnit::Bytes))
        );
        assert_eq!(
            OutOfBounds::range(usize::MAX, 2, 8, RangeUnit::Bytes),
            OutOfBounds::Range {
                start: usize::MAX,
                end: usize::MAX,
                size: 8,
                unit: RangeUnit::Bytes
            }
        );
    }
}
