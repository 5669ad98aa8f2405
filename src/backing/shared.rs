//! Pinned host memory that `fork()` does not copy.
//!
//! The kernel copies every page pinned for DMA (`cuMemHostRegister`) into a `fork()` child at
//! fork time, so that the parent keeps the pages the GPU maps: with anonymous pinned memory
//! every child of a process holding 2 GiB of NumPy arrays starts with 2 GiB of its own
//! (1.4-2.1 s per fork on the lent H100). Pages of a file mapped `MAP_SHARED` are not copied.
//! So the pinned host side keeps its pages in one memory file:
//!
//! - **One memfd for the process**, sparse, [`FILE_SIZE`] long (a memfd reserves nothing until
//!   written). A chunk's file offset is its address, so there is no offset allocator, a chunk's
//!   room to grow is contiguous in the file too, and a child can map any range again from the
//!   one file. A chunk is mapped `MAP_SHARED` at its address and advised `MADV_DONTFORK`: fork
//!   copies neither its pages nor its page tables.
//! - **In the child** (`fork_child`, run before `fork()` returns there), every live chunk is
//!   mapped again at the same address, `MAP_PRIVATE` from the file: the child reads the
//!   parent's data, and its writes stay its own (copy-on-write). Only the process that made
//!   the file (the *owner*) does that: a grandchild inherits the child's private mappings the
//!   ordinary way.
//! - **Releasing a chunk** in the owner unmaps it and punches its range out of the file (else
//!   the file would keep the pages); a fork child only unmaps (its pages are its own copies,
//!   and a punch would destroy the parent's data).
//!
//! **What a child sees.** A page the child has not written shows the file: the parent's later
//! writes to that page show in the child. For an array made before the fork and written in
//! place by the parent afterwards, that is a visible difference from a copy (documented). For
//! memory the parent *frees* and reuses, it would be corruption: a child may still read its
//! view of an array the parent freed. So every fork gets a *generation* (counted in the
//! owner), and the child keeps a shared lock on byte `generation` of the file through an open
//! file description of its own (`F_OFD_SETLK`), made by the parent before the fork so that it
//! exists the moment fork returns; the parent closes its reference afterwards. The kernel
//! drops the lock when the child and every process that inherited the description (its own
//! fork children) are gone: exit, exec (close-on-exec) or a close of the descriptor.
//! [`live_max`] is the newest generation whose children may live. A block allocated in
//! generation `g` was live at every later fork, so the pool holds it back when it is freed
//! while `g < live_max()` (see `pool::hold`), and gives it back once the locks are gone.

use crate::error::{Error, Result};
use crate::prim::file::{self, Fd};
use crate::prim::fork::lock;
use crate::prim::os;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Length of the file: above every user-space address on x86-64 and aarch64 (48-bit address
/// spaces), so that a chunk's file offset can be its address.
pub(crate) const FILE_SIZE: u64 = 1 << 48;

/// How often, at most, the children's locks are looked at again (blocks held back for them
/// go back this long after the last child exits, at the pool's next allocation or `trim`).
const REFRESH_MS: u64 = 10;

/// The process's memory file.
struct File {
    fd: Fd,
    /// This process made the file (false in a fork child: its mappings of it are private).
    owner: AtomicBool,
    /// Ranges mapped from the file, by address: what a fork child maps again.
    live: Mutex<BTreeMap<usize, usize>>,
}

static FILE: OnceLock<std::result::Result<File, String>> = OnceLock::new();
/// Serialises making the file and reading the children's locks; taken at fork (after every
/// pool lock), so that neither is half done in a child.
static LOCK: Mutex<()> = Mutex::new(());

/// The newest fork's generation (forks the owner made while it had shared pages).
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The newest generation whose children may still live (0: no child may).
static LIVE_MAX: AtomicU64 = AtomicU64::new(0);
/// The newest generation whose child could not be given a lock (no `/proc`, no descriptors):
/// counted alive for good.
static UNTRACKED: AtomicU64 = AtomicU64::new(0);
/// When the locks are next looked at (milliseconds since `EPOCH`).
static NEXT_REFRESH: AtomicU64 = AtomicU64::new(0);
/// The descriptor holding the lock of the fork in progress (-1: none).
static FORK_LOCK_FD: AtomicI32 = AtomicI32::new(-1);
/// An open file description of the file made ahead for the next fork's lock (-1: none), so
/// that a fork made while the process has no descriptor left is tracked all the same.
static SPARE_FD: AtomicI32 = AtomicI32::new(-1);
/// Times [`LIVE_MAX`] went down (children gone): held blocks can go back only after one.
static DROPS: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();

fn now_ms() -> u64 {
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Make the file and check that every call the mechanism needs works here.
fn make() -> std::result::Result<File, String> {
    let fd = file::memfd(c"ump-alloc-pinned").ok_or("memfd_create failed")?;
    let check = || -> std::result::Result<(), String> {
        if !file::set_len(fd, FILE_SIZE) {
            return Err("the memory file cannot be made 256 TiB long (RLIMIT_FSIZE?)".into());
        }
        if !file::punch_hole(fd, 0, os::page_size()) {
            return Err("the kernel cannot punch holes in a memory file".into());
        }
        let other = file::reopen(fd).ok_or("/proc/self/fd is not available")?;
        let seen = file::read_lock(other, 1) && file::locked_in(fd, 1, 1) == Some(1);
        file::close(other);
        if !seen || file::locked_in(fd, 1, 1).is_some() {
            return Err("open-file-description locks (Linux 3.15) do not work here".into());
        }
        Ok(())
    };
    match check() {
        Ok(()) => Ok(File {
            fd,
            owner: AtomicBool::new(true),
            live: Mutex::new(BTreeMap::new()),
        }),
        Err(e) => {
            file::close(fd);
            Err(e)
        }
    }
}

fn the_file() -> std::result::Result<&'static File, &'static str> {
    let f = match FILE.get() {
        Some(f) => f,
        None => {
            let _g = lock(&LOCK);
            let f = FILE.get_or_init(make);
            if let Ok(f) = f {
                make_spare(f);
            }
            f
        }
    };
    f.as_ref().map_err(String::as_str)
}

/// Open the next fork's lock description ahead, if there is none (under [`LOCK`]).
fn make_spare(f: &File) {
    if SPARE_FD.load(Ordering::Relaxed) < 0
        && let Some(fd) = file::reopen(f.fd)
    {
        SPARE_FD.store(fd, Ordering::Relaxed);
    }
}

/// Whether pinned memory can be shared pages here; if not, why (the host side then copies
/// at fork, as with `UMP_ALLOC_PINNED_FORK=copy`).
pub fn available() -> std::result::Result<(), String> {
    the_file().map(|_| ()).map_err(str::to_string)
}

/// Whether this process owns the file (made it, or has not made it yet): false in a fork
/// child of the owner, which must not map new shared pages (the parent's file offsets are
/// its addresses) nor punch the parent's.
pub fn owner() -> bool {
    FILE.get()
        .and_then(|f| f.as_ref().ok())
        .is_none_or(|f| f.owner.load(Ordering::Relaxed))
}

/// Bytes of memory the file holds (None when there is none).
pub fn file_bytes() -> Option<u64> {
    file::allocated_bytes(FILE.get()?.as_ref().ok()?.fd)
}

/// Map `[addr, addr+len)` (inside a reservation of ours) to the file, shared, kept out of fork
/// children. Refused in a fork child of the owner.
pub(crate) fn map(addr: usize, len: usize) -> Result<()> {
    let f = the_file().map_err(Error::unsupported)?;
    if !f.owner.load(Ordering::Relaxed) {
        return Err(Error::unsupported(
            "shared pinned pages cannot be made in a fork() child",
        ));
    }
    if (addr + len) as u64 > FILE_SIZE {
        return Err(Error::unsupported(format!(
            "address {addr:#x} lies past the shared memory file"
        )));
    }
    // SAFETY: the caller's reservation, unused.
    if !unsafe { file::map_at_own_offset(f.fd, addr, len, true) } {
        return Err(Error::oom(format!(
            "the OS refused a shared mapping of {len} bytes"
        )));
    }
    os::advise_dontfork(addr as *mut u8, len);
    lock(&f.live).insert(addr, len);
    Ok(())
}

/// Grow the range mapped at `base` from `old` to `new` bytes (the addresses after it are a
/// reservation of ours). Returns false when the OS refuses (nothing changed then).
pub(crate) fn extend(base: usize, old: usize, new: usize) -> bool {
    let Ok(f) = the_file() else { return false };
    if !f.owner.load(Ordering::Relaxed) || (base + new) as u64 > FILE_SIZE {
        return false;
    }
    let ext = base + old;
    // SAFETY: the reservation after the chunk, unused (the caller's contract).
    if !unsafe { file::map_at_own_offset(f.fd, ext, new - old, true) } {
        return false;
    }
    os::advise_dontfork(ext as *mut u8, new - old);
    lock(&f.live).insert(base, new);
    true
}

/// Undo [`extend`]: `[base+old, base+new)` goes back to the reservation and out of the file.
///
/// # Safety
/// Nothing uses the range.
pub(crate) unsafe fn retract(base: usize, old: usize, new: usize) {
    let Ok(f) = the_file() else { return };
    // SAFETY: forwarded from the caller.
    unsafe { os::decommit((base + old) as *mut u8, new - old) };
    file::punch_hole(f.fd, (base + old) as u64, new - old);
    lock(&f.live).insert(base, old);
}

/// The range mapped at `base` (`len` bytes) was unmapped: forget it, and in the owner give
/// its memory back (a fork child's copies are its own, and the file is the parent's).
pub(crate) fn forget(base: usize, len: usize) {
    let Ok(f) = the_file() else { return };
    lock(&f.live).remove(&base);
    if f.owner.load(Ordering::Relaxed) {
        file::punch_hole(f.fd, base as u64, len);
    }
}

/// The generation a block allocated now belongs to.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// The newest fork generation whose children may still read this process's shared pages
/// (0: none may). A block of generation `g` that is freed while `g < live_max()` must not be
/// reused: a child of a fork after `g` may read it.
#[inline]
pub fn live_max() -> u64 {
    LIVE_MAX.load(Ordering::Relaxed)
}

/// How many times [`live_max`] went down so far: blocks held back for children can go back
/// only after it changed (a pool looks at its held blocks again only then).
#[inline]
pub fn drops() -> u64 {
    DROPS.load(Ordering::Acquire)
}

/// Look at the children's locks again (unless `force`, at most every [`REFRESH_MS`]) and
/// lower [`live_max`] to the newest generation with a live child. Returns `live_max()` as it
/// was then: a fork may raise it as soon as this returns, so a caller deciding what to give
/// back reads [`live_max`] again under a lock that keeps forks out (a pool's).
pub fn refresh(force: bool) -> u64 {
    let cur = LIVE_MAX.load(Ordering::Relaxed);
    if cur == 0 {
        return 0;
    }
    let now = now_ms();
    if !force && now < NEXT_REFRESH.load(Ordering::Relaxed) {
        return cur;
    }
    let Some(Ok(f)) = FILE.get() else {
        return cur;
    };
    // A fork in progress raises LIVE_MAX under this lock: never overwritten with an older view.
    let _g = lock(&LOCK);
    NEXT_REFRESH.store(now + REFRESH_MS, Ordering::Relaxed);
    let newest = GENERATION.load(Ordering::Relaxed);
    let mut live = 0;
    let mut from = 1;
    while from <= newest {
        // Some lock in [from, newest]: not necessarily the lowest, so look above it again.
        match file::locked_in(f.fd, from, newest - from + 1) {
            Some(g) if g >= from => {
                live = live.max(g);
                from = g + 1;
            }
            _ => break,
        }
    }
    let live = live.max(UNTRACKED.load(Ordering::Relaxed));
    if live < LIVE_MAX.swap(live, Ordering::Relaxed) {
        DROPS.fetch_add(1, Ordering::Release);
    }
    live
}

// ---- fork -------------------------------------------------------------------------------------

/// Before `fork()`, after every pool lock: in the owner of live shared pages, open the next
/// generation and give the child its lock.
pub(crate) fn fork_prepare(held: &mut crate::prim::fork::Held) {
    held.push(lock(&LOCK));
    let Some(Ok(f)) = FILE.get() else { return };
    let live = lock(&f.live);
    if f.owner.load(Ordering::Relaxed) && !live.is_empty() {
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
        // The description opened ahead, else a new one (past the soft descriptor limit if
        // need be): the child's lock needs one of its own.
        let spare = SPARE_FD.swap(-1, Ordering::Relaxed);
        let fd = if spare >= 0 {
            Some(spare)
        } else {
            file::reopen_past_limit(f.fd)
        };
        match fd {
            Some(fd) if file::read_lock(fd, generation) => {
                FORK_LOCK_FD.store(fd, Ordering::Relaxed);
            }
            other => {
                if let Some(fd) = other {
                    file::close(fd);
                }
                // Its liveness cannot be seen: what it may read is held back for good.
                UNTRACKED.fetch_max(generation, Ordering::Relaxed);
                os::write_stderr(
                    "ump-alloc: warning: cannot track a fork() child (no /proc/self/fd, or no \
                     file descriptor left even past the soft limit); pinned blocks it may read \
                     stay held back for the life of this process\n",
                );
            }
        }
        LIVE_MAX.store(generation, Ordering::SeqCst);
        // Threads that free without taking a lock read LIVE_MAX relaxed: make the new value
        // visible to each of them before the fork (where the kernel supports it).
        os::membarrier();
    }
    held.push(live);
}

/// In the parent after `fork()` (or after a failed fork): the child holds the lock now.
/// The next fork's description is opened ahead while descriptors are free.
pub(crate) fn fork_parent() {
    let fd = FORK_LOCK_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        file::close(fd);
        if let Some(Ok(f)) = FILE.get() {
            make_spare(f);
        }
    }
}

/// In the child after `fork()`, with every allocator lock free again and no other thread:
/// map the owner's live chunks again, private, from the file.
pub(crate) fn fork_child() {
    // The lock's descriptor stays open for the child's whole life; the parent's spare is
    // the parent's (a child makes no generations: it does not own the file).
    FORK_LOCK_FD.store(-1, Ordering::Relaxed);
    let spare = SPARE_FD.swap(-1, Ordering::Relaxed);
    if spare >= 0 {
        file::close(spare);
    }
    LIVE_MAX.store(0, Ordering::Relaxed);
    DROPS.fetch_add(1, Ordering::Release);
    UNTRACKED.store(0, Ordering::Relaxed);
    let Some(Ok(f)) = FILE.get() else { return };
    if !f.owner.swap(false, Ordering::Relaxed) {
        return;
    }
    let live = lock(&f.live);
    for (&addr, &len) in live.iter() {
        // SAFETY: a hole where the parent's chunk was (MADV_DONTFORK), ours in this child.
        if !unsafe { file::map_at_own_offset(f.fd, addr, len, false) } {
            os::write_stderr(
                "ump-alloc: error: a fork() child could not map the parent's pinned memory \
                 (too many mappings, or no memory for its page tables); touching arrays made \
                 before the fork will crash this child. UMP_ALLOC_PINNED_FORK=copy avoids it.\n",
            );
        }
    }
}
