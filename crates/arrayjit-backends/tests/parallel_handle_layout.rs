//! The C `aj_par` struct every CPU kernel receives (`arrayjit_codegen::PARALLEL_TYPEDEF`) and
//! the Rust `ParallelHandle` the runtime passes must agree field by field. A C kernel compiled
//! by the `cc` backend reports the struct's size and offsets as its compiler lays it out, reads
//! the worker count through the handle it is given, and runs chunks through the handle's entry
//! point; all of it is checked against the Rust side.

use std::mem::{offset_of, size_of};
use std::sync::Arc;

use arrayjit_backends::LaunchRequest;
use arrayjit_backends::cc::{self, CcConfig};
use arrayjit_backends::cpu::worker_pool::ParallelHandle;
use arrayjit_codegen::{KernelInterface, PARALLEL_TYPEDEF, SourceKernel};
use arrayjit_ir::{Prec, Tnode};

const OUT: usize = 8;

fn source() -> String {
    format!(
        "#include <stddef.h>\n#include <stdint.h>\n{PARALLEL_TYPEDEF}\
         static void chunk(void *ctx, int64_t index) {{ ((int64_t *)ctx)[4 + index] = index + 100; }}\n\
         void aj_layout(void *const *args, const int64_t *statics, const aj_par *par) {{\n\
           (void)statics;\n\
           int64_t *out = (int64_t *)args[0];\n\
           out[0] = (int64_t)sizeof(aj_par);\n\
           out[1] = (int64_t)offsetof(aj_par, run);\n\
           out[2] = (int64_t)offsetof(aj_par, workers);\n\
           out[3] = par->workers;\n\
           par->run(par->pool, chunk, out, 4);\n\
         }}\n"
    )
}

#[test]
fn the_c_aj_par_struct_matches_parallel_handle() {
    let mut config = CcConfig::from_env().unwrap();
    config.workers_per_device = Some(3);
    config.cache_dir = None;
    let backend = cc::backend(config).unwrap();
    if let Err(e) = backend.check_available() {
        eprintln!("skipped: {e}");
        return;
    }
    let out = Tnode::new(Prec::I64, &[OUT], &["out"]).unwrap();
    let interface = KernelInterface {
        name: "layout".into(),
        symbol: "aj_layout".into(),
        args: vec![out],
        merge: None,
        statics: vec![],
        scratch_bytes: 0,
    };
    // SAFETY: the source exports `aj_layout` with the C calling convention and writes only the
    // 8 values of its one buffer.
    let batch =
        unsafe { backend.compile_source(&source(), &[SourceKernel::cpu(interface)]) }.unwrap();
    let buffer = backend.runtime().alloc_array(0, Prec::I64, OUT).unwrap();
    assert_eq!(buffer.size_in_bytes(), OUT * 8);
    // SAFETY: the buffer is this test's alone, and the launch finishes before it returns.
    unsafe { batch.launch(LaunchRequest::new(0, &[Arc::clone(&buffer)], &[])) }.unwrap();
    let mut bytes = vec![0u8; OUT * 8];
    // SAFETY: as above.
    unsafe { backend.runtime().copy_to_host(&buffer, &mut bytes, None) }.unwrap();
    let values: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(values[0] as usize, size_of::<ParallelHandle>(), "sizeof");
    assert_eq!(values[1] as usize, offset_of!(ParallelHandle, run), "run");
    assert_eq!(
        values[2] as usize,
        offset_of!(ParallelHandle, workers),
        "workers"
    );
    assert_eq!(values[3], 3, "the worker count read through the handle");
    assert_eq!(
        &values[4..],
        &[100, 101, 102, 103],
        "chunks run through the handle"
    );
}
