"""The benchmarks' one entry point: list them, or run one by name with its own arguments.

    python benches/run.py list                 # each bench: name, purpose, what it needs
    python benches/run.py NAME [ARGS...]       # run benches/NAME_bench.py ARGS... (NAME.py works too)
    python benches/run.py NAME --help          # that bench's own options

A bench is a ``benches/*_bench.py`` script; its purpose is the first sentence of its
docstring. The C-level criterion bench (``benches/alloc.rs``) runs with ``cargo bench``. The
one-off probes that earlier measurements used live in ``benches/archive/``, each with the
command that builds and runs it in its header; they are not listed here. The figures these
benches produced are in docs/BENCHMARKS.md (current, by topic) and docs/benchmarks-archive.md.

A bench that needs a GPU or a library this machine lacks exits 0 with one ``skipped: ...`` line.
Run from a checkout: ``PYTHONPATH=python`` (or an installed package) and, for a cargo build,
``UMP_ALLOC_LIBRARY=target/release/libump_alloc.so``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# What each bench needs beyond NumPy and ump-alloc: "GPU" (a CUDA GPU; it skips without one)
# and the libraries it imports, in its own process or in the fresh interpreters it starts.
# python_tests/test_benches.py checks that every *_bench.py has a row here.
NEEDS = {
    "churn": "GPU; CuPy and/or PyTorch",
    "cupy_alloc": "GPU; CuPy; a C compiler for the floor and --detail columns",
    "dataloader_fork": "GPU; PyTorch, torchvision",
    "fork": "GPU (pinned host memory)",
    "fragmentation": "GPU; CuPy and/or PyTorch (per configuration)",
    "managed_residency": "GPU; CuPy",
    "no_context": "GPU",
    "numpy": "CPU only",
    "numpy_threads": "CPU only",
    "pipeline": "GPU; CuPy and/or PyTorch (--libs)",
    "realloc": "CPU only (a GPU optional)",
    "small_arrays": "CPU only",
    "torch_patch_overhead": "GPU; PyTorch (torchvision for resnet18)",
    "torch_training": "GPU; PyTorch, torchvision (resnet), transformers (gpt2)",
    "torch_transfer": "GPU; PyTorch",
    "transfer": "GPU; CuPy, PyTorch",
    "zero_copy": "GPU; CuPy",
}


def benches() -> dict[str, str]:
    """Name -> path of every bench in this folder (``benches/NAME_bench.py``)."""
    return {
        f[: -len("_bench.py")]: os.path.join(HERE, f)
        for f in sorted(os.listdir(HERE))
        if f.endswith("_bench.py")
    }


def purpose(path: str, width: int = 100) -> str:
    """The first sentence of the script's docstring, on one line, cut to ``width`` characters
    (the script is read, not imported)."""
    with open(path) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    first = " ".join(doc.split("\n\n")[0].split()).split(". ", 1)[0].rstrip(".")
    if len(first) > width:
        first = first[:width].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return first


def list_benches() -> int:
    found = benches()
    width = max(len(n) for n in found)
    for name, path in found.items():
        print(f"{name:<{width}}  {purpose(path)}")
        print(f"{'':<{width}}  needs: {NEEDS.get(name, '(not recorded in benches/run.py NEEDS)')}")
    print(f"\n{len(found)} benches; run one: python benches/run.py NAME [ARGS...] (NAME --help for its options)")
    print("C level: cargo bench (benches/alloc.rs); archived probes: benches/archive/")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python benches/run.py list | NAME [ARGS...]\n")
        print(__doc__)
        return 0
    if argv[0] == "list":
        return list_benches()
    name = argv[0]
    for suffix in (".py", "_bench"):
        name = name.removesuffix(suffix)
    found = benches()
    if name not in found:
        print(f"no bench {argv[0]!r}; the benches: {', '.join(found)}", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, found[name], *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
