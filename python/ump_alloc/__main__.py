"""``python -m ump_alloc demo`` runs the demo; ``python -m ump_alloc info`` prints the
configuration table, the machine's capabilities and the mode; ``stats`` prints the memory
summary; ``bench`` measures ump-alloc against the default allocators (see ``ump_alloc.bench``)."""

from __future__ import annotations

import argparse
import sys

import ump_alloc
from ump_alloc import _lib


def _dist_version(module: str) -> str | None:
    """The installed version of ``module``'s distribution, without importing it; None when
    the module is not installed."""
    import importlib.metadata as md
    import importlib.util

    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    names = {"numba": ["numba-cuda", "numba"], "dask": ["dask"], "torch": ["torch"], "numpy": ["numpy"]}.get(module, [])
    if module == "cupy":
        names = sorted(d.metadata["Name"] for d in md.distributions() if (d.metadata["Name"] or "").lower().startswith("cupy"))
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return "installed"


def _what_it_means(problems_stop: bool) -> None:
    """The configuration's meaning for this user: which libraries are here and what switches
    them over."""
    import os

    on = os.environ.get("UMP_ALLOC", "").strip() not in ("", "0")
    caps = ump_alloc.capabilities()
    gpu = caps["cuda_available"] and caps["mode"] != "host"
    print()
    print("What this means here:")
    if problems_stop:
        print("  ump-alloc will not start: fix the configuration error above; a program run with")
        print("  UMP_ALLOC=1 stops at its first import of NumPy, CuPy or PyTorch with that message.")
    how = "UMP_ALLOC=1 is set: switched over as the program imports it" if on else "off until ump_alloc.enable() or UMP_ALLOC=1"
    for module, label in (("numpy", "NumPy"), ("cupy", "CuPy"), ("torch", "PyTorch"), ("numba", "Numba"), ("dask", "Dask")):
        v = _dist_version(module)
        if v is None:
            print(f"  {label:<8} not installed")
            continue
        if module in ("cupy", "torch") and not gpu:
            what = "stays on its own allocator: no GPU mode here"
        elif module == "numba":
            mm = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "")
            what = ("switched over (NUMBA_CUDA_MEMORY_MANAGER=ump_alloc.numba)" if mm == "ump_alloc.numba"
                    else "off until NUMBA_CUDA_MEMORY_MANAGER=ump_alloc.numba" + ("" if gpu else " (needs a GPU)"))
        elif module == "dask":
            what = "per cluster: ump_alloc.dask.register(client) sets up every worker"
        else:
            what = how
        print(f"  {label:<8} {v:<12} {what}")


def _pin_rule() -> str:
    """When NumPy's memory is pinned (UMP_ALLOC_PIN), for info."""
    pin = next((r["parsed"] for r in ump_alloc.config_table() if r["name"] == "UMP_ALLOC_PIN"), None)
    if pin == "eager":
        return "as it is made (UMP_ALLOC_PIN=eager): a CUDA context at the first NumPy array"
    return (
        f"at the process's first use of a GPU (UMP_ALLOC_PIN={pin or 'lazy'}): not pinned yet (no GPU used "
        "in this process); a NumPy-only process makes no CUDA context, and its copies to a GPU "
        "run at pageable speed until then"
    )


def _torch_route() -> None:
    """The PyTorch route configured, and what it means (PyTorch is not imported)."""
    from ump_alloc import _torch

    try:
        route = _torch.route_setting()
    except _lib.UmpError as e:
        print(f"PyTorch route: invalid ({e})")
        return
    if route == "segments":
        print("PyTorch route: segments (UMP_ALLOC_TORCH_ROUTE): PyTorch keeps its own caching allocator and")
        print("  ump-alloc supplies its segments; every torch.cuda feature works as without ump-alloc;")
        print("  a cudaMalloc interposer loaded before PyTorch (LD_PRELOAD) is chained to, not bypassed")
        print("  (ump_alloc.memory_summary() names it in the program)")
    else:
        print("PyTorch route: swap (UMP_ALLOC_TORCH_ROUTE=swap): ump-alloc replaces PyTorch's allocator")
        print("  (before the first CUDA tensor only); on this route these raise:")
        for item in _torch.SWAP_UNSUPPORTED:
            print(f"    - {item}")

def _shown(row: dict) -> str:
    """A configuration row's value as typed, with what it means when that differs
    (``8GB = 8 GiB (8589934592 bytes)``), or its default."""
    value = row["value"]
    if value is None or not value.strip():
        return f"(default {row['default']})"
    parsed = row["parsed"]
    if parsed is None:
        return f"{value}  (invalid: see the configuration error)"
    if parsed.strip().lower() == value.strip().lower():
        return value
    return f"{value} = {parsed}"


#: The kernel's setting for transparent huge pages of shared memory (memfd and tmpfs).
SHMEM_THP = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def _kernel_choice(path: str) -> str | None:
    """The bracketed choice of a kernel setting file such as ``always [madvise] never`` (the
    whole text where there are no brackets); None where the file cannot be read."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.find("[") + 1 : text.find("]")] if "[" in text and "]" in text else text.strip()


def shared_pages(path: str = SHMEM_THP) -> str:
    """What size the pinned host side's shared pages get, from the kernel's setting for huge
    pages of shared memory (``path``), and what it costs fork children: one line for ``info``.

    ump-alloc asks for huge pages (``MADV_HUGEPAGE``) on every chunk of 4 MiB or more; the
    kernel grants them to shared memory only with ``always``, ``within_size``, ``advise`` or
    ``force``. With 4 KiB pages a fork child's first read of the parent's arrays faults the
    pages in (NumPy's own memory is inherited mapped): measured on the lent H100 with
    ``benches/fork_bench.py --parts fork --gib 2``, docs/benchmarks-archive.md, "fork() and the pinned host side"."""
    chosen = _kernel_choice(path)
    if chosen is None:
        return "4 KiB pages (this kernel has no huge pages for shared memory)"
    if chosen in ("always", "within_size", "advise", "force"):
        return f"2 MiB huge pages for chunks of 4 MiB or more ({path}: {chosen})"
    return (
        f"4 KiB pages ({path}: {chosen}): a fork child's first read of the parent's arrays faults "
        "their pages in, about 20-70 ms per GiB more than with NumPy's own memory on the lent H100; "
        f"'echo advise > {path}' (root) gives the chunks huge pages and makes that read as fast"
    )


def hugetlb_pages(meminfo: str = "/proc/meminfo") -> str | None:
    """Why the hugetlb pages this machine reserved (``HugePages_Total`` of ``meminfo``) are not
    used for the shared pages: one line for ``info``, None where none are reserved.

    A fork child remaps the parent's memory file ``MAP_PRIVATE``; on a hugetlb file that
    reserves a free huge page for every page of the file at the remap (``ENOMEM`` in the child
    where too few are free), or, with ``MAP_NORESERVE``, kills the child with ``SIGBUS`` at its
    first write to a page no free huge page is left for; and the pool's 4 KiB hole punches give
    nothing back. Measured on the CPU box with ``benches/archive/hugetlb_fork_probe.c``
    (docs/benchmarks-archive.md, "No CUDA context, the pipelines on the H200, and hugetlb pages")."""
    try:
        with open(meminfo) as f:
            total = next((int(l.split()[1]) for l in f if l.startswith("HugePages_Total:")), 0)
    except (OSError, ValueError, IndexError):
        return None
    if total <= 0:
        return None
    return (f"{total} reserved hugetlb pages, not used: each fork child would need as many free "
            "huge pages as the parent's arrays take (its private remap fails, or it is killed "
            "by SIGBUS at a write)")


#: The kernel's setting for transparent huge pages of private memory.
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def private_pages(path: str = THP) -> str:
    """The page sizes plain host memory gets, from the kernel's THP setting (``path``): one
    line for ``info``. Blocks of 4 MiB or more are advised huge pages, as NumPy's default
    allocator advises them; arenas of small blocks are advised small pages, as glibc's heap
    gets (under ``always`` 2 MiB faults made 2,000,000 small arrays 1.10x slower than NumPy's
    default on the CPU box); free pages go back to the OS when the pool grows (issue 35,
    docs/benchmarks-archive.md, "Never lose to NumPy's default allocator on the host")."""
    chosen = _kernel_choice(path)
    if chosen is None:
        return "4 KiB pages (this kernel has no transparent huge pages)"
    if chosen == "never":
        return f"4 KiB pages ({path}: never)"
    return (f"huge pages for blocks of 4 MiB or more, as NumPy's default allocator asks; 4 KiB pages for "
            f"the arenas of small blocks, as glibc's heap; free pages go back to the OS when the pool "
            f"grows ({path}: {chosen})")


def _info_without_library(error: _lib.UmpError) -> int:
    """``info`` when the library cannot be loaded: the error with its fix, and the ``UMP_ALLOC*``
    variables set in the environment as typed. The table of every variable (defaults, meanings,
    what each value means) is the library's own (``ump_config_var``), so it cannot be shown."""
    import os

    print(f"ump-alloc {ump_alloc.__version__}  library: cannot be loaded")
    print(f"configuration error: {error}")
    print()
    print("Configuration (UMP_ALLOC* environment variables set here, as typed; the table of every")
    print("variable, with its default and what each value means, is in the library, which cannot be loaded):")
    names = sorted(n for n in os.environ if n.startswith("UMP_ALLOC"))
    width = max((len(n) for n in names), default=0)
    for n in names:
        print(f"  {n:<{width}} = {os.environ[n]}")
    if not names:
        print("  (none set)")
    print()
    print("Mode: none: ump-alloc cannot start without its library (the configuration error above)")
    print()
    print("What this means here:")
    print("  ump-alloc will not start: fix the configuration error above; a program run with")
    print("  UMP_ALLOC=1 stops at its first import of NumPy, CuPy or PyTorch with that message.")
    print(f"ump_alloc: {error}", file=sys.stderr)
    return 2


def info() -> int:
    try:
        _lib.lib()
    except _lib.UmpError as e:
        return _info_without_library(e)
    problems = ump_alloc.config_errors()
    fatal = any(p.startswith("configuration error:") for p in problems)
    print(f"ump-alloc {ump_alloc.version()}  library: {ump_alloc.library_path()}")
    for p in problems:
        print(p if p.startswith("configuration error:") else f"warning: {p}")
    print()
    print("Configuration (UMP_ALLOC_* environment variables, read once at the first allocation):")
    rows = ump_alloc.config_table()
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        print(f"  {row['name']:<{width}} = {_shown(row):<16} {row['help']}")
    print()
    caps = ump_alloc.capabilities()
    if caps["cuda_available"]:
        v = caps["driver_version"]
        print(f"CUDA driver {v // 1000}.{v % 1000 // 10}, {caps['device_count']} device(s), "
              f"prefetch/advise v2: {'yes' if caps['has_prefetch_v2'] else 'no'}")
        for d in caps["devices"]:
            print(f"  device {d['ordinal']}: {d['name']}, {d['total_memory'] / 2**30:.1f} GiB")
            for key in ("pageable_memory_access", "uses_host_page_tables", "concurrent_managed_access",
                        "host_register_supported", "host_pointer_for_registered_mem"):
                print(f"    {key:<33} {'yes' if d[key] else 'no'}")
    else:
        print("CUDA: not available")
    state = "fixed" if caps["mode_fixed"] else "would be chosen"
    print()
    align = f"{caps['alignment']} bytes" if caps["alignment"] else "invalid (see the configuration error)"
    if caps["mode"] == "unset" and not caps["mode_fixed"]:
        print("Mode: none: this configuration cannot start ump-alloc (the configuration error above)")
    else:
        print(f"Mode: {caps['mode']} ({state}); alignment {align}")
    if caps["host_reason"] or caps["device_reason"]:
        print(f"  host side (NumPy):            {caps['host_side']}")
        print(f"    why: {caps['host_reason']}")
        if caps["fork_rule"]:
            print(f"    fork(): {caps['fork_rule']}")
        if caps["fork_shared"]:
            print(f"    shared pages: {shared_pages()}")
            hugetlb = hugetlb_pages()
            if hugetlb:
                print(f"    hugetlb: {hugetlb}")
        elif caps["host_side"] == "host":
            print(f"    pages: {private_pages()}")
        if caps["host_side"] == "pinned":
            print(f"    pinned: {_pin_rule()}")
        print(f"  device side (CuPy, PyTorch):  {caps['device_side']}")
        print(f"    why: {caps['device_reason']}")
    else:
        print(f"  why: {caps['mode_reason']}")
    if _dist_version("numpy") is not None:
        from ump_alloc import _numpy

        print("\n".join(_numpy.describe()))
    if _dist_version("cupy") is not None and not fatal:
        try:
            import cupy  # noqa: F401

            from ump_alloc import _cupy

            print(f"CuPy allocator: {_cupy.describe()}")
        except Exception as e:  # noqa: BLE001 - info must not fail
            print(f"CuPy allocator: unknown ({e})")
    if _dist_version("torch") is not None and not fatal:
        _torch_route()
    _what_it_means(fatal)
    if fatal:
        for p in problems:
            if p.startswith("configuration error:"):
                print(f"\n{p}", file=sys.stderr)
        return 2
    return 0


def demo() -> int:
    import numpy as np

    ump_alloc.enable()
    caps = ump_alloc.capabilities()
    print(f"ump-alloc {ump_alloc.version()}: mode '{ump_alloc.mode()}', alignment {ump_alloc.alignment()} bytes")
    print(f"  why: {caps['mode_reason']}")
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1_000_000).astype(np.float32)
    b = np.sqrt(np.abs(a)) + 1
    print(f"NumPy on ump-alloc: a = {a.nbytes} bytes at {a.ctypes.data:#x} "
          f"(address % {ump_alloc.alignment()} = {a.ctypes.data % ump_alloc.alignment()}), handles(a) = {ump_alloc.handles(a)}")
    print(f"  identify(b): {ump_alloc.identify(b)}")
    print(f"  sum(b) = {b.sum(dtype=np.float64):.3f}")
    if not caps["cuda_available"] or ump_alloc.mode() == "host":
        print("No GPU found: NumPy runs on ump-alloc's aligned host memory; GPU sharing needs a CUDA device.")
        return 0
    try:
        import cupy as cp
    except ImportError:
        print("A GPU is present but CuPy is not installed: nothing to share with.")
        return 0
    x = np.arange(8, dtype=np.float32)
    before = x.copy()
    # A CuPy view of the NumPy array's own memory: no copy. Handing it to the GPU is the
    # process's first use of one: NumPy's memory is pinned then (UMP_ALLOC_PIN=lazy).
    try:
        gx = ump_alloc.asarray(x, like="cupy", copy=False)
    except ValueError as e:
        print(f"mode '{ump_alloc.mode()}' memory is not reachable by the GPU here; no zero-copy demo ({e})")
        return 0
    print(f"  identify(x) once the GPU is used: {ump_alloc.identify(x)}")
    cp.ElementwiseKernel("", "float32 y", "y = y * 10 + 1", "ump_demo")(gx)
    cp.cuda.get_current_stream().synchronize()
    print(f"CuPy kernel wrote the NumPy array in place (no copy, same address {gx.data.ptr:#x}):")
    print(f"  before: {before}")
    print(f"  after:  {x}")
    ok = np.array_equal(x, before * 10 + 1)
    print("  check: " + ("ok" if ok else "MISMATCH"))
    return 0 if ok else 1


def stats() -> int:
    ump_alloc.enable(cupy=False, torch=False)
    print(ump_alloc.memory_summary())
    return 0


#: Each command's help (``python -m ump_alloc COMMAND --help``); ``bench`` has its own parser.
COMMANDS = {
    "info": (
        "print the configuration, the machine and the mode (the default command)",
        "Print every UMP_ALLOC_* variable with its value and what it means, the machine's CUDA "
        "devices and what they can do, the mode and the memory each side (NumPy; CuPy and "
        "PyTorch) would get and why, and what that means for NumPy, CuPy, PyTorch, Numba and "
        "Dask here. It does not start ump-alloc: the configuration is judged as a program run "
        "with UMP_ALLOC=1 would find it. Exit status 0 when ump-alloc would start "
        "with this configuration; 2 when it would not, with the configuration error (or why the "
        "library cannot be loaded) on standard error as well.",
    ),
    "demo": (
        "run the demo",
        "NumPy on ump-alloc in this process: an array's address, alignment and identity (what "
        "ump-alloc knows of it). On a machine with a CUDA GPU and CuPy, a CuPy kernel then "
        "changes a NumPy array in place, at the same address, with no copy. Exit status 0 when "
        "every check passes.",
    ),
    "stats": (
        "print the memory summary of this process",
        "Switch NumPy over to ump-alloc in a fresh process (CuPy and PyTorch are left alone) and "
        "print ump_alloc.memory_summary(): one row per side and per GPU stream pool, with bytes "
        "in use, cached, mapped and reserved, the peak, the largest free block, fragmentation and "
        "cache hits and misses. A program prints its own with print(ump_alloc.memory_summary()); "
        "ump_alloc.stats() gives the same counters as a dict.",
    ),
    "bench": (
        "measure ump-alloc against the default allocators on this machine",
        "python -m ump_alloc bench --help lists its options.",
    ),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from ump_alloc import bench

        return bench.main(argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m ump_alloc",
        description="ump-alloc: one allocator for NumPy, CuPy and PyTorch.",
        epilog="python -m ump_alloc COMMAND --help says what a command does.",
    )
    p.add_argument("--version", action="version", version=f"ump-alloc {ump_alloc.__version__}")
    p.add_argument("--include", action="store_true", help="print the directory of ump_alloc.h and exit")
    p.add_argument("--libdir", action="store_true", help="print the directory of libump_alloc.so (and lib/pkgconfig) and exit")
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, (summary, description) in COMMANDS.items():
        sub.add_parser(name, help=summary, description=description, prog=f"python -m ump_alloc {name}")
    args = p.parse_args(argv)
    if args.include or args.libdir:
        try:
            if args.include:
                print(ump_alloc.get_include())
            if args.libdir:
                print(ump_alloc.get_libdir())
        except _lib.UmpError as e:
            print(f"ump_alloc: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        return {"demo": demo, "info": info, "stats": stats}[args.command or "info"]()
    except _lib.UmpError as e:
        print(f"ump_alloc: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
