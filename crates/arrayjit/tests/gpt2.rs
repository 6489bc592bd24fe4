//! GPT-2 checkpoints against Hugging Face `transformers` (fixtures made by
//! `tests/fixtures/make_gpt2_fixture.py`, no network needed): a tiny random GPT-2's logits and
//! greedy continuations on every backend, with and without the key/value cache; loading
//! errors; saving back; and GPT-2's tokenizer against the `tokenizers` package.

use std::path::{Path, PathBuf};

use arrayjit::Error;
use arrayjit::gpt2::{Gpt2, Gpt2Tokenizer, Sampling};
use arrayjit::tensor::checkpoint::SafetensorsFile;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny")
}

fn gpt2_files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gpt2")
}

/// The fixture's sequences and the logits `transformers` computed for them.
fn expected_logits() -> Vec<(Vec<usize>, Vec<f64>)> {
    let mut file = SafetensorsFile::open(&fixture().join("expected_logits.safetensors")).unwrap();
    let mut out = Vec::new();
    for k in 0.. {
        if file.get(&format!("ids_{k}")).is_none() {
            break;
        }
        let ids = file.read(&format!("ids_{k}")).unwrap();
        let logits = file.read(&format!("logits_{k}")).unwrap();
        out.push((ids.into_iter().map(|i| i as usize).collect(), logits));
    }
    assert!(out.len() >= 4);
    out
}

fn expected_greedy() -> Vec<(Vec<usize>, Vec<usize>)> {
    let text = std::fs::read_to_string(fixture().join("expected_greedy.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let ids = |k: &str| -> Vec<usize> {
                case[k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as usize)
                    .collect()
            };
            (ids("prompt"), ids("tokens"))
        })
        .collect()
}

/// The largest difference between `got` and `want`, relative to `want`'s largest magnitude.
fn relative_difference(got: &[Vec<f32>], want: &[f64]) -> f64 {
    let flat: Vec<f64> = got.iter().flatten().map(|&v| f64::from(v)).collect();
    assert_eq!(flat.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    flat.iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

/// Logits and greedy continuations on one backend: the prefill in chunks of `chunk`.
fn agrees_with_transformers(backend: &arrayjit::runtime::Backend, chunk: usize) {
    let mut model = Gpt2::from_pretrained(&fixture(), backend).unwrap();
    model.set_prefill_chunk(chunk).unwrap();
    for (ids, want) in expected_logits() {
        let got = model.logits(&ids).unwrap();
        let diff = relative_difference(&got, &want);
        assert!(
            diff < 1e-4,
            "{} chunk {chunk}: logits of {} ids differ by {diff:e}",
            backend.name(),
            ids.len()
        );
    }
    let (_, routines) = model.routine_counts();
    for (prompt, want) in expected_greedy() {
        let got = model
            .generate(&prompt, want.len(), &Sampling::greedy(), &[])
            .unwrap();
        assert_eq!(
            got,
            want,
            "{} chunk {chunk}: greedy after {prompt:?}",
            backend.name()
        );
        // Without the cache: the whole sequence so far, prefilled, gives the same next token.
        let mut seq = prompt.clone();
        for &token in &want[..5] {
            let logits = model.logits(&seq).unwrap();
            let last = logits.last().unwrap();
            let best = arrayjit::gpt2::sample_token(last, &Sampling::greedy(), 0.0);
            assert_eq!(
                best,
                token,
                "{}: uncached greedy after {seq:?}",
                backend.name()
            );
            seq.push(token);
        }
    }
    // Nothing compiled after the first generation's routines.
    assert_eq!(model.routine_counts().1, routines);
}

#[test]
fn logits_and_greedy_continuations_agree_with_transformers_on_every_backend() {
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        agrees_with_transformers(&backend, 64);
        eprintln!("{}: agrees with transformers", backend.name());
    }
}

#[test]
fn prefill_chunks_of_any_size_give_the_same_results() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    // 7 does not divide the sequences' lengths; 128 is the whole context in one run.
    for chunk in [1, 7, 128] {
        agrees_with_transformers(&backend, chunk);
    }
}

/// Generators of every batch size share one context and stream: the second batch size adds
/// its caches, inputs and logits, neither the parameters again nor a scratch pool of its own
/// (in a context of its own it took both: exactly what a model of its own takes); and each
/// still gives its own greedy tokens.
#[test]
fn every_batch_size_shares_one_copy_of_the_parameters() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let model = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
    let device = backend.get_device(0).unwrap();
    let params: usize = model
        .params()
        .iter()
        .map(|t| t.node().size_in_bytes())
        .sum();
    let cases = expected_greedy();
    let before = device.used_memory();
    let alone = model
        .generate(&cases[0].0, 8, &Sampling::greedy(), &[])
        .unwrap();
    assert_eq!(alone[..], cases[0].1[..8]);
    let first = device.used_memory() - before;
    assert!(first >= params, "{first} bytes for {params} of parameters");
    let prompts: Vec<Vec<usize>> = cases.iter().take(3).map(|(p, _)| p.clone()).collect();
    let before = device.used_memory();
    let batched = model
        .generate_batch(&prompts, 8, &Sampling::greedy(), &[])
        .unwrap();
    let second = device.used_memory() - before;
    for ((_, want), got) in cases.iter().zip(&batched) {
        assert_eq!(got[..], want[..8]);
    }
    // The same batch size in a model of its own takes its parameters too.
    let own = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
    let before = device.used_memory();
    own.generate_batch(&prompts, 8, &Sampling::greedy(), &[])
        .unwrap();
    let alone = device.used_memory() - before;
    assert!(
        second + params < alone,
        "the second batch size took {second} bytes; alone, with {params} bytes of \
         parameters, {alone}"
    );
}

#[test]
fn a_batch_of_prompts_of_different_lengths_generates_what_each_would_alone() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let model = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
    let cases = expected_greedy();
    let prompts: Vec<Vec<usize>> = cases.iter().map(|(p, _)| p.clone()).collect();
    let count = 20;
    let got = model
        .generate_batch(&prompts, count, &Sampling::greedy(), &[])
        .unwrap();
    for ((_, want), got) in cases.iter().zip(&got) {
        assert_eq!(got[..], want[..count]);
    }
    // Sampling: the same seed gives the same tokens, batched or alone; another seed differs.
    let sampling = Sampling {
        temperature: 0.8,
        top_k: Some(40),
        top_p: Some(0.95),
        seed: 5,
    };
    let a = model.generate_batch(&prompts, 16, &sampling, &[]).unwrap();
    let b = model.generate_batch(&prompts, 16, &sampling, &[]).unwrap();
    assert_eq!(a, b);
    let other = Sampling {
        seed: 6,
        ..sampling
    };
    assert_ne!(a, model.generate_batch(&prompts, 16, &other, &[]).unwrap());
    // A stop token ends its row, and is the last token returned.
    let stop = cases[0].1[3];
    let stopped = model
        .generate(&cases[0].0, 20, &Sampling::greedy(), &[stop])
        .unwrap();
    let first = cases[0].1.iter().position(|&t| t == stop).unwrap();
    assert_eq!(stopped, cases[0].1[..=first]);
}

#[test]
fn bad_input_is_refused_before_any_work() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let model = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
    let greedy = Sampling::greedy();
    // Longer than the model's 128 positions, with the tokens to generate.
    let long = vec![1; 120];
    let e = model.generate(&long, 10, &greedy, &[]).unwrap_err();
    assert!(
        matches!(e, Error::BadValue { .. }) && e.to_string().contains("128"),
        "{e}"
    );
    let e = model.logits(&vec![1; 129]).unwrap_err();
    assert!(e.to_string().contains("128"), "{e}");
    // An id outside the vocabulary (512).
    let e = model.generate(&[1, 512], 3, &greedy, &[]).unwrap_err();
    assert!(
        matches!(e, Error::BadValue { .. }) && e.to_string().contains("512"),
        "{e}"
    );
    assert!(model.logits(&[]).is_err());
    let bad = Sampling {
        top_p: Some(0.0),
        ..greedy.clone()
    };
    assert!(model.generate(&[1], 3, &bad, &[]).is_err());
    // None of that compiled anything.
    assert_eq!(model.routine_counts(), (0, 0));
}

/// A copy of the fixture with `edit` applied to its files.
fn broken(edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), dir.path().join(f)).unwrap();
    }
    edit(dir.path());
    dir
}

#[test]
fn bad_checkpoints_are_typed_errors_that_name_what_is_wrong() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let load = |dir: &Path| {
        Gpt2::from_pretrained(dir, &backend)
            .err()
            .unwrap()
            .to_string()
    };
    // Missing files.
    let empty = tempfile::tempdir().unwrap();
    assert!(load(empty.path()).contains("config.json"));
    let d = broken(|p| std::fs::remove_file(p.join("model.safetensors")).unwrap());
    assert!(load(d.path()).contains("model.safetensors"));
    // Another architecture, an unsupported field.
    let edit_config = |f: &dyn Fn(&mut serde_json::Value)| {
        broken(|p| {
            let path = p.join("config.json");
            let mut j: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            f(&mut j);
            std::fs::write(&path, j.to_string()).unwrap();
        })
    };
    let d = edit_config(&|j| j["model_type"] = "llama".into());
    assert!(load(d.path()).contains("another architecture"));
    let d = edit_config(&|j| j["activation_function"] = "silu".into());
    assert!(load(d.path()).contains("activation_function"));
    // A config that does not match the tensors: the tensor, its found and expected shapes.
    let d = edit_config(&|j| j["n_embd"] = 32.into());
    let e = load(d.path());
    assert!(
        e.contains("wte.weight") && e.contains("[512, 64]") && e.contains("[512, 32]"),
        "{e}"
    );
    // A truncated file.
    let d = broken(|p| {
        let path = p.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(load(d.path()).contains("truncated"));
    // A missing tensor.
    let d = broken(|p| {
        let path = p.join("model.safetensors");
        let mut file = SafetensorsFile::open(&path).unwrap();
        let names: Vec<String> = file
            .names()
            .filter(|n| !n.ends_with("h.1.mlp.c_fc.bias"))
            .map(String::from)
            .collect();
        let data: Vec<(String, Vec<u8>, Vec<usize>)> = names
            .iter()
            .map(|n| {
                let shape = file.get(n).unwrap().shape.clone();
                let bytes = file
                    .read(n)
                    .unwrap()
                    .into_iter()
                    .flat_map(|v| (v as f32).to_le_bytes())
                    .collect();
                (n.clone(), bytes, shape)
            })
            .collect();
        let views: Vec<_> = data
            .iter()
            .map(|(n, b, s)| {
                let view =
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                        .unwrap();
                (n.clone(), view)
            })
            .collect();
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    });
    assert!(load(d.path()).contains("h.1.mlp.c_fc.bias"));
}

#[test]
fn saved_checkpoints_hold_the_same_tensors_and_load_again() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let model = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
    let out = tempfile::tempdir().unwrap();
    model.save_pretrained(out.path()).unwrap();
    // Every tensor the fixture holds, under GPT2LMHeadModel's names, with the same values.
    let mut original = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
    let mut saved = SafetensorsFile::open(&out.path().join("model.safetensors")).unwrap();
    let names: Vec<String> = original.names().map(String::from).collect();
    assert!(names.len() > 20);
    for name in &names {
        let stripped = name.trim_start_matches("transformer.");
        let ours = format!("transformer.{stripped}");
        assert_eq!(
            saved.get(&ours).unwrap().shape,
            original.get(name).unwrap().shape,
            "{name}"
        );
        assert_eq!(
            saved.read(&ours).unwrap(),
            original.read(name).unwrap(),
            "{name}"
        );
    }
    // It loads again and computes the same logits.
    let again = Gpt2::from_pretrained(out.path(), &backend).unwrap();
    let (ids, _) = &expected_logits()[1];
    assert_eq!(again.logits(ids).unwrap(), model.logits(ids).unwrap());
    assert_eq!(again.config(), model.config());
}

#[test]
fn f16_and_bf16_checkpoints_load_converted() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    for (dtype, size) in [(safetensors::Dtype::F16, 2), (safetensors::Dtype::BF16, 2)] {
        let d = broken(|p| {
            let path = p.join("model.safetensors");
            let mut file = SafetensorsFile::open(&path).unwrap();
            let names: Vec<String> = file.names().map(String::from).collect();
            let data: Vec<(String, Vec<u8>, Vec<usize>)> = names
                .iter()
                .map(|n| {
                    let shape = file.get(n).unwrap().shape.clone();
                    let values = file.read(n).unwrap();
                    let bytes: Vec<u8> = values
                        .iter()
                        .flat_map(|&v| match dtype {
                            safetensors::Dtype::F16 => half::f16::from_f64(v).to_le_bytes(),
                            _ => half::bf16::from_f64(v).to_le_bytes(),
                        })
                        .collect();
                    assert_eq!(bytes.len(), values.len() * size);
                    (n.clone(), bytes, shape)
                })
                .collect();
            let views: Vec<_> = data
                .iter()
                .map(|(n, b, s)| {
                    (
                        n.clone(),
                        safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
                    )
                })
                .collect();
            std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        });
        let model = Gpt2::from_pretrained(d.path(), &backend).unwrap();
        // The weights are the rounded ones, so the logits are close, not equal.
        let (ids, want) = &expected_logits()[1];
        let diff = relative_difference(&model.logits(ids).unwrap(), want);
        let bound = if dtype == safetensors::Dtype::F16 {
            5e-3
        } else {
            5e-2
        };
        assert!(diff < bound, "{dtype:?}: {diff:e}");
        let embedding = model.model().token_embedding.values().unwrap();
        let rounded = embedding.iter().all(|&v| match dtype {
            safetensors::Dtype::F16 => half::f16::from_f64(v).to_f64() == v,
            _ => half::bf16::from_f64(v).to_f64() == v,
        });
        assert!(rounded, "{dtype:?}: the embedding holds the stored values");
    }
}

#[test]
fn the_tokenizer_agrees_with_hugging_faces() {
    let files = gpt2_files();
    let tokenizer =
        Gpt2Tokenizer::from_files(&files.join("vocab.json"), &files.join("merges.txt")).unwrap();
    assert_eq!(tokenizer.vocabulary(), 50257);
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2_tokenizer_cases.json"),
    )
    .unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    for case in cases.as_array().unwrap() {
        let s = case["text"].as_str().unwrap();
        let want: Vec<usize> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(tokenizer.encode(s).unwrap(), want, "{s:?}");
        assert_eq!(tokenizer.decode(&want).unwrap(), s);
    }
    // A character split across two decodes: each half is U+FFFD, the whole is the character.
    let ids = tokenizer.encode("😀").unwrap();
    assert!(ids.len() > 1);
    assert!(tokenizer.decode(&ids[..1]).unwrap().contains('\u{fffd}'));
    assert_eq!(tokenizer.decode(&ids).unwrap(), "😀");
    // An id outside the vocabulary.
    let e = tokenizer.decode(&[50257]).unwrap_err();
    assert!(e.to_string().contains("50257"), "{e}");
    // A directory of GPT-2's files loads the same tokenizer.
    let same = Gpt2Tokenizer::from_pretrained(&files).unwrap();
    assert_eq!(
        same.encode("Hello, world!").unwrap(),
        vec![15496, 11, 995, 0]
    );
    assert!(Gpt2Tokenizer::from_pretrained(Path::new("/nonexistent")).is_err());
}

/// Small random GPT-2s (a prefill chunk as long as the context, rows narrower than a GPU
/// group) generate on every backend, with the same logits as on the first. On cuda_emu this
/// once failed to compile: the GPU's hoisting of reductions moved one out of the gather that
/// picks the prompt's last row, leaving the gather's symbol unbound. (Random weights give
/// near-ties between tokens, so the tokens themselves are only checked to be ids.)
#[test]
fn small_models_generate_alike_on_every_backend() {
    for (positions, width, heads, hidden) in [(8, 16, 2, 32), (16, 16, 2, 32), (8, 64, 4, 256)] {
        let mut config = arrayjit::gpt2::Gpt2Config::small();
        config.vocabulary = 30;
        config.positions = positions;
        config.width = width;
        config.heads = heads;
        config.layers = 1;
        config.hidden = hidden;
        let mut runs = Vec::new();
        for backend in arrayjit_testing::all_backends_under_test().unwrap() {
            let model = Gpt2::random(config.clone(), 3, &backend).unwrap();
            let tokens = model
                .generate(&[1, 2, 3], positions - 3, &Sampling::greedy(), &[])
                .unwrap();
            let logits = model.logits(&[4, 5, 6, 7]).unwrap();
            runs.push((backend.name().to_string(), tokens, logits));
        }
        let (first, _, logits) = &runs[0];
        for (name, t, l) in &runs {
            assert_eq!(t.len(), positions - 3, "{name}");
            assert!(t.iter().all(|&id| id < 30), "{name}: {t:?}");
            let want: Vec<f64> = logits.iter().flatten().map(|&v| f64::from(v)).collect();
            let diff = relative_difference(l, &want);
            assert!(diff < 1e-4, "{name} vs {first}: {diff:e}");
        }
    }
}

/// Products in bf16 (`Precision::Bf16Products`: operands rounded to bf16, sums in f32) give
/// logits close to f32's, and the same first greedy tokens on the fixture.
#[test]
fn bf16_products_stay_close_to_f32() {
    let backend = arrayjit::backend("sync_cc").unwrap();
    let f32_model = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
    let bf16_model = Gpt2::from_pretrained_with(
        &fixture(),
        &backend,
        arrayjit::tensor::Precision::Bf16Products,
    )
    .unwrap();
    let (ids, want) = &expected_logits()[1];
    let diff = relative_difference(&bf16_model.logits(ids).unwrap(), want);
    assert!(diff < 5e-2 && diff > 0.0, "{diff:e}");
    let greedy = Sampling::greedy();
    assert_eq!(
        bf16_model.generate(&[1, 2, 3], 3, &greedy, &[]).unwrap(),
        f32_model.generate(&[1, 2, 3], 3, &greedy, &[]).unwrap()
    );
}

/// Weights stored in bf16 (`Precision::Bf16Weights`: the matrix weights and embeddings in
/// bf16, everything else f32) compute what an f32 model whose weights were rounded to bf16
/// computes, on every backend: the same logits within f32's tolerance, and the same greedy
/// tokens with the key/value cache. Half the bytes of those weights are held.
#[test]
fn bf16_weights_compute_what_f32_computes_with_the_rounded_weights() {
    use arrayjit::ir::Prec;
    use arrayjit::tensor::Precision;
    let round_to_bf16 = |v: f64| f64::from(half::bf16::from_f64(v).to_f32());
    let greedy = Sampling::greedy();
    for backend in arrayjit_testing::all_backends_under_test().unwrap() {
        let name = backend.name().to_string();
        let narrow =
            Gpt2::from_pretrained_with(&fixture(), &backend, Precision::Bf16Weights).unwrap();
        let rounded = Gpt2::from_pretrained(&fixture(), &backend).unwrap();
        let mut weights = 0;
        for (n, r) in narrow.params().iter().zip(rounded.params()) {
            assert_eq!(n.dims(), r.dims());
            if n.prec() == Prec::Bf16 {
                weights += 1;
                let values: Vec<f64> = r.values().unwrap().into_iter().map(round_to_bf16).collect();
                r.node().host().set_values(&values).unwrap();
            } else {
                assert_eq!(n.prec(), Prec::F32, "{}", n.label());
            }
        }
        // Per block: query, key, value, output, MLP up and down; and the two embeddings.
        assert_eq!(weights, 6 * narrow.config().layers + 2, "{name}");
        for (ids, _) in expected_logits().iter().take(3) {
            let got = narrow.logits(ids).unwrap();
            let want: Vec<f64> = rounded
                .logits(ids)
                .unwrap()
                .iter()
                .flatten()
                .map(|&v| f64::from(v))
                .collect();
            let diff = relative_difference(&got, &want);
            assert!(
                diff < 1e-4,
                "{name}: logits of {} ids differ by {diff:e}",
                ids.len()
            );
        }
        let prompt = [5, 17, 3, 250, 9];
        assert_eq!(
            narrow.generate(&prompt, 12, &greedy, &[]).unwrap(),
            rounded.generate(&prompt, 12, &greedy, &[]).unwrap(),
            "{name}"
        );
    }
}

/// A model with weights stored in bf16 is for inference: the trainer refuses it with a typed
/// error that says which precisions train.
#[test]
fn bf16_weights_are_refused_for_training() {
    use arrayjit::tensor::Precision;
    let mut config = arrayjit::gpt::TrainerConfig::small(30);
    config.model.precision = Precision::Bf16Weights;
    let backend = arrayjit::backend("sync_cc").unwrap();
    let Err(e) = arrayjit::gpt::GptTrainer::new(&backend, &config) else {
        panic!("a trainer of bf16 weights was built");
    };
    assert!(
        matches!(&e, Error::InvalidSetting { setting, .. } if setting == "precision"),
        "{e}"
    );
    assert!(e.to_string().contains("inference"), "{e}");
}
