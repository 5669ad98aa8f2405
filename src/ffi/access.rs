//! Host and device access, and the transfer plan: the C side of `access` (stream-synchronised
//! views of memory both processors reach) and `transfer` (when a DMA copy is faster than a
//! view). Shared by every consumer.

use super::status;
use super::{versioned_len, write_versioned};
use crate::error::{Error, Result, Status};
use crate::transfer::{self, Direction, Facts, Memory, Move, Path, Plan, Resident};
use std::ffi::{c_char, c_int, c_void};

/// Version of `ump_transfer_facts` and `ump_transfer_plan`.
pub const UMP_TRANSFER_VERSION: u32 = 1;

/// Which way a transfer goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ump_direction {
    /// To the host: a host view or copy of GPU data (`asnumpy`, `ump_host_access`).
    UMP_TO_HOST = 0,
    /// To a device: a GPU view or copy of host data (`asarray`, `ump_device_access`).
    UMP_TO_DEVICE = 1,
}

/// The memory a transfer's data is in.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ump_memory {
    /// Host memory a GPU reaches only with HMM/ATS (malloc, NumPy's allocator, kinds host and
    /// system).
    UMP_MEMORY_PAGEABLE = 0,
    /// Page-locked host memory mapped for the GPU (kind registered, cudaHostAlloc).
    UMP_MEMORY_PINNED = 1,
    /// CUDA managed memory: its pages migrate.
    UMP_MEMORY_MANAGED = 2,
    /// Device memory: the host cannot reach it.
    UMP_MEMORY_DEVICE = 3,
}

/// Where a transfer's data is resident, as far as known.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ump_resident {
    /// Not known: taken to be the side the data comes from.
    UMP_RESIDENT_UNKNOWN = 0,
    /// In host memory.
    UMP_RESIDENT_HOST = 1,
    /// In device memory.
    UMP_RESIDENT_DEVICE = 2,
}

/// The two ways to hand data to the other side.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ump_path {
    /// The same memory, after a stream synchronisation (to the host) or a stream-ordered
    /// prefetch (to a device).
    UMP_PATH_VIEW = 0,
    /// A stream-ordered DMA copy into the other side's memory.
    UMP_PATH_COPY = 1,
}

/// What a view does to managed pages.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ump_move {
    /// Nothing: the pages the reader touches fault over (or the memory does not migrate).
    UMP_MOVE_NONE = 0,
    /// A prefetch in the stream's order.
    UMP_MOVE_PREFETCH = 1,
    /// To the host, after the stream's work: migrated in the background while the host reads.
    UMP_MOVE_BACKGROUND = 2,
}

/// What is known about a transfer: `ump_plan_transfer` fills it for an address,
/// `ump_decide_transfer` takes it from the caller. Versioned: set `size` to
/// `sizeof(struct ump_transfer_facts)` (0 means "the current size").
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ump_transfer_facts {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_TRANSFER_VERSION`.
    pub version: u32,
    /// An `enum ump_direction`.
    pub direction: i32,
    /// An `enum ump_memory`.
    pub memory: i32,
    /// An `enum ump_resident`.
    pub resident: i32,
    /// 1: the machine is coherent (the GPU reads pageable memory: HMM or ATS); 0: not.
    pub coherent: i32,
    /// Bytes the transfer covers.
    pub bytes: u64,
    /// Bytes the reader will touch, as a fraction of `bytes` (1: all of it once; 0.01: a
    /// hundredth; 3: three passes). Finite, 0 or more.
    pub touch: f64,
}

/// The faster of a view and a copy, and why (`ump_plan_transfer`, `ump_decide_transfer`).
/// Versioned like `ump_transfer_facts`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct ump_transfer_plan {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_TRANSFER_VERSION`.
    pub version: u32,
    /// The faster path.
    pub path: ump_path,
    /// What a view does to managed pages (when a view is made, chosen or asked for).
    pub view_move: ump_move,
    /// Whether a view is possible at all; when false a copy is the only way.
    pub view_possible: bool,
    /// Why, NUL-terminated.
    pub reason: [c_char; 192],
}

fn direction_of(d: c_int) -> Result<Direction> {
    match d {
        0 => Ok(Direction::ToHost),
        1 => Ok(Direction::ToDevice),
        _ => Err(Error::invalid(format!(
            "direction {d} is neither UMP_TO_HOST (0) nor UMP_TO_DEVICE (1)"
        ))),
    }
}

fn facts_to_c(f: &Facts) -> ump_transfer_facts {
    ump_transfer_facts {
        size: 0,
        version: UMP_TRANSFER_VERSION,
        direction: match f.direction {
            Direction::ToHost => ump_direction::UMP_TO_HOST,
            Direction::ToDevice => ump_direction::UMP_TO_DEVICE,
        } as i32,
        memory: match f.memory {
            Memory::Pageable => ump_memory::UMP_MEMORY_PAGEABLE,
            Memory::Pinned => ump_memory::UMP_MEMORY_PINNED,
            Memory::Managed => ump_memory::UMP_MEMORY_MANAGED,
            Memory::Device => ump_memory::UMP_MEMORY_DEVICE,
        } as i32,
        resident: match f.resident {
            Resident::Unknown => ump_resident::UMP_RESIDENT_UNKNOWN,
            Resident::Host => ump_resident::UMP_RESIDENT_HOST,
            Resident::Device => ump_resident::UMP_RESIDENT_DEVICE,
        } as i32,
        coherent: i32::from(f.coherent),
        bytes: f.bytes as u64,
        touch: f.touch,
    }
}

fn facts_from_c(c: &ump_transfer_facts) -> Result<Facts> {
    let memory = match c.memory {
        0 => Memory::Pageable,
        1 => Memory::Pinned,
        2 => Memory::Managed,
        3 => Memory::Device,
        m => {
            return Err(Error::invalid(format!(
                "memory {m} is not an enum ump_memory"
            )));
        }
    };
    let resident = match c.resident {
        0 => Resident::Unknown,
        1 => Resident::Host,
        2 => Resident::Device,
        r => {
            return Err(Error::invalid(format!(
                "resident {r} is not an enum ump_resident"
            )));
        }
    };
    let coherent = match c.coherent {
        0 => false,
        1 => true,
        x => return Err(Error::invalid(format!("coherent {x} is neither 0 nor 1"))),
    };
    let bytes = usize::try_from(c.bytes)
        .map_err(|_| Error::invalid(format!("bytes {} does not fit this machine", c.bytes)))?;
    transfer::check_touch(c.touch)?;
    Ok(Facts {
        direction: direction_of(c.direction)?,
        memory,
        resident,
        coherent,
        bytes,
        touch: c.touch,
    })
}

fn plan_to_c(p: &Plan) -> ump_transfer_plan {
    let mut reason = [0 as c_char; 192];
    super::copy_cstr(&mut reason, p.reason);
    ump_transfer_plan {
        size: 0,
        version: UMP_TRANSFER_VERSION,
        path: match p.path {
            Path::View => ump_path::UMP_PATH_VIEW,
            Path::Copy => ump_path::UMP_PATH_COPY,
        },
        view_move: match p.view_move {
            Move::None => ump_move::UMP_MOVE_NONE,
            Move::Prefetch => ump_move::UMP_MOVE_PREFETCH,
            Move::Background => ump_move::UMP_MOVE_BACKGROUND,
        },
        view_possible: p.view_possible,
        reason,
    }
}

/// Plan the transfer of `[ptr, ptr+size)` in `direction` (an `enum ump_direction`): whether a
/// view of the same memory or a stream-ordered DMA copy into the other side's memory is faster
/// for a reader that touches `touch` of it (a fraction: 1 reads all of it once; 0.01 a
/// hundredth; more than 1, several passes). `device`: the GPU that reads it (to a device), or
/// that the data comes from when the memory does not say (to the host; -1: the memory's own).
/// Fills `*plan`, and `*facts` (what the plan was made from) unless `facts` is NULL. Decides
/// only; `ump_host_access_ex` / `ump_device_access_ex` make a view, the caller makes a copy.
/// Returns `UMP_OK`; `UMP_ERR_NULL` (`plan` NULL, or `ptr` NULL with a size);
/// `UMP_ERR_INVALID` for a bad direction or touch, or a range past the end of its block.
/// Outputs are written only on success.
///
/// # Safety
/// `plan` is NULL or points to a writable `ump_transfer_plan` whose `size` field is set; so is
/// `facts` (a `ump_transfer_facts`), or it is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_plan_transfer(
    ptr: *const c_void,
    size: usize,
    direction: c_int,
    device: c_int,
    touch: f64,
    facts: *mut ump_transfer_facts,
    plan: *mut ump_transfer_plan,
) -> c_int {
    status("ump_plan_transfer", || {
        if plan.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "plan is NULL"));
        }
        if ptr.is_null() && size > 0 {
            return Err(Error::new(Status::UMP_ERR_NULL, "ptr is NULL"));
        }
        let (f, p) = transfer::plan(ptr as usize, size, direction_of(direction)?, device, touch)?;
        // Both sizes are checked before either struct is written.
        // SAFETY: non-NULL; the caller provides `size` bytes.
        unsafe { versioned_len(plan) }?;
        if !facts.is_null() {
            // SAFETY: non-NULL; the caller provides `size` bytes.
            unsafe { versioned_len(facts) }?;
            // SAFETY: as above.
            unsafe { write_versioned(facts, facts_to_c(&f)) }?;
        }
        // SAFETY: non-NULL; the caller provides `size` bytes.
        unsafe { write_versioned(plan, plan_to_c(&p)) }
    })
}

/// The decision of `ump_plan_transfer` for facts the caller gives (`*facts`, every field set;
/// `size` 0 or the whole struct): a pure function, for tools and tests, and to see what
/// another machine kind would do (`coherent`). Returns `UMP_OK`; `UMP_ERR_NULL`;
/// `UMP_ERR_INVALID` for a value outside its enum, a `touch` that is not a finite fraction of
/// 0 or more, or a struct too small. `*plan` is written only on success.
///
/// # Safety
/// `facts` is NULL or points to a readable `ump_transfer_facts`; `plan` is NULL or points to a
/// writable `ump_transfer_plan` whose `size` field is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_decide_transfer(
    facts: *const ump_transfer_facts,
    plan: *mut ump_transfer_plan,
) -> c_int {
    status("ump_decide_transfer", || {
        if facts.is_null() || plan.is_null() {
            return Err(Error::new(Status::UMP_ERR_NULL, "facts or plan is NULL"));
        }
        // SAFETY: non-NULL; readable for its first u32 by the contract.
        let n = unsafe { versioned_len(facts) }?;
        if n < size_of::<ump_transfer_facts>() {
            return Err(Error::invalid(format!(
                "facts.size {n} is smaller than struct ump_transfer_facts ({})",
                size_of::<ump_transfer_facts>()
            )));
        }
        // SAFETY: the whole struct is readable (checked above); every field is plain data
        // valid for any bit pattern.
        let c = unsafe { facts.read_unaligned() };
        let p = transfer::decide(&facts_from_c(&c)?, transfer::prefetch_min());
        // SAFETY: non-NULL; the caller provides `size` bytes.
        unsafe { write_versioned(plan, plan_to_c(&p)) }
    })
}

/// Make `[ptr, ptr+size)` safe for the host to read and write, with no copy: wait for the work
/// queued on `stream` (a `CUstream`/`cudaStream_t`; NULL is the legacy default stream). Managed
/// ranges are moved as `ump_plan_transfer`'s `view_move` says for a reader of all of them:
/// from `UMP_ALLOC_PREFETCH_MIN` bytes prefetched to the host before the wait, from 8 MiB
/// migrated in the background after it while the host reads. Without a GPU it only
/// validates. Returns `UMP_OK`; `UMP_ERR_INVALID` for device-only memory or a range past its
/// block; `UMP_ERR_NULL`; `UMP_ERR_CUDA`.
#[unsafe(no_mangle)]
pub extern "C" fn ump_host_access(ptr: *const c_void, size: usize, stream: *mut c_void) -> c_int {
    status("ump_host_access", || {
        crate::access::host_access(ptr as usize, size, stream as usize, 1.0)
    })
}

/// `ump_host_access` for a host that will touch `touch` of the range (a fraction, as in
/// `ump_plan_transfer`): a sparse reader's managed pages are not migrated (the ones it touches
/// fault over). `UMP_ERR_INVALID` also for a `touch` that is not a finite number, 0 or more.
#[unsafe(no_mangle)]
pub extern "C" fn ump_host_access_ex(
    ptr: *const c_void,
    size: usize,
    stream: *mut c_void,
    touch: f64,
) -> c_int {
    status("ump_host_access_ex", || {
        crate::access::host_access(ptr as usize, size, stream as usize, touch)
    })
}

/// Make `[ptr, ptr+size)` ready for kernels on `device` queued on `stream`, in stream order and
/// with no host wait: managed ranges are prefetched to the device. Host writes made before the
/// call are seen by kernels queued after it. Returns `UMP_OK`; `UMP_ERR_INVALID` for memory
/// the device cannot reach on this machine; `UMP_ERR_UNSUPPORTED` without a GPU.
#[unsafe(no_mangle)]
pub extern "C" fn ump_device_access(
    ptr: *const c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    status("ump_device_access", || {
        crate::access::device_access(ptr as usize, size, device, stream as usize, 1.0)
    })
}

/// `ump_device_access` for kernels that will touch `touch` of the range (a fraction, as in
/// `ump_plan_transfer`): managed ranges they touch little of are not prefetched (the pages
/// they touch fault over). `UMP_ERR_INVALID` also for a `touch` that is not a finite number,
/// 0 or more.
#[unsafe(no_mangle)]
pub extern "C" fn ump_device_access_ex(
    ptr: *const c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
    touch: f64,
) -> c_int {
    status("ump_device_access_ex", || {
        crate::access::device_access(ptr as usize, size, device, stream as usize, touch)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c_facts(direction: i32, memory: i32, resident: i32, touch: f64) -> ump_transfer_facts {
        ump_transfer_facts {
            size: 0,
            version: 0,
            direction,
            memory,
            resident,
            coherent: 0,
            bytes: 1 << 30,
            touch,
        }
    }

    fn decide(f: &ump_transfer_facts) -> (c_int, ump_transfer_plan) {
        // SAFETY: all-zero is a valid plan (enum values 0 exist).
        let mut p: ump_transfer_plan = unsafe { std::mem::zeroed() };
        // SAFETY: valid structs.
        let rc = unsafe { ump_decide_transfer(f, &mut p) };
        (rc, p)
    }

    #[test]
    fn decide_through_the_c_structs() {
        let (rc, p) = decide(&c_facts(0, 2, 2, 1.0));
        assert_eq!(rc, 0);
        assert_eq!(p.path, ump_path::UMP_PATH_COPY);
        assert_eq!(p.view_move, ump_move::UMP_MOVE_BACKGROUND);
        assert!(p.view_possible);
        assert_eq!(p.size as usize, size_of::<ump_transfer_plan>());
        assert_eq!(p.version, UMP_TRANSFER_VERSION);
        // SAFETY: NUL-terminated by copy_cstr.
        let why = unsafe { std::ffi::CStr::from_ptr(p.reason.as_ptr()) };
        assert!(why.to_str().unwrap().contains("DMA copy"), "{why:?}");
        let (_, v) = decide(&c_facts(0, 2, 2, 0.01));
        assert_eq!(
            (v.path, v.view_move),
            (ump_path::UMP_PATH_VIEW, ump_move::UMP_MOVE_NONE)
        );
    }

    #[test]
    fn decide_refuses_bad_facts_and_writes_nothing() {
        for bad in [
            c_facts(2, 0, 0, 1.0),
            c_facts(0, 4, 0, 1.0),
            c_facts(0, 0, -1, 1.0),
            c_facts(0, 0, 0, f64::NAN),
            c_facts(0, 0, 0, -1.0),
            ump_transfer_facts {
                coherent: 2,
                ..c_facts(0, 0, 0, 1.0)
            },
            ump_transfer_facts {
                size: 16,
                ..c_facts(0, 0, 0, 1.0)
            },
        ] {
            // SAFETY: all-zero is a valid plan.
            let mut p: ump_transfer_plan = unsafe { std::mem::zeroed() };
            p.size = 12345;
            // SAFETY: valid structs.
            let rc = unsafe { ump_decide_transfer(&bad, &mut p) };
            assert_eq!(rc, Status::UMP_ERR_INVALID as c_int, "{bad:?}");
            assert_eq!(p.size, 12345, "nothing written on failure");
        }
        // SAFETY: NULLs are checked.
        let rc = unsafe { ump_decide_transfer(std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(rc, Status::UMP_ERR_NULL as c_int);
    }

    #[test]
    fn plan_of_host_memory_and_bad_arguments() {
        let v = vec![7u8; 1 << 16];
        // SAFETY: all-zero is valid for both.
        let (mut f, mut p): (ump_transfer_facts, ump_transfer_plan) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let ptr = v.as_ptr().cast();
        // SAFETY: valid structs.
        let rc = unsafe { ump_plan_transfer(ptr, v.len(), 0, -1, 1.0, &mut f, &mut p) };
        assert_eq!(rc, 0);
        assert_eq!(p.path, ump_path::UMP_PATH_VIEW);
        assert_eq!(
            (f.direction, f.memory, f.bytes),
            (0, 0, v.len() as u64),
            "{f:?}"
        );
        // SAFETY: valid structs; NULL facts is allowed.
        let rc =
            unsafe { ump_plan_transfer(ptr, v.len(), 1, 0, 1.0, std::ptr::null_mut(), &mut p) };
        assert_eq!(rc, 0);
        if !crate::allocator::caps().pageable_everywhere() {
            assert_eq!(p.path, ump_path::UMP_PATH_COPY);
            assert!(!p.view_possible);
        }
        for (dir, touch) in [(5, 1.0), (0, f64::NAN)] {
            // SAFETY: valid structs.
            let rc = unsafe { ump_plan_transfer(ptr, v.len(), dir, 0, touch, &mut f, &mut p) };
            assert_eq!(rc, Status::UMP_ERR_INVALID as c_int);
        }
        // SAFETY: NULL plan and NULL ptr are checked.
        unsafe {
            assert_eq!(
                ump_plan_transfer(ptr, 1, 0, 0, 1.0, &mut f, std::ptr::null_mut()),
                Status::UMP_ERR_NULL as c_int
            );
            assert_eq!(
                ump_plan_transfer(std::ptr::null(), 1, 0, 0, 1.0, &mut f, &mut p),
                Status::UMP_ERR_NULL as c_int
            );
        }
        assert_eq!(
            ump_host_access_ex(ptr, v.len(), std::ptr::null_mut(), -2.0),
            Status::UMP_ERR_INVALID as c_int
        );
        assert_eq!(
            ump_host_access_ex(ptr, v.len(), std::ptr::null_mut(), 0.01),
            0
        );
    }
}
