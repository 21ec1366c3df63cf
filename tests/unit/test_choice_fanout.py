"""ChoiceFanout without an engine: a request's choices over several prompts, and a refusal part-way;
ResponseShape's trillium extensions on a closed choice."""

from __future__ import annotations

import pytest
import trio

from trillium.engine_client import EngineOverloaded, StreamOutput
from trillium.protocol import FinishReason
from trillium.server.openai_shapes import ChoiceFanout


class FakeStream:
    def __init__(self, i: int, outputs: int = 2) -> None:
        self.i = i
        self.left = outputs
        self.aborted = False
        self.num_prompt_tokens, self.num_completion_tokens, self.num_cached_tokens = 10 + i, 0, i

    async def __anext__(self) -> StreamOutput:
        self.left -= 1
        self.num_completion_tokens += 1
        return StreamOutput(f"{self.i}", [self.i], FinishReason.LENGTH if self.left == 0 else None)

    def abort(self) -> None:
        self.aborted = True


def test_choices_of_several_prompts_in_order():
    opened: list[FakeStream] = []

    def open_choice(i: int) -> FakeStream:
        opened.append(FakeStream(i))
        return opened[-1]

    fanout = ChoiceFanout(open_choice, n=2, num_prompts=3)  # type: ignore[arg-type]
    assert [s.i for s in opened] == [0, 2, 4]  # each prompt's first choice; siblings after its first delta

    async def read() -> dict[int, str]:
        texts: dict[int, str] = {}
        while (item := await fanout.next()) is not None:
            texts[item[0]] = texts.get(item[0], "") + item[1].text
        return texts

    assert trio.run(read) == {i: f"{i}{i}" for i in range(6)}
    assert sorted(s.i for s in opened) == list(range(6)) and fanout.n == 6
    usage = fanout.usage()
    assert usage["prompt_tokens"] == 10 + 12 + 14  # the prompts' first choices
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens_details"]["cached_tokens_per_choice"] == list(range(6))


def test_a_refusal_part_way_aborts_what_was_opened():
    opened: list[FakeStream] = []

    def open_choice(i: int) -> FakeStream:
        if i == 4:
            raise EngineOverloaded("queue full")
        opened.append(FakeStream(i))
        return opened[-1]

    with pytest.raises(EngineOverloaded):
        ChoiceFanout(open_choice, n=2, num_prompts=3)  # type: ignore[arg-type]
    assert [s.aborted for s in opened] == [True, True]


@pytest.mark.parametrize("chat", [True, False])
def test_a_closed_choice_that_fails_a_check_says_so_in_both_shapes(chat):
    """``closed_early`` and ``unsatisfied_check`` (trillium's extensions) on the choices they
    concern only, whole and streamed."""
    from trillium.server.openai_shapes import ResponseShape

    shape = ResponseShape("r", "m", chat)
    body = shape.full(
        [("[1]", "length", None), ("[2]", "length", None), ("[3]", "stop", None)],
        {},
        closed_early=frozenset({0, 1}),
        unsatisfied_checks={1: "uniqueItems: a duplicate item"},
    )
    first, second, third = body["choices"]
    assert first["closed_early"] is True and "unsatisfied_check" not in first
    assert second["closed_early"] is True and second["unsatisfied_check"] == "uniqueItems: a duplicate item"
    assert "closed_early" not in third and "unsatisfied_check" not in third
    (last,) = shape.chunk(1, "]", "length", closed_early=True, unsatisfied_check="x")["choices"]
    assert last["closed_early"] is True and last["unsatisfied_check"] == "x"
    (plain,) = shape.chunk(0, "[", None)["choices"]
    assert "closed_early" not in plain and "unsatisfied_check" not in plain
