"""TokenBucket and TenantQuota with a fake clock: refill, refunds, never-fits, concurrency."""

from __future__ import annotations

import math

import pytest

from trillium.metering.buckets import TokenBucket
from trillium.metering.quotas import LimitExceeded, Quotas, TenantQuota
from trillium.metering.tenants import TenantLimits


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_and_refills_continuously():
    clock = FakeClock()
    bucket = TokenBucket(60, period=60.0, clock=clock)  # 1 unit per second
    assert bucket.level == 60
    assert bucket.try_take(50) == 0.0
    assert bucket.level == pytest.approx(10)
    # Not enough: nothing is taken, and the wait is exactly the refill time of the shortfall.
    assert bucket.try_take(15) == pytest.approx(5.0)
    assert bucket.level == pytest.approx(10)
    clock.now += 4.0
    assert bucket.try_take(15) == pytest.approx(1.0)
    clock.now += 1.0
    assert bucket.try_take(15) == 0.0
    assert bucket.level == pytest.approx(0)
    clock.now += 1000.0  # refill stops at the capacity
    assert bucket.level == 60


def test_bucket_over_capacity_never_fits():
    bucket = TokenBucket(10, clock=FakeClock())
    assert bucket.try_take(11) == math.inf
    assert bucket.level == 10  # nothing taken
    assert bucket.try_take(10) == 0.0


def test_bucket_refund_is_capped_at_capacity():
    clock = FakeClock()
    bucket = TokenBucket(100, clock=clock)
    bucket.try_take(80)
    bucket.refund(30)
    assert bucket.level == pytest.approx(50)
    bucket.refund(1000)
    assert bucket.level == 100


def test_bucket_rejects_zero_capacity():
    with pytest.raises(ValueError):
        TokenBucket(0)


def quota(**limits) -> tuple[TenantQuota, FakeClock]:
    clock = FakeClock()
    return TenantQuota("acme", TenantLimits(**limits), clock), clock


def test_unlimited_tenant_admits_everything():
    q, _ = quota()
    for _ in range(1000):
        q.admit()
    assert q.reserve(10**6, 10**6) == 2 * 10**6
    assert q.num_in_flight == 1000


def test_concurrency_limit_counts_requests_in_flight():
    q, _ = quota(max_concurrent_requests=2)
    q.admit()
    q.admit()
    with pytest.raises(LimitExceeded) as info:
        q.admit()
    assert info.value.limit == "max_concurrent_requests" and info.value.kind == "requests"
    assert info.value.retry_after > 0 and "acme" in info.value.message
    assert q.num_in_flight == 2
    q.finish(reserved=0, used=0)
    q.admit()  # a slot freed
    assert q.num_in_flight == 2


def test_requests_per_minute_bucket():
    q, clock = quota(requests_per_minute=3)
    for _ in range(3):
        q.admit()
    with pytest.raises(LimitExceeded) as info:
        q.admit()
    assert info.value.limit == "requests_per_minute"
    assert info.value.retry_after == pytest.approx(20.0)  # 3 per minute: one every 20 s
    assert q.num_in_flight == 3  # the refused request is not in flight
    clock.now += 20.0
    q.admit()


def test_concurrency_refusal_takes_no_request_unit():
    q, _ = quota(max_concurrent_requests=1, requests_per_minute=2)
    q.admit()
    with pytest.raises(LimitExceeded):
        q.admit()
    q.finish(0, 0)
    q.admit()  # the refused request did not use the second unit


def test_token_reservation_and_refund():
    q, clock = quota(tokens_per_minute=100)
    q.admit()
    assert q.reserve(10, 50) == 60
    q.admit()
    with pytest.raises(LimitExceeded) as info:
        q.reserve(10, 40)  # 50 > the 40 left
    assert info.value.limit == "tokens_per_minute" and info.value.kind == "tokens"
    assert info.value.retry_after == pytest.approx(6.0)  # 10 tokens at 100/60 per second
    assert q.tokens.level == pytest.approx(40)  # a refused reservation takes nothing
    q.finish(reserved=60, used=25)  # 35 unused tokens go back
    assert q.tokens.level == pytest.approx(75)
    assert q.reserve(10, 40) == 50
    q.finish(reserved=50, used=50)
    assert q.tokens.level == pytest.approx(25)
    assert q.num_in_flight == 0
    clock.now += 60.0
    assert q.tokens.level == 100


def test_max_tokens_per_request_never_fits():
    q, _ = quota(max_tokens_per_request=64, tokens_per_minute=1000)
    with pytest.raises(LimitExceeded) as info:
        q.reserve(30, 35)
    assert info.value.limit == "max_tokens_per_request" and info.value.retry_after == math.inf
    assert q.tokens.level == 1000
    assert q.reserve(30, 34) == 64


def test_more_tokens_than_a_minute_holds_never_fits():
    q, _ = quota(tokens_per_minute=100)
    with pytest.raises(LimitExceeded) as info:
        q.reserve(60, 41)
    assert info.value.limit == "tokens_per_minute" and info.value.retry_after == math.inf


def test_default_max_tokens_fits_the_limits():
    q, _ = quota(max_tokens_per_request=100, tokens_per_minute=1000)
    assert q.default_max_tokens(num_prompt_tokens=20, room=500) == 80
    assert q.default_max_tokens(num_prompt_tokens=20, room=500, n=4) == 20
    assert q.default_max_tokens(num_prompt_tokens=20, room=50) == 50
    # A prompt over the limit still gets 1, so that reserve() answers with a 429.
    assert q.default_max_tokens(num_prompt_tokens=200, room=500) == 1
    open_quota, _ = quota()
    assert open_quota.default_max_tokens(num_prompt_tokens=20, room=500, n=3) == 500


def test_quotas_are_per_tenant():
    quotas = Quotas({"a": TenantLimits(max_concurrent_requests=1), "b": TenantLimits()})
    quotas["a"].admit()
    with pytest.raises(LimitExceeded):
        quotas["a"].admit()
    quotas["b"].admit()
    with pytest.raises(KeyError):
        quotas["c"]
