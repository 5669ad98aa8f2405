//! Tests of `src/pool/commit.rs`.

use super::*;
use crate::backing::Kind;
use crate::backing::vmm::{OsPages, SEGMENT, Space};
use crate::backing::{HostBacking, VmmBacking};
use crate::stream::StreamPools;

const MB: usize = 1 << 20;
const PAGE: usize = 2 * MB;

fn space() -> &'static Space {
    Space::new(
        Box::new(OsPages::new(Kind::UMP_KIND_SYSTEM, 0)),
        PAGE,
        8 << 30,
    )
}

/// A pool like a device's: lazily committed, keeps everything (`retain` unbounded).
fn lazy_pool(limit: Option<usize>) -> &'static Pool {
    Pool::new(Box::new(VmmBacking::new(space())), 512, limit, usize::MAX)
}

fn mapped(p: &Pool) -> usize {
    p.stats.mapped.load(Ordering::Relaxed)
}

/// Whether the page holding `addr` is resident (mincore; no access is made).
fn resident(addr: usize) -> bool {
    let page = crate::prim::os::page_size();
    let mut v = 0u8;
    // SAFETY: mincore only inspects the mapping and writes one byte.
    let rc = unsafe { libc::mincore((addr & !(page - 1)) as *mut libc::c_void, page, &mut v) };
    rc == 0 && v & 1 == 1
}

fn touch(ptr: usize, n: usize) {
    // SAFETY: a live block of at least `n` bytes: its pages must be committed (a page that
    // is not faults here and fails the test).
    unsafe { std::ptr::write_bytes(ptr as *mut u8, 0x5a, n) };
}

#[test]
fn only_the_pages_blocks_land_on_are_committed() {
    let p = lazy_pool(None);
    let a = p.alloc(4096).unwrap().ptr;
    touch(a, 4096);
    assert_eq!(
        mapped(p),
        PAGE,
        "one 4 KiB block holds one page, not an arena"
    );
    assert_eq!(p.stats.reserved.load(Ordering::Relaxed), SEGMENT);
    let n = 10 * MB + 5;
    let b = p.alloc(n).unwrap().ptr;
    touch(b, n);
    assert!(
        mapped(p) <= PAGE + n.next_multiple_of(PAGE) + PAGE,
        "{}",
        mapped(p)
    );
    let r = p.report();
    assert_eq!((r.mapped, r.reserved), (mapped(p), SEGMENT));
    p.free(b).unwrap();
    assert!(
        mapped(p) > PAGE,
        "a free block keeps its pages until a purge"
    );
    assert!(p.report().largest_free >= 10 * MB, "{:?}", p.report());
    p.trim();
    assert_eq!(mapped(p), PAGE, "trim purges every free page; a's stays");
    assert!(!resident(b + 4 * MB), "a purged page holds no memory");
    touch(a, 4096);
    p.free(a).unwrap();
    assert_eq!(p.trim(), PAGE);
    assert_eq!(mapped(p), 0);
    assert_eq!(
        p.stats.reserved.load(Ordering::Relaxed),
        0,
        "idle chunks go back on trim"
    );
}

/// Sizes that change every step with long-lived blocks between them: no hole fits the
/// next step, so every step lands on fresh address space. Committing it purges the old
/// holes, so mapped stays near the peak in use; the same steps on a pool of eager chunks
/// (the control) hold far more.
fn fragmenting_steps(p: &'static Pool) -> (usize, usize, Vec<usize>) {
    let mut keep = Vec::new();
    for step in 1..=24 {
        let n = step * 3 * MB + 12_345;
        let x = p.alloc(n).unwrap().ptr;
        touch(x, n);
        let k = p.alloc(300 << 10).unwrap().ptr; // long-lived, between the holes
        touch(k, 300 << 10);
        keep.push(k);
        let y = p.alloc(n / 2).unwrap().ptr;
        touch(y, n / 2);
        p.free(x).unwrap();
        p.free(y).unwrap();
    }
    let peak_mapped = p.stats.mapped_peak.load(Ordering::Relaxed);
    (
        peak_mapped,
        p.stats.in_use_peak.load(Ordering::Relaxed),
        keep,
    )
}

#[test]
fn reuse_of_committed_memory_is_a_hit_and_a_commit_a_miss() {
    let p = lazy_pool(None);
    let small = p.alloc(512).unwrap().ptr;
    let a = p.alloc(100 * MB).unwrap().ptr;
    let b = p.alloc(50 * MB).unwrap().ptr;
    let (h0, m0) = (
        p.stats.hits.load(Ordering::Relaxed),
        p.stats.misses.load(Ordering::Relaxed),
    );
    p.free(a).unwrap();
    p.free(b).unwrap();
    let c = p.alloc(10 * MB).unwrap().ptr;
    assert_eq!(
        p.stats.hits.load(Ordering::Relaxed),
        h0 + 1,
        "served by committed pages"
    );
    assert_eq!(p.stats.misses.load(Ordering::Relaxed), m0);
    let d = p.alloc(400 * MB).unwrap().ptr;
    assert_eq!(
        p.stats.misses.load(Ordering::Relaxed),
        m0 + 1,
        "a commit is a miss"
    );
    for x in [small, c, d] {
        p.free(x).unwrap();
    }
    p.trim();
}

#[test]
fn committing_past_the_peak_purges_old_holes_first() {
    let p = lazy_pool(None);
    let (peak_mapped, peak, keep) = fragmenting_steps(p);
    // Each long-lived block can hold a page of its own beside its 300 KiB.
    let bound = peak + slack(peak) + keep.len() * PAGE + 2 * PAGE;
    assert!(
        peak_mapped <= bound,
        "peak mapped {} MiB > bound {} MiB (peak in use {} MiB)",
        peak_mapped >> 20,
        bound >> 20,
        peak >> 20
    );
    for k in keep {
        touch(k, 300 << 10);
        p.free(k).unwrap();
    }
    p.trim();
    assert_eq!(mapped(p), 0);
    // The control: eager chunks keep every hole.
    let eager = Pool::new(
        Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
        512,
        None,
        usize::MAX,
    );
    let (em, epeak, ekeep) = fragmenting_steps(eager);
    assert!(
        em > epeak + slack(epeak) + ekeep.len() * PAGE + 2 * PAGE,
        "the control should exceed the bound: {} MiB for {} MiB in use",
        em >> 20,
        epeak >> 20
    );
    for k in ekeep {
        eager.free(k).unwrap();
    }
    eager.trim();
}

#[test]
fn idle_pages_go_back_after_the_purge_delay_without_trim() {
    let p = lazy_pool(None);
    let big = p.alloc(50 * MB).unwrap().ptr;
    touch(big, 50 * MB);
    let small = p.alloc(1 << 20).unwrap().ptr;
    p.free(big).unwrap();
    assert!(mapped(p) >= 50 * MB);
    std::thread::sleep(PURGE_DELAY + Duration::from_millis(2 * PURGE_TICK_MS));
    // Any large allocation or free of the pool looks for what is due.
    let other = p.alloc(1 << 20).unwrap().ptr;
    assert!(
        mapped(p) <= 4 * PAGE,
        "{} MiB still mapped",
        mapped(p) >> 20
    );
    for x in [small, other] {
        touch(x, 1 << 20);
        p.free(x).unwrap();
    }
    p.trim();
}

#[test]
fn a_big_phase_falls_back_while_small_blocks_keep_coming() {
    let p = lazy_pool(None);
    let big: Vec<usize> = (1..=6).map(|i| p.alloc(i * 20 * MB).unwrap().ptr).collect();
    let peak = mapped(p);
    let in_use = 5 * 3 * MB;
    assert!(
        peak > in_use + slack(in_use) + 4 * PAGE,
        "the bound below means something"
    );
    for b in big {
        p.free(b).unwrap();
    }
    let t0 = Instant::now();
    let mut small = Vec::new();
    while t0.elapsed() < PURGE_DELAY + Duration::from_millis(4 * PURGE_TICK_MS) {
        small.push(p.alloc(3 * MB).unwrap().ptr);
        if small.len() > 4 {
            p.free(small.remove(0)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        mapped(p) <= in_use + slack(in_use) + 4 * PAGE,
        "{} MiB mapped of a {} MiB peak, {} MiB in use",
        mapped(p) >> 20,
        peak >> 20,
        in_use >> 20
    );
    for x in small {
        p.free(x).unwrap();
    }
    p.trim();
}

#[test]
fn the_limit_counts_committed_pages_and_purges_make_room() {
    let p = lazy_pool(Some(100 * MB));
    let a = p.alloc(60 * MB).unwrap().ptr;
    let e = p.alloc(60 * MB).unwrap_err();
    assert_eq!(e.class, crate::error::ErrorClass::Limit, "{}", e.msg);
    p.free(a).unwrap();
    // a's pages are free: the retry purges them and the request fits.
    let b = p.alloc(70 * MB).unwrap().ptr;
    touch(b, 70 * MB);
    assert!(mapped(p) <= 100 * MB);
    p.free(b).unwrap();
    p.trim();
    assert_eq!(mapped(p), 0);
}

#[test]
fn stream_pools_share_one_space_and_move_idle_chunks_with_their_pages() {
    let sp = space();
    let stats = Box::leak(Box::new(crate::pool::PoolStats::default()));
    let g = StreamPools::new(
        0,
        Box::new(move || Box::new(VmmBacking::new(sp))),
        256,
        None,
        usize::MAX,
        false,
        stats,
    );
    let s1 = g.pool_for(0x10).unwrap();
    let s2 = g.pool_for(0x20).unwrap();
    let big = SEGMENT / 2 + 10 * MB; // a chunk of its own
    let x = s1.alloc(big).unwrap().ptr;
    // Its first and last MiB only: writing all 522 MiB took over a second on a loaded
    // 2-core box, two purge windows, after which the free purged the idle pages (a
    // decay the test does not look at) and the next line read 0 bytes mapped.
    touch(x, MB);
    touch(x + big - MB, MB);
    s1.free(x).unwrap();
    let m = stats.mapped.load(Ordering::Relaxed);
    assert!(
        m >= big,
        "its pages stay committed after the free ({m} bytes mapped)"
    );
    let y = s2.alloc(big).unwrap().ptr;
    assert_eq!(y, x, "s1's idle chunk serves s2");
    assert_eq!(
        stats.mapped.load(Ordering::Relaxed),
        m,
        "with its pages: nothing committed"
    );
    assert_eq!(s2.report().mapped, m);
    assert_eq!(s1.report().mapped, 0);
    s2.free(y).unwrap();
    assert_eq!(g.trim(), m);
    assert_eq!(sp.committed_total(), 0);
    assert_eq!(stats.reserved.load(Ordering::Relaxed), 0);
}
