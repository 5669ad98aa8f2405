//! Explicit transfers that never lose: for data going to the host (`asnumpy`) or to a device
//! (`asarray`), a *view* of the same memory or a stream-ordered *DMA copy* into the other
//! side's memory, whichever is faster for what the reader will do.
//!
//! [`decide`] is a pure function of the facts (size, what memory the data is in and where its
//! pages are, whether the machine is coherent, how much of it the reader will touch); [`facts`]
//! gathers them for an address. `ump_host_access` / `ump_device_access` take from the plan what
//! a view does to managed pages ([`Plan::view_move`]); the Python package makes the copy or
//! the view.
//!
//! The rule, on a PCIe machine without HMM/ATS (the lent H100/H200; rates below):
//! - **A view** where a view moves nothing (host memory read by the host, managed pages already
//!   where the reader is), where managed memory goes to the device (a stream-ordered prefetch
//!   moves it at DMA speed, 48 against 51 GB/s, with no second array), where the reader touches
//!   little of the data (only those pages move or cross PCIe), and on coherent machines.
//! - **A copy** where the reader reads most of data that lives on the other side of PCIe:
//!   GPU-written managed memory read by the host (a DMA copy into pinned memory runs at
//!   52 GB/s; the pages would migrate at 19 GB/s, or 6.8 GB/s by faults), and pinned host memory
//!   read by kernels (one DMA copy at 51 GB/s, then device-memory speed, against PCIe at every
//!   pass); and where a view is impossible (device memory for the host, pageable memory for a
//!   GPU without HMM/ATS).
//!
//! "Most" is a break-even derived from the rates, halved: a view must be expected to win by
//! 2x before it is chosen over a copy, whose cost is predictable (a DMA at link speed), while a
//! view's depends on how the reader's touches fall on pages.

use crate::allocator;
use crate::backing::Kind;
use crate::error::{Error, Result};
use crate::pointer::{Region, region};

/// Which way the data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// To the host: a NumPy array of GPU data (`asnumpy`, `ump_host_access`).
    ToHost,
    /// To a device: a GPU array of host data (`asarray`, `ump_device_access`).
    ToDevice,
}

/// The memory the data is in, as a transfer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory a GPU reaches only on a coherent (HMM/ATS) machine: `malloc`, NumPy's own
    /// allocator, ump-alloc's `host` and `system` kinds.
    Pageable,
    /// Page-locked host memory mapped for the GPU: ump-alloc's pinned (registered) memory,
    /// `cudaHostAlloc`, `cudaHostRegister`.
    Pinned,
    /// CUDA managed memory: its pages migrate between host and device.
    Managed,
    /// Device memory: the host cannot reach it.
    Device,
}

/// Where the data's pages are, as far as known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resident {
    /// Not known: taken to be the side the data comes from.
    Unknown,
    Host,
    Device,
}

/// What a view does to managed pages before (or while) the reader touches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// Nothing: pages the reader touches fault over (or the memory does not migrate).
    None,
    /// A prefetch in the stream's order (to the host: then a wait; to a device: no host wait).
    Prefetch,
    /// To the host, after the stream's work: a worker thread migrates the range while the
    /// caller reads (`migrate`).
    Background,
}

/// The two ways to hand data to the other side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The same memory, made safe by a stream synchronisation or a stream-ordered prefetch.
    View,
    /// A stream-ordered DMA copy into the other side's memory.
    Copy,
}

/// What is known about a transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Facts {
    pub direction: Direction,
    pub memory: Memory,
    pub resident: Resident,
    /// The GPU reaches pageable memory and the host reaches GPU memory coherently (HMM/ATS).
    pub coherent: bool,
    /// Bytes the transfer covers.
    pub bytes: usize,
    /// Bytes the reader will touch, as a fraction of `bytes`: 1 reads all of it once, 0.01 a
    /// hundredth, 3 three passes over it (kernels re-reading their input).
    pub touch: f64,
}

/// What [`decide`] makes of the facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The faster way.
    pub path: Path,
    /// Whether a view is possible at all (otherwise a copy is the only way).
    pub view_possible: bool,
    /// What a view does to managed pages, whenever a view is made (chosen or asked for).
    pub view_move: Move,
    /// Why, in a sentence.
    pub reason: &'static str,
}

// Rates measured on the lent H100/H200 (PCIe, no HMM/ATS; 1 GiB of float32, 2026-11-21 and
// 2026-11-22; the DMA and kernel rates are also in docs/benchmarks-archive.md, "Zero-copy against
// copies", "Kernel bandwidth on ump memory" and "The unchanged pipeline and 1 GiB transfers"), in
// bytes per second. Only their ratios enter the decision.
/// DMA copy between pinned host memory and device memory, either way (51-55 GB/s).
const DMA: f64 = 52e9;
/// A kernel reading pinned host memory over PCIe: half of the 85 GB/s an elementwise kernel
/// reads and writes there.
const KERNEL_READS_PINNED: f64 = 42e9;
/// A kernel reading device memory (or managed memory resident there).
const KERNEL_READS_DEVICE: f64 = 1680e9;
/// The host reading GPU-written managed memory, pages faulted over, the read included.
const HOST_READS_BY_FAULTS: f64 = 6.8e9;
/// The host reading host memory (NumPy's sum), paid by a copy's reader too.
const HOST_READS: f64 = 9.7e9;
/// Managed memory prefetched to a device, and a GPU faulting host-resident managed pages over.
const PREFETCH_TO_DEVICE: f64 = 48e9;
const DEVICE_FAULTS: f64 = 23e9;
/// How much faster a view must be expected to be before it is chosen over a copy.
const MARGIN: f64 = 2.0;

/// Touch up to which the host reads GPU-resident managed memory through a view (its faults
/// bring the touched pages) rather than a DMA copy of all of it into pinned memory and a read
/// of the touched part: break-even where `t / HOST_READS_BY_FAULTS = 1 / DMA + t /
/// HOST_READS`, about 0.44, halved.
pub(crate) const SPARSE_TO_HOST: f64 =
    (1.0 / DMA) / (1.0 / HOST_READS_BY_FAULTS - 1.0 / HOST_READS) / MARGIN;
/// Touch up to which kernels read pinned host memory through a view (over PCIe) rather than a
/// DMA copy to the device and reads at device speed: break-even where `t /
/// KERNEL_READS_PINNED = 1 / DMA + t / KERNEL_READS_DEVICE`, about 0.83, halved.
pub(crate) const SPARSE_TO_DEVICE: f64 =
    (1.0 / DMA) / (1.0 / KERNEL_READS_PINNED - 1.0 / KERNEL_READS_DEVICE) / MARGIN;
/// Touch up to which host-resident managed memory handed to a device is left to the GPU's
/// faults rather than prefetched: break-even where `t / DEVICE_FAULTS = 1 /
/// PREFETCH_TO_DEVICE`, about 0.48, halved.
pub(crate) const SPARSE_FAULTS_TO_DEVICE: f64 = DEVICE_FAULTS / PREFETCH_TO_DEVICE / MARGIN;

/// Managed ranges from this size migrate to the host in the background (`migrate`); smaller
/// ones (from `UMP_ALLOC_PREFETCH_MIN`) are prefetched before `ump_host_access` returns.
pub(crate) const BACKGROUND_MIN: usize = 8 << 20;

/// Whether `touch` is a valid hint: a finite fraction, 0 or more.
pub fn check_touch(touch: f64) -> Result<()> {
    if touch.is_finite() && touch >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "touch {touch} is not a fraction of the data (a finite number, 0 or more; 1: all of it)"
        )))
    }
}

/// What a view of this data does to managed pages. `prefetch_min`: `UMP_ALLOC_PREFETCH_MIN`.
fn view_move(f: &Facts, prefetch_min: usize) -> Move {
    if f.memory != Memory::Managed || f.bytes == 0 {
        return Move::None;
    }
    match f.direction {
        Direction::ToHost if f.touch <= SPARSE_TO_HOST || f.bytes < prefetch_min => Move::None,
        Direction::ToHost if f.bytes >= BACKGROUND_MIN => Move::Background,
        Direction::ToHost => Move::Prefetch,
        Direction::ToDevice if f.touch <= SPARSE_FAULTS_TO_DEVICE => Move::None,
        Direction::ToDevice => Move::Prefetch,
    }
}

/// The faster of a view and a copy for `f` (see the module's rule). `prefetch_min` only
/// shapes [`Plan::view_move`].
pub fn decide(f: &Facts, prefetch_min: usize) -> Plan {
    use Direction::{ToDevice, ToHost};
    use Memory::{Device, Managed, Pageable, Pinned};
    let view_move = view_move(f, prefetch_min);
    let view = |reason| Plan {
        path: Path::View,
        view_possible: true,
        view_move,
        reason,
    };
    let copy = |reason| Plan {
        path: Path::Copy,
        view_possible: true,
        view_move,
        reason,
    };
    let only_copy = |reason| Plan {
        path: Path::Copy,
        view_possible: false,
        view_move: Move::None,
        reason,
    };
    match (f.direction, f.memory) {
        (ToHost, Device) => return only_copy("device memory: the host cannot read it"),
        (ToDevice, Pageable) if !f.coherent => {
            return only_copy("pageable host memory: this GPU cannot read it (no HMM/ATS)");
        }
        _ => {}
    }
    if f.bytes == 0 {
        return view("no bytes to move");
    }
    if f.coherent {
        return view("a coherent machine (HMM/ATS): the reader reaches the memory where it is");
    }
    let resident = match (f.resident, f.direction) {
        (Resident::Unknown, ToHost) => Resident::Device,
        (Resident::Unknown, ToDevice) => Resident::Host,
        (r, _) => r,
    };
    match (f.direction, f.memory, resident) {
        (ToHost, Pageable | Pinned, _) => view("host memory: the host reads it where it is"),
        (ToHost, Managed, Resident::Host) => view("managed memory whose pages are on the host"),
        (ToHost, Managed, _) if f.touch <= SPARSE_TO_HOST => {
            view("the host touches little of it: only the pages it touches fault over")
        }
        (ToHost, Managed, _) => copy(
            "the host reads most of it: a DMA copy into pinned memory (52 GB/s) beats migrating \
             managed pages (19 GB/s; 6.8 GB/s by faults)",
        ),
        (ToDevice, Device, _) => view("device memory: kernels read it where it is"),
        (ToDevice, Managed, Resident::Device) => {
            view("managed memory whose pages are on the device")
        }
        (ToDevice, Managed, _) if f.touch <= SPARSE_FAULTS_TO_DEVICE => {
            view("kernels touch little of it: only the pages they touch fault over")
        }
        (ToDevice, Managed, _) => view(
            "managed memory: a prefetch in stream order moves it as fast as a DMA copy \
             (48 against 51 GB/s), with no second array",
        ),
        (ToDevice, Pinned, _) if f.touch <= SPARSE_TO_DEVICE => {
            view("kernels touch little of it: they read those bytes over PCIe")
        }
        (ToDevice, Pinned, _) => copy(
            "kernels read most of it: one DMA copy (51 GB/s), then device-memory speed, beats \
             reading pinned memory over PCIe (about 42 GB/s) at every pass",
        ),
        // Returned above: neither reaches this memory without a copy.
        (ToHost, Device, _) | (ToDevice, Pageable, _) => {
            only_copy("the reader cannot reach this memory")
        }
    }
}

/// The facts about `[ptr, ptr+size)` going `direction`. `device`: the GPU that reads it (to a
/// device), or the GPU the data comes from when the memory does not say (to the host; -1: the
/// memory's own device, else 0). `touch` as in [`Facts::touch`].
pub fn facts(
    ptr: usize,
    size: usize,
    direction: Direction,
    device: i32,
    touch: f64,
) -> Result<Facts> {
    check_touch(touch)?;
    // To a device: the GPU that reads it; to the host, -1 (the memory's own) or a GPU.
    if direction == Direction::ToDevice || device != -1 {
        allocator::check_device(device)?;
    }
    // Planning a hand-over to a GPU is a use of it: NumPy's memory is pinned first (where it
    // waits for the first use of a GPU), so that the plan is made for the memory it will be.
    if direction == Direction::ToDevice && crate::prim::cuda::available() {
        allocator::use_gpu(Some(device));
    }
    let r = if size == 0 {
        None
    } else {
        Some(region(ptr, size)?)
    };
    Ok(facts_of(r.as_ref(), size, direction, device, touch))
}

/// The facts about `size` bytes of region `r` (None: no bytes) going `direction` (see
/// [`facts`]); `touch` is valid.
pub fn facts_of(
    r: Option<&Region>,
    size: usize,
    direction: Direction,
    device: i32,
    touch: f64,
) -> Facts {
    let (memory, resident, own_device) = match r {
        None => (Memory::Pageable, Resident::Host, -1),
        Some(r) => {
            let memory = match r.kind {
                _ if r.managed => Memory::Managed,
                Kind::UMP_KIND_REGISTERED | Kind::UMP_KIND_FOREIGN_CUDA => Memory::Pinned,
                Kind::UMP_KIND_DEVICE => Memory::Device,
                _ => Memory::Pageable,
            };
            let resident = match memory {
                Memory::Pageable | Memory::Pinned => Resident::Host,
                Memory::Device => Resident::Device,
                // Ours: the device side's blocks are made for kernels, the host side's for NumPy.
                Memory::Managed if r.ours && r.device >= 0 => Resident::Device,
                Memory::Managed if r.ours => Resident::Host,
                Memory::Managed => Resident::Unknown,
            };
            (memory, resident, r.device)
        }
    };
    let gpu = match direction {
        Direction::ToDevice => device,
        Direction::ToHost if own_device >= 0 => own_device,
        Direction::ToHost => device.max(0),
    };
    let coherent = allocator::caps()
        .devices
        .iter()
        .any(|d| d.ordinal == gpu && d.pageable_memory_access);
    Facts {
        direction,
        memory,
        resident,
        coherent,
        bytes: size,
        touch,
    }
}

/// The configured `UMP_ALLOC_PREFETCH_MIN`.
pub fn prefetch_min() -> usize {
    allocator::env_config().map_or_else(
        |_| crate::config::Config::default().prefetch_min,
        |c| c.prefetch_min,
    )
}

/// [`facts`] then [`decide`].
pub fn plan(
    ptr: usize,
    size: usize,
    direction: Direction,
    device: i32,
    touch: f64,
) -> Result<(Facts, Plan)> {
    let f = facts(ptr, size, direction, device, touch)?;
    Ok((f, decide(&f, prefetch_min())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Direction::{ToDevice, ToHost};
    use Memory::{Device, Managed, Pageable, Pinned};

    const GIB: usize = 1 << 30;
    const PREFETCH_MIN: usize = 64 << 10;

    fn f(direction: Direction, memory: Memory, resident: Resident, touch: f64) -> Facts {
        Facts {
            direction,
            memory,
            resident,
            coherent: false,
            bytes: GIB,
            touch,
        }
    }

    fn path(x: Facts) -> Path {
        decide(&x, PREFETCH_MIN).path
    }

    #[test]
    fn thresholds_follow_from_the_measured_rates() {
        assert!((0.2..0.25).contains(&SPARSE_TO_HOST), "{SPARSE_TO_HOST}");
        assert!(
            (0.4..0.45).contains(&SPARSE_TO_DEVICE),
            "{SPARSE_TO_DEVICE}"
        );
        assert!(
            (0.2..0.26).contains(&SPARSE_FAULTS_TO_DEVICE),
            "{SPARSE_FAULTS_TO_DEVICE}"
        );
    }

    #[test]
    fn to_the_host_gpu_written_managed_memory_is_copied_unless_the_host_touches_little() {
        for r in [Resident::Device, Resident::Unknown] {
            let p = decide(&f(ToHost, Managed, r, 1.0), PREFETCH_MIN);
            assert_eq!(p.path, Path::Copy, "{r:?}");
            assert!(p.view_possible);
            assert_eq!(
                p.view_move,
                Move::Background,
                "a view asked for still migrates in the background"
            );
            let sparse = decide(&f(ToHost, Managed, r, 0.01), PREFETCH_MIN);
            assert_eq!(sparse.path, Path::View);
            assert_eq!(
                sparse.view_move,
                Move::None,
                "a sparse reader's faults bring its pages"
            );
        }
        assert_eq!(
            path(f(ToHost, Managed, Resident::Device, SPARSE_TO_HOST)),
            Path::View
        );
        assert_eq!(
            path(f(ToHost, Managed, Resident::Device, SPARSE_TO_HOST * 1.01)),
            Path::Copy
        );
        assert_eq!(
            path(f(ToHost, Managed, Resident::Host, 1.0)),
            Path::View,
            "nothing to move"
        );
    }

    #[test]
    fn to_the_host_host_memory_is_a_view_and_device_memory_only_a_copy() {
        for m in [Pageable, Pinned] {
            let p = decide(&f(ToHost, m, Resident::Host, 1.0), PREFETCH_MIN);
            assert_eq!((p.path, p.view_move), (Path::View, Move::None), "{m:?}");
        }
        let p = decide(&f(ToHost, Device, Resident::Device, 0.01), PREFETCH_MIN);
        assert_eq!((p.path, p.view_possible), (Path::Copy, false));
        assert!(p.reason.contains("cannot read"), "{}", p.reason);
    }

    #[test]
    fn to_a_device_pinned_memory_is_copied_unless_kernels_touch_little() {
        let p = decide(&f(ToDevice, Pinned, Resident::Host, 1.0), PREFETCH_MIN);
        assert_eq!((p.path, p.view_possible), (Path::Copy, true));
        assert_eq!(
            path(f(ToDevice, Pinned, Resident::Host, 3.0)),
            Path::Copy,
            "several passes"
        );
        assert_eq!(path(f(ToDevice, Pinned, Resident::Host, 0.01)), Path::View);
        assert_eq!(
            path(f(ToDevice, Pinned, Resident::Host, SPARSE_TO_DEVICE)),
            Path::View
        );
        assert_eq!(
            path(f(ToDevice, Pinned, Resident::Host, SPARSE_TO_DEVICE * 1.01)),
            Path::Copy
        );
    }

    #[test]
    fn to_a_device_managed_memory_is_a_view_prefetched_unless_kernels_touch_little() {
        for r in [Resident::Host, Resident::Unknown, Resident::Device] {
            let p = decide(&f(ToDevice, Managed, r, 1.0), PREFETCH_MIN);
            assert_eq!((p.path, p.view_move), (Path::View, Move::Prefetch), "{r:?}");
        }
        let p = decide(&f(ToDevice, Managed, Resident::Host, 0.05), PREFETCH_MIN);
        assert_eq!((p.path, p.view_move), (Path::View, Move::None));
        assert_eq!(path(f(ToDevice, Device, Resident::Device, 1.0)), Path::View);
    }

    #[test]
    fn pageable_memory_reaches_a_gpu_only_on_a_coherent_machine() {
        let p = decide(&f(ToDevice, Pageable, Resident::Host, 0.01), PREFETCH_MIN);
        assert_eq!((p.path, p.view_possible), (Path::Copy, false));
        let mut c = f(ToDevice, Pageable, Resident::Host, 5.0);
        c.coherent = true;
        assert_eq!(decide(&c, PREFETCH_MIN).path, Path::View);
    }

    #[test]
    fn a_coherent_machine_views_everything_the_reader_can_reach() {
        for (d, m) in [
            (ToHost, Managed),
            (ToHost, Pinned),
            (ToDevice, Pinned),
            (ToDevice, Managed),
        ] {
            let mut c = f(d, m, Resident::Unknown, 1.0);
            c.coherent = true;
            assert_eq!(decide(&c, PREFETCH_MIN).path, Path::View, "{d:?} {m:?}");
        }
        let mut c = f(ToHost, Device, Resident::Device, 1.0);
        c.coherent = true;
        assert!(
            !decide(&c, PREFETCH_MIN).view_possible,
            "device memory stays device memory"
        );
    }

    #[test]
    fn a_view_migrates_managed_pages_to_the_host_by_size() {
        let at = |bytes, touch| {
            let mut x = f(ToHost, Managed, Resident::Device, touch);
            x.bytes = bytes;
            decide(&x, PREFETCH_MIN).view_move
        };
        assert_eq!(at(PREFETCH_MIN - 1, 1.0), Move::None);
        assert_eq!(at(PREFETCH_MIN, 1.0), Move::Prefetch);
        assert_eq!(at(BACKGROUND_MIN - 1, 1.0), Move::Prefetch);
        assert_eq!(at(BACKGROUND_MIN, 1.0), Move::Background);
        assert_eq!(at(GIB, 0.0), Move::None);
        assert_eq!(
            decide(&f(ToHost, Pinned, Resident::Host, 1.0), 0).view_move,
            Move::None
        );
        let mut empty = f(ToHost, Managed, Resident::Device, 1.0);
        empty.bytes = 0;
        let p = decide(&empty, PREFETCH_MIN);
        assert_eq!((p.path, p.view_move), (Path::View, Move::None));
    }

    #[test]
    fn touch_must_be_a_finite_fraction() {
        for bad in [-0.5, f64::NAN, f64::INFINITY] {
            assert!(check_touch(bad).is_err(), "{bad}");
        }
        for ok in [0.0, 0.01, 1.0, 7.0] {
            assert!(check_touch(ok).is_ok());
        }
    }

    #[test]
    fn facts_of_host_memory() {
        let p = crate::allocator::malloc(1 << 20).unwrap();
        let (fa, pl) = plan(p + 64, 4096, ToHost, -1, 1.0).unwrap();
        assert_eq!(fa.bytes, 4096);
        assert_eq!(fa.resident, Resident::Host);
        assert!(matches!(fa.memory, Pageable | Pinned | Managed));
        assert_eq!(pl.path, Path::View, "{fa:?} {pl:?}");
        let e = plan(p, 1 << 30, ToHost, -1, 1.0).unwrap_err();
        assert!(e.msg.contains("past the end"), "{}", e.msg);
        assert!(plan(p, 16, ToHost, -1, f64::NAN).is_err());
        crate::allocator::free(p).unwrap();
        let v = [0u8; 100];
        let (fv, _) = plan(v.as_ptr() as usize, v.len(), ToDevice, 0, 1.0).unwrap();
        assert_eq!(fv.memory, Pageable);
        if !crate::prim::cuda::available() {
            assert!(!fv.coherent);
        }
    }
}
