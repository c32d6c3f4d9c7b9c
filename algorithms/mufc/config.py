"""The public parameters of a MUFC run and what both roles derive from them.

:class:`MUFCConfig` (K, the grid, the prime p, T = 2KL, the modes) is agreed before the run (or in
``setup.data``, :mod:`fedproto.algorithms.mufc.setup`) and every party is built with it;
:func:`secagg_plus_config` gives the SecAgg+ parameters of a run that aggregates with SecAgg+
instead of SCMA (:func:`check_secagg_plus` refuses ones that do not fit it). The server
(:mod:`fedproto.algorithms.mufc.server`) and the clients (:mod:`fedproto.algorithms.mufc.client`)
name each SecAgg+ instance with :data:`SECAGG_PURPOSE` and raise :func:`remote_error` for a
peer's illegal message. The protocol as a whole: :mod:`fedproto.algorithms.mufc.protocol`.

References:
    Pan, Sima, Prakash, Rana, Milenkovic, "Machine Unlearning of Federated Clusters", ICLR 2023,
    Sec. 4.2 and Algorithm 1; spec mufc.md 1.2 and 2.7 (the field); Bell et al., ACM CCS 2020,
    Sec. 3-4 (SecAgg+).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedproto.algorithms import scma
from fedproto.algorithms.mufc.quantize import Grid, make_grid
from fedproto.algorithms.secagg_plus.config import Modulus, SecAggPlusConfig, check_fits, session_config
from fedproto.errors import RemoteProtocolError
from fedproto.machine import ProtocolMachine

__all__ = [
    "MODES",
    "SECAGG_CHOICES",
    "SECAGG_PURPOSE",
    "SERVER",
    "SERVER_MODES",
    "MUFCConfig",
    "MUFCOptions",
    "check_secagg_plus",
    "make_config",
    "remote_error",
    "secagg_plus_config",
]

SERVER = "server"
MODES = ("exact", "literal", "lazy")
SERVER_MODES = ("weighted", "uniform")
#: ``--secagg`` choices: the paper's SCMA pairwise masking, SecAgg+ on a sparse random graph, or
#: classic SecAgg (the complete graph).
SECAGG_CHOICES = ("scma", "plus", "complete")
#: The purpose in every SecAgg+ instance's bytes (:func:`~fedproto.algorithms.secagg_plus.protocol.instance_bytes`).
SECAGG_PURPOSE = b"fedproto/mufc/secagg-plus"
_SECAGG_GRAPH = b"fedproto/mufc/secagg-graph"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MUFCOptions:
    """The options of a MUFC run that neither the data nor the grid fix: how the server clusters,
    how the clients unlearn, and the dropout quorum. :class:`MUFCConfig` holds them with the
    public parameters; the public options of a run whose parties hold only their own data
    (:class:`~fedproto.algorithms.mufc.setup.DataSetup`) hold them until ``setup.data`` gives
    the rest, and pass them on with :meth:`options`.

    Attributes:
        server_mode: ``weighted`` (bin centres with weights) or ``uniform`` (samples in the bins).
        unlearning: ``exact``, ``literal`` or ``lazy`` (see :mod:`fedproto.algorithms.mufc.protocol`).
        n_init: K-means++ restarts at the server (best weighted cost wins).
        max_iter: Lloyd iterations cap at the server.
        lloyd_iterations: Lloyd iterations at the clients after seeding (0 = MUFC; > 0 = the
            "complete client training" variant of App. M.3, where every removal retrains).
        fresh_randomness: re-seeding and re-clustering draw fresh keys per round.
        min_clients: fewest clients an aggregation may go on with after dropouts (default: all
            with SCMA; with SecAgg+, no quorum beyond what SecAgg+ itself can recover).

    The values are checked by :class:`MUFCConfig`.
    """

    server_mode: str = "weighted"
    unlearning: str = "exact"
    n_init: int = 10
    max_iter: int = 300
    lloyd_iterations: int = 0
    fresh_randomness: bool = False
    min_clients: int | None = None

    def options(self) -> dict[str, Any]:
        """These options by name, as :func:`make_config` takes them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(MUFCOptions)}


@dataclasses.dataclass(frozen=True)
class MUFCConfig(MUFCOptions):
    """The public parameters of one MUFC run (agreed before it starts; spec 1.2).

    Attributes:
        k: clusters at the server (K).
        k_client: seeds per client (the paper's K; the authors' ``k_prime`` in non-i.i.d. runs).
        n_clients: L, the clients at the start.
        grid: the quantization grid (gamma, box, bins per dimension B, B^d bins).
        prime: p > max(n, B^d), the field of the syndromes.
        n_syndromes: T = 2 * k_client * L.
        server_mode, unlearning, n_init, max_iter, lloyd_iterations, fresh_randomness,
            min_clients: the run's :class:`MUFCOptions` (keyword-only).

    Raises:
        ValueError: a parameter or an option out of range.
    """

    k: int
    k_client: int
    n_clients: int
    grid: Grid
    prime: int
    n_syndromes: int

    def __post_init__(self) -> None:
        if self.k < 1 or self.k_client < 1 or self.n_clients < 1:
            raise ValueError("k, k_client and n_clients must be at least 1")
        if self.n_syndromes != 2 * self.k_client * self.n_clients:
            raise ValueError("n_syndromes must be 2 * k_client * n_clients")
        if self.server_mode not in SERVER_MODES:
            raise ValueError(f"server_mode must be one of {SERVER_MODES}")
        if self.unlearning not in MODES:
            raise ValueError(f"unlearning must be one of {MODES}")
        if self.prime <= self.grid.n_bins:
            raise ValueError("the prime must exceed the number of bins B^d")
        if self.n_init < 1 or self.max_iter < 1 or self.lloyd_iterations < 0:
            raise ValueError("n_init and max_iter must be positive, lloyd_iterations non-negative")
        if self.min_clients is not None and not 1 <= self.min_clients <= self.n_clients:
            raise ValueError("min_clients must lie in [1, n_clients]")

    @property
    def width(self) -> int:
        """Bytes per field element on the wire, ceil(bitlength(p) / 8)."""
        return scma.field_width(self.prime)

    @property
    def quorum(self) -> int:
        """Fewest clients an aggregation may finish with."""
        return self.n_clients if self.min_clients is None else self.min_clients

    def syndrome_bytes(self) -> int:
        """Analytic payload of one :class:`MaskedSyndromes`: ``T * width`` bytes (spec 1.10)."""
        return self.n_syndromes * self.width


def make_config(
    n: int,
    d: int,
    k: int,
    n_clients: int,
    *,
    k_client: int | None = None,
    gamma: float | None = None,
    lo: float = 0.0,
    hi: float = 1.0,
    **options: Any,
) -> MUFCConfig:
    """The public parameters for ``n`` points in ``[lo, hi]^d`` over ``n_clients`` clients.

    gamma defaults to 1/sqrt(n) (spec 1.2) and p to the smallest prime above max(n, B^d).

    Raises:
        ValueError: a parameter out of range.
    """
    if n < 1 or d < 1:
        raise ValueError("n and d must be positive")
    grid = make_grid(n, d, lo=lo, hi=hi, gamma=gamma)
    kc = k if k_client is None else k_client
    return MUFCConfig(
        k=k,
        k_client=kc,
        n_clients=n_clients,
        grid=grid,
        prime=scma.field_prime(n, grid.n_bins),
        n_syndromes=2 * kc * n_clients,
        **options,
    )


def secagg_plus_config(config: MUFCConfig, kind: str = "plus", *, session: int = 0) -> SecAggPlusConfig | None:
    """The SecAgg+ parameters of a MUFC run: ``L`` clients, vectors of ``T`` elements of ``F_p``.

    Args:
        config: the run's public parameters.
        kind: ``scma`` (no SecAgg+: returns ``None``), ``plus`` (a random k-regular graph with
            Bell et al.'s (k, t); the complete graph where L is too small for their bounds) or
            ``complete`` (classic SecAgg).
        session: the run's session id; the graph seed is public, SHA-256 of a label and it.

    Raises:
        ValueError: an unknown ``kind``, or fewer than 2 clients.

    References:
        Bell et al., ACM CCS 2020, Sec. 3-4; Bonawitz et al., ACM CCS 2017, Sec. 4.
    """
    if kind not in SECAGG_CHOICES:
        raise ValueError(f"secure aggregation must be one of {SECAGG_CHOICES}, got {kind!r}")
    if kind == "scma":
        return None
    return session_config(kind, config.n_clients, config.n_syndromes, Modulus.field(config.prime),
                          graph_label=_SECAGG_GRAPH, session=session)


def check_secagg_plus(config: MUFCConfig, secagg_plus: SecAggPlusConfig | None) -> None:
    """Refuse SecAgg+ parameters that do not fit the run (``None`` always fits).

    Raises:
        TypeError: not a :class:`SecAggPlusConfig`.
        ValueError: another field than ``F_p``, another vector length than ``T`` or another
            client count than ``L`` (:func:`~fedproto.algorithms.secagg_plus.config.check_fits`).
    """
    if secagg_plus is not None:  # checking no SecAgg+ builds no modulus (one per client)
        check_fits(secagg_plus, Modulus.field(config.prime), config.n_clients, config.n_syndromes,
                   length_name="T (syndromes)")


def remote_error(message: str, sender: str, machine: ProtocolMachine) -> RemoteProtocolError:
    """The error for an illegal message from ``sender``, with ``machine``'s round and state."""
    return RemoteProtocolError(message, party=sender, round_idx=machine.round_idx, state=machine.state.name)
