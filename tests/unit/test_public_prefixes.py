"""Declared public prefixes: how many of a prompt's leading tokens one covers, as plain text and
as the chat template's system message, with the real tokenizer."""

from __future__ import annotations

import array
import random

from trillium.server.public_prefixes import PublicPrefixes, _common_len

PUBLIC = "You are a careful assistant. Answer in one sentence."


def test_a_completion_prompt_shares_the_texts_tokens_and_no_more(tok):
    prefixes = PublicPrefixes(tok)
    public_ids = tok.encode(PUBLIC)
    prompt = tok.encode(PUBLIC + "\nMy secret is 1234.")
    covered = prefixes.num_public_tokens((PUBLIC,), prompt)
    assert len(public_ids) - 1 <= covered <= len(public_ids)  # the last token may merge with what follows
    assert prompt[:covered] == public_ids[:covered]
    assert prefixes.num_public_tokens((), prompt) == 0
    assert prefixes.num_public_tokens(("Something else entirely.",), prompt) < 3


def test_a_chat_whose_system_message_is_the_text_shares_the_whole_system_turn(tok):
    prefixes = PublicPrefixes(tok)
    messages = [{"role": "system", "content": PUBLIC}, {"role": "user", "content": "My secret is 1234."}]
    prompt = tok.encode(tok.apply_chat_template(messages))
    system = tok.encode(tok.apply_chat_template(messages[:1], add_generation_prompt=False))
    covered = prefixes.num_public_tokens((PUBLIC,), prompt)
    assert covered == len(system) and prompt[:covered] == system
    # Another system message: only the template's opening tokens agree.
    other = tok.encode(tok.apply_chat_template([{"role": "system", "content": "Be terse."}, messages[1]]))
    assert prefixes.num_public_tokens((PUBLIC,), other) < 5
    # The texts in force change (a config reload): the new ones count.
    assert prefixes.num_public_tokens(("Be terse.",), other) > 5


def test_the_shared_length_matches_a_plain_scan_on_random_sequences(random_seed):
    rng = random.Random(random_seed)
    for _ in range(500):
        a = [rng.randint(-2, 3) for _ in range(rng.randint(0, 40))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(-2, 3) for _ in range(rng.randint(0, 6))]
        want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert _common_len(array.array("i", a).tobytes(), array.array("i", b).tobytes()) == want
