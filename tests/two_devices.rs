//! Two devices on a machine without a GPU (issue 25's part that needs no second GPU): the
//! device side's pools and the virtual-memory pool are per device, so each test makes device 0
//! and device 1 of the same kind of memory, as the allocator does for two GPUs, over host
//! pages (`HostBacking::for_device`, `OsPages`) that stand in for device memory.
//!
//! What must hold: a block freed on one device is never handed out on the other, each device's
//! `UMP_ALLOC_LIMIT` is its own, a virtual-memory pool commits and purges the pages of its own
//! device only, and every block knows its device.

use std::sync::atomic::Ordering;
use ump_alloc::backing::vmm::{OsPages, Space};
use ump_alloc::backing::{HostBacking, Kind, VmmBacking};
use ump_alloc::pool;
use ump_alloc::pool::PoolStats;
use ump_alloc::stream::StreamPools;

const MIB: usize = 1 << 20;

fn group(device: i32, limit: Option<usize>, vmm: bool) -> &'static StreamPools {
    let stats = Box::leak(Box::new(PoolStats::default()));
    let make: Box<dyn Fn() -> Box<dyn ump_alloc::backing::Backing> + Send + Sync> = if vmm {
        let space = Space::new(
            Box::new(OsPages::new(Kind::UMP_KIND_DEVICE, device)),
            2 * MIB,
            4 << 30,
        );
        Box::new(move || Box::new(VmmBacking::new(space)))
    } else {
        Box::new(move || Box::new(HostBacking::for_device(Kind::UMP_KIND_SYSTEM, device)))
    };
    StreamPools::new(device, make, 512, limit, usize::MAX, false, stats)
}

fn device_of(ptr: usize) -> i32 {
    pool::lookup(ptr).expect("a live block").pool.device()
}

#[test]
fn a_block_freed_on_one_device_is_never_handed_out_on_the_other() {
    for vmm in [false, true] {
        let (d0, d1) = (group(0, None, vmm), group(1, None, vmm));
        for stream in [0usize, 0x10] {
            let mut freed_on_1 = Vec::new();
            for n in [100, 4096, 300 << 10, 3 * MIB, 40 * MIB] {
                let p = d1.pool_for(stream).unwrap().alloc(n).unwrap().ptr;
                assert_eq!(
                    device_of(p),
                    1,
                    "a block of device 1 says device 1 (vmm {vmm})"
                );
                freed_on_1.push((p, n));
                d1.pool_for(stream).unwrap().free(p).unwrap();
            }
            for &(p, n) in &freed_on_1 {
                let q = d0.pool_for(stream).unwrap().alloc(n).unwrap().ptr;
                assert_ne!(
                    q, p,
                    "device 0 got device 1's freed block ({n} bytes, vmm {vmm})"
                );
                assert!(
                    pool::lookup(p).is_none(),
                    "device 1's freed block stays free"
                );
                assert_eq!(device_of(q), 0);
                d0.pool_for(stream).unwrap().free(q).unwrap();
            }
            // Each device reuses its own freed memory.
            let (p, n) = freed_on_1[3];
            assert_eq!(d1.pool_for(stream).unwrap().alloc(n).unwrap().ptr, p);
            d1.pool_for(stream).unwrap().free(p).unwrap();
        }
        d0.trim();
        d1.trim();
    }
}

#[test]
fn each_device_has_its_own_limit() {
    let limit = 256 * MIB;
    let (d0, d1) = (group(0, Some(limit), false), group(1, Some(limit), false));
    let mut on1 = Vec::new();
    loop {
        match d1.pool_for(0).unwrap().alloc(48 * MIB) {
            Ok(a) => on1.push(a.ptr),
            Err(e) => {
                assert_eq!(e.status, ump_alloc::Status::UMP_ERR_OOM, "{}", e.msg);
                break;
            }
        }
        assert!(on1.len() < 64, "the limit never refused");
    }
    assert!(
        d1.stats.mapped.load(Ordering::Relaxed) <= limit,
        "device 1 mapped past its limit"
    );
    // Device 1 is full; device 0 still has all of its own limit.
    let mut on0 = Vec::new();
    for _ in 0..on1.len() {
        on0.push(d0.pool_for(0).unwrap().alloc(48 * MIB).unwrap().ptr);
    }
    assert!(d0.stats.mapped.load(Ordering::Relaxed) <= limit);
    for p in on1 {
        d1.pool_for(0).unwrap().free(p).unwrap();
    }
    for p in on0 {
        d0.pool_for(0).unwrap().free(p).unwrap();
    }
    d0.trim();
    d1.trim();
}

#[test]
fn virtual_memory_pages_are_committed_and_purged_per_device() {
    let (d0, d1) = (group(0, None, true), group(1, None, true));
    let before0 = d0.stats.mapped.load(Ordering::Relaxed);
    let p = d1.pool_for(0).unwrap().alloc(100 * MIB).unwrap().ptr;
    // SAFETY: a live block of 100 MiB, committed (OsPages: readable and writable host pages).
    unsafe { std::ptr::write_bytes(p as *mut u8, 0x5a, 100 * MIB) };
    assert!(d1.stats.mapped.load(Ordering::Relaxed) >= 100 * MIB);
    assert_eq!(
        d0.stats.mapped.load(Ordering::Relaxed),
        before0,
        "device 1's pages counted on device 0"
    );
    let q = d0.pool_for(0).unwrap().alloc(MIB).unwrap().ptr;
    d1.pool_for(0).unwrap().free(p).unwrap();
    let held1 = d1.stats.mapped.load(Ordering::Relaxed);
    let held0 = d0.stats.mapped.load(Ordering::Relaxed);
    d1.trim(); // purges device 1's free pages
    assert!(
        d1.stats.mapped.load(Ordering::Relaxed) < held1,
        "trim purged nothing on device 1"
    );
    assert_eq!(
        d0.stats.mapped.load(Ordering::Relaxed),
        held0,
        "purging device 1 touched device 0's pages"
    );
    // SAFETY: device 0's live block, committed; writing it proves it is still mapped.
    unsafe { std::ptr::write_bytes(q as *mut u8, 0x33, MIB) };
    d0.pool_for(0).unwrap().free(q).unwrap();
    d0.trim();
}
