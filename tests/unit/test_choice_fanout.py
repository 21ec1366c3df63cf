"""ChoiceFanout without an engine: a request's choices over several prompts, and a refusal part-way."""

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
