"""Fixtures shared by the unit tests: the default model's tokenizer and a grammar compiler over it
(one each per test module, so that a module's cache counts are its own)."""

from __future__ import annotations

import pytest

from trillium.models import default_model_path
from trillium.structured import GrammarCompiler, build_ll_tokenizer
from trillium.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(build_ll_tokenizer(tok, tok.vocab_size))
