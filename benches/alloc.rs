//! Criterion benchmarks of the NumPy-facing C ABI (`ump_malloc` / `ump_free`) against glibc,
//! and of `ump_identify` (hot path, large block, foreign pointer, contended).
//!
//! Run with `cargo bench --bench alloc`. Without a GPU the library runs in `host` mode.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};
use ump_alloc::ffi::numpy::{ump_calloc, ump_free, ump_malloc, ump_realloc};
use ump_alloc::ffi::query::ump_identify;
use ump_alloc::pointer::ump_identity;

const SIZES: [usize; 6] = [64, 512, 4096, 65536, 1 << 20, 16 << 20];
const BATCH: usize = 1000;
/// Reader threads in the contended benchmark, the bench thread included.
const READERS: usize = 16;

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(30);
    g
}

/// Deterministic xorshift64 generator (no `rand` dependency).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `BATCH` sizes in 16..=8192 and a shuffled free order.
fn batch_plan() -> (Vec<usize>, Vec<usize>) {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let sizes: Vec<usize> = (0..BATCH).map(|_| 16 + rng.below(8192 - 16 + 1)).collect();
    let mut order: Vec<usize> = (0..BATCH).collect();
    for i in (1..BATCH).rev() {
        order.swap(i, rng.below(i + 1));
    }
    (sizes, order)
}

fn identify(p: *const c_void) -> ump_identity {
    // SAFETY: all-zero is a valid `ump_identity` (plain data, kind 0 is UNKNOWN).
    let mut id: ump_identity = unsafe { std::mem::zeroed() };
    id.size = size_of::<ump_identity>() as u32;
    // SAFETY: `id` is a writable `ump_identity` with its `size` set; any address may be asked.
    let rc = unsafe { ump_identify(p, &mut id) };
    debug_assert_eq!(rc, 0);
    id
}

/// CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a writable timespec; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn bench_malloc_free(c: &mut Criterion) {
    let mut g = configure(c, "malloc_free");
    for &size in &SIZES {
        g.bench_with_input(BenchmarkId::new("ump", size), &size, |b, &n| {
            b.iter(|| {
                let p = ump_malloc(black_box(n));
                assert!(!p.is_null());
                ump_free(black_box(p), n);
            })
        });
        g.bench_with_input(BenchmarkId::new("glibc_malloc", size), &size, |b, &n| {
            b.iter(|| {
                // SAFETY: plain malloc/free pair.
                unsafe {
                    let p = libc::malloc(black_box(n));
                    assert!(!p.is_null());
                    libc::free(black_box(p));
                }
            })
        });
        g.bench_with_input(
            BenchmarkId::new("glibc_memalign512", size),
            &size,
            |b, &n| {
                b.iter(|| {
                    let mut p: *mut c_void = std::ptr::null_mut();
                    // SAFETY: 512 is a power of two multiple of sizeof(void*); `p` is writable.
                    unsafe {
                        let rc = libc::posix_memalign(&mut p, 512, black_box(n));
                        assert_eq!(rc, 0);
                        libc::free(black_box(p));
                    }
                })
            },
        );
    }
    g.finish();
}

/// realloc in place of a small block (NumPy's `resize` of a small array): 100 <-> 110 bytes,
/// one size class, against glibc's realloc of the same sizes.
fn bench_realloc_in_place(c: &mut Criterion) {
    let mut g = configure(c, "realloc_in_place");
    g.bench_function("ump/100_110", |b| {
        let mut p = ump_malloc(100);
        let mut k = 0usize;
        b.iter(|| {
            k ^= 1;
            let q = ump_realloc(black_box(p), 100 + 10 * k);
            assert!(q == p);
            p = q;
        });
        ump_free(p, 100);
    });
    g.bench_function("glibc_realloc/100_110", |b| {
        // SAFETY: plain malloc/realloc/free.
        let mut p = unsafe { libc::malloc(100) };
        let mut k = 0usize;
        b.iter(|| {
            k ^= 1;
            // SAFETY: `p` is a live malloc block.
            let q = unsafe { libc::realloc(black_box(p), 100 + 10 * k) };
            assert!(!q.is_null());
            p = q;
        });
        // SAFETY: as above.
        unsafe { libc::free(p) };
    });
    g.finish();
}

fn bench_batch(c: &mut Criterion) {
    let (sizes, order) = batch_plan();
    let mut g = configure(c, "batch");
    let mut ptrs: Vec<*mut c_void> = vec![std::ptr::null_mut(); BATCH];
    g.bench_function("ump/1000_mixed", |b| {
        b.iter(|| {
            for (slot, &n) in ptrs.iter_mut().zip(&sizes) {
                *slot = ump_malloc(black_box(n));
                assert!(!slot.is_null());
            }
            for &i in &order {
                ump_free(black_box(ptrs[i]), sizes[i]);
            }
        })
    });
    g.bench_function("glibc_malloc/1000_mixed", |b| {
        b.iter(|| {
            for (slot, &n) in ptrs.iter_mut().zip(&sizes) {
                // SAFETY: plain malloc.
                *slot = unsafe { libc::malloc(black_box(n)) };
                assert!(!slot.is_null());
            }
            for &i in &order {
                // SAFETY: each pointer came from malloc above and is freed once.
                unsafe { libc::free(black_box(ptrs[i])) };
            }
        })
    });
    g.finish();
}

fn bench_identify(c: &mut Criterion) {
    let mut g = configure(c, "identify");

    // (a) interior of a live 4096-byte block: the hot path.
    let small = ump_malloc(4096);
    assert!(!small.is_null());
    let small_mid = small.wrapping_byte_add(2048).cast_const();
    let id = identify(small_mid);
    assert!(id.ours && id.base == small as usize && id.block_size == 4096);
    g.bench_function("ours_4096_interior", |b| {
        b.iter(|| identify(black_box(small_mid)))
    });

    // (b) interior of a live 1 MiB block.
    let big = ump_calloc(1 << 20, 1);
    assert!(!big.is_null());
    let big_mid = big.wrapping_byte_add(700_000).cast_const();
    let id = identify(big_mid);
    assert!(id.ours && id.base == big as usize && id.block_size == 1 << 20);
    g.bench_function("ours_1MiB_interior", |b| {
        b.iter(|| identify(black_box(big_mid)))
    });

    // (c) a stack address: foreign pointer, slow path.
    let local = 0u64;
    let stack = (&raw const local).cast::<c_void>();
    assert!(!identify(stack).ours);
    g.bench_function("foreign_stack", |b| b.iter(|| identify(black_box(stack))));

    // (d) contended: the bench thread plus READERS - 1 reader threads identify live pointers
    // while one writer thread allocates and frees continuously.
    let live: Arc<Vec<usize>> = Arc::new(
        (0..64usize)
            .map(|i| {
                let n = 64 + i * 1000;
                let p = ump_malloc(n);
                assert!(!p.is_null());
                p as usize + n / 2
            })
            .collect(),
    );
    for &p in live.iter() {
        assert!(identify(p as *const c_void).ours);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let misses = Arc::new(AtomicU64::new(0));
    let writer_cycles = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..READERS - 1 {
        let (live, stop, misses) = (live.clone(), stop.clone(), misses.clone());
        handles.push(thread::spawn(move || {
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let p = live[i % live.len()] as *const c_void;
                if !identify(black_box(p)).ours {
                    misses.fetch_add(1, Ordering::Relaxed);
                }
                i = i.wrapping_add(1);
            }
        }));
    }
    {
        let (stop, cycles) = (stop.clone(), writer_cycles.clone());
        handles.push(thread::spawn(move || {
            let mut rng = XorShift(0xDEAD_BEEF_CAFE_F00D);
            let mut held: Vec<(*mut c_void, usize)> = Vec::with_capacity(32);
            while !stop.load(Ordering::Relaxed) {
                let n = 16 + rng.below(64 << 10);
                let p = ump_malloc(n);
                assert!(!p.is_null());
                held.push((p, n));
                if held.len() == 32 {
                    let (q, m) = held.swap_remove(rng.below(32));
                    ump_free(q, m);
                }
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            for (q, m) in held {
                ump_free(q, m);
            }
        }));
    }
    // Whether criterion ran a contended bench (a name filter may skip them).
    let measured = AtomicBool::new(false);
    g.bench_function(format!("contended_{READERS}r_1w/ours_interior"), |b| {
        b.iter_custom(|iters| {
            measured.store(true, Ordering::Relaxed);
            let mut all_ours = true;
            let start = Instant::now();
            for i in 0..iters as usize {
                let id = identify(black_box(live[i % live.len()] as *const c_void));
                all_ours &= id.ours;
            }
            let elapsed = start.elapsed();
            assert!(all_ours, "a live pointer was not identified as ours");
            elapsed
        })
    });
    // Same loop, timed with this thread's CPU clock: with 17 busy threads on a machine with
    // few cores, wall time mostly counts time spent descheduled; CPU time shows the cost of
    // the calls themselves under contention.
    g.bench_function(
        format!("contended_{READERS}r_1w/ours_interior_thread_cpu"),
        |b| {
            b.iter_custom(|iters| {
                measured.store(true, Ordering::Relaxed);
                let mut all_ours = true;
                let start = thread_cpu_time();
                for i in 0..iters as usize {
                    let id = identify(black_box(live[i % live.len()] as *const c_void));
                    all_ours &= id.ours;
                }
                let elapsed = thread_cpu_time().saturating_sub(start);
                assert!(all_ours, "a live pointer was not identified as ours");
                elapsed
            })
        },
    );
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        misses.load(Ordering::Relaxed),
        0,
        "reader saw ours == false"
    );
    assert!(
        !measured.load(Ordering::Relaxed) || writer_cycles.load(Ordering::Relaxed) > 0,
        "the writer never ran during the contended benchmark"
    );
    g.finish();

    for p in live.iter() {
        // Any interior address maps back to its block; free through the base.
        let id = identify(*p as *const c_void);
        ump_free(id.base as *mut c_void, id.block_size);
    }
    ump_free(small, 4096);
    ump_free(big, 1 << 20);
}

/// Allocation cost against the number of free spans in the pool: N holes of distinct sizes
/// (300 KiB .. ), then alloc+free pairs of a size that fits none exactly. RMM's legacy pool is
/// linear in N; a best-fit tree is logarithmic.
fn bench_free_spans(c: &mut Criterion) {
    let mut g = configure(c, "free_spans");
    for &holes in &[16usize, 1024, 16384] {
        let mut live = Vec::new();
        let mut gaps = Vec::new();
        for i in 0..holes {
            // Distinct hole sizes, separated by live blocks so they cannot merge.
            let n = (320 << 10) + (i % 2048) * 65536;
            let hole = ump_malloc(n);
            let sep = ump_malloc(300 << 10);
            assert!(!hole.is_null() && !sep.is_null());
            gaps.push((hole, n));
            live.push(sep);
        }
        for &(p, n) in &gaps {
            ump_free(p, n);
        }
        g.bench_with_input(BenchmarkId::new("ump_pair_1MiB", holes), &holes, |b, _| {
            b.iter(|| {
                let p = ump_malloc(black_box((1 << 20) + 4096));
                assert!(!p.is_null());
                ump_free(black_box(p), (1 << 20) + 4096);
            })
        });
        // 64 sizes in turn: more than the exact-size list holds, so every request searches
        // the best-fit tree.
        let mut k = 0usize;
        g.bench_with_input(
            BenchmarkId::new("ump_pair_64_sizes", holes),
            &holes,
            |b, _| {
                b.iter(|| {
                    k = (k + 1) % 64;
                    let n = (1 << 20) + k * 65536;
                    let p = ump_malloc(black_box(n));
                    assert!(!p.is_null());
                    ump_free(black_box(p), n);
                })
            },
        );
        for p in live {
            ump_free(p, 300 << 10);
        }
        ump_alloc::ffi::config::ump_trim();
    }
    g.finish();
}

/// The GPU libraries' path: `ump_torch_malloc`/`ump_torch_free` pairs on the legacy default
/// stream (cached after the first). Skipped without a GPU.
fn bench_device_pair(c: &mut Criterion) {
    use ump_alloc::ffi::torch::{ump_torch_free, ump_torch_malloc};
    let probe = ump_torch_malloc(64, 0, std::ptr::null_mut());
    if probe.is_null() {
        eprintln!("device_pair: skipped (no GPU memory in this mode)");
        return;
    }
    ump_torch_free(probe, 64, 0, std::ptr::null_mut());
    let mut g = configure(c, "device_pair");
    for &size in &[512usize, 65536, 1 << 20, 16 << 20, 64 << 20] {
        g.bench_with_input(BenchmarkId::new("ump_torch", size), &size, |b, &n| {
            b.iter(|| {
                let p = ump_torch_malloc(black_box(n), 0, std::ptr::null_mut());
                assert!(!p.is_null());
                ump_torch_free(black_box(p), n, 0, std::ptr::null_mut());
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_malloc_free,
    bench_realloc_in_place,
    bench_batch,
    bench_identify,
    bench_free_spans,
    bench_device_pair
);
criterion_main!(benches);
