//! Checkpoint loading is all or nothing and reads the header first (reliability issue, item 22).

use arrayjit_ir::Error;
use arrayjit_tensor::checkpoint;
use arrayjit_tensor::{Init, Tensor};

#[test]
fn item22_checkpoint_loading_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ck.safetensors");
    let a = Tensor::param("a", &[2], Init::Zeros, 1, 0).unwrap();
    let w = Tensor::param("w", &[2, 2], Init::Zeros, 1, 1).unwrap();
    a.node().host().set_values(&[1.0, 2.0]).unwrap();
    w.node().host().set_values(&[3.0, 4.0, 5.0, 6.0]).unwrap();
    checkpoint::save(&[a.clone(), w.clone()], &path).unwrap();
    // Load into parameters where `a` matches but `w` has another shape: nothing changes.
    let a2 = Tensor::param("a", &[2], Init::Zeros, 1, 0).unwrap();
    let w2 = Tensor::param("w", &[4], Init::Zeros, 1, 1).unwrap();
    let err = checkpoint::load(&[a2.clone(), w2.clone()], &path).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert_eq!(
        a2.node().host().get_values().unwrap(),
        vec![0.0, 0.0],
        "a was overwritten"
    );
    // The matching load works.
    let a3 = Tensor::param("a", &[2], Init::Zeros, 1, 0).unwrap();
    let w3 = Tensor::param("w", &[2, 2], Init::Zeros, 1, 1).unwrap();
    checkpoint::load(&[a3.clone(), w3.clone()], &path).unwrap();
    assert_eq!(
        w3.node().host().get_values().unwrap(),
        vec![3.0, 4.0, 5.0, 6.0]
    );
    // A huge sparse file with a bad header is refused after reading its header alone.
    let sparse = dir.path().join("sparse.safetensors");
    let f = std::fs::File::create(&sparse).unwrap();
    use std::io::Write as _;
    (&f).write_all(&u64::MAX.to_le_bytes()).unwrap();
    f.set_len(8 << 30).unwrap();
    let started = std::time::Instant::now();
    let err = checkpoint::load(std::slice::from_ref(&a3), &sparse).unwrap_err();
    assert!(err.to_string().contains("header"), "{err}");
    // A bad file is a Checkpoint error that says so once, with the file first.
    assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.starts_with(&sparse.display().to_string()), "{msg}");
    assert_eq!(msg.matches("not a valid checkpoint").count(), 1, "{msg}");
    assert!(!msg.contains("invalid argument"), "{msg}");
    // A file without a parameter says which.
    let lone = Tensor::param("lonely", &[2], Init::Zeros, 1, 0).unwrap();
    let err = checkpoint::load(std::slice::from_ref(&lone), &path).unwrap_err();
    assert!(
        matches!(err, Error::Checkpoint { .. }) && err.to_string().contains("no parameter lonely"),
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    // A truncated file: the header is fine but the data is cut short.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
    let before = a3.node().host().get_values().unwrap();
    assert!(checkpoint::load(&[a3.clone(), w3.clone()], &cut).is_err());
    assert_eq!(a3.node().host().get_values().unwrap(), before);
}

/// Parameters of f16, bf16, f32 and f64 are saved in their own precision and load back bit for
/// bit; a tensor of another float precision loads converted to the parameter's.
#[test]
fn checkpoints_keep_each_parameters_precision() {
    use arrayjit_ir::Prec;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.safetensors");
    let values: Vec<f64> = (0..6).map(|k| 0.1 * k as f64 - 0.25).collect();
    let precs = [Prec::F16, Prec::Bf16, Prec::F32, Prec::F64];
    let make = |init: bool| -> Vec<Tensor> {
        precs
            .iter()
            .map(|&p| {
                let t = Tensor::param_with_prec(
                    &format!("p_{}", p.name()),
                    p,
                    &[2, 3],
                    Init::Zeros,
                    1,
                    0,
                )
                .unwrap();
                if init {
                    t.node().host().set_values(&values).unwrap();
                }
                t
            })
            .collect()
    };
    let saved = make(true);
    checkpoint::save(&saved, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (p, dtype) in precs.iter().zip(["F16", "BF16", "F32", "F64"]) {
        let t = file.tensor(&format!("p_{}", p.name())).unwrap();
        assert_eq!(format!("{:?}", t.dtype()), dtype);
        assert_eq!(t.data().len(), 6 * p.size_in_bytes());
    }
    let loaded = make(false);
    checkpoint::load(&loaded, &path).unwrap();
    for (a, b) in saved.iter().zip(&loaded) {
        let (x, y) = (a.values().unwrap(), b.values().unwrap());
        assert_eq!(
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{}",
            a.label()
        );
    }
    // The f64 tensor into an f32 parameter: converted, rounded to nearest.
    let narrow = Tensor::param_with_prec("p_f64", Prec::F32, &[2, 3], Init::Zeros, 1, 0).unwrap();
    checkpoint::load(std::slice::from_ref(&narrow), &path).unwrap();
    let expected: Vec<f64> = values.iter().map(|&v| v as f32 as f64).collect();
    assert_eq!(narrow.values().unwrap(), expected);
}

/// The values `make_numpy_checkpoint.py` writes, computed here independently.
fn numpy_values() -> Vec<(&'static str, arrayjit_ir::Prec, Vec<usize>, Vec<f64>)> {
    use arrayjit_ir::Prec;
    vec![
        (
            "w.f32",
            Prec::F32,
            vec![2, 3],
            (0..6).map(|k| (k as f64 - 2.5) / 4.0).collect(),
        ),
        (
            "w.f16",
            Prec::F16,
            vec![4],
            (0..4).map(|k| k as f64 * 0.5 - 1.0).collect(),
        ),
        (
            "w.f64",
            Prec::F64,
            vec![2, 2],
            vec![1.0 / 3.0, -2.0 / 3.0, 1e-10, 1e10],
        ),
        ("b.i32", Prec::I32, vec![3], vec![1.0, -2.0, 3.0]),
        ("mask.u8", Prec::U8, vec![2], vec![0.0, 255.0]),
    ]
}

/// A file written by Python's `safetensors.numpy.save_file` (the committed fixture, from
/// `fixtures/make_numpy_checkpoint.py`) loads into parameters of the same shapes, in their
/// precisions or converted; where Python has numpy and safetensors, the script runs again and
/// its output loads the same.
#[test]
fn checkpoints_written_by_numpy_load() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/numpy_checkpoint.safetensors");
    let mut files = vec![fixture];
    let dir = tempfile::tempdir().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/make_numpy_checkpoint.py");
    let fresh = dir.path().join("fresh.safetensors");
    let python = std::env::var("ARRAYJIT_PYTHON").unwrap_or_else(|_| "python3".into());
    match std::process::Command::new(&python)
        .arg(&script)
        .arg(&fresh)
        .output()
    {
        Ok(out) if out.status.success() => files.push(fresh),
        Ok(out) => eprintln!(
            "skipped running the script: {python} lacks numpy or safetensors ({})",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => eprintln!("skipped running the script: {python}: {e}"),
    }
    for file in &files {
        let params: Vec<(Tensor, Vec<f64>)> = numpy_values()
            .into_iter()
            .map(|(name, prec, dims, values)| {
                (
                    Tensor::param_with_prec(name, prec, &dims, Init::Zeros, 1, 0).unwrap(),
                    values,
                )
            })
            .collect();
        let tensors: Vec<Tensor> = params.iter().map(|(t, _)| t.clone()).collect();
        checkpoint::load(&tensors, file).unwrap();
        for (t, expected) in &params {
            assert_eq!(
                &t.values().unwrap(),
                expected,
                "{}: {}",
                file.display(),
                t.label()
            );
        }
        // The f16 tensor into an f64 parameter: converted exactly.
        let wide =
            Tensor::param_with_prec("w.f16", arrayjit_ir::Prec::F64, &[4], Init::Zeros, 1, 0)
                .unwrap();
        checkpoint::load(std::slice::from_ref(&wide), file).unwrap();
        assert_eq!(wide.values().unwrap(), vec![-1.0, -0.5, 0.0, 0.5]);
        // Another shape is refused, naming both.
        let other =
            Tensor::param_with_prec("w.f32", arrayjit_ir::Prec::F32, &[3, 2], Init::Zeros, 1, 0)
                .unwrap();
        let e = checkpoint::load(std::slice::from_ref(&other), file).unwrap_err();
        assert!(
            e.to_string().contains("F32 [2, 3]") && e.to_string().contains("[3, 2]"),
            "{e}"
        );
    }
    eprintln!("loaded {} file(s)", files.len());
}
