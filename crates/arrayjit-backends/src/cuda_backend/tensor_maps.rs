//! Tensor maps of the `cuda` backend: a pass whose warpgroup product's factors the tensor
//! memory accelerator stages takes one per such factor by value, encoded at launch from the
//! factor's device address and the shape the renderer recorded
//! ([`arrayjit_codegen::cuda::CudaTensorMap`]) by the driver (`cuTensorMapEncodeTiled`).

use arrayjit_codegen::cuda::CudaPass;
use arrayjit_ir::{Error, Result};
use cudarc::driver::DeviceRepr;
use cudarc::driver::sys;

use super::devices::Gpu;

/// One encoded tensor map, as a kernel parameter (`const __grid_constant__`, 64-byte aligned).
#[repr(transparent)]
pub(crate) struct TensorMapArg(sys::CUtensorMap);

// SAFETY: a tensor map is plain bytes the kernel takes by value (the driver's own type, with
// its alignment), as the kernel's `aj_tensor_map` parameter declares it.
unsafe impl DeviceRepr for TensorMapArg {}

/// The tensor maps of `pass`, in its parameters' order, for the factors at `args` (the
/// pass's pointer arguments' device addresses). A map the driver refuses is a typed error
/// naming the factor's shape.
pub(crate) fn encode(gpu: &Gpu, pass: &CudaPass, args: &[u64]) -> Result<Vec<TensorMapArg>> {
    pass.tensor_maps
        .iter()
        .map(|m| {
            let address = *args.get(m.arg).ok_or_else(|| {
                Error::invalid(format!(
                    "{} takes a tensor map of pointer parameter {} of its {}",
                    pass.symbol,
                    m.arg,
                    args.len()
                ))
            })?;
            let shape = &m.shape;
            let eb = shape.element_bytes as u64;
            let rank = shape.axes.len();
            let dims: Vec<u64> = shape.axes.iter().map(|a| a.extent as u64).collect();
            let strides: Vec<u64> = shape.axes[1..]
                .iter()
                .map(|a| a.stride as u64 * eb)
                .collect();
            let boxes: Vec<u32> = shape.axes.iter().map(|a| a.boxed as u32).collect();
            let element_strides = vec![1u32; rank];
            let data_type = match eb {
                2 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                4 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
                _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            };
            let swizzle = match shape.swizzle_bytes {
                128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
                32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
                _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            };
            let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
            // SAFETY: every array holds `rank` entries (`strides` one fewer), as the call
            // reads; `map` is the driver's type, so aligned as it requires.
            let status = unsafe {
                sys::cuTensorMapEncodeTiled(
                    map.as_mut_ptr(),
                    data_type,
                    rank as u32,
                    address as *mut std::ffi::c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    boxes.as_ptr(),
                    element_strides.as_ptr(),
                    sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    swizzle,
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                    sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            };
            if status != sys::cudaError_enum::CUDA_SUCCESS {
                return Err(gpu.driver_error(
                    &format!(
                        "encoding the tensor map of {} (dims {dims:?}, byte strides \
                         {strides:?}, box {boxes:?}, {}-byte swizzle)",
                        pass.symbol, shape.swizzle_bytes
                    ),
                    cudarc::driver::DriverError(status),
                ));
            }
            // SAFETY: the driver wrote the map.
            Ok(TensorMapArg(unsafe { map.assume_init() }))
        })
        .collect()
}
