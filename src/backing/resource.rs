//! The resource contract every backing fulfils (`Backing`), the chunks it hands out, the kinds
//! of memory, and the sizes the pools cut chunks by.

use crate::error::Result;

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
