"""Structured-output benchmark on JSONSchemaBench (``../shared/data/jsonschemabench``).

    python bench/structured.py coverage [--per-subset N] [--engine llguidance|outlines-core]
    python bench/structured.py e2e [--count 200] [--max-tokens 256]
    python bench/structured.py steps [--batch 32] [--max-tokens 64]
    python bench/structured.py witness [--subsets Handwritten] [--max-checks 3000]

``coverage``: for each schema, the grammar compile time; whether every ``valid`` instance is
accepted and every ``invalid`` one rejected when fed token by token (compact JSON, our
tokenizer) through a matcher; and the time to compute each next-token mask along the valid
instances. Prints one JSON line per subset and a summary line (coverage %, false rejects,
false accepts, compile p50/p99, mask p50/p99). ``--engine outlines-core`` runs the same feed
through outlines-core (not a project dependency: put it on PYTHONPATH for the comparison);
each of its compiles runs in a forked child that is killed after ``--compile-timeout`` s.

``e2e``: generates (greedy) with the default model for ``--count`` schemas (a fixed random
sample of those llguidance compiles and whose prompt fits) and reports the share of outputs
that validate with ``jsonschema``; an output cut by ``max_tokens`` counts as invalid. ``steps``: the mean step time at one batch size with no constraint, a JSON Schema
constraint, and the same schema with keywords enforced by value checks (jump-forward and
closing off, so the runs take the same steps unless a check takes tokens back). ``witness``:
for each schema, whether ``structured.witness`` finds a value it accepts within ``--max-checks``
validations (each found one validated again with ``jsonschema``), and the checks and time
that took; one JSON line per subset and a summary. No model.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import multiprocessing
import os
import random
import sys
import time

import torch

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "jsonschemabench")
SUBSETS = ("Github_trivial", "Github_easy", "Glaiveai2K", "Snowplow", "Synthesized", "Handwritten")


def load_cases(per_subset: int | None, subsets=SUBSETS, seed: int = 0) -> list[tuple[str, str, dict]]:
    """[(subset, file name, case)] sorted by name, ``per_subset`` of each drawn with a fixed seed."""
    out = []
    for subset in subsets:
        files = sorted(glob.glob(os.path.join(DATA, f"{subset}---*.json")))
        if per_subset is not None and per_subset < len(files):
            files = sorted(random.Random(seed).sample(files, per_subset))
        for path in files:
            with open(path, encoding="utf-8") as f:
                out.append((subset, os.path.basename(path), json.load(f)))
    return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---- engines: compile a schema; feed tokens through a fresh state ------------------------------


class LLGuidanceEngine:
    """Our path: GrammarCompiler (llguidance) and its matchers."""

    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int) -> None:
        from trillium.structured import GrammarCompiler, build_ll_tokenizer

        self.compiler = GrammarCompiler(build_ll_tokenizer(tokenizer, vocab_size), cache_size=1)

    def compile(self, schema: dict):
        from trillium.protocol import StructuredOutputs

        return self.compiler.compile(StructuredOutputs(json=schema))

    def feed(self, grammar, tokens: list[int], eos: int, mask: torch.Tensor, times: list[float] | None) -> bool:
        matcher = grammar.new_matcher().ll_matcher
        for token in [*tokens, eos]:
            start = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
            if times is not None:
                times.append(time.perf_counter() - start)
            if not (int(mask[token // 32]) >> (token % 32)) & 1 or not matcher.consume_token(token):
                return False
        return True


class OutlinesCoreEngine:
    """outlines-core: JSON Schema -> regex -> token-level DFA index (compact whitespace, like ours)."""

    name = "outlines-core"

    def __init__(self, tokenizer, vocab_size: int) -> None:
        import outlines_core

        self.oc = outlines_core
        eos = min(tokenizer.eos_token_ids)
        special = set(tokenizer._backend.get_added_tokens_decoder())
        u2b = _gpt2_unicode_to_bytes()
        vocab: dict[bytes, list[int]] = {}
        for text, token_id in tokenizer._backend.get_vocab(with_added_tokens=True).items():
            if token_id in special or token_id == eos:
                continue
            vocab.setdefault(bytes(u2b[c] for c in text), []).append(token_id)
        self.vocab = outlines_core.Vocabulary(eos, vocab)

    def compile(self, schema: dict):
        regex = self.oc.json_schema.build_regex_from_schema(compact(schema), whitespace_pattern="")
        return self.oc.Index(regex, self.vocab)

    def feed(self, index, tokens: list[int], eos: int, mask: torch.Tensor, times: list[float] | None) -> bool:
        guide = self.oc.Guide(index)
        for token in tokens:
            start = time.perf_counter()
            guide.write_mask_into(mask.data_ptr(), mask.numel(), 4)
            if times is not None:
                times.append(time.perf_counter() - start)
            if not (int(mask[token // 32]) >> (token % 32)) & 1:
                return False
            guide.advance(token)
        return guide.is_finished()


def _gpt2_unicode_to_bytes() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's bytes_to_unicode), inverted."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


# ---- coverage ------------------------------------------------------------------------------------


def evaluate(engine, tokenizer, case: dict, vocab_size: int) -> dict:
    """One schema: compile, then feed every test instance. Never raises."""
    eos = min(tokenizer.eos_token_ids)
    start = time.perf_counter()
    try:
        grammar = engine.compile(case["schema"])
    except Exception as exc:  # unsupported feature or rejected schema: not covered
        return {"compiled": False, "error": str(exc)[:200], "compile_s": time.perf_counter() - start}
    record = {
        "compiled": True,
        "compile_s": time.perf_counter() - start,
        "valid": 0,
        "valid_accepted": 0,
        "invalid": 0,
        "invalid_rejected": 0,
        "mask_s": [],
    }
    mask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
    for test in case["tests"]:
        tokens = tokenizer.encode(compact(test["data"]))
        ok = engine.feed(grammar, tokens, eos, mask, record["mask_s"] if test["valid"] else None)
        if test["valid"]:
            record["valid"] += 1
            record["valid_accepted"] += ok
        else:
            record["invalid"] += 1
            record["invalid_rejected"] += not ok
    return record


def _evaluate_in_child(conn, engine, tokenizer, case, vocab_size):
    conn.send(evaluate(engine, tokenizer, case, vocab_size))


def evaluate_with_timeout(engine, tokenizer, case, vocab_size, timeout_s: float) -> dict:
    """``evaluate`` in a forked child, killed after ``timeout_s`` (outlines-core can build DFAs for
    minutes); a timeout counts as not compiled."""
    parent, child = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.get_context("fork").Process(
        target=_evaluate_in_child, args=(child, engine, tokenizer, case, vocab_size)
    )
    proc.start()
    if parent.poll(timeout_s):
        record = parent.recv()
        proc.join()
        return record
    proc.kill()
    proc.join()
    return {"compiled": False, "error": f"timeout after {timeout_s:g} s", "compile_s": timeout_s}


def summarize(name: str, records: list[dict]) -> dict:
    compiled = [r for r in records if r["compiled"]]
    valid = sum(r["valid"] for r in compiled)
    invalid = sum(r["invalid"] for r in compiled)
    masks = [t for r in compiled for t in r["mask_s"]]
    compile_ms = [r["compile_s"] * 1e3 for r in compiled]
    return {
        "subset": name,
        "schemas": len(records),
        "compiled": len(compiled),
        "coverage_pct": round(100 * len(compiled) / max(1, len(records)), 1),
        "schemas_all_correct": sum(
            r["valid_accepted"] == r["valid"] and r["invalid_rejected"] == r["invalid"] for r in compiled
        ),
        "valid_instances": valid,
        "false_rejects": valid - sum(r["valid_accepted"] for r in compiled),
        "invalid_instances": invalid,
        "false_accepts": invalid - sum(r["invalid_rejected"] for r in compiled),
        "compile_ms_p50": _round(pct(compile_ms, 50)),
        "compile_ms_p99": _round(pct(compile_ms, 99)),
        "mask_us_p50": _round(pct([t * 1e6 for t in masks], 50)),
        "mask_us_p99": _round(pct([t * 1e6 for t in masks], 99)),
        "masks": len(masks),
    }


def _round(x):
    return None if x is None else round(x, 2)


def cmd_coverage(args, tokenizer, vocab_size: int) -> None:
    engine = (OutlinesCoreEngine if args.engine == "outlines-core" else LLGuidanceEngine)(tokenizer, vocab_size)
    by_subset: dict[str, list[dict]] = {}
    cases = load_cases(args.per_subset, args.subsets)
    start = time.perf_counter()
    for i, (subset, name, case) in enumerate(cases):
        if args.engine == "outlines-core":
            record = evaluate_with_timeout(engine, tokenizer, case, vocab_size, args.compile_timeout)
        else:
            record = evaluate(engine, tokenizer, case, vocab_size)
        record["file"] = name
        by_subset.setdefault(subset, []).append(record)
        if args.progress and (i + 1) % 100 == 0:
            print(f"# {i + 1}/{len(cases)} schemas, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    for subset, records in by_subset.items():
        print(json.dumps({"engine": engine.name, **summarize(subset, records)}), flush=True)
    summary = summarize("all", [r for records in by_subset.values() for r in records])
    print(json.dumps({"engine": engine.name, **summary, "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    if args.errors:
        errors = {}
        for records in by_subset.values():
            for r in records:
                if not r["compiled"]:
                    key = r["error"].removeprefix("invalid JSON schema: ")[:70]
                    errors[key] = errors.get(key, 0) + 1
        print(json.dumps({"compile_errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:15])}))


# ---- end to end -----------------------------------------------------------------------------------


def cmd_e2e(args, llm) -> None:
    import jsonschema

    from trillium.protocol import StructuredOutputs
    from trillium.structured import GrammarError

    compiler = llm.engine.grammar_actor.compiler
    rng = random.Random(args.seed)
    cases = load_cases(None)
    rng.shuffle(cases)
    chosen, skipped = [], {"compile": 0, "prompt_too_long": 0, "validator": 0, "shortest_output_over_max_tokens": 0}
    for subset, name, case in cases:
        if len(chosen) == args.count:
            break
        schema = case["schema"]
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except Exception:
            skipped["validator"] += 1  # the validator itself cannot judge outputs for it
            continue
        try:
            grammar = compiler.compile(StructuredOutputs(json=schema))
        except GrammarError:
            skipped["compile"] += 1
            continue
        if grammar.min_output_tokens > args.max_tokens:
            skipped["shortest_output_over_max_tokens"] += 1
            continue
        prompt = [
            {
                "role": "user",
                "content": "Write one JSON object that satisfies this JSON Schema. Reply with "
                f"the JSON only.\n\n{compact(schema)}",
            }
        ]
        if len(llm.tokenizer.encode(llm.tokenizer.apply_chat_template(prompt))) > args.max_prompt_tokens:
            skipped["prompt_too_long"] += 1
            continue
        chosen.append((subset, name, schema, prompt))
    results = {}
    for close in (False, True):  # the same schemas, without and with closing, in one run
        results["closed" if close else "cut"] = _e2e_run(llm, args, chosen, close)
    print(
        json.dumps(
            {
                "schemas": len(chosen),
                "skipped": skipped,
                "max_tokens": args.max_tokens,
                "repetition_penalty": args.repetition_penalty,
                **results,
            }
        ),
        flush=True,
    )


def _e2e_run(llm, args, chosen, close: bool) -> dict:
    """Generate for every chosen schema; the share of outputs that validate and how they ended."""
    import jsonschema

    from trillium import SamplingParams
    from trillium.protocol import StructuredOutputs

    params = [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=0.0,
            repetition_penalty=args.repetition_penalty,
            structured=StructuredOutputs(json=s),
            close_structured_output=close,
        )
        for _, _, s, _ in chosen
    ]
    forced_before = llm.engine.client.stats()["num_forced_tokens"]
    start = time.perf_counter()
    outputs = llm.chat([p for *_, p in chosen], params)
    seconds = time.perf_counter() - start
    valid = stopped = closed = 0
    per_subset: dict[str, list[int]] = {}
    for (subset, name, schema, _), out in zip(chosen, outputs):
        ok = False
        stopped += out.finish_reason == "stop"
        closed += out.closed_early
        try:
            jsonschema.validate(json.loads(out.text), schema)
            ok = True
        except (ValueError, jsonschema.ValidationError) as exc:
            if args.show_invalid:
                print(
                    f"invalid ({'closed' if close else 'cut'}) {name}: {out.finish_reason} {exc}"[:400], file=sys.stderr
                )
        except Exception:  # the validator tripped on the schema (e.g. an unresolvable remote $ref)
            pass
        valid += ok
        per_subset.setdefault(subset, [0, 0])
        per_subset[subset][0] += 1
        per_subset[subset][1] += ok
    return {
        "valid": valid,
        "valid_pct": round(100 * valid / len(chosen), 1),
        "finish_stop": stopped,
        "finish_length": len(chosen) - stopped,
        "closed_early": closed,
        "per_subset": {k: {"n": n, "valid": v} for k, (n, v) in per_subset.items()},
        "completion_tokens": sum(len(o.token_ids) for o in outputs),
        "forced_tokens": llm.engine.client.stats()["num_forced_tokens"] - forced_before,
        "seconds": round(seconds, 1),
    }


# ---- step time with and without constraints -----------------------------------------------------

STEP_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "qty", "tags"],
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "qty": {"type": "integer", "maximum": 1000},
                    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
                },
            },
        }
    },
    "required": ["items"],
}


def _checked_step_schema() -> dict:
    """STEP_SCHEMA plus keywords no grammar expresses, checked as values complete (the items
    unique; each item's property names checked with jsonschema when it closes)."""
    schema = json.loads(json.dumps(STEP_SCHEMA))
    items = schema["properties"]["items"]
    items["uniqueItems"] = True
    items["items"]["propertyNames"] = {"not": {"pattern": "^zz"}}
    return schema


def cmd_steps(args, llm) -> None:
    from trillium import SamplingParams
    from trillium.protocol import StructuredOutputs

    scheduler = llm.engine.scheduler
    scheduler.policy.config = dataclasses.replace(scheduler.policy.config, jump_forward=False)
    prompts = [
        [{"role": "user", "content": f"List {i + 3} items in my shopping cart as JSON."}] for i in range(args.batch)
    ]
    llm.chat(prompts[:2], SamplingParams(max_tokens=4))  # warm up
    # Alternate the two runs ``--repeats`` times and keep each one's median: the machine's other
    # load and warm-up drift then fall on both alike.
    runs: dict[str, list[dict]] = {"free": [], "json_schema": [], "checked": []}
    kinds = (
        ("free", None),
        ("json_schema", StructuredOutputs(json=STEP_SCHEMA)),
        ("checked", StructuredOutputs(json=_checked_step_schema())),
    )
    for _ in range(args.repeats):
        for label, structured in kinds:
            before = llm.engine.client.stats()
            sampling = SamplingParams(
                max_tokens=args.max_tokens,
                temperature=0.0,
                ignore_eos=True,
                structured=structured,
                close_structured_output=False,  # the same steps for every kind
            )
            start = time.perf_counter()
            outs = llm.chat(prompts, sampling)
            wall = time.perf_counter() - start
            after = llm.engine.client.stats()

            def delta(key: str, after: dict = after, before: dict = before) -> float:
                return after[key] - before[key]

            steps = delta("num_steps")
            runs[label].append(
                {
                    "steps": steps,
                    "mean_step_ms": round(1e3 * delta("step_seconds") / steps, 2),
                    "tokens": sum(len(o.token_ids) for o in outs),
                    "wall_s": round(wall, 2),
                    # the whole step as the client sees it: also the scheduler's update, where
                    # value checks run (mean_step_ms is the executor's part only)
                    "wall_ms_per_step": round(1e3 * wall / steps, 2),
                    "fill_ms_per_step": round(1e3 * delta("grammar_fill_seconds") / steps, 3),
                    "wait_ms_per_step": round(1e3 * delta("grammar_wait_seconds") / steps, 3),
                }
            )
    results = {label: sorted(r, key=lambda x: x["mean_step_ms"])[len(r) // 2] for label, r in runs.items()}
    free, constrained = results["free"]["mean_step_ms"], results["json_schema"]["mean_step_ms"]
    wall_constrained, wall_checked = (results[k]["wall_ms_per_step"] for k in ("json_schema", "checked"))
    print(
        json.dumps(
            {
                "batch": args.batch,
                "max_tokens": args.max_tokens,
                "repeats": args.repeats,
                **results,
                "all_mean_step_ms": {k: [x["mean_step_ms"] for x in r] for k, r in runs.items()},
                "overhead_pct": round(100 * (constrained - free) / free, 1),
                "checks_overhead_pct": round(100 * (wall_checked - wall_constrained) / wall_constrained, 1),
            }
        ),
        flush=True,
    )


def cmd_witness(args) -> None:
    """The share of schemas whose witness search finds a valid value, per subset."""
    from trillium.structured.schema_relax import SchemaDocument
    from trillium.structured.witness import Spent, WitnessFinder

    totals = {"schemas": 0, "found": 0, "spent": 0, "failed": 0}
    for subset in args.subsets:
        found, spent, failed, checks, seconds, missing = 0, 0, 0, [], [], []
        cases = load_cases(args.per_subset, (subset,))
        for _, name, case in cases:
            schema = case.get("schema", case)
            try:
                doc = SchemaDocument(schema)
            except Exception:
                failed += 1
                continue
            count = [0]
            start = time.perf_counter()

            def budget_spent(count=count, start=start) -> bool:
                count[0] += 1
                return count[0] > args.max_checks or time.perf_counter() - start > args.max_seconds

            finder = WitnessFinder(doc.validator, doc.specification, doc.legacy_ref, budget_spent)
            try:
                value = next(iter(finder.witnesses([(schema, doc.resolver)])), missing)  # (null is a value)
            except Spent:
                spent += 1
                missing.append(name)
                continue
            except Exception:
                failed += 1
                missing.append(name)
                continue
            if value is missing or not doc.validator.is_valid(value):
                missing.append(name)
                continue
            found += 1
            checks.append(count[0])
            seconds.append(time.perf_counter() - start)
        line = {
            "subset": subset,
            "schemas": len(cases),
            "found": found,
            "found_pct": round(100 * found / max(len(cases), 1), 1),
            "spent": spent,
            "failed": failed,
            "checks_p50": pct(checks, 50),
            "checks_p90": pct(checks, 90),
            "ms_p50": round(1000 * (pct(seconds, 50) or 0), 2),
            "ms_p90": round(1000 * (pct(seconds, 90) or 0), 2),
        }
        if args.show_missing:
            line["missing"] = missing
        print(json.dumps(line), flush=True)
        for key in totals:
            totals[key] += line.get(key, 0)
    totals["found_pct"] = round(100 * totals["found"] / max(totals["schemas"], 1), 1)
    print(json.dumps({"subset": "all", **totals}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    cov = sub.add_parser("coverage")
    cov.add_argument("--engine", choices=("llguidance", "outlines-core"), default="llguidance")
    cov.add_argument("--per-subset", type=int, default=None, help="schemas per subset (default: all)")
    cov.add_argument("--subsets", nargs="+", default=list(SUBSETS))
    cov.add_argument("--compile-timeout", type=float, default=10.0)
    cov.add_argument("--errors", action="store_true", help="also print the most common compile errors")
    cov.add_argument("--progress", action="store_true")
    e2e = sub.add_parser("e2e")
    e2e.add_argument("--count", type=int, default=200)
    e2e.add_argument("--max-tokens", type=int, default=256)
    e2e.add_argument("--max-prompt-tokens", type=int, default=3000)
    e2e.add_argument("--seed", type=int, default=0)
    e2e.add_argument("--show-invalid", action="store_true", help="print each invalid output's schema and error")
    e2e.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="greedy decoding of a small model loops inside strings and arrays; 1.1 breaks most loops",
    )
    wit = sub.add_parser("witness")
    wit.add_argument("--subsets", nargs="+", default=["Synthesized", "Handwritten"])
    wit.add_argument("--per-subset", type=int, default=None, help="schemas per subset (default: all)")
    wit.add_argument("--max-checks", type=int, default=3000, help="validations per search (the server's bound)")
    wit.add_argument("--max-seconds", type=float, default=2.0)
    wit.add_argument("--show-missing", action="store_true", help="name the schemas with no witness found")
    steps = sub.add_parser("steps")
    steps.add_argument("--batch", type=int, default=32)
    steps.add_argument("--max-tokens", type=int, default=64)
    steps.add_argument("--repeats", type=int, default=3, help="alternating runs of each kind; the median is kept")
    for s in (e2e, steps):
        s.add_argument("--dtype", default="auto")
    args = p.parse_args()

    if args.cmd == "witness":
        cmd_witness(args)
        return
    if args.cmd == "coverage":
        from trillium.models import default_model_path
        from trillium.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(default_model_path())
        cmd_coverage(args, tokenizer, tokenizer.vocab_size)
        return
    from trillium import LLM

    llm = LLM(dtype=args.dtype, progress=False, max_running=max(64, getattr(args, "batch", 0)))
    (cmd_e2e if args.cmd == "e2e" else cmd_steps)(args, llm)


if __name__ == "__main__":
    main()
