//! The CPU schedule of a fused attention pass ([`arrayjit_ir::attention`]): the pass's loop nest,
//! found whole among a routine's statements, runs as a blocked helper of the C backends
//! instead of its loops. The helper walks the keys in blocks of [`AttentionPlan::block_keys`]
//! for a block of [`AttentionPlan::block_queries`] query rows at a time (the key gradients:
//! query blocks for a block of keys), keeps a block's scores in a small buffer, skips the
//! blocks a causal mask hides entirely, and splits the blocks of every batch element and head
//! over the device's workers. It computes what the loops compute, in another order of the
//! same float operations, so results agree with the loops within float rounding.

use std::fmt;
use std::sync::Arc;

use arrayjit_ir::attention::AttentionOp;
use arrayjit_ir::low_level::LowLevel;
use arrayjit_ir::prec::Prec;

use super::{Blocking, ScheduleSettings};

/// How one pass of fused attention runs on a CPU.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionPlan {
    /// The pass (its spec and the nodes it reads and writes).
    pub op: Arc<AttentionOp>,
    /// Query rows per block.
    pub block_queries: usize,
    /// Keys per block.
    pub block_keys: usize,
    /// The blocking of the product helper whose micro-kernels run the block products
    /// (`Q·Kᵀ`, `P·V` and the gradients' products), the same as `f32` contractions get.
    pub blocking: Blocking,
}

/// Query rows per block: a multiple of the register tiles' columns (32 or 16) and of whole
/// cache lines, so that every block's rows of the transposed queries start on a line.
/// Measured on the Xeon (6/207), forward + backward of batch 4, 12 heads of 64, T = 1024 on one
/// core, first with the transposes' rows in one L1 set: 32 × 64 blocks took 386–435 ms,
/// 48 × 128 385 ms, 96 × 128 329–338 ms, 128 × 128 325–337 ms, 96 × 256 339–345 ms, 192 × 128
/// 343–349 ms; then with them spread: 96 × 128 306–321 ms, 120 × 128 314–316, 128 × 128
/// 286–293, 144 × 128 318–327, 128 × 256 297–301, 128 × 64 327–359; at T = 4096 96 and 128
/// rows alike (3930 ms). Larger blocks pack the keys and values fewer times and call the block
/// products less often; past these the scores of a block leave L2 and the causal diagonal
/// wastes more. Once diagonal blocks ran in strips (each over the keys its rows see), the sizes
/// came out alike: 96, 128 or 192 × 128, 128 × 256 and 256 × 256 249–258 ms, 256 × 128 282–302.
pub const ATTENTION_BLOCK_QUERIES: usize = 128;
/// Keys per block (a multiple of 16: the row maxima and sums run over 16 lanes).
pub const ATTENTION_BLOCK_KEYS: usize = 128;

impl AttentionPlan {
    /// The plan of `stmt` if it is a whole pass of fused attention the helper runs: `f32`
    /// inputs, outputs and statistics, no padding, a `u32` dropout step (the helper draws the
    /// same Philox values as the loops). `Err` says why a pass is left to its loops.
    pub fn detect(
        stmt: &LowLevel,
        settings: &ScheduleSettings,
    ) -> Option<std::result::Result<AttentionPlan, String>> {
        AttentionPlan::detect_with(stmt, settings, Blocking::for_settings(settings, 4))
    }

    /// [`AttentionPlan::detect`] with the product helper's blocking given.
    pub fn detect_with(
        stmt: &LowLevel,
        settings: &ScheduleSettings,
        blocking: Blocking,
    ) -> Option<std::result::Result<AttentionPlan, String>> {
        let op = AttentionOp::of_statement(stmt)?;
        let spec = op.spec();
        let step = spec.dropout.as_ref().map(|d| &d.step);
        let unfit = op
            .inputs()
            .into_iter()
            .chain(op.outputs())
            .filter(|t| Some(*t) != step)
            .find(|t| t.prec() != Prec::F32 || t.padding().is_some());
        let step_unfit = step.filter(|t| t.prec() != Prec::U32 || t.padding().is_some());
        let why_not = if !settings.enable_contractions {
            Some("blocked products are disabled in the schedule settings".to_string())
        } else if let Some(t) = step_unfit {
            Some(format!(
                "the dropout step {} is not an unpadded u32 node",
                t.debug_name()
            ))
        } else {
            unfit.map(|t| {
                format!(
                    "{} is {}{}: the blocked helper takes unpadded f32 arrays",
                    t.debug_name(),
                    t.prec().name(),
                    if t.padding().is_some() {
                        ", padded"
                    } else {
                        ""
                    }
                )
            })
        };
        Some(match why_not {
            Some(why) => Err(why),
            None => Ok(AttentionPlan {
                op,
                block_queries: ATTENTION_BLOCK_QUERIES,
                block_keys: ATTENTION_BLOCK_KEYS,
                blocking,
            }),
        })
    }
}

impl fmt::Display for AttentionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: blocks of {} queries × {} keys, their products on {}×{} register tiles{}",
            self.op.describe(),
            self.block_queries,
            self.block_keys,
            self.blocking.mr,
            self.blocking.nr,
            if self.op.spec().causal {
                ", blocks above the diagonal skipped"
            } else {
                ""
            }
        )
    }
}
