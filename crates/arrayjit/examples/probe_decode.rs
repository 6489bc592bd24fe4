use arrayjit::gpt2::{Gpt2, Gpt2Config, Sampling};
use arrayjit::tensor::Precision;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let backend = &args[1];
    let prec = if args[2] == "bf16" {
        Precision::Bf16Weights
    } else {
        Precision::F32
    };
    let dir = std::path::Path::new("/tmp/s36/gpt2ck");
    if !dir.join("model.safetensors").exists() {
        std::fs::create_dir_all(dir).unwrap();
        let b = arrayjit::backend("sync_cc").unwrap();
        Gpt2::random(Gpt2Config::small(), 1, &b)
            .unwrap()
            .save_pretrained(dir)
            .unwrap();
    }
    let b = arrayjit::backend(backend).unwrap();
    let model = Gpt2::from_pretrained_with(dir, &b, prec).unwrap();
    let prompt = [15496, 11, 314, 1101, 257, 3303, 2746, 11];
    model
        .generate(&prompt, 4, &Sampling::greedy(), &[])
        .unwrap();
    let n: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(64);
    let t = std::time::Instant::now();
    model
        .generate(&prompt, n, &Sampling::greedy(), &[])
        .unwrap();
    let s = t.elapsed().as_secs_f64();
    println!("{backend} {}: {:.1} tokens/s", args[2], n as f64 / s);
}
