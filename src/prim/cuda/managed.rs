//! Managed-memory residency in batches (CUDA 13): discard the pages of dead blocks so that
//! nothing migrates them, and discard-and-prefetch a reused block to the device that will use
//! it. Measured on the lent H100 (driver 580, 2026-11-24): a discard batch call costs about
//! 3 µs for one range and 29 µs for 32; a GPU write to 1 GiB of discarded pages that were not
//! prefetched takes about 2 s (every page faults), while discard-and-prefetch then the write
//! takes 2.1–2.4 ms. So a discarded range is always prefetched before it is used again.

use super::libcuda::{check, driver, location, with_device};
use crate::error::Result;
use cudarc::driver::sys::{CUdeviceptr, CUstream};

/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const CU_STREAM_PER_THREAD: usize = 2;

/// The stream a batch call is queued on for `stream`. The batch calls refuse the legacy default
/// stream (CUDA_ERROR_INVALID_VALUE, seen on the lent H100 with driver 580); the per-thread
/// default stream is a blocking stream, so it is ordered with the legacy stream both ways and
/// stands in for it.
fn batch_stream(stream: usize) -> CUstream {
    match stream {
        0 | 1 => CU_STREAM_PER_THREAD as CUstream,
        s => s as CUstream,
    }
}

/// Whether the driver has the batch discard calls.
pub fn has_discard() -> bool {
    driver().is_ok_and(|d| {
        d.cuMemDiscardBatchAsync.is_some() && d.cuMemDiscardAndPrefetchBatchAsync.is_some()
    })
}

/// Discard the pages of every `(addr, len)` of `ranges` (managed memory) in `stream`'s order,
/// with `device`'s context current: their contents become undefined and no later access
/// migrates them. Returns false when the driver lacks the call.
///
/// # Safety
/// Nothing reads the ranges before writing or prefetching them, and no other operation on
/// them (access, prefetch) runs at the same time as the discard.
pub unsafe fn discard(ranges: &[(usize, usize)], stream: usize, device: i32) -> Result<bool> {
    if ranges.is_empty() {
        return Ok(true);
    }
    with_device(device.max(0), |d| {
        let Some(f) = d.cuMemDiscardBatchAsync else {
            return Ok(false);
        };
        let (mut ptrs, mut sizes): (Vec<CUdeviceptr>, Vec<usize>) =
            ranges.iter().map(|&(a, n)| (a as CUdeviceptr, n)).unzip();
        // SAFETY: both arrays hold `ranges.len()` entries; forwarded from the caller.
        check(
            d,
            unsafe {
                f(
                    ptrs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    ranges.len(),
                    0,
                    batch_stream(stream),
                )
            },
            "cuMemDiscardBatchAsync",
        )?;
        Ok(true)
    })
}

/// Discard the pages of every range of `ranges` and prefetch them to `device` (`< 0`: the
/// host) in `stream`'s order: the memory is populated there with no data moved. Returns false
/// when the driver lacks the call.
///
/// # Safety
/// As for [`discard`]: the contents are undefined afterwards and nothing else may operate on
/// the ranges while the call runs.
pub unsafe fn discard_and_prefetch(
    ranges: &[(usize, usize)],
    device: i32,
    stream: usize,
    ctx_device: i32,
) -> Result<bool> {
    if ranges.is_empty() {
        return Ok(true);
    }
    with_device(ctx_device.max(0), |d| {
        let Some(f) = d.cuMemDiscardAndPrefetchBatchAsync else {
            return Ok(false);
        };
        let (mut ptrs, mut sizes): (Vec<CUdeviceptr>, Vec<usize>) =
            ranges.iter().map(|&(a, n)| (a as CUdeviceptr, n)).unzip();
        let mut loc = location(device);
        let mut idx = 0usize;
        // SAFETY: both arrays hold `ranges.len()` entries; one location, used from range 0 on.
        check(
            d,
            unsafe {
                f(
                    ptrs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    ranges.len(),
                    &mut loc,
                    &mut idx,
                    1,
                    0,
                    batch_stream(stream),
                )
            },
            "cuMemDiscardAndPrefetchBatchAsync",
        )?;
        Ok(true)
    })
}
