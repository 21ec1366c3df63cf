"""Which tool-call format a model speaks, read from its chat template.

- ``hermes`` (Hermes, Qwen2/2.5/3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call; tool results come back in ``<tool_response>`` blocks.
- ``llama3_json`` (Llama 3.1+): a bare ``{"name": ..., "parameters": {...}}`` object (after
  ``<|python_tag|>`` on some versions), several separated by ``;``.

A template that renders ``tools`` itself and writes one of these formats is ``native``: the request's
tools and tool messages go to it as they are. Any other template (the default model's has no tools
section) gets the fallback: the tools are described in the system prompt (``prompt.py``), the model
is asked for Hermes blocks, and tool messages are rendered as user turns of ``<tool_response>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ToolFormat:
    name: Literal["hermes", "llama3_json"]
    native: bool  # the chat template renders tools and tool messages itself


FALLBACK = ToolFormat("hermes", native=False)


def tool_format(chat_template: str | None) -> ToolFormat:
    """The format of a model with this chat template (see the module docstring)."""
    source = chat_template or ""
    if "tools" not in source:
        return FALLBACK
    if "<tool_call>" in source:
        return ToolFormat("hermes", native=True)
    if "<|python_tag|>" in source or "ipython" in source:
        return ToolFormat("llama3_json", native=True)
    return FALLBACK  # a tools section in a format we do not parse: describe the tools ourselves
