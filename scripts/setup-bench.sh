#!/usr/bin/env bash
# Sets up the peers of `arrayjit bench`: a virtual environment in .bench-venv with NumPy from
# PyPI, and PyTorch (CPU build) when --torch is given. `arrayjit bench` finds it there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .bench-venv
.bench-venv/bin/pip install --quiet --upgrade pip
.bench-venv/bin/pip install --quiet numpy
if [ "${1:-}" = "--torch" ]; then
  .bench-venv/bin/pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu \
    || .bench-venv/bin/pip install --quiet torch
fi
.bench-venv/bin/python -c "import numpy; print('numpy', numpy.__version__, 'ready in .bench-venv')"
