//! Unit tests of stream-ordered reuse (host-backed pools stand in for device memory).

use super::*;
use crate::backing::{HostBacking, Kind};

fn group(limit: Option<usize>) -> &'static StreamPools {
    let stats = Box::leak(Box::new(PoolStats::default()));
    StreamPools::new(
        0,
        Box::new(|| Box::new(HostBacking::for_device(Kind::UMP_KIND_SYSTEM, 0))),
        256,
        limit,
        usize::MAX,
        false,
        stats,
    )
}

#[test]
fn streams_get_their_own_pools() {
    let g = group(None);
    let a = g.pool_for(0).unwrap();
    assert!(std::ptr::eq(a, g.pool_for(CU_STREAM_LEGACY).unwrap()));
    let b = g.pool_for(0x1000).unwrap();
    assert!(!std::ptr::eq(a, b));
    assert_eq!(b.stream(), 0x1000);
    assert_eq!(g.pools().len(), 2);
}

#[test]
fn same_stream_reuses_at_once_and_other_streams_do_not_share_partial_chunks() {
    let g = group(None);
    let s1 = g.pool_for(0x10).unwrap();
    let s2 = g.pool_for(0x20).unwrap();
    let keep = s1.alloc(1 << 20).unwrap().ptr; // keeps s1's arena partly used
    let x = s1.alloc(4 << 20).unwrap().ptr;
    s1.free(x).unwrap();
    assert_eq!(
        s1.alloc(4 << 20).unwrap().ptr,
        x,
        "same stream: immediate reuse"
    );
    s1.free(x).unwrap();
    let mapped = g.stats.mapped.load(Ordering::Relaxed);
    let y = s2.alloc(4 << 20).unwrap().ptr;
    assert_ne!(y, x, "another stream must not reuse s1's block");
    assert_eq!(
        g.stats.mapped.load(Ordering::Relaxed),
        mapped + crate::backing::ARENA,
        "s1's chunk is still in use, so s2 maps its own"
    );
    s2.free(y).unwrap();
    s1.free(keep).unwrap();
}

#[test]
fn idle_chunks_move_between_streams() {
    let g = group(None);
    let s1 = g.pool_for(0x30).unwrap();
    let s2 = g.pool_for(0x40).unwrap();
    let big = 48 << 20; // a dedicated chunk
    let x = s1.alloc(big).unwrap().ptr;
    s1.free(x).unwrap();
    let mapped = g.stats.mapped.load(Ordering::Relaxed);
    let y = s2.alloc(big).unwrap().ptr;
    assert_eq!(y, x, "the idle chunk of s1 serves s2");
    assert_eq!(
        g.stats.mapped.load(Ordering::Relaxed),
        mapped,
        "nothing new mapped"
    );
    assert!(crate::pool::lookup(y).is_some_and(|i| std::ptr::eq(i.pool, s2)));
    s2.free(y).unwrap();
    assert_eq!(g.trim(), big);
}

#[test]
fn retired_streams_keep_their_blocks_and_lend_idle_chunks() {
    let g = group(None);
    let s1 = g.pool_for(0x70).unwrap();
    let x = s1.alloc(40 << 20).unwrap().ptr;
    let small = s1.alloc(100).unwrap().ptr;
    assert!(g.retire(0x70));
    assert!(!g.retire(0x70), "already retired");
    assert!(!g.retire(0), "the legacy stream is never retired");
    // The same handle, reused by a new stream, gets a new pool.
    let s1b = g.pool_for(0x70).unwrap();
    assert!(!std::ptr::eq(s1, s1b));
    // Blocks of the retired pool are still freed into it; its idle chunk serves others.
    s1.free(x).unwrap();
    s1.free(small).unwrap();
    let y = g.pool_for(0x80).unwrap().alloc(40 << 20).unwrap().ptr;
    assert_eq!(y, x);
    // s1 holds nothing any more: the new stream 0x80 got it, recycled.
    assert_eq!(g.pools().len(), 2);
    assert!(std::ptr::eq(g.pool_for(0x80).unwrap(), s1));
    g.pool_for(0x80).unwrap().free(y).unwrap();
}

/// Issue 9, defect 7: retired streams neither pin memory nor pile up pools.
#[test]
fn retired_streams_return_memory_and_pools_stay_bounded() {
    let g = group(None);
    for i in 0..2000usize {
        let s = 0x10_000 + i * 0x100;
        let p = g.pool_for(s).unwrap();
        let a = p.alloc(1000).unwrap().ptr;
        let b = p.alloc(5 << 20).unwrap().ptr;
        p.free(a).unwrap();
        if i % 2 == 0 {
            p.free(b).unwrap();
            assert!(g.retire(s));
        } else {
            // Retired while a block is live; freed afterwards.
            assert!(g.retire(s));
            p.free(b).unwrap();
        }
    }
    assert!(
        g.pools().len() <= 3,
        "{} pools for 2000 retired streams",
        g.pools().len()
    );
    let m = g.stats.mapped.load(Ordering::Relaxed);
    assert!(m <= 2 * crate::backing::ARENA, "{} MiB mapped", m >> 20);
    assert_eq!(g.trim(), m);
    assert_eq!(g.stats.mapped.load(Ordering::Relaxed), 0);
}

/// Issue 9, defect 3: empty slabs of many streams do not make a false out-of-memory.
#[test]
fn empty_slabs_of_other_streams_make_room_under_the_limit() {
    let g = group(Some(1 << 30));
    for i in 0..40usize {
        let p = g.pool_for(0x900 + i * 0x10).unwrap();
        let a = p
            .alloc(1000)
            .unwrap_or_else(|e| panic!("stream {i}: {}", e.msg));
        p.free(a.ptr).unwrap();
    }
    assert!(g.stats.mapped.load(Ordering::Relaxed) <= 1 << 30);
}

/// A stream pool keeps the last freed slot of each class out of its slab (no lock on an
/// alloc+free pair); trim and retire put it back, so nothing stays mapped.
#[test]
fn the_hot_slot_is_reused_at_once_and_given_back() {
    let g = group(None);
    let p = g.pool_for(0x500).unwrap();
    let a = p.alloc(1000).unwrap().ptr;
    p.free(a).unwrap();
    assert_eq!(
        p.alloc(1000).unwrap().ptr,
        a,
        "the hot slot serves the next alloc"
    );
    assert!(
        p.free(a).is_ok() && p.free(a).is_err(),
        "a double free is still refused"
    );
    let r = p.report();
    assert_eq!(
        r.mapped - r.cached,
        0,
        "the hot slot counts as cached: {r:?}"
    );
    assert_eq!(
        g.trim(),
        r.mapped,
        "trim returns the slab of the hot slot too"
    );
    let b = p.alloc(2000).unwrap().ptr;
    p.free(b).unwrap();
    assert!(g.retire(0x500));
    let q = g.pool_for(0x600).unwrap();
    assert!(
        std::ptr::eq(p, q),
        "a retired pool with only a freed slot is recycled"
    );
    q.trim();
}

/// PyTorch's memory fraction: a limit set at run time, lifted again, beside UMP_ALLOC_LIMIT.
#[test]
fn a_runtime_limit_applies_to_every_stream_and_can_be_lifted() {
    let g = group(Some(200 << 20));
    let s1 = g.pool_for(0x50).unwrap();
    let a = s1.alloc(40 << 20).unwrap().ptr;
    s1.free(a).unwrap();
    g.set_runtime_limit(60 << 20);
    assert_eq!(
        g.stats.mapped.load(Ordering::Relaxed),
        40 << 20,
        "40 MiB idle is within the new 60 MiB limit"
    );
    let s2 = g.pool_for(0x60).unwrap();
    let e = s2.alloc(100 << 20).unwrap_err();
    assert_eq!(e.class, crate::error::ErrorClass::Limit, "{}", e.msg);
    assert!(e.msg.contains("fraction"), "{}", e.msg);
    g.set_runtime_limit(20 << 20);
    assert_eq!(
        g.stats.mapped.load(Ordering::Relaxed),
        0,
        "idle memory above it went back"
    );
    g.set_runtime_limit(0);
    let b = s2.alloc(100 << 20).unwrap().ptr;
    let e = s2.alloc(150 << 20).unwrap_err();
    assert!(e.msg.contains("UMP_ALLOC_LIMIT"), "{}", e.msg);
    s2.free(b).unwrap();
}

#[test]
fn the_limit_covers_all_streams_and_idle_chunks_make_room() {
    let limit = 100 << 20;
    let g = group(Some(limit));
    let s1 = g.pool_for(0x50).unwrap();
    let s2 = g.pool_for(0x60).unwrap();
    let a = s1.alloc(40 << 20).unwrap().ptr;
    let b = s1.alloc(40 << 20).unwrap().ptr;
    assert!(
        s2.alloc(40 << 20).is_err(),
        "80 MiB mapped + 40 MiB > 100 MiB"
    );
    s1.free(a).unwrap();
    // s1's idle 40 MiB chunk moves to s2.
    let c = s2.alloc(40 << 20).unwrap().ptr;
    assert_eq!(c, a);
    s1.free(b).unwrap();
    s2.free(c).unwrap();
    // 80 MiB idle in two streams; 90 MiB needs both given back first.
    let d = s2.alloc(90 << 20).unwrap().ptr;
    assert!(g.stats.mapped.load(Ordering::Relaxed) <= limit);
    s2.free(d).unwrap();
}
