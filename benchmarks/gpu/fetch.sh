#!/usr/bin/env bash
# Download the GPU run's wheel set (wheels.txt) for Python 3.12 into .whl/ (ignored), check it is
# complete (check.py) and that pip would install it for Python 3.12 (a dry run). Run from the repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.whl}
mkdir -p "$dest"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
wheels=$(grep -v '^#' benchmarks/gpu/wheels.txt | grep -v '^deepspeed' | grep .)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$dest" $wheels
python3 -m pip download -q --no-deps --no-binary=:all: -d "$dest" "$(grep '^deepspeed' benchmarks/gpu/wheels.txt)"
python3 benchmarks/gpu/check.py "$dest"
python3 -m pip install -q --dry-run --no-index --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --target "$(mktemp -d)" "$dest"/*.whl
echo "$(du -sh "$dest" | cut -f1) in $dest: complete, and pip installs it for Python 3.12 (dry run)"
