"""The access config (TOML tenants, key hashes, limits) and ``trillium hash-key``: errors name the entry."""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

from trillium.metering.commands import print_key_hashes
from trillium.metering.tenants import ConfigError, TenantLimits, hash_key, load_access_config, new_key

ROOT = Path(__file__).resolve().parents[2]
H1 = hash_key("sk-one")
H2 = hash_key("sk-two")


def write(tmp_path, text: str) -> str:
    path = tmp_path / "trillium.toml"
    path.write_text(text)
    return str(path)


def load(tmp_path, text: str):
    return load_access_config(write(tmp_path, text))


def test_valid_config(tmp_path):
    config = load(
        tmp_path,
        f"""
[ledger]
path = "data/usage.sqlite"
[admin]
keys = ["{hash_key("sk-admin")}"]
[tenants.acme]
keys = ["{H1}", "{H2.removeprefix("sha256:").upper()}"]
requests_per_minute = 10
max_tokens_per_request = 512
[tenants.globex]
keys = ["  {hash_key("sk-three")}  "]
""",
    )
    digest = hashlib.sha256(b"sk-one").hexdigest()
    assert config.key_hashes[digest] == "acme"
    assert config.key_hashes[hashlib.sha256(b"sk-two").hexdigest()] == "acme"  # bare, upper-case hex works
    assert config.key_hashes[hashlib.sha256(b"sk-three").hexdigest()] == "globex"
    assert config.admin_key_hashes == {hashlib.sha256(b"sk-admin").hexdigest()}
    assert config.limits["acme"] == TenantLimits(requests_per_minute=10, max_tokens_per_request=512)
    assert config.limits["globex"] == TenantLimits()
    # Relative to the config file, not to the working directory.
    assert config.ledger_path == os.path.join(str(tmp_path), "data", "usage.sqlite")


def test_default_ledger_path_and_no_admin(tmp_path):
    config = load(tmp_path, f'[tenants.a]\nkeys = ["{H1}"]\n')
    assert config.ledger_path == os.path.join(str(tmp_path), "usage.sqlite")
    assert config.admin_key_hashes == frozenset()


def test_example_config_loads_and_its_demo_keys_match():
    config = load_access_config(str(ROOT / "examples" / "trillium.toml"))
    owners = {
        name: config.key_hashes.get(hashlib.sha256(f"sk-example-{name}".encode()).hexdigest())
        for name in ("acme", "globex")
    }
    assert owners == {"acme": "acme", "globex": "globex"}
    assert hashlib.sha256(b"sk-example-admin").hexdigest() in config.admin_key_hashes


@pytest.mark.parametrize(
    "text, where",
    [
        # A key instead of its hash: refused, so that no secret sits in the file.
        ('[tenants.acme]\nkeys = ["sk-one"]\n', "tenants.acme.keys[0]"),
        (f'[tenants.acme]\nkeys = ["{H1}", "sha256:abc"]\n', "tenants.acme.keys[1]"),
        ('[admin]\nkeys = ["sk-admin"]\n[tenants.acme]\nkeys = ["' + H1 + '"]\n', "admin.keys[0]"),
        ("[tenants.acme]\nkeys = [1]\n", "tenants.acme.keys[0]"),
    ],
)
def test_plain_key_instead_of_hash(tmp_path, text, where):
    with pytest.raises(ConfigError, match=re.escape(where)) as info:
        load(tmp_path, text)
    assert "trillium hash-key" in str(info.value) or "Expected `str`" in str(info.value)


def test_duplicate_key_names_both_owners(tmp_path):
    with pytest.raises(ConfigError, match=r"tenants\.globex\.keys\[1\] is also a key of acme"):
        load(tmp_path, f'[tenants.acme]\nkeys = ["{H1}"]\n[tenants.globex]\nkeys = ["{H2}", "{H1}"]\n')
    with pytest.raises(ConfigError, match=r"tenants\.acme\.keys\[0\] is also a key of admin"):
        load(tmp_path, f'[admin]\nkeys = ["{H1}"]\n[tenants.acme]\nkeys = ["{H1}"]\n')
    # The same hash written twice in different forms is still the same key.
    with pytest.raises(ConfigError, match=r"tenants\.acme\.keys\[1\] is also a key of acme"):
        load(tmp_path, f'[tenants.acme]\nkeys = ["{H1}", "{H1.removeprefix("sha256:")}"]\n')


@pytest.mark.parametrize(
    "text, message",
    [
        (
            f'[tenants.acme]\nkeys = ["{H1}"]\n[tenants.globex]\nkeys = ["{H2}"]\nrequests_per_minut = 5\n',
            "unknown field `requests_per_minut` - at `tenants.globex`",
        ),
        (f'[tenants.acme]\nkeys = ["{H1}"]\n[admin]\nkey = ["{H2}"]\n', "unknown field `key` - at `admin`"),
        (f'[tenants.acme]\nkeys = ["{H1}"]\n[ledger]\nfile = "x.sqlite"\n', "unknown field `file` - at `ledger`"),
        (f'[tenants.acme]\nkeys = ["{H1}"]\n[limits]\nrpm = 1\n', "unknown field `limits`"),
    ],
)
def test_unknown_field_is_named(tmp_path, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(tmp_path, text)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            f'[tenants.acme]\nkeys = ["{H1}"]\nmax_concurrent_requests = 0\n',
            r">= 1 - at `tenants\.acme\.max_concurrent_requests`",
        ),
        (f'[tenants.acme]\nkeys = ["{H1}"]\ntokens_per_minute = "lots"\n', r"at `tenants\.acme\.tokens_per_minute`"),
        ("[tenants.acme]\nkeys = []\n", r"tenants\.acme\.keys must list at least one"),
        ("[tenants.acme]\nrequests_per_minute = 5\n", r"missing required field `keys` - at `tenants\.acme`"),
        ("tenants.acme = 3\n", r"Expected `object`, got `int` - at `tenants\.acme`"),
        ('[ledger]\npath = "x"\n', r"missing required field `tenants`"),
        ("[tenants]\n", r"at least one tenant"),
        ("[tenants.acme\n", r"trillium\.toml"),  # TOML syntax error: the file is named
    ],
)
def test_invalid_values(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, text)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        load_access_config(str(tmp_path / "nope.toml"))


def test_hash_key_prints_a_new_key_and_its_hash():
    out = io.StringIO()
    assert print_key_hashes(from_stdin=False, out=out) == 0
    key = re.search(r"^key:\s+(\S+)$", out.getvalue(), re.M).group(1)
    digest = re.search(r"^hash:\s+(\S+)$", out.getvalue(), re.M).group(1)
    assert key.startswith("sk-trl-") and len(key) > 40
    assert digest == "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    assert new_key() != new_key()


def test_hash_key_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("sk-example-acme\n\n  sk-one  \n"))
    out = io.StringIO()
    assert print_key_hashes(from_stdin=True, out=out) == 0
    assert out.getvalue().splitlines() == [
        "sha256:5dea1d865bf17e8d7b64aa572e4c77cbe2289cb91f6207c04ee2735985218d8a",  # examples/trillium.toml
        H1,
    ]


def test_each_tenant_has_its_own_cache_namespace_unless_grouped(tmp_path):
    config = load(
        tmp_path,
        f"""
[tenants.acme]
keys = ["{H1}"]
[tenants.globex]
keys = ["{H2}"]
[tenants.initech]
keys = ["{hash_key("sk-three")}"]
[prefix_cache]
public_prefixes = ["You are a helpful assistant."]
[prefix_cache.groups]
partners = ["acme", "globex"]
""",
    )
    assert config.cache_scopes == {"acme": "group:partners", "globex": "group:partners", "initech": "tenant:initech"}
    assert config.public_prefixes == ("You are a helpful assistant.",)
    alone = load(tmp_path, f'[tenants.acme]\nkeys = ["{H1}"]\n')
    assert alone.cache_scopes == {"acme": "tenant:acme"} and alone.public_prefixes == ()


@pytest.mark.parametrize(
    "section, message",
    [
        ('[prefix_cache.groups]\np = ["acme", "nobody"]', r"prefix_cache\.groups\.p\[1\]: no tenant named 'nobody'"),
        (
            '[prefix_cache.groups]\np = ["acme"]\nq = ["acme"]',
            r"prefix_cache\.groups\.q\[0\]: tenant 'acme' is already in",
        ),
        ('[prefix_cache]\npublic_prefixes = [""]', r"prefix_cache\.public_prefixes\[0\]"),
        ("[prefix_cache]\nshare_everything = true", r"share_everything"),
    ],
)
def test_prefix_cache_section_errors_name_the_entry(tmp_path, section, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, f'[tenants.acme]\nkeys = ["{H1}"]\n{section}\n')
