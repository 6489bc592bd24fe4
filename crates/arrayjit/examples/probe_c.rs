fn main() {
    let b = arrayjit::backend("sync_cc").unwrap();
    let _ = arrayjit::bench::workloads::mlp_classifier(&b).unwrap();
}
