"""The paired node's own TLS certificate, and the pin a sidecar keeps of it.

``sessionwatch node --tls`` serves HTTPS with a certificate it makes for itself on first
start: a self-signed P-256 key and certificate in one PEM file, mode 0600, like the token
(made with ``cryptography``, the library Python's own TLS tooling points to). No certificate
authority is involved: the sidecar pins the certificate's SHA-256 fingerprint in
``[nodes.NAME] fingerprint``, and the TLS handshake fails closed on any other certificate.
The node logs its fingerprint at every start; ``doctor`` checks the pin.
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

from monitor.errors import ConfigError
from monitor.paths import make_private_dirs
from monitor.private import refuse_if_shared

log = logging.getLogger(__name__)

VALID_DAYS = 3650  # a pin, not a CA's expiry, is what the sidecar trusts


def fingerprint_of_der(der: bytes) -> str:
    """The pin of a certificate: the SHA-256 of its DER bytes, as lowercase hex."""
    return hashlib.sha256(der).hexdigest()


def _make(path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sessionwatch node")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=VALID_DAYS))
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ) + cert.public_bytes(serialization.Encoding.PEM)
    make_private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    log.info("created the node's TLS certificate %s", path)


def server_context(path: Path) -> tuple[ssl.SSLContext, str]:
    """The node's TLS context from its key and certificate (made when absent), and the
    certificate's fingerprint. A file others can read is refused."""
    refuse_if_shared(path, "the node's TLS key and certificate")
    try:
        if not path.exists():
            _make(path)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(path)
        pem = path.read_text(encoding="ascii")
    except (OSError, ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"cannot use the node's TLS certificate {path}: {reason}") from None
    begin = pem.find("-----BEGIN CERTIFICATE-----")
    if begin < 0:
        raise ConfigError(f"{path} holds no certificate")
    der = ssl.PEM_cert_to_DER_cert(pem[begin:])
    return context, fingerprint_of_der(der)
