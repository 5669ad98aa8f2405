"""Every ctypes Structure in ``ump_alloc/_lib.py`` has the layout of its struct in
``include/ump_alloc.h`` (issue 24): the same fields in the same order, and the size, alignment,
field offsets and field sizes a C compiler gives the header's struct. The C side is measured
by compiling a small program of ``sizeof``/``offsetof`` against the header."""

import ctypes
import json
import os
import re
import shutil
import subprocess

import pytest

from ump_alloc import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "include", "ump_alloc.h")
if not os.path.exists(os.path.join(ROOT, "Cargo.toml")):
    pytest.skip("not a checkout (the device runs a staged copy of python/ and python_tests/)", allow_module_level=True)

# The header's struct that each ctypes Structure mirrors.
C_NAMES = {
    "DeviceCaps": "ump_device_caps",
    "Capabilities": "ump_capabilities",
    "Identity": "ump_identity",
    "Usage": "ump_usage",
    "PoolStat": "ump_pool_stat",
    "Stats": "ump_stats",
    "ScopeReport": "ump_scope_report",
    "TransferFacts": "ump_transfer_facts",
    "TransferPlan": "ump_transfer_plan",
}
# Header structs Python does not mirror: NumPy's handler, which it only passes along as a
# pointer in a capsule.
NOT_MIRRORED = {"ump_numpy_allocator", "ump_numpy_handler"}


def _structures():
    """Every ctypes Structure class defined in ``_lib``, by name."""
    return {
        name: obj
        for name, obj in vars(_lib).items()
        if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj.__module__ == _lib.__name__
    }


def header_fields(text):
    """``{struct name: [field names in order]}`` of every ``struct ump_... { ... };`` in the
    header text (cbindgen's output: one field per line, comments on lines of their own)."""
    out = {}
    for m in re.finditer(r"^struct (\w+) \{\n(.*?)^\};", text, re.S | re.M):
        fields = []
        for line in m.group(2).splitlines():
            line = line.split("//", 1)[0].strip()
            if not line:
                continue
            fp = re.match(r".*\(\*(\w+)\)\(.*\);$", line)  # a function pointer
            f = fp or re.match(r".*?(\w+)(\[[^\]]*\])?;$", line)
            assert f, f"cannot read the field in {line!r} of struct {m.group(1)}"
            fields.append(f.group(1))
        out[m.group(1)] = fields
    return out


def c_layout(structs, tmp_path):
    """What the C compiler makes of ``structs`` (``{c name: [fields]}``): ``{c name: {"size",
    "align", "fields": {field: [offset, size]}}}``."""
    lines = ["#include <stdalign.h>", "#include <stddef.h>", "#include <stdio.h>", '#include "ump_alloc.h"',
             "int main(void) {", '  printf("{");']
    for i, (name, fields) in enumerate(structs.items()):
        sep = "," if i else ""
        lines.append(f'  printf("{sep}\\"{name}\\": {{\\"size\\": %zu, \\"align\\": %zu, \\"fields\\": {{", '
                     f"sizeof(struct {name}), alignof(struct {name}));")
        for j, f in enumerate(fields):
            fsep = "," if j else ""
            lines.append(f'  printf("{fsep}\\"{f}\\": [%zu, %zu]", offsetof(struct {name}, {f}), '
                         f"sizeof(((struct {name} *)0)->{f}));")
        lines.append('  printf("}}");')
    lines += ['  printf("}\\n");', "  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{os.path.dirname(HEADER)}", "-o", str(exe), str(src)],
                   check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


def ctypes_layout(cls):
    return {
        "size": ctypes.sizeof(cls),
        "align": ctypes.alignment(cls),
        "fields": {name: [getattr(cls, name).offset, getattr(cls, name).size] for name, *_ in cls._fields_},
    }


def differences(c, py):
    """Where the ctypes layout ``py`` differs from the C layout ``c`` (both as c_layout gives)."""
    out = [f"{k}: C {c[k]}, ctypes {py[k]}" for k in ("size", "align") if c[k] != py[k]]
    for f, (off, size) in c["fields"].items():
        if py["fields"].get(f) != [off, size]:
            out.append(f"{f}: C offset {off} size {size}, ctypes {py['fields'].get(f)}")
    return out


@pytest.fixture(scope="module")
def header():
    with open(HEADER) as f:
        return header_fields(f.read())


def test_every_struct_is_mirrored_or_named(header):
    structures = _structures()
    assert set(structures) == set(C_NAMES), "a ctypes Structure in _lib without its C name here, or gone"
    assert set(header) == set(C_NAMES.values()) | NOT_MIRRORED, sorted(set(header) ^ (set(C_NAMES.values()) | NOT_MIRRORED))


def test_fields_are_the_headers_in_order(header):
    for py_name, cls in _structures().items():
        assert [f[0] for f in cls._fields_] == header[C_NAMES[py_name]], py_name


def test_sizes_and_offsets_are_the_headers(header, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    structures = _structures()
    c = c_layout({C_NAMES[n]: header[C_NAMES[n]] for n in structures}, tmp_path)
    problems = {n: d for n, cls in structures.items() if (d := differences(c[C_NAMES[n]], ctypes_layout(cls)))}
    assert not problems, problems


def test_layout_check_can_fail(header, tmp_path):
    """Control: a Structure with one field of the wrong width (``kind`` as 64 bits) is caught,
    with the fields it shifts and the size; and the header reader sees a function pointer's
    name."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")

    class WrongIdentity(ctypes.Structure):
        _fields_ = [(n, ctypes.c_int64 if n == "kind" else t) for n, t in _lib.Identity._fields_]

    c = c_layout({"ump_identity": header["ump_identity"]}, tmp_path)
    assert differences(c["ump_identity"], ctypes_layout(_lib.Identity)) == []
    found = differences(c["ump_identity"], ctypes_layout(WrongIdentity))
    assert [d.split(":")[0] for d in found] == ["size", "kind", "device", "base", "block_size"], found
    assert header["ump_numpy_allocator"] == ["ctx", "malloc", "calloc", "realloc", "free"]
