"""The package's import graph goes one way: no module imports from its own layer's siblings or
from a layer above it (docs/architecture.md, "Layers"). A new import that breaks the order fails
here, naming the file and the import."""

from __future__ import annotations

import ast
import pathlib

import trillium

# Lowest first. A module may import its own unit (package or top-level module) and any unit of a
# lower layer. Imports under ``if TYPE_CHECKING:`` count too: a type that points upwards is a
# design smell as well.
LAYERS: list[set[str]] = [
    {"_core", "_cuda", "config", "runtime", "protocol"},
    {"ops"},
    {"models"},
    {"tokenizer", "structured", "engine", "tools"},
    {"speculative"},  # the draft-model proposer runs a model through the engine's sampler
    {"scheduler", "metering", "cluster"},
    {"engine_client"},
    {"launch"},
    {"server"},
    {"serve", "llm", "chat", "model_info"},
    {"cli", "__init__"},
    {"__main__"},  # python -m trillium: the cli
]
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
ROOT = pathlib.Path(trillium.__file__).parent


def _imported_units(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, unit) for every ``trillium.<unit>`` a module imports."""
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "trillium":
                names = [f"trillium.{alias.name}" for alias in node.names]
            elif node.module.startswith("trillium."):
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("trillium.")]
        found.extend((node.lineno, name.split(".")[1]) for name in names)
    return found


def _violations() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        unit = rel.parts[0].removesuffix(".py")
        assert unit in LAYER_OF, f"{rel}: new unit {unit!r}: give it a layer in LAYERS (and in the map)"
        for line, imported in _imported_units(ast.parse(path.read_text(), str(path))):
            if imported == unit:
                continue
            assert imported in LAYER_OF, f"{rel}:{line}: imports unknown unit {imported!r}"
            if LAYER_OF[imported] >= LAYER_OF[unit]:
                out.append(
                    f"{rel}:{line}: {unit} (layer {LAYER_OF[unit]}) imports {imported} (layer {LAYER_OF[imported]})"
                )
    return out


def test_no_module_imports_from_its_layer_or_above():
    assert _violations() == []


def test_the_checker_sees_an_upward_import():
    """The check itself: a runtime module importing the server would be reported."""
    tree = ast.parse(
        "from trillium.server.app import build_app\nimport trillium.scheduler.actor\nfrom trillium import launch\n"
    )
    assert [u for _, u in _imported_units(tree)] == ["server", "scheduler", "launch"]


# What the scheduler may use of structured output: the per-request controller and the bitmask
# filler it hands each step's controllers to. Everything behind the controller (matcher, guard,
# closer, witnesses, value checks) is structured/'s own.
SCHEDULER_MAY_IMPORT = {
    "trillium.structured.controller": {"OutputController", "StructuredCounters", "CLOSE_SEARCH_SECONDS"},
    "trillium.structured.bitmask": {"BitmaskFiller", "StepBitmask"},
}
BEHIND_THE_CONTROLLER = {"matcher", "guard", "closer", "checker", "ll_matcher", "bans"}


def _scheduler_reaches() -> list[str]:
    out = []
    for path in sorted((ROOT / "scheduler").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"scheduler/{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trillium.structured"):
                allowed = SCHEDULER_MAY_IMPORT.get(node.module, set())
                out += [f"{where}: imports {node.module}.{a.name}" for a in node.names if a.name not in allowed]
            elif isinstance(node, ast.Import):
                out += [f"{where}: imports {a.name}" for a in node.names if a.name.startswith("trillium.structured")]
            elif isinstance(node, ast.Attribute) and node.attr in BEHIND_THE_CONTROLLER:
                out.append(f"{where}: reaches .{node.attr}")
    return out


def test_the_scheduler_calls_structured_output_only_through_its_controller():
    assert _scheduler_reaches() == []


def test_the_controller_answers_in_protocol_types():
    """The scheduler gets verdicts (``protocol.Verdict``) and plain values back, never an object
    of structured/'s internals."""
    import typing

    from trillium.protocol import Verdict
    from trillium.structured.controller import OutputController

    hints = {name: typing.get_type_hints(getattr(OutputController, name))["return"] for name in ("step", "draft_run")}
    hints["searches"] = typing.get_type_hints(OutputController.searches.fget)["return"]
    assert hints == {"step": Verdict, "draft_run": list[int], "searches": bool}
