"""Prometheus metrics (``GET /metrics``), named as vLLM's with the ``trillium:`` prefix.

Request histograms and token counters are updated by the frontend when a request finishes
(:meth:`Metrics.observe`, a few microseconds); the scheduler's gauges and counters are read
from its ``stats()`` at scrape time. One :class:`CollectorRegistry` per server, so several
servers (or tests) in one process do not share series.

With an access config, ``/metrics`` without the admin key shows the load gauges only
(:data:`LOAD_GAUGES`: what routers and autoscalers read; ``exposition(everything=False)``): every
other series -- token counters, latency histograms, prefix-cache hits, per tenant or summed over
all -- tells, under light traffic, the prompt lengths and cache hits of other tenants' requests.
Every series about one tenant is named ``trillium:tenant_*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from trillium.protocol.usage import REJECTED, UsageRecord

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# vLLM's buckets, so that dashboards built for it read ours the same way.
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
# fmt: on
# What /metrics shows without the admin key under --config: how loaded the engine is, nothing of
# any request (vLLM's names too: routers written for vLLM workers read them).
LOAD_GAUGES = frozenset(
    f"{prefix}:{name}"
    for prefix in ("trillium", "vllm")
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
)
# request_success_total{finished_reason}: vLLM's label values.
FINISHED_REASONS = ("stop", "length", "abort")


class ChoiceCounts(Protocol):
    """What :meth:`Metrics.observe` reads of one choice (an ``engine_client.RequestStream``, a layer
    above this one, so not imported here)."""

    num_prompt_tokens: int
    num_cached_tokens: int
    inter_token_seconds: list[float]


class _SchedulerCollector:
    """Reads the scheduler's counters when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict[str, Any]], model_name: str) -> None:
        self._stats = stats
        self._labels = [model_name]

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for name, key, doc in (
            ("num_requests_running", "num_requests_running", "Requests holding KV blocks and decoding."),
            ("num_requests_waiting", "num_requests_waiting", "Requests waiting for admission."),
            ("kv_cache_usage_perc", "kv_cache_usage_perc", "Fraction of KV blocks held by requests (0-1)."),
        ):
            # Also under vLLM's own names: routers and autoscalers written for vLLM workers
            # (vllm-router among them) read these three.
            for prefix in ("trillium", "vllm"):
                gauge = GaugeMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                gauge.add_metric(self._labels, float(stats.get(key, 0)))
                yield gauge
        for name, key, doc in (
            ("num_preemptions", "num_preemptions", "Requests preempted (recompute)."),
            (
                "kv_events_published",
                "kv_events_published",
                "Prefix-cache event batches published (--kv-events-endpoint).",
            ),
            ("kv_events_dropped", "kv_events_dropped", "Prefix-cache event batches dropped: the sender was behind."),
            # Speculative decoding, vLLM's names.
            ("spec_decode_num_drafts", "spec_num_drafts", "Verify rows: a request speculating in a step."),
            ("spec_decode_num_draft_tokens", "spec_num_draft_tokens", "Draft tokens proposed."),
            ("spec_decode_num_accepted_tokens", "spec_num_accepted_tokens", "Draft tokens accepted."),
        ):
            counter = CounterMetricFamily(f"trillium:{name}", doc, labels=["model_name"])
            counter.add_metric(self._labels, float(stats.get(key, 0)))
            yield counter
        per_pos = CounterMetricFamily(
            "trillium:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft.",
            labels=["model_name", "position"],
        )
        for position, count in enumerate(stats.get("spec_accepted_per_pos", [])):
            per_pos.add_metric([*self._labels, str(position)], float(count))
        yield per_pos


class Metrics:
    """The server's metrics registry and the instruments the frontend updates."""

    def __init__(self, model_name: str, scheduler_stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = r = CollectorRegistry()
        m = [model_name]
        self.ttft = Histogram(
            "trillium:time_to_first_token_seconds",
            "Request received to first token.",
            ["model_name"],
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(*m)
        self.itl = Histogram(
            "trillium:inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            ["model_name"],
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(*m)
        self.e2e = Histogram(
            "trillium:e2e_request_latency_seconds",
            "Request received to finished.",
            ["model_name"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        ).labels(*m)
        self.queue = Histogram(
            "trillium:request_queue_time_seconds",
            "Time waiting for the scheduler's first step.",
            ["model_name"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        ).labels(*m)
        self.prompt_tokens = Counter(
            "trillium:prompt_tokens", "Prompt tokens of finished requests.", ["model_name"], registry=r
        ).labels(*m)
        self.generation_tokens = Counter(
            "trillium:generation_tokens", "Generated tokens of finished requests.", ["model_name"], registry=r
        ).labels(*m)
        self.cache_queries = Counter(
            "trillium:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", ["model_name"], registry=r
        ).labels(*m)
        self.cache_hits = Counter(
            "trillium:prefix_cache_hits", "Prompt tokens served from the prefix cache.", ["model_name"], registry=r
        ).labels(*m)
        success = Counter(
            "trillium:request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(model_name, reason) for reason in FINISHED_REASONS}
        self.failure = Counter(
            "trillium:request_failure", "Requests the engine or the handler failed.", ["model_name"], registry=r
        ).labels(*m)
        self.tenant_requests = Counter(
            "trillium:tenant_requests", "Admitted requests per tenant and outcome.", ["tenant", "status"], registry=r
        )
        self.tenant_prompt_tokens = Counter(
            "trillium:tenant_prompt_tokens", "Prompt tokens per tenant.", ["tenant"], registry=r
        )
        self.tenant_generation_tokens = Counter(
            "trillium:tenant_generation_tokens", "Generated tokens per tenant.", ["tenant"], registry=r
        )
        self.tenant_rejected = Counter(
            "trillium:tenant_rate_limited_requests",
            "Requests refused with 429, per tenant and limit.",
            ["tenant", "limit"],
            registry=r,
        )
        # Per prefix-cache namespace (a tenant's, or a [prefix_cache.groups] group's): hits / queries
        # is the namespace's hit rate. Only with an access config (``cache_scope_of``).
        self.namespace_cache_queries = Counter(
            "trillium:tenant_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache, per cache namespace.",
            ["namespace"],
            registry=r,
        )
        self.namespace_cache_hits = Counter(
            "trillium:tenant_prefix_cache_hits",
            "Prompt tokens served from the prefix cache, per cache namespace.",
            ["namespace"],
            registry=r,
        )
        # tenant -> its cache namespace's name, or None when requests have no namespace of their
        # own (an open server); the accounting sets it from the access config in force.
        self.cache_scope_of: Callable[[str], str | None] = lambda tenant: None
        # API keys (--config): 401s by reason (missing, invalid), and the 429s of throttled addresses.
        auth_failures = Counter(
            "trillium:auth_failures",
            "Requests refused with 401: no API key (missing) or an unknown one (invalid).",
            ["model_name", "reason"],
            registry=r,
        )
        self.auth_failures = {reason: auth_failures.labels(model_name, reason) for reason in ("missing", "invalid")}
        self.auth_throttled = Counter(
            "trillium:auth_throttled_requests",
            "Requests refused with 429 before their key was read: too many failed authentications from their address.",
            ["model_name"],
            registry=r,
        ).labels(*m)
        r.register(_SchedulerCollector(scheduler_stats, model_name))
        self._public = CollectorRegistry()
        self._public.register(_LoadOnly(r))

    def observe(self, record: UsageRecord, streams: Iterable[ChoiceCounts]) -> None:
        """Count one finished request; ``streams`` are its choices' RequestStreams (for the
        inter-token intervals and prefix-cache counts)."""
        self.tenant_requests.labels(record.tenant, record.status).inc()
        if record.status == REJECTED:
            return
        self.tenant_prompt_tokens.labels(record.tenant).inc(record.prompt_tokens)
        self.tenant_generation_tokens.labels(record.tenant).inc(record.completion_tokens)
        self.prompt_tokens.inc(record.prompt_tokens)
        self.generation_tokens.inc(record.completion_tokens)
        self.e2e.observe(record.e2e)
        if record.ttft is not None:
            self.ttft.observe(record.ttft)
        if record.queue_time is not None:
            self.queue.observe(record.queue_time)
        scope = self.cache_scope_of(record.tenant)
        for stream in streams:
            self.cache_queries.inc(stream.num_prompt_tokens)
            self.cache_hits.inc(stream.num_cached_tokens)
            if scope is not None:
                self.namespace_cache_queries.labels(scope).inc(stream.num_prompt_tokens)
                self.namespace_cache_hits.labels(scope).inc(stream.num_cached_tokens)
            for seconds in stream.inter_token_seconds:
                self.itl.observe(seconds)
        success = self.success.get(record.finish_reason or "")
        if success is not None:
            success.inc()
        else:
            self.failure.inc()

    def rate_limited(self, tenant: str, limit: str) -> None:
        self.tenant_rejected.labels(tenant, limit).inc()

    def exposition(self, *, everything: bool = True) -> bytes:
        """The Prometheus text: every series, or the load gauges alone."""
        return generate_latest(self.registry if everything else self._public)


class _LoadOnly:
    """A registry's load gauges alone (the collector of ``Metrics._public``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        return (m for m in self._registry.collect() if m.name in LOAD_GAUGES)
