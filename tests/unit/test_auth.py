"""API keys without a server: the failed-authentication throttle (fake clock), the client address
behind trusted proxies, the operational routes' admin check, a config reload (keys swapped in one
step, quotas carried over) and the metrics a scrape without the admin key sees."""

from __future__ import annotations

import hashlib

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request

from trillium.metering.metrics import Metrics
from trillium.metering.quotas import LimitExceeded, Quotas
from trillium.metering.tenants import (
    AccessConfig,
    AuthSettings,
    ConfigError,
    TenantLimits,
    hash_key,
    load_access_config,
)
from trillium.protocol.usage import COMPLETED, UsageRecord
from trillium.server.accounting import Accounting
from trillium.server.auth import Authenticator
from trillium.server.auth_throttle import AuthThrottle, client_address, parse_networks
from trillium.server.errors import APIError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access(tenants: dict[str, str], *, admin: str = "sk-admin", **auth) -> AccessConfig:
    """tenants: key -> tenant."""
    return AccessConfig(
        limits={tenant: TenantLimits() for tenant in tenants.values()},
        key_hashes={digest(key): tenant for key, tenant in tenants.items()},
        admin_key_hashes=frozenset({digest(admin)}),
        ledger_path="usage.sqlite",
        auth=AuthSettings(**auth),
    )


def request(key: str | None = None, peer: str = "10.0.0.1", forwarded: str | None = None) -> Request:
    headers = []
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if forwarded is not None:
        headers.append((b"x-forwarded-for", forwarded.encode()))
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers, "client": (peer, 40000)})


def status(call) -> int:
    try:
        call()
    except APIError as exc:
        return exc.status
    return 200


# ---- [auth] in the config file ----------------------------------------------------------------

TENANT = f'[tenants.acme]\nkeys = ["{hash_key("sk-acme")}"]\n'


def load(tmp_path, text: str) -> AccessConfig:
    path = tmp_path / "trillium.toml"
    path.write_text(TENANT + text)
    return load_access_config(str(path))


def test_auth_section_defaults_and_values(tmp_path):
    assert load(tmp_path, "").auth == AuthSettings(failures_per_minute=30, trusted_proxies=())
    config = load(tmp_path, '[auth]\nfailures_per_minute = 5\ntrusted_proxies = ["127.0.0.1", " 10.0.0.0/8 ", "::1"]\n')
    assert config.auth == AuthSettings(failures_per_minute=5, trusted_proxies=("127.0.0.1/32", "10.0.0.0/8", "::1/128"))
    # A host address with a prefix is taken as its network.
    assert load(tmp_path, '[auth]\ntrusted_proxies = ["10.1.2.3/8"]\n').auth.trusted_proxies == ("10.0.0.0/8",)


@pytest.mark.parametrize(
    "text, message",
    [
        ('[auth]\ntrusted_proxies = ["127.0.0.1", "proxy.local"]\n', r"auth\.trusted_proxies\[1\].*'proxy\.local'"),
        ("[auth]\nfailures_per_minute = -1\n", r">= 0 - at `auth\.failures_per_minute`"),
        ("[auth]\nfailures_per_min = 5\n", r"unknown field `failures_per_min` - at `auth`"),
        ('[auth]\ntrusted_proxies = "127.0.0.1"\n', r"at `auth\.trusted_proxies`"),
    ],
)
def test_auth_section_errors_name_the_entry(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, text)


# ---- the throttle ------------------------------------------------------------------------------


def test_throttle_allows_n_failures_a_minute_then_one_per_share_of_the_window():
    clock = Clock()
    throttle = AuthThrottle(30, clock=clock)
    for _ in range(29):
        throttle.failed("a")
        assert throttle.retry_after("a") == 0.0
    throttle.failed("a")  # the 30th
    assert throttle.retry_after("a") == pytest.approx(2.0)  # 60 s / 30
    assert throttle.retry_after("b") == 0.0  # another address is unaffected
    clock.now += 1.0
    assert throttle.retry_after("a") == pytest.approx(1.0)
    clock.now += 1.0
    assert throttle.retry_after("a") == 0.0  # one more try...
    throttle.failed("a")
    assert throttle.retry_after("a") == pytest.approx(2.0)  # ...and throttled again
    clock.now += 60.0
    assert throttle.retry_after("a") == 0.0
    assert len(throttle) == 0  # leaked away: forgotten


def test_zero_failures_per_minute_turns_the_throttle_off():
    """Replicas behind a router that hides client addresses: one guesser must not lock out all."""
    throttle = AuthThrottle(0, clock=Clock())
    for _ in range(1000):
        throttle.failed("router")
    assert throttle.retry_after("router") == 0.0 and len(throttle) == 0


def test_throttle_remembers_a_bounded_number_of_addresses_least_recently_failed_out():
    clock = Clock()
    throttle = AuthThrottle(1, max_addresses=3, clock=clock)
    for address in ("a", "b", "c"):
        throttle.failed(address)
    throttle.failed("a")  # a failed again: b is now the least recent
    throttle.failed("d")
    assert len(throttle) == 3
    assert throttle.retry_after("b") == 0.0
    assert all(throttle.retry_after(x) > 0 for x in ("a", "c", "d"))


def test_a_new_rate_applies_to_the_counts_already_there():
    clock = Clock()
    throttle = AuthThrottle(10, clock=clock)
    for _ in range(5):
        throttle.failed("a")
    assert throttle.retry_after("a") == 0.0
    throttle.failures_per_minute = 5
    assert throttle.retry_after("a") == pytest.approx(12.0)


def test_client_address_trusts_forwarded_for_only_from_trusted_proxies():
    trusted = parse_networks(["127.0.0.1", "10.0.0.0/8"])
    assert client_address("203.0.113.9", "1.1.1.1", trusted) == "203.0.113.9"  # not a proxy: forged
    assert client_address("127.0.0.1", "198.51.100.7", trusted) == "198.51.100.7"
    # The rightmost entry that is not a trusted proxy; what the client wrote left of it is ignored.
    assert client_address("127.0.0.1", "6.6.6.6, 198.51.100.7, 10.1.2.3", trusted) == "198.51.100.7"
    assert client_address("127.0.0.1", None, trusted) == "127.0.0.1"
    # Every entry a trusted proxy: the nearest one's, never a client-written one further left.
    assert client_address("127.0.0.1", "10.9.9.9, 10.1.2.3", trusted) == "10.1.2.3"
    assert client_address("127.0.0.1", "1.1.1.1", ()) == "127.0.0.1"  # no trusted proxies configured
    assert client_address("::ffff:127.0.0.1", "198.51.100.7", trusted) == "198.51.100.7"  # dual-stack
    # IPv6 counts by /64: one host cannot rotate through its own prefix.
    assert client_address("2001:db8::1", None, ()) == client_address("2001:db8::ffff", None, ()) == "2001:db8::/64"
    assert client_address(None, None, trusted) == "unknown"


# ---- the authenticator -------------------------------------------------------------------------


def test_an_address_past_its_failures_gets_429_even_with_a_valid_key_others_do_not():
    clock = Clock()
    metrics = Metrics("m", dict)
    auth = Authenticator(access({"sk-acme": "acme"}, failures_per_minute=3), metrics, clock)
    for key in (None, "sk-wrong", "sk-wrong"):
        assert status(lambda key=key: auth.tenant(request(key))) == 401
    with pytest.raises(APIError) as info:
        auth.tenant(request("sk-acme"))
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "20"
    assert status(lambda: auth.require_admin(request("sk-admin"))) == 429
    assert auth.tenant(request("sk-acme", peer="10.0.0.2")) == "acme"
    clock.now += 20
    assert auth.tenant(request("sk-acme")) == "acme"
    samples = scrape(metrics)
    assert samples[("trillium:auth_failures_total", (("model_name", "m"), ("reason", "missing")))] == 1
    assert samples[("trillium:auth_failures_total", (("model_name", "m"), ("reason", "invalid")))] == 2
    assert samples[("trillium:auth_throttled_requests_total", (("model_name", "m"),))] == 2


def test_forwarded_for_from_a_trusted_proxy_is_the_address_counted():
    auth = Authenticator(access({"sk-acme": "acme"}, failures_per_minute=1, trusted_proxies=("127.0.0.1/32",)))
    assert status(lambda: auth.tenant(request("sk-x", peer="127.0.0.1", forwarded="198.51.100.7"))) == 401
    assert status(lambda: auth.tenant(request("sk-acme", peer="127.0.0.1", forwarded="198.51.100.7"))) == 429
    assert auth.tenant(request("sk-acme", peer="127.0.0.1", forwarded="198.51.100.8")) == "acme"


def test_operational_routes_are_open_without_a_config_and_admin_only_with_one():
    open_auth = Authenticator(None)
    open_auth.require_operator(request())  # no config: open
    auth = Authenticator(access({"sk-acme": "acme"}))
    assert status(lambda: auth.require_operator(request())) == 401
    assert status(lambda: auth.require_operator(request("sk-acme"))) == 403  # a tenant's key
    assert status(lambda: auth.require_operator(request("sk-admin"))) == 200
    assert status(lambda: open_auth.require_admin(request("sk-admin"))) == 404  # /v1/usage, reload


# ---- reload ------------------------------------------------------------------------------------


def test_reload_swaps_the_keys_and_carries_the_quotas_of_tenants_that_stay():
    first = access({"sk-acme": "acme", "sk-old": "old"})
    first = _with_limits(first, acme=TenantLimits(max_concurrent_requests=1, requests_per_minute=5))
    accounting = Accounting("m", Metrics("m", dict), first)
    held = accounting.admit(request("sk-acme"), chat=True)  # in flight across the reload
    old_quota = accounting.quotas["acme"]
    second = _with_limits(
        access({"sk-acme": "acme", "sk-new": "new"}),
        acme=TenantLimits(max_concurrent_requests=1, requests_per_minute=5),
    )
    second = AccessConfig(**{**_fields(second), "ledger_path": "elsewhere.sqlite"})
    warnings = accounting.reload(second)
    assert len(warnings) == 1 and "elsewhere.sqlite" in warnings[0]
    assert accounting.auth.access.ledger_path == "usage.sqlite"  # the ledger stays where it is
    assert status(lambda: accounting.auth.tenant(request("sk-old"))) == 401
    assert accounting.auth.tenant(request("sk-new")) == "new"
    assert accounting.quotas["acme"] is old_quota  # the in-flight count carried over:
    with pytest.raises(APIError) as info:
        accounting.admit(request("sk-acme"), chat=True)
    assert info.value.status == 429 and info.value.param == "max_concurrent_requests"
    held.finish()
    accounting.admit(request("sk-acme"), chat=True).finish()


def test_quotas_update_keeps_unchanged_buckets_and_refills_changed_ones():
    clock = Clock()
    quotas = Quotas({"a": TenantLimits(requests_per_minute=2, tokens_per_minute=100), "gone": TenantLimits()}, clock)
    quota = quotas["a"]
    quota.admit()
    quota.admit()
    with pytest.raises(LimitExceeded):
        quota.admit()
    quotas.update({"a": TenantLimits(requests_per_minute=2, tokens_per_minute=50), "new": TenantLimits()})
    assert quotas["a"] is quota and quota.num_in_flight == 2
    with pytest.raises(LimitExceeded):  # requests per minute unchanged: still empty
        quota.admit()
    assert quota.tokens.capacity == 50
    assert set(quotas.tenants) == {"a", "new"}
    quotas.update({"a": TenantLimits(requests_per_minute=3)})
    quota.admit()  # a changed limit: a fresh bucket
    assert quota.tokens is None


# ---- metrics -----------------------------------------------------------------------------------


def test_the_public_exposition_has_the_load_gauges_alone():
    metrics = Metrics("m", dict)
    metrics.observe(
        UsageRecord(
            request_id="r",
            tenant="acme",
            model="m",
            endpoint="chat",
            created=0.0,
            e2e=0.1,
            http_status=200,
            status=COMPLETED,
            prompt_tokens=5,
        ),
        (),
    )
    metrics.auth_failures["invalid"].inc()
    every = {name for name, _ in scrape(metrics)}
    public = {name for name, _ in scrape(metrics, everything=False)}
    assert {"trillium:tenant_prompt_tokens_total", "trillium:prompt_tokens_total"} <= every
    # Summed token counts and latencies tell other tenants' prompt lengths as well: load only.
    assert public == {"trillium:num_requests_running", "vllm:num_requests_running", "trillium:num_requests_waiting",
                      "vllm:num_requests_waiting", "trillium:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"}  # fmt: skip


def scrape(metrics: Metrics, **kwargs) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition(**kwargs).decode())
        for s in family.samples
    }


def _fields(config: AccessConfig) -> dict:
    return {name: getattr(config, name) for name in config.__struct_fields__}


def _with_limits(config: AccessConfig, **limits: TenantLimits) -> AccessConfig:
    return AccessConfig(**{**_fields(config), "limits": {**config.limits, **limits}})
