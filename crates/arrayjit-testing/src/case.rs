//! One program of the corpus ([`Case`]) and the helpers every family of cases builds with.

use arrayjit_ir::{Assignments, MemoryMode, MemoryType, Prec, Result, StaticSymbol, Tnode};

/// One program of the corpus.
pub struct Case {
    /// A short name.
    pub name: String,
    /// The program.
    pub program: Assignments,
    /// Static symbols bound per run.
    pub bindings: Vec<StaticSymbol>,
    /// Static values for each run, in the order of `bindings`; one run with no values if empty.
    pub runs: Vec<Vec<i64>>,
    /// The hosted nodes compared after the runs.
    pub results: Vec<Tnode>,
}

/// A hosted result node, compared after the runs.
pub(crate) fn output(prec: Prec, dims: &[usize], label: &str) -> Result<Tnode> {
    let t = Tnode::new(prec, dims, &[label])?;
    t.update_memory_mode(
        MemoryMode::Hosted(MemoryType::Nonconstant),
        "conformance: compared result",
    )?;
    Ok(t)
}

/// A case with one run and no static indices.
pub(crate) fn case(name: &str, program: Assignments, results: Vec<Tnode>) -> Case {
    Case {
        name: name.into(),
        program,
        bindings: vec![],
        runs: vec![],
        results,
    }
}
