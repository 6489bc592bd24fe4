//! The main demo: train an MLP on half-moons, report held-out accuracy, and draw the decision
//! boundary, the points and the loss curve into a PNG.

use std::path::Path;
use std::time::{Duration, Instant};

use arrayjit_ir::{Error, Result};
use arrayjit_tensor::Optimizer;
use arrayjit_tensor::datasets::{Dataset, moons};
use plotters::prelude::*;

use arrayjit::train::{Classifier, EpochStats, LossKind, Mlp, TrainConfig};

/// Settings of the demo.
#[derive(Clone, Debug)]
pub struct MoonsConfig {
    /// Backend name (`None`: `ARRAYJIT_BACKEND`, else `sync_cc`).
    pub backend: Option<String>,
    /// Training epochs.
    pub epochs: usize,
    /// Seed of the data, the split and the parameters.
    pub seed: u64,
    /// Number of points (80% train, 20% held out).
    pub samples: usize,
    /// Where to write the picture (`None`: no picture).
    pub output: Option<std::path::PathBuf>,
    /// Data-parallel shards (streams) per step; 1 trains on one stream.
    pub shards: usize,
    /// Train across the processes of this group (see
    /// [`arrayjit::train::Classifier::new_distributed`]); `None`: this process alone.
    pub group: Option<arrayjit::dist::ProcessGroup>,
}

impl Default for MoonsConfig {
    fn default() -> Self {
        MoonsConfig {
            backend: None,
            epochs: 60,
            seed: 1,
            samples: 500,
            output: Some("moons.png".into()),
            shards: 1,
            group: None,
        }
    }
}

/// What the demo produced.
#[derive(Clone, Debug)]
pub struct MoonsReport {
    /// The backend trained on.
    pub backend: String,
    /// Loss of every epoch.
    pub losses: Vec<f64>,
    /// Accuracy on the training points.
    pub train_accuracy: f64,
    /// Accuracy on the held-out points.
    pub test_accuracy: f64,
    /// Time to build and compile the training step (cold or from the compile cache).
    pub build_time: Duration,
    /// Time of all epochs.
    pub train_time: Duration,
}

/// The trained model with its data, ready to draw ([`Trained::draw`]).
pub struct Trained {
    /// What training produced.
    pub report: MoonsReport,
    classifier: Classifier,
    train: Dataset,
    test: Dataset,
}

impl Trained {
    /// Draws the decision boundary, the points and the loss curve into a picture at `path`
    /// (checked first with [`check_picture_path`]).
    pub fn draw(&self, path: &Path) -> Result<()> {
        check_picture_path(path)?;
        draw(
            path,
            &self.classifier,
            &self.train,
            &self.test,
            &self.report.losses,
        )
    }
}

/// Trains on moons and draws the picture when `config.output` names one; `on_epoch` sees
/// every epoch's statistics (e.g. to drive a progress bar).
pub fn run(config: &MoonsConfig, on_epoch: impl FnMut(&EpochStats)) -> Result<MoonsReport> {
    if let Some(path) = &config.output {
        check_picture_path(path)?;
    }
    let trained = train(config, on_epoch)?;
    if let Some(path) = &config.output {
        trained.draw(path)?;
    }
    Ok(trained.report)
}

/// The samples, epochs and shards the demo accepts: an error naming the limit otherwise.
/// Every shard takes a batch of [`BATCH_SIZE`] training points per step, and 80% of the
/// samples train, so `samples` must give `shards` such batches and leave held-out points.
pub fn check_config(config: &MoonsConfig) -> Result<()> {
    if config.epochs == 0 {
        return Err(Error::invalid("--epochs must be at least 1"));
    }
    if config.shards == 0 {
        return Err(Error::invalid(
            "--shards must be at least 1 (1 trains on one stream)",
        ));
    }
    let train_points = (config.samples as f64 * 0.8).round() as usize;
    let processes = config.group.as_ref().map_or(1, |g| g.size());
    let needed = BATCH_SIZE * config.shards * processes;
    if train_points < needed || config.samples <= train_points {
        let least = (needed as f64 / 0.8).ceil() as usize + 1;
        return Err(Error::BadValue {
            what: "--samples".into(),
            value: config.samples.to_string(),
            expected: format!(
                "{least} or more: {train_points} training points, and {} shard(s) need at least \
                 {needed} (a batch of {BATCH_SIZE} each) and held-out points",
                config.shards * processes
            ),
        });
    }
    Ok(())
}

/// Points per batch in the demo's training.
pub const BATCH_SIZE: usize = 20;

/// Trains on moons without drawing (see [`run`]).
pub fn train(config: &MoonsConfig, mut on_epoch: impl FnMut(&EpochStats)) -> Result<Trained> {
    check_config(config)?;
    let backend = match &config.backend {
        Some(name) => arrayjit_runtime::backend(name)?,
        None => arrayjit_runtime::default_backend()?,
    };
    backend.check_available()?;
    let data = moons(config.samples, 0.1, config.seed)?;
    let (train, test) = data.split(0.8, config.seed)?;
    let started = Instant::now();
    let model = Mlp::new(&[2, 16, 16, 1], config.seed)?;
    let settings = TrainConfig {
        epochs: config.epochs,
        batch_size: BATCH_SIZE,
        optimizer: Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        loss: LossKind::Hinge,
        shards: config.shards,
    };
    let classifier = match &config.group {
        Some(group) => Classifier::new_distributed(
            &backend,
            model,
            &train,
            &settings,
            group,
            arrayjit::buckets::DEFAULT_BUCKET_BYTES,
        )?,
        None => Classifier::new(&backend, model, &train, &settings)?,
    };
    let build_time = started.elapsed();
    let started = Instant::now();
    let mut losses = Vec::new();
    for epoch in 0..config.epochs {
        let stats = classifier.epoch(epoch)?;
        losses.push(stats.loss);
        on_epoch(&stats);
    }
    let train_time = started.elapsed();
    // Across processes, every rank must hold the same parameters (a hash compared).
    classifier.check_parameters_identical()?;
    let report = MoonsReport {
        backend: backend.name().to_string(),
        train_accuracy: classifier.accuracy(&train)?,
        test_accuracy: classifier.accuracy(&test)?,
        losses,
        build_time,
        train_time,
    };
    Ok(Trained {
        report,
        classifier,
        train,
        test,
    })
}

/// Checks that a picture can be written at `path` before anything is trained: a known
/// extension (`.png`, `.bmp`), a folder that exists, and permission to write there. The error
/// names the path and what is wrong.
pub fn check_picture_path(path: &Path) -> Result<()> {
    let shown = path.display();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !matches!(ext.as_deref(), Some("png" | "bmp")) {
        return Err(Error::BadValue {
            what: "picture path".into(),
            value: shown.to_string(),
            expected: "a file name ending in .png or .bmp".into(),
        });
    }
    if path.is_dir() {
        return Err(Error::BadValue {
            what: "picture path".into(),
            value: shown.to_string(),
            expected: "a file, not a folder (name a file in it)".into(),
        });
    }
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(Error::BadValue {
            what: "picture path".into(),
            value: shown.to_string(),
            expected: format!(
                "a file in a folder that exists ({} does not)",
                folder.display()
            ),
        });
    }
    let probe = folder.join(format!(".arrayjit-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(Error::io(
            format!("checking that the folder of the picture {shown} is writable"),
            e,
        )),
    }
}

/// The bundled font the picture's text uses (DejaVu Sans; see `assets/DejaVuSans-LICENSE.txt`):
/// no system font is needed.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers the bundled font as plotters' `sans-serif`, once.
fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
            .map_err(|_| "the bundled font does not load".to_string())
    })
    .clone()
    .map_err(Error::invalid)
}

/// The decision boundary with the training and held-out points (left) and the loss curve
/// (right), with titles, axis values and a legend. An error names the path.
pub fn draw(
    path: &Path,
    classifier: &Classifier,
    train: &Dataset,
    test: &Dataset,
    losses: &[f64],
) -> Result<()> {
    let plot_error = |e: &dyn std::fmt::Display| {
        Error::invalid(format!(
            "drawing the picture {} failed: {e}",
            path.display()
        ))
    };
    register_font()?;
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for data in [train, test] {
        for i in 0..data.len() {
            let p = data.row(i);
            x0 = x0.min(p[0]);
            x1 = x1.max(p[0]);
            y0 = y0.min(p[1]);
            y1 = y1.max(p[1]);
        }
    }
    let (x0, x1, y0, y1) = (x0 - 0.5, x1 + 0.5, y0 - 0.5, y1 + 0.5);
    let grid = 120;
    let mut points = Vec::with_capacity(grid * grid * 2);
    for gy in 0..grid {
        for gx in 0..grid {
            points.push(x0 + (x1 - x0) * (gx as f64 + 0.5) / grid as f64);
            points.push(y0 + (y1 - y0) * (gy as f64 + 0.5) / grid as f64);
        }
    }
    let classes = classifier.predict(&points, 2)?;
    let root = BitMapBackend::new(path, (1300, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let (left, right) = root.split_horizontally(650);
    let mut chart = ChartBuilder::on(&left)
        .caption("Decision boundary on half-moons", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("x₁")
        .y_desc("x₂")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| plot_error(&e))?;
    let (dx, dy) = ((x1 - x0) / grid as f64, (y1 - y0) / grid as f64);
    let background = [RGBColor(205, 220, 250), RGBColor(250, 210, 205)];
    chart
        .draw_series(classes.iter().enumerate().map(|(k, &c)| {
            let (px, py) = (points[2 * k], points[2 * k + 1]);
            Rectangle::new(
                [
                    (px - dx / 2.0, py - dy / 2.0),
                    (px + dx / 2.0, py + dy / 2.0),
                ],
                background[c.min(1)].filled(),
            )
        }))
        .map_err(|e| plot_error(&e))?;
    let colors = [RGBColor(30, 70, 200), RGBColor(200, 40, 30)];
    // Training points filled, held-out points as rings.
    for (data, filled, label) in [
        (train, true, "training points"),
        (test, false, "held-out points"),
    ] {
        chart
            .draw_series((0..data.len()).map(|i| {
                let p = data.row(i);
                let color = colors[data.labels[i].min(1)];
                let style = if filled {
                    color.filled()
                } else {
                    color.stroke_width(2)
                };
                Circle::new((p[0], p[1]), if filled { 3 } else { 4 }, style)
            }))
            .map_err(|e| plot_error(&e))?
            .label(label)
            .legend(move |(x, y)| {
                let style = if filled {
                    BLACK.filled()
                } else {
                    BLACK.stroke_width(2)
                };
                Circle::new((x + 8, y), 4, style)
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_error(&e))?;
    let max_loss = losses.iter().cloned().fold(0.0f64, f64::max).max(1e-9);
    let x_end = (losses.len().max(2) - 1) as f64;
    let mut curve = ChartBuilder::on(&right)
        .caption("Training loss", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_end, 0.0..max_loss * 1.05)
        .map_err(|e| plot_error(&e))?;
    curve
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("mean hinge loss")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| plot_error(&e))?;
    curve
        .draw_series(LineSeries::new(
            losses.iter().enumerate().map(|(e, &l)| (e as f64, l)),
            RGBColor(200, 40, 30).stroke_width(2),
        ))
        .map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}
