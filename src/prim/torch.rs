//! PyTorch's C++ side, reached without its headers or a C++ compiler: the hooks of
//! `torch::cuda::CUDAPluggableAllocator` and its out-of-memory exception.
//!
//! PyTorch's pluggable allocator keeps its hooks (`record_stream`, `reset` for
//! `torch.cuda.empty_cache()`, the memory fraction, `init`) in `std::function` members that
//! only C++ setters reach, and it turns a NULL from the allocation function into a tensor at
//! address 0. This module, given `libtorch_cuda.so` already loaded by `import torch`:
//! - finds the allocator object PyTorch uses (`c10::cuda::CUDACachingAllocator::allocator`)
//!   and accepts it only when its vtable is `CUDAPluggableAllocator`'s;
//! - calls the exported setters with `std::function` objects built here, in the libstdc++
//!   layout (functor storage of two words, manager, invoker: unchanged since GCC 4.x), each
//!   holding one plain function pointer;
//! - throws `c10::OutOfMemoryError` (which PyTorch's Python layer turns into
//!   `torch.OutOfMemoryError`): built with the exported `c10::Error` constructor, given
//!   `OutOfMemoryError`'s vtable, thrown with `__cxa_throw`; where a symbol is missing,
//!   `c10::detail::torchCheckFail` throws a plain `c10::Error` (a `RuntimeError`) instead.
//!
//! Every symbol is looked up by its mangled name in `libtorch_cuda.so` and its dependencies
//! (`libc10_cuda.so`, `libc10.so`, `libstdc++`); a PyTorch whose names differ is refused as a
//! whole, never half used.

use crate::error::{Error, Result};
use libloading::os::unix::Library;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `RTLD_NOLOAD`: find a library only if it is loaded already.
const RTLD_NOLOAD: c_int = 0x4;

const SYM_ALLOCATOR: &str = "_ZN3c104cuda20CUDACachingAllocator9allocatorE";
const SYM_PLUGGABLE_VTABLE: &str =
    "_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";
const SYM_SET_RECORD_STREAM: &str = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator20set_record_stream_fnESt8functionIFvPvP11CUstream_stEE";
const SYM_SET_RESET: &str = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator12set_reset_fnESt8functionIFvvEE";
const SYM_SET_FRACTION: &str = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator22set_memory_fraction_fnESt8functionIFvdiEE";
const SYM_SET_INIT: &str =
    "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator11set_init_fnESt8functionIFviEE";
const SYM_ERROR_CTOR: &str = "_ZN3c105ErrorC1ENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt10shared_ptrIKNS_9LazyValueIS6_EEEPKv";
const SYM_OOM_VTABLE: &str = "_ZTVN3c1016OutOfMemoryErrorE";
const SYM_OOM_TYPEINFO: &str = "_ZTIN3c1016OutOfMemoryErrorE";
const SYM_CHECK_FAIL: &str = "_ZN3c106detail14torchCheckFailEPKcS2_jS2_";

/// Bytes reserved for a `c10::Error` object (about 130 in PyTorch 2.x): generous on purpose,
/// the exception allocator is told this size and the constructor writes what it needs.
const ERROR_OBJECT_BYTES: usize = 512;

/// The functor storage of a `std::function` (`std::_Any_data`): two words.
type AnyData = [usize; 2];
/// `std::_Function_base::_Manager_type`.
type Manager = unsafe extern "C" fn(*mut AnyData, *const AnyData, c_int) -> bool;

/// A `std::function<R(Args...)>` in libstdc++'s layout.
#[repr(C)]
struct StdFunction {
    functor: AnyData,
    manager: Option<Manager>,
    invoker: *const c_void,
}

/// The manager of a `std::function` holding one function pointer in its first word: copying
/// copies the word, destroying does nothing, the type is reported as unknown (null).
unsafe extern "C" fn manager(dest: *mut AnyData, src: *const AnyData, op: c_int) -> bool {
    // SAFETY: libstdc++ passes valid `_Any_data` storage for both (for op 0/1, `src` is ours).
    unsafe {
        match op {
            0 => (*dest)[0] = 0,            // __get_type_info
            1 => (*dest)[0] = src as usize, // __get_functor_ptr
            2 => *dest = *src,              // __clone_functor
            _ => {}                         // __destroy_functor
        }
    }
    false
}

/// The hooks ump-alloc gives PyTorch. Each runs inside PyTorch's C++ code: it must not unwind
/// (the callers wrap their bodies in the FFI panic boundary).
#[derive(Clone, Copy)]
pub struct Hooks {
    /// `record_stream(ptr, stream)`: `ptr` is used on `stream` too.
    pub record_stream: fn(usize, usize),
    /// `torch.cuda.empty_cache()`.
    pub reset: fn(),
    /// `torch.cuda.set_per_process_memory_fraction(fraction, device)`.
    pub memory_fraction: fn(f64, i32),
    /// The caching allocator's `init(device_count)`.
    pub init: fn(i32),
}

// Invokers: `R (*)(const _Any_data&, Args&&...)`; arguments arrive by reference.
unsafe extern "C" fn invoke_record_stream(f: *const AnyData, ptr: *mut usize, stream: *mut usize) {
    // SAFETY: `f` holds the `fn(usize, usize)` stored by `function`; PyTorch passes valid
    // references to its arguments.
    unsafe {
        let hook: fn(usize, usize) = std::mem::transmute::<usize, fn(usize, usize)>((*f)[0]);
        hook(*ptr, *stream);
    }
}

unsafe extern "C" fn invoke_reset(f: *const AnyData) {
    // SAFETY: as for `invoke_record_stream`.
    unsafe {
        let hook: fn() = std::mem::transmute::<usize, fn()>((*f)[0]);
        hook();
    }
}

unsafe extern "C" fn invoke_fraction(f: *const AnyData, fraction: *mut f64, device: *mut c_int) {
    // SAFETY: as for `invoke_record_stream`.
    unsafe {
        let hook: fn(f64, i32) = std::mem::transmute::<usize, fn(f64, i32)>((*f)[0]);
        hook(*fraction, *device);
    }
}

unsafe extern "C" fn invoke_init(f: *const AnyData, count: *mut c_int) {
    // SAFETY: as for `invoke_record_stream`.
    unsafe {
        let hook: fn(i32) = std::mem::transmute::<usize, fn(i32)>((*f)[0]);
        hook(*count);
    }
}

fn function(hook: usize, invoker: *const c_void) -> StdFunction {
    StdFunction {
        functor: [hook, 0],
        manager: Some(manager as Manager),
        invoker,
    }
}

/// `void CUDAPluggableAllocator::set_X(std::function<...>)`: `this`, then the by-value
/// `std::function` passed by invisible reference (the caller owns and destroys it).
type Setter = unsafe extern "C" fn(*mut c_void, *mut StdFunction);
/// `c10::Error::Error(std::string, std::shared_ptr<const LazyValue<std::string>>, const void*)`.
type ErrorCtor =
    unsafe extern "C-unwind" fn(*mut c_void, *mut CxxString, *mut [usize; 2], *const c_void);
type CxaAllocate = unsafe extern "C" fn(usize) -> *mut c_void;
type CxaThrow = unsafe extern "C-unwind" fn(*mut c_void, *const c_void, *const c_void) -> !;
type OperatorNew = unsafe extern "C-unwind" fn(usize) -> *mut u8;
type OperatorDelete = unsafe extern "C" fn(*mut u8);
type CheckFail = unsafe extern "C-unwind" fn(*const c_char, *const c_char, u32, *const c_char) -> !;

/// What it takes to throw `c10::OutOfMemoryError`.
struct Oom {
    allocate: CxaAllocate,
    throw: CxaThrow,
    ctor: ErrorCtor,
    op_new: OperatorNew,
    op_delete: OperatorDelete,
    vtable: usize,
    typeinfo: usize,
}

/// PyTorch, attached.
struct Torch {
    oom: Option<Oom>,
    check_fail: Option<CheckFail>,
    /// Keeps `libtorch_cuda.so` (and so its dependencies) loaded for good.
    _lib: Library,
}

static TORCH: OnceLock<Torch> = OnceLock::new();

/// A `std::string` (the C++11 ABI of libstdc++): pointer, length, then either the capacity
/// or a 16-byte local buffer for short strings.
#[repr(C)]
struct CxxString {
    ptr: *mut u8,
    len: usize,
    local: [u8; 16],
}

fn sym(lib: &Library, name: &str) -> Option<usize> {
    let c = CString::new(name).ok()?;
    // SAFETY: looking a symbol up runs no code; it is only read as an address here.
    let s = unsafe { lib.get::<*const c_void>(c.as_bytes_with_nul()) }.ok()?;
    let p = s.into_raw() as usize;
    (p != 0).then_some(p)
}

fn need(lib: &Library, name: &str) -> Result<usize> {
    sym(lib, name).ok_or_else(|| {
        Error::unsupported(format!(
            "this PyTorch lacks the symbol {name}: its pluggable allocator's hooks cannot be set"
        ))
    })
}

/// Attach to PyTorch: `libtorch_cuda` is the path of the loaded `libtorch_cuda.so`. The
/// current CUDA allocator must be the `CUDAPluggableAllocator` just installed. Sets `hooks`
/// and prepares the out-of-memory exception. Returns whether `c10::OutOfMemoryError` (rather
/// than a plain `c10::Error`) can be thrown. Attaching twice sets the hooks again.
pub fn attach(libtorch_cuda: &str, hooks: Hooks) -> Result<bool> {
    // SAFETY: RTLD_NOLOAD maps nothing and runs no initialiser: the library is only found
    // if `import torch` loaded it.
    let lib = unsafe { Library::open(Some(libtorch_cuda), RTLD_NOLOAD | libc::RTLD_NOW) }.map_err(
        |e| {
            Error::unsupported(format!(
                "{libtorch_cuda} is not loaded in this process (import torch first): {e}"
            ))
        },
    )?;
    let current = need(&lib, SYM_ALLOCATOR)?;
    let vtable = need(&lib, SYM_PLUGGABLE_VTABLE)?;
    let setters = [
        need(&lib, SYM_SET_RECORD_STREAM)?,
        need(&lib, SYM_SET_RESET)?,
        need(&lib, SYM_SET_FRACTION)?,
        need(&lib, SYM_SET_INIT)?,
    ];
    // SAFETY: the symbol is `std::atomic<CUDAAllocator*>`, one pointer-sized atomic word.
    let obj = unsafe { &*(current as *const std::sync::atomic::AtomicPtr<c_void>) }
        .load(std::sync::atomic::Ordering::Acquire);
    if obj.is_null() {
        return Err(Error::invalid("PyTorch has no CUDA allocator yet"));
    }
    // An object of a polymorphic class starts with its vtable pointer: two words (offset to
    // top, type info) past the vtable symbol.
    // SAFETY: `obj` is PyTorch's live allocator object; its first word is readable.
    let vptr = unsafe { *(obj as *const usize) };
    if vptr != vtable + 2 * size_of::<usize>() {
        return Err(Error::invalid(
            "PyTorch's current CUDA allocator is not a CUDAPluggableAllocator \
             (torch.cuda.memory.change_current_allocator was not called, or failed)",
        ));
    }
    let invokers = [
        (
            hooks.record_stream as usize,
            invoke_record_stream as *const c_void,
        ),
        (hooks.reset as usize, invoke_reset as *const c_void),
        (
            hooks.memory_fraction as usize,
            invoke_fraction as *const c_void,
        ),
        (hooks.init as usize, invoke_init as *const c_void),
    ];
    for (setter, (hook, invoker)) in setters.into_iter().zip(invokers) {
        let mut f = function(hook, invoker);
        // SAFETY: `setter` is the exported member function of the class `obj` was checked to
        // be; `f` is a valid std::function the callee moves from (our manager makes the
        // moved-from or copied state need no destruction).
        unsafe {
            let set: Setter = std::mem::transmute::<usize, Setter>(setter);
            set(obj, &mut f);
        }
    }
    let oom = prepare_oom(&lib);
    let check_fail = sym(&lib, SYM_CHECK_FAIL)
        // SAFETY: the exported `c10::detail::torchCheckFail(const char*, const char*,
        // uint32_t, const char*)`, which throws `c10::Error`.
        .map(|p| unsafe { std::mem::transmute::<usize, CheckFail>(p) });
    let can_oom = oom.is_some();
    let _ = TORCH.set(Torch {
        oom,
        check_fail,
        _lib: lib,
    });
    Ok(can_oom)
}

fn prepare_oom(lib: &Library) -> Option<Oom> {
    let f = |n| sym(lib, n);
    // SAFETY: each address is the exported function of that mangled name, with the
    // signature its type alias spells out.
    unsafe {
        Some(Oom {
            allocate: std::mem::transmute::<usize, CxaAllocate>(f("__cxa_allocate_exception")?),
            throw: std::mem::transmute::<usize, CxaThrow>(f("__cxa_throw")?),
            ctor: std::mem::transmute::<usize, ErrorCtor>(f(SYM_ERROR_CTOR)?),
            op_new: std::mem::transmute::<usize, OperatorNew>(f("_Znwm")?),
            op_delete: std::mem::transmute::<usize, OperatorDelete>(f("_ZdlPv")?),
            vtable: f(SYM_OOM_VTABLE)?,
            typeinfo: f(SYM_OOM_TYPEINFO)?,
        })
    }
}

/// Whether [`attach`] succeeded (allocation failures may then be thrown to PyTorch).
pub fn attached() -> bool {
    TORCH.get().is_some()
}

/// Throw `msg` to PyTorch as `c10::OutOfMemoryError` when `oom`, else as `c10::Error`.
/// Returns only when PyTorch is not attached (the caller then returns NULL).
///
/// # Safety
/// Only from a function PyTorch called through its allocator (its caller is C++ code that
/// expects exceptions), with every frame between here and there declared `C-unwind` and no
/// Rust `catch_unwind` in between.
pub unsafe fn throw(msg: &str, oom: bool) {
    let Some(t) = TORCH.get() else { return };
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    if oom && let Some(o) = &t.oom {
        // SAFETY: per this function's contract; `throw_oom` never returns.
        unsafe { throw_oom(o, text.as_bytes()) }
    }
    if let Some(fail) = t.check_fail {
        let func = c"ump_torch_malloc";
        let file = c"ump-alloc";
        // SAFETY: torchCheckFail copies its strings into the exception before throwing.
        unsafe { fail(func.as_ptr(), file.as_ptr(), 0, text.as_ptr()) }
    }
}

/// Build and throw a `c10::OutOfMemoryError` holding `msg`.
unsafe fn throw_oom(o: &Oom, msg: &[u8]) -> ! {
    // SAFETY: every call below is to the libstdc++ / c10 function of that name, with the
    // argument layout of the Itanium C++ ABI: the exception object is ours until thrown,
    // by-value class arguments are temporaries we own and destroy after the call.
    unsafe {
        let obj = (o.allocate)(ERROR_OBJECT_BYTES);
        std::ptr::write_bytes(obj as *mut u8, 0, ERROR_OBJECT_BYTES);
        let mut s = CxxString {
            ptr: std::ptr::null_mut(),
            len: msg.len(),
            local: [0; 16],
        };
        if msg.len() < 16 {
            s.local[..msg.len()].copy_from_slice(msg);
            s.ptr = s.local.as_mut_ptr();
        } else {
            let buf = (o.op_new)(msg.len() + 1);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf, msg.len());
            *buf.add(msg.len()) = 0;
            s.ptr = buf;
            s.local[..8].copy_from_slice(&msg.len().to_ne_bytes()); // the capacity
        }
        let mut backtrace = [0usize; 2]; // an empty shared_ptr
        (o.ctor)(obj, &mut s, &mut backtrace, std::ptr::null());
        if s.ptr != s.local.as_mut_ptr() {
            (o.op_delete)(s.ptr); // not moved from: still ours
        }
        let vptr = o.vtable + 2 * size_of::<usize>();
        *(obj as *mut usize) = vptr;
        // The complete-object destructor is the first virtual slot.
        let dtor = *(vptr as *const usize) as *const c_void;
        (o.throw)(obj, o.typeinfo as *const c_void, dtor)
    }
}
