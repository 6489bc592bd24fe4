//! Draws a trace written by `--trace` / `ARRAYJIT_TRACE` (Chrome trace format) as a PNG
//! timeline: one lane per track (streams, compile threads), slices coloured by category
//! (kernels, copies, merge-buffer transfers, waits, compile phases), and the waits' arrows from
//! their producers. A picture for where Perfetto is not at hand (reports, docs).
//!
//! Run: `cargo run --example trace_timeline -- trace.json timeline.png [FROM_MS TO_MS]`
//! (the optional window zooms in on part of the run).

use std::collections::BTreeMap;

use plotters::prelude::*;
use serde_json::Value;

/// One slice to draw.
struct Slice {
    lane: usize,
    start: f64,
    end: f64,
    category: String,
}

fn color(category: &str) -> RGBColor {
    match category {
        "kernel" => RGBColor(46, 110, 200),
        "copy" => RGBColor(40, 160, 90),
        "merge" => RGBColor(150, 90, 200),
        "wait" => RGBColor(200, 200, 200),
        "compile" => RGBColor(230, 150, 40),
        _ => RGBColor(120, 120, 120),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(input), Some(output)) = (args.get(1), args.get(2)) else {
        return Err("usage: trace_timeline TRACE.json OUT.png [FROM_MS TO_MS]".into());
    };
    let window: Option<(f64, f64)> = match (args.get(3), args.get(4)) {
        (Some(a), Some(b)) => Some((a.parse::<f64>()? * 1e3, b.parse::<f64>()? * 1e3)),
        _ => None,
    };
    // Text is drawn with the font bundled with the demo (no system fonts).
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        include_bytes!("../../arrayjit-cli/assets/DejaVuSans.ttf"),
    )
    .map_err(|_| "the bundled font does not load")?;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(input)?)?;
    let events = json["traceEvents"]
        .as_array()
        .ok_or("the file has no traceEvents")?;
    // Lanes by tid, named by thread_name metadata, in sort order.
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    for e in events {
        if e["ph"] == "M" && e["name"] == "thread_name" {
            let tid = e["tid"].as_u64().unwrap_or(0);
            names.insert(tid, e["args"]["name"].as_str().unwrap_or("?").to_string());
        }
    }
    let lanes: Vec<u64> = names.keys().copied().collect();
    let lane_of = |tid: u64| lanes.iter().position(|&t| t == tid);
    let inside = |t: f64| window.is_none_or(|(a, b)| t >= a && t <= b);
    let mut slices = Vec::new();
    let mut flows: BTreeMap<u64, Vec<(usize, f64)>> = BTreeMap::new();
    for e in events {
        let (Some(tid), Some(ts)) = (e["tid"].as_u64(), e["ts"].as_f64()) else {
            continue;
        };
        let Some(lane) = lane_of(tid) else { continue };
        match e["ph"].as_str() {
            Some("X") => {
                let end = ts + e["dur"].as_f64().unwrap_or(0.0);
                if inside(ts) || inside(end) {
                    slices.push(Slice {
                        lane,
                        start: ts,
                        end,
                        category: e["cat"].as_str().unwrap_or("").to_string(),
                    });
                }
            }
            Some("s") | Some("f") if inside(ts) => {
                let id = e["id"].as_u64().unwrap_or(0);
                flows.entry(id).or_default().push((lane, ts));
            }
            _ => {}
        }
    }
    let (t0, t1) = window.unwrap_or_else(|| {
        let lo = slices.iter().map(|s| s.start).fold(f64::MAX, f64::min);
        let hi = slices.iter().map(|s| s.end).fold(f64::MIN, f64::max);
        (lo.min(hi), hi.max(lo + 1.0))
    });
    let height = 190 + 90 * lanes.len() as u32;
    let root = BitMapBackend::new(output, (1600, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let lane_names: Vec<String> = lanes.iter().map(|t| names[t].clone()).collect();
    let (plot, legend) = root.split_vertically(height - 36);
    let mut chart = ChartBuilder::on(&plot)
        .caption(format!("arrayjit timeline: {input}"), ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(260)
        .build_cartesian_2d(t0 / 1e3..t1 / 1e3, 0.0..lanes.len() as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("milliseconds since the recording started")
        .y_labels(lanes.len() * 2 + 1)
        .y_label_formatter(&|y| {
            let k = (*y - 0.5).round();
            if (*y - 0.5 - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < lane_names.len() {
                lane_names[lane_names.len() - 1 - k as usize].clone()
            } else {
                String::new()
            }
        })
        .label_style(("sans-serif", 14))
        .draw()?;
    let n = lanes.len() as f64;
    let y_of = |lane: usize| n - 1.0 - lane as f64;
    chart.draw_series(slices.iter().map(|s| {
        let y = y_of(s.lane);
        let end = s.end.max(s.start + (t1 - t0) * 1e-4);
        Rectangle::new(
            [(s.start / 1e3, y + 0.15), (end / 1e3, y + 0.85)],
            color(&s.category).filled(),
        )
    }))?;
    chart.draw_series(flows.values().filter(|f| f.len() == 2).map(|f| {
        let (a, b) = (f[0], f[1]);
        PathElement::new(
            vec![(a.1 / 1e3, y_of(a.0) + 0.5), (b.1 / 1e3, y_of(b.0) + 0.5)],
            RGBColor(200, 40, 30).stroke_width(1),
        )
    }))?;
    // Legend.
    for (i, cat) in ["kernel", "copy", "merge", "wait", "compile"]
        .iter()
        .enumerate()
    {
        let x = 280 + 150 * i as i32;
        legend.draw(&Rectangle::new([(x, 8), (x + 18, 20)], color(cat).filled()))?;
        legend.draw(&Text::new(*cat, (x + 24, 7), ("sans-serif", 14)))?;
    }
    legend.draw(&Text::new(
        "red lines: waits, from the end of the producer's task to the waiting stream",
        (280 + 150 * 5, 7),
        ("sans-serif", 14),
    ))?;
    root.present()?;
    println!(
        "{output}: {} lanes, {} slices, {} arrows",
        lanes.len(),
        slices.len(),
        flows.len()
    );
    Ok(())
}
