//! Operating-system memory: anonymous mappings, huge-page advice, errno.

use std::ptr::NonNull;

/// Size of a base page. Every mapping and advice range is a multiple of it.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// Map `size` bytes of fresh zeroed memory aligned to `align` (a power of two that is a
/// multiple of the page size). `size` must be a multiple of the page size.
/// Returns None when the OS refuses.
pub fn map_aligned(size: usize, align: usize) -> Option<NonNull<u8>> {
    map_trimmed(
        size,
        align,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
    )
}

/// An anonymous mapping of `size + align` bytes with `prot` and `flags`, trimmed to the
/// `align`-aligned `size` bytes inside it.
fn map_trimmed(size: usize, align: usize, prot: i32, flags: i32) -> Option<NonNull<u8>> {
    debug_assert!(align.is_power_of_two() && size % page_size() == 0);
    let span = size.checked_add(align)?;
    // SAFETY: an anonymous mapping with no address hint has no preconditions.
    let raw = unsafe { libc::mmap(std::ptr::null_mut(), span, prot, flags, -1, 0) };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = span - head - size;
    // Trim the unaligned head and the tail so exactly [aligned, aligned+size) stays mapped.
    if head > 0 {
        // SAFETY: [start, start+head) is part of the mapping made above and unused.
        unsafe { libc::munmap(raw, head) };
    }
    if tail > 0 {
        // SAFETY: [aligned+size, aligned+size+tail) is the unused end of the same mapping.
        unsafe { libc::munmap((aligned + size) as *mut libc::c_void, tail) };
    }
    NonNull::new(aligned as *mut u8)
}

/// Unmap a range made by [`map_aligned`].
///
/// # Safety
/// `[ptr, ptr+size)` must be a live mapping from `map_aligned` that nothing uses any more.
pub unsafe fn unmap(ptr: NonNull<u8>, size: usize) {
    // SAFETY: the caller guarantees the range is ours and unused.
    unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
}

/// Reserve `size` bytes of address space aligned to `align` with no memory behind it
/// (`PROT_NONE`, not counted against overcommit): [`commit`] makes parts of it usable.
pub fn reserve(size: usize, align: usize) -> Option<NonNull<u8>> {
    map_trimmed(
        size,
        align,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
    )
}

/// Make `[ptr, ptr+size)` (page-aligned, inside a reservation) readable and writable. Pages
/// read as zero until written. Returns false when the OS refuses (no memory).
pub fn commit(ptr: *mut u8, size: usize) -> bool {
    // SAFETY: the caller's range lies in a reservation of ours; mprotect changes no contents.
    unsafe { libc::mprotect(ptr.cast(), size, libc::PROT_READ | libc::PROT_WRITE) == 0 }
}

/// Give the memory of `[ptr, ptr+size)` back and make the range inaccessible again (a touch
/// faults); it stays reserved.
///
/// # Safety
/// Nothing uses the range any more.
pub unsafe fn decommit(ptr: *mut u8, size: usize) {
    // SAFETY: the caller guarantees the range is ours and unused; a fixed PROT_NONE mapping
    // over it drops its pages in one call.
    unsafe {
        libc::mmap(
            ptr.cast(),
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

/// Grow the mapping `[ptr, ptr+old)` to `new` bytes at the same address, if the address space
/// after it is free (`mremap` without moving). Returns whether it grew; if not, nothing changed.
///
/// # Safety
/// `[ptr, ptr+old)` is a whole private anonymous mapping of ours.
pub unsafe fn remap_in_place(ptr: NonNull<u8>, old: usize, new: usize) -> bool {
    // SAFETY: forwarded from the caller; without MREMAP_MAYMOVE the mapping stays put or
    // nothing changes.
    unsafe { libc::mremap(ptr.as_ptr().cast(), old, new, 0) != libc::MAP_FAILED }
}

/// Move the pages of the mapping `[ptr, ptr+old)` into `dest` (a reservation of `new` bytes
/// from [`reserve`], which the move replaces), growing it to `new` bytes: page tables move, no
/// byte is copied (`mremap(MREMAP_MAYMOVE | MREMAP_FIXED)`). Returns whether it moved; if not,
/// nothing changed and `dest` is still the caller's.
///
/// # Safety
/// `[ptr, ptr+old)` is a whole private anonymous mapping of ours; after a move its old range is
/// gone and must not be used.
pub unsafe fn remap_into(ptr: NonNull<u8>, old: usize, new: usize, dest: NonNull<u8>) -> bool {
    // SAFETY: forwarded from the caller; `dest` is a reservation of ours.
    let p = unsafe {
        libc::mremap(
            ptr.as_ptr().cast(),
            old,
            new,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dest.as_ptr(),
        )
    };
    p != libc::MAP_FAILED
}

/// Give back `dest` after [`remap_into`] into it failed. The kernel may have unmapped it
/// already (it unmaps the destination before it checks the memory accounting), and then the
/// range is free for any thread's next mapping: a placeholder asked for there with
/// `MAP_FIXED_NOREPLACE` succeeds only on a free range (which is then ours again, and goes);
/// an occupied range is still our destination in every failure the kernel reports before it
/// touches the destination (bad arguments, the map count), and goes.
///
/// # Safety
/// `[dest, dest+size)` was a mapping of ours given to a `remap_into` that failed, and is used
/// by nothing of ours.
pub unsafe fn release_after_failed_remap(dest: NonNull<u8>, size: usize) {
    // SAFETY: a hint with MAP_FIXED_NOREPLACE never replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            dest.as_ptr().cast(),
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED && p != dest.as_ptr().cast() {
        // A kernel older than 4.17 took the flag as a hint and mapped elsewhere.
        // SAFETY: the mapping just made, ours.
        unsafe { libc::munmap(p, size) };
    }
    // SAFETY: the range is ours: the placeholder, or the destination itself (see above).
    unsafe { libc::munmap(dest.as_ptr().cast(), size) };
}

/// Ask for transparent huge pages on a range, as NumPy's default allocator does for blocks of
/// 4 MiB and more. Only whole pages inside the range are advised. Advisory: errors are ignored.
pub fn advise_hugepage(ptr: *mut u8, size: usize) {
    advise(ptr, size, libc::MADV_HUGEPAGE);
}

/// Ask for small pages on a range (`MADV_NOHUGEPAGE`): where the kernel's THP setting is
/// `always`, memory of small blocks would otherwise fault in 2 MiB at a time, which glibc's
/// heap, where NumPy's small arrays live by default, does not. Whole pages only; advisory.
pub fn advise_nohugepage(ptr: *mut u8, size: usize) {
    advise(ptr, size, libc::MADV_NOHUGEPAGE);
}

/// Keep a range out of `fork()` children: the child gets no mapping there (a hole), and fork
/// copies neither its pages nor its page tables. Only whole pages inside the range.
pub fn advise_dontfork(ptr: *mut u8, size: usize) -> bool {
    advise(ptr, size, libc::MADV_DONTFORK)
}

/// Drop the contents of a range: the next touch sees zero-filled pages.
/// Only whole pages inside the range are dropped.
pub fn discard(ptr: *mut u8, size: usize) -> bool {
    advise(ptr, size, libc::MADV_DONTNEED)
}

/// Fault every page of `[ptr, ptr+size)` in for writing now (`MADV_POPULATE_WRITE`), the range
/// cut into `threads` pieces of whole multiples of `piece_align` bytes faulted in at once by
/// threads that live only for this call (a piece a thread cannot be started for is faulted in
/// by the caller's). Returns false when a piece was refused (a kernel older than 5.14: EINVAL;
/// no memory: ENOMEM; never a signal): the pages left fault in on first touch, as without it.
pub fn populate_write(ptr: *mut u8, size: usize, threads: usize, piece_align: usize) -> bool {
    let populate =
        |start: usize, len: usize| advise(start as *mut u8, len, libc::MADV_POPULATE_WRITE);
    let threads = threads.max(1);
    let piece = size.div_ceil(threads).next_multiple_of(piece_align.max(1));
    if threads == 1 || piece >= size {
        return populate(ptr as usize, size);
    }
    let base = ptr as usize;
    std::thread::scope(|s| {
        let mut workers = Vec::with_capacity(threads);
        let mut ok = true;
        for off in (piece..size).step_by(piece) {
            let len = piece.min(size - off);
            let started = std::thread::Builder::new()
                .name("ump-populate".into())
                .stack_size(64 << 10)
                .spawn_scoped(s, move || populate(base + off, len));
            match started {
                Ok(w) => workers.push(w),
                Err(_) => ok &= populate(base + off, len),
            }
        }
        ok &= populate(base, piece);
        // A worker only returns madvise's answer; a panic there is not possible short of an
        // allocation failure in the runtime, and counts as a refused piece.
        workers
            .into_iter()
            .fold(ok, |ok, w| w.join().unwrap_or(false) & ok)
    })
}

fn advise(ptr: *mut u8, size: usize, advice: libc::c_int) -> bool {
    let page = page_size();
    let start = (ptr as usize).next_multiple_of(page);
    let end = (ptr as usize + size) & !(page - 1);
    if end <= start {
        return false;
    }
    // SAFETY: madvise on a range inside a mapping we own; these advices never unmap it.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) == 0 }
}

/// Whether the page holding `addr` is mapped in this process (mincore fails with ENOMEM on
/// unmapped pages). Reads nothing at `addr`.
pub fn is_mapped(addr: usize) -> bool {
    let page = page_size();
    let start = addr & !(page - 1);
    if start == 0 {
        return false;
    }
    let mut vec = 0u8;
    // SAFETY: mincore only inspects the mapping and writes one byte into `vec`; it never
    // faults on unmapped addresses.
    unsafe { libc::mincore(start as *mut libc::c_void, page, &mut vec) == 0 }
}

/// The number of threads of this process (`num_threads` of `/proc/self/stat`); None where it
/// cannot be read.
pub fn thread_count() -> Option<usize> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold anything.
    let rest = &stat[stat.rfind(')')? + 1..];
    // State is field 3; num_threads is field 20: the 18th after the name.
    rest.split_whitespace().nth(17)?.parse().ok()
}

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Register this process for `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (Linux 4.14+).
/// Returns whether [`membarrier`] is usable.
pub fn membarrier_register() -> bool {
    // SAFETY: membarrier's query and register commands take no pointers.
    let q = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
    if q < 0 || q & MEMBARRIER_CMD_PRIVATE_EXPEDITED as libc::c_long == 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        ) == 0
    }
}

/// Run a full memory barrier on every running thread of this process (the heavy side of an
/// asymmetric fence). Returns false when the kernel refused (the caller then fences itself).
pub fn membarrier() -> bool {
    // SAFETY: the expedited barrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// Whether the kernel gives shared memory (a memory file's pages) transparent huge pages:
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` set to `always`, `within_size` or
/// `advise` (ump-alloc advises its chunks), or `force`. False at `never` and `deny` (the lent
/// GPU machines), and where the file is missing: 4 KiB pages, which cost about 0.45 s per GiB
/// to fault in against about 0.1 s for anonymous huge pages.
pub fn shmem_huge_pages() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").is_ok_and(|s| {
        let chosen = s.split('[').nth(1).and_then(|t| t.split(']').next());
        matches!(chosen, Some("always" | "within_size" | "advise" | "force"))
    })
}

/// Bytes of memory this process may use: the machine's (`MemTotal`), or its cgroup's limit
/// when that is lower (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`). 0 if unknown.
pub fn memory_available() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<usize>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024);
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| {
        std::fs::read_to_string(p)
            .ok()?
            .trim()
            .parse::<usize>()
            .ok()
    })
    .min();
    match cgroup {
        Some(c) if c > 0 && (total == 0 || c < total) => c,
        _ => total,
    }
}

/// Set the calling thread's errno (malloc-family contracts report ENOMEM through it).
/// Write `msg` to standard error with one `write(2)` (no buffering, no lock a fork could
/// leave held); errors are ignored.
pub fn write_stderr(msg: &str) {
    // SAFETY: the pointer and length describe `msg`'s bytes, valid for the call.
    let _ = unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = value };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prim::file;

    #[test]
    fn thread_count_follows_the_threads_of_the_process() {
        let n = thread_count().expect("/proc/self/stat");
        let tasks = || std::fs::read_dir("/proc/self/task").unwrap().count();
        assert!(n >= 1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv().ok());
        // Other tests' threads come and go: one more than before, as /proc/self/task says.
        let (with, listed) = (thread_count().unwrap(), tasks());
        assert!(
            with >= 2 && with.abs_diff(listed) <= 2,
            "{with} against {listed}"
        );
        drop(tx);
        t.join().unwrap();
    }

    #[test]
    fn aligned_mapping_is_aligned_zeroed_and_writable() {
        let align = 1 << 21;
        let size = 3 << 16;
        let p = map_aligned(size, align).unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0);
        // SAFETY: the mapping is ours, `size` bytes long.
        let s = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), size) };
        assert!(s.iter().all(|&b| b == 0));
        s.fill(7);
        advise_hugepage(p.as_ptr(), size);
        assert!(discard(p.as_ptr(), size));
        assert!(
            s.iter().all(|&b| b == 0),
            "discarded pages read back as zero"
        );
        assert!(is_mapped(p.as_ptr() as usize + 5));
        // SAFETY: unused from here on.
        unsafe { unmap(p, size) };
        assert!(!is_mapped(p.as_ptr() as usize + 5));
        assert!(!is_mapped(0));
    }

    /// Pages of `[p, p+size)` resident now (mincore).
    fn resident(p: *mut u8, size: usize) -> usize {
        let mut v = vec![0u8; size.div_ceil(page_size())];
        // SAFETY: a mapping of ours, `v` one byte per page of it.
        assert_eq!(unsafe { libc::mincore(p.cast(), size, v.as_mut_ptr()) }, 0);
        v.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn populate_write_faults_every_page_in_from_several_threads() {
        // Pages of a memory file mapped shared, as the pinned host side's; a length that does
        // not divide into the pieces.
        let size = (24 << 20) + 3 * page_size();
        let fd = file::memfd(c"ump-test").unwrap();
        assert!(file::set_len(fd, size as u64));
        for threads in [1, 4] {
            // SAFETY: a new shared mapping of the file, unmapped below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            let p = p.cast::<u8>();
            // The file empty again (mincore counts a file's cached pages).
            assert!(file::punch_hole(fd, 0, size));
            // SAFETY: inside the mapping.
            unsafe { p.add(5).write(9) };
            let before = resident(p, size);
            assert_eq!(before, 1, "one page written before");
            assert!(populate_write(p, size, threads, 1 << 21));
            assert_eq!(resident(p, size), size / page_size(), "{threads} threads");
            // SAFETY: inside the mapping, every page of it resident.
            let s = unsafe { std::slice::from_raw_parts(p, size) };
            assert_eq!(s[5], 9, "contents are kept");
            assert!(s.iter().enumerate().all(|(i, &b)| b == (i == 5) as u8 * 9));
            // SAFETY: unused from here on.
            unsafe { libc::munmap(p.cast(), size) };
        }
        file::close(fd);
    }
}
