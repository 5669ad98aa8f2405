//! Span descriptors and cutting: a new (or recycled) descriptor for a range, and cutting a
//! block off either end of a free span. Part of `span`; `take` cuts blocks with it, and
//! `chunk`, `grow` and `commit` make and cut descriptors through the pool.

use crate::pool::types::{Large, NEVER, Pool, SPAN_FREE, Span, TAG_SPAN};
use crate::registry;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

impl Pool {
    pub(in crate::pool) fn new_span(
        &'static self,
        lg: &mut Large,
        start: usize,
        len: usize,
        (chunk_base, chunk_len): (usize, usize),
        dirty: bool,
    ) -> &'static Span {
        let sp = lg.spare.pop().unwrap_or_else(|| {
            Box::leak(Box::new(Span {
                pool: self,
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                state: AtomicU8::new(SPAN_FREE),
                req: AtomicUsize::new(0),
                chunk_base: AtomicUsize::new(0),
                chunk_len: AtomicUsize::new(0),
                dirty: AtomicBool::new(false),
                free_epoch: AtomicU64::new(0),
                away: AtomicBool::new(false),
                born: AtomicU64::new(NEVER),
            }))
        });
        sp.state.store(SPAN_FREE, Ordering::Release);
        sp.start.store(start, Ordering::Release);
        sp.len.store(len, Ordering::Release);
        sp.chunk_base.store(chunk_base, Ordering::Relaxed);
        sp.chunk_len.store(chunk_len, Ordering::Relaxed);
        sp.dirty.store(dirty, Ordering::Relaxed);
        sp.away.store(false, Ordering::Relaxed);
        // Whatever ran on the range before is covered by the epoch open now.
        sp.free_epoch.store(lg.lazy.epoch(), Ordering::Relaxed);
        // Inside a chunk whose range was reserved when it was mapped.
        registry::set_range(start, len, sp as *const Span as usize | TAG_SPAN);
        sp
    }

    /// Cut `len` bytes off the end of free span `sp` (already out of the free set) and return
    /// the span for them; the front stays free. Only the granules of the cut part are
    /// re-registered, so the cost follows the size handed out.
    pub(in crate::pool) fn split_tail(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        len: usize,
    ) -> &'static Span {
        let flen = sp.len();
        if flen == len {
            return sp;
        }
        let start = sp.start();
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start), sp);
        self.carve(lg, sp, start + flen - len, len)
    }

    /// A new span for `[start, start+len)`, cut from free span `sp`: same chunk, and `sp`'s
    /// dirtiness and residency.
    pub(in crate::pool) fn carve(
        &'static self,
        lg: &mut Large,
        sp: &Span,
        start: usize,
        len: usize,
    ) -> &'static Span {
        let chunk = (
            sp.chunk_base.load(Ordering::Relaxed),
            sp.chunk_len.load(Ordering::Relaxed),
        );
        let taken = self.new_span(lg, start, len, chunk, sp.dirty.load(Ordering::Relaxed));
        taken
            .away
            .store(sp.away.load(Ordering::Relaxed), Ordering::Relaxed);
        taken
    }

    /// Cut `len` bytes off the front of free span `sp` (already out of the free set) and
    /// return the span for them; the rest stays free (and is queued for purging again).
    pub(in crate::pool) fn split_head(
        &'static self,
        lg: &mut Large,
        sp: &'static Span,
        len: usize,
    ) -> &'static Span {
        let flen = sp.len();
        if flen == len {
            return sp;
        }
        let start = sp.start();
        // The descriptor keeps the rest (its granules still point at it); the head gets a new
        // one, registered over the head's granules only.
        sp.start.store(start + len, Ordering::Release);
        sp.len.store(flen - len, Ordering::Release);
        lg.free.insert((flen - len, start + len), sp);
        if self.lazy() {
            self.on_span_free(lg, sp);
        }
        self.carve(lg, sp, start, len)
    }
}
