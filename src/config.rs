//! The one configuration table: every `UMP_ALLOC_*` environment variable, its default, its
//! meaning and its parser. The environment is read once, at the first allocation (or at
//! `ump_init`), validated, and never re-read; `python -m ump_alloc info` prints the result.

use crate::error::{Error, Result};
use crate::mode::{DeviceSide, HostSide, ModeRequest, SideRequest};
use std::ffi::CStr;

/// Default alignment: CuPy's allocation unit.
pub(crate) const DEFAULT_ALIGNMENT: usize = 512;
/// Smallest accepted alignment (the C `max_align_t` on x86-64 and aarch64).
pub(crate) const MIN_ALIGNMENT: usize = 16;
/// Largest accepted alignment: the registry granule, so every block start stays aligned.
pub(crate) const MAX_ALIGNMENT: usize = crate::registry::GRANULE;
/// Default size from which `ump_host_access` prefetches managed memory to the host instead of
/// letting page faults migrate it (measured on the H200: docs/BENCHMARKS.md).
pub(crate) const DEFAULT_PREFETCH_MIN: usize = 64 << 10;
/// Default bytes of free memory a host-memory pool keeps cached before it gives chunks back.
pub(crate) const DEFAULT_HOST_RETAIN: usize = 256 << 20;
/// Default cap on pinned host memory, in percent of the machine's memory (or of the cgroup's
/// limit, when lower): pinned pages cannot be swapped or reclaimed, so half of memory stays
/// pageable for the OS, the page cache and other processes.
pub(crate) const DEFAULT_PINNED_PERCENT: usize = 50;

/// One row of the configuration table.
pub struct Var {
    pub name: &'static CStr,
    pub default: &'static CStr,
    pub help: &'static CStr,
}

/// Every environment variable ump-alloc reads. Rows used only by the Python package are
/// listed too, so that `info` shows the whole picture in one place.
pub const VARS: &[Var] = &[
    Var {
        name: c"UMP_ALLOC",
        default: c"0",
        help: c"1: enable ump-alloc for NumPy, CuPy and PyTorch as the program imports them (Python); 0 or unset: off",
    },
    Var {
        name: c"UMP_ALLOC_MODE",
        default: c"auto",
        help: c"auto | pinned | system | managed | registered | device | host (both sides at once)",
    },
    Var {
        name: c"UMP_ALLOC_HOST_SIDE",
        default: c"auto",
        help: c"memory for NumPy: auto | pinned | system | managed | host (overrides the mode's)",
    },
    Var {
        name: c"UMP_ALLOC_DEVICE_SIDE",
        default: c"auto",
        help: c"memory for CuPy and PyTorch: auto | managed | system | pinned | device (overrides the mode's)",
    },
    Var {
        name: c"UMP_ALLOC_PINNED_LIMIT",
        default: c"50%",
        help: c"cap on pinned host memory (bytes such as 16G, or a percentage of RAM); beyond it NumPy gets plain host memory",
    },
    Var {
        name: c"UMP_ALLOC_PINNED_FORK",
        default: c"share",
        help: c"what fork() children get of pinned NumPy memory: share (none of it is copied; a child sees the parent's later writes to arrays made before the fork on pages it has not written) | copy (every pinned page is copied into the child at fork)",
    },
    Var {
        name: c"UMP_ALLOC_ALIGNMENT",
        default: c"512",
        help: c"alignment of every block: a power of two, 16 ..= 65536",
    },
    Var {
        name: c"UMP_ALLOC_LIMIT",
        default: c"none",
        help: c"cap on bytes mapped by the host pool and by each device, all streams together (e.g. 8G; at least 64M, one arena); beyond it allocations fail cleanly",
    },
    Var {
        name: c"UMP_ALLOC_HOST_RETAIN",
        default: c"256M",
        help: c"free bytes a host-memory pool keeps cached before returning chunks to the OS",
    },
    Var {
        name: c"UMP_ALLOC_HEADROOM",
        default: c"0",
        help: c"managed mode: device memory to keep free; chunks for GPU libraries beyond (free - headroom) prefer host memory",
    },
    Var {
        name: c"UMP_ALLOC_DEVICE_VMM",
        default: c"1",
        help: c"1: plain device memory (device side 'device') is a virtual-memory pool: address space reserved once, pages mapped as it grows and unmapped when idle (where the driver supports it); 0: chunks from cuMemAlloc",
    },
    Var {
        name: c"UMP_ALLOC_MANAGED_DISCARD",
        default: c"1",
        help: c"1: managed device-side blocks the host has read are discarded when freed and discarded-and-prefetched to the device when reused, so dead data never migrates (CUDA 13 drivers); 0: off",
    },
    Var {
        name: c"UMP_ALLOC_OVERSUBSCRIBE",
        default: c"0",
        help: c"1: managed device-side memory may exceed what the GPU has free (the driver pages it to the host); 0: an allocation that would fails cleanly as out of memory (PyTorch: torch.OutOfMemoryError after emptying its cache)",
    },
    Var {
        name: c"UMP_ALLOC_TORCH_ROUTE",
        default: c"segments",
        help: c"segments: PyTorch keeps its own caching allocator and ump-alloc supplies its segments (everything of torch.cuda works); swap: ump-alloc replaces PyTorch's allocator (its own stream-ordered caching; memory stats, snapshots, cudnn.benchmark, CUDA graph pools, MemPool and CUDA IPC then raise)",
    },
    Var {
        name: c"UMP_ALLOC_TORCH_FAST_CPU",
        default: c"1",
        help: c"1: PyTorch's .cpu()/.to(\"cpu\")/.numpy(force=True) of CUDA tensors copy into ump-alloc's host side (pinned: PCIe speed); 0: PyTorch's own CPU memory",
    },
    Var {
        name: c"UMP_ALLOC_TORCH_UNIFIED",
        default: c"0",
        help: c"1: PyTorch's .to(device) of a tensor on memory both sides reach returns a tensor on the same memory, no copy (RFC-0023; copy=True copies)",
    },
    Var {
        name: c"UMP_ALLOC_CUPY_ZERO_COPY",
        default: c"0",
        help: c"1: cupy.asnumpy/ndarray.get return a view of ump-alloc memory the host reads, cupy.asarray wraps ump-alloc NumPy memory the GPU reaches (CUPY_ENABLE_UMP's behaviour)",
    },
    Var {
        name: c"UMP_ALLOC_PREFETCH_MIN",
        default: c"64K",
        help: c"managed ranges from this size are prefetched to the host by ump_host_access",
    },
    Var {
        name: c"UMP_ALLOC_NUMPY_ROUTE",
        default: c"native",
        help: c"native: NumPy gets ump-alloc's own NEP 49 handler (needs nothing but NumPy >= 1.22); numpy_allocator: through the numpy_allocator package (Python)",
    },
    Var {
        name: c"UMP_ALLOC_LIBRARY",
        default: c"(packaged)",
        help: c"path of libump_alloc.so to load instead of the packaged one (Python)",
    },
    Var {
        name: c"UMP_ALLOC_NO_CUDA",
        default: c"0",
        help: c"1: behave as if no CUDA driver were installed (tests, CPU-only runs); 0 or unset: use CUDA",
    },
];

/// How PyTorch gets its CUDA memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchRoute {
    /// PyTorch's own caching allocator on top, ump-alloc supplying its segments.
    Segments,
    /// ump-alloc replaces PyTorch's allocator (`CUDAPluggableAllocator`).
    Swap,
}

impl TorchRoute {
    pub fn parse(v: &str) -> Option<TorchRoute> {
        match v.trim().to_ascii_lowercase().as_str() {
            "segments" => Some(TorchRoute::Segments),
            "swap" => Some(TorchRoute::Swap),
            _ => None,
        }
    }
}

/// A cap on pinned host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinnedLimit {
    Bytes(usize),
    /// Percent of the machine's memory (or of the cgroup's limit, when lower).
    Percent(usize),
}

impl PinnedLimit {
    /// The cap in bytes, given the memory available to this process.
    pub fn bytes(self, memory: usize) -> usize {
        match self {
            PinnedLimit::Bytes(b) => b,
            PinnedLimit::Percent(p) => memory / 100 * p,
        }
    }
}

/// What `fork()` does with the pinned host side's pages (`UMP_ALLOC_PINNED_FORK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinnedFork {
    /// Pages of one shared memory file: fork copies none; children map them copy-on-write.
    Share,
    /// Anonymous pages: fork copies every pinned page into the child.
    Copy,
}

impl PinnedFork {
    pub fn name(self) -> &'static str {
        match self {
            PinnedFork::Share => "share",
            PinnedFork::Copy => "copy",
        }
    }

    pub fn parse(v: &str) -> Option<PinnedFork> {
        [PinnedFork::Share, PinnedFork::Copy]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(v.trim()))
    }
}

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mode: ModeRequest,
    pub host_side: SideRequest<HostSide>,
    pub device_side: SideRequest<DeviceSide>,
    pub pinned_limit: PinnedLimit,
    pub pinned_fork: PinnedFork,
    pub alignment: usize,
    pub limit: Option<usize>,
    pub host_retain: usize,
    pub prefetch_min: usize,
    /// Device bytes to keep free (0: off).
    pub headroom: usize,
    /// The device side's plain device memory is a virtual-memory pool where supported.
    pub device_vmm: bool,
    /// Discard managed blocks that may be away from the device when they are freed.
    pub managed_discard: bool,
    /// Managed device-side chunks may exceed the device's free memory.
    pub oversubscribe: bool,
    /// How PyTorch gets its memory (read by `ump_alloc`, validated here).
    pub torch_route: TorchRoute,
    /// Switches of the Python integrations (read by `ump_alloc`, validated here).
    pub torch_fast_cpu: bool,
    pub torch_unified: bool,
    pub cupy_zero_copy: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: ModeRequest::Auto,
            host_side: SideRequest::Auto,
            device_side: SideRequest::Auto,
            pinned_limit: PinnedLimit::Percent(DEFAULT_PINNED_PERCENT),
            pinned_fork: PinnedFork::Share,
            alignment: DEFAULT_ALIGNMENT,
            limit: None,
            host_retain: DEFAULT_HOST_RETAIN,
            prefetch_min: DEFAULT_PREFETCH_MIN,
            headroom: 0,
            device_vmm: true,
            managed_discard: true,
            oversubscribe: false,
            torch_route: TorchRoute::Segments,
            torch_fast_cpu: true,
            torch_unified: false,
            cupy_zero_copy: false,
        }
    }
}

impl Config {
    /// Read and validate the process environment.
    pub fn from_env() -> Result<Config> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Read and validate from any lookup (tests inject maps here). Empty values count as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut c = Config::default();
        if let Some(v) = get("UMP_ALLOC_MODE") {
            c.mode = ModeRequest::parse(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_MODE={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_HOST_SIDE") {
            c.host_side = parse_side(&v, HostSide::parse).map_err(|e| {
                Error::config(format!(
                    "UMP_ALLOC_HOST_SIDE={v:?}: {e}; expected auto, pinned, system, managed or host"
                ))
            })?;
        }
        if let Some(v) = get("UMP_ALLOC_DEVICE_SIDE") {
            c.device_side = parse_side(&v, DeviceSide::parse)
                .map_err(|e| Error::config(format!("UMP_ALLOC_DEVICE_SIDE={v:?}: {e}; expected auto, managed, system, pinned or device")))?;
        }
        if let Some(v) = get("UMP_ALLOC_PINNED_LIMIT") {
            c.pinned_limit = parse_pinned_limit(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_PINNED_LIMIT={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_PINNED_FORK") {
            c.pinned_fork = PinnedFork::parse(&v).ok_or_else(|| {
                Error::config(format!(
                    "UMP_ALLOC_PINNED_FORK={v:?}: expected share (fork copies no pinned page) or \
                     copy (fork copies every pinned page: exact copy semantics)"
                ))
            })?;
        }
        if let Some(v) = get("UMP_ALLOC_ALIGNMENT") {
            c.alignment = parse_alignment(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_ALIGNMENT={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_LIMIT") {
            c.limit = parse_limit(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_LIMIT={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_HOST_RETAIN") {
            c.host_retain = parse_bytes(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_HOST_RETAIN={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_HEADROOM") {
            c.headroom = parse_bytes(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_HEADROOM={v:?}: {e}")))?;
        }
        // Switches read elsewhere (the Python start-up hook, the CUDA probe) are validated
        // here too, so that a value such as "true" or "2" stops the program instead of being
        // ignored.
        for name in ["UMP_ALLOC", "UMP_ALLOC_NO_CUDA"] {
            if let Some(v) = get(name) {
                parse_switch(&v).map_err(|e| Error::config(format!("{name}={v:?}: {e}")))?;
            }
        }
        if let Some(v) = get("UMP_ALLOC_NUMPY_ROUTE") {
            parse_numpy_route(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_NUMPY_ROUTE={v:?}: {e}")))?;
        }
        for (name, slot) in [
            ("UMP_ALLOC_DEVICE_VMM", &mut c.device_vmm),
            ("UMP_ALLOC_MANAGED_DISCARD", &mut c.managed_discard),
            ("UMP_ALLOC_OVERSUBSCRIBE", &mut c.oversubscribe),
            ("UMP_ALLOC_TORCH_FAST_CPU", &mut c.torch_fast_cpu),
            ("UMP_ALLOC_TORCH_UNIFIED", &mut c.torch_unified),
            ("UMP_ALLOC_CUPY_ZERO_COPY", &mut c.cupy_zero_copy),
        ] {
            if let Some(v) = get(name) {
                *slot =
                    parse_switch(&v).map_err(|e| Error::config(format!("{name}={v:?}: {e}")))?;
            }
        }
        if let Some(v) = get("UMP_ALLOC_TORCH_ROUTE") {
            c.torch_route = TorchRoute::parse(&v).ok_or_else(|| {
                Error::config(format!(
                    "UMP_ALLOC_TORCH_ROUTE={v:?}: expected segments or swap"
                ))
            })?;
        }
        if let Some(v) = get("UMP_ALLOC_PREFETCH_MIN") {
            c.prefetch_min = parse_bytes(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_PREFETCH_MIN={v:?}: {e}")))?;
        }
        Ok(c)
    }
}

fn parse_side<T>(
    v: &str,
    parse: fn(&str) -> Option<T>,
) -> std::result::Result<SideRequest<T>, String> {
    if v.trim().eq_ignore_ascii_case("auto") {
        return Ok(SideRequest::Auto);
    }
    parse(v)
        .map(SideRequest::Forced)
        .ok_or_else(|| "unknown side".to_string())
}

/// Parse a pinned-memory cap: a byte count, or a percentage of memory (`50%`, 1 ..= 100).
pub fn parse_pinned_limit(v: &str) -> std::result::Result<PinnedLimit, String> {
    if let Some(p) = v.trim().strip_suffix('%') {
        let n: usize = p.trim().parse().map_err(|_| {
            "expected a percentage such as 50% or a byte count such as 16G".to_string()
        })?;
        if !(1..=100).contains(&n) {
            return Err(format!("{n}% is outside 1% ..= 100%"));
        }
        return Ok(PinnedLimit::Percent(n));
    }
    parse_bytes(v).map(PinnedLimit::Bytes)
}

/// Validate an alignment given as text.
pub fn parse_alignment(v: &str) -> std::result::Result<usize, String> {
    let n: usize = v
        .parse()
        .map_err(|_| "not a whole number of bytes".to_string())?;
    check_alignment(n)
}

/// Validate a numeric alignment: a power of two in `MIN_ALIGNMENT..=MAX_ALIGNMENT`.
pub fn check_alignment(n: usize) -> std::result::Result<usize, String> {
    if !n.is_power_of_two() {
        return Err(format!("{n} is not a power of two"));
    }
    if n < MIN_ALIGNMENT {
        return Err(format!("{n} is below the minimum of {MIN_ALIGNMENT}"));
    }
    if n > MAX_ALIGNMENT {
        return Err(format!("{n} is above the maximum of {MAX_ALIGNMENT}"));
    }
    Ok(n)
}

/// Parse a byte count: a whole number with an optional K, M, G or T suffix (powers of 1024,
/// an optional trailing `B` or `iB` is accepted).
pub fn parse_bytes(v: &str) -> std::result::Result<usize, String> {
    let s = v.trim();
    let upper = s.to_ascii_uppercase();
    let t = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (num, shift) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| "expected a byte count such as 1048576, 512M or 8G".to_string())?;
    n.checked_mul(1usize << shift)
        .ok_or_else(|| "byte count overflows".to_string())
}

/// Smallest accepted limit: one arena, the chunk a pool maps for every block under half of it
/// (small blocks share it, one slab per size class). Below it no pool could map its usual
/// chunk, and a limit of a few KiB failed even NumPy's first 48-byte array.
pub const MIN_LIMIT: usize = crate::pool::ARENA;

/// A limit: "none" (no limit) or a byte count of at least [`MIN_LIMIT`]. 0 and smaller
/// counts are refused: they would fail every allocation (or nearly).
pub fn parse_limit(v: &str) -> std::result::Result<Option<usize>, String> {
    if v.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match parse_bytes(v)? {
        0 => Err("a limit of 0 bytes would fail every allocation; use a positive size such as 8G, or \"none\" (or leave it unset) for no limit".into()),
        n if n < MIN_LIMIT => Err(format!(
            "{n} bytes is below the minimum of {}M, one arena (the chunk a pool maps for its \
             blocks under {} MiB): a smaller limit fails nearly every allocation; the value \
             counts bytes (K, M, G, T: powers of 1024), so use a size such as 8G, or \"none\" \
             for no limit",
            MIN_LIMIT >> 20,
            MIN_LIMIT >> 21
        )),
        n => Ok(Some(n)),
    }
}

/// How the Python package makes ump-alloc NumPy's handler (read by `ump_alloc`, validated
/// here): `native` or `numpy_allocator`.
fn parse_numpy_route(v: &str) -> std::result::Result<(), String> {
    match v.trim() {
        "native" | "numpy_allocator" => Ok(()),
        _ => Err("expected native (ump-alloc's own NumPy handler, the default) or numpy_allocator (through the numpy_allocator package)".into()),
    }
}

/// What `value` means for variable `name`, parsed exactly as [`Config::from_lookup`] parses it
/// (the other variables unset): "8 GiB (8589934592 bytes)" for `UMP_ALLOC_LIMIT=8GB`, "11.7 GiB
/// (...) of 23.4 GiB (...)" for `UMP_ALLOC_PINNED_LIMIT=50%` with `memory` bytes available. An
/// invalid value gives the error `from_lookup` gives; a row with no parsed form (a path) gives
/// the value back; a name with no row gives `UMP_ERR_INVALID`.
pub fn describe(name: &str, value: &str, memory: usize) -> Result<String> {
    if !VARS.iter().any(|v| v.name.to_bytes() == name.as_bytes()) {
        return Err(Error::invalid(format!(
            "no configuration variable {name:?}"
        )));
    }
    let c = Config::from_lookup(|k| (k == name).then(|| value.to_string()))?;
    let v = value.trim();
    let switch = |on: bool| if on { "1 (on)" } else { "0 (off)" }.to_string();
    Ok(match name {
        "UMP_ALLOC_MODE" => c.mode.name().to_string(),
        "UMP_ALLOC_HOST_SIDE" => match c.host_side {
            SideRequest::Auto => "auto".into(),
            SideRequest::Forced(h) => h.name().into(),
        },
        "UMP_ALLOC_DEVICE_SIDE" => match c.device_side {
            SideRequest::Auto => "auto".into(),
            SideRequest::Forced(d) => d.name().into(),
        },
        "UMP_ALLOC_PINNED_LIMIT" => match c.pinned_limit {
            PinnedLimit::Bytes(b) => show_bytes(b),
            PinnedLimit::Percent(_) => format!(
                "{} of {}",
                show_bytes(c.pinned_limit.bytes(memory)),
                show_bytes(memory)
            ),
        },
        "UMP_ALLOC_ALIGNMENT" => format!("{} bytes", c.alignment),
        "UMP_ALLOC_LIMIT" => c.limit.map_or("no limit".into(), show_bytes),
        "UMP_ALLOC_HOST_RETAIN" => show_bytes(c.host_retain),
        "UMP_ALLOC_HEADROOM" => show_bytes(c.headroom),
        "UMP_ALLOC_PREFETCH_MIN" => show_bytes(c.prefetch_min),
        "UMP_ALLOC_DEVICE_VMM" => switch(c.device_vmm),
        "UMP_ALLOC_MANAGED_DISCARD" => switch(c.managed_discard),
        "UMP_ALLOC_TORCH_FAST_CPU" => switch(c.torch_fast_cpu),
        "UMP_ALLOC_TORCH_UNIFIED" => switch(c.torch_unified),
        "UMP_ALLOC_CUPY_ZERO_COPY" => switch(c.cupy_zero_copy),
        "UMP_ALLOC_OVERSUBSCRIBE" => switch(c.oversubscribe),
        "UMP_ALLOC_PINNED_FORK" => c.pinned_fork.name().into(),
        "UMP_ALLOC_TORCH_ROUTE" => match c.torch_route {
            TorchRoute::Segments => "segments".into(),
            TorchRoute::Swap => "swap".into(),
        },
        // Validated by from_lookup above but kept nowhere in `Config`.
        "UMP_ALLOC" | "UMP_ALLOC_NO_CUDA" if !v.is_empty() => switch(v == "1"),
        _ => v.to_string(),
    })
}

/// A byte count for people: "8 GiB (8589934592 bytes)", "1.5 GiB (1610612736 bytes)",
/// "1000 bytes".
pub fn show_bytes(n: usize) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let one = 1usize << shift;
        if n >= one {
            let whole = if n % one == 0 {
                format!("{} {unit}", n >> shift)
            } else {
                format!("{:.1} {unit}", n as f64 / one as f64)
            };
            return format!("{whole} ({n} bytes)");
        }
    }
    format!("{n} bytes")
}

/// A switch: exactly "0" or "1" (surrounding blanks ignored).
fn parse_switch(v: &str) -> std::result::Result<bool, String> {
    match v.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err("expected 0 or 1 (the only values a switch takes)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn switches_are_strict() {
        let c = cfg(&[
            ("UMP_ALLOC_TORCH_UNIFIED", "1"),
            ("UMP_ALLOC_TORCH_FAST_CPU", " 0"),
        ])
        .unwrap();
        assert!(c.torch_unified && !c.torch_fast_cpu && !c.cupy_zero_copy);
        for bad in ["true", "2", "yes", "01"] {
            let e = cfg(&[("UMP_ALLOC_CUPY_ZERO_COPY", bad)]).unwrap_err();
            assert!(
                e.msg.contains("UMP_ALLOC_CUPY_ZERO_COPY") && e.msg.contains("0 or 1"),
                "{}",
                e.msg
            );
        }
    }

    #[test]
    fn numpy_route_is_one_of_two() {
        for ok in ["native", " numpy_allocator "] {
            assert!(cfg(&[("UMP_ALLOC_NUMPY_ROUTE", ok)]).is_ok(), "{ok}");
        }
        for bad in ["numpy-allocator", "Native", "1"] {
            let e = cfg(&[("UMP_ALLOC_NUMPY_ROUTE", bad)]).unwrap_err();
            assert!(
                e.msg.contains("UMP_ALLOC_NUMPY_ROUTE") && e.msg.contains("numpy_allocator"),
                "{}",
                e.msg
            );
        }
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.alignment, 512);
    }

    #[test]
    fn alignment_valid_and_invalid() {
        assert_eq!(
            cfg(&[("UMP_ALLOC_ALIGNMENT", "4096")]).unwrap().alignment,
            4096
        );
        assert_eq!(cfg(&[("UMP_ALLOC_ALIGNMENT", "16")]).unwrap().alignment, 16);
        for bad in ["3", "8", "0", "-16", "abc", "131072", "1e3"] {
            let e = cfg(&[("UMP_ALLOC_ALIGNMENT", bad)]).unwrap_err();
            assert_eq!(e.status, crate::error::Status::UMP_ERR_CONFIG, "{bad}");
            assert!(e.msg.contains("UMP_ALLOC_ALIGNMENT"), "{}", e.msg);
        }
    }

    #[test]
    fn empty_value_is_unset() {
        assert_eq!(
            cfg(&[("UMP_ALLOC_ALIGNMENT", "  ")]).unwrap().alignment,
            512
        );
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("4k").unwrap(), 4096);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("2GB").unwrap(), 2 << 30);
        assert!(parse_bytes("x").is_err());
        assert!(parse_bytes("99999999999999999999T").is_err());
        assert_eq!(cfg(&[("UMP_ALLOC_LIMIT", "none")]).unwrap().limit, None);
        assert_eq!(
            cfg(&[("UMP_ALLOC_LIMIT", "1G")]).unwrap().limit,
            Some(1 << 30)
        );
        assert!(cfg(&[("UMP_ALLOC_LIMIT", "lots")]).is_err());
        assert!(
            cfg(&[("UMP_ALLOC_LIMIT", "0")]).is_err(),
            "0 would fail every allocation"
        );
        assert!(cfg(&[("UMP_ALLOC_LIMIT", "0G")]).is_err());
        assert_eq!(parse_limit(" None "), Ok(None));
    }

    #[test]
    fn limits_below_one_arena_are_refused_with_the_minimum() {
        // Each of these was accepted, then failed every allocation (a 48-byte array included).
        for bad in ["1", "64K", "128K", "1M", "63M", "67108863"] {
            let e = cfg(&[("UMP_ALLOC_LIMIT", bad)]).unwrap_err();
            assert_eq!(e.status, crate::error::Status::UMP_ERR_CONFIG, "{bad}");
            assert!(
                e.msg.starts_with(&format!("UMP_ALLOC_LIMIT={bad:?}: "))
                    && e.msg.contains("below the minimum of 64M"),
                "{}",
                e.msg
            );
        }
        assert_eq!(MIN_LIMIT, crate::pool::ARENA);
        assert_eq!(
            cfg(&[("UMP_ALLOC_LIMIT", "64M")]).unwrap().limit,
            Some(64 << 20)
        );
        assert_eq!(parse_limit("67108864"), Ok(Some(MIN_LIMIT)));
    }

    #[test]
    fn describe_shows_the_parsed_value() {
        let d = |n: &str, v: &str| describe(n, v, 16 << 30);
        assert_eq!(
            d("UMP_ALLOC_LIMIT", "8GB").unwrap(),
            "8 GiB (8589934592 bytes)"
        );
        assert_eq!(d("UMP_ALLOC_LIMIT", " none ").unwrap(), "no limit");
        assert_eq!(
            d("UMP_ALLOC_HOST_RETAIN", "1536M").unwrap(),
            "1.5 GiB (1610612736 bytes)"
        );
        assert_eq!(
            d("UMP_ALLOC_PINNED_LIMIT", "25%").unwrap(),
            // The cap as the pool computes it (memory / 100 * percent).
            "4.0 GiB (4294967275 bytes) of 16 GiB (17179869184 bytes)"
        );
        assert_eq!(d("UMP_ALLOC_ALIGNMENT", "4096").unwrap(), "4096 bytes");
        assert_eq!(d("UMP_ALLOC_MODE", "Managed").unwrap(), "managed");
        assert_eq!(d("UMP_ALLOC_DEVICE_SIDE", "DEVICE").unwrap(), "device");
        assert_eq!(d("UMP_ALLOC_TORCH_UNIFIED", "1").unwrap(), "1 (on)");
        assert_eq!(d("UMP_ALLOC", "0").unwrap(), "0 (off)");
        assert_eq!(d("UMP_ALLOC_PREFETCH_MIN", "1000").unwrap(), "1000 bytes");
        assert_eq!(
            d("UMP_ALLOC_LIBRARY", "/x/libump_alloc.so").unwrap(),
            "/x/libump_alloc.so"
        );
        // Invalid values give the error the configuration gives; unknown names are refused.
        for (n, v) in [
            ("UMP_ALLOC_LIMIT", "64K"),
            ("UMP_ALLOC_ALIGNMENT", "3"),
            ("UMP_ALLOC", "true"),
        ] {
            let e = d(n, v).unwrap_err();
            assert_eq!(e.msg, cfg(&[(n, v)]).unwrap_err().msg);
        }
        let e = d("UMP_ALLOC_MODEE", "host").unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_INVALID);
        // Every row of the table is described (by value or as typed).
        for v in VARS {
            let name = v.name.to_str().unwrap();
            d(name, v.default.to_str().unwrap())
                .unwrap_or_else(|e| panic!("the default of {name}: {}", e.msg));
        }
    }

    #[test]
    fn mode_parse_errors_name_the_variable() {
        let e = cfg(&[("UMP_ALLOC_MODE", "turbo")]).unwrap_err();
        assert!(
            e.msg.contains("UMP_ALLOC_MODE") && e.msg.contains("managed"),
            "{}",
            e.msg
        );
        assert_eq!(
            cfg(&[("UMP_ALLOC_MODE", "Managed")]).unwrap().mode,
            ModeRequest::Forced(crate::mode::Mode::Managed)
        );
    }

    #[test]
    fn sides_and_pinned_limit() {
        let c = cfg(&[
            ("UMP_ALLOC_HOST_SIDE", "Pinned"),
            ("UMP_ALLOC_DEVICE_SIDE", "device"),
            ("UMP_ALLOC_PINNED_LIMIT", "25%"),
        ])
        .unwrap();
        assert_eq!(c.host_side, SideRequest::Forced(HostSide::Pinned));
        assert_eq!(c.device_side, SideRequest::Forced(DeviceSide::Device));
        assert_eq!(c.pinned_limit, PinnedLimit::Percent(25));
        assert_eq!(c.pinned_fork, PinnedFork::Share);
        assert_eq!(
            cfg(&[("UMP_ALLOC_PINNED_FORK", " Copy ")])
                .unwrap()
                .pinned_fork,
            PinnedFork::Copy
        );
        assert_eq!(c.pinned_limit.bytes(1000), 250);
        assert_eq!(
            cfg(&[("UMP_ALLOC_PINNED_LIMIT", "16G")])
                .unwrap()
                .pinned_limit,
            PinnedLimit::Bytes(16 << 30)
        );
        for (k, v) in [
            ("UMP_ALLOC_HOST_SIDE", "device"),
            ("UMP_ALLOC_DEVICE_SIDE", "none"),
            ("UMP_ALLOC_PINNED_LIMIT", "0%"),
            ("UMP_ALLOC_PINNED_LIMIT", "150%"),
            ("UMP_ALLOC_PINNED_LIMIT", "lots"),
            ("UMP_ALLOC_PINNED_FORK", "shared"),
            ("UMP_ALLOC_PINNED_FORK", "1"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert!(e.msg.contains(k), "{}", e.msg);
        }
    }

    #[test]
    fn torch_route_and_oversubscription() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.torch_route, TorchRoute::Segments);
        assert!(!c.oversubscribe, "oversubscription is opt-in");
        let c = cfg(&[
            ("UMP_ALLOC_TORCH_ROUTE", " Swap "),
            ("UMP_ALLOC_OVERSUBSCRIBE", "1"),
        ])
        .unwrap();
        assert_eq!(c.torch_route, TorchRoute::Swap);
        assert!(c.oversubscribe);
        for (k, v) in [
            ("UMP_ALLOC_TORCH_ROUTE", "mempool"),
            ("UMP_ALLOC_OVERSUBSCRIBE", "yes"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert!(e.msg.contains(k), "{}", e.msg);
        }
    }

    #[test]
    fn table_names_every_variable_read() {
        for name in [
            "UMP_ALLOC_HOST_SIDE",
            "UMP_ALLOC_DEVICE_SIDE",
            "UMP_ALLOC_PINNED_LIMIT",
            "UMP_ALLOC_PINNED_FORK",
            "UMP_ALLOC_PREFETCH_MIN",
            "UMP_ALLOC_MODE",
            "UMP_ALLOC_ALIGNMENT",
            "UMP_ALLOC_LIMIT",
            "UMP_ALLOC_HOST_RETAIN",
            "UMP_ALLOC_OVERSUBSCRIBE",
            "UMP_ALLOC_TORCH_ROUTE",
        ] {
            assert!(VARS.iter().any(|v| v.name.to_str() == Ok(name)), "{name}");
        }
    }
}
