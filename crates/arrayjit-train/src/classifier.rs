//! The MLP classifier trained as one compiled step: the model ([`Mlp`]), its training settings
//! ([`TrainConfig`], [`LossKind`]) and the loop ([`Classifier`]) that compiles forward +
//! backward + update once and runs it per batch with the batch index as a static binding, data
//! parallel on request.

use arrayjit_dist::{ProcessGroup, ReduceOp};
use arrayjit_ir::{
    AccumRhs, Assignments, BinOp, Error, MemoryMode, MemoryType, Operand, Prec, Projections,
    Result, StaticSymbol, UnOp,
};
use arrayjit_runtime::{Backend, CompileRequest, Context, DataParallel, Routine};
use arrayjit_tensor::datasets::Dataset;
use arrayjit_tensor::{Init, Optimizer, Tensor, grad_program, losses, update_program};

/// A multi-layer perceptron: `relu(x·W + b)` layers, the last one linear.
#[derive(Clone, Debug)]
pub struct Mlp {
    layers: Vec<(Tensor, Tensor)>,
}

impl Mlp {
    /// Layers of the given sizes (`[inputs, hidden..., outputs]`), Kaiming-uniform weights and
    /// zero biases drawn from `seed`.
    pub fn new(sizes: &[usize], seed: u64) -> Result<Mlp> {
        if sizes.len() < 2 {
            return Err(Error::invalid(
                "an MLP needs at least an input and an output size",
            ));
        }
        let mut layers = Vec::new();
        for (k, w) in sizes.windows(2).enumerate() {
            let weight = Tensor::param(
                &format!("w{k}"),
                &[w[0], w[1]],
                Init::KaimingUniform,
                seed,
                2 * k as u32,
            )?;
            let bias = Tensor::param(
                &format!("b{k}"),
                &[w[1]],
                Init::Zeros,
                seed,
                2 * k as u32 + 1,
            )?;
            layers.push((weight, bias));
        }
        Ok(Mlp { layers })
    }

    /// `[batch, inputs] → [batch, outputs]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (k, (w, b)) in self.layers.iter().enumerate() {
            h = h.matmul(w)?.add(b)?;
            if k + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    /// The parameters, weights and biases of each layer in order.
    pub fn params(&self) -> Vec<Tensor> {
        self.layers
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }
}

/// Which loss a classifier trains with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossKind {
    /// Hinge loss on one output with labels `±1` (two classes).
    Hinge,
    /// Softmax cross-entropy on one output per class.
    SoftmaxCrossEntropy,
}

/// Training settings.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Passes over the data.
    pub epochs: usize,
    /// Rows per batch (the remainder of the data is dropped).
    pub batch_size: usize,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// The loss.
    pub loss: LossKind,
    /// Data-parallel shards: with more than one, every step runs one batch per shard on its own
    /// stream (spread over the backend's devices), sums the gradients through merge buffers and
    /// updates once (so a step sees `shards` batches and their summed gradients).
    pub shards: usize,
}

impl TrainConfig {
    /// One shard (no data parallelism).
    pub fn new(
        epochs: usize,
        batch_size: usize,
        optimizer: Optimizer,
        loss: LossKind,
    ) -> TrainConfig {
        TrainConfig {
            epochs,
            batch_size,
            optimizer,
            loss,
            shards: 1,
        }
    }
}

/// How training steps run.
enum Engine {
    /// One routine: forward, backward, update.
    Single(Routine),
    /// Gradients per shard, summed, one update.
    Parallel(DataParallel),
    /// Gradients on this process, summed over the processes of a group on a communication
    /// stream, one update (identical on every rank).
    Distributed(Distributed),
}

/// The training step across processes: each rank computes the gradients of its own batch in
/// buckets, each bucket's gradients (and the batch loss) are all-reduced over the group on a
/// communication stream while the next bucket computes, then every rank runs the same update.
struct Distributed {
    group: ProcessGroup,
    /// Backprop in buckets ([`crate::buckets`]), in order, each with the nodes all-reduced
    /// once it has run (its gradients; the first also the step loss).
    buckets: Vec<(Routine, Vec<arrayjit_ir::Tnode>)>,
    update: Routine,
    comm: arrayjit_runtime::Stream,
    params: Vec<arrayjit_ir::Tnode>,
}

impl Distributed {
    /// One step over the batch `first + rank`: each bucket runs on the compute stream and its
    /// gradients are all-reduced on the communication stream after it, while the next bucket
    /// computes; the update waits for exactly those reductions (by the events of the arrays it
    /// reads).
    fn step(&self, batch: &StaticSymbol, first: usize) -> Result<()> {
        for (routine, reduced) in &self.buckets {
            // Buckets past the forward pass may not read the batch at all.
            if routine.bindings().iter().any(|b| b.symbol == batch.symbol) {
                routine.set_static(batch, (first + self.group.rank()) as i64)?;
            }
            routine.run()?;
            for tn in reduced {
                self.group
                    .all_reduce_array(routine.context(), tn, &self.comm, ReduceOp::Sum)?;
            }
        }
        self.update.run()
    }
}

/// The step loss (the batch loss copied out of the gradient routine) and every gradient: the
/// nodes summed across shards or processes, kept on the device per stream.
fn summed_nodes(
    grads: &arrayjit_tensor::GradProgram,
    why: &str,
) -> Result<(arrayjit_ir::Tnode, Vec<arrayjit_ir::Tnode>)> {
    let step_loss = arrayjit_ir::Tnode::new(Prec::F32, &[], &["step_loss"])?;
    let mut summed: Vec<arrayjit_ir::Tnode> = vec![step_loss.clone()];
    for p in &grads.params {
        let g = p
            .grad()
            .cloned()
            .ok_or_else(|| Error::invalid("a parameter has no gradient"))?;
        summed.push(g);
    }
    for t in &summed {
        t.update_memory_mode(MemoryMode::OnDevice(arrayjit_ir::Sharing::PerStream), why)?;
    }
    Ok((step_loss, summed))
}

/// The gradient and update routines of a data-parallel step: gradients (and the batch loss
/// into `step_loss`) per shard or rank, and the update adding the summed step loss to the
/// epoch's. The nodes summed across shards are returned with the codes (step loss first).
fn data_parallel_codes(
    backend: &Backend,
    grads: &arrayjit_tensor::GradProgram,
    update: &arrayjit_tensor::Update,
    loss: &Tensor,
    epoch_loss: &Tensor,
    batch: &StaticSymbol,
    why: &str,
) -> Result<(Vec<arrayjit_runtime::Code>, Vec<arrayjit_ir::Tnode>)> {
    let (step_loss, summed) = summed_nodes(grads, why)?;
    let grad_program = grads
        .program
        .clone()
        .then(add_into(&step_loss, loss.node(), BinOp::Arg2));
    let update_program = update_with_loss(update, epoch_loss, &step_loss);
    let codes = backend.compile(
        CompileRequest::batch(&[
            ("shard_gradients", &grad_program),
            ("update", &update_program),
        ])
        .bindings(std::slice::from_ref(batch)),
    )?;
    Ok((codes, summed))
}

/// The optimizer's update followed by adding the step's (summed) loss into the epoch's.
fn update_with_loss(
    update: &arrayjit_tensor::Update,
    epoch_loss: &Tensor,
    step_loss: &arrayjit_ir::Tnode,
) -> Assignments {
    update
        .program
        .clone()
        .then(add_into(epoch_loss.node(), step_loss, BinOp::Add))
}

/// `dst (accum)= src`, element by element.
fn add_into(dst: &arrayjit_ir::Tnode, src: &arrayjit_ir::Tnode, accum: BinOp) -> Assignments {
    Assignments::Accum {
        initialize_neutral: false,
        accum,
        lhs: dst.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Node(src.clone())),
        projections: Projections::pointwise(&[], 1),
    }
}

/// What one epoch did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochStats {
    /// 0-based epoch.
    pub epoch: usize,
    /// Mean batch loss.
    pub loss: f64,
}

/// A classifier being trained on a backend: the compiled training step linked into a context,
/// with inference routines linked next to it (sharing its parameters).
pub struct Classifier {
    backend: Backend,
    model: Mlp,
    loss: LossKind,
    engine: Engine,
    batch: StaticSymbol,
    batches: usize,
    epoch_loss: Tensor,
    /// The learning rate node (hosted): change it between epochs with `set_values`.
    pub learning_rate: arrayjit_ir::Tnode,
    /// Time spent optimizing, compiling (or loading from the cache) and linking the training
    /// step, not building its graph.
    pub compile_and_link: std::time::Duration,
}

fn out_classes(loss: LossKind, classes: usize) -> usize {
    match loss {
        LossKind::Hinge => 1,
        LossKind::SoftmaxCrossEntropy => classes,
    }
}

impl Classifier {
    /// Builds and compiles the training step for `model` on `train` (one routine: forward,
    /// backprop, optimizer update, loss accumulation), and links it on a new stream of device 0.
    pub fn new(
        backend: &Backend,
        model: Mlp,
        train: &Dataset,
        config: &TrainConfig,
    ) -> Result<Classifier> {
        Classifier::build(backend, model, train, config, None)
    }

    /// [`Classifier::new`] for data-parallel training across the processes of `group` (one
    /// stream per process; `config.shards` must be 1): every process holds the whole training
    /// set and the same initial model (same seed); a step runs batch `step · size + rank` on
    /// each rank, sums the gradients and batch losses over the group on a communication stream,
    /// and applies one update, identical on every rank. The same as one process training with
    /// `shards = group.size()` on the same batches, up to float rounding of the sums.
    ///
    /// Backprop runs in buckets of at least `bucket_bytes` of gradients
    /// ([`crate::buckets::DEFAULT_BUCKET_BYTES`] is PyTorch's default): each bucket's gradients
    /// are all-reduced while the next bucket computes (on backends whose streams run
    /// concurrently, such as `multicore_cc`).
    pub fn new_distributed(
        backend: &Backend,
        model: Mlp,
        train: &Dataset,
        config: &TrainConfig,
        group: &ProcessGroup,
        bucket_bytes: usize,
    ) -> Result<Classifier> {
        if config.shards > 1 {
            return Err(Error::BadValue {
                what: "shards per process with training across processes".into(),
                value: config.shards.to_string(),
                expected: "1 (start more processes instead)".into(),
            });
        }
        Classifier::build(backend, model, train, config, Some((group, bucket_bytes)))
    }

    fn build(
        backend: &Backend,
        model: Mlp,
        train: &Dataset,
        config: &TrainConfig,
        group: Option<(&ProcessGroup, usize)>,
    ) -> Result<Classifier> {
        if config.loss == LossKind::Hinge && train.classes != 2 {
            return Err(Error::BadValue {
                what: "classes of the dataset for the hinge loss".into(),
                value: train.classes.to_string(),
                expected: "2 (use the softmax cross-entropy loss for more)".into(),
            });
        }
        let (batches, xs) = train.batches(config.batch_size)?;
        let bs = config.batch_size;
        let x_all = Tensor::input(Prec::F32, &[batches, bs, train.features], "x_batches", &xs)?;
        let k = out_classes(config.loss, train.classes);
        let y_values: Vec<f64> = match config.loss {
            LossKind::Hinge => train.signed_labels(),
            LossKind::SoftmaxCrossEntropy => train.one_hot()?,
        };
        let y_all = Tensor::input(
            Prec::F32,
            &[batches, bs, k],
            "y_batches",
            &y_values[..batches * bs * k],
        )?;
        let batch = StaticSymbol::new("batch", batches);
        let xb = Tensor::slice(&x_all, &batch)?;
        let yb = Tensor::slice(&y_all, &batch)?;
        let out = model.forward(&xb)?;
        let loss = match config.loss {
            LossKind::Hinge => losses::hinge(&out, &yb)?,
            LossKind::SoftmaxCrossEntropy => losses::softmax_cross_entropy(&out, &yb)?,
        };
        let grads = grad_program(&loss)?;
        let update = update_program(&config.optimizer, &grads.params)?;
        let epoch_loss = Tensor::input(Prec::F32, &[], "epoch_loss", &[0.0])?;
        let shards = match group {
            Some((g, _)) => g.size(),
            None => config.shards.max(1),
        };
        if batches < shards {
            return Err(Error::BadValue {
                what: format!("batches of {bs} in a training set of {} rows", train.len()),
                value: batches.to_string(),
                expected: format!(
                    "at least one per shard or process ({shards}): use smaller batches or fewer \
                     shards"
                ),
            });
        }
        let compile_started = std::time::Instant::now();
        let engine = if let Some((group, bucket_bytes)) = group {
            let (step_loss, summed) = summed_nodes(&grads, "train: summed across processes")?;
            let buckets = crate::buckets::split(&grads.program, &summed[1..], bucket_bytes)?;
            let mut programs: Vec<(String, Assignments)> = Vec::new();
            let mut reduced = Vec::new();
            for (k, b) in buckets.into_iter().enumerate() {
                let mut nodes = b.gradients;
                let program = if k == 0 {
                    nodes.insert(0, step_loss.clone());
                    b.program
                        .then(add_into(&step_loss, loss.node(), BinOp::Arg2))
                } else {
                    b.program
                };
                programs.push((format!("gradients_{k}"), program));
                reduced.push(nodes);
            }
            programs.push((
                "update".into(),
                update_with_loss(&update, &epoch_loss, &step_loss),
            ));
            let named: Vec<(&str, &Assignments)> =
                programs.iter().map(|(n, p)| (n.as_str(), p)).collect();
            let mut codes = backend
                .compile(CompileRequest::batch(&named).bindings(std::slice::from_ref(&batch)))?;
            let update_code = codes.pop().expect("the update was compiled");
            let device = backend.get_device(0)?;
            let mut context = Context::new(&device.new_stream()?);
            let mut linked = Vec::new();
            for (code, nodes) in codes.iter().zip(reduced) {
                let routine = context.link(code)?;
                context = routine.context().clone();
                linked.push((routine, nodes));
            }
            Engine::Distributed(Distributed {
                group: group.clone(),
                buckets: linked,
                update: context.link(&update_code)?,
                comm: device.new_stream()?,
                params: grads.params.iter().map(|p| p.node().clone()).collect(),
            })
        } else if shards == 1 {
            let program = grads.program.then(update.program.clone()).then(add_into(
                epoch_loss.node(),
                loss.node(),
                BinOp::Add,
            ));
            let code = backend.compile(
                CompileRequest::routine("train_step", &program)
                    .bindings(std::slice::from_ref(&batch)),
            )?;
            let stream = backend.get_device(0)?.new_stream()?;
            Engine::Single(Context::new(&stream).link(&code)?)
        } else {
            // Gradients and the batch loss are computed per shard and summed by the helper.
            let (codes, merged) = data_parallel_codes(
                backend,
                &grads,
                &update,
                &loss,
                &epoch_loss,
                &batch,
                "train: summed across data-parallel shards",
            )?;
            let devices = backend.num_devices().max(1);
            let streams = (0..shards)
                .map(|i| backend.get_device(i % devices)?.new_stream())
                .collect::<Result<Vec<_>>>()?;
            let params: Vec<arrayjit_ir::Tnode> =
                grads.params.iter().map(|p| p.node().clone()).collect();
            Engine::Parallel(DataParallel::new(
                backend, &streams, &codes[0], &codes[1], &merged, &params,
            )?)
        };
        let compile_and_link = compile_started.elapsed();
        Ok(Classifier {
            compile_and_link,
            backend: backend.clone(),
            model,
            loss: config.loss,
            engine,
            batch,
            batches: batches / shards * shards,
            epoch_loss,
            learning_rate: update.lr,
        })
    }

    /// The context inference code links into (it holds the trained parameters).
    fn context(&self) -> &Context {
        match &self.engine {
            Engine::Single(step) => step.context(),
            Engine::Parallel(dp) => dp.update_routine().context(),
            Engine::Distributed(d) => d.update.context(),
        }
    }

    /// A debug check that every process holds the same parameters (a hash compared across the
    /// group; see [`ProcessGroup::check_identical`]); `Ok` for a single process.
    pub fn check_parameters_identical(&self) -> Result<()> {
        match &self.engine {
            Engine::Distributed(d) => d.group.check_identical(&d.params),
            _ => Ok(()),
        }
    }

    /// One pass over the batches; returns the mean batch loss.
    pub fn epoch(&self, epoch: usize) -> Result<EpochStats> {
        self.epoch_loss.node().host().set_values(&[0.0])?;
        match &self.engine {
            Engine::Single(step) => {
                for b in 0..self.batches {
                    step.set_static(&self.batch, b as i64)?;
                    step.run()?;
                }
            }
            Engine::Parallel(dp) => {
                let n = dp.num_shards();
                for first in (0..self.batches).step_by(n) {
                    for i in 0..n {
                        let routine = dp.grad_routine(i).expect("shard exists");
                        routine.set_static(&self.batch, (first + i) as i64)?;
                    }
                    dp.step()?;
                }
            }
            Engine::Distributed(d) => {
                let n = d.group.size();
                for first in (0..self.batches).step_by(n) {
                    d.step(&self.batch, first)?;
                }
            }
        }
        let total = self.epoch_loss.values()?[0];
        Ok(EpochStats {
            epoch,
            loss: total / self.batches as f64,
        })
    }

    /// The model.
    pub fn model(&self) -> &Mlp {
        &self.model
    }

    /// Scores of the model for `rows` inputs of `features` each (row-major), computed on the
    /// backend next to the training step: `[rows, outputs]`.
    pub fn predict_scores(&self, x: &[f64], features: usize) -> Result<Vec<f64>> {
        let rows = x.len() / features.max(1);
        let input = Tensor::input(Prec::F32, &[rows, features], "x_eval", x)?;
        let out = self.model.forward(&input)?;
        out.node().update_memory_mode(
            MemoryMode::Hosted(MemoryType::Nonconstant),
            "train: predictions read on the host",
        )?;
        let code = self.backend.compile(CompileRequest::routine(
            "predict",
            &arrayjit_tensor::forward_program(&[&out]),
        ))?;
        let routine = self.context().link(&code)?;
        routine.run()?;
        out.values()
    }

    /// Predicted classes for `rows` inputs.
    pub fn predict(&self, x: &[f64], features: usize) -> Result<Vec<usize>> {
        let scores = self.predict_scores(x, features)?;
        Ok(match self.loss {
            LossKind::Hinge => scores.iter().map(|&s| usize::from(s > 0.0)).collect(),
            LossKind::SoftmaxCrossEntropy => {
                let k = scores.len() / (x.len() / features.max(1)).max(1);
                scores
                    .chunks(k.max(1))
                    .map(|row| {
                        row.iter()
                            .enumerate()
                            .fold((0, f64::NEG_INFINITY), |best, (i, &v)| {
                                if v > best.1 { (i, v) } else { best }
                            })
                            .0
                    })
                    .collect()
            }
        })
    }

    /// Fraction of `data` classified correctly.
    pub fn accuracy(&self, data: &Dataset) -> Result<f64> {
        let predicted = self.predict(&data.x, data.features)?;
        let correct = predicted
            .iter()
            .zip(&data.labels)
            .filter(|(p, l)| p == l)
            .count();
        Ok(correct as f64 / data.len().max(1) as f64)
    }
}
