"""The fedproto exception hierarchy.

Every error fedproto raises on purpose derives from :class:`FedProtoError` and carries structured
attributes (``party``, ``round_idx``, ``state``, ``phase``) as well as a message that names them::

    FedProtoError
      ProtocolError
        LocalProtocolError        we asked a machine to do something illegal
        RemoteProtocolError       a peer sent something illegal or undecodable
          DecodeError
          InsufficientParticipants
          RunAborted
      TransportError
        TransportClosed
        TransportBroken
          PeerUnreachable
          PartyCrashed
        PeerDropped
      AgreementMismatch         a peer runs another protocol, other options or another roster
        SessionMismatch         a machine's session is not the run's (also a ValueError)

Configuration mistakes are ``ValueError``/``TypeError`` at construction time instead.

A message names its structured attributes once, in one suffix: ``"... (party=w1, round_idx=2)"``.
A message that quotes another error quotes it with :func:`describe` (its sentence without the
suffix), so ``party=`` never appears twice with two different values; the quoted error stays
reachable as ``__cause__``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FedProtoError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "DecodeError",
    "InsufficientParticipants",
    "RunAborted",
    "TransportError",
    "TransportClosed",
    "TransportBroken",
    "PeerUnreachable",
    "PartyCrashed",
    "PeerDropped",
    "AgreementMismatch",
    "SessionMismatch",
    "describe",
]


class FedProtoError(Exception):
    """Base class of every error fedproto raises on purpose.

    Args:
        message: what went wrong, in one sentence.
        party: the party the error is about (a peer for remote errors, ourselves otherwise).
        round_idx: the 0-based round in which it happened, when known.
        state: the machine state's name, when known.
        phase: the protocol phase, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        party: str | None = None,
        round_idx: int | None = None,
        state: str | None = None,
        phase: str | None = None,
    ) -> None:
        self.party = party
        self.round_idx = round_idx
        self.state = state
        self.phase = phase
        context = [
            f"{name}={value}"
            for name, value in (
                ("party", party),
                ("round_idx", round_idx),
                ("state", state),
                ("phase", phase),
            )
            if value is not None
        ]
        self.detail = message
        super().__init__(f"{message} ({', '.join(context)})" if context else message)

    def context(self) -> dict[str, Any]:
        """The structured attributes as a dict (for logs and reports)."""
        return {
            "error": type(self).__name__,
            "message": self.detail,
            "party": self.party,
            "round_idx": self.round_idx,
            "state": self.state,
            "phase": self.phase,
        }


class ProtocolError(FedProtoError):
    """A protocol rule was broken, by us or by a peer."""


class LocalProtocolError(ProtocolError):
    """We asked a machine to do something illegal (e.g. ``result()`` before it is done)."""


class RemoteProtocolError(ProtocolError):
    """A peer sent something illegal: wrong round, unexpected message, bad content."""


class DecodeError(RemoteProtocolError):
    """A frame could not be decoded or failed validation (version, tag, fields, sizes)."""


class InsufficientParticipants(RemoteProtocolError):
    """Too few parties answered before a deadline.

    Attributes:
        missing: the parties that did not answer, sorted.
    """

    def __init__(self, message: str, *, missing: list[str] | tuple[str, ...] = (), **kwargs: Any):
        self.missing = tuple(sorted(missing))
        super().__init__(message, **kwargs)


class RunAborted(RemoteProtocolError):
    """A peer gave up on the run: the run is over for this party too.

    When a party's machine fails (a deadline passed, a peer crashed or broke the protocol), the
    runtime tells every party it has exchanged frames with before it exits (and they pass the
    notice on to theirs), so all of them end promptly instead of each waiting out its own deadline.

    A notice is evidence about its reporter only, the party that gave up: the culprits it names
    are the reporter's claim, which the receiver cannot check, so the error is about the reporter
    (``party``) and its message leads with it: ``"client-1 reports that client-0 failed: ..."``,
    or, passed on by the hub, ``"server says client-1 reports that client-0 failed: ..."``.

    Attributes:
        culprits: the parties the reporter blamed, sorted (the reporter itself when it failed on
            its own): a claim, not a verified fact.
        reporter: the party that gave up and sent the notice (authenticated by the transport when
            it told this party itself; else as ``relayed_by`` says).
        reason: the reporter's one-line account of its failure.
        relayed_by: the party that passed the reporter's notice on to this one (authenticated by
            the transport), or ``""`` when the reporter told this party itself.
        party: the reporter.
    """

    def __init__(
        self,
        message: str,
        *,
        culprits: list[str] | tuple[str, ...] = (),
        reporter: str = "",
        reason: str = "",
        relayed_by: str = "",
        **kwargs: Any,
    ):
        self.culprits = tuple(sorted(culprits))
        self.reporter = reporter
        self.reason = reason
        self.relayed_by = relayed_by
        super().__init__(message, **kwargs)


class TransportError(FedProtoError):
    """Moving a frame failed."""


class TransportClosed(TransportError):
    """The transport was closed by us; no more frames can be sent or received."""


class TransportBroken(TransportError):
    """The transport failed for an external reason (the original error is ``__cause__``)."""


class PeerUnreachable(TransportBroken):
    """A peer cannot be reached (unknown address, refused or lost connection)."""


class PartyCrashed(TransportBroken):
    """This endpoint's own party crashed (fault injection): like a killed process, it is gone.

    Raised by the memory transport's :class:`~fedproto.testing.Faults` ``crash_after`` on every
    later ``send`` and ``receive`` of the crashed party. :func:`~fedproto.runtime.run_parties`
    ends that party's task quietly (a crashed process reports nothing); its peers notice it the way
    they would notice a real crash, by its silence. ``party`` is the crashed party.
    """


class PeerDropped(TransportError):
    """A peer is gone, and the transport knows it: raised once by ``receive`` of every other party.

    Optional in the :class:`~fedproto.transport.Transport` contract: a transport that learns that a
    peer has left for good may raise it from ``receive`` (and ``receive_nowait``), once per gone
    peer, after the frames that peer sent before it left. The runtime turns it into a
    :class:`~fedproto.messages.PartyDropped` event for the machine, so a coordinator can act on a
    dropout at once instead of waiting out its deadline. The memory transport raises it when built
    with ``report_drops=True`` and a party crashes by fault injection; TCP and MPI never raise it
    (a peer's silence is all they see). The endpoint stays usable: the next ``receive`` returns the
    next frame. ``party`` is the peer that dropped.
    """


class AgreementMismatch(FedProtoError):
    """A peer runs another protocol, with other options or another roster, than this party.

    Raised before any protocol work, when the parties compare what they run
    (:mod:`fedproto.agreement`): by the TCP transport in its handshake, by the MPI transport when
    its endpoint is made. A configuration error, not a fault to wait out: it ends the run.
    ``party`` is the peer that differs; the message names the first differing option and both
    values.
    """


class SessionMismatch(AgreementMismatch, ValueError):
    """A party's machine declares another session than the run's, before any frame is sent.

    A protocol machine that computes with the session (it seeds a SecAgg+ graph, names an
    aggregation's keys or seals seeds with it) declares it as its ``session`` attribute; the
    runtime (:func:`~fedproto.runtime.run_party`, :func:`~fedproto.runtime.run_parties`), the
    lean engine (:func:`~fedproto.simulation.simulate`, sharded too) and the synchronous
    :class:`~fedproto.testing.Harness` compare it with the run's session
    (:attr:`~fedproto.runtime.RuntimeConfig.session`) when they start, as they do an endpoint's
    own ``session`` (a TCP endpoint's handshake session). A machine built without ``session=``
    holds its default, 0, and in a run of another session fails here too: otherwise it would
    compute with the wrong session and the run would end with wrong results and no error. A
    configuration error (so also a ``ValueError``), raised before any frame is sent.

    Attributes:
        party: the first party whose machine (or endpoint) differs, in mapping order.
        parties: every such party, in mapping order.
        session: the session ``party``'s machine declares.
        expected: the run's session.
    """

    def __init__(
        self,
        message: str,
        *,
        parties: tuple[str, ...] = (),
        session: int | None = None,
        expected: int | None = None,
        **kwargs: Any,
    ):
        self.parties = tuple(parties)
        self.session = session
        self.expected = expected
        super().__init__(message, **kwargs)


def describe(error: BaseException) -> str:
    """One sentence for ``error``, to quote inside another error's message.

    Args:
        error: any exception.

    Returns:
        ``error.detail`` for a :class:`FedProtoError` (its message without the structured
        ``(party=..., ...)`` suffix, which belongs to the quoting error), else ``str(error)``, or
        the exception's class name when that is empty.
    """
    if isinstance(error, FedProtoError):
        return error.detail
    return str(error) or type(error).__name__
