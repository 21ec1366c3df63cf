"""Tenants, API keys and limits from a TOML file (``trillium serve --config FILE``).

::

    [ledger]
    path = "usage.sqlite"           # relative to this file; the default

    [admin]
    keys = ["sha256:9f86d0..."]     # may read GET /v1/usage

    [tenants.acme]
    keys = ["sha256:5e8848..."]     # one or more; `trillium hash-key` prints new ones
    requests_per_minute = 600       # every limit is optional (absent = unlimited)
    tokens_per_minute = 200000      # prompt + completion
    max_concurrent_requests = 16
    max_tokens_per_request = 8192   # prompt + completion (all choices)

    [prefix_cache]
    public_prefixes = ["You are a helpful assistant."]  # cached once for every tenant

    [prefix_cache.groups]
    partners = ["acme", "globex"]   # tenants that share one prefix-cache namespace

    [auth]
    failures_per_minute = 30        # failed authentications one client address may make (then 429; 0: off)
    trusted_proxies = ["127.0.0.1"] # peers whose X-Forwarded-For names the client (addresses or CIDR)

Each tenant's requests hit only prefix-cache blocks its own requests wrote (its namespace), unless
``[prefix_cache.groups]`` puts it in a group, whose tenants share one namespace: a tenant cannot
tell from ``cached_tokens`` or from timing what a tenant outside its group sent. The leading
tokens a prompt shares with a public prefix (as plain text, or as the chat template's system
message) are cached once for all: that a public text was sent is all another tenant can learn.

The file holds SHA-256 hashes of keys, never keys: a key is a random string the server hashes
on each request. Errors name the offending entry (``tenants.acme.keys[0]``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import secrets
import sys
from typing import Annotated, Any, TypeVar

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]

_HASH = re.compile(r"(?:sha256:)?([0-9a-fA-F]{64})")
_T = TypeVar("_T")
KEY_PREFIX = "sk-trl-"


def hash_key(key: str) -> str:
    """The form a key takes in the config file: ``sha256:<hex digest of its UTF-8 bytes>``."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class TenantLimits(msgspec.Struct, kw_only=True, frozen=True):
    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    max_concurrent_requests: Positive | None = None
    max_tokens_per_request: Positive | None = None


class _Tenant(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    keys: list[str]
    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    max_concurrent_requests: Positive | None = None
    max_tokens_per_request: Positive | None = None


class _Admin(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    keys: list[str] = msgspec.field(default_factory=list)


class _Ledger(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str = "usage.sqlite"


class _PrefixCache(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    groups: dict[str, list[str]] = msgspec.field(default_factory=dict)
    public_prefixes: list[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(default_factory=list)


class AuthSettings(msgspec.Struct, kw_only=True, frozen=True):
    """``[auth]``: the failed-authentication throttle (server/auth_throttle.py)."""

    # 0: no throttle (replicas behind a router that throttles, or that hides client addresses)
    failures_per_minute: NonNegative = 30
    trusted_proxies: tuple[str, ...] = ()  # networks, normalized ("127.0.0.1/32")


class _Auth(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    failures_per_minute: NonNegative = 30
    trusted_proxies: list[str] = msgspec.field(default_factory=list)


class _File(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Each tenant is converted on its own: msgspec's error paths say `tenants[...]` for a dict
    # value, and an error must name the tenant.
    tenants: dict[str, Any]
    admin: _Admin = msgspec.field(default_factory=_Admin)
    ledger: _Ledger = msgspec.field(default_factory=_Ledger)
    prefix_cache: _PrefixCache = msgspec.field(default_factory=_PrefixCache)
    auth: _Auth = msgspec.field(default_factory=_Auth)


class AccessConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The validated file: ``key_hashes`` maps each key's hex digest to its tenant's name;
    ``cache_scopes`` each tenant to its prefix-cache namespace's name (``tenant:<name>``, or
    ``group:<name>`` for the tenants of a ``[prefix_cache.groups]`` entry); ``public_prefixes``
    the texts whose tokens every tenant's requests share."""

    limits: dict[str, TenantLimits]
    key_hashes: dict[str, str]
    admin_key_hashes: frozenset[str]
    ledger_path: str
    cache_scopes: dict[str, str] = msgspec.field(default_factory=dict)
    public_prefixes: tuple[str, ...] = ()
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message names the file and the entry."""


def parse_hash(value: str, where: str) -> str:
    match = _HASH.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(
            f"{where}: expected a SHA-256 key hash like 'sha256:<64 hex digits>' (run `trillium hash-key`), not a key"
        )
    return match.group(1).lower()


def load_access_config(path: str) -> AccessConfig:
    """Read and validate ``path``. Raises :class:`ConfigError`."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse_access_config(raw, base_dir=os.path.dirname(os.path.abspath(path)), source=path)


def _convert(raw: Any, kind: type[_T], source: str, where: str = "") -> _T:
    """``msgspec.convert`` whose error names the entry: `tenants.acme.keys[0]`, not `$...`."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if " - at `$" in text:
            text = text.replace("`$.", f"`{where}." if where else "`")
        elif where:  # an error at the root of ``raw``: msgspec gives no path
            text += f" - at `{where}`"
        raise ConfigError(f"{source}: {text}") from None


def parse_access_config(raw: dict[str, Any], *, base_dir: str, source: str = "config") -> AccessConfig:
    file = _convert(raw, _File, source)
    if not file.tenants:
        raise ConfigError(f"{source}: [tenants] must name at least one tenant")
    owners: dict[str, str] = {}
    admin = set()
    for i, value in enumerate(file.admin.keys):
        admin.add(parse_hash(value, f"{source}: admin.keys[{i}]"))
    limits = {}
    for name, value in file.tenants.items():
        tenant = _convert(value, _Tenant, source, f"tenants.{name}")
        if not tenant.keys:
            raise ConfigError(f"{source}: tenants.{name}.keys must list at least one key hash")
        for i, entry in enumerate(tenant.keys):
            digest = parse_hash(entry, f"{source}: tenants.{name}.keys[{i}]")
            if digest in owners or digest in admin:
                other = owners.get(digest, "admin")
                raise ConfigError(f"{source}: tenants.{name}.keys[{i}] is also a key of {other}")
            owners[digest] = name
        limits[name] = TenantLimits(
            requests_per_minute=tenant.requests_per_minute,
            tokens_per_minute=tenant.tokens_per_minute,
            max_concurrent_requests=tenant.max_concurrent_requests,
            max_tokens_per_request=tenant.max_tokens_per_request,
        )
    return AccessConfig(
        limits=limits,
        key_hashes=owners,
        admin_key_hashes=frozenset(admin),
        ledger_path=os.path.join(base_dir, file.ledger.path),
        cache_scopes=_cache_scopes(file.prefix_cache, limits, source),
        public_prefixes=tuple(file.prefix_cache.public_prefixes),
        auth=_auth_settings(file.auth, source),
    )


def _auth_settings(section: _Auth, source: str) -> AuthSettings:
    """``[auth]`` with each trusted proxy checked: an address or a network (CIDR)."""
    networks = []
    for i, value in enumerate(section.trusted_proxies):
        try:
            networks.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise ConfigError(
                f"{source}: auth.trusted_proxies[{i}]: expected an IP address or network such as "
                f"'10.0.0.0/8', got {value!r}"
            ) from None
    return AuthSettings(failures_per_minute=section.failures_per_minute, trusted_proxies=tuple(networks))


def _cache_scopes(section: _PrefixCache, tenants: dict[str, TenantLimits], source: str) -> dict[str, str]:
    """Each tenant's prefix-cache namespace name: its own, or its group's. A tenant in two groups,
    or a group naming a tenant the file does not define, is a ConfigError."""
    scopes = {name: f"tenant:{name}" for name in tenants}
    grouped: dict[str, str] = {}
    for group, members in section.groups.items():
        for i, member in enumerate(members):
            where = f"{source}: prefix_cache.groups.{group}[{i}]"
            if member not in tenants:
                raise ConfigError(f"{where}: no tenant named {member!r} in [tenants]")
            if member in grouped:
                raise ConfigError(f"{where}: tenant {member!r} is already in group {grouped[member]!r}")
            grouped[member] = group
            scopes[member] = f"group:{group}"
    return scopes
