//! realloc without a copy. A large block shrinks by giving its tail back; it grows into the
//! free span after it in its chunk, or, when it holds its chunk alone, with its chunk: the
//! backing maps more after it (pinned memory, into the room its chunk was reserved with) or
//! moves its pages (plain host memory, `mremap`). NumPy's `ndarray.resize`, `np.fromiter` and
//! the readers that grow their result as they go (`np.loadtxt`, `np.fromfile` with a separator)
//! then copy nothing, as they copy nothing on glibc's malloc.

use super::span::{SPAN_CACHED, SPAN_FREE, SPAN_USED, Span};
use super::*;

/// A chunk of pinned memory grows by at least half its size at a time: registering it again
/// costs about its size (25 ms per GiB), so a loop that grows it step by step re-registers it
/// a logarithmic number of times.
const PINNED_GROWTH: usize = 2;

impl Pool {
    /// Resize the large block starting at `base` (span `sp`) to `n` bytes (more than
    /// `SMALL_MAX`) without copying. Returns where the block is now, or None when that needs
    /// a copy (nothing changed then).
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
        } else if self.owns_chunk(&mut lg, sp) {
            self.grow_chunk(&mut lg, sp, want)
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
        // SAFETY: the chunk is this pool's and holds `sp` alone, whose owner is inside
        // realloc and keeps only the first `len` bytes.
        let Some(new) = (unsafe { self.backing.shrink(&old, len) }) else {
            return false;
        };
        registry::set_range(new.base + len, old.size - len, 0);
        lg.chunks.insert(new.base, new);
        self.stats.on_unmap(old.size - new.size);
        self.stats.on_reserve(new.raw_size);
        self.stats.on_unreserve(old.raw_size);
        sp.len.store(len, Ordering::Release);
        sp.chunk_len.store(len, Ordering::Relaxed);
        true
    }

    /// Grow used span `sp` to `len` bytes over the free span right after it in its chunk.
    /// Returns whether it did.
    fn grow_into_next(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> bool {
        let end = sp.start() + sp.len();
        let extra = len - sp.len();
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        if end >= cbase + sp.chunk_len.load(Ordering::Relaxed) {
            return false;
        }
        let Some(Entry::Span(mut next)) = entry_at(end) else {
            return false;
        };
        if next.start() == end && next.state.load(Ordering::Acquire) == SPAN_CACHED {
            // On the exact-size list: merge it into the free set first.
            let Some(i) = lg.quick.iter().position(|q| std::ptr::eq(*q, next)) else {
                return false;
            };
            lg.quick.remove(i);
            self.uncache(lg, next);
            let Some(Entry::Span(merged)) = entry_at(end) else {
                return false;
            };
            next = merged;
        }
        if next.start() != end
            || next.state.load(Ordering::Acquire) != SPAN_FREE
            || next.chunk_base.load(Ordering::Relaxed) != cbase
            || next.len() < extra
            || !lg.free.contains_key(&(next.len(), end))
        {
            return false;
        }
        self.unlist_free(lg, next);
        if self.lazy() {
            if self.commit_span(lg, end, extra, None).is_err() {
                self.insert_free(lg, next);
                return false;
            }
            self.on_span_used(lg, extra);
        }
        let rest = next.len() - extra;
        registry::set_range(end, extra, sp as *const Span as usize | TAG_SPAN);
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
        sp.len.store(len, Ordering::Release);
        true
    }

    /// Whether used span `sp` holds its chunk alone: it starts the chunk and the rest of the
    /// chunk is free (a tail it gave back when it shrank), in which case the span takes that
    /// tail back and covers the whole chunk.
    fn owns_chunk(&'static self, lg: &mut Large, sp: &'static Span) -> bool {
        let cbase = sp.chunk_base.load(Ordering::Relaxed);
        let cend = cbase + sp.chunk_len.load(Ordering::Relaxed);
        if sp.start() != cbase {
            return false;
        }
        let end = sp.start() + sp.len();
        if end == cend {
            return true;
        }
        let rest = cend - end;
        self.grow_into_next(lg, sp, sp.len() + rest) && sp.is_whole_chunk()
    }

    /// Grow span `sp`, which holds its chunk alone, with the chunk (see the module docs).
    /// Returns where the block is now.
    fn grow_chunk(&'static self, lg: &mut Large, sp: &'static Span, len: usize) -> Option<usize> {
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
            let mut ready = |b: usize, s: usize| registry::reserve(b, s);
            // SAFETY: the chunk is this pool's and holds `sp` alone, whose owner is inside
            // realloc; the registry follows the move below.
            let Some(new) = (unsafe { self.backing.grow(&old, size, &mut ready) }) else {
                self.stats.on_unmap(delta);
                continue;
            };
            self.stats.on_reserve(new.raw_size);
            self.stats.on_unreserve(old.raw_size);
            lg.chunks.remove(&old.base);
            lg.chunks.insert(new.base, new);
            if new.base != old.base {
                registry::set_range(old.base, old.size, 0);
            }
            registry::set_range(new.base, new.size, sp as *const Span as usize | TAG_SPAN);
            sp.start.store(new.base, Ordering::Release);
            sp.len.store(new.size, Ordering::Release);
            sp.chunk_base.store(new.base, Ordering::Relaxed);
            sp.chunk_len.store(new.size, Ordering::Relaxed);
            return Some(new.base);
        }
        None
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
mod room_tests {
    use super::*;
    use crate::backing::{Backing, Chunk};
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
        unsafe fn grow(
            &self,
            c: &Chunk,
            size: usize,
            ready: &mut dyn FnMut(usize, usize) -> bool,
        ) -> Option<Chunk> {
            if size <= c.size || c.base + size > c.raw + c.raw_size || !ready(c.base, size) {
                return None;
            }
            assert!(os::commit((c.base + c.size) as *mut u8, size - c.size));
            Some(Chunk { size, ..*c })
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
