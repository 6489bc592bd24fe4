//! The observability switches from Python: the listing level (`set_debug_level`, as
//! `ARRAYJIT_DEBUG`), run timing (`set_run_timing`), and timelines in the Chrome trace format
//! (`start_trace` / `stop_trace`, as `ARRAYJIT_TRACE`).

use std::path::PathBuf;

use arrayjit_ir::trace::TraceConfig;
use pyo3::prelude::*;

use crate::errors::IntoPy;

/// Sets the listing level for the process: 0 nothing, 1 a line per compiled routine, 2 also a
/// line per run, 3 also the optimized loop IR, the generated source and every node's memory
/// mode with its reason; `None`: back to `ARRAYJIT_DEBUG`.
#[pyfunction]
#[pyo3(signature = (level))]
pub fn set_debug_level(level: Option<u8>) {
    arrayjit_runtime::set_debug_level(level);
}

/// The listing level in effect.
#[pyfunction]
pub fn debug_level() -> PyResult<u8> {
    arrayjit_runtime::debug_level().py()
}

/// Times every run from now on (`Routine.stats()`), or stops timing.
#[pyfunction]
pub fn set_run_timing(on: bool) {
    arrayjit_runtime::set_run_timing(on);
}

/// Starts recording a timeline of compiles, kernels, copies and waits (a recording under way
/// is discarded); at most `max_events` events are kept.
#[pyfunction]
#[pyo3(signature = (max_events = 1_000_000))]
pub fn start_trace(max_events: usize) {
    arrayjit_runtime::start_trace(TraceConfig { max_events });
}

/// Stops recording; writes the timeline to `path` (Chrome trace JSON, for ui.perfetto.dev)
/// when given. Returns the number of events recorded (0 when nothing was recording).
#[pyfunction]
#[pyo3(signature = (path = None))]
pub fn stop_trace(py: Python<'_>, path: Option<PathBuf>) -> PyResult<usize> {
    let Some(trace) = arrayjit_runtime::stop_trace() else {
        return Ok(0);
    };
    if let Some(p) = path {
        py.detach(|| trace.write(&p)).py()?;
    }
    Ok(trace.events().len())
}

/// Adds the functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_debug_level, m)?)?;
    m.add_function(wrap_pyfunction!(debug_level, m)?)?;
    m.add_function(wrap_pyfunction!(set_run_timing, m)?)?;
    m.add_function(wrap_pyfunction!(start_trace, m)?)?;
    m.add_function(wrap_pyfunction!(stop_trace, m)?)?;
    Ok(())
}
