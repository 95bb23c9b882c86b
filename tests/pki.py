"""A throwaway PKI for the TLS tests: a CA, a server certificate for 127.0.0.1, a client
certificate of the CA and one of a rogue CA (EC P-256 keys, one day)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def make_pki(d: Path) -> dict[str, tuple[Path, Path]]:
    """Write the PKI into ``d``; return name -> (certificate, key) files for ``ca``,
    ``server``, ``client`` and ``rogue``."""
    ca = _cert("qpmesh-test-ca", None, ca=True)
    rogue = _cert("rogue-ca", None, ca=True)
    return {"ca": _write(d, "ca", ca),
            "server": _write(d, "server", _cert("qpmesh-api", ca, server=True)),
            "client": _write(d, "client", _cert("grafana", ca)),
            "rogue": _write(d, "rogue", _cert("mallory", rogue))}  # fmt: skip


def _cert(name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None, *,
          ca: bool = False, server: bool = False) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    else:
        eku = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
    if server:
        ip = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        b = b.add_extension(x509.SubjectAlternativeName([ip]), critical=False)
    cert = b.sign(issuer[1] if issuer else key, hashes.SHA256())
    return cert, key


def _write(d: Path, name: str, pair: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> tuple[Path, Path]:  # fmt: skip
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    crt.write_bytes(pair[0].public_bytes(serialization.Encoding.PEM))
    key.write_bytes(pair[1].private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    key.chmod(0o600)
    return crt, key
