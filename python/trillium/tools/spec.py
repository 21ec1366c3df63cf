"""What a request offers and asks for: function tools, the tool choice, and a parsed call."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

# OpenAI's rule for function names.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolSpecError(ValueError):
    """A tool definition or tool choice is malformed; ``param`` names the request field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; ``parameters`` is its arguments' JSON Schema (an object)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ToolSpecError("tools", f"function name {self.name!r} must match [A-Za-z0-9_-]{{1,64}}")
        if not isinstance(self.parameters, dict):
            raise ToolSpecError("tools", f"parameters of {self.name!r} must be a JSON Schema object")

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry, as chat templates expect it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """``none``: no calls (the tools stay out of the prompt); ``auto``: text or calls; ``required``:
    at least one call; ``function``: exactly a call of ``name``."""

    mode: Literal["none", "auto", "required", "function"] = "auto"
    name: str | None = None

    def check(self, tools: list[FunctionTool]) -> None:
        if self.mode == "function" and all(t.name != self.name for t in tools):
            raise ToolSpecError("tool_choice", f"tool_choice names {self.name!r}, which is not among the tools")
        if self.mode in ("required", "function") and not tools:
            raise ToolSpecError("tool_choice", f"tool_choice {self.mode!r} needs at least one tool")


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: ``arguments`` is the JSON text the model wrote (an object)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: new_call_id())

    def openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def arguments_object(arguments: Any, param: str) -> dict[str, Any]:
    """A history message's ``function.arguments`` (JSON text, as OpenAI sends it) as an object,
    which is what chat templates render."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolSpecError(param, f"arguments is not valid JSON: {exc}") from None
        if isinstance(value, dict):
            return value
    raise ToolSpecError(param, "arguments must be a JSON object")
