"""How far n-gram speculation can go on this machine: verify-step costs by row count, and the
decode speedup that draft policies would reach on the grounded prompts, replayed offline.

    python bench/spec_ceiling.py                   # all committed grounded prompts, k = 5 and 8
    python bench/spec_ceiling.py --num-prompts 6 --max-tokens 64     # smoke mode (a minute)
    python bench/spec_ceiling.py --row-cost-ms 0.6  # what if an extra verify row cost 0.6 ms?

1. Times a step of one request at ``--context`` tokens verifying 0..8 drafts (1..9 rows) on the
   engine's own step thread (``ModelRunner.execute``, greedy, medians of ``--repeats``).
2. Generates each grounded prompt's greedy answer without speculation (``LLM.chat``).
3. Replays every answer token by token: at each step a policy proposes drafts from the context so
   far (the real ``NgramProposer`` and ``DraftDepth``); greedy verification keeps the drafts that
   equal the answer's next tokens (exactly what the engine does, so no model is run); the step
   costs the measured time for its row count. Prints, per policy and k, the decode speedup over
   plain decoding (prefill not counted), steps, verify steps and drafts accepted per verify.

Policies: ``engine`` (what the scheduler does: proposer back-off and the depth chosen from recent
acceptance against the measured break-even), ``always`` (k drafts whenever the n-gram index has a
match), ``oracle`` (knows how many drafts will be accepted and proposes exactly those: the ceiling
of any depth policy over this proposer). ``--row-cost-ms`` replaces the measured table by decode
cost + that much per extra row, to see what a cheaper verify row (a kernel change) would buy.
A benchmark, not a test: one JSON line per (policy, k), then a table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

from trillium import LLM, SamplingParams
from trillium.engine.step_costs import StepTimer
from trillium.speculative import DraftDepth, NgramProposer

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = os.path.join(HERE, "speculative_prompts.jsonl")
MAX_ROWS = 9


def measure_rows(llm: LLM, context: int, repeats: int) -> dict[int, float]:
    """ms of a step of one request verifying rows - 1 drafts, for rows 1..MAX_ROWS."""

    def run() -> dict[int, float]:
        timer = StepTimer(llm.engine.runner, context, MAX_ROWS)
        return {rows: timer.median_s(1, rows, repeats) * 1e3 for rows in range(1, MAX_ROWS + 1)}

    return llm.engine.step_thread.call(run)


class _Context:
    """A request's tokens as the proposer reads them (``ngram.TokenSource``)."""

    request_id = "r"

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        return self.ids[start:end]


Policy = Callable[[NgramProposer, DraftDepth, _Context, list[int], int, int, float], list[int]]


def _accepted(drafts: list[int], answer: list[int], t: int) -> int:
    a = 0
    while a < len(drafts) and t + a < len(answer) and drafts[a] == answer[t + a]:
        a += 1
    return a


def engine_policy(prop, depth, ctx, answer, t, k, break_even):
    limit = depth.limit(break_even)
    return prop.propose(ctx, limit) if limit else []


def always_policy(prop, depth, ctx, answer, t, k, break_even):
    return prop.propose(ctx, k)  # never given feedback: no back-off, the cap stays k


def oracle_policy(prop, depth, ctx, answer, t, k, break_even):
    drafts = always_policy(prop, depth, ctx, answer, t, k, break_even)
    return drafts[: _accepted(drafts, answer, t)]


POLICIES: dict[str, Policy] = {"engine": engine_policy, "always": always_policy, "oracle": oracle_policy}


def replay(answers: list[tuple[list[int], list[int]]], policy: Policy, k: int, cost: dict[int, float]) -> dict:
    break_even = (cost[k + 1] - cost[1]) / k / cost[1]
    ms = 0.0
    tokens = steps = verifies = accepted = 0
    for prompt, answer in answers:
        prop, depth = NgramProposer(k, 1, 4), DraftDepth(k)
        t = 1  # answer[0] came from the prefill
        while t < len(answer):
            drafts = policy(prop, depth, _Context(prompt + answer[:t]), answer, t, k, break_even)
            drafts = drafts[: len(answer) - t - 1]
            a = _accepted(drafts, answer, t)
            if drafts:
                if policy is engine_policy:  # the others ignore how drafts did
                    prop.feedback("r", len(drafts), a)
                    depth.record(len(drafts), a)
                verifies += 1
                accepted += a
            ms += cost[len(drafts) + 1]
            tokens += a + 1
            steps += 1
            t += a + 1
    return {
        "ms_per_token": ms / tokens,
        "steps": steps,
        "verifies": verifies,
        "accepted_per_verify": accepted / max(verifies, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=None, help="first N grounded prompts (default: all)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--context", type=int, default=400, help="context of the timed verify steps (tokens)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--k", type=int, nargs="*", default=[5, 8])
    p.add_argument("--row-cost-ms", type=float, default=None, help="model each extra row at this cost instead")
    args = p.parse_args()

    llm = LLM(progress=False)
    cost = measure_rows(llm, args.context, args.repeats)
    if args.row_cost_ms is not None:
        cost = {r: cost[1] + args.row_cost_ms * (r - 1) for r in cost}
    print(json.dumps({"step_ms_by_rows": {r: round(c, 2) for r, c in cost.items()}}))
    with open(PROMPTS) as f:
        items = [json.loads(line) for line in f if line.strip()][: args.num_prompts]
    outs = llm.chat([it["messages"] for it in items], SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    answers = [(o.prompt_token_ids, o.token_ids) for o in outs]

    plain = replay(answers, lambda *a: [], 1, cost)["ms_per_token"]
    rows = []
    for k in args.k:
        for name, policy in POLICIES.items():
            r = replay(answers, policy, k, cost)
            row = {"policy": name, "k": k, "speedup": round(plain / r["ms_per_token"], 3)}
            row |= {key: round(v, 3) if isinstance(v, float) else v for key, v in r.items()}
            rows.append(row)
            print(json.dumps(row))
    print("\n| policy | k | decode speedup | ms per token | steps | verify steps | accepted / verify |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['policy']} | {r['k']} | {r['speedup']:.2f}x | {r['ms_per_token']:.2f} | {r['steps']} "
            f"| {r['verifies']} | {r['accepted_per_verify']:.2f} |"
        )


if __name__ == "__main__":
    main()
