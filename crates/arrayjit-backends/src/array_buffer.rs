//! Buffers that know the precision of their values (the reference's `device_buffer`, a native
//! buffer with its size and dtype): [`ArrayBuffer`] wraps any backend's buffer with a
//! [`Prec`], and [`typed`] is the one way the runtime and [`DeviceRuntime::alloc_array`]
//! make them (a host array handed to a device is typed with its own precision).
//!
//! A backend's own code is unchanged by the wrapper: [`DeviceBuffer::as_any`] of an
//! [`ArrayBuffer`] is its inner buffer's, so a backend downcasting an argument to its buffer
//! type finds it. What the precision buys is checks: [`check_launch`](crate::launch_check::check_launch)
//! refuses an argument whose precision differs from the kernel's array, a context refuses an
//! explicit array of another precision than its node's, and a merge buffer is reused only for
//! the same precision. Untyped bytes (scratch, raw [`DeviceRuntime::alloc_zeroed`] buffers)
//! answer `None` and are checked by size only.
//!
//! [`DeviceRuntime::alloc_array`]: crate::device_runtime::DeviceRuntime::alloc_array
//! [`DeviceRuntime::alloc_zeroed`]: crate::device_runtime::DeviceRuntime::alloc_zeroed

use std::any::Any;
use std::sync::Arc;

use arrayjit_ir::{Error, Prec, Result};

use crate::device_buffer::{BufferHandle, DeviceBuffer};

/// A device buffer holding values of one precision: a backend's buffer and the [`Prec`] of
/// its elements. Made by [`typed`]; sized in whole elements.
#[derive(Debug)]
pub struct ArrayBuffer {
    inner: BufferHandle,
    prec: Prec,
}

impl ArrayBuffer {
    /// The backend's buffer it wraps.
    pub fn inner(&self) -> &BufferHandle {
        &self.inner
    }

    /// How many values of its precision it holds.
    pub fn num_elems(&self) -> usize {
        self.inner.size_in_bytes() / self.prec.size_in_bytes()
    }
}

impl DeviceBuffer for ArrayBuffer {
    fn size_in_bytes(&self) -> usize {
        self.inner.size_in_bytes()
    }
    fn device(&self) -> usize {
        self.inner.device()
    }
    /// The inner buffer's: backends downcast arguments to their own buffer type.
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }
    fn prec(&self) -> Option<Prec> {
        Some(self.prec)
    }
}

/// `buffer` as a buffer of `prec` values: itself when it already holds `prec` values, else
/// wrapped in an [`ArrayBuffer`]. `op` says what the buffer is for, in errors. An error when
/// the buffer knows another precision ([`Error::PrecisionMismatch`]) or its size is not a whole
/// number of `prec` values.
pub fn typed(buffer: BufferHandle, prec: Prec, op: &str) -> Result<BufferHandle> {
    match buffer.prec() {
        Some(p) if p == prec => Ok(buffer),
        Some(p) => Err(Error::PrecisionMismatch {
            op: op.to_string(),
            expected: prec,
            found: p,
        }),
        None if !buffer.size_in_bytes().is_multiple_of(prec.size_in_bytes()) => {
            Err(Error::ShapeMismatch {
                op: op.to_string(),
                shapes: vec![],
                detail: format!(
                    "a buffer of {} bytes does not hold whole {} values ({} bytes each)",
                    buffer.size_in_bytes(),
                    prec.name(),
                    prec.size_in_bytes()
                ),
            })
        }
        None => Ok(Arc::new(ArrayBuffer {
            inner: buffer,
            prec,
        })),
    }
}

/// A buffer made of a host array of `prec` values (a host array handed to a device), typed
/// with that precision: it holds whole values by construction, so nothing can fail.
pub(crate) fn typed_host_array(buffer: BufferHandle, prec: Prec) -> BufferHandle {
    Arc::new(ArrayBuffer {
        inner: buffer,
        prec,
    })
}

/// Checks that `buffer`, if it knows its precision, holds `prec` values (for uses that need a
/// precision but keep the buffer as it is, such as copies).
pub fn check_prec(buffer: &BufferHandle, prec: Prec, op: &str) -> Result<()> {
    match buffer.prec() {
        Some(p) if p != prec => Err(Error::PrecisionMismatch {
            op: op.to_string(),
            expected: prec,
            found: p,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::buffer::CpuBuffer;

    fn cpu(bytes: usize) -> BufferHandle {
        Arc::new(CpuBuffer::zeroed(bytes, 0, Arc::default()).unwrap())
    }

    #[test]
    fn a_typed_buffer_knows_its_precision_and_still_downcasts() {
        let b = typed(cpu(16), Prec::F32, "test").unwrap();
        assert_eq!(b.prec(), Some(Prec::F32));
        assert_eq!(b.size_in_bytes(), 16);
        assert!(b.as_any().downcast_ref::<CpuBuffer>().is_some());
        // Typing again with the same precision keeps the same buffer.
        let again = typed(b.clone(), Prec::F32, "test").unwrap();
        assert!(Arc::ptr_eq(&b, &again));
        let e = typed(b.clone(), Prec::F16, "an explicit array of x").unwrap_err();
        assert!(matches!(e, Error::PrecisionMismatch { .. }), "{e}");
        assert!(e.to_string().contains("holds f32 values but f16"), "{e}");
        assert!(check_prec(&b, Prec::F64, "copy").is_err());
        assert!(check_prec(&cpu(8), Prec::F64, "copy").is_ok());
        let e = typed(cpu(6), Prec::F32, "test").unwrap_err();
        assert!(e.to_string().contains("whole f32 values"), "{e}");
    }
}
