//! The books of a lazily committed pool, an owned part: how many bytes are committed and how
//! many are in use, the working-set windows, the free spans queued for purging, and the
//! epochs that say when the device is done with freed memory. The policy that reads them
//! (when to purge, how much to keep) is the pool's `commit.rs`; this part only keeps the
//! counts true and the epochs ordered.
//!
//! **Epochs.** Frees are stamped with the current epoch. Asking whether an epoch is over may
//! close the current one with a fence (made by the caller: the part never makes one), and an
//! epoch is over once the fence that closed it (or any later one) has been reached.

use super::fence::Fence;
use std::collections::VecDeque;

#[derive(Default)]
pub(crate) struct Lazy {
    /// Bytes committed in the pool's chunks.
    committed: usize,
    /// Bytes of spans handed out or cut into slabs (all committed).
    used: usize,
    /// The current epoch: spans freed now are stamped with it.
    epoch: u64,
    /// Fences that closed epochs, oldest first: (epoch closed, fence).
    fences: VecDeque<(u64, Box<dyn Fence>)>,
    /// Every epoch below this is over on the device.
    safe: u64,
    /// Free spans that may hold committed pages, oldest first, by start. Entries go stale
    /// when spans merge or are reused; the reader checks them.
    queue: VecDeque<usize>,
    /// Most bytes of `used` in the current window and in the one before.
    window_peak: usize,
    last_window_peak: usize,
    /// When the current window began (`epoch_ms`; 0: not yet).
    window_start: u64,
}

/// How an epoch's fences are asked: never blocking, or waiting on the host.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Ask {
    Query,
    Wait,
}

impl Ask {
    /// Whether `fence` is reached, asked this way (a fence that cannot be asked about counts
    /// as not reached).
    pub(crate) fn reached(self, fence: &dyn Fence) -> bool {
        match self {
            Ask::Wait => fence.wait(),
            Ask::Query => matches!(fence.done(), Ok(true)),
        }
    }
}

impl Lazy {
    /// Bytes committed.
    pub(crate) fn committed(&self) -> usize {
        self.committed
    }

    /// Committed bytes that no span in use needs (free spans, the exact-size list).
    pub(crate) fn free_committed(&self) -> usize {
        self.committed.saturating_sub(self.used)
    }

    /// `n` more bytes were committed (or came with an adopted chunk).
    pub(crate) fn on_commit(&mut self, n: usize) {
        self.committed += n;
    }

    /// `n` bytes were decommitted (or left with a chunk).
    pub(crate) fn on_decommit(&mut self, n: usize) {
        debug_assert!(n <= self.committed, "decommitting more than is committed");
        self.committed -= n;
    }

    /// `n` more bytes are handed out: the window's peak follows.
    pub(crate) fn on_use(&mut self, n: usize) {
        self.used += n;
        self.window_peak = self.window_peak.max(self.used);
    }

    /// `n` bytes handed out are free again.
    pub(crate) fn on_unuse(&mut self, n: usize) {
        debug_assert!(n <= self.used, "freeing more than is in use");
        self.used -= n;
    }

    /// The epoch frees are stamped with now.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the frees of `epoch` are over on the device. When `epoch` is the current one,
    /// it is closed first with `fence()` (None: the device was synchronised instead, so every
    /// epoch so far is over). Fences are asked oldest first, as `ask` says.
    pub(crate) fn epoch_over(
        &mut self,
        epoch: u64,
        ask: Ask,
        fence: impl FnOnce() -> Option<Box<dyn Fence>>,
    ) -> bool {
        if epoch < self.safe {
            return true;
        }
        if epoch == self.epoch {
            match fence() {
                Some(f) => self.fences.push_back((self.epoch, f)),
                None => {
                    self.fences.clear();
                    self.safe = self.epoch + 1;
                }
            }
            self.epoch += 1;
        }
        while let Some((e, f)) = self.fences.front() {
            if !ask.reached(&**f) {
                break;
            }
            self.safe = e + 1;
            self.fences.pop_front();
        }
        epoch < self.safe
    }

    /// Queue free span `start` for purging. When the queue is mostly stale entries (more than
    /// four per free span, `free_spans`), keep only the newest entry of each start that
    /// `is_free` still finds.
    pub(crate) fn queue(
        &mut self,
        start: usize,
        free_spans: usize,
        is_free: impl Fn(usize) -> bool,
    ) {
        self.queue.push_back(start);
        if self.queue.len() > 4 * free_spans + 64 {
            let mut seen = std::collections::HashSet::new();
            let mut kept = VecDeque::new();
            for &s in self.queue.iter().rev() {
                if is_free(s) && seen.insert(s) {
                    kept.push_front(s);
                }
            }
            self.queue = kept;
        }
    }

    /// Entries queued (stale ones included).
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The oldest queued start, taken off the queue.
    pub(crate) fn next_queued(&mut self) -> Option<usize> {
        self.queue.pop_front()
    }

    /// Put `start` back at the front (looked at first next time).
    pub(crate) fn requeue_first(&mut self, start: usize) {
        self.queue.push_front(start);
    }

    /// Put `start` back at the end (its epoch is not over yet).
    pub(crate) fn requeue_last(&mut self, start: usize) {
        self.queue.push_back(start);
    }

    /// Forget every queued span (all were purged).
    pub(crate) fn clear_queue(&mut self) {
        self.queue.clear();
    }

    /// At `ms`, with windows of `window` ms: whether a window has ended, in which case the
    /// next begins. A window with no call saw no span handed out or freed: its peak is what
    /// is in use.
    pub(crate) fn window_over(&mut self, ms: u64, window: u64) -> bool {
        if self.window_start == 0 {
            self.window_start = ms;
        }
        if ms < self.window_start + window {
            return false;
        }
        self.last_window_peak = if ms >= self.window_start + 2 * window {
            self.used
        } else {
            self.window_peak
        };
        self.window_peak = self.used;
        self.window_start = ms;
        true
    }

    /// The most bytes in use over the current window and the one before.
    pub(crate) fn recent_peak(&self) -> usize {
        self.window_peak.max(self.last_window_peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A fence reached when its flag is set; `wait` sets it and counts.
    struct Flag(Arc<AtomicBool>, Arc<AtomicUsize>);
    impl Fence for Flag {
        fn done(&self) -> Result<bool> {
            Ok(self.0.load(Ordering::Relaxed))
        }
        fn wait(&self) -> bool {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.store(true, Ordering::Relaxed);
            true
        }
        fn wait_on(&self, _: usize) -> bool {
            true
        }
    }

    fn flag() -> (Arc<AtomicBool>, Arc<AtomicUsize>, Box<dyn Fence>) {
        let (f, w) = (Arc::default(), Arc::default());
        let b: Box<dyn Fence> = Box::new(Flag(Arc::clone(&f), Arc::clone(&w)));
        (f, w, b)
    }

    #[test]
    fn an_epoch_is_over_only_once_its_fence_is_reached() {
        let mut z = Lazy::default();
        let e0 = z.epoch();
        let (reached, waits, f) = flag();
        assert!(!z.epoch_over(e0, Ask::Query, || Some(f)));
        // Frees after the question belong to the next epoch.
        assert_eq!(z.epoch(), e0 + 1);
        // Asking again makes no second fence for the closed epoch.
        assert!(!z.epoch_over(e0, Ask::Query, || panic!("closed already")));
        reached.store(true, Ordering::Relaxed);
        assert!(z.epoch_over(e0, Ask::Query, || panic!("closed already")));
        assert_eq!(waits.load(Ordering::Relaxed), 0, "a query never waits");
    }

    #[test]
    fn waiting_reaches_the_fences_in_order() {
        let mut z = Lazy::default();
        let (_, w0, f0) = flag();
        assert!(!z.epoch_over(0, Ask::Query, || Some(f0)));
        let (_, w1, f1) = flag();
        assert!(!z.epoch_over(1, Ask::Query, || Some(f1)));
        // Waiting for epoch 1 waits for epoch 0's fence first, then its own.
        assert!(z.epoch_over(1, Ask::Wait, || panic!("closed already")));
        assert_eq!(
            (w0.load(Ordering::Relaxed), w1.load(Ordering::Relaxed)),
            (1, 1)
        );
        assert!(z.epoch_over(0, Ask::Query, || panic!("over")));
    }

    #[test]
    fn a_later_epoch_is_not_over_while_an_earlier_fence_is_pending() {
        let mut z = Lazy::default();
        let (_, _, f0) = flag();
        assert!(!z.epoch_over(0, Ask::Query, || Some(f0)));
        let (r1, _, f1) = flag();
        assert!(!z.epoch_over(1, Ask::Query, || Some(f1)));
        r1.store(true, Ordering::Relaxed);
        // Fence 1 is reached but fence 0 is asked first and is not: nothing is over.
        assert!(!z.epoch_over(1, Ask::Query, || panic!("closed already")));
        assert!(!z.epoch_over(0, Ask::Query, || panic!("closed already")));
    }

    #[test]
    fn no_fence_means_the_device_was_synchronised() {
        let mut z = Lazy::default();
        let (_, _, f0) = flag();
        assert!(!z.epoch_over(0, Ask::Query, || Some(f0)));
        // Epoch 1 closes with a device sync: every epoch so far is over, the pending fence
        // is dropped.
        assert!(z.epoch_over(1, Ask::Query, || None));
        assert!(z.epoch_over(0, Ask::Query, || panic!("over")));
        assert_eq!(z.epoch(), 2);
        assert!(!z.epoch_over(2, Ask::Query, || {
            let (_, _, f) = flag();
            Some(f)
        }));
    }

    #[test]
    fn counts_and_window_peaks() {
        let mut z = Lazy::default();
        z.on_commit(100);
        z.on_use(60);
        z.on_use(30);
        z.on_unuse(50);
        assert_eq!((z.committed(), z.free_committed()), (100, 60));
        assert!(
            !z.window_over(1_000, 500),
            "the first call starts the window"
        );
        assert_eq!(z.recent_peak(), 90);
        assert!(z.window_over(1_500, 500));
        // The ended window's peak is kept one more window.
        assert_eq!(z.recent_peak(), 90);
        assert!(z.window_over(2_000, 500));
        assert_eq!(z.recent_peak(), 40);
        // Two windows without a call: both saw only what is in use now.
        z.on_use(10);
        assert!(z.window_over(5_000, 500));
        assert_eq!(z.recent_peak(), 50);
        z.on_decommit(100);
        assert_eq!(z.free_committed(), 0);
    }

    #[test]
    fn a_stale_queue_keeps_the_newest_entry_of_each_free_span() {
        let mut z = Lazy::default();
        for i in 0..64 {
            z.queue(i % 4, 0, |_| true);
        }
        assert_eq!(z.queued(), 64);
        // Past 4 × 0 + 64 entries the queue is compacted to the spans still free.
        z.queue(1, 0, |s| s == 1 || s == 2);
        let mut order = vec![];
        while let Some(s) = z.next_queued() {
            order.push(s);
        }
        assert_eq!(order, vec![2, 1]);
    }
}
