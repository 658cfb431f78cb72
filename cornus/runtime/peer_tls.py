"""Mutual TLS on the node-to-node port: its settings, their checks, and the SSL contexts built
from them.

Why: the peer port carries the protocol's messages and the execution phase's requests. Without
TLS, anything that can open a connection to it (any pod of a flat cluster network) can send a
participant a Decision it applies, or read the values that requests carry. With TLS, both ends
present a certificate signed by the cluster's CA; a connection without one ends in its
handshake, before any frame is read.

What a certificate proves: membership of the cluster, not which node it is. The hello's sender
is believed, as before. Every member holds the storage credentials, which let it write any record
of any node directly, so a member claiming to be another gains nothing it lacks.

Hostnames: the connecting side checks that the peer's certificate names the host it dialed (its
`peers` entry, a DNS name or an IP address in the certificate's subjectAltName), unless
`verify_hostname` is false; then any certificate of the CA is taken.

Files are read once, when the node starts: new certificates take effect by a rolling restart.
TLS is all or nothing across a cluster: a node with it and a node without it do not connect.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from storage_adapters.errors import ValidationError

# Longer paths are a configuration mistake, not a file: said early rather than by the OS.
PATH_LENGTH_MAX = 4096


@dataclass(frozen=True, slots=True)
class PeerTlsContexts:
    """What the transport needs: one context to accept peers' connections, one to open its own."""

    server: ssl.SSLContext
    client: ssl.SSLContext


@dataclass(frozen=True, slots=True)
class PeerTlsConfig:
    """The files of this node's certificate, its key, and the cluster's CA (PEM)."""

    cert_file: str
    key_file: str
    ca_file: str
    verify_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "ca_file"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > PATH_LENGTH_MAX:
                raise ValidationError(f"peer_tls {name} must be a file path (1..{PATH_LENGTH_MAX} characters), "
                                      f"got {value!r}")
        if not isinstance(self.verify_hostname, bool):
            raise ValidationError(f"peer_tls verify_hostname must be true or false, got {self.verify_hostname!r}")

    def contexts(self) -> PeerTlsContexts:
        """Both contexts, or a ValidationError that names the file that cannot be used."""
        return PeerTlsContexts(server=self._context(ssl.Purpose.CLIENT_AUTH),
                               client=self._context(ssl.Purpose.SERVER_AUTH))

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(purpose, cafile=self.ca_file)
        except (OSError, ssl.SSLError) as error:
            raise ValidationError(f"peer_tls ca_file {self.ca_file}: {error}") from error
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise ValidationError(
                f"peer_tls cert_file {self.cert_file} with key_file {self.key_file}: {error}") from error
        # Every end is one of ours: no older protocol version needs to be spoken.
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        # Both directions: an accepting node refuses a connection that shows no certificate of the
        # CA (the default for a server context is to ask for none).
        context.verify_mode = ssl.CERT_REQUIRED
        if purpose is ssl.Purpose.SERVER_AUTH:
            context.check_hostname = self.verify_hostname
        return context

