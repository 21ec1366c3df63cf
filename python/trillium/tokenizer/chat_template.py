"""Render a model's Jinja chat template the way Hugging Face ``apply_chat_template`` does.

Templates come from model files, i.e. they are untrusted code: they run in jinja2's immutable
sandbox. The environment matches HF's (trim_blocks, lstrip_blocks, loopcontrols, ``tojson``
without HTML escaping, ``raise_exception``, ``strftime_now``) so rendered prompts are identical.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Templates for files that carry none, by the vocabulary's turn markers: a Gemma GGUF converted
# without its template still has <start_of_turn>/<end_of_turn>, and Gemma was trained on this
# format (a system message goes before the first user turn's text, as Gemma's own template does).
GEMMA_TURNS = (
    "{{ bos_token }}"
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{%- if loop.first and system -%}{{ system | trim + '\\n\\n' }}{%- endif -%}"
    "{{ message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def fallback_template(vocabulary: set[str]) -> str | None:
    """A chat template for a model file without one, from the turn markers its vocabulary has
    (None when it has no known ones)."""
    if {"<start_of_turn>", "<end_of_turn>"} <= vocabulary:
        return GEMMA_TURNS
    return None


class ChatTemplateError(ValueError):
    """The template rejected the conversation (``raise_exception``) or failed to render."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in tojson HTML-escapes <, >, & and ', which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per distinct template source (compiling costs milliseconds, rendering microseconds)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str | None,
    eos_token: str | None,
    **extra: Any,
) -> str:
    """The prompt text for ``messages``; ``extra`` (e.g. ``tools``) is passed to the template as is.

    Raises ChatTemplateError with the template's own message when it rejects the input.
    """
    try:
        return compile_template(source).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **extra,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template error: {exc}") from exc
