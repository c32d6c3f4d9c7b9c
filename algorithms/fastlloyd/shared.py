"""What FastLloyd's client and server share: the run's SecAgg+ parameters and their checks, the
public initial centroids, and the check of a peer's ring arrays.

Every party derives these from public values only, so each computes the same: a client and the
server agree on them without a message (FastLloyd Sec. 5; the protocol in
:mod:`fedproto.algorithms.fastlloyd.protocol`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from fedproto.algorithms import secagg
from fedproto.algorithms.fastlloyd import _kernels
from fedproto.algorithms.fastlloyd.config import SECAGG_CHOICES, FastLloydConfig, FastLloydOptions
from fedproto.errors import RemoteProtocolError

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig

# SecAgg+'s modules (SCMA's arithmetic, FLINT) are imported only by a run that asks for it
# (--secagg plus or complete): in secagg_plus_config, check_secagg_plus with parameters, and where
# the server opens an aggregation.

__all__ = [
    "SECAGG_PURPOSE",
    "check_ring_values",
    "check_secagg_plus",
    "initial_centroids",
    "one_of",
    "secagg_config",
    "secagg_plus_config",
]

SECAGG_PURPOSE = b"fedproto/fastlloyd/secagg-plus"
"""The purpose in the instance bytes of each iteration's SecAgg+ aggregation."""
_SECAGG_GRAPH = b"fedproto/fastlloyd/secagg-graph"


def secagg_plus_config(
    choice: str, *, ring_bits: int, length: int, n_clients: int, session: int
) -> SecAggPlusConfig | None:
    """The SecAgg+ parameters of a run, or ``None`` for the paper's MSA.

    Every party derives them from public values only: the graph seed is SHA-256 of FastLloyd's
    label and the session id, the vectors are ``length = k (d+1)`` elements of ``Z_{2^w}``.

    Args:
        choice: ``"msa"``, ``"plus"`` (Bell et al.'s sparse graph) or ``"complete"`` (classic
            SecAgg), one of :data:`~fedproto.algorithms.fastlloyd.config.SECAGG_CHOICES`.
        ring_bits: the run's ring width w (32 or 64).
        length: elements per client vector, ``k (d+1)``.
        n_clients: number of clients M.
        session: the run's session id.

    Raises:
        ValueError: an unknown choice, or SecAgg+ with fewer than 2 clients
            (:func:`~fedproto.algorithms.secagg_plus.config.session_config`).
    """
    if choice not in SECAGG_CHOICES:
        raise ValueError(f"unknown secure aggregation {choice!r}; choose one of {SECAGG_CHOICES}")
    if choice == "msa":
        return None
    from fedproto.algorithms.secagg_plus.config import Modulus, session_config

    return session_config(
        choice, n_clients, length, Modulus.ring(ring_bits), graph_label=_SECAGG_GRAPH, session=session
    )


def secagg_config(choice: str, config: FastLloydConfig, n_clients: int, session: int) -> SecAggPlusConfig | None:
    """The SecAgg+ parameters of a run at ``config``, or ``None`` for the paper's MSA
    (:func:`secagg_plus_config` at the config's ring and ``k (d+1)``; the graph seed is SHA-256 of
    the public session id).

    Raises:
        ValueError: as :func:`secagg_plus_config`.
    """
    return secagg_plus_config(
        choice, ring_bits=config.ring_bits, length=config.k * (config.d + 1), n_clients=n_clients, session=session
    )


def one_of(config: FastLloydConfig | None, options: FastLloydOptions | None, secagg_plus) -> None:
    """Refuse a role built from both or neither of ``config`` and ``options``, or from ``options``
    with SecAgg+ parameters (they follow from ``options.secagg`` after ``setup.data``).

    Raises:
        ValueError: naming the mistake.
    """
    if (config is None) == (options is None):
        raise ValueError("give exactly one of config (normalised points) and options (raw points, setup.data)")
    if options is not None and secagg_plus is not None:
        raise ValueError("with options the SecAgg+ parameters follow from options.secagg after setup; leave secagg_plus out")



def check_secagg_plus(config: FastLloydConfig, secagg_plus: SecAggPlusConfig | None, n_clients: int) -> None:
    """Refuse a SecAgg+ configuration that does not fit the run: ``n_clients`` clients, vectors
    of ``k (d+1)`` elements of ``Z_{2^w}``.

    Raises:
        TypeError: ``secagg_plus`` is not a SecAgg+ configuration.
        ValueError: the sizes or the ring differ
            (:func:`~fedproto.algorithms.secagg_plus.config.check_fits`).
    """
    if secagg_plus is None:
        return  # MSA: SecAgg+'s modules stay unloaded
    from fedproto.algorithms.secagg_plus.config import Modulus, check_fits

    k, d1 = config.shape
    check_fits(secagg_plus, Modulus.ring(config.ring_bits), n_clients, k * d1, length_name="k (d+1)")


def initial_centroids(config: FastLloydConfig) -> np.ndarray:
    """The public initial centroids ``[k, d]`` float64 (read-only): sphere packing from
    ``config.init_seed``. Computed once per ``(k, d, seed, B)`` and shared by every party of a
    process (it is deterministic, and 10,000 clients would otherwise repeat it).

    References:
        FastLloyd Sec. 5.3.1 (after Su et al.); spec 2.4, halving variant.
    """
    return _sphere_packed(config.k, config.d, config.init_seed, config.bound)


@functools.lru_cache(maxsize=32)
def _sphere_packed(k: int, d: int, seed: int, bound: float) -> np.ndarray:
    centers, _ = _kernels.sphere_packing(k, d, seed, bound=bound)
    centers = np.array(centers, dtype=np.float64)
    centers.setflags(write=False)
    return centers



def check_ring_values(config: FastLloydConfig, values: np.ndarray, what: str, sender: str, round_idx: int) -> None:
    """Refuse a peer's ring array whose shape or element width does not match the run's."""
    expected = secagg.ring_dtype(config.ring_bits)
    if values.shape != config.shape or values.dtype != expected:
        raise RemoteProtocolError(
            f"{what} of shape {values.shape} and dtype {values.dtype}, expected {config.shape} {expected}",
            party=sender,
            round_idx=round_idx,
        )

