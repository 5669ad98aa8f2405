//! realloc without a copy. A large block shrinks by giving its tail back; it grows into the
//! free span after it in its chunk, or, when it holds its chunk alone, with its chunk: the
//! backing maps more after it (pinned memory, into the room its chunk was reserved with) or
//! moves its pages (plain host memory, `mremap`). NumPy's `ndarray.resize`, `np.fromiter` and
//! the readers that grow their result as they go (`np.loadtxt`, `np.fromfile` with a separator)
//! then copy nothing, as they copy nothing on glibc's malloc.

use super::span::{SPAN_CACHED, SPAN_FREE, SPAN_USED, Span};
use super::*;
use crate::backing::{Growth, RangeBook};

/// A chunk of pinned memory grows by at least half its size at a time: registering it again
/// costs about its size (25 ms per GiB), so a loop that grows it step by step re-registers it
/// a logarithmic number of times.
const PINNED_GROWTH: usize = 2;

/// The registry's side of a chunk that changes size under span `sp` (see [`RangeBook`]). The
/// chunk's range holds `sp` and, after it, the free spans `rest`; a range left and then kept
/// after all points at them again.
struct Book<'a> {
    sp: &'static Span,
    rest: &'a [&'static Span],
}

impl RangeBook for Book<'_> {
    fn claim(&mut self, base: usize, len: usize) -> bool {
        registry::reserve(base, len)
    }
    fn leave(&mut self, base: usize, len: usize) {
        registry::set_range(base, len, 0);
    }
    fn stay(&mut self, base: usize, len: usize) {
        for s in std::iter::once(self.sp).chain(self.rest.iter().copied()) {
            let (a, b) = (s.start().max(base), (s.start() + s.len()).min(base + len));
            if a < b {
                registry::set_range(a, b - a, s as *const Span as usize | TAG_SPAN);
            }
        }
    }
}

impl Pool {
    /// Resize the large block starting at `base` (span `sp`) to `n` bytes (more than
    /// `SMALL_MAX`) without copying. Returns where the block is now, or None when that needs
    /// a copy (nothing changed then: the block, the free memory around it and the books).
    pub(super) fn resize_large(
        &'static self,
        sp: &'static Span,
        base: usize,
        n: usize,
    ) -> Option<usize> {
        let mut lg = lock(&self.large);
        if sp.state.load(Ordering::Acquire) != SPAN_USED || sp.start() != base {
            return None;
        }
        let len = sp.len();
        let want = n.next_multiple_of(GRANULE);
        let at = if want <= len {
            if sp.born.load(Ordering::Relaxed) < crate::backing::shared::live_max() {
                // A fork child may read the whole block: its tail is not given back.
            } else if !(sp.is_whole_chunk() && self.shrink_chunk(&mut lg, sp, want)) {
                self.shrink_span(&mut lg, sp, want);
            }
            Some(base)
        } else if self.grow_into_next(&mut lg, sp, want) {
            Some(base)
        } else if let Some(rest) = self.rest_of_chunk(&lg, sp) {
            self.grow_chunk(&mut lg, sp, &rest, want)
        } else {
            None
        }?;
        let old = sp.req.swap(n, Ordering::Relaxed);
        self.stats.on_resize(old, n);
        Some(at)
    }

    /// Give the tail of used span `sp` past `len` bytes back to the free set.
    fn shrink_span(&'static self, lg: &mut Large, sp: &'static Span, len: usize) {
        let old = sp.len();
        if len == old {
            return;
        }
        sp.len.store(len, Ordering::Release);
        let tail = self.carve(lg, sp, sp.start() + len, old - len);
        tail.dirty.store(true, Ordering::Relaxed);
        if self.lazy() {
            lg.lazy.used -= old - len;
        }
        self.insert_free(lg, tail);
    }

    /// Shrink the chunk that used span `sp` holds alone to `len` bytes, giving the rest back
    /// to the backing (plain host memory: glibc's realloc does the same). Returns whether it
    /// did.
    fn shrink_chunk(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> bool {
        let Some(&old) = lg.chunks.get(&sp.start()) else {
            return false;
        };
        let mut book = Book { sp, rest: &[] };
        // SAFETY: the chunk is this pool's and holds `sp` alone, whose owner is inside
        // realloc and keeps only the first `len` bytes. The backing clears the tail's registry
        // entries before the OS takes the tail back.
        let Some(new) = (unsafe { self.backing.shrink(&old, len, &mut book) }) else {
            return false;
        };
        lg.chunks.insert(new.base, new);
        self.stats.on_unmap(old.size - new.size);
        self.stats.on_reserve(new.raw_size);
        self.stats.on_unreserve(old.raw_size);
        sp.len.store(len, Ordering::Release);
        sp.chunk_len.store(len, Ordering::Relaxed);
        true
    }

    /// The free span that starts right after used span `sp` in its chunk, and the bytes it
    /// offers: a span of the free set, or one of the exact-size list with the free span after
    /// it (what merging it would make). Nothing is changed.
    fn free_after(&self, lg: &Large, sp: &Span) -> Option<(&'static Span, usize)> {
        let end = sp.start() + sp.len();
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        if end >= cend {
            return None;
        }
        let Some(Entry::Span(next)) = entry_at(end) else {
            return None;
        };
        if next.start() != end || next.chunk_base.load(Ordering::Relaxed) != cbase {
            return None;
        }
        match next.state.load(Ordering::Acquire) {
            SPAN_FREE if lg.free.contains_key(&(next.len(), end)) => Some((next, next.len())),
            SPAN_CACHED if lg.quick.iter().any(|q| std::ptr::eq(*q, next)) => {
                let after = end + next.len();
                let more = match entry_at(after) {
                    Some(Entry::Span(f))
                        if after < cend
                            && f.start() == after
                            && f.chunk_base.load(Ordering::Relaxed) == cbase
                            && f.state.load(Ordering::Acquire) == SPAN_FREE =>
                    {
                        f.len()
                    }
                    _ => 0,
                };
                Some((next, next.len() + more))
            }
            _ => None,
        }
    }

    /// Grow used span `sp` to `len` bytes over the free span right after it in its chunk.
    /// Returns whether it did; when not, nothing changed.
    fn grow_into_next(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> bool {
        let end = sp.start() + sp.len();
        let extra = len - sp.len();
        let Some((mut next, room)) = self.free_after(lg, sp) else {
            return false;
        };
        if room < extra {
            return false;
        }
        if next.state.load(Ordering::Acquire) == SPAN_CACHED {
            // On the exact-size list: merge it into the free set first.
            let i = lg
                .quick
                .iter()
                .position(|q| std::ptr::eq(*q, next))
                .expect("free_after found it listed");
            lg.quick.remove(i);
            self.uncache(lg, next);
            let Some(Entry::Span(merged)) = entry_at(end) else {
                unreachable!("the merged span starts where the listed one did");
            };
            next = merged;
        }
        self.unlist_free(lg, next);
        if self.lazy() {
            // A lazily committed pool keeps no exact-size list: nothing was merged above.
            if self.commit_span(lg, end, extra, None).is_err() {
                self.insert_free(lg, next);
                return false;
            }
            self.on_span_used(lg, extra);
        }
        let rest = next.len() - extra;
        registry::set_range(end, extra, sp as *const Span as usize | TAG_SPAN);
        let away = next.away.load(Ordering::Relaxed);
        if rest == 0 {
            next.len.store(0, Ordering::Release);
            lg.spare.push(next);
        } else {
            next.start.store(end + extra, Ordering::Release);
            next.len.store(rest, Ordering::Release);
            lg.free.insert((rest, end + extra), next);
            lg.free_bytes += rest;
            if self.lazy() {
                self.on_span_free(lg, next);
            }
        }
        let dirty = sp.dirty.load(Ordering::Relaxed) || next.dirty.load(Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);
        sp.away.fetch_or(away, Ordering::Relaxed);
        sp.len.store(len, Ordering::Release);
        // Free memory handed out: out of the pending discards and migrations.
        self.residency_on_grow(lg, end, end + extra);
        true
    }

    /// When used span `sp` starts its chunk and everything after it in the chunk is free
    /// (spans of the free set or of the exact-size list: say a tail it gave back when it
    /// shrank), those spans, in address order (none when `sp` is the whole chunk). Nothing is
    /// changed.
    fn rest_of_chunk(&self, lg: &Large, sp: &'static Span) -> Option<Vec<&'static Span>> {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        if sp.start() != cbase {
            return None;
        }
        let mut rest = Vec::new();
        let mut a = sp.start() + sp.len();
        while a < cend {
            let Some(Entry::Span(f)) = entry_at(a) else {
                return None;
            };
            let listed = match f.state.load(Ordering::Acquire) {
                SPAN_FREE => lg.free.contains_key(&(f.len(), a)),
                SPAN_CACHED => lg.quick.iter().any(|q| std::ptr::eq(*q, f)),
                _ => false,
            };
            if !listed || f.start() != a || f.chunk_base.load(Ordering::Relaxed) != cbase {
                return None;
            }
            rest.push(f);
            a += f.len();
        }
        Some(rest)
    }

    /// Take the free spans `rest` (after `sp` in its chunk, from `rest_of_chunk`) out of the
    /// free set and the exact-size list: their range now belongs to `sp`'s chunk growth.
    fn take_rest(&'static self, lg: &mut Large, sp: &'static Span, rest: &[&'static Span]) {
        debug_assert!(!self.lazy(), "lazily committed chunks do not grow");
        for &f in rest {
            sp.dirty
                .fetch_or(f.dirty.load(Ordering::Relaxed), Ordering::Relaxed);
            sp.away
                .fetch_or(f.away.load(Ordering::Relaxed), Ordering::Relaxed);
            if f.state.load(Ordering::Acquire) == SPAN_CACHED {
                if let Some(i) = lg.quick.iter().position(|q| std::ptr::eq(*q, f)) {
                    lg.quick.remove(i);
                    lg.quick_bytes -= f.len();
                }
            } else {
                self.unlist_free(lg, f);
            }
            f.state.store(SPAN_FREE, Ordering::Release);
            f.len.store(0, Ordering::Release);
            lg.spare.push(f);
        }
    }

    /// Grow span `sp`, which starts its chunk and is followed by nothing but the free spans
    /// `rest`, with the chunk (see the module docs). Returns where the block is now; on
    /// failure nothing changed (unless the backing degraded the chunk: see `doom`).
    fn grow_chunk(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        rest: &[&'static Span],
        len: usize,
    ) -> Option<usize> {
        let old = *lg.chunks.get(&sp.start())?;
        let mut sizes = vec![len];
        if self.kind == Kind::UMP_KIND_REGISTERED {
            let step = (old.size + old.size / PINNED_GROWTH).next_multiple_of(GRANULE);
            if step > len {
                sizes.insert(0, step);
            }
        }
        for size in sizes {
            let delta = size - old.size;
            if !self.stats.reserve_mapped(delta, self.limit().map(|l| l.0)) {
                continue;
            }
            let mut book = Book { sp, rest };
            // SAFETY: the chunk is this pool's and holds `sp` (whose owner is inside realloc)
            // and free spans; the registry follows through `book`.
            let new = match unsafe { self.backing.grow(&old, size, &mut book) } {
                Growth::Grown(new) => new,
                Growth::Refused => {
                    self.stats.on_unmap(delta);
                    continue;
                }
                Growth::Degraded => {
                    self.stats.on_unmap(delta);
                    self.doom(lg, sp, rest);
                    return None;
                }
            };
            // The free spans after `sp` are part of the block now (or gone with the old range).
            self.residency_on_grow(lg, old.base, old.base + old.size);
            self.take_rest(lg, sp, rest);
            self.stats.on_reserve(new.raw_size);
            self.stats.on_unreserve(old.raw_size);
            lg.chunks.remove(&old.base);
            lg.chunks.insert(new.base, new);
            registry::set_range(new.base, new.size, sp as *const Span as usize | TAG_SPAN);
            sp.start.store(new.base, Ordering::Release);
            sp.len.store(new.size, Ordering::Release);
            sp.chunk_base.store(new.base, Ordering::Relaxed);
            sp.chunk_len.store(new.size, Ordering::Relaxed);
            return Some(new.base);
        }
        None
    }

    /// The chunk of `sp` is no longer the backing's kind of memory (`Growth::Degraded`): none
    /// of it is handed out again (`sp` takes the free spans after it), and it goes back to the
    /// backing as soon as `sp`'s block is freed (see `insert_free`).
    fn doom(&'static self, lg: &mut Large, sp: &'static Span, rest: &[&'static Span]) {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        let end = sp.start() + sp.len();
        self.residency_on_grow(lg, end, cend);
        self.take_rest(lg, sp, rest);
        registry::set_range(end, cend - end, sp as *const Span as usize | TAG_SPAN);
        sp.len.store(cend - cbase, Ordering::Release);
        lg.doomed.push(cbase);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::HostBacking;

    const MB: usize = 1 << 20;

    fn host_pool() -> &'static Pool {
        Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            None,
            usize::MAX,
        )
    }

    /// One byte per 4 KiB page: enough to see pages lost or moved wrong.
    fn marks(n: usize) -> impl Iterator<Item = usize> {
        (0..n).step_by(4096)
    }

    fn fill(ptr: usize, n: usize, seed: u8) {
        for i in marks(n) {
            // SAFETY: inside a live host block of at least `n` bytes.
            unsafe { *((ptr + i) as *mut u8) = (i >> 12) as u8 ^ seed };
        }
    }

    fn same(ptr: usize, n: usize, seed: u8) -> bool {
        // SAFETY: inside a live host block of at least `n` bytes.
        marks(n).all(|i| unsafe { *((ptr + i) as *const u8) } == (i >> 12) as u8 ^ seed)
    }

    fn resize(p: &'static Pool, ptr: usize, n: usize) -> Option<usize> {
        let info = lookup(ptr).expect("live");
        p.resize_in_place(&info, n)
    }

    #[test]
    fn a_block_alone_in_its_chunk_grows_with_it_and_keeps_its_bytes() {
        let p = host_pool();
        let mut ptr = p.alloc(40 * MB).unwrap().ptr;
        fill(ptr, 40 * MB, 3);
        let mut n = 40 * MB;
        for step in 1..=6 {
            let m = n + step * 37 * MB + 123;
            ptr = resize(p, ptr, m).expect("grows without a copy");
            assert!(
                same(ptr, n, 3),
                "step {step}: the old bytes moved with the pages"
            );
            fill(ptr, m, 3);
            n = m;
            let info = lookup(ptr + n - 1).unwrap();
            assert_eq!((info.base, info.size), (ptr, n));
            assert!(info.capacity >= n && info.capacity % GRANULE == 0);
        }
        assert!(p.stats.mapped.load(Ordering::Relaxed) >= n);
        // Shrinking gives the tail back to the OS in place; growing again maps it again.
        let mapped = p.stats.mapped.load(Ordering::Relaxed);
        let shrunk = resize(p, ptr, 50 * MB).unwrap();
        assert_eq!(shrunk, ptr);
        assert!(same(ptr, 50 * MB, 3));
        assert_eq!(lookup(ptr).unwrap().capacity, 50 * MB);
        assert!(lookup(ptr + 60 * MB).is_none(), "the tail is gone");
        assert!(p.stats.mapped.load(Ordering::Relaxed) + (n - 50 * MB) <= mapped + GRANULE);
        ptr = resize(p, ptr, 90 * MB).expect("regrown without a copy");
        assert!(same(ptr, 50 * MB, 3));
        p.free(ptr).unwrap();
        p.trim();
        assert_eq!(p.stats.mapped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_size_past_the_largest_request_is_refused_and_changes_nothing() {
        let p = host_pool();
        let a = p.alloc(MB).unwrap().ptr;
        let in_use = p.stats.in_use();
        for n in [usize::MAX - 4096, usize::MAX, MAX_REQUEST + 1] {
            assert_eq!(resize(p, a, n), None, "{n:#x}");
        }
        let info = lookup(a).unwrap();
        assert_eq!((info.size, info.capacity), (MB, MB));
        assert_eq!(p.stats.in_use(), in_use);
        p.free(a).unwrap();
        p.trim();
    }

    #[test]
    fn a_block_grows_over_the_free_span_after_it() {
        let p = host_pool();
        // Host-side blocks are cut from the front of free memory: `b` follows `a`.
        let a = p.alloc(2 * MB).unwrap().ptr;
        let b = p.alloc(2 * MB).unwrap().ptr;
        assert_eq!(a + 2 * MB, b);
        fill(a, 2 * MB, 9);
        assert_eq!(resize(p, a, 3 * MB), None, "b is live after a");
        p.free(b).unwrap();
        assert_eq!(resize(p, a, 3 * MB + 5), Some(a));
        assert!(same(a, 2 * MB, 9));
        let info = lookup(a + 3 * MB).unwrap();
        assert_eq!((info.base, info.size), (a, 3 * MB + 5));
        assert_eq!(
            resize(p, a, 100),
            None,
            "a large block does not become small in place"
        );
        p.free(a).unwrap();
        p.trim();
    }
}

#[cfg(test)]
mod refusal_tests {
    //! Issue 21: a refused or failed resize leaves the allocator exactly as it was, and a chunk
    //! that changes size never clears registry entries of a range the OS already took back.
    use super::*;
    use crate::backing::{ARENA, Backing, Chunk, Growth, HostBacking, RangeBook};
    use crate::error::Result;
    use std::sync::atomic::AtomicBool;

    const MB: usize = 1 << 20;

    fn resize(p: &'static Pool, ptr: usize, n: usize) -> Option<usize> {
        let info = lookup(ptr).expect("live");
        p.resize_in_place(&info, n)
    }

    fn fill(ptr: usize, n: usize, seed: u8) {
        // SAFETY: a live host block of at least `n` bytes.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, seed, n) };
    }

    fn same(ptr: usize, n: usize, seed: u8) -> bool {
        // SAFETY: a live host block of at least `n` bytes.
        unsafe { std::slice::from_raw_parts(ptr as *const u8, n) }
            .iter()
            .all(|&b| b == seed)
    }

    fn host(limit: Option<usize>, retain: usize) -> &'static Pool {
        Pool::new(
            Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
            512,
            limit,
            retain,
        )
    }

    /// Defect 1: a 40 MiB block grown to sizes no OS grants (half the user address space, and
    /// all of it) made registry leaves for the whole requested range, at the block and again at
    /// a fresh reservation (32,768 mappings for 64 TiB), and kept them. Addresses past the
    /// user address space (2^47) are never mapped: no leaf may cover them.
    #[test]
    fn a_growth_the_os_refuses_makes_no_registry_leaves() {
        let p = host(None, usize::MAX);
        let a = p.alloc(40 * MB).unwrap().ptr;
        fill(a, 40 * MB, 5);
        let beyond = || registry::leaves_in(1 << 47, registry::ADDR_LIMIT);
        assert_eq!(beyond(), 0);
        let r0 = p.report();
        for n in [1usize << 47, (1 << 47) + (1 << 46)] {
            assert_eq!(resize(p, a, n), None, "{n:#x}");
            assert_eq!(
                beyond(),
                0,
                "registry leaves for a range the OS did not grant"
            );
            assert_eq!(p.report(), r0, "a refused growth changed the pool");
            let info = lookup(a + 40 * MB - 1).unwrap();
            assert_eq!((info.base, info.size, info.capacity), (a, 40 * MB, 40 * MB));
            assert!(same(a, 40 * MB, 5));
        }
        p.free(a).unwrap();
        p.trim();
    }

    /// Defect 2: the free memory after a block was merged into it before the growth was known
    /// to succeed, and stayed there when it failed (here: the limit refuses 100 MiB).
    #[test]
    fn a_refused_growth_leaves_the_free_memory_after_the_block_free() {
        let p = host(Some(96 * MB), usize::MAX);
        let a = p.alloc(MB).unwrap().ptr;
        fill(a, MB, 7);
        let r0 = p.report();
        assert_eq!(
            r0.largest_free,
            ARENA - MB,
            "a starts an arena whose rest is free"
        );
        assert_eq!(resize(p, a, 100 * MB), None);
        assert_eq!(
            p.report(),
            r0,
            "the arena's free memory went into the block"
        );
        assert!(lookup(a + 32 * MB).is_none(), "{:x?}", lookup(a + 32 * MB));
        assert_eq!(lookup(a).unwrap().capacity, MB);
        let b = p
            .alloc(40 * MB)
            .expect("the arena's free memory serves 40 MiB under the limit");
        assert_eq!(b.ptr, a + MB);
        // The same with a listed span after the block (an exact-size hole, then free memory).
        p.free(b.ptr).unwrap();
        let c = p.alloc(2 * MB).unwrap().ptr;
        let d = p.alloc(3 * MB).unwrap().ptr;
        p.free(c).unwrap(); // listed: kept whole for a request of its size
        let r1 = p.report();
        let info = lookup(a).unwrap();
        assert_eq!(p.resize_in_place(&info, ARENA + MB), None);
        assert_eq!(p.report(), r1);
        assert!(lookup(c).is_none() && lookup(a + MB).is_none());
        assert_eq!(
            p.alloc(2 * MB).unwrap().ptr,
            c,
            "the listed span is still listed"
        );
        for x in [a, c, d] {
            p.free(x).unwrap();
        }
        assert!(same(a, MB, 7) || lookup(a).is_none());
        p.trim();
    }

    /// Host memory whose chunk changes pause right after the OS call, as a preempted thread
    /// would: the window in which another pool maps the range given up.
    struct Slow {
        inner: HostBacking,
        /// Where the range given up starts (pool B maps there when it can).
        given_up: &'static AtomicUsize,
    }

    impl Slow {
        fn pause() {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
    }

    impl Backing for Slow {
        fn kind(&self) -> Kind {
            self.inner.kind()
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> Result<Chunk> {
            self.inner.map(size)
        }
        unsafe fn unmap(&self, c: &Chunk) {
            // SAFETY: forwarded.
            unsafe { self.inner.unmap(c) }
        }
        unsafe fn shrink(&self, c: &Chunk, size: usize, book: &mut dyn RangeBook) -> Option<Chunk> {
            self.given_up.store(c.base + size, Ordering::Relaxed);
            // SAFETY: forwarded.
            let r = unsafe { self.inner.shrink(c, size, book) };
            Self::pause();
            r
        }
        unsafe fn grow(&self, c: &Chunk, size: usize, book: &mut dyn RangeBook) -> Growth {
            self.given_up.store(c.base, Ordering::Relaxed);
            // SAFETY: forwarded.
            let r = unsafe { self.inner.grow(c, size, book) };
            Self::pause();
            r
        }
    }

    /// Host memory mapped where pool A last gave a range up, when that range is free (another
    /// pool of the process mapping there: the kernel hands out freed ranges again at once).
    struct Squat {
        at: &'static AtomicUsize,
        /// Chunks mapped where pool A gave up a range.
        squatted: &'static AtomicUsize,
    }

    impl Backing for Squat {
        fn kind(&self) -> Kind {
            Kind::UMP_KIND_HOST
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> Result<Chunk> {
            let hint = self.at.load(Ordering::Relaxed);
            // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; a hint is only a wish.
            let p = unsafe {
                libc::mmap(
                    hint as *mut libc::c_void,
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p as usize == hint && hint != 0 {
                self.squatted.fetch_add(1, Ordering::Relaxed);
                return Ok(Chunk {
                    base: hint,
                    size,
                    raw: hint,
                    raw_size: size,
                    advised: false,
                });
            }
            if p != libc::MAP_FAILED {
                // SAFETY: mapped just now, elsewhere (an old kernel took the flag as a hint).
                unsafe { libc::munmap(p, size) };
            }
            HostBacking::new(Kind::UMP_KIND_HOST).map(size)
        }
        unsafe fn unmap(&self, c: &Chunk) {
            // SAFETY: forwarded.
            unsafe { HostBacking::new(Kind::UMP_KIND_HOST).unmap(c) }
        }
    }

    /// Defect 4: shrinking a chunk unmapped its tail and then cleared the tail's registry
    /// entries; a chunk that moved (mremap) had its old range cleared after the move. Pool B,
    /// mapping a chunk meanwhile, got that range, and the late clear erased its live blocks
    /// (their frees then failed as not ours, and leaked). Pool A grows and shrinks a block
    /// that holds its own chunk; pool B allocates and frees, checking its live blocks after
    /// each step.
    #[test]
    fn a_chunk_that_shrinks_or_moves_never_clears_another_pools_entries() {
        let given_up: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let a = Pool::new(
            Box::new(Slow {
                inner: HostBacking::new(Kind::UMP_KIND_HOST),
                given_up,
            }),
            512,
            None,
            0,
        );
        let squatted: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let b = Pool::new(
            Box::new(Squat {
                at: given_up,
                squatted,
            }),
            512,
            None,
            0,
        );
        let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
        let grower = std::thread::spawn(move || {
            let mut ptr = a.alloc(40 * MB).unwrap().ptr;
            while !stop.load(Ordering::Relaxed) {
                for n in [80 * MB, 40 * MB] {
                    ptr = resize(a, ptr, n).unwrap_or_else(|| panic!("resize to {n} refused"));
                }
            }
            a.free(ptr).unwrap();
        });
        let (mut live, mut checked) = (Vec::new(), 0);
        let t0 = std::time::Instant::now();
        // Long enough for pool B to map many ranges pool A gave up.
        while t0.elapsed() < std::time::Duration::from_millis(1500)
            || squatted.load(Ordering::Relaxed) < 20 && t0.elapsed().as_secs() < 10
        {
            // A chunk of its own (at least half an arena) that fits the 40 MiB pool A gives up.
            let x = b.alloc(36 * MB).unwrap().ptr;
            live.push(x);
            for &x in &live {
                for off in [0, 18 * MB, 36 * MB - 1] {
                    let info = lookup(x + off);
                    assert!(
                        info.is_some_and(|i| i.base == x && std::ptr::eq(i.pool, b)),
                        "pool B's live block {x:#x} is gone from the registry at +{off:#x} \
                         ({info:x?}): a range pool A gave up was cleared after B mapped it"
                    );
                    checked += 1;
                }
            }
            if live.len() >= 4 {
                for x in live.drain(..) {
                    b.free(x).unwrap();
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        grower.join().unwrap();
        for x in live {
            b.free(x).unwrap();
        }
        assert!(
            squatted.load(Ordering::Relaxed) > 0,
            "pool B never mapped a range pool A gave up: the test tests nothing"
        );
        assert!(checked > 0);
    }

    /// Host memory whose growth degrades the chunk (pinned memory that could be registered
    /// neither with its growth nor as it was), and that counts the chunks given back.
    struct Degrades {
        inner: HostBacking,
        unmapped: AtomicUsize,
    }

    impl Backing for Degrades {
        fn kind(&self) -> Kind {
            Kind::UMP_KIND_REGISTERED
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> Result<Chunk> {
            self.inner.map(size)
        }
        unsafe fn unmap(&self, c: &Chunk) {
            self.unmapped.fetch_add(1, Ordering::Relaxed);
            // SAFETY: forwarded.
            unsafe { self.inner.unmap(c) }
        }
        unsafe fn grow(&self, _c: &Chunk, _size: usize, _book: &mut dyn RangeBook) -> Growth {
            Growth::Degraded
        }
    }

    /// The sibling of defect 5 in the pinned growth: a failed re-registration left the chunk
    /// as it was, marked pinned, and it served other blocks. A degraded chunk serves nothing
    /// more and goes back to the backing with its block, whatever `retain` allows.
    #[test]
    fn a_degraded_chunk_serves_nothing_more_and_goes_back_with_its_block() {
        let backing: &'static Degrades = Box::leak(Box::new(Degrades {
            inner: HostBacking::new(Kind::UMP_KIND_HOST),
            unmapped: AtomicUsize::new(0),
        }));
        struct Shared(&'static Degrades);
        impl Backing for Shared {
            fn kind(&self) -> Kind {
                self.0.kind()
            }
            fn device(&self) -> i32 {
                -1
            }
            fn map(&self, size: usize) -> Result<Chunk> {
                self.0.map(size)
            }
            unsafe fn unmap(&self, c: &Chunk) {
                // SAFETY: forwarded.
                unsafe { self.0.unmap(c) }
            }
            unsafe fn grow(&self, c: &Chunk, size: usize, book: &mut dyn RangeBook) -> Growth {
                // SAFETY: forwarded.
                unsafe { self.0.grow(c, size, book) }
            }
        }
        let p = Pool::new(Box::new(Shared(backing)), 512, None, usize::MAX);
        let a = p.alloc(40 * MB).unwrap().ptr; // a chunk of its own
        assert_eq!(
            resize(p, a, 20 * MB),
            Some(a),
            "shrinks in place, its tail free"
        );
        fill(a, 20 * MB, 9);
        let mapped = p.stats.mapped.load(Ordering::Relaxed);
        assert_eq!(
            resize(p, a, 60 * MB),
            None,
            "the backing degraded the chunk"
        );
        assert!(same(a, 20 * MB, 9), "the block keeps its bytes");
        assert_eq!(lookup(a).unwrap().size, 20 * MB);
        assert_eq!(p.stats.mapped.load(Ordering::Relaxed), mapped);
        // The chunk's free tail is handed out no more.
        let b = p.alloc(20 * MB).unwrap().ptr;
        assert!(
            b + 20 * MB <= a || b >= a + 40 * MB,
            "{b:#x} was cut from the degraded chunk at {a:#x}"
        );
        // Freed, the chunk goes back at once although retain would keep it.
        let before = backing.unmapped.load(Ordering::Relaxed);
        p.free(a).unwrap();
        assert_eq!(backing.unmapped.load(Ordering::Relaxed), before + 1);
        // (Another test's pool may have mapped the range since: it is not this pool's.)
        for x in [a, a + 30 * MB] {
            assert!(pool_at(x).is_none_or(|q| !std::ptr::eq(q, p)));
        }
        assert_eq!(
            p.stats.mapped.load(Ordering::Relaxed),
            mapped + ARENA - 40 * MB
        );
        p.free(b).unwrap();
        p.trim();
    }
}

#[cfg(test)]
mod room_tests {
    use super::*;
    use crate::backing::{ARENA, Backing, Chunk, Growth, RangeBook};
    use crate::error::Result;
    use crate::prim::os;

    /// Pinned memory's growth rules without CUDA: chunks of their own sit in 8x their size of
    /// address space and grow into it in place.
    struct Room;
    impl Backing for Room {
        fn kind(&self) -> Kind {
            Kind::UMP_KIND_REGISTERED
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> Result<Chunk> {
            let raw_size = if size >= ARENA / 2 { size * 8 } else { size };
            let p = os::reserve(raw_size, GRANULE).unwrap().as_ptr();
            assert!(os::commit(p, size));
            let base = p as usize;
            Ok(Chunk {
                base,
                size,
                raw: base,
                raw_size,
                advised: false,
            })
        }
        unsafe fn unmap(&self, c: &Chunk) {
            // SAFETY: ours, unused.
            unsafe {
                os::unmap(
                    std::ptr::NonNull::new(c.raw as *mut u8).unwrap(),
                    c.raw_size,
                )
            };
        }
        unsafe fn grow(&self, c: &Chunk, size: usize, book: &mut dyn RangeBook) -> Growth {
            if size <= c.size || c.base + size > c.raw + c.raw_size || !book.claim(c.base, size) {
                return Growth::Refused;
            }
            assert!(os::commit((c.base + c.size) as *mut u8, size - c.size));
            Growth::Grown(Chunk { size, ..*c })
        }
    }

    #[test]
    fn pinned_style_chunks_grow_in_their_room_step_after_step() {
        let p = Pool::new(Box::new(Room), 512, None, 256 << 20);
        let mut n = (8 << 20) * 4;
        let mut ptr = p.alloc(n).unwrap().ptr;
        for step in 1..=5 {
            let m = n + n / 2 + step * 12345 * 4;
            let info = lookup(ptr).unwrap();
            let r = p.resize_in_place(&info, m);
            assert!(r.is_some(), "step {step}: {n} -> {m} copies");
            ptr = r.unwrap();
            n = m;
        }
        p.free(ptr).unwrap();
        p.trim();
    }
}
