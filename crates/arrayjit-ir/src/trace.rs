//! The timeline recorder: what arrayjit did and when, per stream, in the Chrome trace event
//! format (opens in Perfetto, `ui.perfetto.dev`, and `chrome://tracing`).
//!
//! Recording is off until [`start`] (or `ARRAYJIT_TRACE=path`, read by the runtime); while it
//! is off, every hook costs one relaxed atomic load ([`enabled`]). While on:
//!
//! - each stream is a track (a `tid` named after the stream) holding its tasks as slices:
//!   kernel runs named after their routine, copies with their bytes, waits on other streams;
//! - a wait on another stream's work is an arrow (a flow) from the end of the producer's task
//!   to the waiting slice;
//! - each thread that compiles has a compile track with the phases of every compilation
//!   (optimize, render, compile or cache hit, load) named after the routines.
//!
//! Memory is bounded: at most [`TraceConfig::max_events`] events are kept (the first ones);
//! later ones are counted, and the trace says how many were dropped. [`stop`] ends recording
//! and returns the [`Trace`], which [`Trace::to_chrome_json`] and [`Trace::write`] turn into a
//! file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Error, Result};

static ENABLED: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<Option<Recorder>> = Mutex::new(None);
static NEXT_FLOW: AtomicU64 = AtomicU64::new(1);

/// Whether a trace is being recorded: the one check every hook makes first.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// How a recording behaves.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// Events kept at most; later ones are dropped and counted (default 1,000,000, about
    /// 100 MB).
    pub max_events: usize,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            max_events: 1_000_000,
        }
    }
}

/// Where an event is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    /// A stream, by its unique id (see [`name_track`]).
    Stream(u64),
    /// Compilations on one thread, by a number of the thread's own.
    Compile(u64),
}

impl Track {
    /// The compile track of the calling thread.
    pub fn compile_here() -> Track {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        Track::Compile(ID.with(|id| *id))
    }

    /// The Chrome `tid`: streams from 1000 on, compile tracks below.
    fn tid(self) -> u64 {
        match self {
            Track::Stream(id) => 1000 + id,
            Track::Compile(n) => n,
        }
    }
}

/// A value attached to an event (shown in the details pane).
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// A number (bytes, counts).
    Int(u64),
    /// A text.
    Text(String),
}

#[derive(Clone, Debug)]
enum Kind {
    /// A slice from `ts` lasting `dur` (µs).
    Slice { dur: f64 },
    /// The start (`true`) or end of flow `id`.
    Flow { id: u64, start: bool },
}

/// One recorded event.
#[derive(Clone, Debug)]
pub struct Event {
    track: Track,
    name: String,
    category: &'static str,
    /// Microseconds since the recording started.
    ts: f64,
    kind: Kind,
    args: Vec<(&'static str, Arg)>,
}

impl Event {
    /// Its track.
    pub fn track(&self) -> Track {
        self.track
    }
    /// Its name (a routine's, a copy's, a phase's).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its category: `kernel`, `copy`, `merge`, `wait`, `task`, `compile`, `flow`.
    pub fn category(&self) -> &'static str {
        self.category
    }
    /// When it starts, in microseconds since the recording started.
    pub fn start_us(&self) -> f64 {
        self.ts
    }
    /// How long it lasts in microseconds (0 for a flow's ends).
    pub fn duration_us(&self) -> f64 {
        match self.kind {
            Kind::Slice { dur } => dur,
            Kind::Flow { .. } => 0.0,
        }
    }
    /// For a flow's end: its id and whether it is the start.
    pub fn flow(&self) -> Option<(u64, bool)> {
        match self.kind {
            Kind::Flow { id, start } => Some((id, start)),
            Kind::Slice { .. } => None,
        }
    }
    /// Its attached values.
    pub fn args(&self) -> &[(&'static str, Arg)] {
        &self.args
    }
}

struct Recorder {
    origin: Instant,
    max_events: usize,
    events: Vec<Event>,
    dropped: u64,
    names: BTreeMap<Track, String>,
}

fn state() -> MutexGuard<'static, Option<Recorder>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts recording (a recording already under way is discarded).
pub fn start(config: TraceConfig) {
    *state() = Some(Recorder {
        origin: Instant::now(),
        max_events: config.max_events,
        events: Vec::new(),
        dropped: 0,
        names: BTreeMap::new(),
    });
    ENABLED.store(true, Ordering::Release);
}

/// Ends recording and returns what was recorded (`None` when nothing was).
pub fn stop() -> Option<Trace> {
    ENABLED.store(false, Ordering::Release);
    state().take().map(|r| Trace {
        events: r.events,
        dropped: r.dropped,
        names: r.names,
    })
}

/// Names a track (a stream's name, shown as its title). Recorded even before the first event.
pub fn name_track(track: Track, name: &str) {
    if !enabled() {
        return;
    }
    if let Some(r) = state().as_mut() {
        r.names.entry(track).or_insert_with(|| name.to_string());
    }
}

fn push(r: &mut Recorder, event: Event) {
    if r.events.len() < r.max_events {
        r.events.push(event);
    } else {
        r.dropped += 1;
    }
}

fn micros(r: &Recorder, t: Instant) -> f64 {
    t.saturating_duration_since(r.origin).as_nanos() as f64 / 1e3
}

/// Records a slice on `track` from `start` to `end`.
pub fn slice(
    track: Track,
    name: &str,
    category: &'static str,
    start: Instant,
    end: Instant,
    args: Vec<(&'static str, Arg)>,
) {
    if !enabled() {
        return;
    }
    if let Some(r) = state().as_mut() {
        let ts = micros(r, start);
        let dur = (micros(r, end) - ts).max(0.0);
        let event = Event {
            track,
            name: name.to_string(),
            category,
            ts,
            kind: Kind::Slice { dur },
            args,
        };
        push(r, event);
    }
}

/// Records an arrow from the slice of `from` that ends at `from_end` to the slice of `to`
/// enclosing `to_at` (a wait on another stream's work, when it was released).
pub fn flow(from: Track, from_end: Instant, to: Track, to_at: Instant) {
    if !enabled() {
        return;
    }
    let id = NEXT_FLOW.fetch_add(1, Ordering::Relaxed);
    if let Some(r) = state().as_mut() {
        // The start binds to the slice enclosing its time: just before the producer's end.
        let from_ts = (micros(r, from_end) - 0.001).max(0.0);
        let to_ts = micros(r, to_at);
        for (track, ts, start) in [(from, from_ts, true), (to, to_ts, false)] {
            push(
                r,
                Event {
                    track,
                    name: "waits for".into(),
                    category: "flow",
                    ts,
                    kind: Kind::Flow { id, start },
                    args: vec![],
                },
            );
        }
    }
}

/// A slice being timed: recorded on drop (when recording is on). `None` from [`span`] when
/// recording is off, so a disabled span costs one atomic load.
#[must_use = "a span is recorded when it is dropped"]
pub struct Span {
    track: Track,
    name: String,
    category: &'static str,
    start: Instant,
    args: Vec<(&'static str, Arg)>,
}

impl Span {
    /// Attaches a value.
    pub fn arg(&mut self, key: &'static str, value: Arg) {
        self.args.push((key, value));
    }
    /// Renames the slice (e.g. a compile that turned out to be a cache hit).
    pub fn rename(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        slice(
            self.track,
            &self.name,
            self.category,
            self.start,
            Instant::now(),
            std::mem::take(&mut self.args),
        );
    }
}

/// A slice from now until the returned span drops; `None` when recording is off.
pub fn span(track: Track, category: &'static str, name: impl FnOnce() -> String) -> Option<Span> {
    enabled().then(|| Span {
        track,
        name: name(),
        category,
        start: Instant::now(),
        args: vec![],
    })
}

/// A compile phase of `routine` on the calling thread's compile track (see [`span`]).
pub fn compile_phase(phase: &'static str, routine: &str) -> Option<Span> {
    span(Track::compile_here(), "compile", || {
        format!("{phase} {routine}")
    })
}

/// What a recording holds.
#[derive(Clone, Debug)]
pub struct Trace {
    events: Vec<Event>,
    dropped: u64,
    names: BTreeMap<Track, String>,
}

impl Trace {
    /// The events, in the order they were recorded.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Events dropped because the recording was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The name of a track, if it was named.
    pub fn track_name(&self, track: Track) -> Option<&str> {
        self.names.get(&track).map(String::as_str)
    }

    /// The trace in the Chrome trace event format (JSON object form): slices are complete
    /// (`X`) events, flows are `s`/`f` pairs, tracks are threads of process 1 named by
    /// metadata events, compile tracks first.
    pub fn to_chrome_json(&self) -> String {
        let mut out = String::from("{\"traceEvents\":[\n");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        sep(&mut out);
        out.push_str(
            "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"arrayjit\"}}",
        );
        let mut tracks: Vec<Track> = self.events.iter().map(|e| e.track).collect();
        tracks.extend(self.names.keys().copied());
        tracks.sort();
        tracks.dedup();
        for t in tracks {
            let name = match (t, self.names.get(&t)) {
                (_, Some(n)) => n.clone(),
                (Track::Stream(id), None) => format!("stream {id}"),
                (Track::Compile(n), None) => format!("compile (thread {n})"),
            };
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
                t.tid(),
                json_string(&name)
            );
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_sort_index\",\"args\":{{\"sort_index\":{}}}}}",
                t.tid(),
                t.tid()
            );
        }
        for e in &self.events {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"pid\":1,\"tid\":{},\"name\":{},\"cat\":\"{}\",\"ts\":{:.3}",
                e.track.tid(),
                json_string(&e.name),
                e.category,
                e.ts
            );
            match e.kind {
                Kind::Slice { dur } => {
                    let _ = write!(out, ",\"ph\":\"X\",\"dur\":{dur:.3}");
                }
                Kind::Flow { id, start: true } => {
                    let _ = write!(out, ",\"ph\":\"s\",\"id\":{id}");
                }
                Kind::Flow { id, start: false } => {
                    let _ = write!(out, ",\"ph\":\"f\",\"bp\":\"e\",\"id\":{id}");
                }
            }
            if !e.args.is_empty() {
                out.push_str(",\"args\":{");
                for (i, (k, v)) in e.args.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}:", json_string(k));
                    match v {
                        Arg::Int(n) => {
                            let _ = write!(out, "{n}");
                        }
                        Arg::Text(s) => out.push_str(&json_string(s)),
                    }
                }
                out.push('}');
            }
            out.push('}');
        }
        out.push_str("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"arrayjit\"");
        let _ = writeln!(out, ",\"dropped_events\":{}}}}}", self.dropped);
        out
    }

    /// Writes [`Trace::to_chrome_json`] to `path`; an error names the path.
    pub fn write(&self, path: &std::path::Path) -> Result<()> {
        std::fs::write(path, self.to_chrome_json()).map_err(|e| Error::Io {
            context: format!("writing the trace {}", path.display()),
            source: e,
        })
    }
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests share the global recorder: one test does it all.
    #[test]
    fn records_slices_flows_and_bounds_memory() {
        assert!(span(Track::Stream(1), "kernel", || "off".into()).is_none());
        let t0 = Instant::now();
        start(TraceConfig { max_events: 5 });
        name_track(Track::Stream(1), "cc:0:0 \"main\"");
        {
            let mut s = span(Track::Stream(1), "kernel", || "routine relu".into()).unwrap();
            s.arg("bytes", Arg::Int(16));
        }
        let t1 = Instant::now();
        slice(Track::Stream(2), "wait", "wait", t1, Instant::now(), vec![]);
        flow(Track::Stream(1), t1, Track::Stream(2), t1);
        drop(compile_phase("render", "relu"));
        // Full: these are counted, not kept.
        drop(compile_phase("load", "relu"));
        drop(compile_phase("load", "relu"));
        let trace = stop().unwrap();
        assert!(!enabled());
        assert_eq!(trace.events().len(), 5);
        assert_eq!(trace.dropped(), 2);
        let e = &trace.events()[0];
        assert_eq!((e.name(), e.category()), ("routine relu", "kernel"));
        // Recording started after t0, and the slice before t1.
        assert!(e.start_us() >= 0.0 && e.start_us() <= t1.duration_since(t0).as_secs_f64() * 1e6);
        assert_eq!(e.args(), &[("bytes", Arg::Int(16))]);
        assert_eq!(trace.events()[2].flow().map(|f| f.1), Some(true));
        assert_eq!(trace.events()[3].flow().map(|f| f.1), Some(false));
        let json = trace.to_chrome_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        assert!(
            events
                .iter()
                .any(|e| e["args"]["name"] == "cc:0:0 \"main\"")
        );
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "X" && e["args"]["bytes"] == 16)
        );
        assert!(events.iter().any(|e| e["ph"] == "f" && e["bp"] == "e"));
        assert_eq!(v["otherData"]["dropped_events"], 2);
        assert!(stop().is_none());
    }
}
