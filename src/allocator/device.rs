//! The device side (CuPy's and PyTorch's contracts): blocks on a device and stream, the
//! segments PyTorch's caching allocator asks for, stream-ordered frees (`record_stream`), and
//! the device's memory figures and fraction.

use super::blocks::{block_at, block_of, deferred_twice};
use super::init::{caps, get, instance};
use super::malloc::free;
use crate::backing::Kind;
use crate::error::{Error, Result};
use crate::mode::DeviceSide;
use crate::pool;
use crate::prim::cuda;

/// Allocate `n` bytes for GPU libraries on `device`. `stream` is the stream the block will be
/// used on (0: the legacy default stream).
pub fn device_malloc(n: usize, device: i32, stream: usize) -> Result<usize> {
    let a = instance()?;
    let g = a.device_pools(device)?;
    g.release_deferred(false);
    let ptr = g.pool_for(stream)?.alloc(n)?.ptr;
    crate::scope::on_alloc(ptr, n);
    Ok(ptr)
}

/// A segment for PyTorch's caching allocator (its `cudaMalloc`, see `ffi::torch`): `n` bytes
/// of the device side on the device whose context is current on this thread. `Ok(None)` when
/// the request is not ump-alloc's to serve (no device side, no current context, a `fork()`
/// child): the caller hands it to CUDA as before. Segments are outside every scope: PyTorch
/// owns them.
pub fn segment_malloc(n: usize) -> Result<Option<usize>> {
    let a = instance()?;
    if cuda::fork_poisoned() || a.gpu().selection.sides.device == DeviceSide::None {
        return Ok(None);
    }
    let Some(device) = cuda::current_device() else {
        return Ok(None);
    };
    let g = a.segment_pools(device)?;
    g.release_deferred(false);
    let pool = g.pool_for(0)?;
    // Plain cuMemAlloc memory can be shared with CUDA IPC, which exports a driver allocation
    // whole: each segment is then an allocation of its own, as PyTorch's own are.
    let whole = pool.kind() == Kind::UMP_KIND_DEVICE
        && pool.backing().commit_page().is_none()
        && n > pool::SMALL_MAX;
    let block = if whole {
        pool.alloc_whole(n)?
    } else {
        pool.alloc(n)?
    };
    Ok(Some(block.ptr))
}

/// PyTorch's `cudaFree` of a segment: `Ok(false)` when `ptr` lies outside every range of
/// ump-alloc (the caller hands it to CUDA). A segment of ours goes back to its pool once the
/// device's queued work is done, as `cudaFree` waits for it: PyTorch reuses a freed segment's
/// memory without ordering it after the streams that last used it. Any other address inside
/// ump-alloc's ranges (a segment freed already, an address inside one, host memory) is an
/// error and never reaches CUDA, whose `cudaFree` would release driver memory ump-alloc still
/// holds.
pub fn segment_free(ptr: usize) -> Result<bool> {
    let entry = pool::entry_at(ptr);
    if entry.is_none() {
        return Ok(false);
    }
    let (_, info) = block_of(entry, ptr).map_err(|e| e.context(&format!("cudaFree({ptr:#x})")))?;
    if info.pool.device() < 0 {
        return Err(Error::invalid(format!(
            "cudaFree({ptr:#x}): the address is a block of ump-alloc's host side, not a device \
             segment"
        )));
    }
    cuda::device_synchronize(info.pool.device())?;
    pool::free_block(ptr)?;
    Ok(true)
}

/// Free a block made by [`device_malloc`] (any live block of ours is accepted), last used on
/// `stream` (None: the stream it was allocated for). A block goes back to the pool of the
/// stream it was allocated on; when `stream` is another one, that pool's stream is first
/// ordered after `stream`'s work.
pub fn device_free(ptr: usize, _device: i32, stream: Option<usize>) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    if stream.is_none() && !crate::stream::any_recorded() {
        // The block's own stream and no record_stream anywhere: nothing to order or defer.
        return free(ptr);
    }
    // One registry lookup serves the checks, the ordering and the free.
    let (entry, info) = block_of(pool::entry_at(ptr), ptr)?;
    if info.pool.is_stream_ordered()
        && let Some(g) = get().and_then(|a| a.group_of(info.pool))
    {
        if crate::stream::any_deferred() && g.is_deferred(ptr) {
            return Err(deferred_twice(ptr));
        }
        if let Some(stream) = stream {
            g.fence_free(info.pool, stream);
        }
        if g.defer_free(ptr) {
            crate::scope::on_free(ptr);
            return Ok(());
        }
    }
    // Before the free: once freed, another thread may get the same address.
    crate::scope::on_free(ptr);
    entry.free(ptr).map(|_| ())
}

/// The block at `ptr` (from [`device_malloc`]) is used on `stream` too (PyTorch's
/// `tensor.record_stream`): when it is freed, it is reused only after the work queued on
/// `stream` until then. Blocks of pools that are not stream-ordered need nothing.
pub fn device_record_stream(ptr: usize, stream: usize) -> Result<()> {
    let info = block_at(ptr)?;
    if info.pool.is_stream_ordered()
        && let Some(g) = get().and_then(|a| a.group_of(info.pool))
    {
        g.record_stream(info.pool, info.base, stream);
    }
    Ok(())
}

/// Give back what the device side caches on every device and stream (PyTorch's
/// `torch.cuda.empty_cache()`), after the deferred frees complete. Returns the bytes given back.
pub fn device_trim() -> usize {
    get().map_or(0, |a| a.device_groups().iter().map(|g| g.trim()).sum())
}

/// Memory of `device` available to ump-alloc's device side: (free, total) bytes, where free is
/// what the driver reports free plus what ump-alloc caches on the device (ready for reuse).
pub fn device_memory_info(device: i32) -> Result<(usize, usize)> {
    let a = instance()?;
    let g = a.device_pools(device)?;
    let (free, total) = cuda::mem_info(device)?;
    Ok((free.saturating_add(g.cached_bytes()).min(total), total))
}

/// Limit the device side of `device` to `fraction` of its memory (PyTorch's
/// `torch.cuda.set_per_process_memory_fraction`), besides `UMP_ALLOC_LIMIT`.
pub fn set_device_fraction(device: i32, fraction: f64) -> Result<()> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(Error::invalid(format!(
            "memory fraction {fraction} is not in (0, 1]"
        )));
    }
    let a = instance()?;
    let total = usize::try_from(device)
        .ok()
        .and_then(|i| caps().devices.get(i))
        .map(|d| d.total_memory)
        .ok_or_else(|| Error::invalid(format!("no CUDA device {device}")))?;
    let bytes = ((total as f64) * fraction) as usize;
    a.device_pools(device)?.set_runtime_limit(bytes.max(1));
    Ok(())
}
