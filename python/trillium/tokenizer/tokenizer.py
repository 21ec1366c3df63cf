"""Tokenizer: text <-> ids and chat-template rendering for one model, from a GGUF or HF directory.

Thread-safe for concurrent encode/decode (``tokenizers`` releases the GIL and holds no
per-call state here); construction reads the model file once.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from trillium.tokenizer.chat_template import fallback_template, render_chat_template
from trillium.tokenizer.gguf_vocab import END_OF_TURN_TOKENS

log = logging.getLogger(__name__)

# Fill-in-the-middle special tokens: Qwen2.5-Coder's, then StarCoder's (prefix, suffix, middle).
_FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
_END_PROBE = "\x00trillium-end-probe\x00"  # assistant content used to find the template's end token


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with the model's special-token facts and chat template.

    Attributes: ``vocab_size`` (the model's embedding rows: ids are < this), ``bos_token_id``,
    ``eos_token_id``, ``eos_token_ids`` (every id that ends generation), ``pad_token_id`` (None
    when the model names none), ``chat_template``.
    """

    def __init__(
        self,
        backend: _HFTokenizer,
        *,
        vocab_size: int,
        bos_token_id: int | None,
        eos_token_id: int | None,
        extra_eos_token_ids: tuple[int, ...] = (),
        add_bos_token: bool = False,
        chat_template: str | None = None,
        pad_token_id: int | None = None,
        chat_template_fallback: bool = False,
    ) -> None:
        self._backend = backend
        # True when the file had no template and ``chat_template`` is the one its turn markers imply.
        self.chat_template_fallback = chat_template_fallback
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template
        self.bos_token = backend.id_to_token(bos_token_id) if bos_token_id is not None else None
        self.eos_token = backend.id_to_token(eos_token_id) if eos_token_id is not None else None
        eos = {i for i in (eos_token_id, *extra_eos_token_ids) if i is not None}
        end = self._template_end_token_id()
        if end is not None:
            eos.add(end)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        # (prefix, suffix, middle) ids of a fill-in-the-middle vocabulary, else None
        self.fim_token_ids = self._fim_token_ids()

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str) -> Tokenizer:
        """From ``tokenizer.ggml.*`` metadata; EOS ids are ``eos_token_id`` plus ``eot``/``eom`` if set."""
        from trillium.models.gguf_file import GGUFFile
        from trillium.tokenizer.gguf_vocab import build_gguf_tokenizer

        md = GGUFFile(path).metadata
        arch = md.get("general.architecture", "")
        tokens = md["tokenizer.ggml.tokens"]
        # Tokens that end a turn end generation, as llama.cpp treats them, even where the file names
        # no eot id (a Gemma file's <end_of_turn>) or stores them as plain tokens.
        end_of_turn = [i for i, t in enumerate(tokens) if t in END_OF_TURN_TOKENS]
        eot = [md[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in md]
        template = md.get("tokenizer.chat_template")
        fallback = template is None
        if template is None:
            template = fallback_template(set(tokens))
            if template is not None:
                log.info("%s has no chat template; using the turn format its vocabulary marks", path)
        return cls(
            build_gguf_tokenizer(md),
            vocab_size=int(md.get(f"{arch}.vocab_size") or len(tokens)),
            bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
            extra_eos_token_ids=tuple(dict.fromkeys([*eot, *end_of_turn])),
            add_bos_token=bool(md.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=template,
            pad_token_id=md.get("tokenizer.ggml.padding_token_id"),
            chat_template_fallback=fallback and template is not None,
        )

    @classmethod
    def from_hf_dir(cls, path: str) -> Tokenizer:
        """From ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``config.json``,
        ``generation_config.json`` and ``chat_template.jinja`` when present)."""
        backend = _HFTokenizer.from_file(os.path.join(path, "tokenizer.json"))
        tok_cfg = _read_json(path, "tokenizer_config.json")
        model_cfg = _read_json(path, "config.json")
        gen_cfg = _read_json(path, "generation_config.json")

        def token_id(entry: Any) -> int | None:
            content = entry.get("content") if isinstance(entry, dict) else entry
            return backend.token_to_id(content) if content else None

        bos = token_id(tok_cfg.get("bos_token"))
        if bos is None:
            bos = _first_id(model_cfg.get("bos_token_id"))
        eos_candidates = [token_id(tok_cfg.get("eos_token"))]
        for cfg in (gen_cfg, model_cfg):
            value = cfg.get("eos_token_id")
            eos_candidates += value if isinstance(value, list) else [value]
        eos_ids = [i for i in eos_candidates if i is not None]
        pad = token_id(tok_cfg.get("pad_token"))
        if pad is None:
            pad = _first_id(model_cfg.get("pad_token_id"))
        add_bos = tok_cfg.get("add_bos_token")
        if add_bos is None and bos is not None:
            # No flag: trust the tokenizer.json post-processor (Llama 3 adds BOS there).
            add_bos = backend.encode("", add_special_tokens=True).ids[:1] == [bos]
        return cls(
            backend,
            vocab_size=int(model_cfg.get("vocab_size") or backend.get_vocab_size()),
            bos_token_id=bos,
            eos_token_id=eos_ids[0] if eos_ids else None,
            extra_eos_token_ids=tuple(eos_ids[1:]),
            add_bos_token=bool(add_bos),
            chat_template=_hf_chat_template(path, tok_cfg),
            pad_token_id=pad,
        )

    # ---- text <-> ids ------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for ``text``. Special-token strings in the text map to their single ids.
        BOS is prepended only if ``add_special_tokens`` and the model asks for it (``add_bos_token``);
        chat-templated text already carries whatever BOS the template writes."""
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt in prefix-suffix-middle order, as StarCoder and Qwen2.5-Coder
        were trained (``<fim_prefix>`` prefix ``<fim_suffix>`` suffix ``<fim_middle>``, BOS first
        when the model adds one): the model writes the middle. ValueError without FIM tokens."""
        if self.fim_token_ids is None:
            raise ValueError("this model has no fill-in-the-middle tokens")
        pre, suf, mid = self.fim_token_ids
        bos = [self.bos_token_id] if self.add_bos_token and self.bos_token_id is not None else []
        return [*bos, pre, *self.encode(prefix), suf, *self.encode(suffix), mid]

    def _fim_token_ids(self) -> tuple[int, int, int] | None:
        for names in _FIM_TOKENS:
            pre, suf, mid = (self._backend.token_to_id(name) for name in names)
            if pre is not None and suf is not None and mid is not None and max(pre, suf, mid) < self.vocab_size:
                return pre, suf, mid
        return None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text for ``ids``; an incomplete UTF-8 sequence decodes to U+FFFD."""
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self._backend.id_to_token(i) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Prompt text for a conversation. Raises ValueError if the model has no chat template
        or the template rejects the messages (its ``raise_exception`` message is kept)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **extra,
        )

    def _template_end_token_id(self) -> int | None:
        """The special token the template writes right after an assistant turn (``<|im_end|>``,
        ``<|eot_id|>``, ...): the model emits it to end its answer, so it must stop generation."""
        if not self.chat_template:
            return None
        try:
            text = self.apply_chat_template(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _END_PROBE}],
                add_generation_prompt=False,
            )
        except Exception:  # a template with stricter role rules: no end token can be inferred
            return None
        _, found, after = text.partition(_END_PROBE)
        if not found:
            return None
        ids = self._backend.encode(after, add_special_tokens=False).ids
        if not ids:
            return None
        added = self._backend.get_added_tokens_decoder()
        first = added.get(ids[0])
        return ids[0] if first is not None and first.special and after.startswith(first.content) else None


def load_tokenizer(path: str) -> Tokenizer:
    """Tokenizer for a ``.gguf`` file or a HF directory (the same path the model loads from)."""
    if os.path.isdir(path):
        return Tokenizer.from_hf_dir(path)
    if path.lower().endswith(".gguf"):
        return Tokenizer.from_gguf(path)
    if os.path.basename(path) == "tokenizer.json":
        return Tokenizer.from_hf_dir(os.path.dirname(path) or ".")
    raise ValueError(f"cannot load a tokenizer from {path!r}: expected a .gguf file or a directory")


def _read_json(path: str, name: str) -> dict[str, Any]:
    full = os.path.join(path, name)
    if not os.path.exists(full):
        return {}
    with open(full, encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    return config


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    token_id: int | None = value
    return token_id


def _hf_chat_template(path: str, tok_cfg: dict[str, Any]) -> str | None:
    jinja_file = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template
