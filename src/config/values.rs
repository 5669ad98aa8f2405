//! What the rows of the configuration table read: the kinds of value (PyTorch's route and
//! segments, when and how much to pin, what fork does with pinned pages), their parsers (byte
//! counts, limits, alignments, switches) and how a byte count is shown. The table itself, and
//! the configuration the rows fill, are the parent's (`src/config.rs`).

/// Smallest accepted alignment (the C `max_align_t` on x86-64 and aarch64).
pub(crate) const MIN_ALIGNMENT: usize = 16;
/// Largest accepted alignment: the registry granule, so every block start stays aligned.
pub(crate) const MAX_ALIGNMENT: usize = crate::registry::GRANULE;

/// How PyTorch gets its CUDA memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchRoute {
    /// PyTorch's own caching allocator on top, ump-alloc supplying its segments.
    Segments,
    /// ump-alloc replaces PyTorch's allocator (`CUDAPluggableAllocator`).
    Swap,
}

impl TorchRoute {
    pub fn name(self) -> &'static str {
        match self {
            TorchRoute::Segments => "segments",
            TorchRoute::Swap => "swap",
        }
    }

    pub fn parse(v: &str) -> Option<TorchRoute> {
        match v.trim().to_ascii_lowercase().as_str() {
            "segments" => Some(TorchRoute::Segments),
            "swap" => Some(TorchRoute::Swap),
            _ => None,
        }
    }
}

/// The memory of PyTorch's segments on the segments route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchSegments {
    /// `Device` unless the settings ask for the device side's memory (see the row).
    Auto,
    /// Plain device memory, one driver allocation per segment (`cuMemAlloc`).
    Device,
    /// The device side's memory (what CuPy gets).
    Side,
}

impl TorchSegments {
    pub fn name(self) -> &'static str {
        match self {
            TorchSegments::Auto => "auto",
            TorchSegments::Device => "device",
            TorchSegments::Side => "side",
        }
    }

    pub fn parse(v: &str) -> Option<TorchSegments> {
        [
            TorchSegments::Auto,
            TorchSegments::Device,
            TorchSegments::Side,
        ]
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(v.trim()))
    }
}

/// When the pinned host side pins its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pin {
    /// From the process's first use of a GPU (no CUDA context before); memory made before is
    /// plain host memory where shared memory has 4 KiB pages, else pinned then too.
    Lazy,
    /// From the first use of a GPU, memory made before included (shared pages from the start).
    LazyAll,
    /// Every chunk as it is made.
    Eager,
}

impl Pin {
    pub fn name(self) -> &'static str {
        match self {
            Pin::Lazy => "lazy",
            Pin::LazyAll => "lazy-all",
            Pin::Eager => "eager",
        }
    }

    pub fn parse(v: &str) -> Option<Pin> {
        [Pin::Lazy, Pin::LazyAll, Pin::Eager]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(v.trim()))
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

/// Parse a pinned-memory cap: a percentage of memory (`50%`, 1 ..= 100), or a byte count of at
/// least [`MIN_LIMIT`], the rule of `UMP_ALLOC_LIMIT` ([`at_least_one_arena`]): the host pool
/// pins whole chunks, so a smaller cap pins none of NumPy's smaller arrays.
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
    at_least_one_arena(
        parse_bytes(v)?,
        "pin nothing: every NumPy array would get plain host memory; for that, set \
         UMP_ALLOC_HOST_SIDE=host",
        format!(
            "pins none of NumPy's arrays under {} MiB (they share that chunk): they get plain \
             host memory",
            MIN_LIMIT >> 21
        ),
        "use a size such as 16G, or a percentage of memory such as 50%",
    )
    .map(PinnedLimit::Bytes)
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
pub const MIN_LIMIT: usize = crate::backing::ARENA;

/// A limit: "none" (no limit) or a byte count of at least [`MIN_LIMIT`]. 0 and smaller
/// counts are refused: they would fail every allocation (or nearly).
pub fn parse_limit(v: &str) -> std::result::Result<Option<usize>, String> {
    if v.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    at_least_one_arena(
        parse_bytes(v)?,
        "fail every allocation; use a positive size such as 8G, or \"none\" (or leave it unset) \
         for no limit",
        "fails nearly every allocation".into(),
        "use a size such as 8G, or \"none\" for no limit",
    )
    .map(Some)
}

/// The rule of both byte limits (`UMP_ALLOC_LIMIT`, `UMP_ALLOC_PINNED_LIMIT`): at least
/// [`MIN_LIMIT`], one arena. The error says what 0 would do (`zero`, with its fix), what a
/// smaller count does (`below`) and what to write instead (`fix`).
fn at_least_one_arena(
    n: usize,
    zero: &str,
    below: String,
    fix: &str,
) -> std::result::Result<usize, String> {
    match n {
        0 => Err(format!("a limit of 0 bytes would {zero}")),
        n if n < MIN_LIMIT => Err(format!(
            "{n} bytes is below the minimum of {}M, one arena (the chunk a pool maps for its \
             blocks under {} MiB): a smaller limit {below}; the value counts bytes (K, M, G, T: \
             powers of 1024), so {fix}",
            MIN_LIMIT >> 20,
            MIN_LIMIT >> 21
        )),
        n => Ok(n),
    }
}

/// How the Python package makes ump-alloc NumPy's handler (read by `ump_alloc`, validated
/// here): `native` or `numpy_allocator`.
pub(super) fn parse_numpy_route(v: &str) -> std::result::Result<(), String> {
    match v.trim() {
        "native" | "numpy_allocator" => Ok(()),
        _ => Err("expected native (ump-alloc's own NumPy handler, the default) or numpy_allocator (through the numpy_allocator package)".into()),
    }
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
pub(super) fn parse_switch(v: &str) -> std::result::Result<bool, String> {
    match v.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err("expected 0 or 1 (the only values a switch takes)".into()),
    }
}
