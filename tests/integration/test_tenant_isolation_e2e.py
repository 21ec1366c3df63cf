"""Tenants under ``--config`` never share prefix-cache blocks unless the config groups them: the
probe of issue 45 (tenant B sends the prompt tenant A sent a moment before) finds nothing, from
``cached_tokens`` or from the time to the first token; tenants of one ``[prefix_cache.groups]``
group do share. Runs on the session's metered server (tests/integration/metered.py)."""

from __future__ import annotations

import json
import time
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.metered import MODEL, PUBLIC_PREFIX, auth, tenant_auth

# ~900 prompt tokens: a cold prefill takes many times a warm one's.
DOCUMENT = " ".join(f"Clause {i}: the supplier ships part {i * 7} within {i % 9 + 1} days." for i in range(60))


def probe(base_url: str, tenant: str, prompt: str) -> tuple[int, int, float]:
    """Stream one completion as ``tenant``: (prompt tokens, cached tokens, seconds to the first token)."""
    started = time.monotonic()
    first = None
    usage = None
    with httpx.stream(
        "POST",
        base_url + "/v1/completions",
        headers=tenant_auth(tenant),
        timeout=120,
        json={
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 2,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and first is None:
                first = time.monotonic() - started
            usage = chunk.get("usage") or usage
    assert usage is not None and first is not None
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], first


def test_another_tenant_learns_nothing_from_the_prefix_cache(metered_server):
    """acme's prompt, sent again by globex: 0 cached tokens and a cold prefill's time to first token,
    while acme itself hits its own blocks."""
    base = metered_server.base_url
    prompt = f"[{uuid.uuid4().hex}] {DOCUMENT}"
    num_prompt, cached, cold = probe(base, "acme", prompt)
    assert num_prompt > 800 and cached == 0
    _, cached, warm = probe(base, "acme", prompt)
    assert cached >= num_prompt - 16  # acme's own blocks
    _, cached, other = probe(base, "globex", prompt)
    assert cached == 0
    # A hit skips ~900 tokens of prefill: globex's first token comes as late as a cold prompt's, not a
    # warm one's (a generous bound: timing is measured on a shared machine).
    assert other > 3 * warm, (cold, warm, other)
    # globex's own repeat now hits globex's copy.
    assert probe(base, "globex", prompt)[1] >= num_prompt - 16


def test_tenants_of_one_group_share_their_prefixes(metered_server):
    base = metered_server.base_url
    prompt = f"[{uuid.uuid4().hex}] {DOCUMENT}"
    num_prompt, cached, _ = probe(base, "share1", prompt)
    assert cached == 0
    assert probe(base, "share2", prompt)[1] >= num_prompt - 16  # same group: a hit
    assert probe(base, "acme", prompt)[1] == 0  # outside the group: none


def test_a_declared_public_prefix_is_shared_and_nothing_after_it(metered_server):
    """The config's public system prompt is cached once for all: globex reuses the blocks acme's
    request computed for it, but none of what acme wrote after it (the same user message)."""
    base = metered_server.base_url
    messages = [
        {"role": "system", "content": PUBLIC_PREFIX},
        {"role": "user", "content": f"My account number is {uuid.uuid4().int}. " * 20},
    ]

    def usage(tenant: str) -> tuple[int, int]:
        r = httpx.post(
            base + "/v1/chat/completions",
            headers=tenant_auth(tenant),
            timeout=120,
            json={"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    num_prompt, _ = usage("acme")
    _, shared = usage("globex")
    system_only = httpx.post(
        base + "/v1/chat/completions/render",
        headers=tenant_auth("globex"),
        timeout=60,
        json={"model": MODEL, "messages": messages[:1]},
    )
    assert system_only.status_code == 200, system_only.text
    # The system message alone (plus the few tokens of the generation prompt the render adds):
    # globex's hit is its whole blocks, and not one block more.
    num_system = system_only.json()["count"]
    assert num_system - 24 < shared <= num_system < num_prompt - 100
    assert usage("acme")[1] >= num_prompt - 16  # acme's own namespace still has all of it


def test_metrics_report_hit_rates_per_namespace(metered_server):
    base = metered_server.base_url
    prompt = f"[{uuid.uuid4().hex}] {DOCUMENT}"
    probe(base, "globex", prompt)
    probe(base, "globex", prompt)
    r = httpx.get(base + "/metrics", headers=auth(metered_server.admin_key), timeout=30)
    assert r.status_code == 200
    series = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name.startswith("trillium:tenant_prefix_cache_") and sample.name.endswith("_total"):
                series[(sample.name, sample.labels["namespace"])] = sample.value
    queries = series[("trillium:tenant_prefix_cache_queries_total", "tenant:globex")]
    hits = series[("trillium:tenant_prefix_cache_hits_total", "tenant:globex")]
    assert queries >= 2 * 800 and 0 < hits < queries
