//! Scoped bulk free, like GPUArrays.jl's `@cached`: blocks allocated on a thread between
//! `scope_begin` and `scope_end` belong to that scope, and ending it gives every one still
//! live back to the cache at once. Scopes nest per thread; a block belongs to the innermost
//! scope open on the thread that allocated it. A free from any thread takes the block out of
//! its scope, and `keep` takes one out by hand (`@uncached`).
//!
//! A *keep-live* scope (`UMP_SCOPE_KEEP_LIVE`, what Python's `ump_alloc.scope()` uses) tracks
//! and reports but never frees a live block: Python objects own their memory through
//! reference counts, and freeing under a live array would be a use-after-free.
//!
//! Cost: one relaxed load per allocation and free while no scope is open anywhere; while one
//! is, a lock and a hash-map update per allocation and free.

use crate::error::{Error, Result};
use crate::prim::fork::lock;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Scopes open in the process (the fast-path check).
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// What one scope holds and has seen.
#[derive(Default)]
struct Record {
    keep_live: bool,
    /// Live blocks and their sizes.
    live: HashMap<usize, usize>,
    live_bytes: usize,
    peak_bytes: usize,
    allocs: u64,
    alloc_bytes: u64,
    frees: u64,
}

/// Scope ids, never reused.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[derive(Default)]
struct Table {
    /// Block address to the scope that owns it.
    owner: HashMap<usize, u64>,
    scopes: HashMap<u64, Record>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Take live block `ptr` out of its scope: the scope's id and record, with the block's bytes
/// already taken off its live count. None when no open scope holds it.
fn detach<'a>(
    owner: &mut HashMap<usize, u64>,
    scopes: &'a mut HashMap<u64, Record>,
    ptr: usize,
) -> Option<(u64, &'a mut Record)> {
    let id = owner.remove(&ptr)?;
    let rec = scopes.get_mut(&id)?;
    let n = rec.live.remove(&ptr)?;
    rec.live_bytes -= n;
    Some((id, rec))
}

fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let mut g = lock(&TABLE);
    let r = f(g.get_or_insert_with(Table::default));
    // Hold no memory while no scope is open (the next scope starts afresh).
    if g.as_ref().is_some_and(|t| t.scopes.is_empty()) {
        *g = None;
    }
    r
}

/// Fork: the scope table (last in the order: it is never held while another lock is taken).
pub(crate) fn fork_lock(held: &mut crate::prim::fork::Held) {
    held.push(lock(&TABLE));
}

/// This thread's open scopes, innermost last. Dropped at thread exit: scopes left open are
/// closed without freeing anything (another thread may use those blocks).
struct Stack(RefCell<Vec<u64>>);

impl Drop for Stack {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut *self.0.borrow_mut());
        for id in ids {
            close(id);
        }
    }
}

thread_local! {
    static STACK: Stack = const { Stack(RefCell::new(Vec::new())) };
}

/// The summary of a scope at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub allocs: u64,
    pub alloc_bytes: u64,
    /// Blocks of the scope freed before its end.
    pub frees: u64,
    /// Bytes of the scope live at once, at most.
    pub peak_bytes: u64,
    /// Blocks (and bytes) live at the end: freed by the end, or kept for a keep-live scope.
    pub live_at_end: u64,
    pub live_bytes_at_end: u64,
    /// Whether the live blocks were freed.
    pub freed_at_end: bool,
    /// Of those, frees that failed (counted as errors).
    pub failed: u64,
}

/// Open a scope on this thread. Returns its depth (1 for the outermost).
pub fn begin(keep_live: bool) -> Result<usize> {
    let depth = STACK
        .try_with(|s| {
            let id = with_table(|t| {
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                t.scopes.insert(
                    id,
                    Record {
                        keep_live,
                        ..Record::default()
                    },
                );
                id
            });
            let mut st = s.0.borrow_mut();
            st.push(id);
            st.len()
        })
        .map_err(|_| Error::invalid("no scope can open while this thread exits"))?;
    OPEN.fetch_add(1, Ordering::Relaxed);
    Ok(depth)
}

/// Close this thread's innermost scope, freeing its live blocks unless it keeps them.
pub fn end() -> Result<Report> {
    let id = STACK
        .try_with(|s| s.0.borrow_mut().pop())
        .ok()
        .flatten()
        .ok_or_else(|| Error::invalid("no scope is open on this thread"))?;
    let rec = close(id);
    let mut r = Report {
        allocs: rec.allocs,
        alloc_bytes: rec.alloc_bytes,
        frees: rec.frees,
        peak_bytes: rec.peak_bytes as u64,
        live_at_end: rec.live.len() as u64,
        live_bytes_at_end: rec.live_bytes as u64,
        freed_at_end: !rec.keep_live,
        failed: 0,
    };
    if !rec.keep_live {
        for ptr in rec.live.into_keys() {
            // Device blocks go back to the pool of their stream: reuse stays stream-ordered.
            if let Err(e) = crate::pool::free_block(ptr) {
                crate::error::report(&e.context("ump_scope_end"));
                r.failed += 1;
            }
        }
    }
    Ok(r)
}

/// Forget scope `id`: its blocks belong to no scope any more.
fn close(id: u64) -> Record {
    let rec = with_table(|t| {
        let rec = t.scopes.remove(&id).unwrap_or_default();
        for p in rec.live.keys() {
            t.owner.remove(p);
        }
        rec
    });
    OPEN.fetch_sub(1, Ordering::Relaxed);
    rec
}

/// The depth of this thread's scopes.
pub fn depth() -> usize {
    STACK.try_with(|s| s.0.borrow().len()).unwrap_or(0)
}

/// Whether any scope is open in the process (the allocation fast path's check).
#[inline(always)]
pub fn any_open() -> bool {
    OPEN.load(Ordering::Relaxed) != 0
}

/// Scopes open in the process.
pub fn open_count() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// Take live block `ptr` out of its scope, so the scope's end leaves it alone.
pub fn keep(ptr: usize) -> Result<()> {
    let found = OPEN.load(Ordering::Relaxed) != 0
        && with_table(|t| detach(&mut t.owner, &mut t.scopes, ptr).is_some());
    if found {
        Ok(())
    } else {
        Err(Error::not_ours(format!(
            "{ptr:#x} is not a live block of an open scope"
        )))
    }
}

/// A block of `n` bytes was allocated at `ptr` on this thread.
#[inline]
pub fn on_alloc(ptr: usize, n: usize) {
    if OPEN.load(Ordering::Relaxed) != 0 {
        on_alloc_slow(ptr, n);
    }
}

#[cold]
fn on_alloc_slow(ptr: usize, n: usize) {
    let Some(id) = STACK
        .try_with(|s| s.0.borrow().last().copied())
        .ok()
        .flatten()
    else {
        return;
    };
    with_table(|t| {
        let Some(rec) = t.scopes.get_mut(&id) else {
            return;
        };
        rec.live.insert(ptr, n);
        rec.live_bytes += n;
        rec.peak_bytes = rec.peak_bytes.max(rec.live_bytes);
        rec.allocs += 1;
        rec.alloc_bytes += n as u64;
        t.owner.insert(ptr, id);
    });
}

/// The live block at `ptr` is about to be freed (from any thread).
#[inline]
pub fn on_free(ptr: usize) {
    if OPEN.load(Ordering::Relaxed) != 0 {
        on_free_slow(ptr);
    }
}

#[cold]
fn on_free_slow(ptr: usize) {
    with_table(|t| {
        if let Some((_, rec)) = detach(&mut t.owner, &mut t.scopes, ptr) {
            rec.frees += 1;
        }
    });
}

/// realloc resized the block at `old` to `n` bytes, now at `new` (`old` when in place); it
/// stays in its scope, if any, with its new size.
pub fn on_resize(old: usize, new: usize, n: usize) {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    with_table(|t| {
        if let Some((id, rec)) = detach(&mut t.owner, &mut t.scopes, old) {
            rec.live_bytes += n;
            rec.peak_bytes = rec.peak_bytes.max(rec.live_bytes);
            rec.live.insert(new, n);
            t.owner.insert(new, id);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator;

    #[test]
    fn scopes_free_what_is_live_and_nest() {
        assert_eq!(begin(false).unwrap(), depth());
        let d = depth();
        let a = allocator::malloc(1000).unwrap();
        let b = allocator::malloc(300_000).unwrap();
        allocator::free(a).unwrap();
        begin(false).unwrap();
        assert_eq!(depth(), d + 1);
        let c = allocator::malloc(50).unwrap();
        let kept = allocator::malloc(70).unwrap();
        keep(kept).unwrap();
        let inner = end().unwrap();
        assert_eq!((inner.allocs, inner.live_at_end), (2, 1));
        assert!(crate::pool::lookup(c).is_none(), "inner block freed");
        assert!(crate::pool::lookup(b).is_some(), "outer block still live");
        let outer = end().unwrap();
        assert_eq!(outer.allocs, 2);
        assert_eq!(outer.frees, 1);
        assert_eq!(outer.live_bytes_at_end, 300_000);
        assert!(outer.peak_bytes >= 301_000);
        assert!(crate::pool::lookup(b).is_none());
        assert!(keep(kept).is_err(), "no scope holds it any more");
        allocator::free(kept).unwrap();
        assert!(end().is_err(), "every scope of this thread is closed");
    }

    #[test]
    fn keep_live_scopes_report_but_never_free() {
        begin(true).unwrap();
        let a = allocator::malloc(4096).unwrap();
        let r = end().unwrap();
        assert!(!r.freed_at_end);
        assert_eq!((r.live_at_end, r.live_bytes_at_end), (1, 4096));
        assert!(crate::pool::lookup(a).is_some());
        allocator::free(a).unwrap();
    }

    #[test]
    fn a_scope_loop_stays_flat() {
        // Other tests share the pool, so count distinct addresses rather than bytes mapped:
        // if the scope frees, the same few blocks come back every iteration.
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000 {
            begin(false).unwrap();
            let mut ptrs = Vec::new();
            for k in 0..8 {
                ptrs.push(allocator::malloc(1000 + 4096 * k + i % 7).unwrap());
            }
            ptrs.push(allocator::malloc(5 << 20).unwrap());
            let r = end().unwrap();
            assert_eq!(r.live_at_end, 9);
            for p in ptrs {
                assert!(crate::pool::lookup(p).is_none(), "freed at scope end");
                seen.insert(p);
            }
        }
        assert!(
            seen.len() < 100,
            "{} distinct blocks: the scope leaks",
            seen.len()
        );
    }
}
