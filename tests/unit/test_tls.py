"""``--ssl-*`` (server/tls.py): files checked before the server starts or a reload applies them,
errors naming the file, mutual TLS with ``--ssl-ca-certs``, ALPN h2 + http/1.1."""

from __future__ import annotations

import argparse
import ssl

import pytest
import trustme

from trillium.cli import _server_tls
from trillium.metering.tenants import ConfigError
from trillium.server.tls import HypercornConfig, ServerTLS


@pytest.fixture
def files(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = {name: str(tmp_path / f"{name}.pem") for name in ("cert", "key", "ca", "other_key")}
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(paths["other_key"])
    return paths


def test_a_served_context_speaks_h2_and_http11_and_ca_certs_require_client_certificates(files):
    config = HypercornConfig(ServerTLS(files["cert"], files["key"], files["ca"]))
    assert config.ssl_enabled and config.ssl_handshake_timeout == 10
    context = config.create_ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert config.create_ssl_context() is not context  # hypercorn asks once; the last one is kept
    assert not HypercornConfig().ssl_enabled and HypercornConfig().create_ssl_context() is None
    assert ServerTLS(files["cert"], files["key"]).serving_context().verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    "cert, key, ca, named",
    [
        ("cert", "other_key", None, "--ssl-keyfile"),  # a key that is not the certificate's
        ("cert", "missing", None, "--ssl-certfile"),
        ("cert", "key", "key", "--ssl-ca-certs"),  # no certificate in it
    ],
)
def test_a_bad_file_is_a_config_error_naming_it(files, cert, key, ca, named):
    tls = ServerTLS(files.get(cert, "missing.pem"), files.get(key, "missing.pem"), files.get(ca) if ca else None)
    with pytest.raises(ConfigError, match=named):
        tls.check()


def test_a_reload_loads_the_files_into_the_live_context_after_a_check(files):
    tls = ServerTLS(files["cert"], files["key"])
    tls.reload_files()  # not serving yet: nothing to load into
    live = tls.serving_context()
    tls.check()
    tls.reload_files()
    assert tls.context is live


def test_the_flags_go_together(files):
    def flags(**kwargs):
        return argparse.Namespace(**{"ssl_certfile": None, "ssl_keyfile": None, "ssl_ca_certs": None, **kwargs})

    assert _server_tls(flags()) is None
    with pytest.raises(ValueError, match="go together"):
        _server_tls(flags(ssl_certfile=files["cert"]))
    with pytest.raises(ValueError, match="--ssl-ca-certs needs"):
        _server_tls(flags(ssl_ca_certs=files["ca"]))
    with pytest.raises(ConfigError, match="--ssl-keyfile"):
        _server_tls(flags(ssl_certfile=files["cert"], ssl_keyfile=files["other_key"]))
    assert _server_tls(flags(ssl_certfile=files["cert"], ssl_keyfile=files["key"])).certfile == files["cert"]
