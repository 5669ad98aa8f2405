//! The one configuration table: every `UMP_ALLOC_*` environment variable in one row (its
//! name, its default, its meaning, how a value is read and what a value means, as mimalloc
//! keeps one row per option), from which the defaults ([`Config::default`]), parsing
//! ([`Config::from_lookup`]), the C table (`ump_config_var`) and `info`'s reading of each value
//! ([`describe`]) all come. The environment is read once, at the first allocation (or at
//! `ump_init`), validated, and never re-read; `python -m ump_alloc info` prints the result.
//! The kinds of value the rows read and their parsers are in `config/values.rs`.

use crate::error::{Error, Result};
use crate::mode::{DeviceSide, HostSide, ModeRequest, SideRequest};
use std::ffi::CStr;

mod values;
pub use values::{
    MIN_LIMIT, Pin, PinnedFork, PinnedLimit, TorchRoute, TorchSegments, check_alignment,
    parse_alignment, parse_bytes, parse_limit, parse_pinned_limit, show_bytes,
};
use values::{parse_numpy_route, parse_switch};

/// Reads a value (trimmed, not empty) into the configuration, or says what is wrong with it
/// (the message follows `NAME="value": `).
type Read = fn(&mut Config, &str) -> std::result::Result<(), String>;
/// What a value means, for `info`: from the configuration it was read into, the value as typed
/// (trimmed; empty when unset) and the memory available to the process.
type Show = fn(&Config, &str, usize) -> String;

/// One row of the configuration table.
pub struct Var {
    pub name: &'static CStr,
    /// The default, as `info` prints it and as a value of the environment would be read.
    pub default: &'static CStr,
    pub help: &'static CStr,
    read: Read,
    show: Show,
}

impl Var {
    /// The variable's name (every row's text is ASCII: `rows_are_ascii_and_unique`).
    fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or_default()
    }

    /// The default as text.
    fn default(&self) -> &'static str {
        self.default.to_str().unwrap_or_default()
    }
}

/// Every environment variable ump-alloc reads, in the order `info` shows them and the
/// environment is validated in. Rows the Python package acts on are listed too (it reads them
/// through [`setting`]), so that `info` shows the whole picture in one place; `UMP_ALLOC_NO_CUDA`
/// is read through [`no_cuda_in_env`] whenever the CUDA layer would load the driver, and
/// `UMP_ALLOC` (read by the Python start-up hook before the library loads) is validated here
/// too, so that a value such as "true" or "2" stops the program instead of being ignored.
pub const VARS: &[Var] = &[
    Var {
        name: c"UMP_ALLOC",
        default: c"0",
        help: c"1: enable ump-alloc for NumPy, CuPy and PyTorch as the program imports them (Python); 0 or unset: off",
        read: |_, v| parse_switch(v).map(drop),
        show: switch_as_typed,
    },
    Var {
        name: c"UMP_ALLOC_MODE",
        default: c"auto",
        help: c"auto | pinned | system | managed | registered | device | host (both sides at once)",
        read: |c, v| set(&mut c.mode, ModeRequest::parse(v)),
        show: |c, _, _| c.mode.name().into(),
    },
    Var {
        name: c"UMP_ALLOC_HOST_SIDE",
        default: c"auto",
        help: c"memory for NumPy: auto | pinned | system | managed | host (overrides the mode's)",
        read: |c, v| {
            let expected = "auto, pinned, system, managed or host";
            set(&mut c.host_side, parse_side(v, HostSide::parse, expected))
        },
        show: |c, _, _| match c.host_side {
            SideRequest::Auto => "auto".into(),
            SideRequest::Forced(h) => h.name().into(),
        },
    },
    Var {
        name: c"UMP_ALLOC_DEVICE_SIDE",
        default: c"auto",
        help: c"memory for CuPy and PyTorch: auto | managed | system | pinned | device (overrides the mode's)",
        read: |c, v| {
            let expected = "auto, managed, system, pinned or device";
            set(&mut c.device_side, parse_side(v, DeviceSide::parse, expected))
        },
        show: |c, _, _| match c.device_side {
            SideRequest::Auto => "auto".into(),
            SideRequest::Forced(d) => d.name().into(),
        },
    },
    // Pinned pages cannot be swapped or reclaimed: by default half of memory stays pageable for
    // the OS, the page cache and other processes.
    Var {
        name: c"UMP_ALLOC_PINNED_LIMIT",
        default: c"50%",
        help: c"cap on pinned host memory (bytes such as 16G, at least 64M, or a percentage of RAM); beyond it NumPy gets plain host memory",
        read: |c, v| set(&mut c.pinned_limit, parse_pinned_limit(v)),
        show: |c, _, memory| match c.pinned_limit {
            PinnedLimit::Bytes(b) => show_bytes(b),
            PinnedLimit::Percent(_) => format!(
                "{} of {}",
                show_bytes(c.pinned_limit.bytes(memory)),
                show_bytes(memory)
            ),
        },
    },
    Var {
        name: c"UMP_ALLOC_PINNED_FORK",
        default: c"share",
        help: c"what fork() children get of pinned NumPy memory: share (none of it is copied; a child sees the parent's later writes to arrays made before the fork on pages it has not written) | copy (every pinned page is copied into the child at fork)",
        read: |c, v| {
            let why = "expected share (fork copies no pinned page) or copy (fork copies every \
                       pinned page: exact copy semantics)";
            set(&mut c.pinned_fork, PinnedFork::parse(v).ok_or(why))
        },
        show: |c, _, _| c.pinned_fork.name().into(),
    },
    Var {
        name: c"UMP_ALLOC_PIN",
        default: c"lazy",
        help: c"when the pinned host side pins NumPy's memory: lazy (from the process's first use of a GPU: its first device allocation, a transfer call of ump-alloc's, or a CUDA context found active; no CUDA context before; what NumPy got before stays plain host memory where the kernel gives shared memory only 4 KiB pages, else it is pinned then too) | lazy-all (the same, and what NumPy got before is pinned then too, whatever the page size) | eager (every chunk as it is made: a CUDA context at the first NumPy array)",
        read: |c, v| {
            let why = "expected lazy (pin from the first use of a GPU), lazy-all (the same, \
                       memory made before included) or eager (pin every chunk as it is made)";
            set(&mut c.pin, Pin::parse(v).ok_or(why))
        },
        show: |c, _, _| c.pin.name().into(),
    },
    // 512: CuPy's allocation unit.
    Var {
        name: c"UMP_ALLOC_ALIGNMENT",
        default: c"512",
        help: c"alignment of every block: a power of two, 16 ..= 65536",
        read: |c, v| set(&mut c.alignment, parse_alignment(v)),
        show: |c, _, _| format!("{} bytes", c.alignment),
    },
    Var {
        name: c"UMP_ALLOC_LIMIT",
        default: c"none",
        help: c"cap on bytes mapped by the host pool and by each device, all streams together (e.g. 8G; at least 64M, one arena); beyond it allocations fail cleanly",
        read: |c, v| set(&mut c.limit, parse_limit(v)),
        show: |c, _, _| c.limit.map_or("no limit".into(), show_bytes),
    },
    Var {
        name: c"UMP_ALLOC_HOST_RETAIN",
        default: c"256M",
        help: c"free bytes a host-memory pool keeps cached before returning chunks to the OS",
        read: |c, v| set(&mut c.host_retain, parse_bytes(v)),
        show: |c, _, _| show_bytes(c.host_retain),
    },
    Var {
        name: c"UMP_ALLOC_HEADROOM",
        default: c"0",
        help: c"managed mode: device memory to keep free; chunks for GPU libraries beyond (free - headroom) prefer host memory",
        read: |c, v| set(&mut c.headroom, parse_bytes(v)),
        show: |c, _, _| show_bytes(c.headroom),
    },
    Var {
        name: c"UMP_ALLOC_DEVICE_VMM",
        default: c"1",
        help: c"1: plain device memory (device side 'device') is a virtual-memory pool: address space reserved once, pages mapped as it grows and unmapped when idle (where the driver supports it); 0: chunks from cuMemAlloc",
        read: |c, v| set(&mut c.device_vmm, parse_switch(v)),
        show: |c, _, _| on_off(c.device_vmm),
    },
    Var {
        name: c"UMP_ALLOC_MANAGED_DISCARD",
        default: c"1",
        help: c"1: managed device-side blocks the host has read are discarded when freed and discarded-and-prefetched to the device when reused, so dead data never migrates (CUDA 13 drivers); 0: off",
        read: |c, v| set(&mut c.managed_discard, parse_switch(v)),
        show: |c, _, _| on_off(c.managed_discard),
    },
    Var {
        name: c"UMP_ALLOC_OVERSUBSCRIBE",
        default: c"0",
        help: c"1: managed device-side memory may exceed what the GPU has free (the driver pages it to the host); 0: an allocation that would fails cleanly as out of memory (PyTorch: torch.OutOfMemoryError after emptying its cache)",
        read: |c, v| set(&mut c.oversubscribe, parse_switch(v)),
        show: |c, _, _| on_off(c.oversubscribe),
    },
    Var {
        name: c"UMP_ALLOC_TORCH_ROUTE",
        default: c"segments",
        help: c"segments: PyTorch keeps its own caching allocator and ump-alloc supplies its segments (everything of torch.cuda works); swap: ump-alloc replaces PyTorch's allocator (its own stream-ordered caching; memory stats, snapshots, cudnn.benchmark, CUDA graph pools, MemPool and CUDA IPC then raise)",
        read: |c, v| {
            let route = TorchRoute::parse(v).ok_or("expected segments or swap");
            set(&mut c.torch_route, route)
        },
        show: |c, _, _| c.torch_route.name().into(),
    },
    Var {
        name: c"UMP_ALLOC_TORCH_SEGMENTS",
        default: c"auto",
        help: c"the memory of PyTorch's segments (segments route): device (plain device memory, one driver allocation per segment, as PyTorch's own: CUDA IPC shares it, NCCL runs at full speed) | side (the device side's memory, what CuPy gets) | auto (device, unless the device side or the mode is set, UMP_ALLOC_TORCH_UNIFIED=1 asks for memory the host reads, or the device side is system memory: then side)",
        read: |c, v| {
            let why = "expected auto, device (plain device memory) or side (the device side's \
                       memory)";
            set(&mut c.torch_segments, TorchSegments::parse(v).ok_or(why))
        },
        show: |c, _, _| c.torch_segments.name().into(),
    },
    Var {
        name: c"UMP_ALLOC_TORCH_FAST_CPU",
        default: c"1",
        help: c"1: PyTorch's .cpu()/.to(\"cpu\")/.numpy(force=True) of CUDA tensors copy into ump-alloc's host side (pinned: PCIe speed); 0: PyTorch's own CPU memory",
        read: |c, v| set(&mut c.torch_fast_cpu, parse_switch(v)),
        show: |c, _, _| on_off(c.torch_fast_cpu),
    },
    Var {
        name: c"UMP_ALLOC_TORCH_UNIFIED",
        default: c"0",
        help: c"1: PyTorch's .to(device) of a tensor on memory both sides reach returns a tensor on the same memory, no copy (RFC-0023; copy=True copies)",
        read: |c, v| set(&mut c.torch_unified, parse_switch(v)),
        show: |c, _, _| on_off(c.torch_unified),
    },
    Var {
        name: c"UMP_ALLOC_CUPY_ZERO_COPY",
        default: c"0",
        help: c"1: cupy.asnumpy/ndarray.get return a view of ump-alloc memory the host reads, cupy.asarray wraps ump-alloc NumPy memory the GPU reaches (CUPY_ENABLE_UMP's behaviour)",
        read: |c, v| set(&mut c.cupy_zero_copy, parse_switch(v)),
        show: |c, _, _| on_off(c.cupy_zero_copy),
    },
    // From this size `ump_host_access` prefetches managed memory to the host instead of letting
    // page faults migrate it (measured on the H200: docs/BENCHMARKS.md).
    Var {
        name: c"UMP_ALLOC_PREFETCH_MIN",
        default: c"64K",
        help: c"managed ranges from this size are prefetched to the host by ump_host_access",
        read: |c, v| set(&mut c.prefetch_min, parse_bytes(v)),
        show: |c, _, _| show_bytes(c.prefetch_min),
    },
    Var {
        name: c"UMP_ALLOC_NUMPY_ROUTE",
        default: c"native",
        help: c"native: NumPy gets ump-alloc's own NEP 49 handler (needs nothing but NumPy >= 1.22); numpy_allocator: through the numpy_allocator package (Python)",
        read: |_, v| parse_numpy_route(v),
        show: as_typed,
    },
    Var {
        name: c"UMP_ALLOC_LIBRARY",
        default: c"(packaged)",
        help: c"path of libump_alloc.so to load instead of the packaged one (Python)",
        read: |_, _| Ok(()),
        show: as_typed,
    },
    Var {
        name: c"UMP_ALLOC_NO_CUDA",
        default: c"0",
        help: c"1: behave as if no CUDA driver were installed (tests, CPU-only runs); 0 or unset: use CUDA",
        read: |c, v| set(&mut c.no_cuda, parse_switch(v)),
        show: switch_as_typed,
    },
];

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mode: ModeRequest,
    pub host_side: SideRequest<HostSide>,
    pub device_side: SideRequest<DeviceSide>,
    pub pinned_limit: PinnedLimit,
    pub pinned_fork: PinnedFork,
    /// When the pinned host side pins its memory.
    pub pin: Pin,
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
    /// The memory of PyTorch's segments.
    pub torch_segments: TorchSegments,
    /// Switches of the Python integrations (read by `ump_alloc`, validated here).
    pub torch_fast_cpu: bool,
    pub torch_unified: bool,
    pub cupy_zero_copy: bool,
    /// `UMP_ALLOC_NO_CUDA`: behave as if no CUDA driver were installed.
    pub no_cuda: bool,
}

impl Default for Config {
    /// Every row's default, read as the same value in the environment would be.
    fn default() -> Self {
        Config::from_lookup(|_| None).expect("every default in VARS reads (config::tests)")
    }
}

impl Config {
    /// What every row starts from: a placeholder in each field, which the field's row
    /// overwrites with its default or the environment's value (`every_field_has_a_row`).
    fn unread() -> Config {
        Config {
            mode: ModeRequest::Auto,
            host_side: SideRequest::Auto,
            device_side: SideRequest::Auto,
            pinned_limit: PinnedLimit::Bytes(0),
            pinned_fork: PinnedFork::Copy,
            pin: Pin::Eager,
            alignment: 0,
            limit: None,
            host_retain: 0,
            prefetch_min: 0,
            headroom: 0,
            device_vmm: false,
            managed_discard: false,
            oversubscribe: false,
            torch_route: TorchRoute::Swap,
            torch_segments: TorchSegments::Side,
            torch_fast_cpu: false,
            torch_unified: false,
            cupy_zero_copy: false,
            no_cuda: true,
        }
    }

    /// Read and validate the process environment.
    pub fn from_env() -> Result<Config> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Read and validate from any lookup (tests inject maps here), row by row in the table's
    /// order; the first bad value is the error. Empty values count as unset: the row's default
    /// is read instead.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        Config::read_rows(Config::unread(), get)
    }

    /// [`Config::from_lookup`], every row reading into `c`.
    fn read_rows(mut c: Config, get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        for var in VARS {
            var.read_into(&mut c, &get)?;
        }
        Ok(c)
    }
}

impl Var {
    /// Read this row's value from `get` into `c`: the value trimmed, or the row's default
    /// where it is unset or empty; a value the row refuses is the error `NAME="value": ...`.
    /// Returns the value read.
    fn read_into(&self, c: &mut Config, get: impl Fn(&str) -> Option<String>) -> Result<String> {
        let name = self.name();
        let value = get(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| self.default().to_string());
        (self.read)(c, &value).map_err(|e| Error::config(format!("{name}={value:?}: {e}")))?;
        Ok(value)
    }
}

/// Puts a value read into its field of the configuration.
fn set<T, E: Into<String>>(
    field: &mut T,
    value: std::result::Result<T, E>,
) -> std::result::Result<(), String> {
    *field = value.map_err(Into::into)?;
    Ok(())
}

/// A side: `auto`, or a kind of memory `parse` knows (`expected` lists them all).
fn parse_side<T>(
    v: &str,
    parse: fn(&str) -> Option<T>,
    expected: &str,
) -> std::result::Result<SideRequest<T>, String> {
    if v.trim().eq_ignore_ascii_case("auto") {
        return Ok(SideRequest::Auto);
    }
    parse(v)
        .map(SideRequest::Forced)
        .ok_or_else(|| format!("unknown side; expected {expected}"))
}

/// The row of variable `name`, or `UMP_ERR_INVALID` for a name with none.
fn row(name: &str) -> Result<&'static Var> {
    VARS.iter()
        .find(|v| v.name() == name)
        .ok_or_else(|| Error::invalid(format!("no configuration variable {name:?}")))
}

/// What `value` means for variable `name`, parsed exactly as [`Config::from_lookup`] parses it
/// (the other variables unset): "8 GiB (8589934592 bytes)" for `UMP_ALLOC_LIMIT=8GB`, "11.7 GiB
/// (...) of 23.4 GiB (...)" for `UMP_ALLOC_PINNED_LIMIT=50%` with `memory` bytes available. An
/// invalid value gives the error `from_lookup` gives; a row with no parsed form (a path) gives
/// the value back; a name with no row gives `UMP_ERR_INVALID`.
pub fn describe(name: &str, value: &str, memory: usize) -> Result<String> {
    let var = row(name)?;
    let c = Config::from_lookup(|k| (k == name).then(|| value.to_string()))?;
    Ok((var.show)(&c, value.trim(), memory))
}

/// The value of variable `name` in `get`'s environment, checked by its row of the table: as
/// typed (trimmed), or the row's default where it is unset or empty. A bad value gives the
/// error the configuration check gives (`NAME="value": expected ...`), a name with no row
/// `UMP_ERR_INVALID`. The Python package asks this for every variable it acts on, so that the
/// table is the one reading of the environment.
pub fn setting(name: &str, get: impl Fn(&str) -> Option<String>) -> Result<String> {
    row(name)?.read_into(&mut Config::unread(), get)
}

/// Whether `UMP_ALLOC_NO_CUDA` in the process environment says to behave as if no CUDA driver
/// were installed: read through its row now (a value the row refuses reads as no; the
/// configuration check reports it). The CUDA layer asks this before it loads the driver.
pub fn no_cuda_in_env() -> bool {
    setting_in_env("UMP_ALLOC_NO_CUDA").is_ok_and(|v| v == "1")
}

/// [`setting`] of the process environment now (what `ump_config_setting` answers).
pub fn setting_in_env(name: &str) -> Result<String> {
    setting(name, |k| std::env::var(k).ok())
}

/// A switch, for people: "1 (on)" or "0 (off)".
fn on_off(on: bool) -> String {
    if on { "1 (on)" } else { "0 (off)" }.to_string()
}

/// [`Show`] for a row kept nowhere in [`Config`]: the value as typed.
fn as_typed(_: &Config, v: &str, _: usize) -> String {
    v.to_string()
}

/// [`Show`] for a switch kept nowhere in [`Config`]: on or off, or the value as typed (empty)
/// when unset.
fn switch_as_typed(_: &Config, v: &str, _: usize) -> String {
    if v.is_empty() {
        String::new()
    } else {
        on_off(v == "1")
    }
}

#[cfg(test)]
mod tests;
