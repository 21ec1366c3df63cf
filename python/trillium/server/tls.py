"""TLS for ``trillium serve --ssl-certfile F --ssl-keyfile F [--ssl-ca-certs F]``.

hypercorn's own TLS: HTTP/2 or HTTP/1.1 chosen by ALPN, TLS 1.2 or newer, hypercorn's ciphers.
hypercorn builds its SSL context once, when it starts listening (``Config.create_ssl_context``);
:class:`ServerTLS` builds it instead and keeps it, so that a reload (SIGHUP, or
``POST /v1/admin/reload``) loads the files again into the same context: new connections get
the new certificate, open ones keep the one they began with. A reload first loads the files
into a scratch context (:meth:`ServerTLS.check`), so a bad file is refused before the live
context is touched.

``--ssl-ca-certs`` turns on mutual TLS: a client must present a certificate signed by one of
those CAs. A reload adds the file's CAs; it cannot drop one the context already trusts (a
restart does).

A client that speaks plain HTTP to the TLS port fails the handshake; hypercorn closes that
connection and serves on.
"""

from __future__ import annotations

import ssl

from hypercorn.config import Config

from trillium.metering.tenants import ConfigError

ALPN_PROTOCOLS = ["h2", "http/1.1"]
CIPHERS = "ECDHE+AESGCM"  # hypercorn's default
# A connection that has not finished its handshake by then is dropped (hypercorn's default, 60 s,
# lets idle connections that never say a word hold sockets for a minute each).
HANDSHAKE_TIMEOUT_S = 10


class ServerTLS:
    """The certificate files and the SSL context the server listens with (once serving)."""

    def __init__(self, certfile: str, keyfile: str, ca_certs: str | None = None) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self.ca_certs = ca_certs
        self.context: ssl.SSLContext | None = None  # the live one, set when hypercorn asks for it

    def check(self) -> None:
        """Load the files into a scratch context (any thread). Raises ConfigError naming the file."""
        self._new_context()

    def serving_context(self) -> ssl.SSLContext:
        """The context to listen with, kept for :meth:`reload_files`. Raises ConfigError."""
        self.context = self._new_context()
        return self.context

    def reload_files(self) -> None:
        """Load the files again into the live context (event loop: the thread that makes new
        connections from it). Call :meth:`check` first. Raises ConfigError."""
        if self.context is not None:
            self._load(self.context)

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.set_ciphers(CIPHERS)
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # RFC 9113 9.2: HTTP/2 needs TLS 1.2+
        context.options |= ssl.OP_NO_COMPRESSION  # RFC 9113 9.2.1
        context.set_alpn_protocols(ALPN_PROTOCOLS)
        self._load(context)
        if self.ca_certs is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--ssl-certfile {self.certfile} / --ssl-keyfile {self.keyfile}: {exc}") from None
        if self.ca_certs is not None:
            try:
                context.load_verify_locations(self.ca_certs)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--ssl-ca-certs {self.ca_certs}: {exc}") from None


class HypercornConfig(Config):
    """hypercorn's Config, with the SSL context from :class:`ServerTLS` when there is one."""

    def __init__(self, tls: ServerTLS | None = None) -> None:
        super().__init__()
        self._tls = tls
        if tls is not None:  # hypercorn serves TLS when both are set (Config.ssl_enabled)
            self.certfile = tls.certfile
            self.keyfile = tls.keyfile
            self.ca_certs = tls.ca_certs
            self.ssl_handshake_timeout = HANDSHAKE_TIMEOUT_S

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._tls.serving_context() if self._tls is not None else None
