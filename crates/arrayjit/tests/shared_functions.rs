//! Statement functions shared between the C libraries of a process: a routine compiled after
//! another that contains an equal statement calls the first one's compiled function instead of
//! compiling it again, keeps that library loaded while it lives, and computes exactly what it
//! would have computed on its own. (Its own test binary: the process's counters are read.)

use std::path::Path;
use std::sync::Arc;

use arrayjit::backends::cc::{self, CcConfig};
use arrayjit::codegen::BIND_SYMBOL;
use arrayjit::gpt::{CharVocab, GptTrainer, TrainerConfig, batch};
use arrayjit::prelude::*;
use arrayjit::tensor::nn::{Gelu, GptConfig};

/// The two C backends (one worker, two workers) with their compile cache in `dir`: what is
/// cached decides whether a routine imports (a library in the cache is loaded rather than one
/// that imports compiled), so each test starts from an empty cache.
fn c_backends(dir: &Path) -> Vec<Backend> {
    [("sync_cc", 1), ("multicore_cc", 2)]
        .into_iter()
        .map(|(name, workers)| {
            let mut config = CcConfig::from_env().unwrap();
            config.cache_dir = Some(dir.join(name));
            config.build_files_dir = None;
            config.workers_per_device = Some(workers);
            Backend::from_lowered(name, Arc::new(cc::backend(config).unwrap()))
        })
        .collect()
}

/// `out = exp(input)` over 1000 elements, `input` holding `0.001 * i`.
fn exp_of_ramp(name: &str) -> (Tnode, Tnode, Assignments) {
    let input = Tnode::new(Prec::F32, &[1000], &[&format!("{name}_in")]).unwrap();
    let ramp: Vec<f64> = (0..1000).map(|i| 0.001 * f64::from(i)).collect();
    input.host().set_values(&ramp).unwrap();
    let out = Tnode::new(Prec::F32, &[1000], &[&format!("{name}_out")]).unwrap();
    out.update_memory_mode(MemoryMode::Hosted(MemoryType::Nonconstant), "test")
        .unwrap();
    let code = Assignments::pointwise_unop(&out, UnOp::Exp, &input);
    (input, out, code)
}

#[test]
fn a_later_routine_calls_an_earlier_ones_function_and_keeps_its_library_loaded() {
    let dir = tempfile::tempdir().unwrap();
    for backend in c_backends(dir.path()) {
        let name = backend.name().to_string();
        let stream = backend.get_device(0).unwrap().new_stream().unwrap();
        let alone_source = {
            let (_x, _y, code) = exp_of_ramp("third");
            backend
                .compile(CompileRequest::routine("third", &code))
                .unwrap()
                .source()
                .to_string()
        };
        assert!(!alone_source.contains(BIND_SYMBOL), "{name}");
        let (_x, y, first_code) = exp_of_ramp("first");
        let first = backend
            .compile(CompileRequest::routine("first", &first_code))
            .unwrap();
        let first_run = Context::new(&stream).link(&first).unwrap();
        first_run.run().unwrap();
        let want = y.host().get_values().unwrap();
        assert!(
            (want[1] - 0.001f64.exp()).abs() < 1e-6,
            "{name}: {}",
            want[1]
        );

        // The same statement over other arrays: imported, not compiled again.
        let (_x2, z, second_code) = exp_of_ramp("second");
        let before = cc::compile_stats();
        let second = backend
            .compile(CompileRequest::routine("second", &second_code))
            .unwrap();
        let after = cc::compile_stats();
        assert!(
            after.imported_functions > before.imported_functions,
            "{name}: nothing imported ({before:?} -> {after:?})"
        );
        assert!(second.source().contains(BIND_SYMBOL), "{name}");
        assert!(!first.source().contains(BIND_SYMBOL), "{name}");

        // A routine whose library with every function its own is in the compile cache (built
        // while nothing offered its function) loads that rather than compiling one that
        // imports.
        let (_x3, _w, third_again_code) = exp_of_ramp("third");
        let third_again = backend
            .compile(CompileRequest::routine("third", &third_again_code))
            .unwrap();
        assert_eq!(third_again.source(), alone_source, "{name}");

        // The first routine dropped: its library stays loaded for the second, which computes
        // exactly the same values with the same function.
        drop(first_run);
        drop(first);
        let second_run = Context::new(&stream).link(&second).unwrap();
        second_run.run().unwrap();
        assert_eq!(z.host().get_values().unwrap(), want, "{name}");
    }
}

/// A trainer's held-out loss (compiled on first use) calls the training step's forward-pass
/// functions, and its loss of a batch is what the step then reports for that batch.
#[test]
fn a_trainers_evaluation_imports_the_steps_forward_pass_and_agrees_with_it() {
    const TEXT: &str = "to be or not to be, that is the question; whether tis nobler";
    let vocab = CharVocab::from_text(TEXT);
    let data = vocab.encode(TEXT).unwrap();
    let mut c = TrainerConfig::small(vocab.len());
    c.model = GptConfig {
        vocabulary: vocab.len(),
        context: 8,
        width: 16,
        heads: 2,
        layers: 2,
        hidden: 32,
        gelu: Gelu::Tanh,
        precision: arrayjit::tensor::Precision::F32,
        attention: arrayjit::tensor::nn::AttentionKind::Unfused,
    };
    c.batch = 4;
    let dir = tempfile::tempdir().unwrap();
    for backend in c_backends(dir.path()) {
        let name = backend.name().to_string();
        let mut t = GptTrainer::new(&backend, &c).unwrap();
        let (ids, targets) = batch(&data, c.batch, c.model.context, 0, 5).unwrap();
        let before = cc::compile_stats();
        let held_out = t.eval_loss(&ids, &targets).unwrap();
        let after = cc::compile_stats();
        assert!(
            after.imported_functions > before.imported_functions,
            "{name}: the evaluation compiled the step's functions again"
        );
        let trained = t.train_step(&ids, &targets).unwrap();
        assert!(
            (trained - held_out).abs() <= 1e-5 * held_out,
            "{name}: {trained} vs {held_out}"
        );
    }
}
