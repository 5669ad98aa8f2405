//! Memory calls: managed and device allocations, host registration, advice and prefetches
//! of managed memory, and a device's free memory.

use super::libcuda::{check, driver, location, with_device};
use crate::error::Result;
use cudarc::driver::sys::{CUdeviceptr, CUmem_advise, CUstream};
use std::ffi::{c_uint, c_void};

const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 1;
const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 2;

/// cuMemAllocManaged (attached globally), made in `device`'s context.
pub fn alloc_managed(size: usize, device: i32) -> Result<usize> {
    with_device(device.max(0), |d| {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver validates the size.
        check(
            d,
            unsafe { (d.cuMemAllocManaged)(&mut p, size, CU_MEM_ATTACH_GLOBAL) },
            "cuMemAllocManaged",
        )?;
        Ok(p as usize)
    })
}

/// cuMemAlloc on `device`.
pub fn alloc_device(size: usize, device: i32) -> Result<usize> {
    with_device(device, |d| {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver validates the size.
        check(d, unsafe { (d.cuMemAlloc_v2)(&mut p, size) }, "cuMemAlloc")?;
        Ok(p as usize)
    })
}

/// cuMemFree of managed or device memory.
///
/// # Safety
/// `ptr` came from [`alloc_managed`] or [`alloc_device`] and is used by no queued work.
pub unsafe fn free(ptr: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { (d.cuMemFree_v2)(ptr as CUdeviceptr) },
            "cuMemFree",
        )
    })
}

/// Register host memory, portable and mapped: the device sees it at the same address.
///
/// # Safety
/// `[ptr, ptr+size)` is host memory that stays mapped until [`unregister`].
pub unsafe fn register(ptr: usize, size: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        let flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { (d.cuMemHostRegister_v2)(ptr as *mut c_void, size, flags) },
            "cuMemHostRegister",
        )
    })
}

/// Undo [`register`].
///
/// # Safety
/// `ptr` was registered and no queued work uses it.
pub unsafe fn unregister(ptr: usize, device: i32) -> Result<()> {
    with_device(device.max(0), |d| {
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { (d.cuMemHostUnregister)(ptr as *mut c_void) },
            "cuMemHostUnregister",
        )
    })
}

/// Advise the preferred location of managed memory (`device < 0`: the host). Returns false
/// when the driver lacks cuMemAdvise_v2 (advice is optional).
pub fn advise_preferred(ptr: usize, size: usize, device: i32) -> Result<bool> {
    advise(
        ptr,
        size,
        CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        device,
    )
}

/// Advise that `device` (or the host) accesses managed memory, so it is mapped there.
pub fn advise_accessed_by(ptr: usize, size: usize, device: i32) -> Result<bool> {
    advise(
        ptr,
        size,
        CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY,
        device,
    )
}

fn advise(ptr: usize, size: usize, advice: CUmem_advise, device: i32) -> Result<bool> {
    let d = driver()?;
    let Some(f) = d.cuMemAdvise_v2 else {
        return Ok(false);
    };
    // SAFETY: the driver validates the range; advice never invalidates memory.
    check(
        d,
        unsafe { f(ptr as CUdeviceptr, size, advice, location(device)) },
        "cuMemAdvise",
    )?;
    Ok(true)
}

/// Prefetch managed memory to `device` (`< 0`: the host) in `stream`'s order, with
/// `ctx_device`'s context current (the stream's). Returns false when the driver lacks
/// cuMemPrefetchAsync_v2.
pub fn prefetch(
    ptr: usize,
    size: usize,
    device: i32,
    stream: usize,
    ctx_device: i32,
) -> Result<bool> {
    with_device(ctx_device.max(0), |d| {
        let Some(f) = d.cuMemPrefetchAsync_v2 else {
            return Ok(false);
        };
        // SAFETY: the driver validates the range and the stream handle.
        check(
            d,
            unsafe {
                f(
                    ptr as CUdeviceptr,
                    size,
                    location(device),
                    0,
                    stream as CUstream,
                )
            },
            "cuMemPrefetchAsync",
        )?;
        Ok(true)
    })
}

/// Free and total memory of `device`.
pub fn mem_info(device: i32) -> Result<(usize, usize)> {
    with_device(device, |d| {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check(
            d,
            unsafe { (d.cuMemGetInfo_v2)(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
    })
}
