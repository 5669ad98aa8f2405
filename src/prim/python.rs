//! The CPython C API and CuPy's Cython C API, reached through function pointers handed over
//! from Python once (`ump_cupy_fast_path_init`): the library links to no libpython, so one
//! build serves every Python version, and C programs never load Python.
//!
//! Only functions of CPython's stable C API (present in every CPython >= 3.9) are used, and
//! only with the GIL held: they are called from a Python callable or from CuPy's allocator
//! call, both of which run under the GIL.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// A `PyObject *`.
pub type PyObject = *mut c_void;

/// `PyObject *PyObject_CallFunctionObjArgs(PyObject *callable, ..., NULL)`.
type CallObjArgs = unsafe extern "C" fn(PyObject, ...) -> PyObject;
/// `void Py_DecRef(PyObject *)`.
type DecRef = unsafe extern "C" fn(PyObject);
/// `PyObject *PyTuple_GetItem(PyObject *, Py_ssize_t)` (a borrowed reference).
type TupleGetItem = unsafe extern "C" fn(PyObject, isize) -> PyObject;
/// CuPy's `cupy.cuda.stream.get_current_stream_ptr` (a Cython `cpdef`: its C function takes
/// `int __pyx_skip_dispatch`).
type CurrentStream = unsafe extern "C" fn(c_int) -> isize;

/// The functions, as handed over.
pub struct Api {
    call: CallObjArgs,
    decref: DecRef,
    tuple_get: TupleGetItem,
    current_stream: CurrentStream,
}

static API: OnceLock<Api> = OnceLock::new();

/// Take the function pointers (addresses from `ctypes.pythonapi` and CuPy's `__pyx_capi__`).
/// Returns false when one is NULL or they were set already with other values.
///
/// # Safety
/// Each address is the function its type alias above describes, in this process.
pub unsafe fn init(call: usize, decref: usize, tuple_get: usize, current_stream: usize) -> bool {
    if call == 0 || decref == 0 || tuple_get == 0 || current_stream == 0 {
        return false;
    }
    // SAFETY: per this function's contract.
    let api = unsafe {
        Api {
            call: std::mem::transmute::<usize, CallObjArgs>(call),
            decref: std::mem::transmute::<usize, DecRef>(decref),
            tuple_get: std::mem::transmute::<usize, TupleGetItem>(tuple_get),
            current_stream: std::mem::transmute::<usize, CurrentStream>(current_stream),
        }
    };
    let set = API.get_or_init(|| api);
    set.call as usize == call && set.current_stream as usize == current_stream
}

/// The API, once handed over.
pub fn api() -> Option<&'static Api> {
    API.get()
}

impl Api {
    /// CuPy's current stream handle on this thread (0: the legacy default stream).
    ///
    /// # Safety
    /// The GIL is held.
    pub unsafe fn cupy_current_stream(&self) -> usize {
        // SAFETY: CuPy's function reads its thread-local state; the caller holds the GIL.
        unsafe { (self.current_stream)(1) as usize }
    }

    /// `callable(arg)`: a new reference, or NULL with a Python exception set.
    ///
    /// # Safety
    /// The GIL is held; both are live objects.
    pub unsafe fn call1(&self, callable: PyObject, arg: PyObject) -> PyObject {
        // SAFETY: a NULL-terminated argument list of live objects, under the GIL.
        unsafe { (self.call)(callable, arg, std::ptr::null_mut::<c_void>()) }
    }

    /// `tuple[i]` (borrowed), or NULL with an exception set.
    ///
    /// # Safety
    /// The GIL is held; `tuple` is a live object.
    pub unsafe fn tuple_item(&self, tuple: PyObject, i: isize) -> PyObject {
        // SAFETY: under the GIL; PyTuple_GetItem checks the type and the index.
        unsafe { (self.tuple_get)(tuple, i) }
    }

    /// Drop a reference.
    ///
    /// # Safety
    /// The GIL is held; `obj` is a reference the caller owns.
    pub unsafe fn decref(&self, obj: PyObject) {
        // SAFETY: per the contract.
        unsafe { (self.decref)(obj) }
    }
}
