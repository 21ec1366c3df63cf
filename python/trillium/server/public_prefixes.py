"""Declared public prefixes (``[prefix_cache] public_prefixes``) as token ids, and how many of a
prompt's leading tokens one of them covers.

A public prefix is cached once for every tenant (scheduler/kv_manager.py): only the tokens a
prompt has in common with a public text's tokens are ever put in that shared cache, so what it
holds is public by declaration. Each text is matched in the forms a prompt starts with it: as
plain text (completions; with and without the model's BOS) and as the chat template's system
message (chat).
"""

from __future__ import annotations

import array

from trillium.tokenizer import Tokenizer


class PublicPrefixes:
    """The token forms of the texts in force. Event loop only: the texts are tokenized when they
    change (at the first request after a config load or reload; system prompts, a few ms)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: tuple[str, ...] = ()
        self._forms: list[bytes] = []  # each form's token ids as int32 bytes

    def num_public_tokens(self, texts: tuple[str, ...], prompt: list[int]) -> int:
        """The longest run of ``prompt``'s leading tokens that one form of one of ``texts`` also
        starts with (0 when ``texts`` is empty)."""
        if texts != self._texts:
            self._forms = [array.array("i", form).tobytes() for text in texts for form in self._token_forms(text)]
            self._texts = texts
        if not self._forms:
            return 0
        ids = array.array("i", prompt).tobytes()
        return max(_common_len(form, ids) for form in self._forms)

    def _token_forms(self, text: str) -> list[list[int]]:
        tokenizer = self._tokenizer
        forms = [tokenizer.encode(text), tokenizer.encode(text, add_special_tokens=True)]
        if tokenizer.chat_template:
            try:
                system = tokenizer.apply_chat_template(
                    [{"role": "system", "content": text}], add_generation_prompt=False
                )
            except ValueError:  # a template that refuses a lone system message
                pass
            else:
                forms.append(tokenizer.encode(system))
        return [form for i, form in enumerate(forms) if form and form not in forms[:i]]


def _common_len(a: bytes, b: bytes) -> int:
    """How many leading int32 token ids ``a`` and ``b`` share: a binary search over slice
    comparisons, each at memcmp speed (a per-token Python loop over a long public text and a
    batch of prompts would hold the event loop for a noticeable time)."""
    lo, hi = 0, min(len(a), len(b)) // 4  # a[:4 * lo] == b[:4 * lo] holds; past hi it cannot
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: 4 * mid] == b[: 4 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
