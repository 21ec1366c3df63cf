"""Sampling ranges are checked once, in ``SamplingParams``; each error names its parameter."""

from __future__ import annotations

import pytest

from trillium.protocol import SamplingParamError, SamplingParams

BAD = [
    ("max_tokens", 0),
    ("temperature", -0.1),
    ("temperature", 2.5),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", 0),
    ("top_k", -2),
    ("min_p", 1.5),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("repetition_penalty", 0.0),
    ("min_tokens", -1),
    ("stop", ["x"] * 17),
    ("stop_token_ids", [1] * 1025),
    ("seed", 2**64),
    ("seed", -(2**63) - 1),
    ("logprobs", 21),
    ("prompt_logprobs", 21),
    ("prompt_logprobs", -1),
    ("logit_bias", {5: 200.0}),
]


@pytest.mark.parametrize("param,value", BAD)
def test_out_of_range_names_the_parameter(param, value):
    with pytest.raises(SamplingParamError) as info:
        SamplingParams(**{param: value})
    assert info.value.param == param
    assert str(info.value).startswith(param)
    assert isinstance(info.value, ValueError)  # offline callers catch ValueError


def test_min_tokens_may_not_exceed_max_tokens():
    with pytest.raises(SamplingParamError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)
    SamplingParams(max_tokens=3, min_tokens=3)


def test_edges_are_accepted():
    SamplingParams(
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        seed=2**64 - 1,
        logprobs=20,
        prompt_logprobs=20,
        logit_bias={0: -100.0},
        stop=["x"] * 16,
    )
    SamplingParams(seed=-(2**63))
    SamplingParams(logprobs=0, prompt_logprobs=0)


def test_vocabulary_checks():
    SamplingParams(stop_token_ids=[0, 9], logit_bias={9: 1.0}).check_vocab(10)
    with pytest.raises(SamplingParamError) as info:
        SamplingParams(stop_token_ids=[10]).check_vocab(10)
    assert info.value.param == "stop_token_ids"
    with pytest.raises(SamplingParamError) as info:
        SamplingParams(logit_bias={-1: 1.0}).check_vocab(10)
    assert info.value.param == "logit_bias"
