#!/usr/bin/env bash
# Configure, build and run the C++ tests (tests/cpp, cpp/examples) in build/ctest.
# Uses the active Python (e.g. the .venv) to locate pybind11. CUDA stays ON: when nvcc exists the
# CUDA module and tests compile too (GPU tests skip themselves without a device).
# Extra arguments are passed to the cmake configure step, e.g. -DTRILLIUM_BUILD_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
BUILD_DIR="${BUILD_DIR:-build/ctest}"
JOBS="${JOBS:-2}"

cmake -S . -B "$BUILD_DIR" \
  -DCMAKE_BUILD_TYPE=Release \
  -DTRILLIUM_BUILD_TESTS=ON \
  -DPython_EXECUTABLE="$PYTHON" \
  -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" \
  "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
