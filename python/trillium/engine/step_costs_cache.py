"""Step costs kept between start-ups: a restart on the same model, build and machine reuses the
costs measured by the last one (``engine.step_costs``) instead of timing steps again.

Timing takes 2-4 s of the default model's ~10 s start-up. The costs depend on the machine, the
compiled core, the model file and the arithmetic, so an entry is keyed by all of them (``key``):
a change to any one measures again. An entry is reused for ``MAX_AGE_S`` at most, so that a
measurement taken while the machine was busy (which reads draft rows as dearer than they are,
and makes speculation stand aside too early) does not outlive the day.

Where: ``$TRILLIUM_CACHE_DIR/step_costs/`` (default ``$XDG_CACHE_HOME/trillium``, else
``~/.cache/trillium``); ``TRILLIUM_CACHE_DIR=`` (empty) turns the cache off. An unreadable or
unwritable cache is never an error: start-up measures, and says so at debug level.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from trillium import config
from trillium.engine.step_costs import StepCosts

log = logging.getLogger("trillium.engine")

MAX_AGE_S = 24 * 3600.0  # an entry older than this is measured again (module doc)
_FORMAT = 1  # bumped when an entry's layout or the measurement's method changes


def cache_dir() -> Path | None:
    """The directory entries live in, or None when the cache is off (module doc)."""
    root = config.cache_dir()
    return Path(root, "step_costs") if root else None


def _file_identity(path: str) -> list[object]:
    """Path, size and mtime; for a directory (a Hugging Face model), those of each file in it."""
    if os.path.isdir(path):
        return [_file_identity(os.path.join(path, name)) for name in sorted(os.listdir(path))]
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def key(model_path: str, core_path: str, settings: dict[str, object]) -> str:
    """The entry's name: a hash of the model file and compiled core (path, size, mtime), the
    machine (CPU name, core count) and ``settings`` (everything of the configuration that
    changes a step's cost: weights, activations, dtypes, threads, batch bound, drafts per step)."""
    identity = {
        "format": _FORMAT,
        "model": _file_identity(model_path),
        "core": _file_identity(core_path),
        "cpu": [_cpu_name(), os.cpu_count(), platform.machine()],
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cached_step_costs(name: str, measure: Callable[[], tuple[int, StepCosts]]) -> tuple[int, StepCosts]:
    """(threshold, costs) from the entry ``name`` when one younger than ``MAX_AGE_S`` exists;
    else ``measure()``, stored for the next start-up."""
    folder = cache_dir()
    path = folder / f"{name}.json" if folder is not None else None
    if path is not None:
        try:
            entry = json.loads(path.read_text())
            age_s = time.time() - float(entry["measured_at"])
            if age_s < MAX_AGE_S:
                threshold, costs = int(entry["threshold"]), StepCosts(**entry["costs"])
                log.info(
                    "speculation: step costs measured %.0f min ago on this model, build and machine (%s)",
                    age_s / 60,
                    costs.describe(threshold),
                )
                return threshold, costs
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.debug("step costs cache: no usable entry at %s (%s)", path, e)
    threshold, costs = measure()
    if path is not None:
        entry = {"threshold": threshold, "costs": dataclasses.asdict(costs), "measured_at": time.time()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written whole, then renamed: a start-up reading at the same moment sees the old
            # entry or the new one, never half of one.
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(entry))
            os.replace(partial, path)
        except OSError as e:
            log.debug("step costs cache: could not write %s (%s)", path, e)
    return threshold, costs
