//! Every CUDA driver call of ump-alloc, and nothing else.
//!
//! Types and enum values come from cudarc's driver bindings (`cudarc::driver::sys`). The
//! library itself is opened here rather than through cudarc's loader, for three reasons:
//! cudarc panics when libcuda is missing or a symbol is absent (no panic may cross our C ABI),
//! it tries `libcuda.so` before `libcuda.so.1` (so a toolkit stub on LD_LIBRARY_PATH wins), and
//! a driver older than 12.2 lacks the `_v2` prefetch and advise entry points, which must
//! degrade to "unavailable", not abort.
//!
//! Results are read as plain integers (`CuResult`), never as cudarc's `CUresult` enum: a driver
//! may return a code the enum does not list.
//!
//! Layers, as cudarc keeps them apart: `libcuda` is the driver itself (the symbol table, the
//! loader, error codes, primary contexts) and what a fork leaves of it; the calls, typed and
//! returning `Result`, are in `caps` (the capability probe), `memory` (allocation,
//! registration, advice, prefetch), `stream` (streams and synchronisation), `event` (events
//! and their cache), `pointer` (what the driver knows of an address), `managed` (batched
//! discards and prefetches) and `vmm` (virtual memory management).

mod caps;
mod event;
mod libcuda;
mod managed;
mod memory;
mod pointer;
mod stream;
mod vmm;
pub use caps::{DeviceCaps, MachineCaps, probe};
pub use event::Event;
pub(crate) use event::fork_lock_events;
pub(crate) use libcuda::fork_lock_load;
pub use libcuda::{
    CuResult, active_context_device, active_context_device_if_loaded, available, context_active,
    current_device, device_nodes_present, fork_poisoned, set_disabled_check,
};
pub use managed::{discard, discard_and_prefetch, has_discard};
pub use memory::{
    advise_accessed_by, advise_preferred, alloc_device, alloc_managed, free, mem_info, prefetch,
    register, unregister,
};
pub use pointer::{PointerInfo, pointer_info};
pub use stream::{device_synchronize, stream_create, stream_synchronize};
pub use vmm::{
    map_pieces, set_access, unmap_range, unreserve, vmm_granularity, vmm_release, vmm_reserve,
};
