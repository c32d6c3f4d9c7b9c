"""Q-k-means (quantised Lloyd's) with exact deletion.

Theory of operation (Ginart et al. 2019, Sec. 4.1, Alg. 1/4/5, App. B.1, C.1; spec
deletion-kmeans.md sections 1 and 3):

Training (`train_qkmeans`): k-means++ seeding (the seeds are kept un-quantised), then at most T
Lloyd iterations. Iteration tau takes the sums ``S`` and counts ``m`` of the current partition,
pads every cluster lighter than ``M = gamma n / k`` up to mass M with its previous centroid (the
balance correction), snaps all k centroids to the lattice ``eps (theta_tau + Z^d)`` with a fresh
uniform phase, reassigns, and stops at the first iteration whose loss is not strictly lower
(that iteration's centroids are thrown away). Everything deletion needs is kept per executed
iteration: ``S``, ``m``, ``theta``, the integer lattice indices ``A``, the loss and the stop bit.

Deletion (`QKMeans.delete`): deleting a seed retrains. Otherwise every executed iteration is
replayed without the point (`_kernels.replay_removal`): the exact statistics ``S - p``,
``m - 1``, the new threshold ``M' = gamma (n-1) / k`` for *all* k rows, the stored phase, and
the stop decisions with p's loss removed. If every lattice index and every decision is unchanged
(with safety margins against floating-point ties), the metadata is updated and the model is
kept; otherwise the model is retrained on the remaining data with the **same key**.

Exactness: all randomness is keyed (seeding by Gumbel-max over stable point ids, phases by
iteration), so for any key K and any deletion sequence chosen independently of K, the model after
the deletions *equals* ``train_qkmeans(D_remaining, K)`` (oracle O-Q-1), which implies the paper's
distributional guarantee (Def. 3.1). Deviations from the paper and from the authors' code, on
purpose (spec 6.4): the first seed is tracked; p's cluster is its nearest previous *quantised*
centroid; the perturbation is exact; M's dependence on n is honoured; stop decisions are
re-checked; the early stop compares against the seeding loss; deleted rows are removed.

Fresh randomness (``QKMeans(retrain_keys="fresh")``, oracle O-Q-8): retrains draw a new key
instead of the run's, as in the paper's Alg. 5. The output is then ``A(D; K) = A(D_{-i}; K)`` on
the certified event S and a fresh ``A(D_{-i}; K')`` otherwise. The paper (App. C.1) and the spec
(1.5, 3.2) conclude that the mixture has the law of ``A(D_{-i})``. That holds only if S is
independent of ``A(D_{-i}; K)``, and it is not. (1) Seeding: the D^2 normaliser of D contains
i's weight, which depends on the seeds drawn, so the seeds of ``D_{-i}`` do not have the law of
D's seeds given that i was not drawn. (2) Quantisation: given that ``Q(c) = Q(c')``, the phase is
no longer uniform, so ``Q(c') - c'`` is biased towards c (by ``delta / 2`` in 1-D). The O-Q-8 chi-square
test rejects equality in distribution for fresh retrains (and accepts it for coupled ones); see
``tests/algorithms/deletion/test_qkmeans.py``. The default, coupled retrains under the same key,
is pathwise equal to ``A(D_{-i}; K)``. It is therefore exact in distribution for deletion
requests that do not depend on K (Def. 3.1). The fresh option exists to exhibit that difference.

Empty clusters follow option (ii) of App. B.1: an empty cluster keeps its previous centroid (no
re-seeding), so the seed set is exactly the k-means++ seeds. With ``eps=None`` the paper's
heuristic ``eps = 2^round(-log10(n / (k d^1.5)) - 3)`` is re-evaluated after every deletion and a
change retrains (as a change of w does for DC-k-means).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms.deletion import _kernels
from fedproto.algorithms.deletion._store import DeletionError, DeletionOutcome, PointStore, check_points

__all__ = [
    "QKMeans",
    "QKMeansConfig",
    "QKMeansModel",
    "RETRAIN_KEYS",
    "certify_removal",
    "default_epsilon",
    "removal_decision",
    "train_qkmeans",
]

#: ``fold_in`` constants that split a run's key into independent streams (DC-k-means uses 3 and
#: 4, the streams' baseline 5).
SEEDING_STREAM = 1
PHASE_STREAM = 2
#: Stream of the keys of fresh-randomness retrains (``QKMeans(retrain_keys="fresh")``).
FRESH_STREAM = 6
#: How a retrain after an uncertified deletion draws its randomness (see `QKMeans`).
RETRAIN_KEYS = ("coupled", "fresh")


def default_epsilon(n: int, k: int, d: int) -> float:
    """The paper's lattice granularity heuristic ``eps = 2^round(-log10(n / (k d^1.5)) - 3)``.

    References:
        Ginart et al., App. D.1.2; spec 5.1 (2^-5 for Celltype, 2^-2 for MNIST).
    """
    if n < 1 or k < 1 or d < 1:
        raise ValueError("n, k and d must be positive")
    return 2.0 ** round(-math.log10(n / (k * d**1.5)) - 3)


@dataclasses.dataclass(frozen=True)
class QKMeansConfig:
    """Hyper-parameters of Q-k-means.

    Attributes:
        k: clusters.
        iterations: maximum Lloyd iterations T (paper: 10).
        gamma: balance parameter in ``[0, 1)``: clusters lighter than ``gamma n / k`` are
            corrected (paper: 0.2).
        eps: lattice granularity, or ``None`` for the paper's heuristic `default_epsilon`.
        lattice_margin: a replayed coordinate closer than this (in lattice units) to a rounding
            boundary counts as unstable (spec 1.5 [design]).
        loss_margin: a replayed stop decision whose losses differ by at most this relative
            amount counts as unstable.
    """

    k: int
    iterations: int = 10
    gamma: float = 0.2
    eps: float | None = None
    lattice_margin: float = 1e-9
    loss_margin: float = 1e-10

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError("k must be a positive integer")
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise ValueError("iterations must be a positive integer")
        if not 0 <= self.gamma < 1:
            raise ValueError("gamma must lie in [0, 1)")
        if self.eps is not None and not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError("eps must be positive")
        if not 0 <= self.lattice_margin < 0.5 or not self.loss_margin >= 0:
            raise ValueError("margins must be non-negative (lattice margin below 1/2)")

    def resolve_eps(self, n: int, d: int) -> float:
        """The granularity used for ``n`` points in ``d`` dimensions."""
        return self.eps if self.eps is not None else default_epsilon(n, self.k, d)


@dataclasses.dataclass(frozen=True)
class QKMeansModel:
    """A trained Q-k-means model and its deletion metadata (spec 1.4).

    Arrays over iterations have T rows; rows at and beyond ``executed`` are unused.

    Attributes:
        k, n, d: clusters, points, dimension.
        eps: lattice granularity; gamma: balance parameter.
        mass_threshold: ``M = gamma n / k``.
        seed_ids: ``[k]`` int64 ids of the k-means++ seeds, in draw order (the first, uniform
            seed included).
        seed_centroids: ``[k, d]`` the seed points (un-quantised ``chat_0``).
        thetas: ``[T, d]`` phases; indices: ``[T, k, d]`` int64 lattice indices ``A_tau``.
        sums: ``[T, k, d]``; counts: ``[T, k]`` float64 statistics of ``pi_{tau-1}``.
        losses: ``[T+1]`` ``L_0..L_T`` (sums of squared distances).
        accepted: ``[T]`` bool stop decisions (True = accepted).
        executed: iterations executed (the last may be the breaking one).
    """

    k: int
    n: int
    d: int
    eps: float
    gamma: float
    mass_threshold: float
    seed_ids: np.ndarray
    seed_centroids: np.ndarray
    thetas: np.ndarray
    indices: np.ndarray
    sums: np.ndarray
    counts: np.ndarray
    losses: np.ndarray
    accepted: np.ndarray
    executed: int

    @property
    def n_accepted(self) -> int:
        """Accepted iterations (0: the output is the un-quantised seed set)."""
        return int(np.sum(self.accepted[: self.executed]))

    def quantized(self, tau: int) -> np.ndarray:
        """``chat_tau`` ``[k, d]`` for ``1 <= tau <= executed``; ``chat_0`` (the seeds) for 0."""
        if tau == 0:
            return self.seed_centroids
        return np.asarray(_kernels.lattice_points(self.indices[tau - 1], self.eps, self.thetas[tau - 1][None, :]))

    @property
    def centroids(self) -> np.ndarray:
        """The model: ``[k, d]`` float64, the last accepted centroids."""
        return self.quantized(self.n_accepted)

    @property
    def loss(self) -> float:
        """The training loss of the output centroids (sum of squared distances)."""
        return float(self.losses[self.n_accepted])


def train_qkmeans(
    x: np.ndarray,
    ids: np.ndarray,
    config: QKMeansConfig,
    key: jax.Array,
    *,
    seed_ids: np.ndarray | None = None,
    thetas: np.ndarray | None = None,
) -> QKMeansModel:
    """Train Q-k-means (Alg. 4) and record the deletion metadata.

    Args:
        x: ``[n, d]`` float64 points (the paper assumes ``[0, 1]^d``), rows sorted by id.
        ids: ``[n]`` int64 stable ids, unique, below 2^32.
        config: hyper-parameters.
        key: the run's `jax.random` key; seeding uses ``fold_in(key, 1)``, phases
            ``fold_in(key, 2)``.
        seed_ids: test hook: use these k ids as the seeds instead of drawing them.
        thetas: test hook: ``[T, d]`` phases instead of drawing them.

    Returns:
        The model with its metadata.

    Raises:
        ValueError: fewer than k points, fewer than k distinct points, or a bad hook.

    References:
        Ginart et al., Alg. 1 and Alg. 4 (App. B.1); spec 1.3.
    """
    x, ids = check_points(x, ids)
    n, d = x.shape
    k, t_max = config.k, config.iterations
    if n < k:
        raise ValueError(f"k = {k} is larger than the number of points n = {n}")
    eps = config.resolve_eps(n, d)
    xp, ip, valid = _kernels.pad_rows(x, ids)
    if seed_ids is None:
        rows, count = _kernels.kmeanspp_seeding(jax.random.fold_in(key, SEEDING_STREAM), xp, ip, valid, k)
        if int(count) < k:
            raise ValueError(f"fewer than k = {k} distinct points: k-means++ cannot place {k} seeds")
        rows = np.asarray(rows, dtype=np.int64)
    else:
        seed_ids = np.asarray(seed_ids, dtype=np.int64)
        rows = np.searchsorted(ids, seed_ids)
        if seed_ids.shape != (k,) or np.any(rows >= n) or not np.array_equal(ids[np.minimum(rows, n - 1)], seed_ids):
            raise ValueError("seed_ids must be k ids of points in the data")
    if thetas is None:
        thetas = np.asarray(_kernels.random_phases(jax.random.fold_in(key, PHASE_STREAM), t_max, d))
    else:
        thetas = np.asarray(thetas, dtype=np.float64)
        if thetas.shape != (t_max, d):
            raise ValueError(f"thetas must have shape [{t_max}, {d}]")
    seeds = x[rows]
    mass = config.gamma * n / k
    indices = np.zeros((t_max, k, d), dtype=np.int64)
    sums = np.zeros((t_max, k, d))
    counts = np.zeros((t_max, k))
    losses = np.zeros(t_max + 1)
    accepted = np.zeros(t_max, dtype=bool)
    labels, _, loss0 = _kernels.assign_masked(xp, valid, jnp.asarray(seeds))
    losses[0] = float(loss0)
    prev, best = jnp.asarray(seeds), losses[0]
    executed = 0
    for tau in range(1, t_max + 1):
        s, m, a, chat, new_labels, loss = _kernels.qkmeans_iteration(
            xp, valid, labels, prev, jnp.asarray(thetas[tau - 1]), eps, mass, k
        )
        sums[tau - 1], counts[tau - 1], indices[tau - 1] = np.asarray(s), np.asarray(m), np.asarray(a)
        losses[tau] = float(loss)
        executed = tau
        if losses[tau] < best:  # strict: Alg. 4's early stop, against the seeding loss at tau = 1
            accepted[tau - 1] = True
            prev, labels, best = chat, new_labels, losses[tau]
        else:
            break
    return QKMeansModel(
        k=k,
        n=n,
        d=d,
        eps=eps,
        gamma=config.gamma,
        mass_threshold=mass,
        seed_ids=ids[rows],
        seed_centroids=seeds,
        thetas=thetas,
        indices=indices,
        sums=sums,
        counts=counts,
        losses=losses,
        accepted=accepted,
        executed=executed,
    )


def certify_removal(model: QKMeansModel, p: np.ndarray, config: QKMeansConfig) -> tuple[str, QKMeansModel]:
    """Decide whether deleting the (non-seed) point ``p`` leaves the model unchanged.

    Args:
        model: the current model.
        p: ``[d]`` the point's coordinates.
        config: the hyper-parameters (margins).

    Returns:
        ``(reason, updated)``: ``reason`` is ``"certified"`` or why a retrain is needed (see
        `_kernels.REASONS`); ``updated`` is the model with the metadata of ``D`` without p
        (``S``, ``m``, losses, n, M), meaningful only when certified.

    References:
        Ginart et al., Alg. 5 with the corrections of spec 1.5.
    """
    t_max = model.thetas.shape[0]
    prev = np.empty((t_max, model.k, model.d))
    prev[0] = model.seed_centroids
    chat = np.asarray(
        _kernels.lattice_points(jnp.asarray(model.indices), model.eps, jnp.asarray(model.thetas)[:, None, :])
    )
    prev[1:] = chat[:-1]
    new_mass = model.gamma * (model.n - 1) / model.k
    code, sums, counts, losses = _kernels.replay_removal(
        jnp.asarray(p, dtype=jnp.float64),
        jnp.asarray(prev),
        jnp.asarray(chat),
        jnp.asarray(model.thetas),
        jnp.asarray(model.indices),
        jnp.asarray(model.sums),
        jnp.asarray(model.counts),
        jnp.asarray(model.losses),
        jnp.asarray(model.accepted),
        model.executed,
        model.eps,
        new_mass,
        config.lattice_margin,
        config.loss_margin,
    )
    reason = _kernels.REASONS[int(code)]
    executed = model.executed
    # Only the executed iterations carry statistics; the unused rows stay zero.
    new_sums = np.where(np.arange(t_max)[:, None, None] < executed, np.asarray(sums), 0.0)
    new_counts = np.where(np.arange(t_max)[:, None] < executed, np.asarray(counts), 0.0)
    new_losses = np.where(np.arange(t_max + 1) <= executed, np.asarray(losses), 0.0)
    updated = dataclasses.replace(
        model, n=model.n - 1, mass_threshold=new_mass, sums=new_sums, counts=new_counts, losses=new_losses
    )
    return reason, updated


def removal_decision(
    model: QKMeansModel, p: np.ndarray, point_id: int, config: QKMeansConfig
) -> tuple[str, QKMeansModel | None]:
    """Whether deleting point ``point_id`` (coordinates ``p``) keeps the model, or retrains.

    The order of the checks is the one of Alg. 5 with the corrections of spec 1.5: a change of
    the heuristic granularity (``eps=None``: it is a function of n) retrains, deleting a seed
    retrains (the first, uniform seed included), otherwise the exact replay decides.

    Args:
        model: the current model (``model.n`` points, the point among them).
        p: ``[d]`` the point's coordinates; point_id: its stable id.
        config: the hyper-parameters.

    Returns:
        ``(reason, updated)``: ``("certified", model with the metadata of D without p)``, or
        ``(why, None)`` when the model must be retrained on the remaining data (``why`` is
        ``"epsilon changed"``, ``"seed"`` or a replay reason of `_kernels.REASONS`).

    References:
        Ginart et al., Alg. 5; spec 1.5 and 6.4 item 1.
    """
    if config.resolve_eps(model.n - 1, model.d) != model.eps:
        return "epsilon changed", None
    if int(point_id) in set(model.seed_ids.tolist()):
        return "seed", None
    reason, updated = certify_removal(model, p, config)
    return reason, (updated if reason == "certified" else None)


class QKMeans:
    """Q-k-means with exact deletion: train once, then serve deletion requests one by one.

    Args:
        config: hyper-parameters.
        seed: seed of the run's key (ignored when ``key`` is given).
        key: the run's `jax.random` key.
        retrain_keys: ``"coupled"`` (default): a retrain uses the run's key again, so the model
            after any deletion stream *equals* ``train_qkmeans(D_remaining, key)`` (O-Q-1).
            ``"fresh"``: the r-th retrain since `fit` draws the fresh key
            ``fold_in(fold_in(key, 6), r)``, independent of the current model's randomness (the
            paper's Alg. 5). This is **not** an exact deletion: the certified branch keeps
            randomness that is conditioned on certification, so the output is not distributed as
            a fresh training on the remaining data (oracle O-Q-8 fails; see the module docstring).

    Raises:
        ValueError: unknown ``retrain_keys``.

    Attributes:
        model: the current `QKMeansModel` (``None`` before `fit`).
        model_key: the key the current model was trained with.
        store: the current data (`PointStore`).
        certified: deletions served without retraining.
        retrained: deletions that retrained.
        outcomes: every `DeletionOutcome`, in order.

    Example::

        qkm = QKMeans(QKMeansConfig(k=4), seed=0).fit(x)
        outcome = qkm.delete(17)       # certified or retrained, never stale
        qkm.centroids                  # == train_qkmeans(remaining data, same key).centroids
    """

    def __init__(
        self, config: QKMeansConfig, *, seed: int = 0, key: jax.Array | None = None, retrain_keys: str = "coupled"
    ) -> None:
        if retrain_keys not in RETRAIN_KEYS:
            raise ValueError(f"retrain_keys must be one of {RETRAIN_KEYS}, got {retrain_keys!r}")
        self.config = config
        self.key = key if key is not None else jax.random.PRNGKey(seed)
        self.retrain_keys = retrain_keys
        self.model_key = self.key
        self.model: QKMeansModel | None = None
        self.store: PointStore | None = None
        self.certified = 0
        self.retrained = 0
        self.outcomes: list[DeletionOutcome] = []

    def fit(self, x: np.ndarray, ids: np.ndarray | None = None) -> "QKMeans":
        """Train on ``x`` (rows with stable ``ids``, default ``0..n-1``) and reset the counters.

        Raises:
            ValueError: bad points or ids, k > n, fewer than k distinct points.
        """
        store = PointStore(x, ids)
        self.model = train_qkmeans(store.x, store.ids, self.config, self.key)
        self.model_key = self.key
        self.store = store
        self.certified = self.retrained = 0
        self.outcomes = []
        return self

    @property
    def centroids(self) -> np.ndarray:
        """The current model's centroids ``[k, d]``."""
        if self.model is None:
            raise DeletionError("the model is not trained yet: call fit() first")
        return self.model.centroids

    def delete(self, point_id: int) -> DeletionOutcome:
        """Delete one point exactly.

        Args:
            point_id: the stable id of the point.

        Returns:
            What happened (certified, or retrained and why).

        Raises:
            DeletionError: not trained yet, unknown or already deleted id, or fewer than k points
                would remain; the model and data are then unchanged.

        References:
            Ginart et al., Alg. 5; spec 1.5 (and 7.1 O-Q-8 for ``retrain_keys="fresh"``).
        """
        if self.model is None or self.store is None:
            raise DeletionError("delete() before fit(): there is no model to delete from", point_id=point_id)
        store, model = self.store, self.model
        row = store.row_of(point_id)
        point_id = int(point_id)
        if store.n - 1 < self.config.k:
            raise DeletionError(
                f"deleting point {point_id} would leave {store.n - 1} points, fewer than k = {self.config.k}",
                point_id=point_id,
            )
        reason, updated = removal_decision(model, store.x[row], point_id, self.config)
        if updated is not None:
            store.remove(row)
            self.model = updated
            self.certified += 1
            outcome = DeletionOutcome(point_id, False, reason)
            self.outcomes.append(outcome)
            return outcome
        keep = np.ones(store.n, dtype=bool)
        keep[row] = False
        key = self.model_key
        if self.retrain_keys == "fresh":
            key = jax.random.fold_in(jax.random.fold_in(self.key, FRESH_STREAM), self.retrained + 1)
        try:
            fresh = train_qkmeans(store.x[keep], store.ids[keep], self.config, key)
        except ValueError as exc:
            raise DeletionError(f"cannot delete point {point_id}: {exc}", point_id=point_id) from exc
        store.remove(row)
        self.model, self.model_key = fresh, key
        self.retrained += 1
        outcome = DeletionOutcome(point_id, True, reason)
        self.outcomes.append(outcome)
        return outcome
