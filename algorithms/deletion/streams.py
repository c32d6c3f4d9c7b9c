"""Deletion streams: the paper's online-deletion protocol, amortised time and quality metrics.

The paper's experiment (Ginart et al. 2019, Sec. 5 and App. D; spec deletion-kmeans.md 5.2-5.3):
train once, then serve m = 1,000 deletion requests drawn uniformly without replacement, one at a
time, timing each; amortised time = (training + all deletions) / m. The baseline, plain k-means
(k-means++ seeding and 10 Lloyd iterations, the same in-house kernels as the other two methods),
handles each request by retraining from scratch. Quality is measured with the k-means loss (a sum),
the silhouette on a random subsample of 10,000 points, and NMI against the labels with the
**arithmetic** mean normaliser (scikit-learn >= 0.22; the paper's numbers probably used the
geometric mean, spec 5.3). For the baseline's metrics Lloyd's runs until convergence.

Timing reads the wall clock (``time.perf_counter``) here, outside every protocol machine, and
compilation is excluded: `warm_up` compiles every padded shape a stream will meet first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms.deletion import _kernels
from fedproto.algorithms.deletion.dckmeans import DCKMeans, DCKMeansConfig, node_kmeans
from fedproto.algorithms.deletion.qkmeans import QKMeans, QKMeansConfig, train_qkmeans
from fedproto.data import Dataset

__all__ = [
    "GENERATED_DATASETS",
    "PAPER_TABLES",
    "StreamTiming",
    "amortised_s",
    "baseline_kmeans",
    "converged_kmeans",
    "deletion_stream",
    "gaussian_dataset",
    "gaussian_mixture",
    "quality",
    "time_baseline",
    "time_stream",
    "warm_up",
]

BASELINE_STREAM = 5  #: ``fold_in`` constant of the baseline's key (beside Q's 1, 2 and DC's 3, 4)

#: The paper's Tables 1-4 (mean over 5 replicates; spec 5.4): per data set, per metric, the values
#: for (k-means, Q-k-means, DC-k-means). Silhouette: the printed table has two rows labelled
#: "Gaussian" and none "MNIST"; the third row is taken as MNIST (a guess, spec 5.4).
PAPER_TABLES: dict[str, dict[str, tuple[float, float, float]]] = {
    "celltype": {"loss ratio": (1.0, 1.158, 1.439), "silhouette": (0.384, 0.367, 0.422),
                 "nmi": (0.36, 0.336, 0.294), "amortised s": (4.241, 0.026, 0.272)},
    "covtype": {"loss ratio": (1.0, 1.033, 1.017), "silhouette": (0.238, 0.203, 0.222),
                "nmi": (0.311, 0.332, 0.335), "amortised s": (6.114, 0.454, 0.469)},
    "mnist": {"loss ratio": (1.0, 1.11, 1.014), "silhouette": (0.036, 0.031, 0.035),
              "nmi": (0.494, 0.459, 0.494), "amortised s": (65.038, 29.386, 2.562)},
    "postures": {"loss ratio": (1.0, 1.014, 1.034), "silhouette": (0.107, 0.107, 0.109),
                 "nmi": (0.163, 0.169, 0.173), "amortised s": (26.616, 0.413, 1.17)},
    "gaussian": {"loss ratio": (1.0, 1.019, 1.003), "silhouette": (0.066, 0.053, 0.071),
                 "nmi": (0.319, 0.245, 0.318), "amortised s": (206.631, 0.393, 5.992)},
    "botnet": {"loss ratio": (1.0, 1.018, 1.118), "silhouette": (0.583, 0.639, 0.627),
               "nmi": (0.708, 0.73, 0.705), "amortised s": (607.784, 1.04, 8.568)},
}


def deletion_stream(ids: np.ndarray, m: int, seed: int) -> np.ndarray:
    """``m`` ids drawn uniformly without replacement (the paper's stream), independent of any
    model key.

    Raises:
        ValueError: ``m`` exceeds the number of ids.
    """
    ids = np.asarray(ids)
    if not 0 <= m <= len(ids):
        raise ValueError(f"cannot draw {m} deletions from {len(ids)} points")
    return np.random.default_rng(seed).choice(ids, size=m, replace=False)


def gaussian_mixture(
    n: int, seed: int, *, d: int = 25, k: int = 5, variance: float = 0.8
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's synthetic set: k spherical Gaussians with centres uniform in ``[0, 1]^d`` and
    covariance ``variance * I``, n/k samples each, min-max scaled to ``[0, 1]^d``.

    Returns:
        ``(x [n, d] float64, labels [n] int64)``.

    References:
        Ginart et al., App. D.1; spec 5.1 (n = 100,000, d = 25, k = 5, variance 0.8).
    """
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 1, size=(k, d))
    sizes = [n // k + (j < n % k) for j in range(k)]
    x = np.concatenate([rng.normal(c, np.sqrt(variance), size=(s, d)) for c, s in zip(centres, sizes)])
    y = np.repeat(np.arange(k), sizes)
    lo, hi = x.min(0), x.max(0)
    return (x - lo) / np.where(hi > lo, hi - lo, 1.0), y


def gaussian_dataset(seed: int, per_component: int = 20_000, *, name: str = "gaussian") -> Dataset:
    """The paper's synthetic Gaussian set as a `Dataset`: 5 spherical Gaussians in 25 dimensions,
    centres uniform in ``[0, 1]^25``, covariance ``0.8 I``, ``per_component`` samples each (the
    paper: 20,000, n = 100,000), label = component, min-max scaled to ``[0, 1]^25``; k = 5.

    Args:
        seed: seed of the centres and samples (the CLI's ``--seed``).
        per_component: samples per component.
        name: the data set's name.

    Raises:
        ValueError: ``per_component < 1``.

    References:
        Ginart et al., App. D.1; spec 4 (experiments) and 5.1 (the Gaussian row).
    """
    if per_component < 1:
        raise ValueError("per_component must be positive")
    x, y = gaussian_mixture(5 * per_component, seed, d=25, k=5, variance=0.8)
    return Dataset(name, x, y, 5)


#: Data sets the deletion plugins build by name (``fedproto run dckmeans --data gaussian``):
#: ``gaussian`` is the paper's recipe (n = 100,000), ``gaussian-small`` the same with 2,000 points
#: per component (n = 10,000) for quick runs.
GENERATED_DATASETS: dict[str, Callable[[int], Dataset]] = {
    "gaussian": lambda seed: gaussian_dataset(seed),
    "gaussian-small": lambda seed: gaussian_dataset(seed, 2_000, name="gaussian-small"),
}


def baseline_kmeans(x: np.ndarray, ids: np.ndarray, k: int, key: jax.Array, iterations: int = 10) -> np.ndarray:
    """Plain k-means: keyed k-means++ seeding and ``iterations`` Lloyd iterations, ``[k, d]``."""
    return node_kmeans(jax.random.fold_in(key, BASELINE_STREAM), x, ids, k, iterations)


def converged_kmeans(x: np.ndarray, ids: np.ndarray, k: int, key: jax.Array, max_iterations: int = 300) -> np.ndarray:
    """Plain k-means with Lloyd's run until the centroids stop moving (for the baseline's
    metrics, spec 5.2), at most ``max_iterations``; ``[k, d]``."""
    c = baseline_kmeans(x, ids, k, key, 10)
    xp, _, valid = _kernels.pad_rows(x, ids)
    for _ in range(10, max_iterations, 10):
        nxt = np.asarray(_kernels.lloyd_iterations(xp, valid, jnp.asarray(c), c.shape[0], 10))
        if np.array_equal(nxt, c):
            break
        c = nxt
    return c


def quality(
    x: np.ndarray, labels_true: np.ndarray | None, centroids: np.ndarray, *, sample: int = 10_000, seed: int = 0
) -> dict[str, float]:
    """Loss, silhouette (on a random subsample) and NMI of a model on ``x``.

    Args:
        x: ``[n, d]`` points; labels_true: ``[n]`` ground truth or ``None``.
        centroids: ``[k, d]`` the model; sample: silhouette subsample size (paper: 10,000).
        seed: seed of the subsample.

    Returns:
        ``{"loss": sum of squared distances, "silhouette": ..., "nmi": ...}`` (NaN where not
        defined: one cluster only, or no labels).
    """
    from sklearn.metrics import normalized_mutual_info_score, silhouette_score

    xp, _, valid = _kernels.pad_rows(x, np.arange(len(x)))
    labels, _, loss = _kernels.assign_masked(xp, valid, jnp.asarray(centroids))
    labels = np.asarray(labels)[: len(x)]
    out = {"loss": float(loss), "silhouette": float("nan"), "nmi": float("nan")}
    if len(np.unique(labels)) > 1:
        rng = np.random.default_rng(seed)
        idx = rng.choice(len(x), size=min(sample, len(x)), replace=False)
        if len(np.unique(labels[idx])) > 1:
            out["silhouette"] = float(silhouette_score(x[idx], labels[idx]))
    if labels_true is not None:
        out["nmi"] = float(normalized_mutual_info_score(labels_true, labels, average_method="arithmetic"))
    return out


@dataclasses.dataclass(frozen=True)
class StreamTiming:
    """Wall-clock cost of one train-then-delete stream.

    Attributes:
        method: ``"Q-k-means"``, ``"DC-k-means"`` or ``"k-means"``.
        train_s: training time.
        deletion_s: time of each deletion, in order.
        retrained: per deletion, whether it retrained from scratch (the baseline always does).
        centroids: the model after training.
        final: the model after the stream.
    """

    method: str
    train_s: float
    deletion_s: tuple[float, ...]
    retrained: tuple[bool, ...]
    centroids: np.ndarray
    final: np.ndarray

    @property
    def amortised_s(self) -> float:
        """``(training + all deletions) / m`` (spec 5.2)."""
        return amortised_s(self.train_s, self.deletion_s)

    @property
    def cumulative_s(self) -> np.ndarray:
        """Cumulative time after training and after each deletion, ``[m + 1]``."""
        return self.train_s + np.concatenate([[0.0], np.cumsum(self.deletion_s)])


def amortised_s(train_s: float, deletion_s: Sequence[float]) -> float:
    """Amortised time per deletion: ``(t_train + sum t_del) / m``."""
    if not len(deletion_s):
        raise ValueError("no deletions")
    return (train_s + float(np.sum(deletion_s))) / len(deletion_s)


def _block(tree) -> None:
    jax.block_until_ready(tree)


def warm_up(x: np.ndarray, k: int, m: int, *, method: str, iterations: int = 10, widths: Sequence[int] = ()) -> None:
    """Compile every padded shape a stream of ``m`` deletions from ``x`` can meet, so that the
    timed runs measure computation, not compilation.

    Args:
        x: the data; k: clusters; m: deletions; iterations: T.
        method: ``"q"`` or ``"dc"``; the baseline's shapes (plain k-means on ``n - m .. n``
            points) are compiled for both.
        widths: DC widths that will be used (their leaf sizes are covered too).
    """
    n, d = x.shape
    sizes = sorted({_kernels.capacity(s) for s in range(max(n - m, k), n + 1)})
    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(0)
    for cap in sizes:
        pts = rng.uniform(size=(cap, d))
        node_kmeans(key, pts, np.arange(cap), k, iterations)
        if method == "q":
            train_qkmeans(pts, np.arange(cap), QKMeansConfig(k=k, iterations=iterations, eps=0.1), key)
    if method == "q":
        q = QKMeans(QKMeansConfig(k=k, iterations=iterations, eps=0.1), seed=0)
        q.fit(rng.uniform(size=(max(4 * k, 64), d)))
        q.delete(int(next(i for i in q.store.ids if i not in q.model.seed_ids)))
        return
    leaf_caps: set[int] = set()
    for w in widths:
        DCKMeans(DCKMeansConfig(k=k, iterations=iterations, width=w), seed=0).fit(rng.uniform(size=(n, d)))
        mean = n / w
        spread = 6 * np.sqrt(mean) + 1
        leaf_caps |= {_kernels.capacity(s) for s in range(max(int(mean - spread - m), 1), int(mean + spread) + 1)}
        leaf_caps.add(_kernels.capacity(w * k))
    for cap in sorted(leaf_caps - set(sizes)):
        node_kmeans(key, rng.uniform(size=(cap, d)), np.arange(cap), k, iterations)


def time_stream(
    method: str,
    x: np.ndarray,
    ids: np.ndarray,
    stream: Sequence[int],
    *,
    q_config: QKMeansConfig | None = None,
    dc_config: DCKMeansConfig | None = None,
    key: jax.Array,
    leaves: np.ndarray | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamTiming:
    """Train ``method`` (``"q"`` or ``"dc"``) once and time each deletion of ``stream``.

    Raises:
        ValueError: unknown method or missing configuration.
    """
    if method == "q":
        if q_config is None:
            raise ValueError("Q-k-means needs q_config")
        model: QKMeans | DCKMeans = QKMeans(q_config, key=key)
        name = "Q-k-means"
        fit = lambda: model.fit(x, ids)  # noqa: E731
    elif method == "dc":
        if dc_config is None:
            raise ValueError("DC-k-means needs dc_config")
        model = DCKMeans(dc_config, key=key)
        name = "DC-k-means"
        fit = lambda: model.fit(x, ids, leaves=leaves)  # noqa: E731
    else:
        raise ValueError(f"unknown method {method!r}")
    t0 = clock()
    fit()
    train_s = clock() - t0
    centroids = np.array(model.centroids)
    times, retrained = [], []
    for point_id in stream:
        t0 = clock()
        outcome = model.delete(int(point_id))
        times.append(clock() - t0)
        retrained.append(outcome.retrained)
    return StreamTiming(name, train_s, tuple(times), tuple(retrained), centroids, np.array(model.centroids))


def time_baseline(
    x: np.ndarray,
    ids: np.ndarray,
    stream: Sequence[int],
    k: int,
    *,
    key: jax.Array,
    retrains: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamTiming:
    """Plain k-means on the stream: train, then retrain from scratch after each deletion.

    Args:
        retrains: time only this many retrains (evenly spread over the stream) and charge each
            other deletion their mean; ``None`` times all of them.

    Returns:
        The timing; ``deletion_s`` holds measured and (if ``retrains``) estimated times.
    """
    t0 = clock()
    centroids = baseline_kmeans(x, ids, k, key)
    train_s = clock() - t0
    m = len(stream)
    measured_at = set(range(m)) if retrains is None or retrains >= m else set(
        np.linspace(0, m - 1, max(retrains, 1)).round().astype(int).tolist()
    )
    keep = np.ones(len(ids), dtype=bool)
    row_of = {int(i): r for r, i in enumerate(ids)}
    measured: dict[int, float] = {}
    final = centroids
    for j, point_id in enumerate(stream):
        keep[row_of[int(point_id)]] = False
        if j in measured_at:
            t0 = clock()
            final = baseline_kmeans(x[keep], ids[keep], k, key)
            measured[j] = clock() - t0
    mean = float(np.mean(list(measured.values()))) if measured else 0.0
    times = tuple(measured.get(j, mean) for j in range(m))
    return StreamTiming("k-means", train_s, times, (True,) * m, centroids, final)
