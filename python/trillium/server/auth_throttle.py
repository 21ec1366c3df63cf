"""Failed authentications, counted per client address and throttled (``[auth]`` in the config).

Every 401 (no key, or an unknown one) counts against the client's address. An address with
``failures_per_minute`` failures on its count gets 429 with ``Retry-After`` on every request
that needs a key, a valid key included, before the key is looked at: a key guesser learns
nothing from what it sends meanwhile, and the guessing rate of one address is bounded. A request
from another address is unaffected. The count leaks away continuously, ``failures_per_minute``
per 60 s (a token bucket of failures), so a throttled address may try again after
``60 / failures_per_minute`` s and sustain that rate, never more. ``failures_per_minute = 0``
turns it off: behind a proxy that hides client addresses (vllm-router adds no
``X-Forwarded-For``) one key guesser would otherwise get every client throttled.

The address is the socket peer. ``X-Forwarded-For`` counts only when the peer is one of
``trusted_proxies``, and then its rightmost entry that is not itself a trusted proxy: the
entries left of it were written by the client and may be anything. IPv6 addresses count by
their /64 (one host usually holds a whole /64, so counting single addresses would let it rotate).

Memory is bounded: at most ``max_addresses`` addresses are tracked; past that, the one that
failed least recently is forgotten. Not thread-safe: the event loop owns it.
"""

from __future__ import annotations

import collections
import functools
import ipaddress
import time
from collections.abc import Callable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

WINDOW_S = 60.0
MAX_ADDRESSES = 10_000
IPV6_PREFIX = 64


class AuthThrottle:
    """Failed authentications per address, leaking away at ``failures_per_minute`` per minute."""

    def __init__(
        self,
        failures_per_minute: int = 30,
        *,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures_per_minute = failures_per_minute  # a reload may change it; counts stay
        self.max_addresses = max_addresses
        self._clock = clock
        # address -> (failures on its count, when counted); least recently failed first
        self._failures: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def __len__(self) -> int:
        """Addresses tracked."""
        return len(self._failures)

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may present a key again; 0.0 when it may now. Forgets an
        address whose count has leaked away."""
        if self.failures_per_minute == 0:  # throttling off
            return 0.0
        count = self._count(address, self._clock())
        if count == 0.0:
            self._failures.pop(address, None)
            return 0.0
        excess = count - (self.failures_per_minute - 1)
        return excess / self._rate if excess > 0 else 0.0

    def failed(self, address: str) -> None:
        """Count one failed authentication from ``address`` (nothing while throttling is off)."""
        if self.failures_per_minute == 0:
            return
        now = self._clock()
        self._failures[address] = (self._count(address, now) + 1.0, now)
        self._failures.move_to_end(address)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)

    @property
    def _rate(self) -> float:
        return self.failures_per_minute / WINDOW_S

    def _count(self, address: str, now: float) -> float:
        entry = self._failures.get(address)
        if entry is None:
            return 0.0
        count, at = entry
        return max(0.0, count - (now - at) * self._rate)


def parse_networks(values: Sequence[str]) -> tuple[Network, ...]:
    """``[auth] trusted_proxies`` (validated by the config parser) as networks."""
    return tuple(ipaddress.ip_network(value, strict=False) for value in values)


# Parsing addresses costs microseconds, and a server sees the same few peers and forwarded
# chains again and again: each distinct one is worked out once, within a bound.
@functools.lru_cache(maxsize=4096)
def client_address(peer: str | None, forwarded_for: str | None, trusted: tuple[Network, ...]) -> str:
    """The address failures are counted against: the socket ``peer``, or, when the peer is a
    trusted proxy, the rightmost ``X-Forwarded-For`` entry that is not one (see the module
    docstring). ``forwarded_for`` is every X-Forwarded-For header joined with commas."""
    if peer is None:
        return "unknown"  # no socket peer (not over TCP): one shared count
    if not trusted or not forwarded_for or not _trusted(peer, trusted):
        return _counted_as(peer)
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return _counted_as(hop)
    # Every entry a trusted proxy: the nearest one's (the rightmost); a client-written entry
    # further left would let the client pick its count.
    return _counted_as(hops[-1]) if hops else _counted_as(peer)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket's IPv4 client
    return ip


def _trusted(text: str, trusted: Sequence[Network]) -> bool:
    ip = _ip(text)
    return ip is not None and any(ip in network for network in trusted)


def _counted_as(text: str) -> str:
    """The key an address is counted under: itself, its /64 for IPv6, the text if no address."""
    ip = _ip(text)
    if ip is None:
        return text
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)
