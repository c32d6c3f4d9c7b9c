"""What every party of a run must agree on, and how two parties find where they differ.

Parties started on different hosts each parse their own command line. Nothing in the protocol
itself notices when one was started with ``--seed 4`` and the others with ``--seed 3``: each runs
its own, consistent computation and the run ends with different answers. So before any protocol
work the parties compare an :class:`Agreement`: the protocol's name, every option that must match
across parties, the roster (names, order, topology) and the session. The TCP transport does so in
its handshake (each side's record travels in its hello), the MPI transport with one collective
when its endpoint is made; an in-process (memory) run builds every party from one set of options
and needs no exchange.

Options that are each party's own business, and so are left out of the record
(:data:`PARTY_LOCAL_OPTIONS`):

* who and where this process is: ``--party``, ``--roster``, ``--listen-fd``,
  ``--insecure-shared-secret`` (the handshake itself fails if the modes differ);
* what it writes and shows: ``--party-report``, ``--report``, ``--plot``, ``--no-plot``,
  ``--quiet``, ``--full``, ``-v``, ``--log-level``, ``--compute-trace`` (its own handlers' CPU
  in its own report);
* how it computes: ``--device``, ``--no-compile-cache`` (the same kernels, on another device);
* ``--deadline``: how long this party waits for its peers; a machine never sees the value, only
  whether a deadline passed, so a slower host may wait longer;
* ``--data`` of a party that holds only its own data (each party's file is its own; what the
  protocol needs from the whole federation is agreed in its ``setup.data`` phase).

Everything else the command line parsed is in the record: the protocol's parameters (``--k``,
``--epsilon``, ``--seed``, ``--variant``, ``--secagg``, ...), ``--max-frame-bytes`` and, for
parties that each load the whole data set, ``--data``, ``--clients`` and ``--partition``.

Values are compared as given, after parsing (``--epsilon 1`` and ``--epsilon 1.0`` agree); an
option left to a default that depends on the data (``--k`` for a party whose file records its
data set's k) is recorded as the value the party will use, when the caller knows it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

from fedproto.errors import AgreementMismatch

__all__ = [
    "Agreement",
    "Difference",
    "PARTY_LOCAL_OPTIONS",
    "MAX_RECORD_BYTES",
    "check",
    "diff",
    "mismatch_message",
]

#: Option destinations (argparse ``dest``) that each party sets for itself (see the module docstring).
PARTY_LOCAL_OPTIONS = frozenset({
    "party", "roster", "listen_fd", "insecure_shared_secret", "party_report",
    "report", "plot", "no_plot", "quiet", "full", "verbose", "log_level",
    "device", "no_compile_cache", "deadline", "compute_trace",
})
#: Longest encoded record accepted from a peer (bytes): a TCP hello carries one.
MAX_RECORD_BYTES = 8 * 1024

_ITEMS = ("protocol", "parties", "topology", "session")


def _canonical(value: Any) -> Any:
    """``value`` as JSON data that compares and encodes the same on every host."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_canonical(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return str(value)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """The record two parties of one run compare before any protocol work.

    Args:
        protocol: the protocol's name (``fastlloyd``, ...).
        options: ``{option: value}`` of every option that must match across parties, keyed by
            how a user spells it (``"--seed"``); values are JSON data (converted here: paths and
            other objects become strings, tuples lists).
        parties: every party of the run, in roster order.
        topology: how the parties connect (``"star"``, ``"mesh"``), or ``None`` where it does
            not apply.
        session: the run's session id, or ``None`` when it is not fixed yet.

    Raises:
        TypeError: ``options`` is not a mapping with string keys, or ``parties`` not strings.
    """

    protocol: str
    options: Mapping[str, Any]
    parties: tuple[str, ...]
    topology: str | None = None
    session: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options):
            raise TypeError("options must be a mapping of option names (str) to values")
        parties = tuple(self.parties)
        if not all(isinstance(p, str) for p in parties):
            raise TypeError("parties must be strings")
        object.__setattr__(self, "parties", parties)
        object.__setattr__(self, "options", _canonical(dict(self.options)))

    @classmethod
    def of_options(
        cls,
        protocol: str,
        options: Mapping[str, Any],
        parties: Sequence[str],
        *,
        local: Iterable[str] = PARTY_LOCAL_OPTIONS,
        spelling: Mapping[str, str] | None = None,
        topology: str | None = None,
        session: int | None = None,
    ) -> "Agreement":
        """The record of parsed options (e.g. ``vars(args)`` of an argparse namespace).

        Args:
            protocol: the protocol's name.
            options: ``{dest: value}`` as parsed.
            parties: the run's parties in roster order.
            local: destinations left out (default :data:`PARTY_LOCAL_OPTIONS`).
            spelling: ``{dest: "--option"}``; a destination missing from it is spelt
                ``--`` + its name with ``_`` as ``-``.
            topology: see the class.
            session: see the class.
        """
        left_out = frozenset(local)
        spelling = spelling or {}
        kept = {
            spelling.get(dest, "--" + dest.replace("_", "-")): value
            for dest, value in options.items()
            if dest not in left_out
        }
        return cls(protocol, kept, tuple(parties), topology, session)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data."""
        return {
            "protocol": self.protocol,
            "options": dict(self.options),
            "parties": list(self.parties),
            "topology": self.topology,
            "session": self.session,
        }

    def to_bytes(self) -> bytes:
        """The canonical encoding (sorted JSON, UTF-8): equal records encode to equal bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> bytes:
        """SHA-256 of :meth:`to_bytes` (32 bytes)."""
        return hashlib.sha256(self.to_bytes()).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Agreement":
        """Parse a peer's :meth:`to_bytes`.

        Raises:
            ValueError: not a record (too long, not JSON, wrong fields or types).
        """
        if not isinstance(data, bytes) or len(data) > MAX_RECORD_BYTES:
            raise ValueError(f"an agreement record is at most {MAX_RECORD_BYTES} bytes of JSON")
        try:
            doc = json.loads(data.decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError("the agreement record is not JSON") from None
        if not isinstance(doc, dict) or set(doc) != {"protocol", "options", "parties", "topology", "session"}:
            raise ValueError("the agreement record does not have the expected fields")
        protocol, options, parties = doc["protocol"], doc["options"], doc["parties"]
        topology, session = doc["topology"], doc["session"]
        if (
            not isinstance(protocol, str)
            or not isinstance(options, dict)
            or not isinstance(parties, list)
            or not all(isinstance(p, str) for p in parties)
            or not (topology is None or isinstance(topology, str))
            or not (session is None or (isinstance(session, int) and not isinstance(session, bool)))
        ):
            raise ValueError("the agreement record has a field of the wrong type")
        return cls(protocol, options, tuple(parties), topology, session)


@dataclasses.dataclass(frozen=True)
class Difference:
    """Where two records first differ.

    Attributes:
        name: an option as spelt (``"--seed"``), or ``"protocol"``, ``"parties"``,
            ``"topology"``, ``"session"``, or ``"record"`` when one side has none.
        mine: this side's value (``None`` when unset or absent).
        theirs: the other side's value.
        missing: which side lacks the option or the record: ``"mine"``, ``"theirs"`` or ``None``.
    """

    name: str
    mine: Any
    theirs: Any
    missing: str | None = None


def diff(mine: Agreement | None, theirs: Agreement | None) -> Difference | None:
    """The first difference between two records, or ``None`` when they agree.

    The protocol is compared first, then the roster (``parties``) and ``topology``, then the
    options in name order, then the session (which options and roster often determine).
    ``None`` (a party that states no record) agrees only with ``None``.
    """
    if mine is None or theirs is None:
        if mine is None and theirs is None:
            return None
        return Difference("record", mine, theirs, "mine" if mine is None else "theirs")
    for item in _ITEMS[:3]:
        a, b = getattr(mine, item), getattr(theirs, item)
        if a != b:
            return Difference(item, a, b)
    for name in sorted(set(mine.options) | set(theirs.options)):
        if name not in theirs.options:
            return Difference(name, mine.options[name], None, "theirs")
        if name not in mine.options:
            return Difference(name, None, theirs.options[name], "mine")
        if mine.options[name] != theirs.options[name]:
            return Difference(name, mine.options[name], theirs.options[name])
    if mine.session != theirs.session:
        return Difference("session", mine.session, theirs.session)
    return None


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _runs_with(difference: Difference, value: Any, side: str) -> str:
    """How one side runs, in words: ``"with --seed 4"``, ``"fastlloyd"``, ``"the roster [...]"``."""
    name = difference.name
    if name == "record":
        return "without stating its options (no agreement record)" if value is None else "with an agreement record"
    if name == "protocol":
        return str(value)
    if name == "parties":
        return f"with the roster {list(value)}"
    if name in ("topology", "session"):
        return f"{name} {_shown(value)}"
    if difference.missing == side:
        return f"without {name} (another version of the protocol?)"
    if isinstance(value, bool):
        return f"with {name}" if value else f"without {name}"
    return f"with {name} {_shown(value)}"


def mismatch_message(difference: Difference, *, this_party: str, other: str) -> str:
    """One line saying who runs what, e.g. ``client-1 runs with --seed 4, this party (server)
    with --seed 3; every party must run the same options``."""
    theirs = _runs_with(difference, difference.theirs, "theirs")
    mine = _runs_with(difference, difference.mine, "mine")
    return f"{other} runs {theirs}, this party ({this_party}) {mine}; every party must run the same options"


def check(mine: Agreement | None, theirs: Agreement | None, *, this_party: str, other: str) -> None:
    """Raise unless ``other``'s record agrees with this party's.

    Raises:
        AgreementMismatch: the records differ; ``party`` is ``other`` and the message is
            :func:`mismatch_message`'s line.
    """
    difference = diff(mine, theirs)
    if difference is not None:
        raise AgreementMismatch(mismatch_message(difference, this_party=this_party, other=other), party=other)
