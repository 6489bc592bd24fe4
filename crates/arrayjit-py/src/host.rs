//! NumPy in and out of a node's host array without conversions: `Tensor.numpy()` returns a
//! read-only NumPy view of the host array itself (no copy), and `tensor()` / `Tensor.assign()`
//! copy an array of the node's own dtype into the host array in one `memcpy`.
//!
//! Rules:
//! 1. A view aliases the host array, which a node never moves or replaces once made (every
//!    change is in place); the view's base object keeps the node, and so the array, alive, and
//!    pins the array (`node_sync::pin_host_array`): it is not handed to a CPU device while a
//!    view exists (the node's device array is then a copy).
//! 2. A view is read-only: a write through it would change the host values without the runtime
//!    knowing, and devices would compute on stale copies. `assign` is the way in.
//! 3. A view shows the host array as it is: `numpy()` first brings the host up to date (waiting
//!    for the routine that wrote the node), and later refreshes happen in place, so an older view
//!    shows them too. `numpy(copy=True)` is a snapshot.
//! 4. Where NumPy lacks the precision (bf16) or the host array has padding margins, values go
//!    through a converted copy instead.

use arrayjit_ir::{Error, Prec, Tnode};
use arrayjit_runtime::node_sync::{HostPin, pin_host_array};
use numpy::ndarray::{ArrayViewD, IxDyn};
use numpy::{PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{IntoPy, to_py};

/// Keeps a node's host array alive and where it is (pinned) while NumPy views of it exist.
#[pyclass(module = "arrayjit", frozen)]
pub struct HostArrayOwner {
    _pin: HostPin,
}

/// Runs `$body` with `$T` the Rust element type NumPy shares for `$prec`, or `$fallback`.
macro_rules! with_numpy_element {
    ($prec:expr, $T:ident => $body:block else $fallback:block) => {
        match $prec {
            Prec::U8 => {
                type $T = u8;
                $body
            }
            Prec::U16 => {
                type $T = u16;
                $body
            }
            Prec::I32 => {
                type $T = i32;
                $body
            }
            Prec::U32 => {
                type $T = u32;
                $body
            }
            Prec::I64 => {
                type $T = i64;
                $body
            }
            Prec::U64 => {
                type $T = u64;
                $body
            }
            Prec::F16 => {
                type $T = half::f16;
                $body
            }
            Prec::F32 => {
                type $T = f32;
                $body
            }
            Prec::F64 => {
                type $T = f64;
                $body
            }
            _ => $fallback,
        }
    };
}

/// A read-only NumPy view of `tn`'s host array, brought up to date first (rules 1–3); `None`
/// where NumPy lacks the precision or the array has padding (rule 4).
pub fn view<'py>(py: Python<'py>, tn: &Tnode) -> PyResult<Option<Bound<'py, PyAny>>> {
    // Pinned before the refresh that makes a handed-over host array again: it then stays.
    let pin = pin_host_array(tn).py()?;
    let node = tn.clone();
    py.detach(move || node.host().prepare_read()).py()?;
    let Some((plain, address)) = tn
        .host()
        .with(|nd| (nd.padding().is_none(), nd.as_bytes().as_ptr() as usize))
    else {
        return Err(to_py(Error::NotHosted {
            node: tn.debug_name(),
            detail: "reading it with numpy() needs one: set its values, or compile a routine \
                     that outputs it (arrayjit.compile), or call keep() before compiling"
                .into(),
        }));
    };
    if !plain {
        return Ok(None);
    }
    let dims = tn.dims().to_vec();
    with_numpy_element!(tn.prec(), T => {
        let owner = Bound::new(py, HostArrayOwner { _pin: pin })?.into_any();
        // SAFETY: `address` is the start of the host array's storage, which holds exactly
        // `dims`' elements of `T` (no padding), is aligned for `T` (typed storage), and is never
        // moved or replaced while the node lives and the array is pinned (rule 1); `owner`,
        // the view's base object, keeps the node alive and the array pinned as long as the
        // view.
        let array = unsafe {
            let data = ArrayViewD::<T>::from_shape_ptr(IxDyn(&dims), address as *const T);
            PyArrayDyn::<T>::borrow_from_array(&data, owner)
        };
        let flags = PyDict::new(py);
        flags.set_item("write", false)?;
        array.call_method("setflags", (), Some(&flags))?;
        Ok(Some(array.into_any()))
    } else {
        Ok(None)
    })
}

/// Copies `values` into `tn`'s host array in one `memcpy` if it is a NumPy array of the node's
/// own dtype and shape and the host array has no padding; marks the host changed. `Ok(false)`:
/// not that case (the caller converts).
pub fn copy_in(tn: &Tnode, values: &Bound<'_, PyAny>) -> PyResult<bool> {
    with_numpy_element!(tn.prec(), T => {
        let Ok(array) = values.extract::<PyReadonlyArrayDyn<'_, T>>() else {
            return Ok(false);
        };
        if array.as_array().shape() != tn.dims() {
            return Ok(false);
        }
        let owned;
        let slice: &[T] = match array.as_slice() {
            Ok(s) => s,
            Err(_) => {
                owned = array.as_array().iter().copied().collect::<Vec<T>>();
                &owned
            }
        };
        let bytes: &[u8] = bytemuck::cast_slice(slice);
        tn.host().check_writable("set_values").py()?;
        tn.host().prepare_read().py()?;
        let copied = tn
            .host().with_mut(|host| {
                if host.padding().is_some() || host.as_bytes_mut().len() != bytes.len() {
                    return Ok(false);
                }
                host.as_bytes_mut().copy_from_slice(bytes);
                Ok(true)
            })
            .py()?;
        if copied {
            tn.host().mark_changed();
        }
        Ok(copied)
    } else {
        Ok(false)
    })
}
