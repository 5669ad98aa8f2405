//! Lazily committed backings (virtual memory): a chunk is address space only, and physical
//! memory is committed in pages as blocks land on it and decommitted when they fall idle, so
//! that a pool never holds a whole arena for one small block and gives idle memory back
//! without moving any live block (NVIDIA's "Introducing Low-Level GPU Virtual Memory
//! Management"; mimalloc's commit and purge of segment slices).
//!
//! One [`Space`] per device holds the reservations (one range, unless it fills up), the free
//! address space between chunks, and the *pieces* of physical memory mapped in it. Every
//! stream pool of the device takes its chunks from that space. A piece is the unit the driver
//! maps and unmaps: a run of pages to commit is cut into pieces aligned to their own size (a
//! power of two number of pages, at most [`MAX_PIECE`]), so that few calls back a large block
//! and a piece of a freed block can go back once no live block overlaps it. Which pages to
//! commit and when to decommit is the pool's policy (`pool::commit`); this file only keeps the
//! books and calls [`Pages`].

use super::resource::{Backing, Chunk, Kind};
use crate::error::{Error, Result};
use crate::prim::fork::lock;
use crate::prim::{cuda, os};
use crate::registry::GRANULE;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Largest piece of physical memory committed with one driver call. `cuMemCreate` costs about
/// the same for 2 MiB as for 1 GiB (15–30 µs), so large blocks want few pieces; a piece goes
/// back only when no live block overlaps it, so small pieces give memory back sooner.
pub(crate) const MAX_PIECE: usize = 64 << 20;

/// Address space of a chunk that small blocks share (requests of half of it or more get a
/// chunk of their own). Only the pages blocks land on are committed, so this costs nothing
/// but address space and registry entries.
pub(crate) const SEGMENT: usize = 1 << 30;

/// Where the pages of a lazily committed backing come from.
pub trait Pages: Send + Sync + 'static {
    /// The kind of memory the pages are.
    fn kind(&self) -> Kind;
    /// The device the memory is made for (-1: host).
    fn device(&self) -> i32;
    /// Reserve `size` bytes of address space aligned to `align`.
    fn reserve(&self, size: usize, align: usize) -> Result<usize>;
    /// Back each of `pieces` (contiguous, page-aligned, inside a reservation) with physical
    /// memory. Returns one token per piece for [`unback`](Self::unback). On failure nothing of
    /// the run is backed.
    fn back(&self, pieces: &[(usize, usize)]) -> Result<Vec<u64>>;
    /// Give back the physical memory of the contiguous `run` made of the pieces of `tokens`.
    ///
    /// # Safety
    /// Nothing uses the run any more; it was backed by `back` with these tokens.
    unsafe fn unback(&self, run: (usize, usize), tokens: &[u64]) -> Result<()>;
    /// Whether freshly backed pages read as zero.
    fn fresh_is_zero(&self) -> bool;
}

/// Physical device memory through CUDA's virtual memory management (`cuMemCreate` on the
/// device, mapped read-write for it).
pub struct DevicePages {
    device: i32,
}

impl DevicePages {
    pub fn new(device: i32) -> Self {
        DevicePages { device }
    }
}

impl Pages for DevicePages {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_DEVICE
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn reserve(&self, size: usize, align: usize) -> Result<usize> {
        cuda::vmm_reserve(size, align, self.device)
    }
    fn back(&self, pieces: &[(usize, usize)]) -> Result<Vec<u64>> {
        cuda::map_pieces(pieces, self.device)
    }
    unsafe fn unback(&self, run: (usize, usize), tokens: &[u64]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { cuda::unmap_range(run.0, run.1, self.device)? };
        for &t in tokens {
            // SAFETY: unmapped just above, mapped nowhere else.
            unsafe { cuda::vmm_release(t, self.device)? };
        }
        Ok(())
    }
    fn fresh_is_zero(&self) -> bool {
        false
    }
}

/// Host pages committed with `mprotect` inside a `PROT_NONE` reservation, and decommitted by
/// mapping the range `PROT_NONE` again (a touch of a decommitted page faults). The same policy
/// as device memory, on any machine: the tests exercise the pool's commit logic with it.
pub struct OsPages {
    kind: Kind,
    device: i32,
}

impl OsPages {
    pub fn new(kind: Kind, device: i32) -> Self {
        OsPages { kind, device }
    }
}

impl Pages for OsPages {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn reserve(&self, size: usize, align: usize) -> Result<usize> {
        os::reserve(size, align)
            .map(|p| p.as_ptr() as usize)
            .ok_or_else(|| Error::oom(format!("the OS refused {size} bytes of address space")))
    }
    fn back(&self, pieces: &[(usize, usize)]) -> Result<Vec<u64>> {
        let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
            return Ok(Vec::new());
        };
        let (start, end) = (first.0, last.0 + last.1);
        if !os::commit(start as *mut u8, end - start) {
            return Err(Error::oom(format!(
                "the OS refused to commit {} bytes",
                end - start
            )));
        }
        Ok(vec![0; pieces.len()])
    }
    unsafe fn unback(&self, run: (usize, usize), _tokens: &[u64]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { os::decommit(run.0 as *mut u8, run.1) };
        Ok(())
    }
    fn fresh_is_zero(&self) -> bool {
        true
    }
}

/// The books of a space (under its lock).
#[derive(Default)]
struct State {
    /// Reservations made, (base, size).
    ranges: Vec<(usize, usize)>,
    /// Address space inside the reservations that no chunk holds: base -> size.
    free: BTreeMap<usize, usize>,
    /// Committed pieces: start -> (length, token).
    pieces: BTreeMap<usize, (usize, u64)>,
    /// Bytes of all pieces.
    committed: usize,
}

impl State {
    /// Pieces overlapping `[a, b)`, in address order.
    fn overlapping(&self, a: usize, b: usize) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
        // A piece starting before `a` may reach into the range: begin at the last one there.
        let from = self.pieces.range(..a).next_back().map_or(a, |(&s, _)| s);
        self.pieces
            .range(from..b)
            .map(|(&s, &(l, t))| (s, l, t))
            .filter(move |&(s, l, _)| s + l > a)
    }
}

/// The address space and physical pieces of one device (or one test), shared by the stream
/// pools of that device. Leaked: pools and their chunks point into it for the process's life.
pub struct Space {
    pages: Box<dyn Pages>,
    /// Physical memory is committed in multiples of this (the driver's granularity, at least
    /// the registry granule).
    page: usize,
    /// Address space reserved at a time (more only when a reservation fills up).
    reserve_unit: usize,
    state: Mutex<State>,
}

impl Space {
    /// A space over `pages` committing in `page`-byte units and reserving `reserve_unit` bytes
    /// of address space at a time (both rounded up to what the registry needs).
    pub fn new(pages: Box<dyn Pages>, page: usize, reserve_unit: usize) -> &'static Space {
        let page = page.max(GRANULE).next_power_of_two();
        let reserve_unit = reserve_unit.max(SEGMENT).next_multiple_of(page);
        Box::leak(Box::new(Space {
            pages,
            page,
            reserve_unit,
            state: Mutex::new(State::default()),
        }))
    }

    /// The device space of CUDA device `device` (virtual memory management), reserving twice
    /// the device's memory at a time.
    pub fn for_device(device: i32, total_memory: usize) -> Result<&'static Space> {
        let page = cuda::vmm_granularity(device)?;
        Ok(Space::new(
            Box::new(DevicePages::new(device)),
            page,
            total_memory.saturating_mul(2),
        ))
    }

    /// The commit unit.
    pub fn page(&self) -> usize {
        self.page
    }

    /// Bytes committed in the whole space.
    pub fn committed_total(&self) -> usize {
        lock(&self.state).committed
    }

    /// Bytes of address space reserved in the whole space.
    pub fn reserved_total(&self) -> usize {
        lock(&self.state).ranges.iter().map(|r| r.1).sum()
    }

    /// Fork: this space's lock (after every pool lock: commits happen under them).
    fn fork_lock(&'static self) -> Box<dyn std::any::Any> {
        Box::new(lock(&self.state))
    }

    /// Take `size` bytes (a page multiple) of address space for a chunk, reserving more when
    /// every reservation is full.
    fn take_range(&self, size: usize) -> Result<usize> {
        let mut st = lock(&self.state);
        if let Some((&base, &len)) = st.free.iter().find(|(_, l)| **l >= size) {
            st.free.remove(&base);
            if len > size {
                st.free.insert(base + size, len - size);
            }
            return Ok(base);
        }
        let unit = size.max(self.reserve_unit).next_multiple_of(self.page);
        let base = self.pages.reserve(unit, self.page.max(GRANULE))?;
        st.ranges.push((base, unit));
        if unit > size {
            st.free.insert(base + size, unit - size);
        }
        Ok(base)
    }

    /// Give a chunk's address space back to the free list (merged with its free neighbours).
    fn give_range(&self, st: &mut State, base: usize, size: usize) {
        let (mut start, mut len) = (base, size);
        if let Some((&nb, &nl)) = st.free.range(start + len..).next()
            && nb == start + len
        {
            st.free.remove(&nb);
            len += nl;
        }
        if let Some((&pb, &pl)) = st.free.range(..start).next_back()
            && pb + pl == start
        {
            st.free.remove(&pb);
            start = pb;
            len += pl;
        }
        st.free.insert(start, len);
    }

    /// `[a, b)` widened to whole pages.
    fn pages_of(&self, addr: usize, len: usize) -> (usize, usize) {
        let a = addr & !(self.page - 1);
        let b = (addr + len).next_multiple_of(self.page);
        (a, b)
    }

    /// Bytes that committing `[addr, addr+len)` would add.
    pub fn uncommitted(&self, addr: usize, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let (a, b) = self.pages_of(addr, len);
        let st = lock(&self.state);
        let covered: usize = st
            .overlapping(a, b)
            .map(|(s, l, _)| (s + l).min(b) - s.max(a))
            .sum();
        (b - a) - covered
    }

    /// Commit every page of `[addr, addr+len)` that is not committed. Returns the bytes
    /// committed; on failure nothing changed.
    pub fn commit(&self, addr: usize, len: usize) -> Result<usize> {
        if len == 0 {
            return Ok(0);
        }
        let (a, b) = self.pages_of(addr, len);
        let mut st = lock(&self.state);
        // The gaps between committed pieces.
        let mut gaps = Vec::new();
        let mut at = a;
        for (s, l, _) in st.overlapping(a, b) {
            if s > at {
                gaps.push((at, s));
            }
            at = at.max(s + l);
        }
        if at < b {
            gaps.push((at, b));
        }
        let mut done: Vec<Vec<(usize, usize, u64)>> = Vec::new();
        for &(ga, gb) in &gaps {
            let pieces = self.cut(ga, gb);
            match self.pages.back(&pieces) {
                Ok(tokens) => done.push(
                    pieces
                        .iter()
                        .zip(tokens)
                        .map(|(&(s, l), t)| (s, l, t))
                        .collect(),
                ),
                Err(e) => {
                    // Undo the gaps backed so far: the range is as it was.
                    for run in &done {
                        self.unback_run(run);
                    }
                    return Err(e);
                }
            }
        }
        let mut bytes = 0;
        for (s, l, t) in done.into_iter().flatten() {
            st.pieces.insert(s, (l, t));
            bytes += l;
        }
        st.committed += bytes;
        Ok(bytes)
    }

    /// `[a, b)` (whole pages) cut into pieces aligned to their own power-of-two size, each at
    /// most [`MAX_PIECE`] (a buddy decomposition: few pieces, each freeable on its own).
    fn cut(&self, mut a: usize, b: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        while a < b {
            let align = if a == 0 {
                MAX_PIECE
            } else {
                1 << a.trailing_zeros()
            };
            let mut size = align.min(MAX_PIECE).max(self.page);
            while size > b - a {
                size >>= 1;
            }
            out.push((a, size));
            a += size;
        }
        out
    }

    /// Unback `pieces` in contiguous groups, one driver call per group. Returns the pieces
    /// given back (a group the driver refuses stays committed).
    fn unback_run(&self, pieces: &[(usize, usize, u64)]) -> Vec<(usize, usize)> {
        let mut freed = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            let mut j = i + 1;
            while j < pieces.len() && pieces[j - 1].0 + pieces[j - 1].1 == pieces[j].0 {
                j += 1;
            }
            let start = pieces[i].0;
            let end = pieces[j - 1].0 + pieces[j - 1].1;
            let tokens: Vec<u64> = pieces[i..j].iter().map(|p| p.2).collect();
            // SAFETY: the callers hand over pieces that no live block overlaps and that no
            // queued work uses (the pool's fences), and drop them from the books.
            if unsafe { self.pages.unback((start, end - start), &tokens) }.is_ok() {
                freed.extend(pieces[i..j].iter().map(|p| (p.0, p.1)));
            }
            i = j;
        }
        freed
    }

    /// Decommit every piece wholly inside `[addr, addr+len)`. Returns the bytes decommitted.
    /// A piece the driver refuses to give back (a `fork()` child) stays committed.
    ///
    /// # Safety
    /// Nothing uses the range any more, and no queued work touches it.
    pub unsafe fn decommit(&self, addr: usize, len: usize) -> usize {
        let end = addr + len;
        let mut st = lock(&self.state);
        let inside: Vec<(usize, usize, u64)> = st
            .pieces
            .range(addr..end)
            .map(|(&s, &(l, t))| (s, l, t))
            .filter(|&(s, l, _)| s + l <= end)
            .collect();
        if inside.is_empty() || !cuda_usable(self.pages.kind()) {
            return 0;
        }
        let mut bytes = 0;
        for (s, l) in self.unback_run(&inside) {
            st.pieces.remove(&s);
            bytes += l;
        }
        st.committed -= bytes;
        bytes
    }

    /// Bytes committed in `[addr, addr+len)`.
    pub fn committed(&self, addr: usize, len: usize) -> usize {
        let st = lock(&self.state);
        st.overlapping(addr, addr + len)
            .map(|(s, l, _)| (s + l).min(addr + len) - s.max(addr))
            .sum()
    }

    /// The longest committed run inside `[addr, addr+len)`.
    pub fn longest_committed(&self, addr: usize, len: usize) -> usize {
        let st = lock(&self.state);
        let (mut best, mut run, mut at) = (0, 0, addr);
        for (s, l, _) in st.overlapping(addr, addr + len) {
            let (s, e) = (s.max(addr), (s + l).min(addr + len));
            run = if s == at { run + (e - s) } else { e - s };
            at = e;
            best = best.max(run);
        }
        best
    }
}

/// Whether unmapping physical memory of `kind` may call the driver now (not in a `fork()`
/// child of a process that had loaded the driver, where every CUDA call is refused and the
/// pieces simply stay in the books).
fn cuda_usable(kind: Kind) -> bool {
    kind != Kind::UMP_KIND_DEVICE || !crate::prim::cuda::fork_poisoned()
}

/// A lazily committed backing over a [`Space`]: chunks are address space; the pool commits
/// the pages its blocks land on ([`Backing::commit`]) and decommits idle ones.
pub struct VmmBacking {
    space: &'static Space,
}

impl VmmBacking {
    pub fn new(space: &'static Space) -> Self {
        VmmBacking { space }
    }
}

impl Backing for VmmBacking {
    fn kind(&self) -> Kind {
        self.space.pages.kind()
    }
    fn device(&self) -> i32 {
        self.space.pages.device()
    }
    fn chunk_len(&self, len: usize) -> usize {
        if len >= SEGMENT / 2 { len } else { SEGMENT }
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let raw_size = size.next_multiple_of(self.space.page);
        let base = self.space.take_range(raw_size)?;
        Ok(Chunk::mapped(base, size, raw_size))
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        // SAFETY: forwarded from the caller's contract (the chunk is wholly free and unused).
        unsafe { self.space.decommit(chunk.raw, chunk.raw_size) };
        let mut st = lock(&self.space.state);
        self.space.give_range(&mut st, chunk.raw, chunk.raw_size);
    }
    fn fresh_is_zero(&self) -> bool {
        self.space.pages.fresh_is_zero()
    }
    fn commit_page(&self) -> Option<usize> {
        Some(self.space.page)
    }
    fn uncommitted(&self, addr: usize, len: usize) -> usize {
        self.space.uncommitted(addr, len)
    }
    fn commit(&self, addr: usize, len: usize) -> Result<usize> {
        self.space.commit(addr, len)
    }
    unsafe fn decommit(&self, addr: usize, len: usize) -> usize {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.space.decommit(addr, len) }
    }
    fn committed(&self, addr: usize, len: usize) -> usize {
        self.space.committed(addr, len)
    }
    fn longest_committed(&self, addr: usize, len: usize) -> usize {
        self.space.longest_committed(addr, len)
    }
    fn physical(&self, chunk: &Chunk) -> usize {
        self.space.committed(chunk.raw, chunk.raw_size)
    }
    fn fork_lock(&self) -> Option<Box<dyn std::any::Any>> {
        Some(self.space.fork_lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> &'static Space {
        Space::new(
            Box::new(OsPages::new(Kind::UMP_KIND_HOST, -1)),
            2 << 20,
            4 << 30,
        )
    }

    #[test]
    fn pieces_are_aligned_to_their_size_and_cover_the_run() {
        let s = space();
        let p = 2 << 20;
        for (a, b) in [
            (p, 9 * p),
            (0x4000_0000, 0x4000_0000 + 300 * p),
            (3 * p, 4 * p),
        ] {
            let cut = s.cut(a, b);
            let mut at = a;
            for &(x, l) in &cut {
                assert_eq!(x, at);
                assert!(l.is_power_of_two() && l >= p && l <= MAX_PIECE);
                assert_eq!(x % l, 0, "{x:#x} not aligned to {l:#x}");
                at += l;
            }
            assert_eq!(at, b);
        }
        assert!(s.cut(0x4000_0000, 0x4000_0000 + 300 * p).len() <= 16);
    }

    #[test]
    fn commit_decommit_and_books() {
        let s = space();
        let b = VmmBacking::new(s);
        let c = b.map(SEGMENT).unwrap();
        assert_eq!(c.base % s.page(), 0);
        assert_eq!(s.committed_total(), 0);
        assert!(!os::is_mapped(c.base) || s.committed(c.base, c.size) == 0);
        let x = c.base + 3 * GRANULE;
        assert_eq!(b.uncommitted(x, 100 << 10), 2 << 20);
        assert_eq!(b.commit(x, 100 << 10).unwrap(), 2 << 20);
        assert_eq!(b.uncommitted(x, 100 << 10), 0);
        // SAFETY: committed just above.
        unsafe { std::ptr::write_bytes(x as *mut u8, 7, 100 << 10) };
        // A block over the first page and into the next 5 commits only what is missing.
        assert_eq!(b.commit(c.base, 6 << 20).unwrap(), 4 << 20);
        assert_eq!(b.committed(c.base, c.size), 6 << 20);
        assert_eq!(b.longest_committed(c.base, c.size), 6 << 20);
        // Decommitting part of a piece does nothing; a whole piece goes.
        // SAFETY: unused by anything.
        assert_eq!(unsafe { b.decommit(c.base, 1 << 20) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { b.decommit(c.base, 2 << 20) }, 2 << 20);
        assert_eq!(b.committed(c.base, c.size), 4 << 20);
        assert_eq!(b.longest_committed(c.base, c.size), 4 << 20);
        // Committed again, the page reads as zero.
        assert_eq!(b.commit(c.base, 4096).unwrap(), 2 << 20);
        // SAFETY: committed.
        assert_eq!(unsafe { *(x as *const u8) }, 0);
        // SAFETY: the chunk is unused.
        unsafe { b.unmap(&c) };
        assert_eq!(s.committed_total(), 0);
        // The address space is reused.
        let c2 = b.map(SEGMENT).unwrap();
        assert_eq!(c2.base, c.base);
        // SAFETY: unused.
        unsafe { b.unmap(&c2) };
    }

    #[test]
    fn a_full_reservation_reserves_more_and_chunks_round_to_pages() {
        let s = space();
        let b = VmmBacking::new(s);
        let big = b.map(3 << 30).unwrap();
        let c = b.map(2 << 30).unwrap();
        assert_eq!(
            s.reserved_total(),
            8 << 30,
            "3 GiB filled the first 4 GiB range"
        );
        let odd = b.map(3 * GRANULE).unwrap();
        assert_eq!((odd.size, odd.raw_size), (3 * GRANULE, 2 << 20));
        for ch in [big, c, odd] {
            // SAFETY: unused.
            unsafe { b.unmap(&ch) };
        }
    }
}
