//! Issue 21: a refused or failed resize leaves the allocator exactly as it was, and a chunk
//! that changes size never clears registry entries of a range the OS already took back.

use super::*;
use crate::backing::{ARENA, Backing, Chunk, Growth, HostBacking, RangeBook};
use crate::error::Result;
use crate::pool::{lookup, pool_at};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;

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
            return Ok(Chunk::mapped(hint, size, size));
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

/// A block followed by blocks freed onto the exact-size list grows in place over them: the
/// free memory after it is a row of listed spans, merged into the free set for the growth.
/// (Before, only the first listed span was looked at, and for a block that starts its chunk
/// the chunk's growth was computed as `want - chunk size`, which overflowed: a debug build
/// panicked, a release build counted a wrapped byte count as mapped until the backing
/// refused.)
#[test]
fn a_block_grows_in_place_over_listed_neighbours() {
    let p = host(None, usize::MAX);
    let blocks: Vec<usize> = (0..4).map(|_| p.alloc(2 * MB).unwrap().ptr).collect();
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    let [a, b, c, d] = [sorted[0], sorted[1], sorted[2], sorted[3]];
    assert_eq!(
        (b - a, c - b, d - c),
        (2 * MB, 2 * MB, 2 * MB),
        "{sorted:x?}"
    );
    fill(a, 2 * MB, 9);
    fill(d, 2 * MB, 4);
    p.free(b).unwrap();
    p.free(c).unwrap();
    let mapped = p.stats.mapped.load(Ordering::Relaxed);
    // Two listed spans (4 MiB) lie between `a` and `d`: 5 MiB fits in them, 7 MiB does not.
    assert_eq!(resize(p, a, 7 * MB), None);
    assert_eq!(lookup(a).unwrap().size, 2 * MB);
    assert_eq!(resize(p, a, 5 * MB), Some(a));
    let info = lookup(a + 5 * MB - 1).unwrap();
    assert_eq!((info.base, info.size), (a, 5 * MB));
    assert!(same(a, 2 * MB, 9), "the block's bytes moved or changed");
    assert!(
        same(d, 2 * MB, 4),
        "the neighbour after the row was touched"
    );
    assert_eq!(
        p.stats.mapped.load(Ordering::Relaxed),
        mapped,
        "growth in place maps nothing"
    );
    // What is left of the row (1 MiB) is free memory the pool hands out again.
    let e = p.alloc(MB).unwrap().ptr;
    assert_eq!(e, a + 5 * MB);
    for x in [a, d, e] {
        p.free(x).unwrap();
    }
    p.trim();
    assert_eq!(
        p.stats.mapped.load(Ordering::Relaxed),
        0,
        "every chunk went back"
    );
}

/// A block that starts its chunk, grown to less than the chunk holds, whose free memory after
/// it cannot serve the growth: refused cleanly (no overflow, no count changed), and realloc
/// moves the block.
#[test]
fn a_growth_within_a_chunk_that_cannot_be_served_is_refused_cleanly() {
    let p = host(None, usize::MAX);
    let blocks: Vec<usize> = (0..3).map(|_| p.alloc(2 * MB).unwrap().ptr).collect();
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    let [a, b, c] = [sorted[0], sorted[1], sorted[2]];
    assert_eq!(
        (b - a, c - b),
        (2 * MB, 2 * MB),
        "three neighbours: {sorted:x?}"
    );
    fill(a, 2 * MB, 9);
    p.free(b).unwrap();
    // `c` stays in use: 2 MiB of free memory after `a`, and `a` starts its chunk.
    let r0 = p.report();
    let mapped = p.stats.mapped.load(Ordering::Relaxed);
    assert_eq!(resize(p, a, 5 * MB), None);
    assert_eq!(p.report(), r0, "a refused growth changed the pool");
    assert_eq!(p.stats.mapped.load(Ordering::Relaxed), mapped);
    assert_eq!(lookup(a).unwrap().size, 2 * MB);
    assert!(same(a, 2 * MB, 9));
    p.free(a).unwrap();
    p.free(c).unwrap();
    p.trim();
}
