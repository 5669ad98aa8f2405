//! CUDA virtual memory management: address space reserved once, physical device memory
//! created in pieces, mapped into it, and unmapped and released again while the rest of the
//! range stays in use (NVIDIA's "low-level virtual memory management" API). Measured on the
//! lent H100 (driver 580, 2026-11-24, `benches/archive/driver_probe.c`; docs/benchmarks-archive.md,
//! "What the driver does"):
//! `cuMemCreate` 15–30 µs, `cuMemMap` about 2 µs, `cuMemSetAccess` 30–70 µs per call (one call
//! covers several mappings), `cuMemUnmap` 20–35 µs and, unlike `cuMemFree`, no wait for the
//! device's queued work; the granularity is 2 MiB.

use super::libcuda::{
    CUDA_SUCCESS, Driver, check, device_count, driver, err_name, location, with_device,
};
use crate::error::{Error, Result};
use cudarc::driver::sys::{CUdeviceptr, CUmemAccessDesc, CUmemGenericAllocationHandle};
use cudarc::driver::sys::{
    CUmemAccess_flags, CUmemAllocationGranularity_flags, CUmemAllocationHandleType,
    CUmemAllocationProp, CUmemAllocationType,
};
use std::sync::OnceLock;

/// Whether the driver has every call this file makes.
pub(super) fn supported(d: &Driver) -> bool {
    d.cuMemGetAllocationGranularity.is_some()
        && d.cuMemAddressReserve.is_some()
        && d.cuMemAddressFree.is_some()
        && d.cuMemCreate.is_some()
        && d.cuMemRelease.is_some()
        && d.cuMemMap.is_some()
        && d.cuMemUnmap.is_some()
        && d.cuMemSetAccess.is_some()
}

/// The entry point `f`, or the error that says the driver lacks it.
fn entry<F>(f: Option<F>, name: &str) -> Result<F> {
    f.ok_or_else(|| Error::unsupported(format!("the CUDA driver lacks {name}")))
}

fn device_prop(device: i32) -> CUmemAllocationProp {
    // SAFETY: all-zero is a valid value of this plain-data struct (no handle types, no flags).
    let mut p: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CUmemAllocationHandleType(0);
    p.location = location(device);
    p
}

/// The size every piece of physical memory on `device` is a multiple of (2 MiB on the lent
/// GPUs).
pub fn vmm_granularity(device: i32) -> Result<usize> {
    with_device(device, |d| {
        let f = entry(
            d.cuMemGetAllocationGranularity,
            "cuMemGetAllocationGranularity",
        )?;
        let prop = device_prop(device);
        let mut g = 0usize;
        // SAFETY: valid out-pointer and property struct.
        check(
            d,
            unsafe {
                f(
                    &mut g,
                    &prop,
                    CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            },
            "cuMemGetAllocationGranularity",
        )?;
        Ok(g)
    })
}

/// Reserve `size` bytes of address space aligned to `align` (no memory behind it yet).
pub fn vmm_reserve(size: usize, align: usize, device: i32) -> Result<usize> {
    with_device(device, |d| {
        let f = entry(d.cuMemAddressReserve, "cuMemAddressReserve")?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver validates size and alignment.
        check(
            d,
            unsafe { f(&mut p, size, align, 0, 0) },
            "cuMemAddressReserve",
        )?;
        Ok(p as usize)
    })
}

/// Give a reservation back.
///
/// # Safety
/// `[addr, addr+size)` is a whole reservation from [`vmm_reserve`] with nothing mapped in it.
pub unsafe fn unreserve(addr: usize, size: usize, device: i32) -> Result<()> {
    with_device(device, |d| {
        let f = entry(d.cuMemAddressFree, "cuMemAddressFree")?;
        // SAFETY: forwarded from the caller.
        check(
            d,
            unsafe { f(addr as CUdeviceptr, size) },
            "cuMemAddressFree",
        )
    })
}

/// Create physical memory on `device` for each `(addr, len)` of `pieces` (contiguous, inside
/// a reservation, each a granularity multiple) and map it there; then make the whole run
/// readable and writable by `device` with one access call. Returns one handle per piece. On
/// failure everything made here is undone and nothing stays mapped.
pub fn map_pieces(pieces: &[(usize, usize)], device: i32) -> Result<Vec<u64>> {
    with_device(device, |d| {
        let create = entry(d.cuMemCreate, "cuMemCreate")?;
        let map = entry(d.cuMemMap, "cuMemMap")?;
        let unmap = entry(d.cuMemUnmap, "cuMemUnmap")?;
        let release = entry(d.cuMemRelease, "cuMemRelease")?;
        let prop = device_prop(device);
        let mut handles: Vec<u64> = Vec::with_capacity(pieces.len());
        let undo = |handles: &[u64]| {
            for (&(addr, len), &h) in pieces.iter().zip(handles) {
                // SAFETY: mapped just above by this call, used by nothing yet.
                unsafe {
                    unmap(addr as CUdeviceptr, len);
                    release(h);
                }
            }
        };
        for &(addr, len) in pieces {
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer and property struct.
            let made = check(d, unsafe { create(&mut h, len, &prop, 0) }, "cuMemCreate");
            if let Err(e) = made {
                undo(&handles);
                return Err(e);
            }
            // SAFETY: the range lies in a reservation of the caller's and has nothing mapped.
            if let Err(e) = check(
                d,
                unsafe { map(addr as CUdeviceptr, len, 0, h, 0) },
                "cuMemMap",
            ) {
                // SAFETY: created just above and mapped nowhere.
                unsafe { release(h) };
                undo(&handles);
                return Err(e);
            }
            handles.push(h);
        }
        let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
            return Ok(handles);
        };
        let run = (first.0, last.0 + last.1 - first.0);
        if let Err(e) = access(d, run.0, run.1, device) {
            undo(&handles);
            return Err(e);
        }
        Ok(handles)
    })
}

/// The devices that can reach memory of `device` over a peer link (`cuDeviceCanAccessPeer`),
/// read once per device.
pub fn peers_of(device: i32) -> &'static [i32] {
    static PEERS: OnceLock<Vec<OnceLock<Vec<i32>>>> = OnceLock::new();
    let Ok(d) = driver() else { return &[] };
    let all = PEERS.get_or_init(|| (0..device_count(d)).map(|_| OnceLock::new()).collect());
    let Some(slot) = usize::try_from(device).ok().and_then(|i| all.get(i)) else {
        return &[];
    };
    slot.get_or_init(|| {
        let Some(can) = d.cuDeviceCanAccessPeer else {
            return Vec::new();
        };
        (0..all.len() as i32)
            .filter(|&peer| {
                let (mut a, mut b, mut yes) = (0, 0, 0);
                // SAFETY: valid out-pointers; both ordinals are below the device count.
                let ok = unsafe {
                    (d.cuDeviceGet)(&mut a, peer) == CUDA_SUCCESS
                        && (d.cuDeviceGet)(&mut b, device) == CUDA_SUCCESS
                        && can(&mut yes, a, b) == CUDA_SUCCESS
                };
                peer != device && ok && yes != 0
            })
            .collect()
    })
}

/// Make `[addr, addr+len)` readable and writable by `device` and by every device that can
/// reach it over a peer link, as `cudaMalloc` memory is once peer access is enabled: peer
/// copies (`cudaMemcpyPeer`, `.to("cuda:0")`) and peer kernels work on it.
fn access(d: &Driver, addr: usize, len: usize, device: i32) -> Result<()> {
    let f = entry(d.cuMemSetAccess, "cuMemSetAccess")?;
    let desc = |dev: i32| CUmemAccessDesc {
        location: location(dev),
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    static NO_PEERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let peers = if NO_PEERS.load(std::sync::atomic::Ordering::Relaxed) {
        &[]
    } else {
        peers_of(device)
    };
    let descs: Vec<CUmemAccessDesc> = std::iter::once(device)
        .chain(peers.iter().copied())
        .map(desc)
        .collect();
    // SAFETY: `descs.len()` valid descriptors; the driver checks that the range is mapped.
    let rc = unsafe { f(addr as CUdeviceptr, len, descs.as_ptr(), descs.len()) };
    if rc != CUDA_SUCCESS && descs.len() > 1 {
        // A driver that refuses the peers' access still gives the device its own: the memory
        // stays usable there (peer copies then fail as they did before peers were granted).
        NO_PEERS.store(true, std::sync::atomic::Ordering::Relaxed);
        crate::error::set_last(&format!(
            "cuMemSetAccess for the peers of device {device}: {}; device memory pools are \
             reachable from their own device only",
            err_name(d, rc)
        ));
        // SAFETY: one valid descriptor, as above.
        return check(
            d,
            unsafe { f(addr as CUdeviceptr, len, &descs[0], 1) },
            "cuMemSetAccess",
        );
    }
    check(d, rc, "cuMemSetAccess")
}

/// Make mapped `[addr, addr+len)` readable and writable by `device` (again).
pub fn set_access(addr: usize, len: usize, device: i32) -> Result<()> {
    with_device(device, |d| access(d, addr, len, device))
}

/// Unmap every piece in `[addr, addr+len)` with one call (the range covers whole pieces).
///
/// # Safety
/// No queued or running work uses the range, and its pieces are released afterwards with
/// [`vmm_release`].
pub unsafe fn unmap_range(addr: usize, len: usize, device: i32) -> Result<()> {
    with_device(device, |d| {
        let f = entry(d.cuMemUnmap, "cuMemUnmap")?;
        // SAFETY: forwarded from the caller.
        check(d, unsafe { f(addr as CUdeviceptr, len) }, "cuMemUnmap")
    })
}

/// Release the physical memory behind `handle` (unmapped everywhere).
///
/// # Safety
/// `handle` came from [`map_pieces`] and is mapped nowhere any more.
pub unsafe fn vmm_release(handle: u64, device: i32) -> Result<()> {
    with_device(device, |d| {
        let f = entry(d.cuMemRelease, "cuMemRelease")?;
        // SAFETY: forwarded from the caller.
        check(d, unsafe { f(handle) }, "cuMemRelease")
    })
}
