"""Throwaway certificates for peer TLS (cornus.runtime.peer_tls) where no real CA is at hand: the
transport bench's `--tls` and the tests. A CA and the node certificates it signs, written as PEM
files. Never for production: the CA's key lives only in this process's memory, and each
certificate is valid for VALID_DAYS."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 2
CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str

    def environ(self) -> dict[str, str]:
        """As a node reads them from its environment."""
        return {"CORNUS_PEER_TLS_CERT_FILE": self.cert_file, "CORNUS_PEER_TLS_KEY_FILE": self.key_file,
                "CORNUS_PEER_TLS_CA_FILE": self.ca_file}


class ThrowawayCa:
    """A CA whose certificates are written under `directory`."""

    def __init__(self, directory: Path, name: str = "cornus-throwaway-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            # Key identifiers: Python 3.13's default context checks X.509 strictly, and refuses a
            # chain without them ("Missing Authority Key Identifier"; found by review).
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}.crt"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def save_key(self) -> None:
        """Write the CA's key beside its certificate, for `load` in another process (the bench's
        child); only ever under a temporary directory."""
        (self.directory / CA_KEY_FILE).write_bytes(self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (self.directory / CA_CERT_FILE).write_bytes(self.ca_file.read_bytes())

    @classmethod
    def load(cls, directory: Path) -> ThrowawayCa:
        """The CA another process saved under `directory` (save_key)."""
        ca = cls.__new__(cls)
        ca.directory = directory
        ca.ca_file = directory / CA_CERT_FILE
        ca.cert = x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY_FILE).read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        ca.key = key
        return ca

    def issue(self, name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
        """A certificate for both ends of a connection, naming `hosts` (IPs or DNS names)."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_file = self.directory / f"{name}.crt"
        key_file = self.directory / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return TlsFiles(str(cert_file), str(key_file), str(self.ca_file))
