"""Step costs kept between start-ups (``engine.step_costs_cache``): a second start-up with the same
model, build, machine and settings reuses the first one's costs; any change, an old entry, a
broken entry or the cache turned off measures again; an unwritable cache still starts."""

from __future__ import annotations

import json

import pytest

from trillium.engine import step_costs_cache
from trillium.engine.step_costs import StepCosts

COSTS = StepCosts(5, [1, 2], [0.010, 0.012], [0.011, 0.016])


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("TRILLIUM_CACHE_DIR", str(tmp_path / "cache"))
    model, core = tmp_path / "model.gguf", tmp_path / "core.so"
    model.write_bytes(b"weights")
    core.write_bytes(b"code")
    return model, core


class Measure:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> tuple[int, StepCosts]:
        self.calls += 1
        return 4, COSTS


def test_a_second_start_up_reuses_the_first_ones_costs(files):
    model, core = files
    measure = Measure()
    name = step_costs_cache.key(str(model), str(core), {"threads": 2, "k": 5})
    assert step_costs_cache.cached_step_costs(name, measure) == (4, COSTS)
    assert step_costs_cache.cached_step_costs(name, measure) == (4, COSTS)
    assert measure.calls == 1


def test_any_change_to_model_core_or_settings_is_another_entry(files):
    model, core = files
    base = step_costs_cache.key(str(model), str(core), {"threads": 2, "k": 5})
    assert step_costs_cache.key(str(model), str(core), {"threads": 1, "k": 5}) != base
    model.write_bytes(b"other weights")
    assert step_costs_cache.key(str(model), str(core), {"threads": 2, "k": 5}) != base
    changed_model = step_costs_cache.key(str(model), str(core), {"threads": 2, "k": 5})
    core.write_bytes(b"rebuilt core")
    assert step_costs_cache.key(str(model), str(core), {"threads": 2, "k": 5}) != changed_model


def test_an_old_or_broken_entry_is_measured_again(files):
    model, core = files
    measure = Measure()
    name = step_costs_cache.key(str(model), str(core), {})
    step_costs_cache.cached_step_costs(name, measure)
    entry_path = step_costs_cache.cache_dir() / f"{name}.json"
    entry = json.loads(entry_path.read_text())
    entry["measured_at"] -= step_costs_cache.MAX_AGE_S + 1
    entry_path.write_text(json.dumps(entry))
    step_costs_cache.cached_step_costs(name, measure)
    assert measure.calls == 2
    entry_path.write_text('{"threshold": 4, "costs": {"batch_sizes"')  # cut short
    assert step_costs_cache.cached_step_costs(name, measure) == (4, COSTS)
    assert measure.calls == 3 and json.loads(entry_path.read_text())["threshold"] == 4  # rewritten whole


def test_the_cache_turned_off_or_unwritable_always_measures(files, monkeypatch, tmp_path):
    model, core = files
    measure = Measure()
    name = step_costs_cache.key(str(model), str(core), {})
    monkeypatch.setenv("TRILLIUM_CACHE_DIR", "")
    assert step_costs_cache.cache_dir() is None
    step_costs_cache.cached_step_costs(name, measure)
    step_costs_cache.cached_step_costs(name, measure)
    assert measure.calls == 2
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TRILLIUM_CACHE_DIR", str(blocker))  # step_costs/ cannot be made under a file
    assert step_costs_cache.cached_step_costs(name, measure) == (4, COSTS)
    assert measure.calls == 3 and blocker.read_text() == ""  # the file in the way is left as it was
