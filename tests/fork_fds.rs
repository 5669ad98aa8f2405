//! A fork made while the process has no file descriptor left (issue 32): the child must be
//! tracked all the same, so that the blocks held back for it go back once it has exited. Its
//! own test binary (its own process): it lowers `RLIMIT_NOFILE`, hard limit included, for good.
//!
//! Before the fix the parent could not open the child's lock at the fork and held every block
//! live at it back for the life of the process: 128 MiB in 8 blocks here, and allocating the
//! same sizes again mapped 128 MiB more.

mod forkkit;

use forkkit::*;
use ump_alloc::pool;

fn set_nofile(soft: u64, hard: u64) {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

#[test]
fn a_fork_with_no_descriptor_left_is_tracked_and_its_blocks_go_back() {
    let _s = serial();
    let h = host(true);
    let p = h.primary();
    let keep = h.alloc(1000).unwrap().ptr;
    let blocks: Vec<usize> = (0..8).map(|_| h.alloc(16 * MIB).unwrap().ptr).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(b, 16 * MIB, 40 + i as u64);
    }
    let mapped = p.report().mapped;
    // Not one descriptor more, soft or hard: the child's lock cannot be opened at the fork.
    let go = Pipe::new();
    let highest = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap();
    set_nofile(highest + 1, highest + 1);
    // Every number below the limit taken: no descriptor can be opened any more.
    // SAFETY: opening /dev/null is harmless; the descriptors stay open for the test.
    while unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) } >= 0 {}
    let child = fork_child(|| {
        go.recv();
        blocks
            .iter()
            .enumerate()
            .all(|(i, &b)| holds(b, 16 * MIB, 40 + i as u64))
    });
    for &b in &blocks {
        pool::free_block(b).unwrap();
    }
    assert_eq!(
        held(p),
        (128 * MIB, 8),
        "held while the child may read them"
    );
    // The parent writes new arrays of the same sizes: not over the held ones.
    let again: Vec<usize> = (0..8).map(|_| h.alloc(16 * MIB).unwrap().ptr).collect();
    for &b in &again {
        fill(b, 16 * MIB, 99);
    }
    go.send(1);
    assert_eq!(wait(child), 0, "the child saw the parent's new arrays");
    let t = std::time::Instant::now();
    while held(p).1 != 0 && t.elapsed().as_secs() < 10 {
        p.release_held(true);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(held(p), (0, 0), "the child is gone: nothing stays held");
    for b in again {
        pool::free_block(b).unwrap();
    }
    // The same sizes once more reuse the memory: nothing more is mapped.
    let third: Vec<usize> = (0..8).map(|_| h.alloc(16 * MIB).unwrap().ptr).collect();
    assert!(
        p.report().mapped <= mapped + 128 * MIB,
        "mapped {} MiB, had {} MiB before the fork",
        p.report().mapped >> 20,
        mapped >> 20
    );
    let mut all = third;
    all.push(keep);
    finish(&h, &all);
}
