//! Helpers of the fork tests (`fork_share`, `fork_fds`): a pinned host side over shared pages
//! without the CUDA registration, fill and check patterns, pipes, forked children that never
//! unwind, and the end-of-test check that nothing stays behind.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};
use ump_alloc::backing::{RegisteredBacking, shared};
use ump_alloc::config::Config;
use ump_alloc::host::HostPools;
use ump_alloc::mode::HostSide;
use ump_alloc::pool::{self, Pool};

pub const MIB: usize = 1 << 20;

pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pinned host side over shared pages (or anonymous ones: `shared == false`), unregistered.
pub fn host(shared_pages: bool) -> HostPools {
    let b = RegisteredBacking::unregistered(shared_pages);
    assert_eq!(
        b.is_shared(),
        shared_pages,
        "shared pages: {:?}",
        shared::available()
    );
    let config = Config {
        host_retain: 0,
        ..Config::default()
    };
    HostPools::with_backing(HostSide::Pinned, Box::new(b), 0, &config)
}

pub fn fill(p: usize, n: usize, seed: u64) {
    // SAFETY: a live host block of at least n bytes.
    let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, n / 8) };
    for (i, w) in s.iter_mut().enumerate() {
        *w = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
    }
}

pub fn holds(p: usize, n: usize, seed: u64) -> bool {
    // SAFETY: a host block of at least n bytes, mapped in this process.
    let s = unsafe { std::slice::from_raw_parts(p as *const u64, n / 8) };
    s.iter()
        .enumerate()
        .all(|(i, &w)| w == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed)
}

pub fn private_dirty_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("Private_Dirty:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::MAX, |kib| kib / 1024.0)
}

pub struct Pipe {
    pub r: i32,
    pub w: i32,
}

impl Pipe {
    pub fn new() -> Pipe {
        let mut fds = [0; 2];
        // SAFETY: a valid out-array of two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        Pipe {
            r: fds[0],
            w: fds[1],
        }
    }
    pub fn send(&self, b: u8) {
        // SAFETY: one byte from a valid buffer.
        assert_eq!(
            unsafe { libc::write(self.w, (&b as *const u8).cast(), 1) },
            1
        );
    }
    /// The next byte, or None at end of file (every writer gone) or after 30 s.
    pub fn recv(&self) -> Option<u8> {
        let mut pfd = libc::pollfd {
            fd: self.r,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 30_000) } != 1 {
            return None;
        }
        let mut b = 0u8;
        // SAFETY: one byte into a valid buffer.
        (unsafe { libc::read(self.r, (&mut b as *mut u8).cast(), 1) } == 1).then_some(b)
    }
    pub fn close_write(&self) {
        // SAFETY: our descriptor.
        unsafe { libc::close(self.w) };
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // SAFETY: our descriptors (closing a closed one only returns an error).
        unsafe {
            libc::close(self.r);
            libc::close(self.w);
        }
    }
}

/// Fork; the child runs `f` and leaves with status 0 when it returns true (1 when false, 2
/// when it panics). Returns the child's pid.
pub fn fork_child(f: impl FnOnce() -> bool) -> libc::pid_t {
    // SAFETY: the child runs `f` and `_exit`s; it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let code = match ok {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(_) => 2,
        };
        // SAFETY: leaves the child without running the harness's exit path.
        unsafe { libc::_exit(code) };
    }
    pid
}

pub fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

pub fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

pub fn held(p: &Pool) -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (
        p.stats.fork_held.load(Relaxed),
        p.stats.fork_held_blocks.load(Relaxed),
    )
}

/// Free everything, trim, and check that the file gave its memory back.
pub fn finish(h: &HostPools, blocks: &[usize]) {
    for &b in blocks {
        pool::free_block(b).unwrap();
    }
    h.primary().release_held(true);
    assert_eq!(
        held(h.primary()),
        (0, 0),
        "nothing held once no child lives"
    );
    h.trim();
    assert_eq!(h.primary().report().mapped, 0, "every chunk went back");
    assert_eq!(
        shared::file_bytes(),
        Some(0),
        "the shared file keeps no memory once its chunks are gone"
    );
}
