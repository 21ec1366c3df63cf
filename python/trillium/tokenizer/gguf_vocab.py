"""Build a ``tokenizers.Tokenizer`` from a GGUF file's ``tokenizer.ggml.*`` metadata.

A GGUF carries no tokenizer.json: only the vocabulary, merges, token types and the name of the
pre-tokenizer (``tokenizer.ggml.pre``). The split rules per pre-tokenizer name follow llama.cpp's
``llama-vocab.cpp`` (the reference for what the file means).
"""

from __future__ import annotations

import logging
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger(__name__)

TOKEN_TYPE_CONTROL = 3  # llama.cpp token attribute: special tokens such as <|im_end|>
TOKEN_TYPE_USER_DEFINED = 4  # added tokens matched whole in text but not special

# Tokens whose only job is to end a turn: special (never shown as text) and an end of generation
# whatever type the file gives them -- llama.cpp corrects files that store them as plain tokens.
END_OF_TURN_TOKENS = frozenset({"<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>"})

# The trailing "|\s+" (HF's ByteLevel regex; llama.cpp omits it) changes nothing under an
# "isolated" split, which keeps unmatched text as its own piece anyway.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> regexes applied in order (each an "isolated" split), as llama.cpp does.
_PRE_SPLITS: dict[str, list[str]] = {
    "default": [_GPT2],
    "gpt-2": [_GPT2],
    "gpt2": [_GPT2],
    # Digits one by one, then the GPT-2 rules (SmolLM's tokenizer.json: Digits + ByteLevel).
    **{name: [r"\p{N}", _GPT2] for name in ("smollm", "starcoder", "refact", "command-r", "codeshell")},
    **{name: [_LLAMA3] for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3")},
    **{name: [_QWEN2] for name in ("qwen2", "deepseek-r1-qwen")},
}


def byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """Split rules for ``tokenizer.ggml.pre`` followed by the byte-to-unicode mapping."""
    if pre not in _PRE_SPLITS:
        log.warning("unknown GGUF pre-tokenizer %r; using the GPT-2 split rules (as llama.cpp does)", pre)
    splits = _PRE_SPLITS.get(pre or "default", _PRE_SPLITS["default"])
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in splits
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def build_gguf_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The tokenizer of a GGUF vocabulary. Byte-level BPE from ``tokenizer.ggml.{model,pre,tokens,merges,token_type}``.

    Control tokens (type 3) are added as special tokens and user-defined ones (type 4) as
    plain added tokens, so both encode to their single ids when they appear in text.
    A ``llama`` (SentencePiece) vocabulary goes to :func:`gguf_spm.build_spm_tokenizer`. Raises
    ValueError for other tokenizer models.
    """
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        from trillium.tokenizer.gguf_spm import build_spm_tokenizer

        return build_spm_tokenizer(metadata)
    if kind != "gpt2":
        raise ValueError(
            f"unsupported GGUF tokenizer model {kind!r}; supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)"
        )
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges_raw: list[str] = metadata.get("tokenizer.ggml.merges") or []
    if not merges_raw:
        raise ValueError("GGUF byte-level BPE vocabulary has no tokenizer.ggml.merges")
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)

    alphabet = _byte_alphabet()
    allowed = set(alphabet.values())
    # A few converters store tokens as raw text instead of the byte alphabet; re-spell those.
    spelled = [t if set(t) <= allowed else "".join(alphabet[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {token: index for index, token in enumerate(spelled)}
    merges = [(left, right) for left, right in (m.split(" ", 1) for m in merges_raw)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = byte_level_pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()

    special = [
        AddedToken(tok, special=True, normalized=False)
        for tok, kind in zip(tokens, token_types)
        if (kind == TOKEN_TYPE_CONTROL or tok in END_OF_TURN_TOKENS) and set(tok) <= allowed
    ]
    user = [
        AddedToken(tok, special=False, normalized=False)
        for tok, kind in zip(tokens, token_types)
        if kind == TOKEN_TYPE_USER_DEFINED and tok in vocab and tok not in END_OF_TURN_TOKENS
    ]
    if special:
        tokenizer.add_special_tokens(special)
    if user:
        tokenizer.add_tokens(user)
    return tokenizer
