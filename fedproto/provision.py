"""Provisioning a federation: a CA, one key and certificate per party, one kit per party.

``fedproto provision`` (and :func:`provision`) makes everything the parties of a run need to
authenticate each other with mutual TLS 1.3 over the TCP transport:

* a **federation CA**: an ECDSA P-256 key and a self-signed certificate (``BasicConstraints
  CA:TRUE, pathlen:0``, key usage ``keyCertSign``/``cRLSign``), with a random serial and a
  random tag in its name, so two federations' CAs never look alike in a log;
* per **party**: an ECDSA P-256 key and a certificate signed by the CA whose identity is the
  party name (subject CN and a SubjectAlternativeName DNS name, both the party name), not a CA,
  key usage ``digitalSignature``, extended key usage ``serverAuth`` and ``clientAuth`` (in a
  star the hub listens and the others dial; in a mesh every party does both, and one kit serves
  either topology);
* per party a **kit** directory ``OUT/<party>/``: ``ca.pem`` (the CA's certificate),
  ``<party>.pem``, ``<party>.key`` (mode 0600) and ``roster.json`` (every party, the addresses
  given, the topology, the session if given, and a ``"tls"`` block naming the three files,
  relative to the roster); the kits of one federation differ only in that block and their own
  key and certificate. In the default star topology only the hub (the first party) needs an
  address: the others dial out to it.

The CA's private key is written to ``OUT/ca/ca.key`` (mode 0600, beside ``OUT/ca/ca.pem``) and
never into a kit: copy each kit to its party's host, and keep ``OUT/ca`` offline (it can issue
certificates the whole federation trusts). Kit and CA directories are mode 0700.

Party names become DNS names in certificates, and the TCP transport checks a listener's
certificate against the name it dialled, so a name must be one DNS label: lowercase letters,
digits and ``-``, starting with a letter, not ending with ``-``, at most 63 characters
(``server``, ``client-0``, ``machine-3``, ``root``, ``leaf-2``).

Certificates are valid from 5 minutes before they are made (hosts' clocks differ a little) for
``valid_days`` days. Everything here uses the ``cryptography`` package's X.509 builder; nothing
is home-made.

References:
    RFC 8446 (TLS 1.3), section 4.4.2 (certificates), 4.3.2 (certificate requests: the client
    certificate of mutual authentication); RFC 5280 (X.509 profile), sections 4.2.1.3 (key usage),
    4.2.1.6 (subject alternative name), 4.2.1.9 (basic constraints), 4.2.1.12 (extended key usage);
    RFC 1035 section 2.3.1 (the label syntax).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedproto.roster import Roster, TlsFiles

__all__ = [
    "CA_DIRECTORY",
    "DEFAULT_VALID_DAYS",
    "MAX_VALID_DAYS",
    "FederationCA",
    "PartyCredentials",
    "certificate_party",
    "check_output_directory",
    "check_party_name",
    "ephemeral_credentials",
    "provision",
    "write_kit",
]

#: Days a certificate is valid by default.
DEFAULT_VALID_DAYS = 365
#: Longest validity accepted (days): about 100 years, far inside X.509's date range.
MAX_VALID_DAYS = 36500
#: Directory of ``OUT`` that holds the CA's key and certificate (so no party may be called so).
CA_DIRECTORY = "ca"
#: How far before "now" certificates become valid, for hosts whose clocks differ a little.
CLOCK_SKEW = datetime.timedelta(minutes=5)

_LABEL = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
_CURVE = ec.SECP256R1()


def check_party_name(name: object) -> str:
    """``name`` if it can be a party's certificate identity (one DNS label), else ValueError.

    Raises:
        ValueError: one line saying why (lowercase letters, digits and ``-``, starting with a
            letter, not ending with ``-``, at most 63 characters).
    """
    if not isinstance(name, str) or _LABEL.fullmatch(name) is None:
        raise ValueError(
            f"party name {name!r} cannot be a certificate name: use one DNS label (lowercase letters, "
            "digits and '-', starting with a letter, not ending with '-', at most 63 characters)"
        )
    return name


def _check_valid_days(valid_days: object) -> int:
    if isinstance(valid_days, bool) or not isinstance(valid_days, int) or not 1 <= valid_days <= MAX_VALID_DAYS:
        raise ValueError(f"valid_days must be an integer in 1..{MAX_VALID_DAYS}, got {valid_days!r}")
    return valid_days


def _validity(valid_days: int, not_before: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    if not_before is None:
        not_before = datetime.datetime.now(datetime.timezone.utc) - CLOCK_SKEW
    elif not_before.tzinfo is None:
        not_before = not_before.replace(tzinfo=datetime.timezone.utc)
    return not_before, not_before + datetime.timedelta(days=valid_days)


def _certificate_builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey,
    start: datetime.datetime, end: datetime.datetime,
) -> x509.CertificateBuilder:
    """A certificate, extensions still to add, of ``subject``'s key ``public`` by ``issuer``,
    valid from ``start`` to ``end`` (UTC), with a random serial number."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """What a key may do: the CA's signs certificates and CRLs only, a party's signs only (its
    TLS handshakes)."""
    return x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclasses.dataclass(frozen=True)
class PartyCredentials:
    """One party's private key and certificate (PEM), and the CA certificate that vouches for it.

    Attributes:
        party: the party name the certificate names.
        key_pem: the private key, PKCS#8 PEM, unencrypted (write it mode 0600).
        certificate_pem: the party's certificate, PEM.
        ca_pem: the federation CA's certificate, PEM.
    """

    party: str
    key_pem: bytes = dataclasses.field(repr=False)
    certificate_pem: bytes
    ca_pem: bytes

    def write(self, directory: str | os.PathLike[str], *, certificate_mode: int = 0o644) -> TlsFiles:
        """Write ``ca.pem``, ``<party>.pem`` and ``<party>.key`` (0600) into an existing directory.

        Args:
            directory: where to write them.
            certificate_mode: the mode of the two certificates (public: 0644 by default; the
                launcher's throwaway kits use 0600, as every file of a launch).

        Returns:
            Where they are (absolute paths).

        Raises:
            FileExistsError: one of the files exists already (nothing is overwritten).
        """
        directory = Path(directory).absolute()
        files = TlsFiles(directory / "ca.pem", directory / f"{self.party}.pem", directory / f"{self.party}.key")
        _write_new(files.ca, self.ca_pem, certificate_mode)
        _write_new(files.cert, self.certificate_pem, certificate_mode)
        _write_new(files.key, self.key_pem, 0o600)
        return files


class FederationCA:
    """A federation's certificate authority: issues one certificate per party.

    Args:
        key: the CA's private key (ECDSA).
        certificate: the CA's self-signed certificate.

    Example::

        ca = FederationCA.create()
        credentials = ca.issue("client-0")
    """

    def __init__(self, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self.key = key
        self.certificate = certificate

    @classmethod
    def create(
        cls,
        *,
        valid_days: int = DEFAULT_VALID_DAYS,
        not_before: datetime.datetime | None = None,
        name: str | None = None,
    ) -> "FederationCA":
        """A fresh CA: a new P-256 key and a self-signed CA certificate.

        Args:
            valid_days: days the CA certificate is valid (1..36500).
            not_before: start of validity (UTC; default: 5 minutes ago).
            name: the CA's common name (default: ``"fedproto federation CA <random tag>"``).

        Raises:
            ValueError: ``valid_days`` out of range.
        """
        valid_days = _check_valid_days(valid_days)
        start, end = _validity(valid_days, not_before)
        key = ec.generate_private_key(_CURVE)
        subject = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedproto"),
            x509.NameAttribute(NameOID.COMMON_NAME, name or f"fedproto federation CA {secrets.token_hex(4)}"),
        ])
        public = key.public_key()
        certificate = (
            _certificate_builder(subject, subject, public, start, end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate)

    @property
    def certificate_pem(self) -> bytes:
        """The CA's certificate, PEM."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The CA's private key, PKCS#8 PEM, unencrypted."""
        return _key_pem(self.key)

    def issue(
        self, party: str, *, valid_days: int = DEFAULT_VALID_DAYS, not_before: datetime.datetime | None = None
    ) -> PartyCredentials:
        """A new key and a certificate for ``party``, signed by this CA.

        Args:
            party: the party name (one DNS label, see :func:`check_party_name`).
            valid_days: days the certificate is valid (1..36500).
            not_before: start of validity (UTC; default: 5 minutes ago). A date far enough in the
                past makes an expired certificate (tests do).

        Raises:
            ValueError: a bad party name or ``valid_days``.
        """
        check_party_name(party)
        valid_days = _check_valid_days(valid_days)
        start, end = _validity(valid_days, not_before)
        key = ec.generate_private_key(_CURVE)
        public = key.public_key()
        ca_key_id = self.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, party)])
        certificate = (
            _certificate_builder(subject, self.certificate.subject, public, start, end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(party)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return PartyCredentials(
            party, _key_pem(key), certificate.public_bytes(serialization.Encoding.PEM), self.certificate_pem
        )


def certificate_party(certificate_pem: bytes) -> str:
    """The party a certificate names: its single SubjectAlternativeName DNS name.

    Raises:
        ValueError: not a PEM certificate, or it names no party or more than one.
    """
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError as exc:
        raise ValueError(f"not a PEM certificate ({exc})") from None
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise ValueError("the certificate has no SubjectAlternativeName naming its party") from None
    dns = names.get_values_for_type(x509.DNSName)
    if len(dns) != 1:
        raise ValueError(f"the certificate must name exactly one party (DNS name), it names {dns}")
    return dns[0]


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write a new file with ``mode`` (refusing to overwrite one)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)  # the umask may have taken bits away
        handle.write(data)


def check_output_directory(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` if provisioning may write there: absent (its parent a writable directory) or empty.

    Raises:
        ValueError: one line: it is a file, a non-empty directory, or its parent is missing or
            not writable.
    """
    path = Path(out_dir).expanduser()
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise ValueError(f"{out_dir}: exists and is not a directory")
        if any(path.iterdir()):
            raise ValueError(f"{out_dir}: the directory is not empty (provisioning never overwrites keys)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{out_dir}: the directory is not writable")
        return path
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"{out_dir}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{out_dir}: the directory {parent} is not writable")
    return path


def write_kit(
    directory: str | os.PathLike[str],
    credentials: PartyCredentials,
    parties: Sequence[str],
    addresses: Mapping[str, str],
    *,
    session: int | None = None,
    topology: str = "star",
    certificate_mode: int = 0o644,
) -> Path:
    """Write one party's kit: its TLS files and a roster naming them; returns the roster's path.

    Args:
        directory: the kit directory (created, mode 0700; it must not exist or be empty).
        credentials: the party's key and certificate and the CA's certificate.
        parties: every party, in roster order.
        addresses: ``{party: "host:port"}`` for the hub (the first party) in a star, for every
            party in a mesh.
        session: the run's session id, or ``None``.
        topology: ``"star"`` or ``"mesh"`` (see :class:`~fedproto.roster.Roster`).
        certificate_mode: the mode of the two certificate files (see
            :meth:`PartyCredentials.write`); the key and the roster are always 0600.

    Raises:
        ValueError: a bad roster (see :class:`~fedproto.roster.Roster`).
        FileExistsError: a file of the kit exists already.
    """
    directory = Path(directory)
    relative = TlsFiles("ca.pem", f"{credentials.party}.pem", f"{credentials.party}.key")
    roster = Roster(tuple(parties), dict(addresses), None, session, relative, topology)  # checked before writing
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    credentials.write(directory, certificate_mode=certificate_mode)
    return roster.save(directory / "roster.json")


def provision(
    parties: Sequence[str],
    addresses: Mapping[str, str],
    out_dir: str | os.PathLike[str],
    *,
    valid_days: int = DEFAULT_VALID_DAYS,
    session: int | None = None,
    topology: str = "star",
) -> dict[str, Path]:
    """Make a federation's CA and one kit per party under ``out_dir`` (see the module docstring).

    Every check is made before anything is written; the keys are made in memory first.

    Args:
        parties: every party, in roster order (unique DNS-label names, see
            :func:`check_party_name`).
        addresses: ``{party: "host:port"}`` (where it listens): the hub's (the first party's) in
            a star, where the others only dial out; every party's in a mesh.
        out_dir: a directory that does not exist yet (its parent must) or is empty.
        valid_days: days the CA and party certificates are valid (1..36500).
        session: the run's session id written into every roster, or ``None``.
        topology: ``"star"`` (the default) or ``"mesh"``, written into every roster.

    Returns:
        ``{party: kit directory}`` in roster order; the CA's key is ``out_dir/ca/ca.key``.

    Raises:
        ValueError: one line: a bad or repeated party name, a missing or malformed address, an
            address of port 0, a session, ``valid_days`` or topology out of range, or an output
            directory that exists and is not empty (or cannot be made).
    """
    parties = tuple(parties)
    if len(parties) < 2:
        raise ValueError(f"a federation needs at least two parties, got {list(parties)}")
    for party in parties:
        check_party_name(party)
    if CA_DIRECTORY in parties:
        raise ValueError(f"party name {CA_DIRECTORY!r} is taken by the CA's directory; choose another")
    valid_days = _check_valid_days(valid_days)
    # the roster's own checks (unique names, every address well formed, the session's range)
    template = Roster(
        parties, dict(addresses), None, session, TlsFiles("ca.pem", "party.pem", "party.key"), topology
    )
    unknown_port = [p for p, a in template.addresses.items() if a.rpartition(":")[2] == "0"]
    if unknown_port:
        raise ValueError(f"the address of {unknown_port[0]!r} has port 0; give the port it will listen on")
    out = check_output_directory(out_dir)

    ca = FederationCA.create(valid_days=valid_days)
    credentials = {p: ca.issue(p, valid_days=valid_days) for p in parties}

    out.mkdir(mode=0o700, exist_ok=True)
    ca_dir = out / CA_DIRECTORY
    ca_dir.mkdir(mode=0o700)
    _write_new(ca_dir / "ca.key", ca.key_pem, 0o600)
    _write_new(ca_dir / "ca.pem", ca.certificate_pem, 0o644)
    kits = {}
    for party in parties:
        kits[party] = out / party
        write_kit(kits[party], credentials[party], parties, template.addresses, session=session, topology=topology)
    return kits


def ephemeral_credentials(parties: Sequence[str], *, valid_days: int = 1) -> dict[str, PartyCredentials]:
    """A throwaway CA's credentials for every party, in memory (the launcher, in-process TLS
    networks, tests).

    The CA's key is dropped once the certificates are signed, so nobody can issue more, and it is
    never written anywhere: write each party's kit with :func:`write_kit`.

    Raises:
        ValueError: a party name that cannot be a certificate name.
    """
    ca = FederationCA.create(valid_days=valid_days)
    return {p: ca.issue(p, valid_days=valid_days) for p in parties}
