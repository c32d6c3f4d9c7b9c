"""What FastLloyd's client and server share: the run's SecAgg+ parameters and their checks, the
public initial centroids, and the check of a peer's ring arrays.

Every party derives these from public values only, so each computes the same: a client and the
server agree on them without a message (FastLloyd Sec. 5; the protocol in
:mod:`fedproto.algorithms.fastlloyd.protocol`).
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING

import numpy as np

from fedproto.algorithms import secagg
from fedproto.algorithms.fastlloyd import _kernels
from fedproto.algorithms.fastlloyd.config import SECAGG_CHOICES, FastLloydConfig, FastLloydOptions
from fedproto.errors import RemoteProtocolError

if TYPE_CHECKING:
    from fedproto.algorithms.secagg_plus.engine import SecAggPlusConfig

# SecAgg+'s engine (SCMA's arithmetic, FLINT) is imported only by a run that asks for it
# (--secagg plus or complete): in secagg_plus_config and where the server opens an aggregation.

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


def secagg_plus_config(
    choice: str, *, ring_bits: int, length: int, n_clients: int, session: int
) -> SecAggPlusConfig | None:
    """The SecAgg+ parameters of a run, or ``None`` for the paper's MSA.

    Every party derives them from public values only: the graph seed is SHA-256 of the session
    id, the vectors are ``length = k (d+1)`` elements of ``Z_{2^w}``.

    Args:
        choice: ``"msa"``, ``"plus"`` (Bell et al.'s sparse graph) or ``"complete"`` (classic
            SecAgg), one of :data:`~fedproto.algorithms.fastlloyd.config.SECAGG_CHOICES`.
        ring_bits: the run's ring width w (32 or 64).
        length: elements per client vector, ``k (d+1)``.
        n_clients: number of clients M.
        session: the run's session id.

    Raises:
        ValueError: an unknown choice, or SecAgg+ with fewer than 2 clients.
    """
    if choice not in SECAGG_CHOICES:
        raise ValueError(f"unknown secure aggregation {choice!r}; choose one of {SECAGG_CHOICES}")
    if choice == "msa":
        return None
    if n_clients < 2:
        raise ValueError("--secagg plus needs at least 2 clients")
    from fedproto.algorithms.secagg_plus import engine as secagg_plus_engine

    seed = hashlib.sha256(b"fedproto/fastlloyd/secagg-graph" + session.to_bytes(8, "big")).digest()
    modulus = secagg_plus_engine.Modulus.ring(ring_bits)
    if choice == "complete":
        return secagg_plus_engine.complete_config(n_clients, length, modulus, graph_seed=seed)
    return secagg_plus_engine.plus_config(n_clients, length, modulus, graph_seed=seed)



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
        ValueError: the sizes or the ring differ.
    """
    if secagg_plus is None:
        return
    k, d1 = config.shape
    if secagg_plus.modulus.ring_bits != config.ring_bits:
        raise ValueError(f"SecAgg+ sums in {secagg_plus.modulus.describe()}, the run's ring is Z_2^{config.ring_bits}")
    if secagg_plus.vector_length != k * d1 or secagg_plus.n_clients != n_clients:
        raise ValueError(
            f"SecAgg+ is configured for {secagg_plus.n_clients} clients and vectors of {secagg_plus.vector_length}; "
            f"the run has {n_clients} clients and k (d+1) = {k * d1}"
        )



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

