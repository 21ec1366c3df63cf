"""The core as a library, as another project sees it: built with Python off, installed into a
temporary prefix, and used from there only -- by the out-of-tree hosts in examples/embed/ (C++
through CMake's find_package, C through the C API, C through pkg-config), by a Python host over
``trillium._core``, and checked for ABI hygiene (exported symbols, self-contained headers). The
wheel ``pip wheel .`` builds installs into a fresh venv and imports.

Each host is copied out of the source tree before it is built, so nothing can reach back into it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMBED = ROOT / "examples" / "embed"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The core configured with TRILLIUM_BUILD_PYTHON=OFF (no Python, pybind11 or torch), built,
    and installed here."""
    build, prefix = tmp_path_factory.mktemp("core-build"), tmp_path_factory.mktemp("prefix")
    run("cmake", "-S", ROOT, "-B", build, "-DTRILLIUM_BUILD_PYTHON=OFF", "-DTRILLIUM_BUILD_CUDA=OFF",
        "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_INSTALL_PREFIX={prefix}")  # fmt: skip
    run("cmake", "--build", build, "-j", str(os.cpu_count() or 2))
    run("cmake", "--install", build)
    return prefix


def build_host(name: str, prefix: Path, tmp_path: Path) -> Path:
    """examples/embed/<name>, copied out of the tree and built against ``prefix`` alone."""
    src = tmp_path / name
    shutil.copytree(EMBED / name, src)
    run("cmake", "-S", src, "-B", src / "build", f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release")
    run("cmake", "--build", src / "build")
    return src / "build" / f"embed_{name}"


def test_the_package_installs_headers_libraries_and_its_descriptions(prefix: Path) -> None:
    lib = prefix / "lib"
    assert (lib / "libtrillium.so").exists() and (lib / "libtrillium_core.a").exists()
    assert (lib / "cmake" / "trillium" / "trilliumConfig.cmake").exists()
    assert (prefix / "include" / "trillium" / "c_api.h").exists()
    line = next(x for x in (ROOT / "pyproject.toml").read_text().splitlines() if x.startswith("version"))
    version = line.split('"')[1]
    assert f"Version: {version}" in (lib / "pkgconfig" / "trillium.pc").read_text()


def test_a_cpp_host_finds_the_package_and_runs(prefix: Path, tmp_path: Path) -> None:
    out = run(build_host("cpp", prefix, tmp_path))
    assert "32 prefix tokens reused" in out and "all blocks free: yes" in out


def test_a_c_host_runs_through_the_c_api(prefix: Path, tmp_path: Path) -> None:
    out = run(build_host("c", prefix, tmp_path)).strip()
    # the prefix cache hit, the attention check, and the error path: a code and a message, no abort
    assert "prefix hit 8/" in out and "bad call -> out of blocks: trillium_block_allocator_allocate" in out
    assert out.endswith("; ok"), out


@pytest.mark.skipif(shutil.which("pkg-config") is None or shutil.which("cc") is None, reason="needs pkg-config, cc")
def test_a_c_host_builds_with_pkg_config(prefix: Path, tmp_path: Path) -> None:
    env = {"PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = run("pkg-config", "--cflags", "--libs", "trillium", env=env).split()
    exe = tmp_path / "embed_c_pc"
    run("cc", "-std=c11", EMBED / "c" / "main.c", "-o", exe, *flags, "-lm")  # -lm: the example's own exp()
    run(exe, env={"LD_LIBRARY_PATH": str(prefix / "lib")})


def test_the_shared_library_exports_only_trillium_symbols(prefix: Path) -> None:
    """nm -D: the C API (trillium_*) and the trillium:: namespace; the standard library's
    template instances and everything else stay local (cpp/trillium.map)."""
    if shutil.which("nm") is None or shutil.which("c++filt") is None:
        pytest.skip("needs nm and c++filt (binutils)")
    raw = run("nm", "-D", "--defined-only", prefix / "lib" / "libtrillium.so")
    names = run("c++filt", *[line.split()[-1] for line in raw.splitlines() if line.strip()]).splitlines()
    assert any(n.startswith("trillium_") for n in names), "no C API symbol exported"
    assert any(n.startswith("trillium::") for n in names), "no C++ symbol exported"
    stray = [n for n in names if not n.startswith(("trillium_", "trillium::"))]
    assert stray == []


def test_the_public_headers_compile_alone_and_strictly(prefix: Path, tmp_path: Path) -> None:
    """Every installed header on its own: C11 for the C API, C++17 for all, -Wall -Wextra -Werror
    -pedantic."""
    if shutil.which("cc") is None or shutil.which("c++") is None:
        pytest.skip("needs cc and c++")
    include = prefix / "include"
    strict = ["-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", f"-I{include}"]

    def unit(header: str, suffix: str) -> Path:  # a translation unit that includes only it
        src = tmp_path / (header.replace("/", "_") + suffix)
        src.write_text(f"#include <{header}>\n")
        return src

    run("cc", "-std=c11", *strict, unit("trillium/c_api.h", ".c"))
    for path in sorted((include / "trillium").rglob("*.h")):
        header = path.relative_to(include).as_posix()
        if "/cuda/" in header:
            continue  # needs the CUDA toolkit's headers
        run("c++", "-std=c++17", *strict, unit(header, ".cc"))


def test_a_python_host_uses_the_core_module_directly() -> None:
    out = run(sys.executable, EMBED / "python" / "host.py")
    assert "max |error|" in out


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv(tmp_path: Path) -> None:
    """``pip wheel .`` (here without build isolation, CUDA off: the registry and nvcc are not the
    point) gives a wheel that a fresh venv installs and whose compiled core imports and runs
    there, without torch or any other dependency installed."""
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "--no-build-isolation", "-w", wheels, "-q",
        "-C", f"build-dir={tmp_path / 'build'}", "-C", "cmake.define.TRILLIUM_BUILD_CUDA=OFF")  # fmt: skip
    (wheel,) = wheels.glob("trillium-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    out = run(python, "-c", "import trillium, trillium._core as c; a = c.BlockAllocator(8); "
              "print(trillium.__version__, len(a.allocate(3)), a.num_free_blocks)", cwd=tmp_path)  # fmt: skip
    assert out.split()[1:] == ["3", "5"]
