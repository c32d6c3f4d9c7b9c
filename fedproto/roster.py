"""The roster of a multi-process run: who takes part, where each party listens, how links are secured.

One JSON format serves the CLI (``fedproto party ... --roster FILE``), the process launcher
(:func:`fedproto.launcher.launch_local`), the provisioning command (``fedproto provision``), the
examples and the docs::

    {
      "session": 1234,
      "tls": {"ca": "ca.pem", "cert": "client-0.pem", "key": "client-0.key"},
      "parties": [
        {"name": "server", "address": "10.0.0.1:7000"},
        {"name": "client-0"},
        {"name": "client-1"}
      ]
    }

``parties`` is in roster order (the order every process of the run agrees on). The first party
is the **hub** (the coordinating one: ``server``, ``coordinator``, ``root``): in the default
``"topology": "star"`` only the hub listens, so only its entry needs an ``address``; the others
dial out to it (an address they give is not used). With ``"topology": "mesh"`` every party
listens and every entry needs an address (see :mod:`fedproto.transports.tcp`). ``session`` is
optional; when it is given it is the run's session (a party that loads the whole data set, whose
options make a session of their own, refuses to run with another; parties that hold their own
data take the roster's), and parties started with different options are told apart by the
agreement they compare in the handshake (:mod:`fedproto.agreement`). ``tls`` names this party's TLS material (PEM files, paths relative to the roster file): the
federation CA's certificate, the party's own certificate and its private key; the TCP transport
then runs mutual TLS 1.3 (:mod:`fedproto.provision` writes one such roster per party, the rosters
of one federation differing only in this block). Without ``tls`` the roster must hold a
``"secret"`` (hex, at least 16 bytes) for the shared-secret handshake, which the TCP transport
uses only when asked to explicitly (it authenticates membership, not names, and does not encrypt).
A roster may hold both. The file is written readable by its owner only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Roster", "TlsFiles", "MIN_SECRET_BYTES", "TOPOLOGIES"]

#: Shortest accepted secret (bytes).
MIN_SECRET_BYTES = 16
#: How the parties of a TCP run connect: only the hub listens (``"star"``), or all (``"mesh"``).
TOPOLOGIES = ("star", "mesh")
_SESSION_LIMIT = 2**64


def _check_address(party: str, address: Any) -> str:
    """``address`` if it is ``"host:port"`` (IPv6 as ``"[::1]:port"``), else ValueError."""
    if not isinstance(address, str):
        raise ValueError(f"the address of {party!r} must be a 'host:port' string, got {type(address).__name__}")
    text = address.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        ok = bool(sep) and rest.startswith(":")
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        ok = bool(sep) and ":" not in host
    if not ok or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"the address of {party!r} must be 'host:port' with a port in 0..65535, got {address!r}")
    return text


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """One party's TLS material: three PEM files.

    Args:
        ca: the federation CA's certificate (the only certificate a peer's is checked against).
        cert: this party's certificate, issued by that CA, naming the party.
        key: this party's private key (keep it readable by its owner only).

    Relative paths are relative to the working directory; :meth:`Roster.load` makes those of a
    roster file relative to the file's directory.

    Raises:
        TypeError: a path is not a string or path-like.
        ValueError: an empty path.
    """

    ca: Path
    cert: Path
    key: Path

    def __post_init__(self) -> None:
        for name in ("ca", "cert", "key"):
            value = getattr(self, name)
            if not isinstance(value, str | os.PathLike):
                raise TypeError(f"TlsFiles.{name} must be a path, got {type(value).__name__}")
            if not str(value):
                raise ValueError(f"TlsFiles.{name} must not be empty")
            object.__setattr__(self, name, Path(value))

    def anchored_at(self, directory: str | os.PathLike[str]) -> "TlsFiles":
        """These files with relative paths taken from ``directory`` (absolute ones unchanged)."""
        base = Path(directory)
        return TlsFiles(*(base / getattr(self, n) for n in ("ca", "cert", "key")))

    def to_dict(self) -> dict[str, str]:
        """The roster's ``"tls"`` block."""
        return {"ca": str(self.ca), "cert": str(self.cert), "key": str(self.key)}


@dataclasses.dataclass(frozen=True)
class Roster:
    """The parties of a run, their addresses, how links are secured, and optionally the session.

    Args:
        parties: every party name, in roster order (unique, non-empty strings); the first is the
            hub.
        addresses: ``{party: "host:port"}`` (IPv6 as ``"[::1]:port"``): for every party in a
            mesh, for the hub at least in a star.
        secret: the run's shared secret, at least 16 bytes (:meth:`create` draws 32), or ``None``
            when ``tls`` is given.
        session: the run's session id in 0..2**64-1, or ``None`` when the roster does not fix it.
        tls: this party's TLS material (:class:`TlsFiles`), or ``None``.
        topology: ``"star"`` (only the hub listens; the default) or ``"mesh"`` (every party does).

    Raises:
        ValueError: duplicate or empty names, a party without an address (in a star: the hub;
            or an address for a party outside the roster), an address that is not
            ``host:port``, a short secret, neither a secret nor TLS material, a session out of
            range, an unknown topology.
        TypeError: the secret is not bytes, or ``tls`` is not :class:`TlsFiles`.
    """

    parties: tuple[str, ...]
    addresses: dict[str, str] = dataclasses.field(hash=False)
    secret: bytes | None = dataclasses.field(default=None, repr=False)
    session: int | None = None
    tls: TlsFiles | None = None
    topology: str = "star"

    @property
    def hub(self) -> str:
        """The coordinating party (the roster's first): in a star, the only one that listens."""
        return self.parties[0]

    def __post_init__(self) -> None:
        parties = tuple(self.parties)
        if not parties:
            raise ValueError("the roster lists no parties")
        for name in parties:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"party names must be non-empty strings, got {name!r}")
        duplicates = sorted({p for p in parties if parties.count(p) > 1})
        if duplicates:
            raise ValueError(f"party names must be unique; repeated: {', '.join(duplicates)}")
        addresses = dict(self.addresses)
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"the topology must be 'star' or 'mesh', got {self.topology!r}")
        if self.topology == "star" and parties[0] not in addresses:
            raise ValueError(
                f"no address for the hub {parties[0]} (the first party: in a star it alone listens)"
            )
        missing = [p for p in parties if p not in addresses]
        if missing and self.topology == "mesh":
            raise ValueError(f"no address for {', '.join(missing)} (in a mesh every party listens)")
        extra = sorted(set(addresses) - set(parties))
        if extra:
            raise ValueError(f"addresses for parties outside the roster: {', '.join(map(str, extra))}")
        checked = {p: _check_address(p, addresses[p]) for p in parties if p in addresses}
        if self.tls is not None and not isinstance(self.tls, TlsFiles):
            raise TypeError(f"tls must be TlsFiles, got {type(self.tls).__name__}")
        if self.secret is None:
            if self.tls is None:
                raise ValueError("the roster has neither TLS material nor a secret")
        elif not isinstance(self.secret, bytes | bytearray):
            raise TypeError(f"the secret must be bytes, got {type(self.secret).__name__}")
        elif len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the secret must be at least {MIN_SECRET_BYTES} bytes, got {len(self.secret)}")
        session = self.session
        if session is not None and (
            isinstance(session, bool) or not isinstance(session, int) or not 0 <= session < _SESSION_LIMIT
        ):
            raise ValueError(f"the session must be an integer in 0..2**64-1, got {session!r}")
        object.__setattr__(self, "parties", parties)
        object.__setattr__(self, "addresses", checked)
        if self.secret is not None:
            object.__setattr__(self, "secret", bytes(self.secret))

    @classmethod
    def create(
        cls,
        addresses: Mapping[str, str],
        *,
        session: int | None = None,
        secret_bytes: int = 32,
        parties: Sequence[str] | None = None,
        topology: str = "star",
    ) -> "Roster":
        """A roster with a fresh random secret (:func:`secrets.token_bytes`).

        Args:
            addresses: ``{party: "host:port"}``, in roster order when ``parties`` is not given.
            session: the run's session id, or ``None``.
            secret_bytes: length of the secret (at least 16).
            parties: every party in roster order (default: the keys of ``addresses``); in a star,
                parties without an address dial out to the hub.
            topology: ``"star"`` or ``"mesh"``.
        """
        parties = tuple(addresses) if parties is None else tuple(parties)
        return cls(parties, dict(addresses), secrets.token_bytes(secret_bytes), session, topology=topology)

    # -- JSON -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The roster in its JSON layout (see the module docstring)."""
        doc: dict[str, Any] = {}
        if self.session is not None:
            doc["session"] = self.session
        if self.secret is not None:
            doc["secret"] = self.secret.hex()
        if self.tls is not None:
            doc["tls"] = self.tls.to_dict()
        if self.topology != "star":
            doc["topology"] = self.topology
        doc["parties"] = [
            {"name": p, "address": self.addresses[p]} if p in self.addresses else {"name": p} for p in self.parties
        ]
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> "Roster":
        """Parse the JSON layout (already decoded); ``tls`` paths are kept as written.

        Raises:
            ValueError: one line saying what is wrong.
        """
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        unknown = sorted(set(doc) - {"session", "secret", "tls", "topology", "parties"})
        if unknown:
            raise ValueError(
                f"unknown keys {', '.join(map(repr, unknown))} (expected session, secret, tls, topology, parties)"
            )
        topology = doc.get("topology", "star")
        if topology not in TOPOLOGIES:
            raise ValueError(f"the topology must be \"star\" or \"mesh\", got {topology!r}")
        if "parties" not in doc:
            raise ValueError("no 'parties' list of {\"name\": ..., \"address\": \"host:port\"}")
        entries = doc["parties"]
        if not isinstance(entries, list):
            raise ValueError(f"'parties' must be a list, got {type(entries).__name__}")
        names: list[str] = []
        addresses: dict[str, str] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not {"name"} <= set(entry) <= {"name", "address"}:
                raise ValueError(f"parties[{i}] must be an object with 'name' and (optional in a star) 'address'")
            name = entry["name"]
            if not isinstance(name, str):
                raise ValueError(f"parties[{i}]: the name must be a string, got {name!r}")
            if name in names:
                raise ValueError(f"party names must be unique; repeated: {name}")
            if "address" not in entry and (topology == "mesh" or i == 0):
                role = "in a mesh every party listens" if topology == "mesh" else "the first party is the star's hub"
                raise ValueError(f"parties[{i}] ({name}) needs an 'address': {role}")
            names.append(name)
            if "address" in entry:
                addresses[name] = entry["address"]
        tls = None
        if "tls" in doc:
            block = doc["tls"]
            if (
                not isinstance(block, dict)
                or set(block) != {"ca", "cert", "key"}
                or not all(isinstance(v, str) and v for v in block.values())
            ):
                raise ValueError("'tls' must be an object of exactly 'ca', 'cert' and 'key' file paths")
            tls = TlsFiles(block["ca"], block["cert"], block["key"])
        secret = None
        if "secret" in doc:
            secret_text = doc["secret"]
            try:
                if not isinstance(secret_text, str):
                    raise ValueError
                secret = bytes.fromhex(secret_text)
            except ValueError:
                raise ValueError("the secret must be a hex string") from None
        elif tls is None:
            raise ValueError("no 'tls' block (fedproto provision writes one) and no 'secret' (hex)")
        session = doc.get("session")
        if session is not None and (isinstance(session, bool) or not isinstance(session, int)):
            raise ValueError(f"the session must be an integer, got {session!r}")
        return cls(tuple(names), addresses, secret, session, tls, topology)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Roster":
        """Read a roster file; relative ``tls`` paths are taken from the file's directory.

        Raises:
            ValueError: the file cannot be read or is not a valid roster; the message is one line
                naming the file and the problem.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read roster {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError:
            raise ValueError(f"cannot read roster {path}: not UTF-8 text") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"roster {path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        try:
            roster = cls.from_dict(doc)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"roster {path}: {exc}") from None
        if roster.tls is not None:
            roster = dataclasses.replace(roster, tls=roster.tls.anchored_at(Path(path).absolute().parent))
        return roster

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the roster as JSON, readable and writable by its owner only (mode 0600).

        Returns:
            The path written.
        """
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
            json.dump(self.to_dict(), handle, indent=2)
            handle.write("\n")
        return path

    # -- checks ----------------------------------------------------------------------------------

    def check_matches(self, parties: Sequence[str], session: int, *, source: str = "the roster") -> None:
        """Check that this roster is for the run these arguments make.

        Args:
            parties: the run's parties in roster order.
            session: the run's session id.
            source: how to name the roster in the message (e.g. its file).

        Raises:
            ValueError: other parties, another order, or another session.
        """
        if tuple(parties) != self.parties:
            raise ValueError(f"{source} lists {list(self.parties)}, this run needs {list(parties)}")
        if self.session is not None and self.session != session:
            raise ValueError(f"{source} is for session {self.session}, these arguments make session {session}")
