"""Self-signed certificates and keys for one test cluster.

Every cluster gets its own CA, so two clusters on one machine can never accept each other's clients.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class ClusterPki:
    """Paths of the PEM files the control-plane components are started with."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_pub: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _issue(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    is_ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def create_pki(directory: Path) -> ClusterPki:
    """Write a CA, the API server's serving pair, an admin client pair and the service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kubetrain-test-ca")
    ca = _issue(subject=ca_name, key=ca_key, issuer=ca_name, issuer_key=ca_key, is_ca=True)

    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue(
        subject=_name("kube-apiserver"),
        key=server_key,
        issuer=ca_name,
        issuer_key=ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            # The real node's pods reach the API server as the `kubernetes` Service (the first address of
            # the service range) and kube-proxy forwards to the sandbox's cluster address.
            x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.213.0.1")),
        ],
    )
    # system:masters bypasses RBAC: the admin identity is for the harness and the tests' own setup only;
    # code under test (the operator) runs with a ServiceAccount token so its RBAC is really checked.
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _issue(
        subject=_name("kubetrain-test-admin", "system:masters"),
        key=admin_key,
        issuer=ca_name,
        issuer_key=ca_key,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    # Service-account tokens are signed with RSA: the API server's JWT issuer supports it everywhere.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = ClusterPki(
        ca_cert=directory / "ca.crt",
        server_cert=directory / "apiserver.crt",
        server_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.server_key, server_key)
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.admin_key, admin_key)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


@dataclass(frozen=True)
class ServingPair:
    """A CA and a serving certificate for 127.0.0.1, named as controller-runtime's cert dir wants."""

    directory: Path
    ca_cert: Path
    cert: Path
    key: Path


def create_serving_pair(directory: Path, common_name: str) -> ServingPair:
    """A CA of its own and a serving pair for 127.0.0.1 and localhost in `directory` (tls.crt, tls.key,
    ca.crt): for a webhook server the API server reaches on the loopback address."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{common_name}-ca")
    ca = _issue(subject=ca_name, key=ca_key, issuer=ca_name, issuer_key=ca_key, is_ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(
        subject=_name(common_name),
        key=key,
        issuer=ca_name,
        issuer_key=ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    pair = ServingPair(directory, directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    pair.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)
    return pair
