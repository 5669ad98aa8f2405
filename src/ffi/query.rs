//! Introspection: the machine's capabilities and the mode, what an address is, the
//! statistics and the pools, a device's memory, and streams about to be destroyed. Shared by
//! every consumer.

use super::{copy_cstr, guard, status, write_versioned};
use crate::allocator;
use crate::error::{self, Error, Status};
use crate::mode::ump_mode;
use crate::pointer::ump_identity;
use std::ffi::{c_char, c_int, c_void};

/// Most devices `ump_capabilities` describes.
pub const UMP_MAX_DEVICES: usize = 16;

const _: () = assert!(crate::stats::STATS_DEVICES == UMP_MAX_DEVICES);

/// Version of `ump_capabilities` (2: each side's kind and reason; 3: what fork() does with the
/// host side's memory).
pub const UMP_CAPABILITIES_VERSION: u32 = 3;
/// Capabilities of one device.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct ump_device_caps {
    /// CUDA device ordinal.
    pub ordinal: i32,
    /// The GPU can read pageable (malloc) memory: HMM or ATS.
    pub pageable_memory_access: bool,
    /// That access goes through the host page tables (ATS, e.g. Grace Hopper).
    pub uses_host_page_tables: bool,
    /// CPU and GPU may touch managed memory at the same time.
    pub concurrent_managed_access: bool,
    /// cuMemHostRegister is supported.
    pub host_register_supported: bool,
    /// Registered memory has the same address on the device.
    pub host_pointer_for_registered_mem: bool,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Device name, NUL-terminated.
    pub name: [c_char; 96],
}

/// What this machine can do and which mode ump-alloc runs in. Versioned: set `size` to
/// `sizeof(ump_capabilities)` (0 means "the current size") before calling.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct ump_capabilities {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_CAPABILITIES_VERSION`.
    pub version: u32,
    /// A CUDA driver with at least one device is usable.
    pub cuda_available: bool,
    /// The driver has cuMemPrefetchAsync_v2 and cuMemAdvise_v2 (driver >= 12.2).
    pub has_prefetch_v2: bool,
    /// The mode and alignment are fixed (an allocation or `ump_init` happened).
    pub mode_fixed: bool,
    /// CUDA driver version, e.g. 13000; 0 without CUDA.
    pub driver_version: i32,
    /// Number of CUDA devices.
    pub device_count: i32,
    /// The mode in force, or the one the configuration would select (`UMP_MODE_UNSET` when the
    /// configuration cannot be satisfied; `mode_reason` then says why).
    pub mode: ump_mode,
    /// Alignment of every block.
    pub alignment: usize,
    /// Why this mode (or what is wrong), NUL-terminated.
    pub mode_reason: [c_char; 256],
    /// The first `min(device_count, UMP_MAX_DEVICES)` devices.
    pub devices: [ump_device_caps; UMP_MAX_DEVICES],
    /// The memory of the host side (NumPy, `ump_malloc`): `UMP_KIND_HOST`, `_SYSTEM`,
    /// `_REGISTERED` (pinned host memory mapped for every device) or `_MANAGED`.
    pub host_side: crate::backing::ump_kind,
    /// The memory of the device side (CuPy, PyTorch): `UMP_KIND_SYSTEM`, `_MANAGED`,
    /// `_REGISTERED`, `_DEVICE`, or `UMP_KIND_UNKNOWN` for none (no GPU).
    pub device_side: crate::backing::ump_kind,
    /// Why the host side has that memory, NUL-terminated.
    pub host_reason: [c_char; 256],
    /// Why the device side has that memory, NUL-terminated.
    pub device_reason: [c_char; 256],
    /// The host side's pinned pages are shared with `fork()` children, not copied into them
    /// (`UMP_ALLOC_PINNED_FORK=share` where the machine allows it).
    pub fork_shared: bool,
    /// What `fork()` does with the host side's memory, and what a child sees, NUL-terminated.
    pub fork_rule: [c_char; 256],
}

/// Fill `out` with the machine's capabilities and the mode (see `ump_capabilities`).
/// Does not fix the mode. Returns `UMP_OK`, or `UMP_ERR_NULL` / `UMP_ERR_INVALID`.
///
/// # Safety
/// `out` is NULL or points to a writable `ump_capabilities` whose `size` field is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_capabilities(out: *mut ump_capabilities) -> c_int {
    status("ump_capabilities", || {
        if out.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "out is NULL"));
        }
        let caps = allocator::caps();
        // SAFETY: all-zero is a valid value of this plain-data struct (UMP_MODE_UNSET is 0).
        let mut c: ump_capabilities = unsafe { std::mem::zeroed() };
        c.version = UMP_CAPABILITIES_VERSION;
        c.cuda_available = caps.cuda_unavailable.is_none() && !caps.devices.is_empty();
        c.has_prefetch_v2 = caps.has_prefetch_v2;
        c.driver_version = caps.driver_version;
        c.device_count = caps.devices.len() as i32;
        match allocator::get() {
            Some(a) => {
                c.mode_fixed = true;
                c.alignment = a.alignment;
            }
            None => c.alignment = allocator::config().map_or(0, |cfg| cfg.alignment),
        }
        match allocator::selection() {
            Ok(sel) => {
                c.mode = sel.mode.to_c();
                copy_cstr(&mut c.mode_reason, &sel.reason());
                c.host_side = sel.sides.host.kind();
                c.device_side = sel.sides.device.kind();
                copy_cstr(&mut c.host_reason, &sel.host_reason);
                copy_cstr(&mut c.device_reason, &sel.device_reason);
            }
            Err(e) => copy_cstr(&mut c.mode_reason, &e.msg),
        }
        if let Some((shared, rule)) = allocator::fork_rule() {
            c.fork_shared = shared;
            copy_cstr(&mut c.fork_rule, &rule);
        }
        for (slot, d) in c.devices.iter_mut().zip(caps.devices.iter()) {
            slot.ordinal = d.ordinal;
            slot.pageable_memory_access = d.pageable_memory_access;
            slot.uses_host_page_tables = d.uses_host_page_tables;
            slot.concurrent_managed_access = d.concurrent_managed_access;
            slot.host_register_supported = d.host_register_supported;
            slot.host_pointer_for_registered_mem = d.host_pointer_for_registered_mem;
            slot.total_memory = d.total_memory;
            copy_cstr(&mut slot.name, &d.name);
        }
        // SAFETY: non-NULL; the caller provides `size` bytes.
        unsafe { write_versioned(out, c) }
    })
}

/// 1 when `ptr` is the start of a live block of ump-alloc's (from any of its allocation
/// functions), else 0 (NULL, foreign memory, a freed block, an address inside a block). A
/// registry lookup: lock-free, and it never asks the CUDA driver (`ump_identify` may, to say
/// who can reach the memory), so a program on plain host memory can ask it without loading
/// the driver.
#[unsafe(no_mangle)]
pub extern "C" fn ump_owns(ptr: *const c_void) -> c_int {
    c_int::from(guard("ump_owns", || {
        crate::pointer::is_block_start(ptr as usize)
    }))
}

/// Tell what `ptr` is: whether it lies in a live block of ours (any address inside the block,
/// not only its start), the kind of memory, the block's base and size, its device, and
/// whether the host and the GPU can reach it on this machine. Lock-free for our pointers;
/// foreign pointers ask the CUDA driver. Returns `UMP_OK` (also for foreign and NULL
/// addresses, which get `ours == false`) or `UMP_ERR_NULL` when `out` is NULL.
///
/// # Safety
/// `out` is NULL or points to a writable `ump_identity` whose `size` field is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_identify(ptr: *const c_void, out: *mut ump_identity) -> c_int {
    status("ump_identify", || {
        if out.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "out is NULL"));
        }
        let id = crate::pointer::identify(ptr as usize);
        // SAFETY: non-NULL; the caller provides `size` bytes.
        unsafe { write_versioned(out, id) }
    })
}

/// Fill `out` with the allocator's counters (see `ump_stats`): bytes in use, mapped and
/// cached, with peaks, per kind and per device; allocation, free, cache hit and miss counts;
/// stream-ordering and error counts. Returns `UMP_OK`, or `UMP_ERR_NULL` / `UMP_ERR_INVALID`
/// (a `size` below 8).
///
/// # Safety
/// `out` is NULL or points to a writable `ump_stats` whose `size` field is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_stats(out: *mut crate::stats::ump_stats) -> c_int {
    status("ump_stats", || {
        if out.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "out is NULL"));
        }
        let s = crate::stats::collect_stats();
        // SAFETY: `out` is non-NULL and, per the contract, holds `size` writable bytes.
        unsafe { write_versioned(out, s) }
    })
}

/// Reset every peak in `ump_stats` to the current value (PyTorch's
/// `reset_peak_memory_stats`). Returns `UMP_OK`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_reset_peak() -> c_int {
    status("ump_reset_peak", || {
        crate::stats::reset_peaks();
        Ok(())
    })
}

/// 1 while the host side's memory is pinned as it is made: pinned host memory with
/// `UMP_ALLOC_PIN=eager`, or once the process used a GPU (its first device-side allocation, a
/// transfer call of ump-alloc's, or a CUDA context found active when a chunk was mapped); 0
/// otherwise: no GPU used in this process yet (its NumPy memory waits to be pinned, and no CUDA
/// context was made for it), or a host side that is not pinned memory.
#[unsafe(no_mangle)]
pub extern "C" fn ump_host_pinned() -> c_int {
    c_int::from(guard("ump_host_pinned", || {
        let pinned_side = crate::allocator::get()
            .is_some_and(|a| a.host_pool().kind() == crate::backing::Kind::UMP_KIND_REGISTERED);
        pinned_side && crate::backing::host_pinning_active()
    }))
}

/// The program is about to hand host memory to GPU `device` (-1: the device current on this
/// thread, else 0) by a way ump-alloc does not see (a view it makes of NumPy memory, a pointer
/// wrapped by hand): pin the host side's memory now if it waits for the first use of a GPU
/// (`UMP_ALLOC_PIN=lazy`), as the first device-side allocation would. Returns `UMP_OK` (also
/// when there is nothing to pin); `UMP_ERR_INVALID` for a device this machine does not have;
/// `UMP_ERR_UNSUPPORTED` without a usable GPU (no driver, a fork child of a CUDA process).
#[unsafe(no_mangle)]
pub extern "C" fn ump_pin_host_side(device: c_int) -> c_int {
    super::status("ump_pin_host_side", || {
        if !crate::prim::cuda::available() {
            return Err(Error::unsupported(
                "no usable GPU here (no CUDA driver, or a fork() child of a process that used CUDA)",
            ));
        }
        let device = if device == -1 {
            crate::prim::cuda::current_device().unwrap_or(0)
        } else {
            device
        };
        crate::allocator::check_device(device)?;
        crate::allocator::use_gpu(Some(device));
        Ok(())
    })
}

/// One pool of ump-alloc, as `ump_pool_stat` reports it. Versioned like `ump_stats`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct ump_pool_stat {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_POOL_STAT_VERSION`.
    pub version: u32,
    /// The device whose side it serves; -1 for the host side (NumPy, the malloc family).
    pub device: i32,
    /// The host side's fallback pool (plain host memory where its own kind was not available).
    pub fallback: bool,
    /// Its stream's handle was retired (`ump_stream_retire`).
    pub retired: bool,
    /// The stream it serves (`cudaStream_t`; NULL: the legacy default stream and host pools).
    pub stream: *mut c_void,
    /// Bytes of the chunks it holds, mapped from the OS or the driver.
    pub mapped: u64,
    /// Free bytes ready for reuse.
    pub cached: u64,
    /// The largest free block: the largest request served without mapping more.
    pub largest_free: u64,
    /// Bytes of address space its chunks hold: more than `mapped` for a virtual-memory pool
    /// (pages are mapped into it as blocks land on them), equal otherwise (version 2).
    pub reserved: u64,
    /// The kind of memory it is made of: a device's pools are of the device side's kind, and
    /// PyTorch's segments may be plain device memory beside them (version 3).
    pub kind: crate::backing::ump_kind,
}

/// Current version of `struct ump_pool_stat` (2: `reserved`; 3: `kind`).
pub const UMP_POOL_STAT_VERSION: u32 = 3;

/// Fill `*out` with pool number `index` (0, 1, ...: the host side's pools, then each device's,
/// one per stream). Returns `UMP_OK`; `UMP_ERR_INVALID` past the last pool (and before the first
/// allocation): the end of the list, with a message in `ump_last_error()` but not counted as an
/// error in `ump_stats`; `UMP_ERR_NULL` for a NULL `out`. `out->size` says how many bytes the
/// caller's struct has (older, smaller structs get the fields they know).
///
/// # Safety
/// `out` is NULL or points to at least `out->size` writable bytes (the whole struct when 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_pool_stat(index: usize, out: *mut ump_pool_stat) -> c_int {
    const NAME: &str = "ump_pool_stat";
    guard(NAME, || {
        if out.is_null() {
            return super::fail(NAME, Error::new(Status::UMP_ERR_NULL, "out is NULL"));
        }
        let reports = crate::stats::pool_reports();
        let Some(&(device, r)) = reports.get(index) else {
            // Walking the list ends here: a caller's loop condition, not a failure to count.
            error::set_last(&format!(
                "{NAME}: no pool {index} ({} pools)",
                reports.len()
            ));
            return Status::UMP_ERR_INVALID as c_int;
        };
        let host_pools = reports.iter().filter(|x| x.0 < 0).count();
        let full = ump_pool_stat {
            size: size_of::<ump_pool_stat>() as u32,
            version: UMP_POOL_STAT_VERSION,
            device,
            fallback: device < 0 && index == 1 && host_pools == 2,
            retired: r.retired,
            stream: r.stream as *mut c_void,
            mapped: r.mapped as u64,
            cached: r.cached as u64,
            largest_free: r.largest_free as u64,
            reserved: r.reserved as u64,
            kind: r.kind,
        };
        // SAFETY: non-NULL; the caller provides `size` bytes (the whole struct when 0).
        match unsafe { write_versioned(out, full) } {
            Ok(()) => Status::UMP_OK as c_int,
            Err(e) => super::fail(NAME, e),
        }
    })
}

/// Memory of `device` for the device side: `*free` is what the driver reports free plus what
/// ump-alloc caches on the device (ready for reuse), `*total` the device's memory (Numba's
/// `get_memory_info`, `cudaMemGetInfo` as seen through ump-alloc). Returns `UMP_OK`;
/// `UMP_ERR_NULL` for a NULL output; `UMP_ERR_INVALID` / `UMP_ERR_UNSUPPORTED` when there is no
/// such device or no GPU. Outputs are written only on success.
///
/// # Safety
/// `free` and `total` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_device_memory_info(
    device: c_int,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    status("ump_device_memory_info", || {
        if free.is_null() || total.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "free or total is NULL"));
        }
        let (f, t) = allocator::device_memory_info(device)?;
        // SAFETY: both checked non-NULL; the caller passes writable size_t's.
        unsafe {
            *free = f;
            *total = t;
        }
        Ok(())
    })
}

/// Tell ump-alloc that `stream` (a `cudaStream_t`) of `device` (-1: every device) is about to
/// be destroyed. Call it before `cudaStreamDestroy` for any stream blocks were allocated on
/// (`ump_alloc`'s CuPy integration does this for CuPy streams): ump-alloc records one last
/// event on it and never uses the handle again, so blocks freed later stay stream-ordered and
/// a new stream that gets the same handle starts afresh. Returns `UMP_OK` (also when ump-alloc
/// never saw the stream); `UMP_ERR_INVALID` for an unknown device (a negative number other than
/// -1, or one this machine does not have), also before the first allocation.
#[unsafe(no_mangle)]
pub extern "C" fn ump_stream_retire(device: c_int, stream: *mut c_void) -> c_int {
    status("ump_stream_retire", || {
        // The device is checked first, whether or not the allocator was initialised: -1 is
        // every device, any other negative number or a device past the machine's is refused.
        let count = allocator::caps().devices.len();
        if device < -1 || usize::try_from(device).is_ok_and(|d| d >= count) {
            return Err(Error::invalid(format!(
                "no CUDA device {device} (this machine has {count}; -1 means every device)"
            )));
        }
        let Some(a) = allocator::get() else {
            return Ok(());
        };
        for g in a.device_groups() {
            if device == -1 || g.device() == device {
                g.retire(stream as usize);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pointer::UMP_IDENTITY_VERSION;

    #[test]
    fn versioned_write_honours_size() {
        let mut id: ump_identity = unsafe { std::mem::zeroed() };
        id.size = 8;
        // SAFETY: valid struct.
        assert_eq!(unsafe { ump_identify(std::ptr::null(), &mut id) }, 0);
        assert_eq!(id.size, 8);
        assert_eq!(id.version, UMP_IDENTITY_VERSION);
        id.size = 4;
        // SAFETY: valid struct.
        assert_eq!(
            unsafe { ump_identify(std::ptr::null(), &mut id) },
            Status::UMP_ERR_INVALID as i32
        );
        // SAFETY: NULL out is checked.
        assert_eq!(
            unsafe { ump_identify(std::ptr::null(), std::ptr::null_mut()) },
            Status::UMP_ERR_NULL as i32
        );
    }

    #[test]
    fn capabilities_without_gpu() {
        let mut c: ump_capabilities = unsafe { std::mem::zeroed() };
        // SAFETY: valid struct, size 0 = current.
        assert_eq!(unsafe { ump_capabilities(&mut c) }, 0);
        assert_eq!(c.size as usize, std::mem::size_of::<ump_capabilities>());
        assert_eq!(c.version, UMP_CAPABILITIES_VERSION);
        if !c.cuda_available {
            assert_eq!(c.device_count, 0);
        }
    }
}
