#!/usr/bin/env bash
# Set up (first run) and run the demo: NumPy on ump-alloc; on a GPU, a NumPy array changed in
# place by a CuPy kernel with no copy.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
cd /tmp && exec "$root/.venv/bin/python" -m ump_alloc demo
