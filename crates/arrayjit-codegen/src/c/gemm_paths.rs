//! Which optional paths of the blocked-product helper (`c/gemm.rs`) a library's products can
//! reach — the guarded steps, the one-row product — so that its unit leaves the others out and
//! gcc never compiles them; and the comments by which a rendered helper says what it left out.

use arrayjit_opt::schedule::Blocking;

/// Which of the product helper's paths a library's products can reach
/// ([`gemm_definition`](crate::c::gemm::gemm_definition)):
/// the others are left out of its unit, so that gcc never compiles them (the guarded steps are a
/// fifth of the unit's compile time, the one-row product a quarter). A path is left out only
/// where no product of the library can reach it, so every product runs the code it ran with the
/// whole helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelperPaths {
    /// Some product is guarded: the guarded steps (bands, masks, guarded tiles, the guarded
    /// one-row product). Without it, every function taking a guard drops it first.
    pub guarded: bool,
    /// Some product can run as one row or one column of C (`{name}_row`).
    pub one_row: bool,
}

impl HelperPaths {
    /// Every path: the whole helper (the benchmark harnesses' unit).
    pub const ALL: HelperPaths = HelperPaths {
        guarded: true,
        one_row: true,
    };
    /// No optional path (the attention helper's packed products reach neither).
    pub const NONE: HelperPaths = HelperPaths {
        guarded: false,
        one_row: false,
    };

    /// The paths a product of `m` rows and `n` columns of C can reach on blocking `b`. The
    /// one-row product runs where a one-thread product has one row or one column: the product
    /// itself, either way round (a column-major C runs as its transpose), or the last range of
    /// a split over the workers, which holds `m` modulo a multiple of `mr` rows (or `n` modulo
    /// a multiple of `nr` columns) and so can hold one only where that remainder is 1 (with a
    /// tile of one row or column, any range can).
    pub fn of_product(m: usize, n: usize, guarded: bool, b: &Blocking) -> HelperPaths {
        let one_row = m == 1
            || n == 1
            || b.mr <= 1
            || b.nr <= 1
            || [m, n]
                .iter()
                .any(|&extent| extent % b.mr == 1 || extent % b.nr == 1);
        HelperPaths { guarded, one_row }
    }

    /// The paths either reaches.
    pub fn union(self, other: HelperPaths) -> HelperPaths {
        HelperPaths {
            guarded: self.guarded || other.guarded,
            one_row: self.one_row || other.one_row,
        }
    }

    /// The paths a definition of [`gemm_definition`](crate::c::gemm::gemm_definition) keeps
    /// (read from its comments).
    pub(crate) fn of_definition(definition: &str) -> HelperPaths {
        HelperPaths {
            guarded: !definition.contains(GUARDS_DROPPED),
            one_row: !definition.contains(ONE_ROW_DROPPED),
        }
    }
}

/// The comment on each line of a helper that drops its guards (no product is guarded).
pub(crate) const GUARDS_DROPPED: &str = "no product of this library is guarded";
/// The comment on each test of a helper that leaves out its one-row product.
pub(crate) const ONE_ROW_DROPPED: &str = "no product of this library runs as one row";
