//! The main demo: train an MLP on half-moons, report held-out accuracy, and draw the decision
//! boundary, the points and the loss curve into a PNG.

use std::path::Path;
use std::time::{Duration, Instant};

use arrayjit_ir::{Error, Result};
use arrayjit_tensor::Optimizer;
use arrayjit_tensor::datasets::{Dataset, moons};
use plotters::prelude::*;

use crate::train::{Classifier, EpochStats, LossKind, Mlp, TrainConfig};

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

/// Trains on moons; `on_epoch` sees every epoch's statistics (e.g. to drive a progress bar).
pub fn run(config: &MoonsConfig, mut on_epoch: impl FnMut(&EpochStats)) -> Result<MoonsReport> {
    let backend = match &config.backend {
        Some(name) => arrayjit_runtime::backend(name)?,
        None => arrayjit_runtime::default_backend()?,
    };
    backend.check_available()?;
    if config.samples < 20 {
        return Err(Error::invalid(format!(
            "{} samples are too few; use at least 20",
            config.samples
        )));
    }
    let data = moons(config.samples, 0.1, config.seed)?;
    let (train, test) = data.split(0.8, config.seed)?;
    let started = Instant::now();
    let model = Mlp::new(&[2, 16, 16, 1], config.seed)?;
    let settings = TrainConfig {
        epochs: config.epochs,
        batch_size: 20,
        optimizer: Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        loss: LossKind::Hinge,
        shards: config.shards.max(1),
    };
    let classifier = Classifier::new(&backend, model, &train, &settings)?;
    let build_time = started.elapsed();
    let started = Instant::now();
    let mut losses = Vec::new();
    for epoch in 0..config.epochs {
        let stats = classifier.epoch(epoch)?;
        losses.push(stats.loss);
        on_epoch(&stats);
    }
    let train_time = started.elapsed();
    let report = MoonsReport {
        backend: backend.name().to_string(),
        train_accuracy: classifier.accuracy(&train)?,
        test_accuracy: classifier.accuracy(&test)?,
        losses,
        build_time,
        train_time,
    };
    if let Some(path) = &config.output {
        draw(path, &classifier, &data, &report.losses)?;
    }
    Ok(report)
}

fn plot_error(e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("drawing the picture failed: {e}"))
}

/// The decision boundary with the points (left) and the loss curve (right).
pub fn draw(path: &Path, classifier: &Classifier, data: &Dataset, losses: &[f64]) -> Result<()> {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for i in 0..data.len() {
        let p = data.row(i);
        x0 = x0.min(p[0]);
        x1 = x1.max(p[0]);
        y0 = y0.min(p[1]);
        y1 = y1.max(p[1]);
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
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(600);
    let mut chart = ChartBuilder::on(&left)
        .margin(10)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(plot_error)?;
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
        .map_err(plot_error)?;
    let colors = [RGBColor(30, 70, 200), RGBColor(200, 40, 30)];
    chart
        .draw_series((0..data.len()).map(|i| {
            let p = data.row(i);
            Circle::new((p[0], p[1]), 3, colors[data.labels[i].min(1)].filled())
        }))
        .map_err(plot_error)?;
    let max_loss = losses.iter().cloned().fold(0.0f64, f64::max).max(1e-9);
    let mut curve = ChartBuilder::on(&right)
        .margin(30)
        .build_cartesian_2d(0.0..(losses.len().max(2) - 1) as f64, 0.0..max_loss * 1.05)
        .map_err(plot_error)?;
    let x_end = (losses.len().max(2) - 1) as f64;
    // Axes (the picture carries no text: no font is needed to draw it).
    curve
        .draw_series([
            PathElement::new(vec![(0.0, 0.0), (x_end, 0.0)], BLACK.stroke_width(1)),
            PathElement::new(
                vec![(0.0, 0.0), (0.0, max_loss * 1.05)],
                BLACK.stroke_width(1),
            ),
        ])
        .map_err(plot_error)?;
    curve
        .draw_series(LineSeries::new(
            losses.iter().enumerate().map(|(e, &l)| (e as f64, l)),
            RGBColor(200, 40, 30).stroke_width(2),
        ))
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}
