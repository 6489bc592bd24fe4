//! What a failed compiler run said ([`CompileFailure`], carried by
//! [`super::Error::CompileFailed`]), and its diagnostics parsed into [`Diagnostic`]s.

use thiserror::Error;

/// The details of [`Error::CompileFailed`](super::Error::CompileFailed).
#[derive(Debug, Error)]
#[error(
    "compiling {routine} with `{command}` failed (exit status {status}); source: {source_path}\n{stderr}"
)]
pub struct CompileFailure {
    /// The routine or batch being compiled.
    pub routine: String,
    /// The compiler command line.
    pub command: String,
    /// The exit status as text.
    pub status: String,
    /// Where the generated source was written.
    pub source_path: String,
    /// The compiler's standard error.
    pub stderr: String,
}

/// One diagnostic of a compiler's output ([`CompileFailure::diagnostics`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file (or `<command-line>`, `cc1`) the compiler names.
    pub file: String,
    /// The line, when the compiler gives one.
    pub line: Option<u32>,
    /// The column, when the compiler gives one.
    pub column: Option<u32>,
    /// `error`, `fatal error`, `warning` or `note`.
    pub severity: String,
    /// The message.
    pub message: String,
}

impl CompileFailure {
    /// The compiler's diagnostics, parsed from its standard error in the form gcc and clang
    /// print (`file:line:column: severity: message`, with the line and column optional); lines
    /// of another form (source excerpts, carets, "In function" headers) are left out.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        self.stderr.lines().filter_map(parse_diagnostic).collect()
    }
}

/// A `file[:line[:column]]: severity: message` line.
fn parse_diagnostic(line: &str) -> Option<Diagnostic> {
    const SEVERITIES: [&str; 4] = ["fatal error", "error", "warning", "note"];
    let (at, severity, message) = SEVERITIES.iter().find_map(|sev| {
        let marker = format!(": {sev}: ");
        line.find(&marker)
            .map(|i| (&line[..i], *sev, &line[i + marker.len()..]))
    })?;
    let mut parts = at.rsplitn(3, ':');
    let last = parts.next()?;
    let (file, line_no, column) = match (last.parse::<u32>(), parts.next(), parts.next()) {
        (Ok(col), Some(l), Some(file)) if l.parse::<u32>().is_ok() => {
            (file, l.parse().ok(), Some(col))
        }
        (Ok(l), Some(file), None) => (file, Some(l), None),
        (Ok(l), Some(mid), Some(head)) => {
            // `file:with:colons:line` — only the last number is the line.
            return Some(Diagnostic {
                file: format!("{head}:{mid}"),
                line: Some(l),
                column: None,
                severity: severity.into(),
                message: message.into(),
            });
        }
        _ => (at, None, None),
    };
    Some(Diagnostic {
        file: file.into(),
        line: line_no,
        column,
        severity: severity.into(),
        message: message.into(),
    })
}
