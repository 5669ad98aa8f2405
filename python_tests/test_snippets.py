"""Every shell and Python snippet in README.md and docs/guides/*.md runs as written.

Which blocks: every fenced block tagged ``python``/``py`` or ``sh``/``bash``/``shell``. A ``c``
block whose first line names a file (``/* quickstart.c */``) is written to that file for the
shell blocks after it; untagged blocks (program output, diagrams) are not code.

Markers: an HTML comment on the line before the opening fence (invisible on GitHub). Use them
sparingly: a snippet that cannot run as written is fixed, not skipped.

    <!-- snippet: gpu -->                 needs a CUDA GPU (pytest mark ``gpu``; skipped without one)
    <!-- snippet: gpu, needs numba -->    ... and these modules (skipped where one is missing)
    <!-- snippet: skip: <reason> -->      not run here; the reason says why and what covers it

How each block runs, in a fresh temporary directory:

- Python: saved as ``snippet.py`` and run with this interpreter (as a user who saves it to a
  file would: multiprocessing's spawn needs a real ``__main__``). An expression statement
  followed by ``# True`` or ``# False`` (and any text) is checked: it must evaluate to that.
  A block of ``>>>`` lines is a doctest, checked as ``python -m doctest`` checks it, with no
  option flags: each output exactly as the interpreter prints it (a wrapped dict fails); a
  directive written in the block (``# doctest: +ELLIPSIS``) is the only way to loosen that. A gpu block whose imports are missing is skipped (say, no Numba on
  the GPU machine); a block without the marker must have everything it imports.
- Shell: ``bash -euo pipefail``, with this interpreter first on PATH as ``python``/``python3``.
  Programs the docs name as placeholders (``your_program.py``, ``program.py``, ``train.py``) are
  stand-ins written into the directory (``STAND_IN`` below): they check that ump-alloc is
  NumPy's allocator exactly when ``UMP_ALLOC=1`` is set, and Numba's memory manager when
  ``NUMBA_CUDA_MEMORY_MANAGER=ump_alloc.numba`` is.
- Environment: ``UMP_ALLOC*`` variables cleared (``UMP_ALLOC_LIBRARY`` kept). Blocks without
  the gpu marker run with ``UMP_ALLOC_NO_CUDA=1``, as on a machine without a GPU, wherever the
  suite runs; gpu blocks see the machine as it is.

On the GPU machine, ``pytest python_tests/test_snippets.py -m gpu`` runs the gpu blocks.

The Python blocks without the gpu marker also run on the oldest NumPy the project supports
(pyproject.toml's ``numpy>=1.22``: 1.22.4, in a CPython 3.9 or 3.10 venv made once in
``target/numpy-oldest``), all but those that import more than NumPy and ump_alloc; this
interpreter has the newest (scripts/setup.sh).
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.exists(os.path.join(ROOT, "README.md")):
    pytest.skip("not a checkout: no README.md", allow_module_level=True)

PYTHON_TAGS = {"python", "py"}
SHELL_TAGS = {"sh", "bash", "shell"}
_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
_C_FILE = re.compile(r"^/\*\s*([\w.-]+\.c)\s*\*/\s*$")

STAND_IN = '''"""Stand-in, written by python_tests/test_snippets.py, for the program a snippet runs."""
import os

import numpy as np

import ump_alloc

on = os.environ.get("UMP_ALLOC", "").strip() not in ("", "0")
a = np.ones(1000)
assert ump_alloc.handles(a) == on, f"UMP_ALLOC={os.environ.get('UMP_ALLOC')!r} but handles(a) is {ump_alloc.handles(a)}"
if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "ump_alloc.numba":
    from numba import cuda

    d = cuda.device_array(1000)
    assert ump_alloc.identify(d).ours, "Numba's device array is not ump-alloc's"
print("stand-in ran; ump-alloc", "on" if on else "off")
'''
PLACEHOLDERS = ("your_program.py", "program.py", "train.py")


@dataclasses.dataclass
class Snippet:
    path: str  # relative to ROOT
    line: int  # of the opening fence, 1-based
    tag: str
    code: str
    gpu: bool = False
    needs: tuple = ()
    skip: str | None = None
    files: dict = dataclasses.field(default_factory=dict)  # earlier C blocks named by their first line

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse_marker(text: str) -> dict:
    """``gpu``, ``gpu, needs numba cupy``, ``skip: reason`` -> dict(gpu, needs, skip)."""
    if text.startswith("skip:"):
        reason = text[len("skip:"):].strip()
        if not reason:
            raise ValueError("a skip marker needs a reason: <!-- snippet: skip: why -->")
        return {"skip": reason}
    out: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if part == "gpu":
            out["gpu"] = True
        elif part.startswith("needs "):
            out["needs"] = tuple(part[len("needs "):].split())
        else:
            raise ValueError(f"unknown snippet marker {part!r} (gpu, needs MODULE..., skip: REASON)")
    return out


def snippets(text: str, path: str) -> list[Snippet]:
    """The runnable blocks of one markdown text, with their markers."""
    lines = text.splitlines()
    out: list[Snippet] = []
    files: dict = {}
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        tag, start = m.group(1).lower(), i
        j = i + 1
        while j < len(lines) and not re.match(r"^```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{start + 1}: a code block is never closed")
        code = "\n".join(lines[i + 1:j]) + "\n"
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _MARKER.match(lines[k]) if k >= 0 else None
        attrs = parse_marker(marker.group(1)) if marker else {}
        if tag == "c" and code.strip() and _C_FILE.match(code.splitlines()[0]):
            files[_C_FILE.match(code.splitlines()[0]).group(1)] = code
        elif tag in PYTHON_TAGS or tag in SHELL_TAGS:
            out.append(Snippet(path, start + 1, tag, code, files=dict(files), **attrs))
        elif marker:
            raise ValueError(f"{path}:{start + 1}: a snippet marker on a ```{tag} block, which is not run")
        i = j + 1
    return out


def documents() -> list[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "guides", "*.md")))


def all_snippets() -> list[Snippet]:
    out = []
    for f in documents():
        with open(f) as fh:
            out += snippets(fh.read(), os.path.relpath(f, ROOT))
    return out


def check_truth_comments(code: str) -> str:
    """Turn ``expr  # True ...`` / ``# False ...`` expression lines into asserts."""
    out = []
    for line in code.splitlines():
        m = re.match(r"^(\s*)(\S.*?)\s+#\s*(True|False)\b.*$", line)
        if m:
            try:
                tree = ast.parse(m.group(2))
            except SyntaxError:
                tree = None
            if tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
                want = m.group(3)
                line = f"{m.group(1)}assert ({m.group(2)}) is {want}, {line.strip()!r} + ': not {want}'"
        out.append(line)
    return "\n".join(out) + "\n"


def _imports(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def _missing(modules) -> list[str]:
    return sorted(m for m in modules if importlib.util.find_spec(m) is None)


def run(snippet: Snippet, workdir: str, python: str = sys.executable, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run one snippet in ``workdir`` (see the module's docstring) with ``python`` (this
    interpreter) and ``env_extra`` in the environment; returns the finished process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") or k == "UMP_ALLOC_LIBRARY"}
    env.update(env_extra or {})
    if not snippet.gpu:
        env["UMP_ALLOC_NO_CUDA"] = "1"
    bindir = os.path.join(workdir, ".bin")
    os.makedirs(bindir, exist_ok=True)
    for name in ("python", "python3"):  # a wrapper, not a link: a venv is found from the path run
        with open(os.path.join(bindir, name), "w") as f:
            f.write(f'#!/bin/sh\nexec "{python}" "$@"\n')
        os.chmod(os.path.join(bindir, name), 0o755)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    for name in PLACEHOLDERS:
        with open(os.path.join(workdir, name), "w") as f:
            f.write(STAND_IN)
    for name, text in snippet.files.items():
        with open(os.path.join(workdir, name), "w") as f:
            f.write(text)
    if snippet.tag in SHELL_TAGS:
        cmd = ["bash", "-euo", "pipefail", "-c", snippet.code]
    elif snippet.code.lstrip().startswith(">>>"):
        with open(os.path.join(workdir, "snippet.txt"), "w") as f:
            f.write(snippet.code)
        cmd = [python, "-m", "doctest", "snippet.txt"]
    else:
        with open(os.path.join(workdir, "snippet.py"), "w") as f:
            f.write(check_truth_comments(snippet.code))
        cmd = [python, "snippet.py"]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def _param(s: Snippet):
    marks = [pytest.mark.gpu] if s.gpu else []
    return pytest.param(s, id=s.id, marks=marks)


SNIPPETS = all_snippets()


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_snippet_runs_as_written(snippet, tmp_path):

    if snippet.skip:
        pytest.skip(snippet.skip)
    wanted = set(snippet.needs) | (_imports(snippet.code) if snippet.tag in PYTHON_TAGS else set())
    missing = _missing(wanted)
    if missing and snippet.gpu:
        pytest.skip(f"needs {', '.join(missing)}")
    assert not missing, f"{snippet.id} imports {missing}, which the test set-up does not install"
    r = run(snippet, str(tmp_path))
    assert r.returncode == 0, f"{snippet.id} failed (exit {r.returncode}):\n{snippet.code}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def test_every_document_has_snippets_and_the_markers_are_few():
    by_file = {}
    for s in SNIPPETS:
        by_file.setdefault(s.path, []).append(s)
    for f in documents():
        assert os.path.relpath(f, ROOT) in by_file, f"{f} has no runnable snippet (or they are not tagged)"
    skipped = [s.id for s in SNIPPETS if s.skip]
    assert len(skipped) <= 3, f"skip markers are for the exceptional case: {skipped}"


# ---- the oldest NumPy supported -------------------------------------------------------------

#: pyproject.toml's floor (numpy>=1.22, the first with NEP 49's handler API) at its last patch
#: release; it has wheels for CPython 3.8-3.10. This interpreter has the newest (setup.sh).
OLDEST_NUMPY = "1.22.4"
OLDEST_VENV = os.path.join(ROOT, "target", "numpy-oldest")


def _python_for_oldest_numpy() -> str | None:
    """A CPython 3.9 or 3.10 on this machine (pyenv's, or on PATH) that runs, or None."""
    import shutil

    for v in ("3.9", "3.10"):
        found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python{v}"))) + [shutil.which(f"python{v}")]
        for exe in filter(None, found):
            if subprocess.run([exe, "-c", "import venv"], capture_output=True, timeout=60).returncode == 0:
                return exe  # (pyenv's shim on PATH fails where that version is not selected)
    return None


@pytest.fixture(scope="module")
def oldest_numpy_python():
    """An interpreter with NumPy 1.22.4 and nothing else, made once in target/numpy-oldest (pip,
    from PyPI); ump_alloc comes from the checkout (``PYTHONPATH=python``, the library cargo
    built)."""
    py = os.path.join(OLDEST_VENV, "bin", "python")
    stamp = os.path.join(OLDEST_VENV, ".numpy")
    if not (os.path.exists(py) and os.path.exists(stamp) and open(stamp).read() == OLDEST_NUMPY):
        base = _python_for_oldest_numpy()
        if base is None:
            pytest.skip(f"no CPython 3.9 or 3.10 here for NumPy {OLDEST_NUMPY} (on PATH or in pyenv)")
        subprocess.run([base, "-m", "venv", "--clear", OLDEST_VENV], check=True, timeout=300)
        r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--only-binary=:all:",
                            f"numpy=={OLDEST_NUMPY}"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(stamp, "w") as f:
            f.write(OLDEST_NUMPY)
    r = subprocess.run([py, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == OLDEST_NUMPY, r.stdout + r.stderr
    return py


@pytest.mark.parametrize(
    "snippet", [pytest.param(s, id=s.id) for s in SNIPPETS if s.tag in PYTHON_TAGS and not s.gpu and not s.skip])
def test_python_snippet_on_the_oldest_numpy(snippet, tmp_path, oldest_numpy_python):
    """The Python snippets (the doctests included) run as written on NumPy 1.22 too; those that
    import more than NumPy and ump_alloc (Dask) run on the newest only."""
    env = {"PYTHONPATH": os.path.join(ROOT, "python")}
    wanted = sorted(_imports(snippet.code))
    r = subprocess.run([oldest_numpy_python, "-c", "import importlib.util as u, sys\n"
                        "print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))", *wanted],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    if r.stdout.strip():
        pytest.skip(f"imports {r.stdout.strip()}, which the NumPy {OLDEST_NUMPY} interpreter does not have "
                    "(checked on the newest NumPy above)")
    r = run(snippet, str(tmp_path), python=oldest_numpy_python, env_extra=env)
    assert r.returncode == 0, f"{snippet.id} failed on NumPy {OLDEST_NUMPY} (exit {r.returncode}):\n{snippet.code}\n" \
                              f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"


# ---- the runner itself can fail ------------------------------------------------------------


def test_runner_catches_failures(tmp_path):
    md = (
        "```python\nraise SystemExit(3)\n```\n\n"
        "```python\nx = 1\nx == 2   # True: this claim is false\n```\n\n"
        "```python\n>>> 1 + 1\n3\n```\n\n"
        "```sh\nfalse\necho never\n```\n\n"
        "```sh\nUMP_ALLOC=1 python your_program.py\n```\n\n"
        "```python\nx = 1\nx == 1   # True\nx == 2   # False, and a remark\nprint(x)  # not checked\n```\n"
        "```python\n>>> {'a': 1, 'b': 2}\n{'a': 1,\n 'b': 2}\n```\n"
        "```python\n>>> {'a': 1, 'b': 2}\n{'a': 1, 'b': 2}\n```\n"
    )
    got = snippets(md, "t.md")
    results = []
    for i, s in enumerate(got):
        d = tmp_path / str(i)
        d.mkdir()
        results.append(run(s, str(d)).returncode)
    assert results[0] == 3 and results[1] != 0 and results[2] != 0 and results[3] != 0, results
    # The stand-in checks what UMP_ALLOC=1 promises: without the import hook (no
    # ump_alloc.pth) it fails, with it it passes.
    from ump_alloc import _enable

    assert (results[4] == 0) == _enable.pth_installed(), results
    assert results[5] == 0, results
    # A doctest is checked as written: a wrapped output fails, the output Python prints passes.
    assert results[6] != 0 and results[7] == 0, results


def test_markers_are_parsed_and_checked():
    md = (
        "<!-- snippet: gpu -->\n```python\nimport cupy\n```\n"
        "<!-- snippet: gpu, needs numba -->\n\n```sh\nx\n```\n"
        "<!-- snippet: skip: because -->\n```sh\nx\n```\n"
        "```\nplain output\n```\n"
        "```c\n/* q.c */\nint main(void) { return 0; }\n```\n```sh\ncc q.c\n```\n"
    )
    got = snippets(md, "t.md")
    assert [(s.line, s.gpu, s.needs, s.skip) for s in got] == [
        (2, True, (), None), (7, True, ("numba",), None), (11, False, (), "because"), (21, False, (), None)]
    assert got[3].files == {"q.c": "/* q.c */\nint main(void) { return 0; }\n"}
    for bad in ("<!-- snippet: gpus -->\n```sh\nx\n```\n", "<!-- snippet: skip: -->\n```sh\nx\n```\n",
                "<!-- snippet: gpu -->\n```\nout\n```\n", "```python\nnever closed\n"):
        with pytest.raises(ValueError):
            snippets(bad, "t.md")
