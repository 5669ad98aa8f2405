//! Files behind shared host memory: a memfd, mappings of it at fixed addresses, holes punched
//! in it, and open-file-description (OFD) byte-range locks on it, which tell a process whether
//! its `fork()` children still live (the kernel drops a child's lock when its last reference to
//! the open file description goes away: at exit or exec).

use std::ffi::CStr;

/// A file descriptor.
pub type Fd = libc::c_int;

/// A new anonymous memory file (`memfd_create`, close-on-exec), empty. None when the kernel
/// refuses.
pub fn memfd(name: &CStr) -> Option<Fd> {
    // SAFETY: `name` is NUL-terminated; no other pointer is passed.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// Set the file's length (`ftruncate`); a memory file grown this way is sparse.
pub fn set_len(fd: Fd, len: u64) -> bool {
    let Ok(len) = libc::off_t::try_from(len) else {
        return false;
    };
    // SAFETY: no pointers.
    unsafe { libc::ftruncate(fd, len) == 0 }
}

/// Open the file behind `fd` again (through `/proc/self/fd`): a new open file description,
/// whose locks are its own, close-on-exec. None without `/proc` or when out of descriptors.
pub fn reopen(fd: Fd) -> Option<Fd> {
    // Formatted without allocating: this runs in fork's prepare handler.
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 12];
    let (mut n, mut len) = (u32::try_from(fd).ok()?, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        path[14 + i] = digits[len - 1 - i];
    }
    // SAFETY: `path` is NUL-terminated (at most 10 digits follow the prefix, zeros after).
    let new = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    (new >= 0).then_some(new)
}

/// [`reopen`], and where the process is at its soft limit of descriptors (`RLIMIT_NOFILE`)
/// but below the hard one, once more with the soft limit raised by one for the call (then set
/// back: a descriptor opened meanwhile stays open).
pub fn reopen_past_limit(fd: Fd) -> Option<Fd> {
    if let Some(new) = reopen(fd) {
        return Some(new);
    }
    // SAFETY: all-zero is a valid `rlimit`; getrlimit fills it.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return None;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_cur + 1,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: valid pointer; a soft limit below the hard one is always accepted.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return None;
    }
    let new = reopen(fd);
    // SAFETY: as above, the limit it had.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    new
}

/// Close a descriptor of ours (errors are ignored).
pub fn close(fd: Fd) {
    // SAFETY: the caller owns `fd`.
    unsafe { libc::close(fd) };
}

/// Map `[addr, addr+len)` (page-aligned, inside a reservation of ours) to the same range of
/// the file, at file offset `addr`, readable and writable: shared (writes reach the file) or
/// private (copy-on-write: writes stay in this process, unwritten pages show the file's current
/// contents). Replaces whatever was mapped there. Returns false when the kernel refuses
/// (nothing changed then).
///
/// # Safety
/// The range lies in address space of ours that nothing else uses.
pub unsafe fn map_at_own_offset(fd: Fd, addr: usize, len: usize, shared: bool) -> bool {
    let Ok(off) = libc::off_t::try_from(addr) else {
        return false;
    };
    let flags = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE | libc::MAP_NORESERVE
    };
    // SAFETY: forwarded from the caller; MAP_FIXED over our own range.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED,
            fd,
            off,
        )
    };
    p as usize == addr
}

/// Give back the file's memory in `[off, off+len)` (it reads as zero afterwards).
pub fn punch_hole(fd: Fd, off: u64, len: usize) -> bool {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return false;
    };
    // SAFETY: no pointers.
    unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        ) == 0
    }
}

/// Bytes of memory the file holds (its allocated blocks).
pub fn allocated_bytes(fd: Fd) -> Option<u64> {
    // SAFETY: all-zero is a valid `stat`; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some(st.st_blocks as u64 * 512)
}

fn flock(kind: libc::c_int, start: u64, len: u64) -> Option<libc::flock> {
    // SAFETY: all-zero is a valid `flock` (l_pid must be 0 for OFD locks).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as libc::c_short;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = libc::off_t::try_from(start).ok()?;
    f.l_len = libc::off_t::try_from(len).ok()?;
    Some(f)
}

/// Take a shared (read) lock on byte `byte` of the file, owned by `fd`'s open file
/// description: it lasts until every descriptor of that description is closed.
pub fn read_lock(fd: Fd, byte: u64) -> bool {
    let Some(f) = flock(libc::F_RDLCK, byte, 1) else {
        return false;
    };
    // SAFETY: `f` is a valid flock.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &f) == 0 }
}

/// Whether another open file description holds a lock on a byte of `[start, start+len)`:
/// the start of one such lock (not necessarily the lowest), or None. Errors count as "none".
pub fn locked_in(fd: Fd, start: u64, len: u64) -> Option<u64> {
    let mut f = flock(libc::F_WRLCK, start, len)?;
    // SAFETY: `f` is a valid flock; the kernel writes the conflicting lock into it.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut f) } != 0 {
        return None;
    }
    (f.l_type != libc::F_UNLCK as libc::c_short).then_some(f.l_start as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_of_another_description_are_seen_and_go_with_it() {
        let fd = memfd(c"ump-test").unwrap();
        assert!(set_len(fd, 1 << 48));
        assert_eq!(locked_in(fd, 1, 100), None);
        let other = reopen(fd).unwrap();
        assert!(read_lock(other, 7));
        assert!(read_lock(other, 42));
        assert!(matches!(locked_in(fd, 1, 100), Some(7 | 42)));
        assert_eq!(locked_in(fd, 8, 34), None, "bytes 8..42");
        assert_eq!(locked_in(fd, 8, 35), Some(42));
        // Its own locks never conflict with a description.
        assert_eq!(locked_in(other, 1, 100), None);
        close(other);
        assert_eq!(
            locked_in(fd, 1, 100),
            None,
            "closing the description drops its locks"
        );
        close(fd);
    }

    #[test]
    fn holes_give_the_memory_back() {
        let fd = memfd(c"ump-test").unwrap();
        assert!(set_len(fd, 1 << 48));
        let len = 1 << 20;
        let addr = crate::prim::os::reserve(len, 1 << 16).unwrap().as_ptr() as usize;
        // SAFETY: the reservation just made.
        assert!(unsafe { map_at_own_offset(fd, addr, len, true) });
        // SAFETY: mapped above, `len` bytes.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 9, len) };
        assert!(allocated_bytes(fd).unwrap() >= len as u64);
        assert!(punch_hole(fd, addr as u64, len));
        assert_eq!(allocated_bytes(fd), Some(0));
        // SAFETY: still mapped; the punched pages read as zero.
        assert_eq!(unsafe { *(addr as *const u8) }, 0);
        // SAFETY: ours, unused.
        unsafe { crate::prim::os::unmap(std::ptr::NonNull::new(addr as *mut u8).unwrap(), len) };
        close(fd);
    }
}
