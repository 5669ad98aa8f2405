//! What the driver knows of an address that is not ours (`cuPointerGetAttributes`).

use super::libcuda::{CUDA_SUCCESS, driver};
use cudarc::driver::sys::{CUdeviceptr, CUpointer_attribute};
use std::ffi::{c_int, c_void};

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)` values.
pub(crate) const CU_MEMORYTYPE_HOST: u32 = 1;

/// What the driver knows of an address that is not ours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PointerInfo {
    /// CU_MEMORYTYPE_* (0: unknown to CUDA).
    pub memory_type: u32,
    pub is_managed: bool,
    pub device: i32,
    pub range_start: usize,
    pub range_size: usize,
}

impl PointerInfo {
    /// Whether the host can load and store it: managed, or host memory the driver knows.
    pub fn host_accessible(&self) -> bool {
        self.is_managed || self.memory_type == CU_MEMORYTYPE_HOST
    }
}

/// Ask the driver about `ptr`. None when there is no driver or the driver does not know it.
pub fn pointer_info(ptr: usize) -> Option<PointerInfo> {
    let d = driver().ok()?;
    let mut memory_type: u32 = 0;
    let mut is_managed: u32 = 0;
    let mut device: c_int = -1;
    let mut start: CUdeviceptr = 0;
    let mut size: usize = 0;
    use CUpointer_attribute as P;
    let mut attrs = [
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        P::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 5] = [
        (&mut memory_type as *mut u32).cast(),
        (&mut is_managed as *mut u32).cast(),
        (&mut device as *mut c_int).cast(),
        (&mut start as *mut CUdeviceptr).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: five attributes, five out-pointers of the sizes cuda.h documents for them.
    let rc = unsafe {
        (d.cuPointerGetAttributes)(5, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr as CUdeviceptr)
    };
    if rc != CUDA_SUCCESS || memory_type == 0 {
        return None;
    }
    Some(PointerInfo {
        memory_type,
        is_managed: is_managed != 0,
        device,
        range_start: start as usize,
        range_size: size,
    })
}
