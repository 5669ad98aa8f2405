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
    debug_assert!(align.is_power_of_two() && size % page_size() == 0);
    let span = size.checked_add(align)?;
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
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

/// Ask for transparent huge pages on a range, as NumPy's default allocator does for blocks of
/// 4 MiB and more. Only whole pages inside the range are advised. Advisory: errors are ignored.
pub fn advise_hugepage(ptr: *mut u8, size: usize) {
    advise(ptr, size, libc::MADV_HUGEPAGE);
}

/// Drop the contents of a range: the next touch sees zero-filled pages.
/// Only whole pages inside the range are dropped.
pub fn discard(ptr: *mut u8, size: usize) -> bool {
    advise(ptr, size, libc::MADV_DONTNEED)
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

/// Set the calling thread's errno (malloc-family contracts report ENOMEM through it).
pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = value };
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
