//! The one check of every launch against its kernel's interface ([`check_launch`]), whichever
//! backend runs it, and the errors launches share.

use arrayjit_codegen::KernelInterface;
use arrayjit_ir::Result;

use crate::array_buffer;
use crate::device_buffer::{BufferHandle, DeviceBuffer};

/// The checks every launch makes before a kernel runs, from its [`KernelInterface`]: one
/// buffer per argument, of this backend's buffer type `B` (`backend` names it in errors) and at
/// least the size the interface needs, and of the precision of its array when the buffer knows
/// its own ([`DeviceBuffer::prec`]); one value per static index, within its range. Returns
/// the buffers as `B`, in order. A mismatch is an error, never an out-of-bounds access.
pub fn check_launch<'a, B: DeviceBuffer>(
    k: &KernelInterface,
    args: &'a [BufferHandle],
    statics: &[i64],
    backend: &str,
) -> Result<Vec<&'a B>> {
    use arrayjit_ir::Error;
    let expected = k.buffer_sizes();
    let precs: Vec<arrayjit_ir::Prec> = k
        .args
        .iter()
        .chain(k.merge.iter())
        .map(|t| t.prec())
        .collect();
    if args.len() != expected.len() {
        return Err(Error::WrongArgumentCount {
            kernel: k.name.clone(),
            what: "buffers".into(),
            expected: expected.len(),
            given: args.len(),
        });
    }
    let mut buffers = Vec::with_capacity(args.len());
    for (pos, (b, &need)) in args.iter().zip(&expected).enumerate() {
        let buffer = b
            .as_any()
            .downcast_ref::<B>()
            .ok_or_else(|| Error::ForeignBuffer {
                what: format!("argument {pos} of {}", k.name),
                backend: backend.into(),
            })?;
        if buffer.size_in_bytes() < need {
            return Err(Error::ShapeMismatch {
                op: format!("launching {}", k.name),
                shapes: vec![],
                detail: format!(
                    "argument {pos} needs {need} bytes but its buffer has {}",
                    buffer.size_in_bytes()
                ),
            });
        }
        if let Some(&prec) = precs.get(pos) {
            array_buffer::check_prec(b, prec, &format!("argument {pos} of {}", k.name))?;
        }
        buffers.push(buffer);
    }
    if statics.len() != k.statics.len() {
        return Err(Error::WrongArgumentCount {
            kernel: k.name.clone(),
            what: "static indices".into(),
            expected: k.statics.len(),
            given: statics.len(),
        });
    }
    for (s, &v) in k.statics.iter().zip(statics) {
        if v < 0 || v >= s.range as i64 {
            return Err(Error::StaticIndex {
                symbol: s.name.clone(),
                detail: format!("value {v} is outside 0..{}", s.range),
            });
        }
    }
    Ok(buffers)
}

/// The error for launching kernel `index` of a batch that has `len` kernels.
pub fn no_such_kernel(index: usize, len: usize) -> arrayjit_ir::Error {
    arrayjit_ir::Error::NoSuchKernel { index, len }
}

/// The error for launch dimensions given at launch time to kernel `kernel` of backend
/// `backend`, compiled from assignments (see
/// [`crate::compiled_batch::LaunchRequest::with_dims`]).
pub fn launch_dims_not_taken(backend: &str, kernel: &str) -> arrayjit_ir::Error {
    arrayjit_ir::Error::Unsupported {
        backend: backend.into(),
        what: format!(
            "launch dimensions at launch time for kernel {kernel}, compiled from assignments (it launches as its schedule says)"
        ),
        instead: "give launch dimensions only to compile_source kernels".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::sync::Arc;

    use super::*;
    use crate::cpu::buffer::CpuBuffer;
    use arrayjit_ir::{Error, Prec, StaticSymbol, Tnode};

    fn interface() -> KernelInterface {
        KernelInterface {
            name: "k".into(),
            symbol: "k".into(),
            args: vec![Tnode::new(Prec::F32, &[4], &["x"]).unwrap()],
            merge: None,
            statics: vec![StaticSymbol::new("batch", 3)],
            scratch_bytes: 8,
        }
    }

    fn cpu(bytes: usize) -> BufferHandle {
        Arc::new(CpuBuffer::zeroed(bytes, 0, Arc::default()).unwrap())
    }

    #[test]
    fn launches_are_checked_against_the_kernel_interface() {
        let k = interface();
        let ok = [cpu(16), cpu(8)];
        assert_eq!(
            check_launch::<CpuBuffer>(&k, &ok, &[2], "cc")
                .unwrap()
                .len(),
            2
        );
        let e = check_launch::<CpuBuffer>(&k, &ok[..1], &[2], "cc").unwrap_err();
        assert!(
            matches!(&e, Error::WrongArgumentCount { what, expected: 2, given: 1, .. } if what == "buffers"),
            "{e}"
        );
        let e = check_launch::<CpuBuffer>(&k, &[cpu(12), cpu(8)], &[2], "cc").unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = check_launch::<CpuBuffer>(&k, &ok, &[3], "cc").unwrap_err();
        assert!(matches!(e, Error::StaticIndex { .. }), "{e}");
        let e = check_launch::<CpuBuffer>(&k, &ok, &[], "cc").unwrap_err();
        assert!(
            matches!(&e, Error::WrongArgumentCount { what, expected: 1, given: 0, .. } if what == "static indices"),
            "{e}"
        );
        // Another backend's buffer type is refused by name.
        #[derive(Debug)]
        struct Other;
        impl DeviceBuffer for Other {
            fn size_in_bytes(&self) -> usize {
                64
            }
            fn device(&self) -> usize {
                0
            }
            fn as_any(&self) -> &dyn Any {
                self
            }
        }
        let other: [BufferHandle; 2] = [Arc::new(Other), cpu(8)];
        let e = check_launch::<CpuBuffer>(&k, &other, &[0], "cc").unwrap_err();
        assert!(
            matches!(&e, Error::ForeignBuffer { backend, .. } if backend == "cc"),
            "{e}"
        );
        assert!(e.to_string().contains("not a cc buffer"), "{e}");
    }
}
