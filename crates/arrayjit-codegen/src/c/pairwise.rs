//! Pairwise (cascade) summation for long floating-point sums in the C renderer: the order of
//! additions that keeps a sum of `n` values within `O(log n)` roundings instead of `O(n)`.
//!
//! **The order** (fixed, documented, independent of timing and of the worker count):
//! - a long reduced loop runs in blocks of [`PAIRWISE_BLOCK_STEPS`] steps of each of its
//!   `lanes` accumulators; each block's per-lane sums start from zero;
//! - block sums are combined as the leaves of a binary tree: block `b` is added to the pending
//!   sum of the blocks before it exactly where a binary counter carries (`cas[level]` holds the
//!   sum of a run of `2^level` blocks), so each sum adds two halves of equal size;
//! - at the end the pending levels are added from the lowest (the shortest runs, after the
//!   tail of fewer than a block) to the highest, then the lanes in order.
//!
//! The same cascade collects the totals of a reduction's outer loops (the loops of a nest that
//! do not index the element summed into: a whole-array sum's rows), one total per iteration.
//! Maxima and minima are exact in any order and keep the plain loop.

use std::fmt::Write;

/// Steps of each lane in one block of a pairwise sum (NumPy's pairwise sum uses blocks of 128
/// elements): a block's own rounding error stays within 128 additions.
pub const PAIRWISE_BLOCK_STEPS: u64 = 128;

/// A cascade of partial sums, `width` lanes wide, declared in the C code as `cas{n}` with the
/// block counter `nb{n}`.
pub(crate) struct Cascade {
    n: usize,
    width: usize,
    levels: usize,
}

impl Cascade {
    /// Declares the levels and the counter of a cascade of at most `leaves` leaves at `pad`;
    /// `t` is the C type summed. (The counter stays below `leaves`, so it never carries past
    /// level `⌊log2 leaves⌋`.)
    pub(super) fn declare(
        n: usize,
        (width, leaves): (usize, u64),
        t: &str,
        pad: &str,
        out: &mut String,
    ) -> Self {
        let levels = (u64::BITS - leaves.max(1).leading_zeros()) as usize;
        let _ = writeln!(
            out,
            "{pad}{t} cas{n}[{levels}][{width}]; uint64_t nb{n} = 0; /* pairwise sum */"
        );
        Cascade { n, width, levels }
    }

    /// Adds the `width` values of `block` (an array, or a scalar when the width is 1) as the
    /// next leaf; `add(a, b)` renders `a + b` in the summed precision. `block` is clobbered.
    pub(super) fn push(
        &self,
        block: &str,
        add: &mut dyn FnMut(&str, &str) -> String,
        pad: &str,
        out: &mut String,
    ) {
        let (n, w) = (self.n, self.width);
        let (value, level) = if w == 1 {
            (block.to_string(), format!("cas{n}[lv{n}][0]"))
        } else {
            (format!("{block}[w{n}]"), format!("cas{n}[lv{n}][w{n}]"))
        };
        let merged = add(&level, &value);
        let lanes = format!("for (int w{n} = 0; w{n} < {w}; ++w{n})");
        let _ = writeln!(out, "{pad}{{\n{pad}  int lv{n} = 0;");
        let _ = writeln!(
            out,
            "{pad}  for (uint64_t c{n} = nb{n}++; c{n} & 1u; c{n} >>= 1, ++lv{n}) {lanes} {value} = {merged};"
        );
        let _ = writeln!(out, "{pad}  {lanes} {level} = {value};\n{pad}}}");
    }

    /// Adds the pending levels into `into` (width values, or a scalar when the width is 1),
    /// the lowest first.
    pub(super) fn finish(
        &self,
        into: &str,
        add: &mut dyn FnMut(&str, &str) -> String,
        pad: &str,
        out: &mut String,
    ) {
        let (n, w, levels) = (self.n, self.width, self.levels);
        let (target, level) = if w == 1 {
            (into.to_string(), format!("cas{n}[lv{n}][0]"))
        } else {
            (format!("{into}[w{n}]"), format!("cas{n}[lv{n}][w{n}]"))
        };
        let merged = add(&target, &level);
        let _ = writeln!(
            out,
            "{pad}for (int lv{n} = 0; lv{n} < {levels}; ++lv{n}) if ((nb{n} >> lv{n}) & 1u) \
             for (int w{n} = 0; w{n} < {w}; ++w{n}) {target} = {merged};"
        );
    }
}
