use super::class::SLAB_MAX;
use super::*;
use crate::backing::{ARENA, Backing, Chunk, HostBacking, Kind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

mod pages;
mod report;

fn pool_with(align: usize, limit: Option<usize>, retain: usize) -> &'static Pool {
    Pool::new(
        Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
        align,
        limit,
        retain,
    )
}

fn pool(align: usize) -> &'static Pool {
    pool_with(align, None, 0)
}

fn mapped(p: &Pool) -> usize {
    p.stats.mapped.load(Ordering::Relaxed)
}

/// The alignment a block of `n` bytes gets from a pool aligned to `align`.
fn expected_align(t: &ClassTable, align: usize, n: usize) -> usize {
    if n <= SMALL_MAX {
        t.alignment_of(t.class_of(n))
    } else {
        align
    }
}

#[test]
fn class_table_is_monotone_and_aligned() {
    for align in [16, 32, 64, 512, 4096, 65536] {
        let t = ClassTable::new(align, true);
        assert!(t.sizes.windows(2).all(|w| w[0] < w[1]));
        for (ci, &s) in t.sizes.iter().enumerate() {
            let a = t.alignment_of(ci);
            assert!(a.is_power_of_two() && a >= 16 && s % a == 0, "{s}: {a}");
            if s >= align {
                assert_eq!(
                    s % align,
                    0,
                    "{s} from the alignment up is a multiple of it"
                );
                assert_eq!(a, align);
            }
        }
        assert_eq!(*t.sizes.last().unwrap(), SMALL_MAX);
        for n in [
            0,
            1,
            15,
            16,
            17,
            48,
            63,
            64,
            100,
            align - 1,
            align,
            align + 1,
            5000,
        ] {
            let c = t.class_of(n);
            assert!(t.size(c) >= n, "{n} -> {}", t.size(c));
            if c > 0 {
                assert!(t.size(c - 1) < n.max(1), "{n} not in the tightest class");
            }
        }
        for n in [100_000, SMALL_MAX] {
            assert!(t.size(t.class_of(n)) >= n);
        }
    }
    // The rule the docs state: below the alignment, natural alignment of the class.
    let t = ClassTable::new(512, true);
    assert_eq!(t.size(t.class_of(64)), 64);
    assert_eq!(t.alignment_of(t.class_of(64)), 64);
    assert_eq!(t.alignment_of(t.class_of(8)), 16);
    assert_eq!(t.alignment_of(t.class_of(40)), 16); // class 48
    assert_eq!(t.alignment_of(t.class_of(500)), 512);
    assert_eq!(t.alignment_of(t.class_of(600)), 512);
    let d = ClassTable::new(512, false);
    assert!(
        (0..d.len()).all(|ci| d.alignment_of(ci) == 512),
        "device side"
    );
}

#[test]
fn small_and_large_blocks_roundtrip() {
    let p = pool(512);
    let mut blocks = Vec::new();
    for n in [
        0,
        1,
        64,
        100,
        512,
        513,
        4096,
        70_000,
        SMALL_MAX,
        SMALL_MAX + 1,
        3 << 20,
        40 << 20,
    ] {
        let a = p.alloc(n).unwrap();
        assert_eq!(a.ptr % expected_align(&p.table, 512, n), 0, "{n}");
        let info = lookup(a.ptr + n / 2).unwrap();
        assert_eq!(info.base, a.ptr);
        assert_eq!(info.size, n);
        assert!(info.capacity >= n);
        // SAFETY: host memory of at least n bytes.
        unsafe { std::ptr::write_bytes(a.ptr as *mut u8, 0xab, n) };
        blocks.push((a.ptr, n));
    }
    let ptrs: std::collections::HashSet<_> = blocks.iter().map(|b| b.0).collect();
    assert_eq!(ptrs.len(), blocks.len(), "blocks are distinct");
    for (ptr, n) in blocks {
        assert_eq!(p.free(ptr).unwrap(), n);
        // Freed memory may go back to the OS at once, and another test's pool map it.
        assert!(lookup(ptr).is_none_or(|i| !std::ptr::eq(i.pool, p)));
    }
}

#[test]
fn double_free_and_interior_pointers_are_refused() {
    // Retain everything: with nothing live, a pool that keeps nothing gives the arena back,
    // and a second free then finds memory that is no longer this pool's.
    let p = pool_with(512, None, usize::MAX);
    for n in [64, 1 << 20] {
        let a = p.alloc(n).unwrap().ptr;
        let e = p.free(a + 16).unwrap_err();
        assert!(e.msg.contains("inside"), "{}", e.msg);
        p.free(a).unwrap();
        let e = p.free(a).unwrap_err();
        assert!(e.msg.contains("double free"), "{}", e.msg);
    }
    // An interior pointer into a freed large block is not called a double free.
    let keep = p.alloc(1 << 20).unwrap().ptr;
    let a = p.alloc(2 << 20).unwrap().ptr;
    p.free(a).unwrap();
    let e = p.free(a + 4096).unwrap_err();
    assert_eq!(e.class, crate::error::ErrorClass::InvalidFree, "{}", e.msg);
    assert!(e.msg.contains("freed memory"), "{}", e.msg);
    p.free(keep).unwrap();
    let x = 5u64;
    assert!(p.free(&x as *const u64 as usize).is_err());
}

#[test]
fn spans_coalesce_and_chunks_go_back() {
    let p = pool(512);
    let a = p.alloc(1 << 20).unwrap().ptr;
    let b = p.alloc(1 << 20).unwrap().ptr;
    let c = p.alloc(1 << 20).unwrap().ptr;
    assert_eq!(mapped(p), ARENA);
    p.free(b).unwrap();
    p.free(a).unwrap();
    p.free(c).unwrap();
    // With retain 0 the arena is whole again and goes back at once.
    assert_eq!(mapped(p), 0);
    assert_eq!(p.cached_bytes(), 0);
}

#[test]
fn exact_sizes_come_back_whole_and_merge_when_needed() {
    let p = pool_with(512, None, usize::MAX);
    let keep = p.alloc(300 << 10).unwrap().ptr;
    let a = p.alloc(1 << 20).unwrap().ptr;
    let b = p.alloc(2 << 20).unwrap().ptr;
    p.free(a).unwrap();
    p.free(b).unwrap();
    assert!(
        lookup(a).is_none() && lookup(b + 5).is_none(),
        "cached spans are not live"
    );
    assert!(p.free(a).is_err(), "a double free of a cached span is seen");
    assert!(p.cached_bytes() >= 3 << 20);
    assert_eq!(
        p.alloc(2 << 20).unwrap().ptr,
        b,
        "exact size: the same span"
    );
    assert_eq!(p.alloc(1 << 20).unwrap().ptr, a);
    // Fill the arena, then free a and b: only merged do they serve 3 MiB.
    let rest = ARENA - (320 << 10) - (3 << 20);
    let f1 = p.alloc(31 << 20).unwrap().ptr;
    let f2 = p.alloc(rest - (31 << 20)).unwrap().ptr;
    let m = mapped(p);
    assert_eq!(m, ARENA);
    p.free(a).unwrap();
    p.free(b).unwrap();
    let c = p.alloc(3 << 20).unwrap().ptr;
    assert_eq!(c, a.min(b), "a and b merged");
    assert_eq!(mapped(p), m, "nothing new mapped");
    for x in [c, f1, f2, keep] {
        p.free(x).unwrap();
    }
    assert_eq!(p.trim(), ARENA);
    assert_eq!(mapped(p), 0);
}

#[test]
fn best_fit_reuses_the_tightest_hole() {
    let p = pool_with(512, None, usize::MAX);
    let big = p.alloc(8 << 20).unwrap().ptr;
    let sep1 = p.alloc(1 << 20).unwrap().ptr;
    let small = p.alloc(2 << 20).unwrap().ptr;
    let _sep2 = p.alloc(1 << 20).unwrap().ptr;
    p.free(big).unwrap();
    p.free(small).unwrap();
    let again = p.alloc(2 << 20).unwrap().ptr;
    assert_eq!(again, small, "the 2 MiB hole fits best");
    p.free(again).unwrap();
    p.free(sep1).unwrap();
}

#[test]
fn fresh_large_blocks_are_zeroed_and_reused_ones_are_not() {
    let p = pool_with(512, None, usize::MAX);
    let a = p.alloc(2 << 20).unwrap();
    assert!(a.zeroed);
    p.free(a.ptr).unwrap();
    let b = p.alloc(2 << 20).unwrap();
    assert!(!b.zeroed);
    p.free(b.ptr).unwrap();
}

#[test]
fn limit_fails_cleanly() {
    let p = pool_with(512, Some(48 << 20), 0);
    let a = p.alloc(40 << 20).unwrap().ptr;
    let e = p.alloc(40 << 20).unwrap_err();
    assert_eq!(e.status, crate::error::Status::UMP_ERR_OOM);
    assert!(e.msg.contains("UMP_ALLOC_LIMIT"), "{}", e.msg);
    p.free(a).unwrap();
    let b = p.alloc(40 << 20).unwrap().ptr;
    p.free(b).unwrap();
}

#[test]
fn trim_returns_empty_slabs_and_reports_what_it_unmapped() {
    let p = pool_with(512, None, usize::MAX);
    let v: Vec<usize> = (0..1000).map(|_| p.alloc(700).unwrap().ptr).collect();
    for x in v {
        p.free(x).unwrap();
    }
    let before = mapped(p);
    assert!(before > 0);
    assert_eq!(p.trim(), before, "trim reports every byte it gave back");
    assert_eq!(mapped(p), 0);
    assert_eq!(p.cached_bytes(), 0);
    // Still usable afterwards.
    let x = p.alloc(700).unwrap().ptr;
    p.free(x).unwrap();
}

/// Issue 9, defect 3: a freed burst of small blocks goes back without `trim`.
#[test]
fn a_freed_burst_of_small_blocks_leaves_about_retain_mapped() {
    let retain = 32 << 20;
    let p = pool_with(512, None, retain);
    let v: Vec<usize> = (0..(256 << 20) / 4096)
        .map(|_| p.alloc(4096).unwrap().ptr)
        .collect();
    assert!(mapped(p) >= 256 << 20);
    for x in v {
        p.free(x).unwrap();
    }
    // The thread's cache keeps a few slots; each class keeps at most one empty slab.
    let slack = tcache::max_bytes(p) + SLAB_MAX;
    assert!(
        mapped(p) <= retain + ARENA + slack,
        "{} MiB stay mapped for a retain of {} MiB",
        mapped(p) >> 20,
        retain >> 20
    );
}

/// Issue 9, defect 3: under the limit, freed small blocks do not cause a false OOM.
#[test]
fn the_limit_path_releases_empty_slabs() {
    let p = pool_with(512, Some(512 << 20), usize::MAX);
    let v: Vec<usize> = (0..(400 << 20) / 4096)
        .map(|_| p.alloc(4096).unwrap().ptr)
        .collect();
    for x in v {
        p.free(x).unwrap();
    }
    flush_thread_counts();
    assert_eq!(p.stats.in_use(), 0);
    let big = p
        .alloc(200 << 20)
        .expect("400 MiB freed: 200 MiB fits the 512 MiB limit");
    p.free(big.ptr).unwrap();
}

/// Issue 9, defect 9: the exact-size list counts against `retain`.
#[test]
fn retain_bounds_the_exact_size_list_too() {
    let retain = 256 << 20;
    let p = pool_with(512, None, retain);
    let v: Vec<usize> = (0..100).map(|_| p.alloc(8 << 20).unwrap().ptr).collect();
    for x in v {
        p.free(x).unwrap();
    }
    assert!(
        mapped(p) <= retain,
        "{} MiB mapped after 100 freed 8 MiB blocks (retain 256 MiB)",
        mapped(p) >> 20
    );
    let p0 = pool_with(512, None, 0);
    let v: Vec<usize> = (0..20_000).map(|_| p0.alloc(1000).unwrap().ptr).collect();
    for x in v {
        p0.free(x).unwrap();
    }
    assert!(
        mapped(p0) <= tcache::max_bytes(p0) + ARENA,
        "retain 0: {} MiB of small-block memory stays",
        mapped(p0) >> 20
    );
}

/// Issue 9, defect 4: an idle thread's cache is reclaimed by `trim` from another thread, and
/// `cached` counts it.
#[test]
fn trim_reclaims_an_idle_threads_cache() {
    let p = pool_with(512, None, usize::MAX);
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let mut x = 12345u64;
        let v: Vec<usize> = (0..2000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                p.alloc(70_000 + (x % 180_000) as usize).unwrap().ptr
            })
            .collect();
        for b in v {
            p.free(b).unwrap();
        }
        tx.send(()).unwrap();
        done_rx.recv().unwrap(); // idle, alive, cache full
    });
    rx.recv().unwrap();
    assert!(p.cached_bytes() > 0);
    let before = mapped(p);
    let given = p.trim();
    assert_eq!(
        given, before,
        "every cached byte goes back, the idle thread's too"
    );
    assert_eq!(mapped(p), 0);
    assert_eq!(p.cached_bytes(), 0);
    done_tx.send(()).unwrap();
    worker.join().unwrap();
}

/// Issue 9, defect 1: stale frees racing with `trim` are refused, and no block is ever
/// handed out twice.
#[test]
fn stale_frees_racing_trim_are_refused_and_blocks_never_overlap() {
    let p = pool_with(512, None, usize::MAX);
    let last = std::sync::Arc::new(AtomicUsize::new(0));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let errors_before = crate::error::ERRORS.total.load(Ordering::Relaxed);
    let a = {
        let (last, stop) = (last.clone(), stop.clone());
        std::thread::spawn(move || {
            for i in 0..20_000 {
                let n = if i % 2 == 0 { 100_000 } else { 300_000 };
                let x = p.alloc(n).unwrap().ptr;
                last.store(x, Ordering::Release);
                let _ = p.free(x); // may lose the race to the stale free below
                if i % 4 == 0 {
                    p.trim();
                }
            }
            stop.store(true, Ordering::Release);
        })
    };
    let mut refused = 0u64;
    while !stop.load(Ordering::Acquire) {
        let x = last.load(Ordering::Acquire);
        if x != 0 && p.free(x).is_err() {
            refused += 1;
        }
    }
    a.join().unwrap();
    assert!(refused > 0, "stale frees were refused");
    let _ = errors_before;
    flush_thread_counts();
    assert_eq!(p.stats.in_use(), 0, "in_use never wraps");
    // A correct workload afterwards: blocks never overlap and keep their contents.
    let mut blocks = Vec::new();
    for k in 0..400usize {
        let n = [64, 1000, 100_000, 300_000, 2 << 20][k % 5];
        let x = p.alloc(n).unwrap().ptr;
        // SAFETY: host memory of n bytes.
        unsafe { std::ptr::write_bytes(x as *mut u8, k as u8, n) };
        blocks.push((x, n, k as u8));
    }
    let mut sorted = blocks.clone();
    sorted.sort();
    for w in sorted.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "blocks overlap");
    }
    for (x, n, tag) in blocks {
        // SAFETY: still ours.
        let s = unsafe { std::slice::from_raw_parts(x as *const u8, n) };
        assert!(s.iter().all(|&b| b == tag), "contents kept");
        p.free(x).unwrap();
    }
}

#[test]
fn threads_churn() {
    let p = pool(64);
    let hs: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..20_000usize {
                    let n = (i * 7919 + t * 31) % 5000 + if i % 97 == 0 { 400_000 } else { 0 };
                    let a = p.alloc(n).unwrap().ptr;
                    // SAFETY: host memory of n bytes.
                    unsafe { std::ptr::write_bytes(a as *mut u8, t as u8, n.min(64)) };
                    live.push((a, n, t as u8));
                    if live.len() > 50 {
                        let (a, n, tag) = live.swap_remove(i % 50);
                        // SAFETY: still ours.
                        let s = unsafe { std::slice::from_raw_parts(a as *const u8, n.min(64)) };
                        assert!(s.iter().all(|&b| b == tag));
                        p.free(a).unwrap();
                    }
                    if i % 5000 == 0 && t == 0 {
                        p.trim();
                    }
                }
                for (a, _, _) in live {
                    p.free(a).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(p.stats.in_use(), 0);
}

/// Issue 21, defect 3: a slot in a thread's cache kept its slab in use, and the slab its
/// 64 MiB arena, whatever `retain` said: one block in each of nine arenas, all freed, left
/// the nine arenas mapped with nothing live. Each small block here shares its arena only with
/// one large block that fills the rest; small classes (with batches of cached slots) and large
/// ones, freed in three orders, each on a thread of its own (a thread caches for the first
/// pool it allocates from). With `retain` 0 nothing may stay.
#[test]
fn cached_slots_pin_no_arena_past_retain() {
    const SIZES: [usize; 9] = [16, 64, 100, 1000, 5000, 20_000, 70_000, 150_000, SMALL_MAX];
    for order in 0..3 {
        std::thread::spawn(move || {
            let p = pool_with(512, None, 0);
            let mut blocks = Vec::new();
            for n in SIZES {
                let small = p.alloc(n).unwrap().ptr;
                let slab = p.table.slab_bytes[p.table.class_of(n)];
                let fill = p.alloc(ARENA - slab).unwrap().ptr;
                blocks.push((small, fill));
            }
            assert_eq!(mapped(p), SIZES.len() * ARENA, "one arena per class");
            match order {
                0 => {
                    for &(s, f) in &blocks {
                        p.free(f).unwrap();
                        p.free(s).unwrap();
                    }
                }
                1 => {
                    for &(s, _) in &blocks {
                        p.free(s).unwrap();
                    }
                    for &(_, f) in &blocks {
                        p.free(f).unwrap();
                    }
                }
                _ => {
                    for &(s, f) in &blocks {
                        p.free(s).unwrap();
                        p.free(f).unwrap();
                    }
                }
            }
            flush_thread_counts();
            assert_eq!(p.stats.in_use(), 0);
            assert_eq!(
                mapped(p),
                0,
                "order {order}: {} MiB mapped with nothing live and retain 0",
                mapped(p) >> 20
            );
            // The cache still serves afterwards.
            let x = p.alloc(64).unwrap().ptr;
            p.free(x).unwrap();
        })
        .join()
        .unwrap();
    }
}
