//! Tests of the pages under the pool's memory: free pages given back when the pool grows,
//! written spans preferred to untouched ones, small pages for arenas of small blocks.

use super::*;

/// Whether the page holding `addr` is resident (mincore; no access is made).
fn resident(addr: usize) -> bool {
    let page = crate::prim::os::page_size();
    let mut v = 0u8;
    // SAFETY: mincore only inspects the mapping and writes one byte.
    let rc = unsafe { libc::mincore((addr & !(page - 1)) as *mut libc::c_void, page, &mut v) };
    rc == 0 && v & 1 == 1
}

/// A freed 20 MiB block in an arena, then a request no free span fits: what the pool does with
/// the freed block's pages as it maps a new chunk. Returns (resident before, resident after,
/// the same 20 MiB asked again: its address, and whether it came zeroed).
fn free_pages_when_growing(kind: Kind) -> (bool, bool, usize, bool) {
    let p = Pool::new(Box::new(HostBacking::new(kind)), 512, None, usize::MAX);
    let a = p.alloc(20 << 20).unwrap().ptr;
    let b = p.alloc(20 << 20).unwrap().ptr;
    let c = p.alloc(20 << 20).unwrap().ptr;
    // SAFETY: a live block of 20 MiB.
    unsafe { std::ptr::write_bytes(a as *mut u8, 0x5a, 20 << 20) };
    p.free(a).unwrap();
    let before = resident(a + (10 << 20));
    let d = p.alloc(30 << 20).unwrap().ptr; // fits no free span: a new chunk
    let after = resident(a + (10 << 20));
    let again = p.alloc(20 << 20).unwrap();
    let out = (before, after, again.ptr, again.zeroed);
    for x in [again.ptr, b, c, d] {
        p.free(x).unwrap();
    }
    out
}

#[test]
fn free_pages_of_plain_host_memory_go_back_when_the_pool_grows() {
    let (before, after, again, zeroed) = free_pages_when_growing(Kind::UMP_KIND_HOST);
    assert!(before, "written and freed: resident until the pool grows");
    assert!(
        !after,
        "a new chunk was mapped: the free block's pages went back first"
    );
    // The block comes back, zeroed by the kernel, and says so (calloc need not clear it).
    assert!(
        zeroed,
        "the pages read zero and the block says so ({again:#x})"
    );
    // Control: memory a GPU reads (`system`) keeps its pages.
    let (before, after, _, zeroed) = free_pages_when_growing(Kind::UMP_KIND_SYSTEM);
    assert!(
        before && after && !zeroed,
        "system memory keeps its free pages"
    );
}

#[test]
fn a_written_free_span_is_preferred_to_a_tighter_untouched_one() {
    let p = pool_with(512, None, usize::MAX);
    let big = p.alloc(40 << 20).unwrap().ptr; // a chunk of its own, written
    // SAFETY: a live block of 40 MiB.
    unsafe { std::ptr::write_bytes(big as *mut u8, 1, 40 << 20) };
    let a = p.alloc(20 << 20).unwrap().ptr; // an arena: 24 MiB of it left, never touched
    let b = p.alloc(20 << 20).unwrap().ptr;
    p.free(big).unwrap(); // 40 MiB free, resident
    let c = p.alloc(22 << 20).unwrap();
    assert!(
        (big..big + (40 << 20)).contains(&c.ptr),
        "the resident 40 MiB, not the untouched 24 MiB tail of the arena ({:#x})",
        c.ptr
    );
    assert!(!c.zeroed, "written memory is not zero");
    for x in [a, b, c.ptr] {
        p.free(x).unwrap();
    }
}

/// The `VmFlags` of the mapping holding `addr` (/proc/self/smaps), e.g. "rd wr mr mw me ac nh".
fn vm_flags(addr: usize) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            inside = (a..b).contains(&addr);
        } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
            return flags.trim().to_string();
        }
    }
    String::new()
}

#[test]
fn arenas_of_small_blocks_ask_for_small_pages_until_a_large_block_lands() {
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
        return; // a kernel without THP takes neither advice
    }
    let p = pool_with(512, None, usize::MAX);
    let small = p.alloc(300 << 10).unwrap().ptr; // past the slab sizes: a span of an arena
    let flags = vm_flags(small)
        .split(' ')
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(
        flags.contains(&"nh".to_string()),
        "MADV_NOHUGEPAGE on the arena: {flags:?}"
    );
    let before = mapped(p);
    let large = p.alloc(8 << 20).unwrap().ptr; // 4 MiB or more: the chunk asks for huge pages
    assert_eq!(
        mapped(p),
        before,
        "the same arena, no new chunk (the test's premise)"
    );
    let flags = vm_flags(small)
        .split(' ')
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(
        flags.contains(&"hg".to_string()) && !flags.contains(&"nh".to_string()),
        "MADV_HUGEPAGE once a large block is in it: {flags:?}"
    );
    // Control: system memory (read by GPUs through HMM) gets no such advice.
    let s = Pool::new(
        Box::new(HostBacking::new(Kind::UMP_KIND_SYSTEM)),
        512,
        None,
        usize::MAX,
    );
    let x = s.alloc(300 << 10).unwrap().ptr;
    assert!(
        !vm_flags(x).split(' ').any(|f| f == "nh"),
        "{}",
        vm_flags(x)
    );
    for (pool, ptr) in [(p, small), (p, large), (s, x)] {
        pool.free(ptr).unwrap();
    }
}
