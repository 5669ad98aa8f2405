"""The docs do what they say: the README's C quick start compiles and runs as written."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.exists(os.path.join(ROOT, "Cargo.toml")):
    pytest.skip("not a checkout (the device runs a staged copy of python/ and python_tests/)", allow_module_level=True)


def _c_quickstart():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Quick start: C", 1)
    assert len(section) == 2, "README.md has no 'Quick start: C' section"
    m = re.search(r"```c\n(.*?)```", section[1], re.S)
    assert m, "the C quick start has no ```c block"
    return m.group(1)


def test_readme_c_quick_start_compiles_and_runs(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    lib = os.path.join(ROOT, "target", "release", "libump_alloc.so")
    if not os.path.exists(lib):
        pytest.skip("cargo build --release first (scripts/test.sh does)")
    src = tmp_path / "quickstart.c"
    src.write_text(_c_quickstart())
    libdir = os.path.dirname(lib)
    # The README's checkout command, as written.
    subprocess.run(
        ["cc", "-Wall", "-Werror", "-o", str(tmp_path / "quickstart"), str(src), f"-I{ROOT}/include",
         f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lump_alloc"],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") and k != "LD_LIBRARY_PATH"}
    env["UMP_ALLOC_NO_CUDA"] = "1"
    r = subprocess.run([str(tmp_path / "quickstart")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "block of 1048576 bytes, device-accessible: 0", r.stdout
    assert lines[1].startswith("refused: ump_malloc: ") and "SIZE_MAX" not in lines[1] and len(lines[1]) > 25, r.stdout


def test_extraction_fails_without_the_block(monkeypatch, tmp_path):
    """Control: a README without the block fails the extraction, so the test above cannot pass
    vacuously."""
    (tmp_path / "README.md").write_text("# nothing here\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    with pytest.raises(AssertionError, match="no 'Quick start: C' section"):
        _c_quickstart()


def _markdown_files():
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(d, n) for n in names if n.endswith(".md")]
    return files


_PATH = re.compile(
    r"`((?:\.\./|\./|\.device/|benches/|src/|python/|python_tests/|tests/|scripts/|docs/|include/|\.ci/)"
    r"[\w./*-]*)`"
)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _missing_references(text, base_dir):
    missing = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        if not os.path.exists(os.path.normpath(os.path.join(base_dir, target))):
            missing.append(target)
    for m in _PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if _not_in_repository(path):
            missing.append(path)
    return missing


def _not_in_repository(path):
    """Whether ``path`` (relative to the checkout; ``*`` a wildcard) names nothing in it: a path
    outside the repository or in a scratch folder, or one that does not exist."""
    if path.startswith(("../", ".device/")):
        return True
    if "*" in path:
        import glob

        return not glob.glob(os.path.join(ROOT, path))
    return not os.path.exists(os.path.join(ROOT, path))


def test_docs_name_only_files_in_the_repository():
    problems = {}
    for f in _markdown_files():
        with open(f) as fh:
            bad = _missing_references(fh.read(), os.path.dirname(f))
        if bad:
            problems[os.path.relpath(f, ROOT)] = sorted(set(bad))
    assert not problems, problems


def test_reference_check_can_fail():
    """Control: the checker reports a dangling link, a path outside the repository and a
    missing source file."""
    text = "see [x](docs/nope.md), `../shared/DEVICE.md`, `src/nope.rs` and `src/lib.rs`"
    assert sorted(_missing_references(text, ROOT)) == ["../shared/DEVICE.md", "docs/nope.md", "src/nope.rs"]


def _readme_config_variables():
    with open(os.path.join(ROOT, "README.md")) as f:
        section = f.read().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `(UMP_ALLOC[A-Z_]*)` \|", section, re.M)}


def test_readme_configuration_table_matches_the_library():
    import ump_alloc

    library = {row["name"] for row in ump_alloc.config_table()}
    readme = _readme_config_variables()
    assert readme, "no configuration table found in the README"
    assert library - readme == set(), f"variables `info` lists that the README does not: {sorted(library - readme)}"
    assert readme - library == set(), f"README variables the library does not know: {sorted(readme - library)}"


# Paths in code: the same roots as in the docs, written without backticks, with brace lists
# (`src/pool/{mod,slab}.rs`). `./` is left out: in code comments it names a program just built.
_CODE_PATH = re.compile(
    r"(?<![\w/.-])((?:\.\./|\.device/|benches/|src/|python/|python_tests/|tests/|scripts/|docs/|include/|\.ci/)"
    r"[\w./*{},-]*)"
)


def _expand(path):
    """``src/pool/{mod,slab}.rs`` -> ``["src/pool/mod.rs", "src/pool/slab.rs"]``."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in _expand(path[: m.start()] + alt + path[m.end():])]


def _source_files():
    """Every Rust file under src/ and Python file under python/, relative to the checkout."""
    out = []
    for top, ext in (("src", ".rs"), ("python", ".py")):
        for d, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__" and not x.endswith(".egg-info")]
            out += [os.path.relpath(os.path.join(d, n), ROOT) for n in names if n.endswith(ext)]
    return sorted(out)


def _missing_in_code(text):
    paths = [p.rstrip(".,:;)") for m in _CODE_PATH.finditer(text) for p in _expand(m.group(1).rstrip(".,:;)"))]
    return [p for p in paths if _not_in_repository(p)]


def test_code_names_only_files_in_the_repository():
    """Comments and docstrings of src/ and python/ name no file outside the repository and none
    that was renamed or removed."""
    problems = {}
    for f in _source_files():
        with open(os.path.join(ROOT, f)) as fh:
            bad = _missing_in_code(fh.read())
        if bad:
            problems[f] = sorted(set(bad))
    assert not problems, problems


def test_code_reference_check_can_fail():
    """Control: a file outside the repository, a renamed one and one of a brace list that does
    not exist are reported; existing ones are not."""
    text = "//! see ../shared/DEVICE.md, src/prim/cuda.rs and src/pool/{mod,nope}.rs (src/lib.rs)."
    assert sorted(_missing_in_code(text)) == ["../shared/DEVICE.md", "src/pool/nope.rs", "src/prim/cuda.rs"]


def _architecture_modules(readme):
    """The .rs and .py files the README's architecture drawing names (brace lists expanded)."""
    section = readme.split("## Architecture", 1)
    assert len(section) == 2, "README.md has no 'Architecture' section"
    m = re.search(r"```\n(.*?)```", section[1], re.S)
    assert m, "the Architecture section has no drawing (a ``` block)"
    tokens = re.findall(r"(?:src|python)/(?:[\w/.]|\{[\w,]*\})*\.(?:rs|py)\b", m.group(1))
    return {p for t in tokens for p in _expand(t)}


def test_architecture_names_every_module():
    """The README's architecture drawing names every Rust file of src/ and Python file of
    python/, and only files that exist."""
    with open(os.path.join(ROOT, "README.md")) as f:
        named = _architecture_modules(f.read())
    modules = set(_source_files())
    assert modules - named == set(), f"modules the architecture does not name: {sorted(modules - named)}"
    assert named - modules == set(), f"the architecture names files that do not exist: {sorted(named - modules)}"


def test_architecture_check_can_fail():
    """Control: a drawing that lists a brace list and a single file is read as those files."""
    readme = "## Architecture\n\n```\nsrc/pool/{mod,slab}.rs  pools\npython/ump_alloc/_lib.py  ctypes\n```\n"
    assert _architecture_modules(readme) == {"src/pool/mod.rs", "src/pool/slab.rs", "python/ump_alloc/_lib.py"}
