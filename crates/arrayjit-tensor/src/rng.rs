//! Random numbers: the counter-based Philox generator (host-side draws for initialization and
//! data, shared with the IR) and [`RandomStream`], which draws fresh uniform tensors inside
//! routines at every step (dropout masks) without storing them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

pub use arrayjit_ir::random::Philox;
use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, Error, FetchOp, MemoryMode, MemoryType, Operand, Prec,
    Projections, Result, Tnode, UnOp,
};

use crate::tensor::Tensor;

/// Stream ids of routine draws start here, apart from the small ids host draws use.
const FIRST_ROUTINE_STREAM: u32 = 0x8000_0000;

/// A source of random tensors computed inside routines: draw `i` of a stream is Philox keyed
/// by the seed at counter `(position, stream id of draw i, step)`, where `step` is a hosted
/// `u32` scalar node read when the routine runs. Add [`RandomStream::advance`] to a training
/// step's program so each run draws new values; save [`RandomStream::step`] with checkpoints
/// to continue the same sequence.
///
/// A drawn tensor is recomputed wherever it is read (in the forward and the backward pass
/// alike) when the optimizer inlines it, so a dropout mask costs no memory. The step is exact
/// while it stays below 2^32; it wraps after that.
#[derive(Clone, Debug)]
pub struct RandomStream {
    seed: u64,
    step: Tensor,
    /// The constant 1 the advance adds (one node, so advancing twice reuses it).
    one: Tnode,
    draws: Arc<AtomicU32>,
}

impl RandomStream {
    /// A stream keyed by `seed`, at step 0, its step node labelled `label`.
    pub fn new(seed: u64, label: &str) -> Result<RandomStream> {
        let step = Tensor::input(Prec::U32, &[], label, &[0.0])?;
        step.node().update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "random stream: the step that selects each run's draws",
        )?;
        Ok(RandomStream {
            seed,
            one: Tnode::new(Prec::U32, &[], &[&format!("{label}_increment")])?,
            step,
            draws: Arc::new(AtomicU32::new(0)),
        })
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The hosted `u32` step node (save it with checkpoints).
    pub fn step(&self) -> &Tensor {
        &self.step
    }

    /// The program that adds one to the step: run it after every read of this stream's draws
    /// (at the end of a training step).
    pub fn advance(&self) -> Assignments {
        let step = self.step.node();
        let one = self.one.clone();
        Assignments::Fetch {
            array: one.clone(),
            op: FetchOp::Constant(1.0),
        }
        .then(Assignments::Accum {
            initialize_neutral: false,
            accum: BinOp::Add,
            lhs: step.clone(),
            rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(one)),
            projections: Projections::pointwise(step.dims(), 1),
        })
    }

    /// The next draw of this stream: its number and the generator stream it draws from. A
    /// fused operation that draws inside its own loops (attention's dropout) takes one here, so
    /// its draws are those [`RandomStream::uniform`] would have made as that draw.
    pub fn next_draw(&self) -> Result<(u32, u32)> {
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        if draw >= FIRST_ROUTINE_STREAM {
            return Err(Error::BadValue {
                what: format!("draws of the random stream with seed {}", self.seed),
                value: (u64::from(draw) + 1).to_string(),
                expected: format!("at most {FIRST_ROUTINE_STREAM}; make a new stream"),
            });
        }
        Ok((draw, FIRST_ROUTINE_STREAM + draw))
    }

    /// A tensor of `dims` holding uniform values in `[0, 1)` (24 random bits), fresh for this
    /// call and for every step. No gradient flows through it.
    pub fn uniform(&self, prec: Prec, dims: &[usize]) -> Result<Tensor> {
        if !prec.is_float() {
            return Err(Error::BadValue {
                what: "precision of random uniform values".into(),
                value: prec.name().into(),
                expected: "a float precision".into(),
            });
        }
        let (draw, stream) = self.next_draw()?;
        let tn = Tnode::new(prec, dims, &[&format!("uniform{draw}")])?;
        let fill = Assignments::Fetch {
            array: tn.clone(),
            op: FetchOp::Random {
                seed: self.seed,
                stream,
                step: self.step.node().clone(),
            },
        };
        Ok(Tensor::custom(tn, fill, vec![self.step.clone()], None))
    }
}

impl Tensor {
    /// Inverted dropout: each element is zeroed with probability `p` and the kept ones are
    /// scaled by `1 / (1 - p)`, so the expected value is unchanged. The mask comes from `rng`
    /// (fresh per call and per step) and is recomputed in the backward pass, not stored. `p`
    /// must be in `[0, 1]`; `p == 0` returns the tensor unchanged, `p == 1` zeros.
    pub fn dropout(&self, p: f64, rng: &RandomStream) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::BadValue {
                what: "dropout probability".into(),
                value: p.to_string(),
                expected: "a number in [0, 1]".into(),
            });
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let prec = if self.prec() == Prec::F64 {
            Prec::F64
        } else {
            Prec::F32
        };
        let u = rng.uniform(prec, self.dims())?;
        let dropped = u.cmplt(&Tensor::full(prec, &[], p)?)?;
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        let kept = Tensor::where_(
            &dropped,
            &Tensor::full(prec, &[], 0.0)?,
            &Tensor::full(prec, &[], scale)?,
        )?;
        // Recomputing the mask where it is read (forward and backward) costs a few integer
        // operations per element; storing it costs a write and a read of memory per use.
        for t in [&u, &dropped, &kept] {
            t.node().update_memory_mode(
                MemoryMode::Virtual,
                "dropout: the mask is recomputed from its counter where it is read, not stored",
            )?;
        }
        self.mul(&kept)
    }
}
