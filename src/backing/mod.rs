//! Backings: the resources at the bottom of the stack, in RMM's sense. Each hands out large
//! granule-aligned chunks of one kind of memory; the pool above sub-allocates them.
//! Host backings call `prim::os`; CUDA backings call `prim::cuda`. No policy lives here.

use crate::error::{Error, Result};
use crate::prim::{cuda, os};
use crate::registry::GRANULE;
use std::ptr::NonNull;

pub mod registered;
pub mod shared;
pub mod vmm;
pub use registered::{
    RegisteredBacking, host_pinning_active, never_pin, pin_host_side, pinned, pinned_at,
    set_pinned_cap,
};
pub use vmm::{Space, VmmBacking};

/// What kind of memory a block is, as reported by `ump_identify`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ump_kind {
    /// Unknown: not ours, and neither CUDA nor the host page tables know it.
    #[default]
    UMP_KIND_UNKNOWN = 0,
    /// Ours: plain aligned host memory (modes `host` and `device`, NumPy side).
    UMP_KIND_HOST = 1,
    /// Ours: system-allocated memory that the GPU reads through HMM/ATS (mode `system`).
    UMP_KIND_SYSTEM = 2,
    /// Ours: CUDA managed memory (mode `managed`).
    UMP_KIND_MANAGED = 3,
    /// Ours: host memory registered with CUDA, mapped at the same address (mode `registered`).
    UMP_KIND_REGISTERED = 4,
    /// Ours: device memory from cuMemAlloc (mode `device`, GPU side).
    UMP_KIND_DEVICE = 5,
    /// Not ours, but known to CUDA (cudaMalloc, cudaMallocManaged, cudaHostAlloc, ...).
    UMP_KIND_FOREIGN_CUDA = 6,
    /// Not ours, ordinary host memory (malloc, stack, mmap) unknown to CUDA.
    UMP_KIND_FOREIGN_HOST = 7,
}

pub use ump_kind as Kind;

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::UMP_KIND_UNKNOWN => "unknown",
            Kind::UMP_KIND_HOST => "host",
            Kind::UMP_KIND_SYSTEM => "system",
            Kind::UMP_KIND_MANAGED => "managed",
            Kind::UMP_KIND_REGISTERED => "registered",
            Kind::UMP_KIND_DEVICE => "device",
            Kind::UMP_KIND_FOREIGN_CUDA => "foreign-cuda",
            Kind::UMP_KIND_FOREIGN_HOST => "foreign-host",
        }
    }

    /// Whether the host CPU can load and store this memory directly.
    pub fn host_accessible(self) -> bool {
        !matches!(self, Kind::UMP_KIND_DEVICE | Kind::UMP_KIND_UNKNOWN)
    }
}

/// One chunk handed out by a backing. `base` is granule-aligned and `size` a granule multiple;
/// `raw`/`raw_size` are what must be given back (they differ when the backing over-allocates to
/// reach granule alignment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub base: usize,
    pub size: usize,
    pub raw: usize,
    pub raw_size: usize,
    /// Huge-page advice was given for the whole chunk (pool bookkeeping).
    pub advised: bool,
}

impl Chunk {
    /// A chunk of `size` bytes at the start of a mapping of `raw_size` bytes at `base`, not
    /// advised yet: what a backing's `map` hands out when nothing is cut off for alignment.
    pub fn mapped(base: usize, size: usize, raw_size: usize) -> Chunk {
        Chunk {
            base,
            size,
            raw: base,
            raw_size,
            advised: false,
        }
    }
}

/// The pool's side of a chunk that changes size ([`Backing::grow`], [`Backing::shrink`]): its
/// registry entries, which must never name a range the OS has not granted, nor outlive one the
/// OS took back (another pool may map it at once and register its own blocks there).
pub trait RangeBook {
    /// The OS granted `[base, base+len)` to the chunk: make its registry entries ready (the one
    /// fallible step: leaves of the radix table are mapped). False: no memory for them.
    fn claim(&mut self, base: usize, len: usize) -> bool;
    /// `[base, base+len)` is about to go back to the OS (or the chunk's pages move away from
    /// it): clear its entries now.
    fn leave(&mut self, base: usize, len: usize);
    /// A range given up with [`leave`](Self::leave) stays after all (the change failed).
    fn stay(&mut self, base: usize, len: usize);
}

/// What [`Backing::grow`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// The chunk as it is now (its base may have moved).
    Grown(Chunk),
    /// Nothing changed.
    Refused,
    /// The chunk kept its size, place and bytes, but is no longer the backing's kind of memory
    /// (pinned memory whose registration could not be restored): the pool hands out none of
    /// it again and gives it back as soon as its block is freed.
    Degraded,
}

/// A source of chunks.
pub trait Backing: Send + Sync {
    /// The kind of every block carved from this backing.
    fn kind(&self) -> Kind;
    /// The device the memory is made for, or -1 for host-side pools.
    fn device(&self) -> i32;
    /// Obtain a chunk of exactly `size` usable bytes (a granule multiple), granule-aligned.
    fn map(&self, size: usize) -> Result<Chunk>;
    /// Give a chunk back.
    ///
    /// # Safety
    /// `chunk` came from `map` on this backing and no block in it is used any more.
    unsafe fn unmap(&self, chunk: &Chunk);
    /// Whether fresh chunks read as zero (calloc may then skip clearing them). Asked at each
    /// allocation of a never-used span: the answer may change (a fork child).
    fn fresh_is_zero(&self) -> bool {
        false
    }
    /// Whether the pages are shared with `fork()` children rather than copied into them (see
    /// `shared`): the pool then holds back freed blocks a child may still read.
    fn fork_shared(&self) -> bool {
        false
    }
    /// Per-block advice when a block of `size` bytes is first handed out at `ptr`
    /// (huge pages for host memory). Advisory.
    fn advise_block(&self, _ptr: usize, _size: usize) {}
    /// Advice for a new arena, a chunk that small blocks share (small pages for host memory,
    /// until a block of [`HUGEPAGE_MIN`] or more lands in it: then `advise_block`). Advisory.
    fn advise_arena(&self, _ptr: usize, _size: usize) {}
    /// The length of the chunk a request of `len` bytes (a granule multiple) is cut from:
    /// an arena small blocks share, or a chunk of its own for a large request.
    fn chunk_len(&self, len: usize) -> usize {
        if len >= ARENA / 2 { len } else { ARENA }
    }

    // ---- growth in place (realloc) --------------------------------------------------------

    /// Grow `chunk` to `size` bytes keeping its contents, without copying: in place, or by
    /// moving its pages to a new address (`mremap`). The registry follows through `book`: a
    /// range is claimed only once the OS has granted it (when the claim fails the backing
    /// undoes the growth), and a range the chunk gives up is left before the OS takes it back
    /// (and stays after all if the growth then fails). Returns the chunk as it is now (`base`
    /// may differ), [`Growth::Refused`] when nothing changed, or [`Growth::Degraded`].
    ///
    /// # Safety
    /// `chunk` came from `map` on this backing and holds one live block, which nothing
    /// touches during the call; when the base moves, its old addresses are gone.
    unsafe fn grow(&self, _chunk: &Chunk, _size: usize, _book: &mut dyn RangeBook) -> Growth {
        Growth::Refused
    }

    /// Shrink `chunk` to `size` bytes in place, giving the rest back (left in `book` first).
    /// Returns the chunk as it is now, or None when the backing keeps it whole (then nothing
    /// was left).
    ///
    /// # Safety
    /// `chunk` came from `map` on this backing and nothing uses its bytes past `size`.
    unsafe fn shrink(
        &self,
        _chunk: &Chunk,
        _size: usize,
        _book: &mut dyn RangeBook,
    ) -> Option<Chunk> {
        None
    }

    // ---- lazily committed backings (virtual memory, `vmm`) --------------------------------

    /// For backings whose chunks are address space only: the unit physical memory is
    /// committed in. None (the default): a chunk is wholly backed when mapped.
    fn commit_page(&self) -> Option<usize> {
        None
    }
    /// Bytes that [`commit`](Self::commit) of `[addr, addr+len)` would add.
    fn uncommitted(&self, _addr: usize, _len: usize) -> usize {
        0
    }
    /// Back every page of `[addr, addr+len)` (inside a chunk) that has no physical memory.
    /// Returns the bytes committed; on failure nothing changed.
    fn commit(&self, _addr: usize, _len: usize) -> Result<usize> {
        Ok(0)
    }
    /// Give back the physical memory of every piece wholly inside `[addr, addr+len)`.
    /// Returns the bytes given back.
    ///
    /// # Safety
    /// No live block overlaps the range and no queued work touches it.
    unsafe fn decommit(&self, _addr: usize, _len: usize) -> usize {
        0
    }
    /// Bytes of `[addr, addr+len)` backed by physical memory (all of it, by default).
    fn committed(&self, _addr: usize, len: usize) -> usize {
        len
    }
    /// Bytes of physical memory `chunk` holds now (all of it, by default).
    fn physical(&self, chunk: &Chunk) -> usize {
        chunk.size
    }
    /// The longest backed run inside `[addr, addr+len)`.
    fn longest_committed(&self, _addr: usize, len: usize) -> usize {
        len
    }
    /// Fork: take the backing's own lock, if it has one (after every pool lock), and hand
    /// over its guard to hold until the fork is over.
    fn fork_lock(&self) -> Option<Box<dyn std::any::Any>> {
        None
    }

    /// Give the physical pages of free range `[addr, addr+len)` (whole pages, inside a chunk)
    /// back to the OS, keeping the addresses: they read zero when touched again. Returns
    /// whether it was done; false (the default) where pages must stay: pinned, shared or
    /// device memory, and memory a GPU reads (`system`).
    ///
    /// # Safety
    /// No live block overlaps the range.
    unsafe fn discard_free(&self, _addr: usize, _len: usize) -> bool {
        false
    }
}

/// Default size of a chunk that pools cut blocks from (an arena small blocks share). Requests
/// of half of it or more get a chunk of their own.
pub(crate) const ARENA: usize = 64 << 20;

/// Blocks of at least this size get transparent huge pages on host-memory backings, as NumPy's
/// default allocator does.
pub(crate) const HUGEPAGE_MIN: usize = 4 << 20;

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

/// Obtain `size` granule-aligned bytes from a driver allocator that aligns as it likes: ask for
/// exactly `size` first (large driver allocations come 2 MiB-aligned), and only when that is
/// not granule-aligned, ask again for `size + GRANULE` and align inside it.
fn aligned_driver_chunk(
    size: usize,
    alloc: impl Fn(usize) -> Result<usize>,
    free: impl Fn(usize),
) -> Result<Chunk> {
    let raw = alloc(size)?;
    if raw % GRANULE == 0 {
        return Ok(Chunk::mapped(raw, size, size));
    }
    free(raw);
    let raw_size = size + GRANULE;
    let raw = alloc(raw_size)?;
    Ok(Chunk {
        base: raw.next_multiple_of(GRANULE),
        size,
        raw,
        raw_size,
        advised: false,
    })
}

/// CUDA managed memory (mode `managed`). Device pools advise their chunks to prefer the
/// device and prefetch them there once, so kernels start at full speed; the host pool leaves
/// placement to the driver's fault-driven migration.
///
/// With a headroom (RMM's SamHeadroomMemoryResource), a device chunk prefers the device only
/// up to the device's free memory minus the headroom; the rest of it prefers host memory and
/// is mapped for the device, so kernels reach it over the bus and the headroom stays free.
///
/// Without a headroom, a device chunk larger than the device's free memory is refused as out
/// of memory unless `oversubscribe` (`UMP_ALLOC_OVERSUBSCRIBE`): the driver would page it,
/// and asking a GPU for far more managed memory than it has can thrash or hang it. A refusal
/// lets the pool give back what it caches and try again, and then PyTorch empty its cache and
/// raise `torch.OutOfMemoryError`, as with device memory.
pub struct ManagedBacking {
    device: i32,
    headroom: usize,
    oversubscribe: bool,
}

impl ManagedBacking {
    pub fn new(device: i32, headroom: usize, oversubscribe: bool) -> Self {
        ManagedBacking {
            device,
            headroom,
            oversubscribe,
        }
    }

    /// Bytes at the front of a new chunk of `size` bytes that may live on the device.
    fn device_portion(&self, size: usize) -> usize {
        if self.headroom == 0 {
            return size;
        }
        let free = cuda::mem_info(self.device).map_or(0, |(free, _)| free);
        let room = free.saturating_sub(self.headroom);
        if room >= size {
            size
        } else {
            room & !(HEADROOM_ALIGN - 1)
        }
    }
}

/// Refuse a managed chunk of `size` bytes for device `dev` that has `free` bytes free.
fn fits_device(size: usize, free: usize, dev: i32) -> Result<()> {
    if size <= free {
        return Ok(());
    }
    Err(Error::oom(format!(
        "device {dev} has {} MiB free, {} MiB of managed memory asked: more would oversubscribe \
         the GPU (UMP_ALLOC_OVERSUBSCRIBE=1 allows it; the driver then pages to the host)",
        free >> 20,
        size.div_ceil(1 << 20)
    )))
}

/// Granularity of the device/host split of a chunk under a headroom (a large page).
const HEADROOM_ALIGN: usize = 2 << 20;

impl Backing for ManagedBacking {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_MANAGED
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let dev = self.device;
        if dev >= 0 && self.headroom == 0 && !self.oversubscribe {
            let (free, _) = cuda::mem_info(dev)?;
            fits_device(size, free, dev)?;
        }
        let chunk = aligned_driver_chunk(
            size,
            |n| cuda::alloc_managed(n, dev),
            |p| {
                // SAFETY: just allocated above and never handed out.
                let _ = unsafe { cuda::free(p, dev) };
            },
        )?;
        if dev >= 0 {
            // Placement is advice: failures leave correct (if slower) memory.
            let on_dev = self.device_portion(chunk.raw_size);
            let _ = cuda::advise_accessed_by(chunk.raw, chunk.raw_size, dev);
            if on_dev > 0 {
                let _ = cuda::advise_preferred(chunk.raw, on_dev, dev);
                let _ = cuda::prefetch(chunk.raw, on_dev, dev, 0, dev);
            }
            if on_dev < chunk.raw_size {
                let _ = cuda::advise_preferred(chunk.raw + on_dev, chunk.raw_size - on_dev, -1);
            }
        }
        Ok(chunk)
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        // SAFETY: forwarded from the caller's contract.
        let _ = unsafe { cuda::free(chunk.raw, self.device) };
    }
}

/// Plain device memory (mode `device`, GPU side): the "UMP off" baseline.
pub struct DeviceBacking {
    device: i32,
}

impl DeviceBacking {
    pub fn new(device: i32) -> Self {
        DeviceBacking { device }
    }
}

impl Backing for DeviceBacking {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_DEVICE
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let dev = self.device;
        aligned_driver_chunk(
            size,
            |n| cuda::alloc_device(n, dev),
            |p| {
                // SAFETY: just allocated above and never handed out.
                let _ = unsafe { cuda::free(p, dev) };
            },
        )
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        // SAFETY: forwarded from the caller's contract.
        let _ = unsafe { cuda::free(chunk.raw, self.device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_chunks_past_free_device_memory_are_out_of_memory() {
        assert!(fits_device(64 << 20, 64 << 20, 0).is_ok());
        let e = fits_device((64 << 20) + 1, 64 << 20, 1).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_OOM);
        assert!(
            e.msg.contains("device 1")
                && e.msg.contains("64 MiB free")
                && e.msg.contains("UMP_ALLOC_OVERSUBSCRIBE=1"),
            "{}",
            e.msg
        );
    }
}
