"""A throw-away PKI for TLS tests: a CA, a server certificate for 127.0.0.1, and client
certificates naming tenants (cryptography, EC P-256, one-day validity)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class Issued(NamedTuple):
    cert: Path
    key: Path


class Authority:
    def __init__(self, directory: Path, name: str = "floorguard test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(self._name, self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{_slug(name)}.pem"
        self.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, common_name: str, *, dns: tuple[str, ...] = (), uri: tuple[str, ...] = ()
    ) -> Issued:
        """A client certificate (or, for "127.0.0.1", the server's)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.UniformResourceIdentifier(u) for u in uri]
        server = common_name == "127.0.0.1"
        if server:
            names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(subject, self._name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = self.directory / _slug(f"{self._name.rfc4514_string()}-{common_name}")
        issued = Issued(stem.with_suffix(".crt"), stem.with_suffix(".key"))
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return issued


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)
