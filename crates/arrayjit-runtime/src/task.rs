//! What a stream runs: a task, and the label that names it in errors and traces.

use std::fmt;
use std::sync::Arc;

use arrayjit_ir::Result;

/// A unit of work on a stream.
pub type Task = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

/// What a task is, for error messages: a fixed text or a shared name (a routine's).
#[derive(Clone, Debug)]
pub(crate) enum TaskLabel {
    Fixed(&'static str),
    Named(&'static str, Arc<str>),
    /// A copy: what it is (`copy from host`, `copy into the merge buffer`...) and its bytes.
    Copy(&'static str, usize),
}

impl fmt::Display for TaskLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskLabel::Fixed(s) => f.write_str(s),
            TaskLabel::Named(what, name) => write!(f, "{what} {name}"),
            TaskLabel::Copy(what, bytes) => write!(f, "{what} ({bytes} bytes)"),
        }
    }
}

impl TaskLabel {
    /// The trace category: `kernel` for routine runs, `collective` for work across processes,
    /// `copy`, `merge` for merge-buffer copies,
    /// `wait` for waits on other streams, else `task`.
    pub(crate) fn category(&self) -> &'static str {
        match self {
            TaskLabel::Named("routine", _) => "kernel",
            TaskLabel::Named("collective", _) => "collective",
            TaskLabel::Copy(what, _) if what.contains("merge") => "merge",
            TaskLabel::Copy(..) => "copy",
            TaskLabel::Fixed(what) if what.starts_with("wait") => "wait",
            _ => "task",
        }
    }

    /// The slice's name in a trace: a routine's name, else the label.
    pub(crate) fn trace_name(&self) -> String {
        match self {
            TaskLabel::Named("routine" | "collective", name) => name.to_string(),
            TaskLabel::Copy(what, _) => what.to_string(),
            other => other.to_string(),
        }
    }
}
