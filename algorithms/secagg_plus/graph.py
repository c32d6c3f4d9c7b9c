"""SecAgg+ neighbourhoods: a random ``k``-regular graph from public randomness, and its ``(k, t)``.

SecAgg+ replaces SecAgg's complete graph by a random ``k``-regular graph with ``k = O(log n)``:
each client agrees keys with, and Shamir-shares its secrets among, its ``k`` neighbours only.

`neighbourhoods` draws the graph as Bell et al. do: a uniformly random permutation ``pi`` of the
clients places them on a ring, and the client at ring position ``i`` is joined to the positions
``i +- 1, ..., i +- k/2 (mod n)`` (the circulant or Harary graph ``H_{k,n}``). The permutation
comes from the public ``seed`` alone (HKDF-SHA256, then a ChaCha20 keystream, then a
Fisher-Yates shuffle with rejection-sampled indices), so every party derives the same graph
and nobody, the server included, can steer it after the seed is fixed. Each client's
neighbourhood is then a uniformly random ``k``-subset of the other ``n - 1`` clients (its ring
position is uniform and the others are placed uniformly around it); neighbourhoods are not
independent of one another, and they need not be.

`plus_parameters` chooses the smallest even degree ``k`` (and a threshold ``t``) for which a
union bound over the ``n`` clients makes each bad event rarer than ``2^-sigma``; `complete_parameters`
gives classic SecAgg's complete graph and majority threshold.

References:
    Bell, Bonawitz, Gascon, Lepoint, Raykova. Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead. ACM CCS 2020, Sec. 3 (the semi-honest protocol over a
    ``k``-regular graph; the random Harary graph and its parameters, with the Theorem that
    bounds the failure probability of a random graph of degree ``O(log n)``) and Sec. 4.
    Bonawitz et al. Practical Secure Aggregation for Privacy-Preserving Machine Learning. ACM
    CCS 2017, Sec. 4 and 6 (the complete graph, threshold ``t > n / 2``).
    Harary. The Maximum Connectivity of a Graph. PNAS 48(7), 1962.
    Knuth, TAOCP vol. 2, Sec. 3.4.2, Algorithm P (the shuffle).
"""

from __future__ import annotations

import math
import struct

import numpy as np

from fedproto.algorithms.secagg import _chacha20_stream, _check_int, derive_bytes

__all__ = ["complete_parameters", "neighbourhoods", "plus_parameters"]

_PERMUTATION_INFO = b"fedproto/secagg_plus/graph/permutation/v1"
# Guards the float comparisons of the fractions times n (e.g. 0.1 * 10 = 1.0000000000000002).
_FRACTION_SLACK = 1e-12


# --------------------------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------------------------


def _random_permutation(n: int, seed: bytes) -> np.ndarray:
    """A uniformly random permutation of ``0..n-1`` (``int64 [n]``) from a 32-byte seed.

    Fisher-Yates (Durstenfeld): for ``i = n-1, ..., 1`` swap ``perm[i]`` with ``perm[j]``,
    ``j`` uniform on ``[0, i]``. Each ``j`` is a 64-bit ChaCha20 word ``w`` accepted when
    ``w >= 2^64 mod (i + 1)`` and reduced ``mod (i + 1)``: the accepted range holds a multiple
    of ``i + 1`` words, so ``j`` is exactly uniform (rejection probability ``< 2^-47`` for
    ``n < 2^17``). Rejected draws take the next unused words, so the result is a fixed function
    of the seed.
    """
    key = derive_bytes(seed, _PERMUTATION_INFO + struct.pack(">Q", n))
    bounds = np.arange(n, 1, -1, dtype=np.uint64)  # i + 1 for i = n-1, ..., 1
    floors = (np.uint64(0) - bounds) % bounds  # 2^64 mod (i + 1), in wrap-around uint64
    draws = np.empty(bounds.size, dtype=np.uint64)
    pending = np.arange(bounds.size)
    n_words = bounds.size + 64
    words = np.frombuffer(_chacha20_stream(key, 8 * n_words), dtype="<u8")
    used = 0
    while pending.size:
        if used + pending.size > words.size:
            # The keystream is prefix-stable: a longer one starts with the words already used.
            n_words *= 2
            words = np.frombuffer(_chacha20_stream(key, 8 * n_words), dtype="<u8")
            continue
        take = words[used : used + pending.size]
        used += pending.size
        accepted = take >= floors[pending]
        draws[pending[accepted]] = take[accepted] % bounds[pending[accepted]]
        pending = pending[~accepted]
    perm = list(range(n))
    for i, j in zip(range(n - 1, 0, -1), draws.tolist(), strict=True):
        perm[i], perm[j] = perm[j], perm[i]
    return np.asarray(perm, dtype=np.int64)


def neighbourhoods(n_clients: int, degree: int, seed: bytes) -> tuple[tuple[int, ...], ...]:
    """The neighbour sets of a random ``degree``-regular graph on clients ``0..n-1``.

    A uniformly random permutation drawn from ``seed`` places the clients on a ring; the client
    at position ``i`` is joined to positions ``i +- 1, ..., i +- degree/2 (mod n)``. Time and
    memory are ``O(n k)`` (plus NumPy's sort of each row, ``O(n k log k)`` in C); the complete
    graph, ``O(n^2)``, is returned when ``degree >= n - 1``.

    Args:
        n_clients: ``n >= 1``.
        degree: ``k``; an even number in ``[2, n - 2]``, or any ``k >= n - 1`` for the
            complete graph (every client joined to every other).
        seed: at least 32 bytes of public randomness (all parties use the same seed).

    Returns:
        ``[n]`` tuple; entry ``u`` is the sorted tuple of ``u``'s ``min(k, n - 1)``
        neighbours (ints in ``[0, n)``, never ``u``). The relation is symmetric.

    Raises:
        TypeError: ``n_clients`` or ``degree`` is not an int, ``seed`` is not bytes.
        ValueError: ``n_clients < 1``; ``degree`` below ``n - 1`` and odd or below 2; ``seed``
            shorter than 32 bytes.

    References:
        Bell et al., ACM CCS 2020, Sec. 3 (random Harary graph, ``GenerateGraph``); Harary 1962.
    """
    n_clients = _check_int("n_clients", n_clients)
    degree = _check_int("degree", degree)
    if not isinstance(seed, bytes | bytearray | memoryview):
        raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
    if len(seed) < 32:
        raise ValueError(f"seed must be at least 32 bytes, got {len(seed)}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if degree >= n_clients - 1:
        everyone = tuple(range(n_clients))
        return tuple(everyone[:u] + everyone[u + 1 :] for u in range(n_clients))
    if degree < 2 or degree % 2:
        raise ValueError(
            f"degree must be even and >= 2 (or >= n_clients - 1 = {n_clients - 1} for the complete graph), got {degree}"
        )
    perm = _random_permutation(n_clients, bytes(seed))
    half = degree // 2
    offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
    # Row i: the clients around ring position i, i.e. the neighbours of client perm[i].
    around = perm[(np.arange(n_clients)[:, None] + offsets[None, :]) % n_clients]
    rows = np.empty_like(around)
    rows[perm] = around
    rows.sort(axis=1)
    return tuple(map(tuple, rows.tolist()))


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def _check_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def _log_disconnection_bound(n: int, k: int, bad_fraction: float) -> float:
    """Natural log of a union bound on the honest survivors' subgraph being disconnected.

    Removing nodes from the ring graph ``H_{k,n}`` (positions ``i +- 1..k/2``) disconnects the
    rest only if the removed nodes cover ``k/2`` consecutive positions at two separate places
    of the ring. With ``b = floor(bad_fraction * n)`` removed clients placed uniformly, a given
    set of ``k`` positions is all removed with probability ``b! (n-k)! / (n! (b-k)!)``; there
    are at most ``n (n - k - 1) / 2`` pairs of places. ``-inf`` when ``b < k`` or the graph is
    complete.
    """
    from scipy import special  # here, not at import: only a SecAgg+ graph needs it

    bad = math.floor(bad_fraction * n + _FRACTION_SLACK)
    if k >= n - 1 or bad < k:
        return -math.inf
    pairs = math.log(n) + math.log(n - k - 1) - math.log(2)
    return pairs + float(
        special.gammaln(bad + 1) + special.gammaln(n - k + 1) - special.gammaln(n + 1) - special.gammaln(bad - k + 1)
    )


def _threshold_for_degree(n: int, k: int, log_budget: float, corrupt: float, dropout: float) -> int | None:
    """The smallest ``t`` meeting the privacy, correctness and majority conditions, if any."""
    from scipy import stats  # here, not at import: scipy.stats costs half a second of every start-up

    ts = np.arange(k + 1)
    # log P[Binomial(k, corrupt) >= t] = logsf(t - 1); log P[Binomial(k, 1 - dropout) < t] = logcdf(t - 1).
    private = stats.binom.logsf(ts - 1, k, corrupt) <= log_budget
    correct = stats.binom.logcdf(ts - 1, k, 1.0 - dropout) <= log_budget
    valid = np.flatnonzero(private & correct & (2 * ts > k) & (ts >= 1))
    return int(valid[0]) if valid.size else None


def plus_parameters(
    n_clients: int,
    *,
    failure_log2: float = 40.0,
    corrupt_fraction: float = 0.2,
    dropout_fraction: float = 0.1,
) -> tuple[int, int]:
    """SecAgg+'s degree ``k`` and Shamir threshold ``t`` for ``n`` clients (Bell et al.).

    Model: a client's ``k`` neighbours are a uniformly random ``k``-subset of the others
    (`neighbourhoods`); each is corrupt (colluding with the semi-honest server) with
    probability ``gamma = corrupt_fraction`` and drops out with probability
    ``delta = dropout_fraction``, so the number of corrupt neighbours is taken as
    ``Binomial(k, gamma)`` and that of surviving ones as ``Binomial(k, 1 - delta)`` (sampling
    with replacement; the exact counts, without replacement, are hypergeometric with the same
    mean and smaller in convex order, Hoeffding 1963, Sec. 6, so Chernoff-type bounds on the
    binomial hold for them too). With ``eps = 2^-sigma`` and a union bound over the ``n``
    clients, ``(k, t)`` must satisfy

    * privacy: ``n * P[Binomial(k, gamma) >= t] <= eps``: no client has ``t`` corrupt
      neighbours, so no secret of an honest client can be rebuilt by the adversary;
    * correctness: ``n * P[Binomial(k, 1 - delta) < t] <= eps``: every client keeps ``t``
      surviving neighbours, so every needed secret can be rebuilt;
    * majority: ``2 t > k``, so the self-mask seed and the masking key of one client cannot
      both reach ``t`` from the disjoint sets of holders that reveal them (Bonawitz et al.'s
      ``t > n / 2`` on a neighbourhood; fedproto's engine shares no masking key, and keeps the
      condition so as to stay within Bell et al.'s parameters);
    * connectivity: the probability that removing the ``floor((gamma + delta) n)`` corrupt and
      dropped clients disconnects the ring graph is ``<= eps``: such a removal must cover
      ``k/2`` consecutive ring positions at two places (the union bound of the authors'
      implementation, federated-compute's ``graph_parameter_finder``), and a disconnected
      graph would reveal the partial sums of its components.

    The privacy tail decreases and the correctness tail increases in ``t``, so the valid
    thresholds form an interval; the smallest valid ``t`` is returned (most tolerant of
    dropouts). ``k`` is the smallest even degree below ``n - 1`` with a valid ``t``, else the
    complete graph ``k = n - 1`` if it has one. Both tails decay as ``exp(-c k)`` for
    ``gamma < 1/2 < 1 - delta``, so ``k = O(sigma + log n)``.

    Args:
        n_clients: ``n >= 2``.
        failure_log2: ``sigma > 0``; each bad event has probability at most ``2^-sigma``.
        corrupt_fraction: ``gamma`` in ``[0, 1)``.
        dropout_fraction: ``delta`` in ``[0, 1)``; ``gamma + delta < 1``.

    Returns:
        ``(k, t)`` with ``2 <= k <= n - 1`` (``k`` even unless ``k = n - 1``) and
        ``k / 2 < t <= k``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``n < 2``, ``sigma <= 0``, fractions out of range, or no ``k <= n - 1``
            meets the conditions (too few clients for the bounds: use `complete_parameters`).

    References:
        Bell et al., ACM CCS 2020, Sec. 3 (semi-honest SecAgg+ over a random ``k``-regular
        graph: ``t`` above the corrupt and below the surviving neighbours of every client, the
        honest survivors' graph connected; failure ``2^-sigma`` with ``k = O(log n + sigma)``)
        and Sec. 4 (concrete parameters). Bonawitz et al., ACM CCS 2017, Sec. 6 (``t > n/2``).
        Hoeffding. Probability Inequalities for Sums of Bounded Random Variables. JASA 58, 1963.
        google-parfait/federated-compute, ``fcp/secagg/server/graph_parameter_finder.cc``
        (Harary-graph parameters: the disconnection bound, ``t`` just above the corrupt tail).
    """
    n_clients = _check_int("n_clients", n_clients)
    if n_clients < 2:
        raise ValueError(f"n_clients must be >= 2, got {n_clients}")
    if isinstance(failure_log2, bool) or not isinstance(failure_log2, int | float):
        raise TypeError(f"failure_log2 must be a float, got {type(failure_log2).__name__}")
    if not math.isfinite(failure_log2) or failure_log2 <= 0:
        raise ValueError(f"failure_log2 must be a positive finite number, got {failure_log2}")
    corrupt = _check_fraction("corrupt_fraction", corrupt_fraction)
    dropout = _check_fraction("dropout_fraction", dropout_fraction)
    if corrupt + dropout >= 1.0:
        raise ValueError(f"corrupt_fraction + dropout_fraction must be < 1, got {corrupt + dropout}")
    log_budget = -float(failure_log2) * math.log(2)
    log_budget_per_client = log_budget - math.log(n_clients)
    candidates = [*range(2, n_clients - 1, 2), n_clients - 1]
    for k in candidates:
        if _log_disconnection_bound(n_clients, k, corrupt + dropout) > log_budget:
            continue
        t = _threshold_for_degree(n_clients, k, log_budget_per_client, corrupt, dropout)
        if t is not None:
            return k, t
    raise ValueError(
        f"no degree k <= n_clients - 1 = {n_clients - 1} meets failure 2^-{failure_log2} with "
        f"corrupt_fraction={corrupt} and dropout_fraction={dropout}: too few clients for SecAgg+ "
        "bounds; use complete_parameters (classic SecAgg)"
    )


def complete_parameters(
    n_clients: int, *, corrupt_fraction: float = 0.2, dropout_fraction: float = 0.1
) -> tuple[int, int]:
    """Classic SecAgg's complete graph and majority threshold: ``(n - 1, floor(n / 2) + 1)``.

    Every client shares with all ``n - 1`` others, and ``t = floor(n / 2) + 1`` (Bonawitz et
    al.'s ``t > n / 2``, which also gives ``2 t > k``). On the complete graph the counts are
    deterministic, so the fractions are checked as worst cases: the
    ``floor(corrupt_fraction * n)`` corrupt clients must stay below ``t`` (privacy) and the
    ``n - 1 - floor(dropout_fraction * n)`` other clients that survive must reach ``t``
    (correctness).

    Args:
        n_clients: ``n >= 3`` (with ``n = 2`` no majority of the one other client exists).
        corrupt_fraction: ``gamma`` in ``[0, 1)``.
        dropout_fraction: ``delta`` in ``[0, 1)``.

    Returns:
        ``(n - 1, floor(n / 2) + 1)``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``n < 3``, a fraction out of range, or a fraction too large for the
            majority threshold (the message says which).

    References:
        Bonawitz et al., ACM CCS 2017, Sec. 4 (Fig. 4) and Sec. 6 (threshold ``t > n / 2``
        against an active server; ``t`` above the corrupt clients).
    """
    n_clients = _check_int("n_clients", n_clients)
    if n_clients < 3:
        raise ValueError(f"n_clients must be >= 3 for a majority threshold among the others, got {n_clients}")
    corrupt = _check_fraction("corrupt_fraction", corrupt_fraction)
    dropout = _check_fraction("dropout_fraction", dropout_fraction)
    k, t = n_clients - 1, n_clients // 2 + 1
    n_corrupt = math.floor(corrupt * n_clients + _FRACTION_SLACK)
    n_dropped = math.floor(dropout * n_clients + _FRACTION_SLACK)
    if n_corrupt >= t:
        raise ValueError(f"{n_corrupt} corrupt clients of {n_clients} reach the threshold t = {t}: privacy fails")
    if k - n_dropped < t:
        raise ValueError(
            f"with {n_dropped} dropouts of {n_clients}, only {k - n_dropped} other clients survive, below t = {t}"
        )
    return k, t
