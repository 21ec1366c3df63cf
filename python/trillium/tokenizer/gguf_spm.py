"""A ``tokenizers.Tokenizer`` for a GGUF file's SentencePiece vocabulary (``tokenizer.ggml.model``
``llama``: Llama 2, Mistral, Gemma, ...), which stores pieces and scores but no merges.

llama.cpp tokenizes such a vocabulary as SentencePiece's BPE does: spaces become ``▁`` (and the
text gets a leading ``▁`` when ``tokenizer.ggml.add_space_prefix``, true unless the file says
otherwise), characters start as symbols, and the adjacent pair whose concatenation is the
best-scored piece merges first; characters no piece covers fall back to ``<0xXX>`` byte tokens.
The leading ``▁`` goes before the text's first piece only, as Hugging Face's tokenizers do
(``Metaspace``, prepend "first"); llama.cpp also puts one after every special token, and a text
that starts with a space gets none (it already has its ``▁``).
A BPE model whose merges are every (left, right) split of every piece, ranked by the merged
piece, runs that same algorithm -- which is how tokenizers' own SentencePiece converters build it.
The rank is the piece's place in the file: SentencePiece writes pieces best first, so for Llama
and Mistral files that is the score order, and Gemma files, whose scores do not follow the merge
order (whitespace runs), need it (Hugging Face reads them so too).
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from trillium.tokenizer.gguf_vocab import END_OF_TURN_TOKENS

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6
SPACE = "\u2581"


def spm_merges(tokens: list[str], mergeable: list[bool]) -> list[tuple[str, str]]:
    """Every split of every mergeable piece into two pieces of the vocabulary, earlier pieces
    first (among the splits of one piece, the longer left half first)."""
    index = {token: i for i, token in enumerate(tokens)}
    ranked: list[tuple[int, int, str, str]] = []
    for i, piece in enumerate(tokens):
        if not mergeable[i] or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                ranked.append((i, -cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_spm_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The tokenizer of a ``llama`` (SentencePiece) GGUF vocabulary: BPE over ``▁``-spelled text
    with byte fallback; control tokens special, user-defined ones added whole. A run of spaces
    stored as real spaces (Gemma's whitespace pieces) is spelled with ``▁`` like the text it matches.
    """
    raw_tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(raw_tokens))
    present = set(raw_tokens)
    # A piece stored as real spaces is looked up as the ▁ run it matches (unless that run is a piece too).
    tokens = [SPACE * len(t) if t and not t.strip(" ") and SPACE * len(t) not in present else t for t in raw_tokens]
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    vocab = {token: i for i, token in enumerate(tokens)}
    mergeable = [kind in (TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED) for kind in types]
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    model = models.BPE(
        vocab=vocab,
        merges=spm_merges(tokens, mergeable),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False
    )
    decode_steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        decode_steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decode_steps)
    special = [
        AddedToken(tok, special=True, normalized=False)
        for tok, kind in zip(tokens, types, strict=True)
        if (kind == TOKEN_TYPE_CONTROL or tok in END_OF_TURN_TOKENS) and tok
    ]
    user = [
        AddedToken(tok, special=False, normalized=False)
        for tok, kind in zip(tokens, types, strict=True)
        if kind == TOKEN_TYPE_USER_DEFINED and tok and tok not in END_OF_TURN_TOKENS
    ]
    if special:
        tokenizer.add_special_tokens(special)
    if user:
        tokenizer.add_tokens(user)
    return tokenizer
