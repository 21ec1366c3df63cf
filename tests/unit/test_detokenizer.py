"""IncrementalDetokenizer: streamed text never breaks a character and adds up to the full decode."""

from __future__ import annotations

import random

import pytest

from trillium.models import default_model_path
from trillium.tokenizer import IncrementalDetokenizer, Tokenizer, load_tokenizer

TEXTS = [
    "Hello 😀🎉 world 👨‍👩‍👧‍👦!",
    "日本語のテキストと中文文本，还有标点。",
    "naïve café — “quotes” ½ ² ³ 🇫🇷🇯🇵",
    "mixed: abc 123 Привет 😀 مرحبا\n\tend",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(default_model_path())


def _stream(tok: Tokenizer, ids: list[int], chunk_sizes, skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    pieces, i = [], 0
    for size in chunk_sizes:
        if i >= len(ids):
            break
        pieces.append(detok.add(ids[i : i + size]))
        i += size
    if i < len(ids):
        pieces.append(detok.add(ids[i:]))
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_never_yields_partial_characters(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    # The point of the test: these texts split characters across byte-level tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    pieces = _stream(tok, ids, [1] * len(ids))
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == text


@pytest.mark.parametrize("seed", range(3))
def test_uneven_chunks_add_up(tok: Tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(TEXTS)
    ids = tok.encode("<|im_start|>assistant\n" + text + "<|im_end|>")
    sizes = [rng.randint(0, 4) for _ in range(len(ids))]
    for skip in (True, False):
        pieces = _stream(tok, ids, sizes, skip=skip)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
        assert all(not p.endswith("\ufffd") for p in pieces[:-1])


@pytest.mark.parametrize("seed", range(5))
def test_random_token_sequences_match_full_decode(tok: Tokenizer, seed: int) -> None:
    """Arbitrary ids, including lone UTF-8 continuation bytes that never complete."""
    rng = random.Random(seed)
    ids = [rng.randrange(tok.vocab_size) for _ in range(300)]
    ids += tok.encode(TEXTS[seed % len(TEXTS)])
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == tok.decode(ids)


def test_held_bytes_are_released_by_flush(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # a 4-byte character spread over byte tokens
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.flush() == tok.decode(ids[:1])  # the incomplete character, as full decode shows it


def test_window_stays_small(tok: Tokenizer) -> None:
    """Cost per token is O(1): the decoded window never grows with the stream length."""
    ids = tok.encode(" ".join(TEXTS) * 20)
    detok = IncrementalDetokenizer(tok)
    widest = 0
    for i in ids:
        detok.add([i])
        widest = max(widest, len(detok.token_ids) - detok._prefix_offset)
    assert widest <= 8
