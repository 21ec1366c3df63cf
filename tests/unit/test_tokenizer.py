"""Tokenizer built from GGUF metadata vs Hugging Face's tokenizer for the same file."""

from __future__ import annotations

import random

import pytest

from trillium.models import default_model_path
from trillium.tokenizer import Tokenizer, load_tokenizer

pytestmark = pytest.mark.slow

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x**2  # square\n\n\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "3.14159 1,000,000 2024-01-01 a 12 ab123cd 0x1F 007",
    "tabs\t\there   and    spaces  ",
    "  leading spaces",
    "trailing   ",
    "\n\n\n",
    "   \n  \t \r\n x",
    "naïve café résumé Ünïcödé",
    "日本語のテキストと中文文本",
    "😀🎉👨‍👩‍👧‍👦 emoji 🇫🇷",
    "Привет мир",
    "مرحبا بالعالم",
    "I'm don't they'll We'VE",
    "<b>html</b> &amp; <|not_special|>",
    "\u00a0nbsp\u2009thin",
    "a" * 64,
]

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And in words? Answer briefly 😀."},
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def hf_tok(hf_reference_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_reference_dir)


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = (
        [chr(c) for c in range(32, 127)] * 4
        + [chr(c) for c in range(0xA0, 0x250)]
        + [chr(c) for c in range(0x4E00, 0x4E80)]
        + [chr(0x1F600 + i) for i in range(50)]
        + ["\n", "\t", "  ", "   ", "0", "1", "9"]
    )
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def test_metadata_facts(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1
    assert tok.eos_token_id == 2
    assert tok.eos_token_ids == frozenset({2})  # <|im_end|>: metadata EOS and the template's end token
    assert tok.add_bos_token is False


@pytest.mark.parametrize("text", [*CORPUS, "".join(CORPUS)])
def test_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_encode_to_single_ids(tok: Tokenizer) -> None:
    for token in SPECIAL:
        (token_id,) = tok.encode(token)
        assert tok.convert_ids_to_tokens([token_id]) == [token]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids) == "user\nhi\n"  # specials skipped by default
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_no_bos_added_for_this_model(tok: Tokenizer) -> None:
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")


def test_matches_hf_ids(tok: Tokenizer, hf_tok) -> None:
    texts = CORPUS + SPECIAL + _random_texts(300)
    mismatches = [t for t in texts if tok.encode(t) != hf_tok.encode(t, add_special_tokens=False)]
    assert mismatches == []


def test_non_ascii_digits_split_like_llama_cpp(tok: Tokenizer, hf_tok) -> None:
    """The file's pre-tokenizer is "smollm": digits split one by one (\\p{N}), as in llama.cpp and
    SmolLM2's own tokenizer.json (Digits(individual_digits=True) + ByteLevel). HF's GGUF loader
    ignores that name and uses plain GPT-2 rules; the two differ only when a non-ASCII digit
    (``²``, ``٣``) follows a space. With the real pre-tokenizer HF agrees with us exactly."""
    from tokenizers import pre_tokenizers

    texts = ["½ ² ³", "١٢٣ ٤٥", "x ² + y ³ = 10 ٣"]
    backend = hf_tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    for text in texts + CORPUS + _random_texts(100, seed=1):
        assert tok.encode(text) == backend.encode(text, add_special_tokens=False).ids, text


@pytest.mark.parametrize("with_system", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_hf(tok: Tokenizer, hf_tok, with_system: bool, add_generation_prompt: bool) -> None:
    messages = ([{"role": "system", "content": "You are terse."}] if with_system else []) + CONVERSATION
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert ours == theirs
    assert tok.encode(ours) == hf_tok.encode(theirs, add_special_tokens=False)
    if add_generation_prompt:
        assert ours.endswith("<|im_start|>assistant\n")


def test_hf_dir_tokenizer_agrees_with_gguf(tok: Tokenizer, hf_reference_dir) -> None:
    from_dir = load_tokenizer(str(hf_reference_dir))
    assert (from_dir.bos_token_id, from_dir.eos_token_ids) == (tok.bos_token_id, tok.eos_token_ids)
    assert from_dir.apply_chat_template(CONVERSATION) == tok.apply_chat_template(CONVERSATION)
    for text in CORPUS[:8] + SPECIAL:  # ASCII digits only: the saved tokenizer.json has HF's GPT-2 rules
        assert from_dir.encode(text) == tok.encode(text)


def test_template_errors_are_value_errors(tok: Tokenizer) -> None:
    template = "{{ raise_exception('roles must alternate') }}"
    broken = Tokenizer(tok._backend, vocab_size=tok.vocab_size, bos_token_id=1, eos_token_id=2, chat_template=template)
    with pytest.raises(ValueError, match="roles must alternate"):
        broken.apply_chat_template(CONVERSATION)


def test_fill_in_the_middle_prompt() -> None:
    """A vocabulary with FIM tokens (Qwen2.5-Coder's names) builds prefix-suffix-middle prompts;
    the default model's has none, so it refuses (the server answers a suffix with a 400)."""
    import trio
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from trillium.protocol.messages import TokenizeRequest
    from trillium.tokenizer.actor import TokenizerActor

    words = ["def", "f", "(", ")", ":", "return", "x", "<unk>"]
    backend = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    fim = Tokenizer(backend, vocab_size=backend.get_vocab_size(), bos_token_id=None, eos_token_id=None)
    assert fim.fim_token_ids == (8, 9, 10)
    assert fim.fim_prompt("def f ( ) :", "return x") == [8, 0, 1, 2, 3, 4, 9, 5, 6, 10]
    actor = TokenizerActor(fim, trio.open_memory_channel(1)[1])
    assert actor.encode(TokenizeRequest(prompt="def f ( ) :", suffix="return x")) == fim.fim_prompt(
        "def f ( ) :", "return x"
    )
    default = load_tokenizer(default_model_path())
    assert default.fim_token_ids is None
    with pytest.raises(ValueError, match="fill-in-the-middle"):
        default.fim_prompt("a", "b")
