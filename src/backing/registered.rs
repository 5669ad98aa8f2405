//! Pinned host memory: host pages registered with CUDA (cuMemHostRegister, portable and mapped)
//! at the same address on every device, and the process-wide cap on it.

use super::resource::{ARENA, Backing, Chunk, Growth, HUGEPAGE_MIN, Kind, RangeBook};
use crate::error::{Error, Result};
use crate::prim::fork::{Held, lock};
use crate::prim::{cuda, os};
use crate::registry::GRANULE;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// Bytes of host memory pinned by every [`RegisteredBacking`] of the process.
static PINNED: AtomicUsize = AtomicUsize::new(0);
/// The cap on [`PINNED`] (`UMP_ALLOC_PINNED_LIMIT`), set once at initialisation.
static PINNED_CAP: AtomicUsize = AtomicUsize::new(usize::MAX);

// ---- pinning at the first use of a GPU (`UMP_ALLOC_PIN=lazy`) ------------------------------
//
// Registering host memory needs a CUDA context (518 MiB of GPU memory and ~0.4 s per process on
// the lent H100), so a process that only uses NumPy must not register anything. The host side's
// chunks are mapped unregistered (`LAZY`) until the process uses a GPU: `pin_host_side` (its
// first device-side allocation, a transfer call of ump-alloc's) or a CUDA context found active
// when a chunk is mapped. From then on every chunk waiting is registered, and every new one as
// it is made. Unpinned chunks are ordinary host memory for everyone (identify, the transfer
// rules) and count against the pinned cap already, so that pinning them later never passes it.

/// Host chunks mapped but not registered yet, by base: (size, shared pages). Registering and
/// the switch happen under it, so no chunk is registered and unmapped at once; taken at fork
/// after the pools' locks.
static LAZY: Mutex<BTreeMap<usize, (usize, bool)>> = Mutex::new(BTreeMap::new());
/// Entries in `LAZY` (0 lets `pinned_at` answer without the lock).
static WAITING: AtomicUsize = AtomicUsize::new(0);
/// The host side pins its chunks as they are made (the process uses a GPU).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The device whose primary context registers host chunks once pinning is active.
static PIN_DEVICE: AtomicI32 = AtomicI32::new(0);
/// The chunks waiting are never registered: the machine turned out not to need it or not to
/// allow it (`never_pin`).
static NEVER: AtomicBool = AtomicBool::new(false);

/// The host side was made pinned before the machine was asked (`UMP_ALLOC_PIN=lazy`), and the
/// machine's answer is that its memory is not to be pinned (HMM/ATS: the GPUs read it as it
/// is; or no host registration): the chunks waiting stay plain host memory, and so do new ones.
pub fn never_pin() {
    NEVER.store(true, Ordering::Release);
}

/// The process uses a GPU now (`device`'s context, where known): register every host chunk
/// waiting to be pinned, and pin new ones as they are made. Does nothing once done, or where
/// CUDA cannot be used (no driver, a fork child).
pub fn pin_host_side(device: Option<i32>) {
    if ACTIVE.load(Ordering::Acquire) || NEVER.load(Ordering::Acquire) || !cuda::available() {
        return;
    }
    let mut waiting = lock(&LAZY);
    activate(&mut waiting, device.unwrap_or(0));
}

/// Switch pinning on, with `LAZY` held, and register what waits.
fn activate(waiting: &mut BTreeMap<usize, (usize, bool)>, device: i32) {
    if ACTIVE.load(Ordering::Acquire) {
        return;
    }
    PIN_DEVICE.store(device.max(0), Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    let mut failed = BTreeMap::new();
    for (base, (size, shared)) in std::mem::take(waiting) {
        populate(shared, base, size);
        // SAFETY: a mapping of the host side's, registered once (it was waiting), and not
        // unmapped meanwhile: unmapping takes `LAZY` first.
        if let Err(e) = unsafe { cuda::register(base, size, device) } {
            // It stays plain host memory (identify says so); the next chunks are pinned.
            crate::error::set_last(&format!(
                "pinning a host chunk waiting for the GPU: {}",
                e.msg
            ));
            failed.insert(base, (size, shared));
        }
    }
    WAITING.store(failed.len(), Ordering::Relaxed);
    *waiting = failed;
}

/// Whether the host side's chunks are pinned as they are made now (the process used a GPU, or
/// `UMP_ALLOC_PIN=eager`).
pub fn host_pinning_active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Whether the registered chunk holding `addr` is pinned (false while it waits for the
/// process's first use of a GPU).
pub fn pinned_at(addr: usize) -> bool {
    if WAITING.load(Ordering::Acquire) == 0 {
        return true;
    }
    let waiting = lock(&LAZY);
    waiting
        .range(..=addr)
        .next_back()
        .is_none_or(|(&base, &(size, _))| addr >= base + size)
}

/// Fork: the list of chunks waiting to be pinned (after every pool's locks).
pub(crate) fn fork_lock(held: &mut Held) {
    held.push(lock(&LAZY));
}

/// Set the cap on pinned host memory (at initialisation).
pub fn set_pinned_cap(bytes: usize) {
    PINNED_CAP.store(bytes, Ordering::Relaxed);
}

/// Bytes of host memory pinned now, and the cap.
pub fn pinned() -> (usize, usize) {
    (
        PINNED.load(Ordering::Relaxed),
        PINNED_CAP.load(Ordering::Relaxed),
    )
}

/// Pinned host memory: host pages registered with CUDA (cuMemHostRegister, portable and
/// mapped), at the same address on every device: NumPy's side without HMM/ATS (host side
/// `pinned`), and both sides of mode `registered`. Registering costs about 25 ms per GiB plus
/// populating the pages, so chunks are cached above (the host pool keeps idle pinned chunks
/// for a while: see `Pool`'s decay). Every chunk counts against the process's pinned cap;
/// past it, and in a `fork()` child (no CUDA there), `map` refuses with `UMP_ERR_UNSUPPORTED`
/// and the host side falls back to plain memory.
///
/// The pages are anonymous memory, which `fork()` copies into every child at once (the kernel
/// copies pinned pages early), or pages of the process's shared memory file, which it does not
/// copy (see `shared`): the host side's default (`UMP_ALLOC_PINNED_FORK=share`).
pub struct RegisteredBacking {
    device: i32,
    /// The pages are shared-file pages (`shared`), else anonymous.
    shared: bool,
    /// Register the pages with CUDA (false only in tests on machines without a GPU: everything
    /// else is the same).
    register: bool,
    /// Register the pages only once the process uses a GPU (the host side's chunks with
    /// `UMP_ALLOC_PIN=lazy`; see `pin_host_side`).
    lazy: bool,
}

impl RegisteredBacking {
    /// Anonymous pinned pages for `device` (-1: the host side).
    pub fn new(device: i32) -> Self {
        RegisteredBacking {
            device,
            shared: false,
            register: true,
            lazy: false,
        }
    }

    /// The host side's pinned pages: shared-file pages when `share` and the machine allows
    /// it, else anonymous ones, with the reason. `lazy`: pinned only once the process uses a
    /// GPU (else each chunk as it is made).
    pub fn host(share: bool, lazy: bool) -> (Self, std::result::Result<(), String>) {
        let why = Self::host_share(share);
        let b = RegisteredBacking {
            device: -1,
            shared: why.is_ok(),
            register: true,
            lazy,
        };
        if !lazy {
            ACTIVE.store(true, Ordering::Release);
        }
        (b, why)
    }

    /// Whether [`host`](Self::host)`(share)` makes shared-file pages: Ok, or why not (the
    /// setting, or what the machine lacks).
    pub fn host_share(share: bool) -> std::result::Result<(), String> {
        if share {
            super::shared::available()
        } else {
            Err("UMP_ALLOC_PINNED_FORK=copy".into())
        }
    }

    /// Host-side pages as [`host`](Self::host) makes them, without the CUDA registration: the
    /// whole mechanism but the pinning, for tests on machines without a GPU.
    pub fn unregistered(shared: bool) -> Self {
        RegisteredBacking {
            device: -1,
            shared: shared && super::shared::available().is_ok(),
            register: false,
            lazy: false,
        }
    }

    /// The device whose context registers this backing's chunks.
    fn pin_device(&self) -> i32 {
        if self.device >= 0 {
            self.device
        } else {
            PIN_DEVICE.load(Ordering::Relaxed)
        }
    }

    /// Register a new chunk, or, while the host side waits for the first use of a GPU (and no
    /// context is active: else that is the first use), leave it waiting. Returns whether it
    /// was registered.
    fn register_new(&self, base: usize, size: usize) -> Result<bool> {
        if !self.register {
            return Ok(false);
        }
        if self.lazy && !ACTIVE.load(Ordering::Acquire) {
            // Under the pool's lock: only where ump-alloc loaded the driver (no look into the
            // dynamic loader's tables, see `active_context_device_if_loaded`). The host side's
            // allocations ask the full question before any lock (`HostPools::alloc`).
            let found = if NEVER.load(Ordering::Acquire) {
                None
            } else {
                cuda::active_context_device_if_loaded()
            };
            let mut waiting = lock(&LAZY);
            match found {
                Some(dev) => activate(&mut waiting, dev),
                None if !ACTIVE.load(Ordering::Acquire) => {
                    waiting.insert(base, (size, self.shared));
                    WAITING.fetch_add(1, Ordering::Relaxed);
                    return Ok(false);
                }
                None => {}
            }
        }
        populate(self.shared, base, size);
        // SAFETY: the mapping is ours and stays until unmap, which unregisters first.
        unsafe { cuda::register(base, size, self.pin_device()) }?;
        Ok(true)
    }

    /// Take the chunk at `base` off the list of those waiting to be pinned. Returns whether it
    /// was waiting (then it was never registered).
    fn stop_waiting(&self, base: usize) -> bool {
        if !self.lazy || WAITING.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut waiting = lock(&LAZY);
        let found = waiting.remove(&base).is_some();
        if found {
            // Under the lock, as every change of the count (`activate` sets it).
            WAITING.fetch_sub(1, Ordering::Relaxed);
        }
        found
    }

    /// Whether the pages are shared-file pages, which fork() does not copy.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Make `[base, base+size)` of a reservation usable.
    fn commit(&self, base: usize, size: usize) -> Result<()> {
        if self.shared {
            return super::shared::map(base, size);
        }
        if os::commit(base as *mut u8, size) {
            Ok(())
        } else {
            Err(Error::oom(format!(
                "the OS refused a mapping of {size} bytes"
            )))
        }
    }
}

impl Backing for RegisteredBacking {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_REGISTERED
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn fork_shared(&self) -> bool {
        self.shared
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        // A lazily pinned chunk needs no CUDA to be made (it is registered when the process
        // uses a GPU, if ever): the driver is not even loaded for it.
        let waits = self.lazy && !ACTIVE.load(Ordering::Acquire);
        if self.register && !waits && !cuda::available() {
            return Err(Error::unsupported(
                "pinned host memory needs CUDA (not available here, e.g. in a fork() child)",
            ));
        }
        let cap = PINNED_CAP.load(Ordering::Relaxed);
        if PINNED
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                p.checked_add(size).filter(|&t| t <= cap)
            })
            .is_err()
        {
            return Err(Error::unsupported(format!(
                "the cap on pinned host memory ({} MiB, UMP_ALLOC_PINNED_LIMIT) is reached",
                cap >> 20
            )));
        }
        // A chunk of its own (a large block) sits at the start of a reservation with room to
        // grow in place (realloc): the room is address space only, neither memory nor pinned.
        let raw_size = if size >= ARENA / 2 {
            size.saturating_mul(GROW_ROOM).max(GROW_ROOM_MIN)
        } else {
            size
        };
        let Some(p) = os::reserve(raw_size, GRANULE) else {
            PINNED.fetch_sub(size, Ordering::Relaxed);
            return Err(Error::oom(format!(
                "the OS refused a reservation of {raw_size} bytes"
            )));
        };
        let base = p.as_ptr() as usize;
        if let Err(e) = self.commit(base, size) {
            PINNED.fetch_sub(size, Ordering::Relaxed);
            // SAFETY: the reservation just made, unused.
            unsafe { os::unmap(p, raw_size) };
            return Err(e);
        }
        // Huge pages before the pages are populated (registering populates them).
        if size >= HUGEPAGE_MIN {
            os::advise_hugepage(base as *mut u8, size);
        }
        if let Err(e) = self.register_new(base, size) {
            PINNED.fetch_sub(size, Ordering::Relaxed);
            // SAFETY: never handed out.
            unsafe { os::unmap(p, raw_size) };
            if self.shared {
                super::shared::forget(base, size);
            }
            return Err(e);
        }
        Ok(Chunk::mapped(base, size, raw_size))
    }
    unsafe fn unmap(&self, chunk: &Chunk) {
        // SAFETY: forwarded from the caller's contract; registered in `map` or when pinning
        // began (unless it still waits: then taken off the list, under its lock, so that it
        // is not pinned meanwhile). In a fork() child the call is refused (the registration
        // belongs to the parent) and the pages, the child's own copies, are simply unmapped.
        if self.register && !self.stop_waiting(chunk.base) {
            let _ = unsafe { cuda::unregister(chunk.raw, self.pin_device()) };
        }
        if let Some(p) = NonNull::new(chunk.raw as *mut u8) {
            // SAFETY: forwarded from the caller's contract.
            unsafe { os::unmap(p, chunk.raw_size) };
        }
        if self.shared {
            super::shared::forget(chunk.base, chunk.size);
        }
        PINNED.fetch_sub(chunk.size, Ordering::Relaxed);
    }
    /// Fresh pages read as zero; in a fork child, shared pages free at the fork show whatever
    /// the parent writes there later, until the child writes them itself.
    fn fresh_is_zero(&self) -> bool {
        !self.shared || super::shared::owner()
    }
    /// Into the chunk's room (see `map`): the new pages are made usable and the whole range is
    /// registered again (a copy may not span two registrations: the driver refuses it with
    /// CUDA_ERROR_INVALID_VALUE, measured on the lent H100). Never moves.
    unsafe fn grow(&self, chunk: &Chunk, size: usize, book: &mut dyn RangeBook) -> Growth {
        let room = chunk.raw + chunk.raw_size;
        if chunk.raw != chunk.base || size <= chunk.size || chunk.base + size > room {
            return Growth::Refused;
        }
        // A chunk waiting to be pinned grows as plain memory does (pinned later, whole). It
        // stays waiting throughout: pinning takes the list's lock, held here.
        let mut waiting = self.lazy.then(|| lock(&LAZY));
        let unpinned = waiting
            .as_ref()
            .is_some_and(|w| w.contains_key(&chunk.base));
        if self.register && !unpinned && !cuda::available() {
            return Growth::Refused;
        }
        let delta = size - chunk.size;
        let cap = PINNED_CAP.load(Ordering::Relaxed);
        if PINNED
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                p.checked_add(delta).filter(|&t| t <= cap)
            })
            .is_err()
        {
            return Growth::Refused;
        }
        let ext = (chunk.base + chunk.size) as *mut u8;
        let undo = || {
            if self.shared {
                // SAFETY: the extension was made here and is used by nothing.
                unsafe { super::shared::retract(chunk.base, chunk.size, size) };
            } else {
                // SAFETY: as above.
                unsafe { os::decommit(ext, delta) };
            }
            PINNED.fetch_sub(delta, Ordering::Relaxed);
        };
        // Why realloc copies after all, for `ump_last_error()` (not an error: the caller copies).
        let why = |what: &str| crate::error::set_last(&format!("realloc in place: {what}"));
        let made = if self.shared {
            super::shared::extend(chunk.base, chunk.size, size)
        } else {
            os::commit(ext, delta)
        };
        if !made {
            why("no memory for the pages of the growth");
            PINNED.fetch_sub(delta, Ordering::Relaxed);
            return Growth::Refused;
        }
        // The registry claims the range only once the OS has granted it.
        if !book.claim(chunk.base, size) {
            why("no memory for the registry entries of the growth");
            undo();
            return Growth::Refused;
        }
        if size >= HUGEPAGE_MIN {
            os::advise_hugepage(chunk.base as *mut u8, size);
        }
        let grown = Chunk {
            size,
            advised: size >= HUGEPAGE_MIN,
            ..*chunk
        };
        if unpinned && let Some(w) = waiting.as_mut() {
            w.insert(chunk.base, (size, self.shared));
        }
        if !self.register || unpinned {
            return Growth::Grown(grown);
        }
        drop(waiting);
        let device = self.pin_device();
        populate(self.shared, chunk.base + chunk.size, delta);
        // SAFETY: the chunk was registered by `map` (or an earlier grow) at its base, and its
        // one live block is not used by the device during a realloc (the caller's contract).
        if let Err(e) = unsafe { cuda::unregister(chunk.base, device) } {
            why(&e.msg);
            undo();
            return Growth::Refused;
        }
        // SAFETY: `[base, base+size)` is mapped and ours.
        if let Err(e) = unsafe { cuda::register(chunk.base, size, device) } {
            undo();
            // SAFETY: as above, the range it had before.
            return match unsafe { cuda::register(chunk.base, chunk.size, device) } {
                Ok(()) => {
                    why(&e.msg);
                    Growth::Refused
                }
                Err(again) => {
                    why(&format!(
                        "{}; registering the old range again failed too ({}): the chunk is \
                         given back once its block is freed",
                        e.msg, again.msg
                    ));
                    Growth::Degraded
                }
            };
        }
        Growth::Grown(grown)
    }
}

/// Before registering shared-file pages (`shared`): fault them in from several threads at
/// once. Registering faults in whatever is not yet there, one 4 KiB page at a time where shared
/// memory gets no transparent huge pages (the lent machines): 0.45-0.6 s per GiB against 0.2 s
/// for anonymous huge pages; four threads halve it (`benches/archive/pinned_make_probe.c`;
/// docs/benchmarks-archive.md, "fork() and the pinned host side"). Anonymous pages are left to
/// the registration (huge pages: fast already). Pages
/// already there (a chunk NumPy used before it was pinned) are left as they are.
fn populate(shared: bool, base: usize, size: usize) {
    if !shared || size < POPULATE_PIECE * 2 {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = POPULATE_THREADS.min(cpus).min(size / POPULATE_PIECE);
    // Refused (an old kernel, no memory): the registration faults the pages in, or fails.
    os::populate_write(base as *mut u8, size, threads, 2 << 20);
}

/// Threads that fault in a large chunk's shared pages before it is registered, at most, and
/// the least each one takes: more than four threads made it no faster (contention on the one
/// memory file), and below 2 x 32 MiB starting a thread costs more than it saves.
const POPULATE_THREADS: usize = 4;
const POPULATE_PIECE: usize = 32 << 20;

/// Address space reserved for a pinned chunk of its own, in multiples of its size, and at
/// least: realloc grows the block in place up to this (address space only: neither memory nor
/// pinned; with the 8x room alone, an array grown in 16 MiB steps to 1 GiB was copied once at
/// 512 MiB on the lent H100).
const GROW_ROOM: usize = 8;
const GROW_ROOM_MIN: usize = 4 << 30;
