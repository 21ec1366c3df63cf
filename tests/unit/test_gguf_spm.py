"""SentencePiece GGUF vocabularies (``tokenizer.ggml.model`` = ``llama``: Llama 2, Mistral, Gemma)
against Hugging Face transformers reading the same file's tokenizer.

The vocabulary is built here: byte tokens, single characters, and merged pieces with scores, in a
GGUF written with the ``gguf`` package; random texts mix covered words, characters no piece covers
(byte fallback) and special tokens.
"""

from __future__ import annotations

import random

import pytest
from gguf import GGUFWriter

from trillium.tokenizer import load_tokenizer

WORDS = ["the", "then", "there", "in", "ing", "thing", "sing", "a", "an", "and", "hand", "ers", "her", "here"]


def _vocab(rng: random.Random) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["\u2581", *"abcdefghijklmnopqrstuvwxyz"]
    merged = set()
    for word in WORDS:  # every prefix of "▁word" and of "word", so merges can build them
        for text in ("\u2581" + word, word):
            for end in range(2, len(text) + 1):
                merged.add(text[:end])
    merged_list = sorted(merged)
    rng.shuffle(merged_list)
    pieces += merged_list
    tokens += pieces
    types += [1] * len(pieces)
    # Scores fall with the position, as SentencePiece writes them (the file's order is the merge order).
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def _write(path, tokens, scores, types, add_space_prefix: bool) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.6:
            parts.append(rng.choice(WORDS))
        elif kind < 0.8:
            parts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 6))))
        elif kind < 0.9:
            parts.append(rng.choice(["café", "日本", "naïve", "😀", "Zürich"]))  # byte fallback
        else:
            parts.append("</s>")
    return rng.choice(["a", "the", "x"]) + " " + " ".join(parts)  # no leading space: see the test


def test_spm_vocabulary_matches_transformers(tmp_path) -> None:
    """Same ids as transformers' GGUF SentencePiece tokenizer, and decoding gives the text back
    (texts that do not start with a space: the prefix ``▁`` is stripped on decoding)."""
    from transformers import AutoTokenizer

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    tokens, scores, types = _vocab(rng)
    path = tmp_path / "spm.gguf"
    _write(path, tokens, scores, types, add_space_prefix=True)
    ours = load_tokenizer(str(path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    for _ in range(50):
        text = _text(rng)
        expected = theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text) == expected, f"seed {seed}: {text!r}"
        assert ours.decode(expected, skip_special_tokens=False) == text, f"seed {seed}: {text!r}"
    for text in ("  two spaces first", " one space"):
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    assert ours.encode("café")[-2:] == [tokens.index("<0xC3>"), tokens.index("<0xA9>")]  # é as UTF-8 bytes


@pytest.mark.parametrize("prefix", [True, False])
def test_space_prefix_follows_the_file(tmp_path, prefix) -> None:
    tokens, scores, types = _vocab(random.Random(0))
    _write(tmp_path / "spm.gguf", tokens, scores, types, add_space_prefix=prefix)
    ours = load_tokenizer(str(tmp_path / "spm.gguf"))
    first = ours.encode("the thing")[0]
    assert tokens[first] == ("\u2581the" if prefix else "the")
    assert ours.decode(ours.encode("the thing")) == "the thing"


@pytest.mark.parametrize("end_type", [3, 4], ids=["control", "user-defined"])
def test_turn_markers_give_a_chat_template_and_stop_generation(tmp_path, end_type) -> None:
    """A Gemma-style file without a chat template: its <start_of_turn>/<end_of_turn> tokens give
    Gemma's turn format, and <end_of_turn> ends generation as <eos> does and is never shown as
    text -- also where the file stores it as a plain user-defined token (llama.cpp corrects that)."""
    tokens, scores, types = _vocab(random.Random(0))
    tokens += ["<start_of_turn>", "<end_of_turn>"]
    scores += [0.0, 0.0]
    types += [3, end_type]
    _write(tmp_path / "turns.gguf", tokens, scores, types, add_space_prefix=False)
    ours = load_tokenizer(str(tmp_path / "turns.gguf"))
    end = tokens.index("<end_of_turn>")
    assert ours.eos_token_ids == {2, end}
    assert ours.decode([tokens.index("the"), end]) == "the"
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and then"},
    ]
    text = ours.apply_chat_template(messages, add_generation_prompt=True)
    assert text == (
        "<s><start_of_turn>user\nbe brief\n\nhi<end_of_turn>\n<start_of_turn>model\nhello<end_of_turn>\n"
        "<start_of_turn>user\nand then<end_of_turn>\n<start_of_turn>model\n"
    )
    _write(tmp_path / "plain.gguf", *_vocab(random.Random(0)), add_space_prefix=True)
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(str(tmp_path / "plain.gguf")).apply_chat_template(messages, add_generation_prompt=True)
