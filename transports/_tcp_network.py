"""Many TCP endpoints at once: :class:`TcpNetwork` (the CLI's transport), :func:`open_tcp_network`.

:func:`open_tcp_network` serves every party of a roster in this process on loopback (tests,
benchmarks, examples); :class:`TcpNetwork` hosts the local parties of a multi-process run at the
addresses of its roster, or all of them on loopback. Both serve their endpoints in one nursery
and end them in order: star clients say goodbye and close, then a hub lingers for clients
elsewhere, then everything closes.
"""

from __future__ import annotations

import secrets
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from fedproto.agreement import Agreement
from fedproto.roster import TlsFiles
from fedproto.transport import Network
from fedproto.transports._framing import MAX_WIRE_FRAME_BYTES
from fedproto.transports._tcp_address import TcpAddress
from fedproto.transports._tcp_endpoint import TcpTransport
from fedproto.transports._tcp_state import DEFAULT_KEEPALIVE_S, TOPOLOGIES


@asynccontextmanager
async def _serving_all(endpoints: Mapping[str, TcpTransport], *, share_addresses: bool = False) -> AsyncIterator[None]:
    """Serve every endpoint in an internal nursery; close them all on exit.

    Listening endpoints start first; with ``share_addresses`` their bound addresses are then
    given to every endpoint, before star clients start dialling. On a normal exit the star
    clients here say goodbye (:meth:`TcpTransport.leave`) and are closed first, then a hub here
    lingers (:meth:`TcpTransport.linger`) for clients elsewhere. An error of the body comes out as itself, not wrapped in the nursery's
    exception group.
    """
    try:
        async with trio.open_nursery() as nursery:
            try:
                clients = [e for e in endpoints.values() if e._is_star_client]
                for endpoint in endpoints.values():
                    if not endpoint._is_star_client:
                        await nursery.start(endpoint.serve)
                if share_addresses:
                    bound = {p: e.addresses[p] for p, e in endpoints.items() if not e._is_star_client}
                    for endpoint in endpoints.values():
                        endpoint.addresses.update(bound)
                for endpoint in clients:
                    await nursery.start(endpoint.serve)
                yield
                async with trio.open_nursery() as leaving:
                    for endpoint in clients:
                        leaving.start_soon(endpoint.leave)
                for endpoint in clients:
                    await endpoint.aclose()
                for endpoint in endpoints.values():
                    await endpoint.linger()
            finally:
                # aclose never blocks, so shielding it cannot hang; it must not be skipped.
                with trio.CancelScope(shield=True):
                    for endpoint in endpoints.values():
                        await endpoint.aclose()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@contextmanager
def throwaway_tls(parties: Sequence[str]) -> Iterator[dict[str, TlsFiles]]:
    """Kits of a throwaway federation (fresh CA, its key dropped), in a private temporary directory.

    For in-process networks and tests: build the endpoints inside the ``with`` (they read their
    kit when constructed); the files are removed on exit.

    Yields:
        ``{party: TlsFiles}``.

    Raises:
        ValueError: a party name that cannot be a certificate name.
    """
    from fedproto.provision import ephemeral_credentials

    credentials = ephemeral_credentials(parties)
    with tempfile.TemporaryDirectory(prefix="fedproto-tls-") as tmp:  # mode 0700
        files = {}
        for party, creds in credentials.items():
            kit = Path(tmp) / party
            kit.mkdir(mode=0o700)
            files[party] = creds.write(kit)
        yield files


@asynccontextmanager
async def open_tcp_network(
    roster: Sequence[str],
    secret: bytes | None = None,
    *,
    tls: Mapping[str, TlsFiles] | None = None,
    host: str = "127.0.0.1",
    topology: str = "mesh",
    **kwargs: Any,
) -> AsyncIterator[dict[str, TcpTransport]]:
    """All parties of ``roster`` in this process, each serving on a free port of ``host``.

    For tests, benchmarks and examples. Every endpoint knows every other's bound address on entry
    (in a star: the hub's, the only one; the clients have dialled it, or are dialling); all are
    closed (and their listeners stopped) on exit. Links are mutual TLS 1.3 unless a ``secret`` is
    given (the shared-secret handshake, insecure: see the module docstring).

    Args:
        roster: every party of the run.
        secret: a per-run secret (at least 16 bytes) for the shared-secret handshake, or ``None``.
        tls: ``{party: TlsFiles}`` for every party; ``None`` (and no secret): a throwaway
            federation made for this network (:func:`throwaway_tls`).
        host: the address every party listens on (loopback by default).
        topology: ``"mesh"`` (every party listens) or ``"star"`` (only the roster's first party
            does; the others dial out to it).
        **kwargs: passed to :class:`TcpTransport` (``session``, ``max_frame_bytes``, timeouts).

    Yields:
        ``{party: TcpTransport}`` in roster order.

    Raises:
        ValueError: both ``secret`` and ``tls``, or ``tls`` missing a party.
    """
    roster = tuple(roster)
    kwargs["topology"] = topology
    listening = roster[:1] if topology == "star" else roster
    addresses = {p: TcpAddress(host, 0) for p in listening}
    if secret is not None:
        if tls is not None:
            raise ValueError("give either TLS material (tls=...) or the shared secret, not both")
        endpoints = {p: TcpTransport(p, roster, addresses, secret, **kwargs) for p in roster}
    elif tls is not None:
        missing = [p for p in roster if p not in tls]
        if missing:
            raise ValueError(f"no TLS material for {missing}")
        endpoints = {p: TcpTransport(p, roster, addresses, tls=tls[p], **kwargs) for p in roster}
    else:
        with throwaway_tls(roster) as files:
            endpoints = {p: TcpTransport(p, roster, addresses, tls=files[p], **kwargs) for p in roster}
    async with _serving_all(endpoints, share_addresses=True):
        yield endpoints


class TcpNetwork(Network):
    """TCP endpoints for the CLI registry: mutual TLS 1.3 and a star by default.

    Without ``addresses`` every party runs in this process on loopback (:func:`open_tcp_network`:
    a throwaway federation's TLS kits unless ``tls`` gives them). With ``addresses``, this process
    hosts the ``local`` parties at their given addresses and reaches the others at theirs; each
    local party needs its TLS kit (``tls``). In the star (the default) only the hub, the roster's
    first party, needs an address: the others dial out to it and it relays their frames to each
    other; ``topology="mesh"`` has every party listen, for a LAN. The shared-secret handshake (insecure: any holder of
    the secret can claim any name, frames are not encrypted) is used only when asked for with
    ``insecure_shared_secret=True``.

    :meth:`from_roster` builds one from a :class:`~fedproto.roster.Roster` (the roster file of a
    multi-process run: ``fedproto provision`` writes one per party), optionally serving on
    listening sockets inherited from the launcher.

    Args:
        addresses: ``{party: TcpAddress | "host:port"}`` for every party (in a star, the hub's
            at least), or None.
        secret: the per-run secret, with ``insecure_shared_secret=True`` only (required then with
            ``addresses``; without them a random one is drawn when ``None``).
        tls: the kit of the local party (a :class:`~fedproto.roster.TlsFiles`, for every local
            party it is for: its certificate names one party) or ``{party: TlsFiles}``.
        insecure_shared_secret: use the shared-secret handshake instead of TLS.
        host: listening host when ``addresses`` is None.
        listen_fds: ``{party: file descriptor}`` of bound TCP sockets that local parties serve
            on instead of binding their address (see :func:`fedproto.launcher.launch_local`);
            each is adopted (and closed with its endpoint) the first time its endpoint opens.
        topology: ``"star"`` (the default) or ``"mesh"`` (see :class:`TcpTransport`).
        agreement: what the local parties run (:class:`fedproto.agreement.Agreement`), compared
            in every handshake (see :class:`TcpTransport`); ``None`` compares nothing.
        **kwargs: passed to :class:`TcpTransport`.

    Attributes:
        max_frame_bytes_limit: the largest ``max_frame_bytes`` the wire allows (the 4-byte length
            prefix), so a front end can check the option before starting anything.
        default_keepalive_s: the star's keep-alive interval when none is given (seconds), so a
            front end can bound it (e.g. by a fraction of its deadline) without importing the
            transport's modules.

    Raises:
        ValueError: ``listen_fds`` without ``addresses`` or for parties without an address; a
            secret without ``insecure_shared_secret=True``; ``insecure_shared_secret=True`` with
            ``tls``, or with ``addresses`` but no secret; ``addresses`` without ``tls`` (in TLS
            mode).
    """

    name = "tcp"
    description = (
        "parties in separate processes or hosts: TCP streams under mutual TLS 1.3 (one certificate per party), "
        "length-prefixed frames"
    )
    max_frame_bytes_limit = MAX_WIRE_FRAME_BYTES
    default_keepalive_s = DEFAULT_KEEPALIVE_S

    def __init__(
        self,
        addresses: Mapping[str, TcpAddress | str] | None = None,
        secret: bytes | None = None,
        *,
        tls: TlsFiles | Mapping[str, TlsFiles] | None = None,
        insecure_shared_secret: bool = False,
        host: str = "127.0.0.1",
        listen_fds: Mapping[str, int] | None = None,
        topology: str = "star",
        agreement: Agreement | None = None,
        **kwargs: Any,
    ) -> None:
        if agreement is not None:
            kwargs["agreement"] = agreement
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be 'star' or 'mesh', got {topology!r}")
        listen_fds = dict(listen_fds or {})
        if listen_fds and addresses is None:
            raise ValueError("listen_fds need the addresses of every party")
        unknown = sorted(set(listen_fds) - set(addresses or {}))
        if unknown:
            raise ValueError(f"listen_fds for parties without an address: {unknown}")
        if insecure_shared_secret:
            if tls is not None:
                raise ValueError("insecure_shared_secret=True uses the shared secret instead of TLS: give one of them")
            if addresses is not None and secret is None:
                raise ValueError("a TCP network with explicit addresses needs the run's secret")
        elif secret is not None:
            raise ValueError(
                "the shared-secret handshake is insecure (any holder of the secret can claim any party's name, "
                "frames travel unencrypted): pass insecure_shared_secret=True to use it, or give TLS material"
            )
        elif addresses is not None and tls is None:
            raise ValueError(
                "a TCP network with explicit addresses needs each local party's TLS kit (tls=..., made by "
                "fedproto provision), or insecure_shared_secret=True and the run's secret"
            )
        self.addresses = addresses
        self.secret = secret
        self.tls = tls
        self.insecure_shared_secret = insecure_shared_secret
        self.host = host
        self.listen_fds = listen_fds
        self.topology = topology
        self.kwargs = kwargs

    @classmethod
    def from_roster(
        cls,
        roster: Any,
        *,
        listen_fds: Mapping[str, int] | None = None,
        insecure_shared_secret: bool = False,
        **kwargs: Any,
    ) -> "TcpNetwork":
        """The network of a roster: its addresses, topology, TLS kit (or secret) and session, if any.

        Args:
            roster: a :class:`fedproto.roster.Roster`.
            listen_fds: ``{party: fd}`` of inherited listening sockets (``--listen-fd``).
            insecure_shared_secret: use the roster's secret and the shared-secret handshake
                (``--insecure-shared-secret``) instead of its TLS kit.
            **kwargs: passed to :class:`TcpTransport` (``max_frame_bytes``, timeouts; ``session``
                when the roster fixes none).

        Raises:
            ValueError: one line: ``session`` given that differs from the roster's; a roster
                without TLS material (and no ``insecure_shared_secret``), or without a secret
                (with it).
        """
        if roster.session is not None:
            if kwargs.setdefault("session", roster.session) != roster.session:
                raise ValueError(f"the roster is for session {roster.session}, not {kwargs['session']}")
        if insecure_shared_secret:
            if roster.secret is None:
                raise ValueError("the roster has no secret for the shared-secret handshake (it has a TLS kit: use it)")
            network = cls(
                dict(roster.addresses), roster.secret, insecure_shared_secret=True, listen_fds=listen_fds,
                topology=roster.topology, **kwargs,
            )
        else:
            if roster.tls is None:
                raise ValueError(
                    "the roster has no TLS material (a 'tls' block: make kits with fedproto provision); to use its "
                    "shared secret instead, which is insecure, pass --insecure-shared-secret"
                )
            network = cls(
                dict(roster.addresses), tls=roster.tls, listen_fds=listen_fds, topology=roster.topology, **kwargs
            )
        network.roster = tuple(roster.parties)
        return network

    def _tls_of(self, party: str) -> TlsFiles:
        if isinstance(self.tls, TlsFiles):
            return self.tls
        assert self.tls is not None
        if party not in self.tls:
            raise ValueError(f"no TLS kit for {party}")
        return self.tls[party]

    @asynccontextmanager
    async def endpoints(
        self, roster: Sequence[str] | None = None, local: Sequence[str] | None = None
    ) -> AsyncIterator[dict[str, TcpTransport]]:
        """Serving endpoints of the ``local`` parties (all of them by default); closed on exit.

        Args:
            roster: every party of the run, in order (default: the roster this network was
                built from, see :meth:`from_roster`).
            local: the parties this process hosts (default: all).

        Raises:
            ValueError: no roster known, or only some parties are local but no addresses were
                given.
        """
        if roster is None:
            if self.roster is None:
                raise ValueError("this TCP network needs the run's roster")
            roster = self.roster
        roster = tuple(roster)
        local = roster if local is None else tuple(local)
        if self.addresses is None:
            if set(local) != set(roster):
                raise ValueError("hosting only some parties needs the addresses of all of them")
            if self.insecure_shared_secret:
                secret = self.secret if self.secret is not None else secrets.token_bytes(32)
                network = open_tcp_network(roster, secret, host=self.host, topology=self.topology, **self.kwargs)
            else:
                tls = None if self.tls is None else {p: self._tls_of(p) for p in roster}
                network = open_tcp_network(roster, tls=tls, host=self.host, topology=self.topology, **self.kwargs)
            async with network as endpoints:
                yield endpoints
            return
        endpoints = {}
        for p in local:
            fd = self.listen_fds.pop(p, None)
            listen_socket = None if fd is None else socket.socket(fileno=fd)
            try:
                if self.insecure_shared_secret:
                    assert self.secret is not None
                    security: dict[str, Any] = {"secret": self.secret}
                else:
                    security = {"tls": self._tls_of(p)}
                endpoints[p] = TcpTransport(
                    p, roster, self.addresses, listen_socket=listen_socket, topology=self.topology,
                    **security, **self.kwargs,
                )
            except BaseException:
                if listen_socket is not None:
                    listen_socket.close()
                with trio.CancelScope(shield=True):  # releases the sockets already adopted
                    for endpoint in endpoints.values():
                        await endpoint.aclose()
                raise
        async with _serving_all(endpoints):
            yield endpoints
