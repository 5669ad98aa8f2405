//! Unit tests of in-place resizing (`src/pool/grow.rs`): shrinking and growing a block over
//! the free span after it and with its own chunk.

use super::*;
use crate::backing::HostBacking;
use crate::pool::lookup;
use crate::pool::types::MAX_REQUEST;

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
