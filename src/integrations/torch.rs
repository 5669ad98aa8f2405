//! PyTorch's segments route, the state behind it: which import slots of `libc10_cuda` point at
//! ump-alloc's `cudaMalloc`/`cudaFree` hooks, the functions those slots held before (CUDA's
//! own, or an interposer's), and where what ump-alloc does not serve is handed on. Hooking and
//! unhooking are done here; the hooks themselves, C functions PyTorch calls through the slots,
//! and the exported calls that marshal to these are `crate::ffi::torch`'s.

use crate::allocator;
use crate::error::{Error, Result};
use crate::prim::elf;
use crate::prim::fork::lock;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `cudaError_t cudaMalloc(void **devPtr, size_t size)`.
pub type CudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
/// `cudaError_t cudaFree(void *devPtr)`.
pub type CudaFree = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The two hooks the slots are swapped to: functions with the C signatures of the ones the
/// slots import (the types say so), which live as long as this library.
#[derive(Clone, Copy, Debug)]
pub struct Hooks {
    /// Goes in every `cudaMalloc` slot.
    pub malloc: CudaMalloc,
    /// Goes in every `cudaFree` slot.
    pub free: CudaFree,
}

impl Hooks {
    /// The address of the function a slot importing `symbol` is swapped to while hooked.
    fn of(self, symbol: &str) -> usize {
        if symbol == "cudaFree" {
            self.free as usize
        } else {
            self.malloc as usize
        }
    }
}

/// CUDA's own `cudaMalloc` / `cudaFree` (of the `libcudart` PyTorch links), or an interposer's,
/// for what ump-alloc does not serve. Set before the slots are swapped; never cleared.
static REAL_MALLOC: AtomicUsize = AtomicUsize::new(0);
static REAL_FREE: AtomicUsize = AtomicUsize::new(0);

/// The hooked library's slots, while hooked (serialises hooking and unhooking).
static SLOTS: Mutex<Option<Vec<elf::Slot>>> = Mutex::new(None);

/// Where the hook hands on what ump-alloc does not serve, once hooked (a leaked string).
static FORWARD: AtomicUsize = AtomicUsize::new(0);

/// The `cudaMalloc` the hook forwards to: 0 until [`hook_segments`] has found it, which it does
/// before any slot points at a hook.
#[inline]
pub fn real_malloc() -> usize {
    REAL_MALLOC.load(Ordering::Acquire)
}

/// The `cudaFree` the hook forwards to (see [`real_malloc`]).
#[inline]
pub fn real_free() -> usize {
    REAL_FREE.load(Ordering::Acquire)
}

/// The function the hook hands `symbol` on to: what the library's slot resolved to, if it
/// was resolved and is not the library's own (an interposer such as an `LD_PRELOAD`ed
/// `cudaMalloc` is chained to, not bypassed); else such an interposer in the global scope;
/// else the function of the CUDA runtime the library links.
fn forward_target(imports: &elf::Imports, own: &str, symbol: &str, hooks: Hooks) -> Option<usize> {
    let foreign =
        |v: usize| v != 0 && v != hooks.of(symbol) && elf::object_of(v).is_some_and(|o| o != own);
    let bound = imports
        .slots
        .iter()
        .filter(|s| s.symbol == symbol)
        .map(elf::Slot::get)
        .find(|&v| foreign(v));
    let runtime = || {
        imports
            .needed
            .iter()
            .filter(|n| n.starts_with("libcudart"))
            .find_map(|n| elf::resolve(n, symbol))
    };
    let interposer = || {
        elf::resolve_global(symbol).filter(|&v| {
            foreign(v)
                && elf::object_of(v).is_some_and(|o| {
                    !std::path::Path::new(&o)
                        .file_name()
                        .is_some_and(|f| f.to_string_lossy().starts_with("libcudart"))
                })
        })
    };
    bound.or_else(interposer).or_else(runtime)
}

/// Point the `cudaMalloc` and `cudaFree` import slots of the `libc10_cuda` at `path` at
/// `hooks` (see `ump_torch_hook_segments` for the whole contract). Calling it again while
/// hooked does nothing when the slots still hold the hooks; a slot written by someone else
/// since is hooked again from scratch. On failure nothing is changed.
pub fn hook_segments(path: &str, hooks: Hooks) -> Result<()> {
    let mut slots = lock(&SLOTS);
    if let Some(v) = slots.as_ref() {
        if v.iter().all(|s| s.get() == hooks.of(&s.symbol)) {
            return Ok(());
        }
        // Something else wrote the slots since: hook them again from scratch.
        *slots = None;
    }
    allocator::init()?;
    let imports = elf::imports(path, &["cudaMalloc", "cudaFree"])?;
    let has = |n: &str| imports.slots.iter().any(|s| s.symbol == n);
    if !has("cudaMalloc") || !has("cudaFree") {
        return Err(Error::unsupported(format!(
            "{} does not call cudaMalloc and cudaFree through import slots (a CUDA runtime \
             linked statically?)",
            imports.path
        )));
    }
    let own = std::fs::canonicalize(&imports.path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| imports.path.clone());
    let (Some(m), Some(f)) = (
        forward_target(&imports, &own, "cudaMalloc", hooks),
        forward_target(&imports, &own, "cudaFree", hooks),
    ) else {
        return Err(Error::unsupported(format!(
            "the CUDA runtime {} links ({}) is not loaded or lacks cudaMalloc/cudaFree",
            imports.path,
            imports.needed.join(", ")
        )));
    };
    // Slots that may vanish must not be swapped: the library stays loaded from now on.
    if !elf::keep_loaded(&imports.path) {
        return Err(Error::unsupported(format!(
            "{} could not be kept loaded",
            imports.path
        )));
    }
    REAL_MALLOC.store(m, Ordering::Release);
    REAL_FREE.store(f, Ordering::Release);
    let target = elf::object_of(m).unwrap_or_else(|| format!("{m:#x}"));
    let target = std::ffi::CString::new(target).unwrap_or_default();
    FORWARD.store(
        Box::leak(target.into_boxed_c_str()).as_ptr() as usize,
        Ordering::Release,
    );
    // cudaFree first: from then on every segment of ours can be freed, whichever function
    // made it.
    let mut done = Vec::new();
    let order = imports
        .slots
        .iter()
        .filter(|s| s.symbol == "cudaFree")
        .chain(imports.slots.iter().filter(|s| s.symbol == "cudaMalloc"));
    for slot in order {
        // SAFETY: the hook has the C signature of the function the slot imports and lives as
        // long as this library (which is never unloaded: Python keeps it).
        match unsafe { elf::swap(slot, hooks.of(&slot.symbol)) } {
            Ok(_) => done.push(slot.clone()),
            Err(e) => {
                for s in &done {
                    let real = if s.symbol == "cudaFree" { f } else { m };
                    // SAFETY: the function the slot forwarded to, back in its slot.
                    let _ = unsafe { elf::swap(s, real) };
                }
                return Err(e);
            }
        }
    }
    *slots = Some(done);
    Ok(())
}

/// Put `cudaMalloc`'s slots back to the function they forwarded to; `cudaFree` stays the hook
/// (see `ump_torch_unhook_segments`). A slot that no longer holds `hooks.malloc` is left as it
/// is. On failure nothing is forgotten: the route stays hooked.
pub fn unhook_segments(hooks: Hooks) -> Result<()> {
    let mut slots = lock(&SLOTS);
    if let Some(v) = slots.as_ref() {
        let real = REAL_MALLOC.load(Ordering::Acquire);
        for s in v.iter().filter(|s| s.symbol == "cudaMalloc") {
            if s.get() == hooks.of(&s.symbol) {
                // SAFETY: the function cudaMalloc forwarded to, back in its slot.
                unsafe { elf::swap(s, real) }?;
            }
        }
        *slots = None;
    }
    Ok(())
}

/// The file of the `cudaMalloc` the hook forwards to, NUL-terminated and valid for the life of
/// the process; NULL when the route was never hooked.
pub fn segments_target() -> *const c_char {
    FORWARD.load(Ordering::Acquire) as *const c_char
}

/// Whether the slots are hooked now.
pub fn segments_hooked() -> bool {
    lock(&SLOTS).is_some()
}
