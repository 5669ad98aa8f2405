//! What an address is: the one question `ump_identify` and the transfer rules ask, answered
//! in one place ([`Pointer::of`]): a live block of ours, memory our pools hold outside any
//! live block, memory the CUDA driver knows (another allocator's), or neither. Our pointers
//! are answered by the registry (lock-free, no driver call); only the rest asks the driver.
//!
//! Two answers are built on it: [`identify`] (`ump_identity`, for any address) and [`region`]
//! (what kind of memory a range is, for `access` and the transfer plan).

use crate::allocator;
use crate::backing::Kind;
use crate::error::{Error, Result};
use crate::pool::{self, BlockInfo, Pool};
use crate::prim::cuda::{self, PointerInfo};
use crate::prim::os;

/// What an address is.
#[derive(Clone, Copy, Debug)]
pub enum Pointer {
    /// In a live block of ours.
    Block(BlockInfo),
    /// In memory a pool of ours holds, outside every live block (cached, or freed).
    Pooled(&'static Pool),
    /// Memory the CUDA driver knows that is not a block of ours.
    Cuda(PointerInfo),
    /// None of these: host memory of another allocator, or nothing mapped at all.
    Other,
}

impl Pointer {
    /// Classify `ptr`: ours first, then the driver. A block is the bytes it was asked for
    /// (`[base, base + size)`; its base alone for an empty one): the rest of its slot or span
    /// is pool memory outside every block.
    pub fn of(ptr: usize) -> Pointer {
        // One registry lookup answers both: a live block, or pool memory outside one.
        match pool::entry_at(ptr) {
            Some(e) => match e.lookup(ptr) {
                Some(info) if ptr - info.base < info.size.max(1) => Pointer::Block(info),
                _ => Pointer::Pooled(e.pool()),
            },
            None => Pointer::foreign(ptr),
        }
    }

    /// What the driver knows of `ptr`, which is in no live block of ours. NULL is not asked
    /// (that would load the driver for nothing).
    fn foreign(ptr: usize) -> Pointer {
        if ptr == 0 {
            return Pointer::Other;
        }
        match cuda::pointer_info(ptr) {
            Some(pi) => Pointer::Cuda(pi),
            None => Pointer::Other,
        }
    }
}

/// Whether `ptr` is the start of a live block of ours (the registry only: never the driver).
pub fn is_block_start(ptr: usize) -> bool {
    pool::lookup(ptr).is_some_and(|info| info.base == ptr)
}

/// Version of `ump_identity`.
pub const UMP_IDENTITY_VERSION: u32 = 1;

/// What `ump_identify` knows of an address. Versioned like `ump_capabilities`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct ump_identity {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_IDENTITY_VERSION`.
    pub version: u32,
    /// The address lies in a live block of this library.
    pub ours: bool,
    /// The host may load and store this memory on this machine.
    pub host_accessible: bool,
    /// GPU kernels may load and store this memory on this machine (system memory only with
    /// HMM or ATS).
    pub device_accessible: bool,
    /// What kind of memory it is.
    pub kind: crate::backing::ump_kind,
    /// Device the memory belongs to or was made for; -1 for host memory.
    pub device: i32,
    /// Start of the block (ours) or of the driver's allocation (foreign CUDA); else 0.
    pub base: usize,
    /// Size of the block in bytes as requested (ours) or the driver's range size; else 0.
    pub block_size: usize,
}

/// Fill an identity for any address, ours or not.
pub fn identify(ptr: usize) -> ump_identity {
    // SAFETY: all-zero is a valid value of this plain-data struct (UMP_KIND_UNKNOWN is 0).
    let mut id: ump_identity = unsafe { std::mem::zeroed() };
    id.version = UMP_IDENTITY_VERSION;
    id.device = -1;
    // Memory of one of our pools, in a live block or not: the pool says what it is.
    let of_pool = |id: &mut ump_identity, p: &Pool| {
        let kind = p.kind();
        id.kind = kind;
        id.device = p.device();
        id.host_accessible = kind.host_accessible();
        id.device_accessible = allocator::get().is_some_and(|a| a.device_accessible(kind));
    };
    match Pointer::of(ptr) {
        Pointer::Block(info) => {
            of_pool(&mut id, info.pool);
            id.ours = true;
            id.base = info.base;
            id.block_size = info.size;
            // Pinned host memory waiting for the process's first use of a GPU: host memory
            // only, for now.
            if id.kind == Kind::UMP_KIND_REGISTERED && !crate::backing::pinned_at(ptr) {
                id.device_accessible = allocator::get()
                    .and_then(|a| a.gpu_if_chosen())
                    .is_some_and(|g| g.caps.pageable_everywhere());
            }
        }
        // Memory we hold in cache but that is not a live block.
        Pointer::Pooled(p) => of_pool(&mut id, p),
        Pointer::Cuda(pi) => {
            id.kind = Kind::UMP_KIND_FOREIGN_CUDA;
            id.device = pi.device;
            id.base = pi.range_start;
            id.block_size = pi.range_size;
            id.host_accessible = pi.host_accessible();
            id.device_accessible = true;
        }
        Pointer::Other if os::is_mapped(ptr) => {
            id.kind = Kind::UMP_KIND_FOREIGN_HOST;
            id.host_accessible = true;
            id.device_accessible = allocator::caps().pageable_everywhere();
        }
        Pointer::Other => {}
    }
    id
}

/// What kind of memory a range is, for the transfer rules and `access`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub kind: Kind,
    /// Device the memory belongs to (-1: host).
    pub device: i32,
    /// Managed memory (ours or foreign): it migrates, so prefetching pays.
    pub managed: bool,
    /// A block of ours (not foreign memory).
    pub ours: bool,
}

/// Classify `[ptr, ptr+size)`. Our blocks must contain the whole range. Memory our pools hold
/// outside a live block is nobody's block here: it is taken as the driver sees it.
pub fn region(ptr: usize, size: usize) -> Result<Region> {
    let end = ptr
        .checked_add(size)
        .ok_or_else(|| Error::invalid(format!("range {ptr:#x} + {size} overflows")))?;
    // A range that starts in a live block must end in it (the bytes it was asked for, as
    // `Pointer::of` counts them), whatever room its slot or span has after them.
    let found = match pool::entry_at(ptr) {
        Some(e) => e
            .lookup(ptr)
            .map_or_else(|| Pointer::foreign(ptr), Pointer::Block),
        None => Pointer::foreign(ptr),
    };
    match found {
        Pointer::Block(b) => {
            if end > b.base + b.size {
                return Err(Error::invalid(format!(
                    "range {ptr:#x} + {size} runs past the end of its block ({:#x} + {} bytes)",
                    b.base, b.size
                )));
            }
            let kind = match b.pool.kind() {
                // Not pinned yet (no GPU used in this process): plain host memory for now.
                Kind::UMP_KIND_REGISTERED if !crate::backing::pinned_at(ptr) => Kind::UMP_KIND_HOST,
                k => k,
            };
            Ok(Region {
                kind,
                device: b.pool.device(),
                managed: kind == Kind::UMP_KIND_MANAGED,
                ours: true,
            })
        }
        Pointer::Cuda(pi) => Ok(Region {
            kind: if pi.host_accessible() {
                Kind::UMP_KIND_FOREIGN_CUDA
            } else {
                Kind::UMP_KIND_DEVICE
            },
            device: pi.device,
            managed: pi.is_managed,
            ours: false,
        }),
        Pointer::Pooled(_) | Pointer::Other => Ok(Region {
            kind: Kind::UMP_KIND_FOREIGN_HOST,
            device: -1,
            managed: false,
            ours: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;

    #[test]
    fn identify_ours_foreign_and_null() {
        let p = crate::ffi::numpy::ump_malloc(3000) as usize;
        let id = identify(p + 1234);
        assert!(id.ours);
        assert_eq!(id.base, p);
        assert_eq!(id.block_size, 3000);
        assert!(id.host_accessible);
        crate::ffi::numpy::ump_free(p as *mut c_void, 3000);
        assert!(!identify(p).ours);
        let x = Box::new(5u64);
        let f = identify(&*x as *const u64 as usize);
        assert!(!f.ours);
        assert_eq!(f.kind, Kind::UMP_KIND_FOREIGN_HOST);
        assert!(f.host_accessible);
        assert_eq!(identify(0).kind, Kind::UMP_KIND_UNKNOWN);
    }
}
