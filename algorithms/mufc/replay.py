"""A timed, centralised replay of a MUFC run: the same computations as the parties, one process.

The protocol machines never read a clock (sans-IO), so the time of each removal against complete
retraining is measured here, by redoing each party's computation in turn and timing it. Clients
work in parallel in a federation, so a step's time is the slowest client's plus the server's
(spec 4.3); a removal request makes only the requesting client compute (Algorithm 3), every other
client only resends its cached syndromes.

Timed work per removal (exact and literal modes): the requesting client's Algorithm 3 and its
syndromes; the server's sum of the L shares, SCMA decoding and (when the mode asks) K-means++ on
the decoded bins. Complete retraining: every client's seeding from scratch on its remaining data
and its syndromes (the slowest client counts), then the same server work. Mask generation is not
timed (the paper excludes it; it is the same in both). A client's powers of its bins
(`~fedproto.algorithms.mufc.protocol.bin_powers_ahead`, after training and after a re-seeding)
are computed between rounds too: timed apart (:attr:`Replay.powers_s`), not in the removals.

References:
    Pan et al., ICLR 2023, Sec. 6 and App. M (timing protocol); spec mufc.md 4.3, 3.5.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from fedproto.algorithms import kmeans, scma
from fedproto.algorithms.mufc.client import bin_powers_ahead, refresh_syndromes
from fedproto.algorithms.mufc.clustering import federated_loss
from fedproto.algorithms.mufc.config import MUFCConfig
from fedproto.algorithms.mufc.messages import MaskedSyndromes, ModelUpdate
from fedproto.algorithms.mufc.seeding import LocalSeeding
from fedproto.algorithms.mufc.server import ServerModel
from fedproto.codec import decode_frame, encode_frame

__all__ = ["RemovalStep", "Replay", "replay", "warm_up_requests"]


@dataclasses.dataclass(frozen=True)
class RemovalStep:
    """One removal request of the replay.

    Attributes:
        client: the requesting client; whole_client: it left the federation.
        reseeded: Algorithm 3 re-seeded (False when the client left).
        client_s: the requesting client's time (Algorithm 3 and its syndromes' update).
        server_s: the server's time: ``share_sum_s + decode_s + cluster_s``.
        reclustered: the server re-ran K-means++.
        loss: phi_f on the remaining data after the step (``None`` if not evaluated).
        share_sum_s: the server's sum of the active clients' packed shares.
        decode_s: the server's syndrome decoding (the change since the last round).
        cluster_s: the server's weighted K-means++ (0 when it did not re-cluster).
        codec_s: encoding and decoding the round's frames, apart from the above: the
            requesting client's share, the server's decoding of every active client's share
            and the model update (one encoding, one decoding).
    """

    client: int
    whole_client: bool
    reseeded: bool
    client_s: float
    server_s: float
    reclustered: bool
    loss: float | None
    share_sum_s: float = 0.0
    decode_s: float = 0.0
    cluster_s: float = 0.0
    codec_s: float = 0.0

    @property
    def total_s(self) -> float:
        """Time of the removal round: client plus server (codec apart)."""
        return self.client_s + self.server_s


@dataclasses.dataclass(frozen=True)
class Replay:
    """The outcome of :func:`replay`.

    Attributes:
        train_client_s: the slowest client's training time (seeding and syndromes).
        train_server_s: the server's training time.
        retrain_s: median time of a complete retraining (slowest client + server), measured
            ``retrains`` times along the stream.
        steps: one :class:`RemovalStep` per request.
        centroids: the final server model ``[k, d]``.
        initial_loss: phi_f after training.
        mask_s: one client's expansion of its pairwise mask for one round among all clients
            (median of three), the work a client does between rounds (precomputed, so apart
            from every removal's time; zero with a single client).
        powers_s: one client's computation of its bins' powers
            (`~fedproto.algorithms.mufc.protocol.bin_powers_ahead`, after training and after each
            re-seeding; median), also between rounds and apart from the removal times.
    """

    train_client_s: float
    train_server_s: float
    retrain_s: float
    steps: tuple[RemovalStep, ...]
    centroids: np.ndarray
    initial_loss: float
    mask_s: float = 0.0
    powers_s: float = 0.0

    @property
    def mean_removal_s(self) -> float:
        """Mean time per removal request (nan without requests)."""
        return float(np.mean([s.total_s for s in self.steps])) if self.steps else float("nan")

    @property
    def speedup(self) -> float:
        """Complete retraining time over the mean removal time (accumulated over the stream)."""
        return self.retrain_s / self.mean_removal_s if self.steps else float("nan")


def _timed(fn: Callable[[], object], clock: Callable[[], float]) -> tuple[object, float]:
    t0 = clock()
    out = fn()
    return out, clock() - t0


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Garbage collection off while timing (a collection pause must not become "the slowest
    client" or a removal's time); one collection before, the collector restored after."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Server:
    """The parties' server computation (:class:`ServerModel`) with the run's point bound, timed
    part by part, over the decoded frames of the active clients' shares."""

    def __init__(self, config: MUFCConfig, key: jax.Array, n_points: int, clock: Callable[[], float]) -> None:
        self.model, self.total, self.clock = ServerModel(config, key), n_points, clock
        self.share_sum_s = self.decode_s = self.cluster_s = 0.0

    @property
    def centroids(self) -> np.ndarray | None:
        return self.model.centroids

    def step(self, shares: Sequence[np.ndarray], round_idx: int, *, force: bool = False) -> bool:
        clock = self.clock
        t0 = clock()
        sums = self.model.sum_shares(shares)
        t1 = clock()
        counts = self.model.decode(sums, n_clients=len(shares), max_total=self.total, fresh=force)
        t2 = clock()
        self.total = sum(counts.values())
        recluster = self.model.adopt(counts, round_idx, force=force)
        t3 = clock()
        self.share_sum_s, self.decode_s, self.cluster_s = t1 - t0, t2 - t1, t3 - t2
        return recluster


def _share_frame(syndromes: Sequence[int], cfg: MUFCConfig, round_idx: int) -> bytes:
    """A client's share as the server receives it (unmasked: the masks cancel in the sum and
    their generation is not timed), encoded with the run's envelope."""
    share = MaskedSyndromes(attempt=0, width=cfg.width, values=scma.pack_elements(syndromes, cfg.prime))
    return encode_frame(share, session=0, round_idx=round_idx, phase="aggregate")


def warm_up_requests(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], config: MUFCConfig, key: jax.Array
) -> list[tuple[int, tuple[int, ...]]]:
    """Removal requests that compile every kernel a timed replay with ``key`` can meet.

    JAX compiles a kernel once per padded size (`fedproto.algorithms.kmeans.capacity`), so the
    first re-seeding of a client of a new size would pay a compilation inside a timed removal.
    These requests remove the first seed of one client per padded size (re-seeding it), plus
    one point that is not a seed; replaying them once before timing (with the same ``key``)
    keeps compilation out of the figures.

    Args:
        parts: each client's ``(points [n_l, d], ids [n_l])``; config: the public parameters.

    Returns:
        ``(client, (point id,))`` requests in client order.
    """
    out: list[tuple[int, tuple[int, ...]]] = []
    sizes: set[int] = set()
    for c, (x, ids) in enumerate(parts):
        size = kmeans.capacity(x.shape[0])
        if size in sizes or x.shape[0] < 3:
            continue
        sizes.add(size)
        seeds = LocalSeeding(x, ids, config.k_client, jax.random.fold_in(key, c + 1)).seeds
        other = next(int(i) for i in ids.tolist() if int(i) not in seeds)
        out += [(c, (int(seeds[0]),)), (c, (other,))]
    return out


def replay(
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
    config: MUFCConfig,
    key: jax.Array,
    requests: Sequence[tuple[int, Sequence[int] | None]],
    *,
    retrains: int = 3,
    evaluate: bool = True,
    progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Replay:
    """Replay training and a removal stream with the parties' keys, timing every step.

    Args:
        parts: each client's ``(points [n_l, d], ids [n_l])``.
        config: the public parameters; key: the run key (as :class:`~fedproto.algorithms.mufc.protocol.MUFCParties`).
        requests: ``(client, ids)`` batches or ``(client, None)`` departures, in order.
        retrains: complete retrainings timed along the stream (at evenly spaced steps).
        evaluate: compute phi_f after every step.
        progress: called with the number of requests served so far.
        clock: seconds: ``time.perf_counter`` (wall time, the default) or ``time.process_time``
            (this process's CPU time, every thread's: what other programs on a busy machine
            disturb least; JAX's worker threads count in full).

    Returns:
        The :class:`Replay`; its centroids equal the protocol's (same keys, same order).

    Raises:
        ValueError: ``retrains < 1``.
    """
    if retrains < 1:
        raise ValueError("retrains must be at least 1")
    with _collector_paused():
        return _replay(parts, config, key, requests, retrains, evaluate, progress, clock)


def _replay(
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
    cfg: MUFCConfig,
    key: jax.Array,
    requests: Sequence[tuple[int, Sequence[int] | None]],
    retrains: int,
    evaluate: bool,
    progress: Callable[[int], None] | None,
    clock: Callable[[], float],
) -> Replay:
    active = list(range(len(parts)))
    locals_: list[LocalSeeding] = []
    counts: list[dict[int, int]] = []
    syndromes: list[list[int]] = []
    client_times = []
    powers: list[dict[int, list[int]]] = []
    powers_times: list[float] = []
    for c, (x, ids) in enumerate(parts):
        def train(c=c, x=x, ids=ids):
            local = LocalSeeding(x, ids, cfg.k_client, jax.random.fold_in(key, c + 1),
                                 lloyd_iterations=cfg.lloyd_iterations)
            q = local.counts(cfg.grid)
            return local, q, scma.rs_syndromes(q, cfg.prime, cfg.n_syndromes)

        (local, q, syn), seconds = _timed(train, clock)
        locals_.append(local)
        counts.append(q)
        syndromes.append(syn)
        client_times.append(seconds)
        # between rounds: the powers of the client's bins, for its next removals
        ahead, seconds = _timed(lambda q=q: bin_powers_ahead(q, cfg), clock)
        powers.append(ahead)
        powers_times.append(seconds)
    frames = [_share_frame(syn, cfg, 0) for syn in syndromes]
    server = _Server(cfg, jax.random.fold_in(key, 0), sum(x.shape[0] for x, _ in parts), clock)
    _, train_server_s = _timed(lambda: server.step([decode_frame(f)[1].values for f in frames], 0), clock)

    def loss() -> float:
        xs, cents, poss = [], [], []
        for c in active:
            x, ids = parts[c]
            kept_ids, positions = locals_[c].assignment()
            row = {int(i): r for r, i in enumerate(ids.tolist())}
            xs.append(x[[row[int(i)] for i in np.asarray(kept_ids).tolist()]])
            cents.append(np.asarray(locals_[c].centroids))
            poss.append(np.asarray(positions))
        return float(federated_loss(xs, cents, poss, cfg.grid, server.centroids))

    initial = loss() if evaluate else float("nan")
    removed: list[set[int]] = [set() for _ in parts]
    retrain_at = set(np.linspace(0, max(len(requests) - 1, 0), retrains).round().astype(int).tolist())
    retrain_times: list[float] = []
    steps = []
    for s, (c, batch) in enumerate(requests, start=1):
        codec_s = 0.0
        if batch is None:
            active.remove(c)
            reseeded, client_s = False, 0.0
        else:
            batch = tuple(int(i) for i in batch)

            def unlearn(c=c, batch=batch):
                outcome = locals_[c].remove(batch, key=(
                    jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, c + 1), 1 << 20), s)
                    if cfg.fresh_randomness else None))
                if cfg.unlearning != "literal" or outcome.reseeded:
                    counts[c], syndromes[c] = refresh_syndromes(locals_[c], counts[c], syndromes[c], cfg, powers[c])
                return outcome.reseeded

            reseeded, client_s = _timed(unlearn, clock)
            if counts[c].keys() != powers[c].keys():  # new seeds: their powers, between rounds
                powers[c], seconds = _timed(lambda c=c: bin_powers_ahead(counts[c], cfg, powers[c]), clock)
                powers_times.append(seconds)
            removed[c].update(batch)
            frames[c], codec_s = _timed(lambda c=c: _share_frame(syndromes[c], cfg, s), clock)
        # the server receives every active client's share frame (the others' were encoded
        # between rounds: their masks do not depend on the request)
        t0 = clock()
        shares = [decode_frame(frames[a])[1].values for a in active]
        codec_s += clock() - t0
        recluster = server.step(shares, s)
        server_s = server.share_sum_s + server.decode_s + server.cluster_s
        assert server.centroids is not None
        t0 = clock()
        update = ModelUpdate(version=s, reclustered=bool(recluster), centroids=server.centroids)
        decode_frame(encode_frame(update, session=0, round_idx=s, phase="model"))
        codec_s += clock() - t0
        steps.append(RemovalStep(
            c, batch is None, bool(reseeded), client_s, server_s, bool(recluster), loss() if evaluate else None,
            share_sum_s=server.share_sum_s, decode_s=server.decode_s, cluster_s=server.cluster_s, codec_s=codec_s,
        ))
        if s - 1 in retrain_at:
            gc.collect()
            retrain_times.append(_complete_retraining(parts, active, removed, cfg, key, clock))
        if progress is not None:
            progress(s)
    if not requests:
        retrain_times.append(_complete_retraining(parts, active, removed, cfg, key, clock))
    assert server.centroids is not None
    return Replay(max(client_times), train_server_s, float(np.median(retrain_times)), tuple(steps),
                  server.centroids, initial, _mask_time(cfg, len(parts), clock), float(np.median(powers_times)))


def _mask_time(cfg: MUFCConfig, n_clients: int, clock: Callable[[], float]) -> float:
    """Median time of one client's pairwise-mask expansion for one round (seed values do not
    change the work)."""
    if n_clients < 2:
        return 0.0
    seeds = {m: bytes([m % 256]) * 32 for m in range(1, n_clients)}
    times = [_timed(lambda r=r: scma.pairwise_masks(0, seeds, cfg.prime, cfg.n_syndromes, r), clock)[1]
             for r in range(3)]
    return float(np.median(times))


def _complete_retraining(
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
    active: Sequence[int],
    removed: Sequence[set[int]],
    cfg: MUFCConfig,
    key: jax.Array,
    clock: Callable[[], float],
) -> float:
    """Time of retraining from scratch on the remaining data: slowest client + server."""
    slowest, syndromes = 0.0, []
    for c in active:
        x, ids = parts[c]
        keep = np.array([int(i) not in removed[c] for i in ids.tolist()], dtype=bool)

        def train(c=c, x=x[keep], ids=ids[keep]):
            local = LocalSeeding(x, ids, cfg.k_client, jax.random.fold_in(key, c + 1),
                                 lloyd_iterations=cfg.lloyd_iterations)
            return scma.rs_syndromes(local.counts(cfg.grid), cfg.prime, cfg.n_syndromes)

        syn, seconds = _timed(train, clock)
        slowest = max(slowest, seconds)
        syndromes.append(scma.pack_elements(syn, cfg.prime))
    n_left = sum(int(np.sum(~np.isin(ids, list(removed[c])))) for c, (_, ids) in enumerate(parts) if c in active)
    server = _Server(cfg, jax.random.fold_in(key, 0), n_left, clock)
    _, server_s = _timed(lambda: server.step(syndromes, 0, force=True), clock)
    return slowest + server_s
