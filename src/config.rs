//! The one configuration table: every `UMP_ALLOC_*` environment variable, its default, its
//! meaning and its parser. The environment is read once, at the first allocation (or at
//! `ump_init`), validated, and never re-read; `python -m ump_alloc info` prints the result.

use crate::error::{Error, Result};
use crate::mode::ModeRequest;
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
        help: c"1: enable ump-alloc for NumPy, CuPy and PyTorch at interpreter start (Python)",
    },
    Var {
        name: c"UMP_ALLOC_MODE",
        default: c"auto",
        help: c"auto | system | managed | registered | device | host",
    },
    Var {
        name: c"UMP_ALLOC_ALIGNMENT",
        default: c"512",
        help: c"alignment of every block: a power of two, 16 ..= 65536",
    },
    Var {
        name: c"UMP_ALLOC_LIMIT",
        default: c"none",
        help: c"cap on bytes mapped by the host pool and by each device, all streams together (e.g. 8G); beyond it allocations fail cleanly",
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
        name: c"UMP_ALLOC_PREFETCH_MIN",
        default: c"64K",
        help: c"managed ranges from this size are prefetched to the host by ump_host_access",
    },
    Var {
        name: c"UMP_ALLOC_LIBRARY",
        default: c"(packaged)",
        help: c"path of libump_alloc.so to load instead of the packaged one (Python)",
    },
    Var {
        name: c"UMP_ALLOC_NO_CUDA",
        default: c"0",
        help: c"1: behave as if no CUDA driver were installed (tests, CPU-only runs)",
    },
];

/// The validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mode: ModeRequest,
    pub alignment: usize,
    pub limit: Option<usize>,
    pub host_retain: usize,
    pub prefetch_min: usize,
    /// Device bytes to keep free (0: off).
    pub headroom: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: ModeRequest::Auto,
            alignment: DEFAULT_ALIGNMENT,
            limit: None,
            host_retain: DEFAULT_HOST_RETAIN,
            prefetch_min: DEFAULT_PREFETCH_MIN,
            headroom: 0,
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
        if let Some(v) = get("UMP_ALLOC_ALIGNMENT") {
            c.alignment = parse_alignment(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_ALIGNMENT={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_LIMIT") {
            c.limit = if v.eq_ignore_ascii_case("none") {
                None
            } else {
                Some(
                    parse_bytes(&v)
                        .map_err(|e| Error::config(format!("UMP_ALLOC_LIMIT={v:?}: {e}")))?,
                )
            };
        }
        if let Some(v) = get("UMP_ALLOC_HOST_RETAIN") {
            c.host_retain = parse_bytes(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_HOST_RETAIN={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_HEADROOM") {
            c.headroom = parse_bytes(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_HEADROOM={v:?}: {e}")))?;
        }
        if let Some(v) = get("UMP_ALLOC_PREFETCH_MIN") {
            c.prefetch_min = parse_bytes(&v)
                .map_err(|e| Error::config(format!("UMP_ALLOC_PREFETCH_MIN={v:?}: {e}")))?;
        }
        Ok(c)
    }
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
    fn table_names_every_variable_read() {
        for name in [
            "UMP_ALLOC_PREFETCH_MIN",
            "UMP_ALLOC_MODE",
            "UMP_ALLOC_ALIGNMENT",
            "UMP_ALLOC_LIMIT",
            "UMP_ALLOC_HOST_RETAIN",
        ] {
            assert!(VARS.iter().any(|v| v.name.to_str() == Ok(name)), "{name}");
        }
    }
}
