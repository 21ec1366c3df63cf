"""Draft-model speculation end to end on the default model: lossless whatever the draft.

Two drafts: the default model itself (it agrees with the target: nearly every draft accepted),
and an honest weaker one, the same GGUF file with its last two decoder layers dropped (written
here with the ``gguf`` package: same tokenizer, different predictions, so drafts are rejected).
Greedy outputs must be token-identical to decoding without speculation, seeded sampled outputs too
(a seeded draft is drawn at the target's own number for its position and verified as a point
mass), and after a run with aborts and preemption no block may be left in either KV pool.
"""

from __future__ import annotations

import re
import types

import pytest
import trio

from tests.integration.conftest import ServerProcess
from tests.integration.test_hf_parity import CHAT, RAW
from tests.integration.test_speculative_e2e import COPY
from trillium import LLM, SamplingParams
from trillium.models import default_model_path

pytestmark = pytest.mark.slow

K = 4


def write_gguf_variant(src: str, dst: str, *, num_layers: int | None = None, metadata: dict | None = None) -> None:
    """A copy of the GGUF file ``src`` at ``dst`` with only its first ``num_layers`` decoder layers
    (None: all of them) and the metadata in ``metadata`` ({key: (value, GGUFValueType)}) replaced;
    every tensor kept is copied as stored (quantized blocks and all)."""
    import gguf

    reader = gguf.GGUFReader(src, "r")
    arch = reader.get_field("general.architecture").contents()
    metadata = dict(metadata or {})
    if num_layers is not None:
        metadata[f"{arch}.block_count"] = (num_layers, gguf.GGUFValueType.UINT32)
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name in metadata:
            value, value_type = metadata.pop(field.name)
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    for key, (value, value_type) in metadata.items():
        writer.add_key_value(key, value, value_type)

    def kept(name: str) -> bool:
        layer = re.match(r"blk\.(\d+)\.", name)
        return num_layers is None or layer is None or int(layer.group(1)) < num_layers

    tensors = [t for t in reader.tensors if kept(t.name)]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


def draft_config(model: str, **extra: object) -> dict:
    return {"method": "draft", "model": model, "num_speculative_tokens": K, "disable_by_batch_size": 8, **extra}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """plain: no speculation; itself: the default model drafts for itself; shallow: the 28-layer
    copy drafts, with small KV pools (its draft pool fills up, the target's preempts)."""
    path = default_model_path()
    shallow_path = str(tmp_path_factory.mktemp("draft") / "smollm2-28-layers.gguf")
    write_gguf_variant(path, shallow_path, num_layers=28)
    llms = types.SimpleNamespace(
        plain=LLM(progress=False, speculative_config=None),
        itself=LLM(progress=False, speculative_config=draft_config(path)),
        shallow=LLM(
            progress=False,
            kv_cache_gib=0.02,
            speculative_config=draft_config(shallow_path, draft_kv_cache_gib=0.006),
        ),
    )
    yield llms
    for llm in vars(llms).values():
        llm.engine.close()


def pools_back(llm: LLM) -> bool:
    """Every block of the target's pool free or cached, every block of the draft's pool free."""
    kv = llm.engine.scheduler.policy.kv
    kv.check_invariants()
    drafter = llm.engine.runner.drafter
    drafter.check_invariants()
    return kv.num_reclaimable_blocks == kv.num_total_blocks and drafter.num_free_blocks == drafter.num_total_blocks


def counts(llm: LLM) -> tuple[int, int]:
    stats = llm.engine.scheduler.policy.spec_stats
    return stats.num_draft_tokens, stats.num_accepted_tokens


def greedy_outputs_match(plain: LLM, spec: LLM) -> tuple[int, int]:
    """Greedy outputs of RAW + COPY (batched, then the last alone) and CHAT equal plain
    decoding's; returns the (draft tokens, accepted) they took."""
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = RAW + COPY
    want = [o.token_ids for o in plain.generate(prompts, params)]
    want_chat = [o.token_ids for o in plain.chat(CHAT, params)]
    drafted, accepted = counts(spec)
    for batch in (prompts, prompts[-1:]):
        assert [o.token_ids for o in spec.generate(batch, params)] == want[len(prompts) - len(batch) :]
    assert [o.token_ids for o in spec.chat(CHAT, params)] == want_chat
    assert pools_back(spec)
    return counts(spec)[0] - drafted, counts(spec)[1] - accepted


def test_the_model_as_its_own_draft_is_token_identical_and_nearly_always_accepted(engines) -> None:
    drafted, accepted = greedy_outputs_match(engines.plain, engines.itself)
    assert drafted > 100 and accepted >= 0.9 * drafted, (drafted, accepted)


def test_a_weaker_draft_is_still_token_identical_and_some_drafts_are_rejected(engines) -> None:
    short_before = engines.shallow.engine.runner.drafter.num_short
    drafted, accepted = greedy_outputs_match(engines.plain, engines.shallow)
    assert 0 < accepted < drafted, (drafted, accepted)
    assert engines.shallow.engine.runner.drafter.num_short > short_before  # its small pool ran full


@pytest.mark.parametrize("draft", ["itself", "shallow"])
def test_seeded_sampling_equals_plain_decoding_and_unseeded_sampling_speculates(engines, draft) -> None:
    """A seeded request's drafts are drawn at the target's own numbers and kept only where they
    equal the target's draws: its text is plain decoding's, alone or batched, every time. An
    unseeded request is verified by rejection sampling against the draft's distribution."""
    spec = getattr(engines, draft)
    params = [
        SamplingParams(max_tokens=40, temperature=t, top_p=p, top_k=k, seed=s, ignore_eos=True)
        for t, p, k, s in ((0.7, 1.0, -1, 1), (1.0, 0.9, -1, 2), (0.5, 1.0, 20, 3))
    ]
    want = [o.token_ids for o in engines.plain.generate(COPY, params)]
    drafted, accepted = counts(spec)
    for _ in range(2):
        assert [spec.generate(prompt, p)[0].token_ids for prompt, p in zip(COPY, params)] == want
    assert [o.token_ids for o in spec.generate(COPY, params)] == want
    assert counts(spec)[1] > accepted
    drafted, accepted = counts(spec)
    unseeded = spec.generate(COPY, SamplingParams(max_tokens=30, temperature=0.8, ignore_eos=True))
    assert [len(o.token_ids) for o in unseeded] == [30] * len(COPY)
    assert counts(spec)[0] > drafted and counts(spec)[1] > accepted
    assert pools_back(spec)


async def test_aborts_and_preemption_leak_no_block_in_either_pool(engines) -> None:
    """Requests that outgrow the small target pool (preemption) and fill the draft pool run
    beside clients that hang up mid-stream; afterwards both pools hold nothing."""
    llm = engines.shallow
    client, policy = llm.engine.client, llm.engine.scheduler.policy
    preemptions = policy.num_preemptions
    greedy = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
    finished: list[int] = []

    async def run(prompt: str, hang_up_after: int | None) -> None:
        ids = await client.tokenize(prompt=prompt)
        stream = client.open_stream(client.new_request_id("draft-test"), ids, greedy)
        seen = 0
        async for out in stream:
            seen += len(out.token_ids)
            if hang_up_after is not None and seen >= hang_up_after:
                stream.abort()
                return
        finished.append(seen)

    async with trio.open_nursery() as actors:
        for actor in llm.engine.actors():
            await actors.start(actor.run)
        async with trio.open_nursery() as requests:
            for i, prompt in enumerate(COPY * 3):
                requests.start_soon(run, prompt, {0: 10, 4: 30}.get(i))
        with trio.fail_after(30):
            while (
                policy.has_work()
                or llm.engine.runner.drafter.num_free_blocks < llm.engine.runner.drafter.num_total_blocks
            ):
                await trio.sleep(0.05)
        actors.cancel_scope.cancel()
    assert finished == [80] * 7
    assert policy.num_preemptions > preemptions
    assert pools_back(llm)
    stats = llm.engine.scheduler.stats.latest
    assert stats.spec_draft_num_total_blocks == llm.engine.runner.drafter.num_total_blocks > 0
    assert stats.spec_draft_num_free_blocks == stats.spec_draft_num_total_blocks


def test_a_draft_with_another_tokenizer_fails_start_up_naming_both_models(tmp_path) -> None:
    import gguf

    path = default_model_path()
    other = str(tmp_path / "other-eos.gguf")
    write_gguf_variant(path, other, metadata={"tokenizer.ggml.eos_token_id": (0, gguf.GGUFValueType.UINT32)})
    config = f'{{"method": "draft", "model": "{other}", "num_speculative_tokens": 4, "disable_by_batch_size": 4}}'
    with pytest.raises(RuntimeError, match="server exited early") as err:
        ServerProcess("--speculative-config", config)
    assert f"the draft model {other} does not share the tokenizer of the model {path}" in str(err.value)
    assert "eos_token_id 2 vs 0" in str(err.value)
