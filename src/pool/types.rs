//! The pool's data model, in one file as mimalloc keeps its `types.h`: the pool itself, the
//! descriptors the registry points to (a [`Span`], a [`Slab`]: each points back to its pool),
//! the books under the pool's locks ([`Large`], [`ClassState`]), and what a pool asks of the
//! layer above it ([`Group`]; the [`Fence`]s it returns are the parts' vocabulary). The data is recursive (a pool holds the books that
//! hold its descriptors, which point back to it), so it is defined here together; what is done
//! with it is in the files of `pool/` above this one. State that only its own methods may touch
//! stays private here (a class's slab lists, the span set's held list and idle fences); the
//! parts that need no back-pointer own their state in `pool/parts/`.

use super::class::ClassTable;
use super::parts::{
    Batch, Chunks, Commit, Decay, ForkHold, FreeSpans, IdleChunks, Lazy, QuickList, Retention,
};
pub use super::parts::{Fence, Limit};
use super::stats::PoolStats;
use crate::backing::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::fork::lock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Largest request accepted at all (keeps every size computation far from overflow).
pub(crate) const MAX_REQUEST: usize = isize::MAX as usize / 2;

pub(in crate::pool) const TAG_SPAN: usize = 1;
pub(in crate::pool) const TAG_SLAB: usize = 2;
pub(in crate::pool) const TAG_MASK: usize = 3;

/// What a stream-ordered pool needs from the set of pools of its device and from its stream
/// (implemented one layer up, by `stream::StreamPools`), so that dependencies point down.
pub trait Group: Send + Sync {
    /// Whether events order reuse across streams (false without a CUDA driver).
    fn ordered(&self) -> bool;
    /// Record a fence on `stream`, the pool's own (never a retired one). None when the stream
    /// takes none (a destroyed handle): the device was synchronised instead, and the sync is
    /// counted, so nothing queued before is pending any more.
    fn fence(&self, stream: usize) -> Option<Box<dyn Fence>>;
    /// Wait on the host for the work queued on `stream` (for the whole device when the
    /// stream cannot be waited for).
    fn host_wait(&self, stream: usize);
    /// An idle chunk of at least `min` bytes of another stream, adopted for `taker` and
    /// ordered after that stream's work.
    fn steal(&self, taker: &'static Pool, min: usize) -> Option<Chunk>;
    /// Under the device's limit, give back idle memory of every stream so that `want` (or at
    /// least `need`) more bytes fit.
    fn make_room(&self, want: usize, need: usize);
    /// Give back idle memory of every stream. Returns the bytes given back.
    fn release_idle(&self) -> usize;
    /// The device's limit on mapped bytes now (it may change: PyTorch's memory fraction), and
    /// what set it, for messages.
    fn limit(&self) -> Option<Limit>;
    /// Take a wholly free chunk of a retired stream's pool, ordered by `fence` (the retire
    /// event), to lend to other streams or give back.
    fn adopt(&self, chunk: Chunk, fence: Option<Arc<dyn Fence>>);
    /// Whether freed managed blocks that may be away from the device are discarded (see
    /// `residency`).
    fn discard(&self) -> bool {
        false
    }
    /// Whether the device's managed memory is oversubscribed (more mapped than the device
    /// has): the driver may have evicted any page.
    fn oversubscribed(&self) -> bool {
        false
    }
    /// Queue, on `stream`, the discard of managed `ranges` (their contents are dead). Ok(false)
    /// when the driver has no discard.
    ///
    /// # Safety
    /// Every range is free memory of the caller, and nothing hands it out before the discard
    /// is queued.
    unsafe fn queue_discard(&self, _ranges: &[(usize, usize)], _stream: usize) -> Result<bool> {
        Ok(false)
    }
    /// Queue, on `stream`, a discard-and-prefetch of managed `[a, a + n)` to the device:
    /// populated there with no data moved. Ok(false) when the driver has no batch call (the
    /// pages were prefetched instead); an error says why the call failed (the pages were
    /// prefetched too). The default, for a group without managed memory, does nothing.
    ///
    /// # Safety
    /// `[a, a + n)` is memory of the caller not handed out yet.
    unsafe fn queue_populate(&self, _a: usize, _n: usize, _stream: usize) -> Result<bool> {
        Ok(false)
    }
}

/// Where a live block is, as the registry and descriptors say.
#[derive(Clone, Copy, Debug)]
pub struct BlockInfo {
    pub pool: &'static Pool,
    pub base: usize,
    /// Requested size.
    pub size: usize,
    /// Usable size (the slot or span length).
    pub capacity: usize,
}

/// A snapshot of one pool (one stream of a device, or the host side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// The stream it serves (0: the legacy default stream; host pools: 0).
    pub stream: usize,
    /// Whether its stream was retired.
    pub retired: bool,
    /// Bytes of physical memory it holds (its chunks; for a lazily committed pool, the pages
    /// committed in them).
    pub mapped: usize,
    /// Bytes of address space its chunks hold (equal to `mapped` unless lazily committed).
    pub reserved: usize,
    /// Free bytes ready for reuse (spans, slots of partly used slabs, kept slabs).
    pub cached: usize,
    /// The largest free span: the largest block that fits without mapping (or committing)
    /// more.
    pub largest_free: usize,
    /// The kind of memory it is made of.
    pub kind: Kind,
}

/// The result of an allocation.
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub ptr: usize,
    /// True when the block is known to read as zero already.
    pub zeroed: bool,
}

/// A caching pool over one backing.
pub struct Pool {
    pub(in crate::pool) backing: Box<dyn Backing>,
    /// The backing's kind and device, copied out so the identity hot path makes no dyn call.
    pub(in crate::pool) kind: Kind,
    pub(in crate::pool) device: i32,
    pub(in crate::pool) table: ClassTable,
    pub(in crate::pool) classes: Box<[Mutex<ClassState>]>,
    pub(in crate::pool) large: Mutex<Large>,
    /// Counters, shared by the stream pools of one device.
    pub stats: &'static PoolStats,
    /// `stream << 1 | retired`: the stream this pool's blocks are used on (stream-ordered
    /// pools; 0 otherwise), and whether it was retired (about to be destroyed: its handle is
    /// never used again, and `retire_event` orders everything it ran). One word, so that a
    /// lock-free reader sees both at once; it changes only while the pool holds no memory.
    pub(in crate::pool) key: AtomicUsize,
    /// The device's set of stream pools this pool belongs to, if it is stream-ordered.
    pub(in crate::pool) group: Option<&'static dyn Group>,
    pub(crate) retire_event: Mutex<Option<Arc<dyn Fence>>>,
    pub(in crate::pool) limit: Option<usize>,
    /// What the pool keeps: the `retain` bound, the kept empty slabs, whether it is over the
    /// bound with nothing to give back, and what it gave back so far (`retain.rs`).
    pub(in crate::pool) retention: Retention,
    /// Stream-ordered pools (no thread cache): per class, the last freed slot, kept out of its
    /// slab so that an alloc+free pair on one stream takes one atomic swap each and no lock.
    /// See `small.rs` (`take_hot`, `put_hot`, `drain_hot`).
    pub(in crate::pool) hot: Box<[AtomicUsize]>,
    /// How long wholly free chunks above `retain` wait before they go back (`retain.rs`).
    pub(in crate::pool) idle: Decay,
    /// Lazy commitment: the commit unit and when free pages are next purged (`commit.rs`).
    pub(in crate::pool) commit: Commit,
    /// Freed blocks a fork child may still read are held back (`hold.rs`).
    pub(in crate::pool) hold: ForkHold,
    /// The pool that shares this one's counters and limit, if any (`share_limit_with`).
    pub(in crate::pool) peer: std::sync::OnceLock<&'static Pool>,
    /// The host side's primary pool (`mark_host_primary`): the pool small allocations of the
    /// malloc family are served from first, which the allocation fast path serves from its
    /// thread caches (`tcache::alloc_cached`).
    pub(in crate::pool) host_primary: AtomicBool,
}

impl Pool {
    /// Fork: take this pool's class locks (all of them, in order).
    pub(crate) fn fork_lock_classes(&'static self, held: &mut crate::prim::fork::Held) {
        for c in self.classes.iter() {
            held.push(lock(c));
        }
    }

    /// Fork: take this pool's large lock.
    pub(crate) fn fork_lock_large(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.large));
    }

    /// Fork: take this pool's retire-event lock.
    pub(crate) fn fork_lock_retire(&'static self, held: &mut crate::prim::fork::Held) {
        held.push(lock(&self.retire_event));
    }
}

#[cold]
#[inline(never)]
pub(in crate::pool) fn double_free(ptr: usize) -> Error {
    Error::double_free(format!("double free of {ptr:#x}"))
}

// ---- spans and the span set ---------------------------------------------------------------

pub(in crate::pool) const SPAN_FREE: u8 = 0;
pub(in crate::pool) const SPAN_USED: u8 = 1;
pub(in crate::pool) const SPAN_SLAB: u8 = 2;
/// Freed, kept whole in the exact-size list (not in the free set, never merged).
pub(in crate::pool) const SPAN_CACHED: u8 = 3;
/// Being handed out while its pages are committed (neither free nor a live block yet).
pub(in crate::pool) const SPAN_TAKING: u8 = 4;
/// Freed, but held back while a fork child may still read it (see `hold`).
pub(in crate::pool) const SPAN_HELD: u8 = 5;

/// The generation of memory that is never shared with fork children (never held): the
/// `born` stamp of spans and slabs in pools whose pages fork copies (see `hold`).
pub(in crate::pool) const NEVER: u64 = u64::MAX;

/// Descriptor of a span: a granule-aligned range inside one chunk.
pub struct Span {
    pub(in crate::pool) pool: &'static Pool,
    pub(in crate::pool) start: AtomicUsize,
    pub(in crate::pool) len: AtomicUsize,
    pub(in crate::pool) state: AtomicU8,
    /// Requested bytes while used.
    pub(in crate::pool) req: AtomicUsize,
    pub(in crate::pool) chunk_base: AtomicUsize,
    pub(in crate::pool) chunk_len: AtomicUsize,
    /// Whether the span may hold non-zero bytes (false only for never-used backing memory
    /// that reads as zero).
    pub(in crate::pool) dirty: AtomicBool,
    /// Lazily committed pools: the epoch the span was last freed in (see `commit`).
    pub(in crate::pool) free_epoch: AtomicU64,
    /// Managed memory: its pages may be away from the pool's device (see `residency`).
    pub(in crate::pool) away: AtomicBool,
    /// Used spans: the fork generation the block was allocated in (see `hold`).
    pub(in crate::pool) born: AtomicU64,
}

/// Where a block is cut from: a free span (out of the free set), which end of it, and, when
/// known, how many bytes committing that end takes.
#[derive(Clone, Copy)]
pub(in crate::pool) struct Fit {
    pub(in crate::pool) span: &'static Span,
    pub(in crate::pool) head: bool,
    pub(in crate::pool) need: Option<usize>,
}

/// The large-block state of a pool (under its large lock).
#[derive(Default)]
pub(crate) struct Large {
    /// Free spans by (length, start), an owned part.
    pub(in crate::pool) free: FreeSpans<&'static Span>,
    /// The wholly free chunks among `free` (what can go back to the backing), an owned part.
    pub(in crate::pool) idle: IdleChunks<&'static Span>,
    /// Chunks of this pool by base, an owned part.
    pub(in crate::pool) chunks: Chunks,
    pub(in crate::pool) spare: Vec<&'static Span>,
    /// Stream-ordered pools only: for each wholly free chunk (by base), the event recorded on
    /// the pool's stream when it fell idle. Another stream may use the chunk once it waits
    /// for the event; this stream may use it at once.
    events: Vec<(usize, Box<dyn Fence>)>,
    /// The exact-size list (oldest first): spans in state CACHED, an owned part.
    pub(in crate::pool) quick: QuickList<&'static Span>,
    /// Lazily committed pools: what is committed and what may be purged, an owned part.
    pub(in crate::pool) lazy: Lazy,
    /// Managed stream pools: freed blocks to discard, in one batch (see `residency`).
    pub(in crate::pool) discards: Batch,
    /// Freed blocks held back for fork children, in state HELD (see `hold`).
    held: Vec<&'static Span>,
    /// Chunks (by base) that are no longer the backing's kind of memory (`Growth::Degraded`):
    /// given back as soon as they are wholly free, never reused.
    pub(in crate::pool) doomed: Vec<usize>,
}

impl Large {
    /// The fence of wholly free chunk `base`, taken (the chunk is used again or goes).
    pub(in crate::pool) fn take_event(&mut self, base: usize) -> Option<Box<dyn Fence>> {
        let i = self.events.iter().position(|e| e.0 == base)?;
        Some(self.events.swap_remove(i).1)
    }

    /// Chunk `base` fell idle: `fence` orders its reuse by another stream.
    pub(in crate::pool) fn set_event(&mut self, base: usize, fence: Box<dyn Fence>) {
        self.events.push((base, fence));
    }

    /// Forget every chunk's fence (a retire fence covers them all).
    pub(in crate::pool) fn clear_events(&mut self) {
        self.events.clear();
    }

    /// Hold used span `sp` back for fork children.
    pub(in crate::pool) fn hold(&mut self, sp: &'static Span) {
        self.held.push(sp);
    }

    /// The held spans that `still` no longer holds (by their generation), taken off the held
    /// list.
    pub(in crate::pool) fn take_unheld(
        &mut self,
        still: impl Fn(u64) -> bool,
    ) -> Vec<&'static Span> {
        take_unheld(&mut self.held, |sp| still(sp.born.load(Ordering::Relaxed)))
    }
}

/// The blocks of a held list (spans or slots) that `still_held` no longer holds, taken off it,
/// in their order; the rest stay, in theirs.
fn take_unheld<T>(held: &mut Vec<T>, still_held: impl Fn(&T) -> bool) -> Vec<T> {
    if held.is_empty() {
        return Vec::new();
    }
    let (keep, go) = std::mem::take(held).into_iter().partition(still_held);
    *held = keep;
    go
}

// ---- slabs and size classes ----------------------------------------------------------------

/// A free slot: its slab and index.
pub(in crate::pool) type Slot = (&'static Slab, u32);

/// Descriptor of a slab: a span cut into equal slots of one class.
pub struct Slab {
    pub(in crate::pool) pool: &'static Pool,
    pub(in crate::pool) class: usize,
    pub(in crate::pool) slot: usize,
    pub(in crate::pool) nslots: usize,
    /// `nslots * slot`: the bytes of the slab's slots.
    pub(in crate::pool) len: usize,
    /// Index of this descriptor's state in its class (fixed for the descriptor's life).
    pub(in crate::pool) id: usize,
    pub(in crate::pool) base: AtomicUsize,
    pub(in crate::pool) span: AtomicUsize,
    /// Reciprocal of `slot` for division by multiplication: `idx = off * magic >> 64`.
    pub(in crate::pool) magic: u64,
    /// Per slot: requested bytes + 1 while handed out, 0 otherwise.
    pub(in crate::pool) words: Box<[AtomicU32]>,
    /// The fork generation of its blocks (renewed when it is taken from with no slot out):
    /// see `hold`.
    pub(in crate::pool) born: AtomicU64,
    /// Blocks of the slab live now (handed out and not freed), as a hint: kept with plain
    /// loads and stores, so exact when one thread uses the slab and possibly off by a few
    /// while threads race on it (it is set right whenever the slab empties). It only decides
    /// when cached slots go back early (`free_small`, `tcache::release_dead`); what is
    /// released is decided by the exact count under the class lock.
    pub(in crate::pool) live: AtomicU32,
}

/// Where a slab descriptor is in its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// In use, with free slots: `partial[i]`.
    Partial(usize),
    /// In use, every slot out.
    Full,
    /// Every slot free, kept for reuse: `empty[i]`.
    Empty(usize),
    /// No span: waiting in `spare` for reuse.
    Spare,
}

/// What a class knows of one of its slab descriptors (under the class lock).
struct SlabState {
    desc: &'static Slab,
    /// Freed slot indices below `bump`.
    free: Vec<u16>,
    /// Slots at or past `bump` were never handed out since the slab was made.
    bump: usize,
    /// Slots out of the slab: handed out or in a thread cache.
    out: usize,
    at: At,
}

impl SlabState {
    fn free_slots(&self) -> usize {
        self.free.len() + (self.desc.nslots - self.bump)
    }
}

/// One size class of a pool: its slab descriptors and which of them have free slots.
#[derive(Default)]
pub(crate) struct ClassState {
    slabs: Vec<SlabState>,
    partial: Vec<usize>,
    empty: Vec<usize>,
    spare: Vec<usize>,
    /// Free slots in slabs in use (partial and empty).
    free: usize,
    /// Freed slots held back for fork children (still out of their slabs): see `hold`.
    held: Vec<Slot>,
}

impl ClassState {
    /// Hold freed slot `slot` back for fork children (it stays out of its slab).
    pub(in crate::pool) fn hold(&mut self, slot: Slot) {
        self.held.push(slot);
    }

    /// The held slots that `still` no longer holds (by their slab's generation), taken off the
    /// held list; they are still out of their slabs.
    pub(in crate::pool) fn take_unheld(&mut self, still: impl Fn(u64) -> bool) -> Vec<Slot> {
        take_unheld(&mut self.held, |(s, _)| {
            still(s.born.load(Ordering::Relaxed))
        })
    }

    /// Free slots held by the class (not counting thread caches).
    pub(in crate::pool) fn free_slots(&self) -> usize {
        self.free
    }

    /// Take slab `id` out of whichever list holds it (partial or empty); it is then `Full`.
    pub(in crate::pool) fn unlist(&mut self, id: usize) {
        let (i, partial) = match self.slabs[id].at {
            At::Partial(i) => (i, true),
            At::Empty(i) => (i, false),
            At::Full | At::Spare => return,
        };
        let list = if partial {
            &mut self.partial
        } else {
            &mut self.empty
        };
        list.swap_remove(i);
        if let Some(&moved) = list.get(i) {
            self.slabs[moved].at = if partial {
                At::Partial(i)
            } else {
                At::Empty(i)
            };
        }
        self.slabs[id].at = At::Full;
    }

    /// A descriptor for a new slab: a spare one, else one `make` makes with the next id.
    pub(in crate::pool) fn spare_or_new(
        &mut self,
        make: impl FnOnce(usize) -> &'static Slab,
    ) -> usize {
        if let Some(id) = self.spare.pop() {
            return id;
        }
        let id = self.slabs.len();
        self.slabs.push(SlabState {
            desc: make(id),
            free: Vec::new(),
            bump: 0,
            out: 0,
            at: At::Spare,
        });
        id
    }

    /// Descriptor `id` of this class.
    pub(in crate::pool) fn desc(&self, id: usize) -> &'static Slab {
        self.slabs[id].desc
    }

    /// Slab `id` was just installed over a span: every slot free, on the partial list.
    pub(in crate::pool) fn list_new(&mut self, id: usize) {
        let s = &mut self.slabs[id];
        s.free.clear();
        s.bump = 0;
        s.out = 0;
        self.free += s.desc.nslots;
        self.push_partial(id);
    }

    /// The wholly free slab kept last, if any.
    pub(in crate::pool) fn last_empty(&self) -> Option<usize> {
        self.empty.last().copied()
    }

    /// Keep wholly free slab `id` (in no list) on the empty list.
    pub(in crate::pool) fn push_empty(&mut self, id: usize) {
        self.empty.push(id);
        self.slabs[id].at = At::Empty(self.empty.len() - 1);
    }

    /// Slab `id` (wholly free, in no list) loses its span: its descriptor waits for reuse.
    /// Returns the descriptor.
    pub(in crate::pool) fn retire_slab(&mut self, id: usize) -> &'static Slab {
        let s = &mut self.slabs[id];
        debug_assert_eq!(s.out, 0);
        s.at = At::Spare;
        s.free.clear();
        s.bump = 0;
        let desc = s.desc;
        self.free -= desc.nslots;
        self.spare.push(id);
        desc
    }

    fn push_partial(&mut self, id: usize) {
        self.partial.push(id);
        self.slabs[id].at = At::Partial(self.partial.len() - 1);
    }

    /// Take up to `want` free slots, from partial slabs first, then a kept empty slab.
    /// Returns the slots and the bytes of empty slabs brought back into use.
    pub(in crate::pool) fn take(&mut self, want: usize, out: &mut Vec<Slot>) -> usize {
        let mut revived = 0;
        while out.len() < want {
            let id = match self.partial.last() {
                Some(&id) => id,
                None => match self.empty.last() {
                    Some(&id) => {
                        self.unlist(id);
                        revived += self.slabs[id].desc.bytes();
                        self.push_partial(id);
                        id
                    }
                    None => break,
                },
            };
            let st = &mut self.slabs[id];
            while out.len() < want {
                let idx = match st.free.pop() {
                    Some(i) => i as usize,
                    None if st.bump < st.desc.nslots => {
                        st.bump += 1;
                        st.bump - 1
                    }
                    None => break,
                };
                st.out += 1;
                self.free -= 1;
                out.push((st.desc, idx as u32));
            }
            if self.slabs[id].free_slots() == 0 {
                self.unlist(id);
            }
        }
        revived
    }

    /// Put slot `idx` back into its slab. Returns true when the slab is now wholly free (the
    /// caller decides whether to keep it); it is then out of the partial list.
    pub(in crate::pool) fn give(&mut self, id: usize, idx: u32) -> bool {
        let st = &mut self.slabs[id];
        debug_assert!(st.out > 0 && !matches!(st.at, At::Spare));
        st.free.push(idx as u16);
        st.out -= 1;
        self.free += 1;
        if self.slabs[id].out == 0 {
            // Every slot is back: nothing is live (the hint may have drifted).
            self.slabs[id].desc.live.store(0, Ordering::Relaxed);
            self.unlist(id);
            return true;
        }
        if self.slabs[id].at == At::Full {
            self.push_partial(id);
        }
        false
    }
}
