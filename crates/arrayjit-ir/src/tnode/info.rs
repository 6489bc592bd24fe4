//! What a node says of itself beyond its header: a code name chosen by the user (still
//! sanitized) and its debug information (with what the runtime says of its device copies).

use std::fmt::Write as _;

use super::{Tnode, lock, sanitize_identifier};

impl Tnode {
    /// Names the node `name` in generated code instead of its label: sanitized into a C
    /// identifier fragment (renderers add a position, [`Tnode::code_name`] the id, so it stays
    /// unique and can never inject anything). A name with nothing left after sanitizing goes
    /// back to the label. Code compiled before keeps the name it had.
    pub fn update_code_name(&self, name: &str) {
        let sanitized = sanitize_identifier(name);
        *lock(&self.0.chosen_code_name) = (!sanitized.is_empty()).then_some(sanitized);
    }

    /// The sanitized name chosen by [`Tnode::update_code_name`], if any.
    pub fn chosen_code_name(&self) -> Option<String> {
        lock(&self.0.chosen_code_name).clone()
    }

    /// Everything known of the node, one item per line: its header (precision, dims, memory
    /// mode and why), whether it has a host array, whether its precision is fixed, its code
    /// name, and what the runtime says of its device copies (which hold the latest values, a
    /// pending host refresh, where a linked array lives).
    pub fn debug_info(&self) -> String {
        let mut out = self.header();
        let host = if self.host().is_on_device() {
            "a host array handed to a device copy (made again at the host's next read)"
        } else if self.host().exists() {
            "a host array"
        } else {
            "no host array"
        };
        let _ = write!(
            out,
            "\n  {host}; precision {}; code name {}",
            if self.prec_is_fixed() {
                "fixed"
            } else {
                "not fixed yet"
            },
            self.code_name()
        );
        match self.device_copies() {
            Some(copies) => {
                for line in copies.describe() {
                    let _ = write!(out, "\n  {line}");
                }
            }
            None => out.push_str("\n  no device copies"),
        }
        out
    }

    /// Logs [`Tnode::debug_info`] through `tracing` at `level` (target `arrayjit::tnode`): the
    /// reference's `log_debug_info ~from_log_level`. It is built only when a subscriber takes
    /// that level.
    pub fn log_debug_info(&self, level: tracing::Level) {
        log_at(level, || self.debug_info());
    }
}

/// Emits `text()` at `level` (target `arrayjit::tnode`), building it only if enabled.
pub(super) fn log_at(level: tracing::Level, text: impl FnOnce() -> String) {
    use tracing::Level;
    macro_rules! at {
        ($lvl:expr) => {
            if tracing::enabled!(target: "arrayjit::tnode", $lvl) {
                tracing::event!(target: "arrayjit::tnode", $lvl, "{}", text());
            }
        };
    }
    match level {
        Level::ERROR => at!(Level::ERROR),
        Level::WARN => at!(Level::WARN),
        Level::INFO => at!(Level::INFO),
        Level::DEBUG => at!(Level::DEBUG),
        _ => at!(Level::TRACE),
    }
}
