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
    a.node().set_values(&[1.0, 2.0]).unwrap();
    w.node().set_values(&[3.0, 4.0, 5.0, 6.0]).unwrap();
    checkpoint::save(&[a.clone(), w.clone()], &path).unwrap();
    // Load into parameters where `a` matches but `w` has another shape: nothing changes.
    let a2 = Tensor::param("a", &[2], Init::Zeros, 1, 0).unwrap();
    let w2 = Tensor::param("w", &[4], Init::Zeros, 1, 1).unwrap();
    let err = checkpoint::load(&[a2.clone(), w2.clone()], &path).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert_eq!(
        a2.node().get_values().unwrap(),
        vec![0.0, 0.0],
        "a was overwritten"
    );
    // The matching load works.
    let a3 = Tensor::param("a", &[2], Init::Zeros, 1, 0).unwrap();
    let w3 = Tensor::param("w", &[2, 2], Init::Zeros, 1, 1).unwrap();
    checkpoint::load(&[a3.clone(), w3.clone()], &path).unwrap();
    assert_eq!(w3.node().get_values().unwrap(), vec![3.0, 4.0, 5.0, 6.0]);
    // A huge sparse file with a bad header is refused after reading its header alone.
    let sparse = dir.path().join("sparse.safetensors");
    let f = std::fs::File::create(&sparse).unwrap();
    use std::io::Write as _;
    (&f).write_all(&u64::MAX.to_le_bytes()).unwrap();
    f.set_len(8 << 30).unwrap();
    let started = std::time::Instant::now();
    let err = checkpoint::load(std::slice::from_ref(&a3), &sparse).unwrap_err();
    assert!(err.to_string().contains("header"), "{err}");
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    // A truncated file: the header is fine but the data is cut short.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
    let before = a3.node().get_values().unwrap();
    assert!(checkpoint::load(&[a3.clone(), w3.clone()], &cut).is_err());
    assert_eq!(a3.node().get_values().unwrap(), before);
}
