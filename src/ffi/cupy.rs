//! CuPy's contract, through `cupy.cuda.CFunctionAllocator(param, malloc, free, owner)`.
//!
//! CuPy does not check for NULL, and its free passes no stream. Two ways to use these calls:
//!
//! - **The fast path** (what `ump_alloc` installs): `param` is `UMP_CUPY_CURRENT_STREAM`. The
//!   block is made for CuPy's current stream, read from CuPy's own C function
//!   (`get_current_stream_ptr`), and freed into the pool of that stream, as CuPy's own pool
//!   does. CuPy's allocator is a Python callable; two are implemented here, made by Python
//!   with `PyCFunction_NewEx`: `ump_cupy_allocator_direct` makes CuPy's
//!   `CFunctionAllocatorMemory` and `MemoryPointer` itself (what `CFunctionAllocator.malloc`
//!   does), `ump_cupy_allocator` calls a `CFunctionAllocator`'s `malloc`. When the allocation
//!   failed, either raises `cupy.cuda.memory.OutOfMemoryError` through a Python function, so
//!   no Python code runs on a successful allocation. `ump_cupy_fast_path_init` hands over the
//!   few Python/CuPy C functions this needs (see `crate::prim::python`).
//! - **One allocator per stream** (C callers, or CuPy without the C function): `param` is the
//!   stream's handle (`Stream.ptr`; 0: the legacy default stream), and CuPy's free hands it back.
//!
//! A block is reused at once on its stream and, on another one, only behind an event (see
//! `crate::stream`).

use super::{guard, status};
use crate::allocator;
use crate::error::{self, Error};
use crate::integrations::cupy as fast_path;
use crate::prim::python;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// The `param` of a CuPy `CFunctionAllocator` whose blocks are made for CuPy's current stream
/// and freed into that stream's pool (needs `ump_cupy_fast_path_init`). `(void *)-2`.
pub const UMP_CUPY_CURRENT_STREAM: isize = -2;

fn is_current_stream(param: *mut c_void) -> bool {
    param as isize == UMP_CUPY_CURRENT_STREAM
}

/// Allocate `size` bytes for CuPy on device `device_id`, from the memory the mode selects
/// (managed, registered, system or device), for use on the stream whose handle is `param`
/// (`cudaStream_t`; NULL: the legacy default stream; `UMP_CUPY_CURRENT_STREAM`: CuPy's current
/// stream, with the GIL held). Returns NULL with a message in `ump_last_error()` on failure,
/// never aborts.
#[unsafe(no_mangle)]
pub extern "C" fn ump_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device_id: c_int,
) -> *mut c_void {
    guard("ump_cupy_malloc", || {
        let stream = if is_current_stream(param) {
            let Some(api) = python::api() else {
                fast_path::note_failure();
                error::report(&Error::invalid(
                    "ump_cupy_malloc: UMP_CUPY_CURRENT_STREAM needs ump_cupy_fast_path_init",
                ));
                return null_mut();
            };
            // SAFETY: CuPy calls its allocator with the GIL held.
            match unsafe { api.cupy_current_stream() } {
                Some(s) => s,
                None => {
                    fast_path::note_failure();
                    error::report(&Error::invalid(
                        "ump_cupy_malloc: CuPy's get_current_stream_ptr failed",
                    ));
                    return null_mut();
                }
            }
        } else {
            param as usize
        };
        match allocator::device_malloc(size, device_id, stream) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                fast_path::note_failure();
                error::report(&e.context("ump_cupy_malloc"));
                null_mut()
            }
        }
    })
}

/// Free a block from `ump_cupy_malloc`; `param` is the allocator's `param`, as CuPy passes it:
/// a stream handle (the stream the block was last used on) or `UMP_CUPY_CURRENT_STREAM` (the
/// block goes back to the pool of the stream it was made for). NULL is a no-op; a foreign
/// pointer or a double free is ignored and counted.
#[unsafe(no_mangle)]
pub extern "C" fn ump_cupy_free(param: *mut c_void, ptr: *mut c_void, device_id: c_int) {
    guard("ump_cupy_free", || {
        let stream = (!is_current_stream(param)).then_some(param as usize);
        if let Err(e) = allocator::device_free(ptr as usize, device_id, stream) {
            error::report(&e.context("ump_cupy_free"));
        }
    })
}

/// Hand over what the CuPy fast path calls: `call_obj_args`, `decref`, `tuple_get_item` and
/// `long_from_long` are CPython's `PyObject_CallFunctionObjArgs`, `Py_DecRef`,
/// `PyTuple_GetItem` and `PyLong_FromLong`; `current_stream` is CuPy's `get_current_stream_ptr`
/// C function and `device_id` CuPy's `get_device_id` (from the modules' `__pyx_capi__`).
/// `long_from_long` and `device_id` may both be NULL (then only `ump_cupy_allocator` works,
/// not `ump_cupy_allocator_direct`). Called once by `ump_alloc`; later calls must pass the same
/// functions. Returns `UMP_OK`, or `UMP_ERR_INVALID` for a NULL, only one of the last two, or
/// different functions than before.
///
/// # Safety
/// Each non-NULL address is that function, in this process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_cupy_fast_path_init(
    call_obj_args: *const c_void,
    decref: *const c_void,
    tuple_get_item: *const c_void,
    current_stream: *const c_void,
    long_from_long: *const c_void,
    device_id: *const c_void,
) -> c_int {
    status("ump_cupy_fast_path_init", || {
        let a = python::Addresses {
            call: call_obj_args as usize,
            decref: decref as usize,
            tuple_get: tuple_get_item as usize,
            current_stream: current_stream as usize,
            long_from_long: long_from_long as usize,
            device_id: device_id as usize,
        };
        // SAFETY: per this function's contract.
        if unsafe { python::init(a) } {
            Ok(())
        } else {
            Err(Error::invalid(
                "ump_cupy_fast_path_init: a NULL function, or other functions than before",
            ))
        }
    })
}

/// CuPy's allocator, as a Python builtin with one argument (`METH_O`): `self_` is the tuple
/// `(malloc, raise_oom)`, where `malloc` is the bound `CFunctionAllocator.malloc` of an
/// allocator whose `param` is `UMP_CUPY_CURRENT_STREAM` and `raise_oom(size)` raises CuPy's
/// `OutOfMemoryError`. Returns `malloc(size)`'s `MemoryPointer`, or NULL with a Python
/// exception set. Python makes the callable with `PyCFunction_NewEx`; it is not for C callers.
///
/// # Safety
/// Called by CPython with the GIL held, after `ump_cupy_fast_path_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_cupy_allocator(self_: *mut c_void, size: *mut c_void) -> *mut c_void {
    guard("ump_cupy_allocator", || {
        let Some(api) = python::api() else {
            return null_mut(); // never installed without the API; CPython reports a SystemError
        };
        // SAFETY: under the GIL (CPython called us); `self_` is the tuple the callable was
        // made with, kept alive by the callable; `size` is a live argument.
        unsafe {
            let malloc = api.tuple_item(self_, 0);
            let raise_oom = api.tuple_item(self_, 1);
            if malloc.is_null() || raise_oom.is_null() {
                return null_mut();
            }
            fast_path::clear_failure();
            let mem = api.call1(malloc, size);
            if mem.is_null() || !fast_path::failed() {
                return mem;
            }
            api.decref(mem);
            api.call1(raise_oom, size)
        }
    })
}

/// CuPy's allocator, as a Python builtin with one argument (`METH_O`), making CuPy's objects
/// itself: `self_` is the tuple `(raise_oom, CFunctionAllocatorMemory, MemoryPointer, param,
/// malloc, free, 0)` (the last four as Python ints: `UMP_CUPY_CURRENT_STREAM`, the addresses
/// of `ump_cupy_malloc` and `ump_cupy_free`, zero). Returns
/// `MemoryPointer(CFunctionAllocatorMemory(size, param, malloc, free, device), 0)` with
/// CuPy's current device, what `CFunctionAllocator.malloc` returns, without its bound-method
/// call and its two new Python ints per allocation; or NULL with a Python exception set
/// (`raise_oom(size)` when the allocation failed). Needs `ump_cupy_fast_path_init` with
/// `long_from_long` and `device_id`. Python makes the callable with `PyCFunction_NewEx`; it is
/// not for C callers.
///
/// # Safety
/// Called by CPython with the GIL held, after `ump_cupy_fast_path_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ump_cupy_allocator_direct(
    self_: *mut c_void,
    size: *mut c_void,
) -> *mut c_void {
    guard("ump_cupy_allocator_direct", || {
        let Some(api) = python::api().filter(|a| a.has_direct()) else {
            return null_mut(); // never installed without the API; CPython reports a SystemError
        };
        // SAFETY: under the GIL (CPython called us); `self_` is the tuple the callable was
        // made with, kept alive by the callable; `size` is a live argument; each new
        // reference is dropped once.
        unsafe {
            let item = |i| api.tuple_item(self_, i);
            let (raise_oom, mem_type, ptr_type) = (item(0), item(1), item(2));
            let (param, malloc, free, zero) = (item(3), item(4), item(5), item(6));
            if [raise_oom, mem_type, ptr_type, param, malloc, free, zero]
                .iter()
                .any(|o| o.is_null())
            {
                return null_mut();
            }
            let device = api.cupy_device_id();
            if device.is_null() {
                return null_mut();
            }
            fast_path::clear_failure();
            let mem = api.call5(mem_type, [size, param, malloc, free, device]);
            api.decref(device);
            if mem.is_null() {
                return null_mut();
            }
            if fast_path::failed() {
                api.decref(mem);
                return api.call1(raise_oom, size);
            }
            let ptr = api.call2(ptr_type, mem, zero);
            api.decref(mem);
            ptr
        }
    })
}
