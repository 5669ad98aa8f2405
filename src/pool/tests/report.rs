//! Tests of what the pool reports: mapped, cached and in-use bytes, the largest free block, and
//! where whole-chunk blocks start.

use super::*;

#[test]
fn report_shows_what_is_mapped_cached_and_the_largest_free_block() {
    let p = pool_with(512, None, usize::MAX);
    let mb = 1 << 20;
    let a = p.alloc(8 * mb).unwrap().ptr;
    let b = p.alloc(8 * mb).unwrap().ptr;
    let c = p.alloc(8 * mb).unwrap().ptr;
    let r = p.report();
    assert_eq!(r.mapped, ARENA);
    assert_eq!(r.cached, ARENA - 24 * mb);
    assert_eq!(r.largest_free, ARENA - 24 * mb, "the arena's tail");
    assert_eq!((r.stream, r.retired), (0, false));
    p.free(b).unwrap();
    p.free(c).unwrap();
    let r = p.report();
    assert_eq!(r.cached, ARENA - 8 * mb, "b and c are free");
    assert_eq!(
        r.largest_free,
        ARENA - 8 * mb,
        "b, c and the tail are one run"
    );
    p.free(a).unwrap();
    assert_eq!(p.report().cached, ARENA);
    p.trim();
    assert_eq!(
        p.report(),
        crate::pool::PoolReport {
            kind: p.kind(),
            ..Default::default()
        }
    );
}

#[test]
fn largest_free_block_counts_listed_neighbours_merged_and_is_servable() {
    let p = pool_with(512, None, usize::MAX);
    let mb = 1 << 20;
    let a = p.alloc(8 * mb).unwrap().ptr;
    let b = p.alloc(8 * mb).unwrap().ptr;
    let c = p.alloc(8 * mb).unwrap().ptr;
    let tail = ARENA - 24 * mb;
    // b alone: a hole between a and c (kept on the exact-size list), smaller than the tail.
    p.free(b).unwrap();
    assert_eq!(p.report().largest_free, tail);
    // c joins b and the tail: one run of 16 MiB + the tail once the list is merged.
    p.free(c).unwrap();
    let r = p.report();
    assert_eq!(r.largest_free, tail + 16 * mb, "{r:?}");
    assert_eq!(r.cached, tail + 16 * mb);
    // The figure is what an allocation gets without mapping more.
    let big = p.alloc(r.largest_free).unwrap().ptr;
    assert_eq!(p.report().mapped, ARENA, "served from the same chunk");
    assert_eq!(p.report().largest_free, 0);
    p.free(big).unwrap();
    p.free(a).unwrap();
    assert_eq!(
        p.report().largest_free,
        ARENA,
        "all merged: the whole chunk"
    );
}

/// A host backing that remembers where each chunk it mapped starts.
struct Recording {
    inner: HostBacking,
    bases: std::sync::Mutex<Vec<usize>>,
}

impl Backing for Recording {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_HOST
    }
    fn device(&self) -> i32 {
        -1
    }
    fn map(&self, size: usize) -> crate::error::Result<Chunk> {
        let c = self.inner.map(size)?;
        self.bases.lock().unwrap().push(c.base);
        Ok(c)
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        self.bases.lock().unwrap().retain(|&b| b != chunk.base);
        // SAFETY: forwarded.
        unsafe { self.inner.unmap(chunk) }
    }
}

#[test]
fn whole_chunk_blocks_start_where_the_backing_mapped_and_are_never_pieces() {
    let backing: &'static Recording = Box::leak(Box::new(Recording {
        inner: HostBacking::new(Kind::UMP_KIND_HOST),
        bases: std::sync::Mutex::new(Vec::new()),
    }));
    struct Fwd(&'static Recording);
    impl Backing for Fwd {
        fn kind(&self) -> Kind {
            self.0.kind()
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> crate::error::Result<Chunk> {
            self.0.map(size)
        }
        unsafe fn unmap(&self, chunk: &Chunk) {
            // SAFETY: forwarded.
            unsafe { self.0.unmap(chunk) }
        }
    }
    let p = Pool::new(Box::new(Fwd(backing)), 512, None, usize::MAX);
    let mapped_at = |ptr| backing.bases.lock().unwrap().contains(&ptr);
    let a = p.alloc_whole(20 << 20).unwrap().ptr;
    assert!(mapped_at(a), "a whole block starts its chunk");
    p.free(a).unwrap();
    // An ordinary request may cut the idle 20 MiB chunk...
    let small = p.alloc(2 << 20).unwrap().ptr;
    assert!(
        (a..a + (20 << 20)).contains(&small),
        "the idle chunk serves a piece"
    );
    // ...after which a whole block of that size is a chunk of its own, not the rest of it.
    let b = p.alloc_whole(20 << 20).unwrap().ptr;
    assert!(
        mapped_at(b) && b != a,
        "{b:#x} must be a fresh chunk, not a piece of {a:#x}"
    );
    p.free(b).unwrap();
    // An idle whole chunk of the exact length is reused as is.
    let c = p.alloc_whole(20 << 20).unwrap().ptr;
    assert_eq!(c, b);
    assert!(
        p.alloc_whole(1000).is_err(),
        "small requests come from slabs"
    );
    p.free(c).unwrap();
    p.free(small).unwrap();
    assert_eq!(p.stats.in_use(), 0);
}
