//! Plain host memory from anonymous mappings: the backing of mode `host` and of mode `system`.

use super::resource::{Backing, Chunk, Growth, HUGEPAGE_MIN, Kind, RangeBook};
use crate::error::{Error, Result};
use crate::prim::os;
use crate::registry::GRANULE;
use std::ptr::NonNull;

/// Plain host memory from anonymous mappings: mode `host`, the NumPy side of mode `device`,
/// and (with kind `system`) mode `system`, where the GPU reads it through HMM/ATS.
pub struct HostBacking {
    kind: Kind,
    device: i32,
}

impl HostBacking {
    pub fn new(kind: Kind) -> Self {
        Self::for_device(kind, -1)
    }
    /// Host memory handed to a GPU library for `device` (mode `system`).
    pub fn for_device(kind: Kind, device: i32) -> Self {
        debug_assert!(matches!(kind, Kind::UMP_KIND_HOST | Kind::UMP_KIND_SYSTEM));
        HostBacking { kind, device }
    }
}

impl Backing for HostBacking {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let p = os::map_aligned(size, GRANULE)
            .ok_or_else(|| Error::oom(format!("the OS refused a mapping of {size} bytes")))?;
        let base = p.as_ptr() as usize;
        Ok(Chunk::mapped(base, size, size))
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        if let Some(p) = NonNull::new(chunk.raw as *mut u8) {
            // SAFETY: forwarded from the caller's contract.
            unsafe { os::unmap(p, chunk.raw_size) };
        }
    }
    fn fresh_is_zero(&self) -> bool {
        true
    }
    fn advise_block(&self, ptr: usize, size: usize) {
        if size >= HUGEPAGE_MIN {
            os::advise_hugepage(ptr as *mut u8, size);
        }
    }
    fn advise_arena(&self, ptr: usize, size: usize) {
        // As glibc's heap: under THP `always`, slabs of small blocks fault 4 KiB at a time
        // (2 MiB faults made a loop of 2,000,000 small arrays 1.10x slower than NumPy's default
        // on the CPU box, zeroing pages no block used yet). Under `madvise`, a no-op. Not for
        // `system` memory, which GPUs read through HMM/ATS: unmeasured there, left as it was.
        if self.kind == Kind::UMP_KIND_HOST {
            os::advise_nohugepage(ptr as *mut u8, size);
        }
    }
    unsafe fn discard_free(&self, addr: usize, len: usize) -> bool {
        // Private anonymous memory only the host reads: a fork child keeps its own copy.
        self.kind == Kind::UMP_KIND_HOST && os::discard(addr as *mut u8, len)
    }
    unsafe fn shrink(&self, chunk: &Chunk, size: usize, book: &mut dyn RangeBook) -> Option<Chunk> {
        if chunk.raw != chunk.base || chunk.raw_size != chunk.size || size >= chunk.size {
            return None;
        }
        let tail = NonNull::new((chunk.base + size) as *mut u8)?;
        book.leave(chunk.base + size, chunk.size - size);
        // SAFETY: the end of a whole mapping of ours, unused (the caller's contract), and no
        // longer registered.
        unsafe { os::unmap(tail, chunk.size - size) };
        Some(Chunk {
            size,
            raw_size: size,
            ..*chunk
        })
    }
    /// In place when the address space after the chunk is free, else the pages move to a new
    /// range (glibc's realloc does the same for its large blocks): never a copy. The new range
    /// is a fresh mapping of the new size first, so the OS says whether it grants that much
    /// memory (as it does for `ump_malloc` of the same size) before anything is registered.
    unsafe fn grow(&self, chunk: &Chunk, size: usize, book: &mut dyn RangeBook) -> Growth {
        if chunk.raw != chunk.base || chunk.raw_size != chunk.size || size <= chunk.size {
            return Growth::Refused;
        }
        let Some(old) = NonNull::new(chunk.base as *mut u8) else {
            return Growth::Refused;
        };
        let grown = |base: usize| {
            self.advise_block(base, size);
            Growth::Grown(Chunk {
                base,
                size,
                raw: base,
                raw_size: size,
                advised: size >= HUGEPAGE_MIN,
            })
        };
        // SAFETY: the chunk is a whole mapping of ours (map_aligned); forwarded contract.
        if unsafe { os::remap_in_place(old, chunk.size, size) } {
            if book.claim(chunk.base, size) {
                return grown(chunk.base);
            }
            let ext = NonNull::new((chunk.base + chunk.size) as *mut u8).expect("past a mapping");
            // SAFETY: the growth just made, unused and unregistered.
            unsafe { os::unmap(ext, size - chunk.size) };
            return Growth::Refused;
        }
        let Some(dest) = os::map_aligned(size, GRANULE) else {
            return Growth::Refused;
        };
        let at = dest.as_ptr() as usize;
        if !book.claim(at, size) {
            // SAFETY: the mapping made above, unused.
            unsafe { os::unmap(dest, size) };
            return Growth::Refused;
        }
        book.leave(chunk.base, chunk.size);
        // SAFETY: `dest` is a mapping of ours that the move replaces; on success the old range
        // is gone, which the caller's contract allows.
        if unsafe { os::remap_into(old, chunk.size, size, dest) } {
            return grown(at);
        }
        book.stay(chunk.base, chunk.size);
        // SAFETY: the destination made above; the block stayed in the old range.
        unsafe { os::release_after_failed_remap(dest, size) };
        Growth::Refused
    }
}
