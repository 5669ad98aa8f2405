//! ump-alloc: one allocator for NumPy, CuPy and PyTorch over memory that both the CPU and the
//! GPU can reach, chosen per machine.
//!
//! Layers, bottom up:
//! - [`prim`]: every OS call (`prim::os`) and every CUDA driver call (`prim::cuda`).
//! - [`backing`]: resources that hand out chunks of one kind of memory (host, system, managed,
//!   registered, device).
//! - [`pool`]: the caching sub-allocator over a backing (slabs for small blocks, best-fit spans
//!   with splitting and coalescing for large ones), with [`stats`] built in and the lock-free
//!   [`registry`] that answers "is this pointer ours".
//! - [`mode`] and [`config`]: policy (which backing, which alignment), from capabilities and
//!   `UMP_ALLOC_*` variables.
//! - [`allocator`]: the process-wide state composing the above; [`access`] and [`transfer`]:
//!   views of memory both sides reach, and when a copy is faster.
//! - [`integrations`]: the state of each consumer's integration (PyTorch's hooked segment
//!   slots, NumPy's dispatch handler and the handler it stands in for, CuPy's failed-call flag).
//! - [`ffi`]: the C contract, one file per consumer (numpy, cupy, torch, scope, access) and
//!   what they share (config: configuration and errors; query: introspection); it only
//!   marshals, calling into the layers below.
//! - [`fork`]: `pthread_atfork` handlers that keep every lock consistent across `fork()`.

pub mod access;
pub mod allocator;
pub mod backing;
pub mod config;
pub mod error;
pub mod ffi;
pub mod fork;
pub mod host;
pub mod integrations;
pub mod migrate;
pub mod mode;
pub mod pointer;
pub mod pool;
pub mod prim;
pub mod registry;
pub mod scope;
pub mod stats;
pub mod stream;
pub mod transfer;

pub use error::{Error, Result, Status};
pub use mode::Mode;

/// Runs when the library is loaded (before any allocation and before any other thread can
/// use it): the CUDA layer is given the configuration's reading of `UMP_ALLOC_NO_CUDA`, the
/// fork handlers are registered, and membarrier where it is cheap (a process of one thread).
extern "C" fn on_load() {
    prim::cuda::set_disabled_check(config::no_cuda_in_env);
    fork::install();
    pool::register_membarrier_if_alone();
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
