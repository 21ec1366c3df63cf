"""``$ref`` beside other keywords, where llguidance cannot intersect them: a definition per site.

Since draft 2019-09 the keywords beside a ``$ref`` apply in addition to the schema it references
(an ``allOf`` of the two), and an ``allOf`` intersects its branches in every draft. llguidance
intersects a ``$ref`` only with a definition it has finished, so it refuses ("circular references
with sibling keys") a site inside the loop of a recursive definition::

    "node": {"properties": {"kids": {"items": {"$ref": "#/$defs/node", "required": ["id"]}}}}
                                              ^ a site: node intersected while node is defined

A site is a schema that intersects a ``$ref`` with other keywords: its own ``$ref`` beside them,
or a branch of its ``allOf`` that is a ``$ref`` (of its ``anyOf``/``oneOf`` too: llguidance
distributes their siblings over the branches). A :class:`RefSplitter` gives such a site a
definition of its own, in the grammar document's root ``$defs``: the referenced schema's grammar
form inlined and intersected with the site's other keywords; the site becomes a plain ``$ref`` to
it. Inside the inlined copy the site is that plain
``$ref`` again, so the loop closes over the new definition, which llguidance defines without an
intersection in flight. Exact: the grammar accepts what the original accepts. Only for the targets
llguidance named (``split_refs``, learned from its errors), and only in documents whose
subschemas carry no ``$id`` or anchor (an inlined copy would move them, or read its relative
references against another base).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trillium.structured.formats import format_constraint

Resolver = Any  # a referencing Resolver
Lookup = Callable[[str, Resolver], tuple[Any, Resolver] | None]

# Keywords that name or hold subschemas but constrain nothing themselves.
IDENTITY_WORDS = ("$id", "id", "$schema", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$defs", "definitions")
_MOVABLE_BLOCKERS = frozenset({"$id", "$anchor", "$dynamicAnchor", "$recursiveAnchor"})
NAME_PREFIX = "trillium-ref-"  # the definitions made here: "#/$defs/trillium-ref-N"


def constrains(word: str, value: Any, keywords: frozenset[str]) -> bool:
    """Whether keyword ``word`` of a draft with ``keywords`` constrains its instance beside a
    ``$ref`` (annotations, identity words and formats the server ignores do not)."""
    if word == "$ref" or word not in keywords:
        return False
    return word != "format" or bool(format_constraint(value))


def movable(schema: dict[str, Any]) -> bool:
    """Whether subschemas of ``schema`` may be copied elsewhere in the document: no dict below the
    root has an ``$id`` or an anchor (data included: a false alarm only forgoes splitting)."""
    stack: list[Any] = [value for key, value in schema.items() if key not in ("$id", "id")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if not _MOVABLE_BLOCKERS.isdisjoint(node):
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def intersected_ref(
    schema: dict[str, Any], keywords: frozenset[str], wanted: Callable[[str], bool]
) -> tuple[str, dict[str, Any] | None] | None:
    """Where ``schema`` intersects a ``$ref`` that ``wanted`` accepts with other keywords:
    ("$ref", None) for its own; (word, branch) for a branch of its ``allOf``/``anyOf``/``oneOf``
    that is a ``$ref`` alone (llguidance distributes the siblings of an ``anyOf`` over its
    branches); None if nowhere."""
    others = [word for word, value in schema.items() if constrains(word, value, keywords)]
    ref = schema.get("$ref")
    if isinstance(ref, str) and wanted(ref) and others:
        return "$ref", None
    for word in ("allOf", "anyOf", "oneOf"):
        branches = schema.get(word)
        if not isinstance(branches, list):
            continue
        if others == [word] and (word != "allOf" or len(branches) < 2):
            continue  # nothing is intersected with the branches
        for branch in branches:
            ref = branch.get("$ref") if isinstance(branch, dict) else None
            if isinstance(ref, str) and wanted(ref) and not any(constrains(w, v, keywords) for w, v in branch.items()):
                return word, branch
    return None


class RefSplitter:
    """The sites of one relaxing pass and their definitions (module docstring).

    ``split_refs``: the ``$ref`` values (as written) whose sites get a definition. ``lookup``
    resolves a ``$ref`` in a resolver's scope. ``taken``: the names the root's ``$defs`` already
    uses. Not thread-safe; one per pass."""

    def __init__(self, split_refs: set[str], keywords: frozenset[str], lookup: Lookup, taken: set[str]) -> None:
        self._split_refs = split_refs
        self._keywords = keywords
        self._lookup = lookup
        self._taken = set(taken)
        self.origin: dict[str, str] = {}  # "#/$defs/<name>" -> the $ref its site intersected
        # (name, the site's grammar form, the word holding the $ref, its branch's grammar form, ...)
        self._pending: list[tuple[str, dict[str, Any], str, Any, str, Resolver]] = []
        self._num_made = 0

    def site(self, schema: dict[str, Any], resolver: Resolver) -> tuple[str, dict[str, Any] | None] | None:
        """:func:`intersected_ref` for the references to split (that resolve), or None."""
        if not self._split_refs:
            return None
        return intersected_ref(
            schema, self._keywords, lambda ref: ref in self._split_refs and self._lookup(ref, resolver) is not None
        )

    def placeholder(
        self, out: dict[str, Any], site: tuple[str, dict[str, Any] | None], relaxed_branch: Any, resolver: Resolver
    ) -> dict[str, Any]:
        """The grammar form of a site (``site`` from :meth:`site`) whose own grammar form is
        ``out``: its identity words and a ``$ref`` to the definition :meth:`definitions` will
        make of ``out``. ``relaxed_branch``: the grammar form of the branch holding the ``$ref``
        (None for the site's own)."""
        while f"{NAME_PREFIX}{self._num_made}" in self._taken:
            self._num_made += 1
        name = f"{NAME_PREFIX}{self._num_made}"
        self._num_made += 1
        pointer = f"#/$defs/{name}"
        word, branch = site
        ref = out["$ref"] if branch is None else branch["$ref"]
        self.origin[pointer] = ref
        self._pending.append((name, out, word, relaxed_branch, ref, resolver))
        kept = {key: value for key, value in out.items() if key in IDENTITY_WORDS}
        return {**kept, "$ref": pointer}

    def definitions(self, relax: Callable[[Any, Resolver], Any]) -> dict[str, Any]:
        """The definitions of the sites met since the last call (name -> grammar schema).
        ``relax`` gives a referenced schema's grammar form (it may meet new sites: call again
        until this returns nothing)."""
        made: dict[str, Any] = {}
        while self._pending:
            name, out, word, relaxed_branch, ref, resolver = self._pending.pop()
            found = self._lookup(ref, resolver)
            assert found is not None  # site() resolved it
            target = relax(*found)
            if isinstance(target, dict):
                target = {key: value for key, value in target.items() if key not in IDENTITY_WORDS}
            rest = {key: value for key, value in out.items() if key not in IDENTITY_WORDS}
            branches = rest.get(word, []) if word != "$ref" else []
            if any(branch is relaxed_branch for branch in branches):
                rest[word] = [target if branch is relaxed_branch else branch for branch in branches]
            else:  # the site's own $ref, or an allOf branch trimmed from the grammar
                assert word in ("$ref", "allOf"), word
                if word == "$ref":
                    del rest["$ref"]
                rest["allOf"] = [target, *rest.get("allOf", [])]
            made[name] = rest
        return made
