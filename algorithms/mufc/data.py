"""MUFC's data: the paper's synthetic Gaussian set and its client splits.

* `gaussian_mixture`: K spherical Gaussians with centres uniform in the unit cube (App. M.1),
  min-max scaled per column into [0, 1] (the authors' code's box).
* `client_split`: the authors' split (``utils.split_data``, paraphrased in the spec): cluster
  the data with scikit-learn ``KMeans(K)``; i.i.d. cuts every cluster evenly over the clients;
  non-i.i.d. gives every client chunks of at most ``K'`` clusters.
* `file_clients`: the split shipped with the Celltype file (``client_X`` / ``client_sizes``).
* `unit_box`: every column scaled into [0, 1] by the (pooled data's) per-feature extent.
* `Federation`: the public quantities of the clients' data (counts, extent) that a run whose
  parties each hold only their own data agrees in its ``setup.data`` phase.

All functions are deterministic given their seed (local ``numpy.random.Generator`` and
``random_state``; no global randomness).

References:
    Pan, Sima, Prakash, Rana, Milenkovic. Machine Unlearning of Federated Clusters (ICLR 2023),
    Sec. 6 and App. M.1-M.2; spec mufc.md, sections 4.1, 4.5 and 5.2.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedproto.data import Dataset, feature_extent

__all__ = ["Federation", "client_split", "cluster_labels", "file_clients", "gaussian_mixture", "unit_box"]


def gaussian_mixture(seed: int, *, n_per: int = 3000, k: int = 10, d: int = 10, variance: float = 0.5) -> Dataset:
    """The paper's synthetic Gaussian data set.

    ``k`` centres are drawn uniformly in ``[0, 1]^d``; each gets ``n_per`` points from
    ``N(centre, variance * I)`` (the paper says "variance 0.5"; read as the variance, so the
    standard deviation is ``sqrt(variance)``). Each column is then min-max scaled to exactly
    ``[0, 1]``. Rows are grouped by component; labels are the component indices.

    Args:
        seed: seed of the local generator.
        n_per: points per component (paper: 3000).
        k: number of components (paper: 10).
        d: dimension (paper: 10).
        variance: per-coordinate variance (paper: 0.5).

    Returns:
        ``Dataset(name="gaussian", x [k * n_per, d] float64 in [0, 1], y [k * n_per] int64,
        paper_k=k)``.

    Raises:
        ValueError: a non-positive size, dimension, component count or variance, or
            ``k * n_per < 2`` (min-max scaling needs two points).

    References:
        Pan et al. App. M.1 (Gaussian: n = 30000, d = 10, K = 10); spec mufc.md 4.1 and 4.5.
    """
    if n_per < 1 or k < 1 or d < 1 or k * n_per < 2:
        raise ValueError("gaussian_mixture needs n_per, k, d >= 1 and at least two points")
    if not variance > 0:
        raise ValueError(f"variance must be positive, got {variance!r}")
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, 1.0, size=(k, d))
    y = np.repeat(np.arange(k, dtype=np.int64), n_per)
    x = centres[y] + np.sqrt(variance) * rng.standard_normal((k * n_per, d))
    lo, hi = x.min(axis=0), x.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    x = np.clip((x - lo) / span, 0.0, 1.0)
    return Dataset("gaussian", x, y, k)


def cluster_labels(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """The K-means cluster of every row used by `client_split` (scikit-learn ``KMeans``).

    Args:
        x: ``[n, d]`` float64.
        k: number of clusters.
        seed: ``random_state``.

    Returns:
        ``[n]`` int64 labels in ``[0, k)``.

    References:
        Spec mufc.md 5.2 (``split_data`` fits ``KMeans(K)`` on the full data).
    """
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(np.asarray(x, np.float64)).astype(np.int64)


def client_split(x: np.ndarray, n_clients: int, *, k: int, k_prime: int | None, seed: int) -> list[np.ndarray]:
    """Split the rows of ``x`` over clients as the authors do (i.i.d. or non-i.i.d.).

    Rows are first clustered with `cluster_labels` (``KMeans(k)``, ``random_state=seed``).

    * i.i.d. (``k_prime`` None or ``k``): each cluster's rows, shuffled, are cut into
      ``n_clients`` equal chunks of ``floor(size / n_clients)``, the remainder going to the last
      client.
    * non-i.i.d. (``k_prime < k``): the target size is ``floor(n / n_clients)``. Each of the
      first ``n_clients - 1`` clients picks ``min(k_prime, available)`` clusters at random among
      those with rows left and fills up to the target with chunks (shuffled rows, random
      lengths between about ``target / k_prime`` and ``target``) from them. The last client
      takes the leftovers. Unlike the authors' code, which asserts that the last client spans
      at most ``k_prime`` clusters, the choice is steered so that this always holds: a client
      must include a not-yet-used cluster when otherwise too many would be left for the
      clients after it, and leftovers of clusters the last client cannot take go to a client
      that already holds that cluster.

    Args:
        x: ``[n, d]`` float64.
        n_clients: number of clients ``L >= 1``.
        k: number of K-means clusters ``K >= 1``.
        k_prime: maximum clusters per client ``K'`` (``1 <= K' <= K``), or None for i.i.d.
        seed: seed of the clustering and of the shuffles.

    Returns:
        ``n_clients`` int64 arrays of row indices (each sorted); together a partition of
        ``range(n)`` with every client non-empty. With ``k_prime < k`` each client's rows lie in
        at most ``k_prime`` clusters of `cluster_labels` ``(x, k, seed)``.

    Raises:
        ValueError: ``n_clients < 1``, ``k < 1``, ``k_prime`` outside ``[1, k]``, fewer rows
            than clients or than clusters, ``n_clients * k_prime < k`` (the clusters cannot be
            covered), or an i.i.d. split that would leave a client empty.

    References:
        Pan et al. Sec. 6 and App. M.2 (non-i.i.d.: at most K' clusters per client, after
        Dennis et al. 2021); spec mufc.md 4.1 and 5.2 (``split_data``).
    """
    pts = np.asarray(x, dtype=np.float64)
    n = pts.shape[0]
    if n_clients < 1:
        raise ValueError("n_clients must be at least 1")
    if k < 1:
        raise ValueError("k must be at least 1")
    if k_prime is not None and not 1 <= k_prime <= k:
        raise ValueError(f"k_prime must lie in [1, k] = [1, {k}], got {k_prime}")
    if n < max(n_clients, k):
        raise ValueError(f"{n} rows cannot be split over {n_clients} clients and {k} clusters")
    iid = k_prime is None or k_prime == k
    if not iid and n_clients * k_prime < k:
        raise ValueError(f"{n_clients} clients with at most {k_prime} clusters each cannot cover {k} clusters")
    labels = cluster_labels(pts, k, seed)
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(k)]
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    if iid:
        for pool in pools:
            size = len(pool) // n_clients
            for client in range(n_clients):
                stop = (client + 1) * size if client < n_clients - 1 else len(pool)
                parts[client].append(pool[client * size : stop])
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if any(len(p) == 0 for p in out):
            raise ValueError("an i.i.d. split would leave a client without rows (too few rows per cluster)")
        return out
    return _non_iid(pools, n, n_clients, k_prime, rng)


def _non_iid(
    pools: list[np.ndarray], n: int, n_clients: int, k_prime: int, rng: np.random.Generator
) -> list[np.ndarray]:
    k = len(pools)
    target = n // n_clients
    used = [0] * k  # rows taken from each cluster's pool so far
    holders: list[list[int]] = [[] for _ in range(k)]  # clients holding rows of each cluster
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    min_chunk = max(1, -(-target // k_prime))
    for client in range(n_clients - 1):
        avail = [c for c in range(k) if used[c] < len(pools[c])]
        fresh = [c for c in avail if not holders[c]]
        later = n_clients - 1 - client  # clients after this one, the last included
        n_forced = max(0, len(fresh) - k_prime * later)
        forced = list(rng.choice(fresh, size=n_forced, replace=False)) if n_forced else []
        others = [c for c in avail if c not in forced]
        n_more = min(k_prime, len(avail)) - n_forced
        chosen = forced + list(rng.choice(others, size=n_more, replace=False) if n_more else [])
        need = target
        for pos, c in enumerate(chosen):
            is_forced = pos < n_forced
            if need <= 0 and not is_forced:
                break
            left = len(pools[c]) - used[c]
            last = pos == len(chosen) - 1
            length = need if last else int(rng.integers(min_chunk, target + 1))
            # Every forced cluster must receive at least one row, even past the target.
            reserve = max(0, n_forced - pos - 1)
            take = min(need - reserve, left, length)
            if is_forced:
                take = max(take, 1)
            parts[client].append(pools[c][used[c] : used[c] + take])
            used[c] += take
            holders[c].append(client)
            need -= take
    last_client = n_clients - 1
    leftover = [c for c in range(k) if used[c] < len(pools[c])]
    # Clusters nobody holds must go to the last client (the forcing above keeps them <= k_prime);
    # the largest other leftovers fill its remaining slots, the rest go back to a holder.
    must = [c for c in leftover if not holders[c]]
    rest = sorted((c for c in leftover if holders[c]), key=lambda c: (used[c] - len(pools[c]), c))
    take_last = must + rest[: max(0, k_prime - len(must))]
    for c in leftover:
        owner = last_client if c in take_last else holders[c][-1]
        parts[owner].append(pools[c][used[c] :])
        used[c] = len(pools[c])
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def file_clients(path: str | os.PathLike, x: np.ndarray) -> list[np.ndarray]:
    """The client split shipped in a data file, as row indices into ``x``.

    The file (e.g. ``celltype.npz``) holds ``client_X`` (all points, concatenated client by
    client) and ``client_sizes`` (the block lengths). Every row of ``client_X`` is matched to an
    exactly equal row of ``x`` (duplicates are matched in order), so ``x[idx_l]`` reproduces
    client l's block.

    Args:
        path: an ``.npz`` file with arrays ``client_X`` ``[n, d]`` and ``client_sizes`` ``[L]``.
        x: ``[n, d]`` float64, the full data set.

    Returns:
        ``L`` int64 arrays of row indices, in the file's row order.

    Raises:
        ValueError: missing arrays, sizes that do not add up, or rows of ``client_X`` that are not
            a permutation of the rows of ``x``.

    References:
        Spec mufc.md 4.5 (celltype.npz: client_0 ... client_99, sizes 120 x 64, 60-119 x 35,
        1134) and 5.4.
    """
    with np.load(Path(path), allow_pickle=False) as archive:
        if "client_X" not in archive or "client_sizes" not in archive:
            raise ValueError(f"{path}: needs arrays 'client_X' and 'client_sizes'")
        cx = np.asarray(archive["client_X"], dtype=np.float64)
        sizes = np.asarray(archive["client_sizes"]).astype(np.int64)
    data = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    if cx.ndim != 2 or data.ndim != 2 or cx.shape != data.shape:
        raise ValueError(f"client_X has shape {cx.shape}, x has shape {data.shape}")
    if sizes.ndim != 1 or np.any(sizes < 0) or int(sizes.sum()) != cx.shape[0]:
        raise ValueError("client_sizes must be non-negative and add up to the rows of client_X")
    rows_of: dict[bytes, list[int]] = {}
    for row, value in enumerate(data):
        rows_of.setdefault(value.tobytes(), []).append(row)
    for rows in rows_of.values():
        rows.reverse()  # pop() then hands out duplicates in their original order
    matched = np.empty(cx.shape[0], dtype=np.int64)
    for i, value in enumerate(np.ascontiguousarray(cx)):
        rows = rows_of.get(value.tobytes())
        if not rows:
            raise ValueError(f"row {i} of client_X does not match a (remaining) row of x")
        matched[i] = rows.pop()
    return np.split(matched, np.cumsum(sizes)[:-1])


def unit_box(x: np.ndarray, extent: tuple[np.ndarray, np.ndarray] | np.ndarray | None = None) -> np.ndarray:
    """Scale every column into ``[0, 1]`` by a per-feature extent (min-max; constant columns map
    to 0); data whose extent already lies in the unit box are returned unchanged, so Celltype
    keeps its values.

    Scaling each client's rows by the federation's extent (the element-wise minimum of the
    clients' minima and maximum of their maxima, agreed in MUFC's ``setup.data`` phase) gives
    exactly the rows of the pooled data scaled at once: the same element-wise arithmetic.

    Args:
        x: ``[m, d]`` float64 (raw points).
        extent: ``(lo, hi)`` or ``float64 [2, d]``: the per-feature minimum and maximum to scale
            by; default ``x``'s own (:func:`fedproto.data.feature_extent`).

    Returns:
        ``[m, d]`` float64 in ``[0, 1]`` (values outside ``extent`` are clipped); ``x`` itself
        when the extent lies inside ``[0, 1]``.

    Raises:
        ValueError: ``extent`` does not hold ``d`` minima and ``d`` maxima.
    """
    x = np.asarray(x, dtype=np.float64)
    if extent is None:
        if not x.size:
            return x
        lo, hi = feature_extent(x)
    else:
        lo, hi = (np.asarray(e, dtype=np.float64) for e in extent)
        if x.ndim != 2 or lo.shape != (x.shape[1],) or hi.shape != (x.shape[1],):
            raise ValueError(f"the extent must hold {x.shape[-1]} minima and maxima for points of shape {x.shape}")
    if lo.min() >= 0.0 and hi.max() <= 1.0:
        return x
    span = np.where(hi > lo, hi - lo, 1.0)
    return np.clip((x - lo) / span, 0.0, 1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class Federation:
    """The public quantities of the federation's data, agreed in ``setup.data``.

    Attributes:
        client_points: every client's number of points n_l, in client order (each >= 1).
        extent: ``float64 [2, d]``: the per-feature minimum (row 0) and maximum (row 1) over all
            the clients' raw points.

    Raises:
        ValueError: no client, a client without points, or an extent not of shape ``[2, d]``
            with finite ``lo <= hi``.
    """

    client_points: tuple[int, ...]
    extent: np.ndarray

    def __post_init__(self) -> None:
        points = tuple(int(n) for n in self.client_points)
        if not points or min(points) < 1:
            raise ValueError("every client must hold at least one point")
        extent = np.array(self.extent, dtype=np.float64)
        if extent.ndim != 2 or extent.shape[0] != 2 or extent.shape[1] < 1:
            raise ValueError(f"the extent must have shape [2, d], got {extent.shape}")
        if not np.all(np.isfinite(extent)) or np.any(extent[0] > extent[1]):
            raise ValueError("the extent must be finite with each minimum at most its maximum")
        extent.setflags(write=False)
        object.__setattr__(self, "client_points", points)
        object.__setattr__(self, "extent", extent)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Federation):
            return NotImplemented
        return self.client_points == other.client_points and np.array_equal(self.extent, other.extent)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def combine(cls, client_points: Sequence[int], extents: Sequence[np.ndarray]) -> Federation:
        """The federation of clients with these counts and ``[2, d]`` extents (the server's step:
        element-wise minimum of the minima and maximum of the maxima, the pooled data's extent)."""
        stack = np.stack([np.asarray(e, dtype=np.float64) for e in extents])
        return cls(tuple(client_points), np.stack([stack[:, 0].min(axis=0), stack[:, 1].max(axis=0)]))

    @classmethod
    def of(cls, parts: Sequence[np.ndarray]) -> Federation:
        """The federation of clients holding these raw ``[n_l, d]`` points (what ``setup.data``
        agrees; a simulation computes it for its pooled summaries)."""
        return cls.combine([len(x) for x in parts], [np.stack(feature_extent(x)) for x in parts])

    @property
    def n(self) -> int:
        """The total number of points."""
        return sum(self.client_points)

    @property
    def d(self) -> int:
        """The number of features."""
        return int(self.extent.shape[1])

    def offset(self, c: int) -> int:
        """The id of client ``c``'s first point: the earlier clients' points."""
        return sum(self.client_points[:c])

    def ids(self, c: int) -> np.ndarray:
        """Client ``c``'s point ids, ``int64 [n_c]``: its rows' numbers in the pooled data."""
        start = self.offset(c)
        return np.arange(start, start + self.client_points[c], dtype=np.int64)

    def scale(self, x: np.ndarray) -> np.ndarray:
        """A client's raw ``[n_l, d]`` points scaled into ``[0, 1]`` by the federation's extent."""
        return unit_box(x, self.extent)
