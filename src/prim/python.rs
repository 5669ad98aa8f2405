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
/// CuPy's `get_current_stream_ptr` (`cupy_backends.cuda.stream`, or `cupy.cuda.stream`): a
/// Cython `cdef intptr_t ...() except? -1`, or a `cpdef` whose C function takes
/// `int __pyx_skip_dispatch` (passing that int to a function without parameters is harmless
/// in the C calling conventions of every platform CuPy supports).
type CurrentStream = unsafe extern "C" fn(c_int) -> isize;
/// `PyObject *PyLong_FromLong(long)`.
type LongFromLong = unsafe extern "C" fn(std::ffi::c_long) -> PyObject;
/// CuPy's `cupy.cuda.device.get_device_id` (`cpdef int get_device_id() except? -1`).
type DeviceId = unsafe extern "C" fn(c_int) -> c_int;

/// The functions, as handed over.
pub struct Api {
    call: CallObjArgs,
    decref: DecRef,
    tuple_get: TupleGetItem,
    current_stream: CurrentStream,
    /// For the direct allocator (`ump_cupy_allocator_direct`); absent with older set-ups.
    direct: Option<(LongFromLong, DeviceId)>,
}

static API: OnceLock<Api> = OnceLock::new();

/// The addresses handed over (0: absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    pub call: usize,
    pub decref: usize,
    pub tuple_get: usize,
    pub current_stream: usize,
    /// Both or neither: the direct allocator needs them.
    pub long_from_long: usize,
    pub device_id: usize,
}

/// Take the function pointers (addresses from `ctypes.pythonapi` and CuPy's `__pyx_capi__`).
/// Returns false when a required one is NULL, only one of the direct pair is given, or they
/// were set already with other values.
///
/// # Safety
/// Each non-zero address is the function its type alias above describes, in this process.
pub unsafe fn init(a: Addresses) -> bool {
    if a.call == 0 || a.decref == 0 || a.tuple_get == 0 || a.current_stream == 0 {
        return false;
    }
    if (a.long_from_long == 0) != (a.device_id == 0) {
        return false;
    }
    // SAFETY: per this function's contract (each address is its function, and not zero).
    let api = unsafe {
        Api {
            call: std::mem::transmute::<usize, CallObjArgs>(a.call),
            decref: std::mem::transmute::<usize, DecRef>(a.decref),
            tuple_get: std::mem::transmute::<usize, TupleGetItem>(a.tuple_get),
            current_stream: std::mem::transmute::<usize, CurrentStream>(a.current_stream),
            direct: (a.long_from_long != 0).then(|| {
                (
                    std::mem::transmute::<usize, LongFromLong>(a.long_from_long),
                    std::mem::transmute::<usize, DeviceId>(a.device_id),
                )
            }),
        }
    };
    API.get_or_init(|| api).addresses() == a
}

/// The API, once handed over.
pub fn api() -> Option<&'static Api> {
    API.get()
}

impl Api {
    fn addresses(&self) -> Addresses {
        let (long_from_long, device_id) = self
            .direct
            .map_or((0, 0), |(l, d)| (l as usize, d as usize));
        Addresses {
            call: self.call as usize,
            decref: self.decref as usize,
            tuple_get: self.tuple_get as usize,
            current_stream: self.current_stream as usize,
            long_from_long,
            device_id,
        }
    }

    /// Whether the direct allocator's functions were handed over.
    pub fn has_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// CuPy's current stream handle on this thread (0: the legacy default stream), or None
    /// when CuPy's function failed (`except? -1`: a Python exception may be set).
    ///
    /// # Safety
    /// The GIL is held.
    pub unsafe fn cupy_current_stream(&self) -> Option<usize> {
        // SAFETY: CuPy's function reads its thread-local state; the caller holds the GIL.
        let s = unsafe { (self.current_stream)(1) };
        (s != -1).then_some(s as usize)
    }

    /// CuPy's current device as a Python int (a new reference), or NULL with a Python
    /// exception set (or none, when CuPy failed without one: CPython then raises
    /// SystemError). NULL too when the direct functions were not handed over.
    ///
    /// # Safety
    /// The GIL is held.
    pub unsafe fn cupy_device_id(&self) -> PyObject {
        let Some((long, device_id)) = self.direct else {
            return std::ptr::null_mut();
        };
        // SAFETY: CuPy's function calls cudaGetDevice; the caller holds the GIL, which
        // PyLong_FromLong needs.
        unsafe {
            let d = device_id(1);
            if d < 0 {
                return std::ptr::null_mut();
            }
            long(d.into())
        }
    }

    /// `callable(args...)`: a new reference, or NULL with a Python exception set.
    ///
    /// # Safety
    /// The GIL is held; every object is live.
    pub unsafe fn call5(&self, callable: PyObject, a: [PyObject; 5]) -> PyObject {
        // SAFETY: a NULL-terminated argument list of live objects, under the GIL.
        unsafe {
            (self.call)(
                callable,
                a[0],
                a[1],
                a[2],
                a[3],
                a[4],
                std::ptr::null_mut::<c_void>(),
            )
        }
    }

    /// `callable(a, b)`: a new reference, or NULL with a Python exception set.
    ///
    /// # Safety
    /// The GIL is held; every object is live.
    pub unsafe fn call2(&self, callable: PyObject, a: PyObject, b: PyObject) -> PyObject {
        // SAFETY: a NULL-terminated argument list of live objects, under the GIL.
        unsafe { (self.call)(callable, a, b, std::ptr::null_mut::<c_void>()) }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_refuses_missing_functions_and_keeps_nothing() {
        let ok = Addresses {
            call: 8,
            decref: 16,
            tuple_get: 24,
            current_stream: 32,
            long_from_long: 40,
            device_id: 48,
        };
        // The addresses are never called: every case is refused before anything is kept.
        for bad in [
            Addresses { call: 0, ..ok },
            Addresses { decref: 0, ..ok },
            Addresses { tuple_get: 0, ..ok },
            Addresses {
                current_stream: 0,
                ..ok
            },
            Addresses {
                long_from_long: 0,
                ..ok
            },
            Addresses { device_id: 0, ..ok },
        ] {
            // SAFETY: refused before any address is turned into a function.
            assert!(!unsafe { init(bad) }, "{bad:?}");
        }
        assert!(api().is_none());
    }
}
