"""docs/architecture.md stays a one-page map that is true to the code: its "Layers" block is the list
tests/unit/test_layering.py enforces, every ``file.py:name`` it cites exists, its relative links
resolve, and it fits on a page (at most 150 lines, 1,500 words, 120 characters a line)."""

from __future__ import annotations

import ast
import pathlib
import re

import trillium

REPO = pathlib.Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "architecture.md"
LAYERING_TEST = REPO / "tests" / "unit" / "test_layering.py"
PACKAGE = pathlib.Path(trillium.__file__).parent

MAX_LINES = 150
MAX_WORDS = 1500
MAX_LINE_CHARS = 120

# `scheduler/policy.py:SchedulerPolicy.schedule`: a module under python/trillium/ and a dotted name in it.
CODE_NAME = re.compile(r"`([\w/]+\.py):([\w.]+)`")
# [text](target): a relative link (no scheme, not an in-page anchor).
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``)."""
    match = re.search(rf"^## {re.escape(heading)}\b.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/architecture.md has no '## {heading}' section"
    return match.group(1)


def map_layers(text: str) -> list[set[str]]:
    """The map's layers, lowest first: the first fenced block of its "Layers" section, units
    separated by spaces, layers by arrows (a block may wrap onto several lines)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", _section(text, "Layers"), re.M | re.S)
    assert blocks, "the map's Layers section has no fenced block"
    return [set(part.split()) for part in blocks[0].split("→")]


def enforced_layers(source: str) -> list[set[str]]:
    """``LAYERS`` as tests/unit/test_layering.py assigns it (a literal list of sets), read with ast."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign):
            targets: list[ast.expr] = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in targets) and node.value is not None:
            return [set(layer) for layer in ast.literal_eval(node.value)]
    raise AssertionError("tests/unit/test_layering.py assigns no LAYERS")


def _defines(tree: ast.Module, dotted: str) -> bool:
    """Whether ``dotted`` (``func``, ``Class`` or ``Class.method``) is defined at module level."""
    body: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        found = next(
            (
                node
                for node in body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part
            ),
            None,
        )
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def test_the_map_lists_the_layers_the_layering_test_enforces():
    text = MAP.read_text()
    assert map_layers(text) == enforced_layers(LAYERING_TEST.read_text())


def test_the_map_fits_on_a_page():
    text = MAP.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines (at most {MAX_LINES}): rationale goes in docs/decisions/"
    assert len(text.split()) <= MAX_WORDS, f"{len(text.split())} words (at most {MAX_WORDS})"
    long = [f"line {i}: {len(line)} characters" for i, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert long == []


def test_every_code_name_in_the_map_exists():
    cited = CODE_NAME.findall(MAP.read_text())
    assert len(cited) >= 20  # the step's call chain is written with them
    trees: dict[str, ast.Module] = {}
    missing = []
    for path, dotted in cited:
        module = PACKAGE / path
        if not module.is_file():
            missing.append(f"{path} (no such module)")
            continue
        tree = trees.setdefault(path, ast.parse(module.read_text(), str(module)))
        if not _defines(tree, dotted):
            missing.append(f"{path}:{dotted}")
    assert missing == []


def test_the_maps_relative_links_resolve():
    targets = [t.split("#")[0] for t in LINK.findall(MAP.read_text()) if "://" not in t and not t.startswith("#")]
    assert [t for t in targets if not (MAP.parent / t).exists()] == []


def test_the_parsers_read_what_they_are_given():
    """The check itself: both readers on small inputs."""
    text = "# m\n\n## Layers\n\nprose\n\n```\na b → c\n→ d\n```\n\n## Next\n"
    assert map_layers(text) == [{"a", "b"}, {"c"}, {"d"}]
    assert enforced_layers('LAYERS: list[set[str]] = [{"a", "b"}, {"c"}]  # x\n') == [{"a", "b"}, {"c"}]
    tree = ast.parse("class A:\n    def f(self): ...\nasync def g(): ...\n")
    assert _defines(tree, "A.f") and _defines(tree, "g") and not _defines(tree, "A.g") and not _defines(tree, "f")
