"""Federated Q-k-means with exact deletion: a coordinator and parties that keep their points.

Theory of operation (spec deletion-kmeans.md 2.3, "Q-k-means as a protocol", a design for this
project: the paper describes no protocol; Ginart et al. 2019, Alg. 4/5/7).

Roles. The data are split horizontally: each :class:`QKMeansParty` holds its points (with stable
ids) and never sends them, except the point it deletes and the points k-means++ chooses as
seeds (which become centroids every party sees). The :class:`QKMeansCoordinator` holds no data:
it holds the public table point id -> party (ids, not values; used to check removal requests),
the run's key (public to all parties), and the model with its deletion metadata (spec 1.4).

Training (from scratch: at the start, and after any uncertified deletion). Rounds are numbered
on, one per step:

* k seeding rounds, s = 0..k-1 (keyed k-means++, spec 3.3). Phase ``seed``: the coordinator
  broadcasts :class:`SeedStep` (with the centre chosen at step s - 1); each party folds it into
  its distances ``u_j`` and replies :class:`SeedScore`, the largest ``log u_j + g_j`` over its
  points, ``g_j = Gumbel(fold_in(fold_in(K_seed, s), id_j))``, with that point's id. Phase
  ``seed-point``: the coordinator sends :class:`SeedPick` to the party with the largest score
  (ties to the lowest id) and that party replies :class:`SeedPoint` (d floats).
  *Why this is exact*: the Gumbel-max draw over the pooled data is ``argmax_j (log u_j + g_j)``;
  every term depends only on point j, its id and the centres so far, and ``max`` is exact and
  associative, so the maximum of the parties' maxima *is* the centralised draw, bit for bit, for
  any split of the data (`_variant_kernels.seeding_scores`). The spec's scheme (each party
  reports its D^2 mass, the coordinator picks a party in proportion, the party samples locally)
  needs the same two exchanges but draws with the coordinator's own randomness and floating-point
  mass sums, so it is exact only in distribution and depends on the split; keyed Gumbel-max is
  pathwise equal to the centralised coupled seeding, which is what makes "federated =
  centralised" and "deletion = retraining" deterministic tests.
* Lloyd rounds j = 0, 1, ..., one per iteration, phase ``lloyd``: the coordinator broadcasts
  :class:`IterationCentroids` ``chat_j`` (the un-quantised seeds for j = 0); each party assigns
  its points and replies :class:`ClusterStatistics` (sums ``S``, counts ``m`` and its loss). The
  coordinator sums them in roster order (so the result does not depend on arrival order), takes
  the stop decision for iteration j (``L_j < L_{j-1}``, strict, against the seeding loss at
  j = 1), and if it continues applies the balance correction with ``M = gamma n / k`` and
  quantises with ``theta_{j+1}`` (`_variant_kernels.quantized_step`): the centroid update is
  linear in the statistics, so this is the centralised iteration. The phases come from the
  public key (``fold_in(K, 2)``), so they need not travel.
* The round that ends training also carries phase ``model``: :class:`ModelUpdate` to every party.

Deletion. After model version v the party owning the stream's request v sends
:class:`PointRemoval` (id and coordinates; phase ``request``) and drops the point. The
coordinator runs the centralised decision (`qkmeans.removal_decision`): a change of the
heuristic eps or a seed retrains; otherwise the exact replay of spec 1.5 on the stored metadata.
Certified: the metadata lose p, the model is unchanged and goes out as :class:`ModelUpdate` in
the same round (2 messages per party at most; 1 round). Not certified: the federated training
above restarts from scratch on the remaining data with the **same key** (k + tau_end + 1
rounds). So after any deletion stream the model *equals* a from-scratch federated run on the
remaining data with the same key, which equals the centralised `qkmeans.train_qkmeans` (same
seeds, phases, lattice indices and stop decisions). The stored sums and losses are added party
by party, so they differ from the centralised ones in the last bits; the certifier's margins
(1e-9 lattice units, 1e-10 relative loss) absorb that, and the model is compared exactly.

Privacy (what is revealed, not a guarantee): the coordinator sees per-party cluster sums,
counts and losses in every round, the seeds, and the deleted point (its replay must subtract p
from the summed statistics it holds in the clear; spec 2.3 notes this leak). Losing candidates
of a seeding step are never revealed, only their scores and ids.

Cost per round, payload bytes excluding framing (P parties, k clusters, d dimensions): seeding
step s: ``P * 8d * [s > 0]`` down, P scores up, ``8d`` for the chosen point; Lloyd round:
``P * 8kd`` down and ``P * 8(kd + k)`` up; model: ``P * 8kd``; certified deletion: ``8d`` up plus
the model. Each message adds a constant envelope (tag, round, phase, field headers).

Each party's own data: built by `protocol.LocalQKMeansParties` with ``federated=True`` (what
``fedproto run`` and ``fedproto party`` use), the coordinator is given neither d nor the id
table, and each party only its raw points: the run opens with the setup phase ``setup.data``
(`local_data`), after which the coordinator knows d, n and the table, each party its ids and
scaled points, and each party draws its own removal requests from the stream's public terms.
`protocol.QKMeansParties` (``federated=True``) builds the same protocol from pooled data with
given ids, without that phase.

Dropout and errors: no quorum, every party is needed; a silent party makes the coordinator fail
with :class:`~fedproto.errors.InsufficientParticipants` naming it. Messages out of order, for the
wrong step or iteration, from a party that does not own the point, for a deleted or unknown id,
or with statistics that do not add up to the table's n are a
:class:`~fedproto.errors.RemoteProtocolError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedproto.algorithms.deletion import _kernels, _variant_kernels, messages
from fedproto.algorithms.deletion._base import FollowsRounds, SetupHub, StreamClient, remote_error
from fedproto.algorithms.deletion._store import PointStore
from fedproto.algorithms.deletion.local_data import SETUP_PHASE, DataCollector, LocalPoints, StreamTerms
from fedproto.algorithms.deletion.qkmeans import (
    PHASE_STREAM,
    SEEDING_STREAM,
    QKMeansConfig,
    QKMeansModel,
    removal_decision,
)
from fedproto.machine import machine_states
from fedproto.messages import Outgoing
from fedproto.star import check_clients

__all__ = [
    "COORDINATOR",
    "FederatedPartyResult",
    "FederatedQKMeansResult",
    "QKMeansCoordinator",
    "QKMeansParty",
    "training_payload_bytes",
]

COORDINATOR = "coordinator"


def training_payload_bytes(n_parties: int, k: int, d: int, executed: int) -> dict[str, int]:
    """Analytic payload bytes (array bytes, without framing) of one federated training.

    Args:
        n_parties: P; k: clusters; d: dimension; executed: iterations executed (tau_end).

    Returns:
        ``{"seeding": P 8d (k - 1) + 8dk, "lloyd per round": P 8(2kd + k), "lloyd":
        (executed + 1) times that, "model": P 8kd}``.
    """
    per_round = n_parties * 8 * (2 * k * d + k)
    return {
        "seeding": n_parties * 8 * d * (k - 1) + 8 * d * k,
        "lloyd per round": per_round,
        "lloyd": (executed + 1) * per_round,
        "model": n_parties * 8 * k * d,
    }


@dataclasses.dataclass(frozen=True)
class FederatedQKMeansResult:
    """The coordinator's output.

    Attributes:
        centroids: the final model ``[k, d]``.
        model: the final `QKMeansModel` with its deletion metadata.
        history: the model after training and after each deletion.
        reasons: per deletion, ``"certified"`` or why it retrained.
        certified, retrained: counts.
        trainings: federated trainings run (1 + retrains).
    """

    centroids: np.ndarray
    model: QKMeansModel
    history: tuple[np.ndarray, ...]
    reasons: tuple[str, ...]
    certified: int
    retrained: int
    trainings: int


@dataclasses.dataclass(frozen=True)
class FederatedPartyResult:
    """A party's output: the final model, per deletion whether it retrained, points left and the
    ids this party deleted."""

    centroids: np.ndarray
    version: int
    retrained: tuple[bool, ...]
    points: int
    removed: tuple[int, ...]


CoordinatorState = machine_states("CoordinatorState", "SETUP", "SEED", "PICK", "LLOYD", "SERVING")


PartyState = machine_states("PartyState", "SETUP", "WAITING", "SEEDING", "LLOYD")


class QKMeansCoordinator(SetupHub):
    """The coordinator of federated Q-k-means: seeding, Lloyd aggregation, deletion decisions.

    Args:
        party: its name; parties: every data-holding party, in roster order.
        config: hyper-parameters; key: the run's `jax.random` key (the same at every party).
        d: dimension of the data (public).
        owners: point id -> the party holding it (every id; ids, not values).
        n_deletions: requests in the stream (the run ends after the last).
        setup: instead of ``d`` and ``owners``: the parties hold only their own data, and the
            coordinator first runs the setup phase ``setup.data`` with them (state ``SETUP``;
            `local_data`), which gives d, n and the id table; training then starts.

    Raises:
        ValueError: bad roster, an owner outside it, or a stream that would leave fewer than k
            points.
    """

    State = CoordinatorState
    INITIAL_STATE = CoordinatorState.SEED
    TRANSITIONS = {
        (CoordinatorState.SETUP, messages.DataSummary): ("_on_summary", CoordinatorState.SETUP),
        (CoordinatorState.SEED, messages.SeedScore): ("_on_score", CoordinatorState.SEED),
        (CoordinatorState.PICK, messages.SeedPoint): ("_on_point", CoordinatorState.PICK),
        (CoordinatorState.LLOYD, messages.ClusterStatistics): ("_on_statistics", CoordinatorState.LLOYD),
        (CoordinatorState.SERVING, messages.PointRemoval): ("_on_removal", CoordinatorState.SERVING),
    }

    def __init__(
        self,
        party: str,
        *,
        parties: Sequence[str],
        config: QKMeansConfig,
        key: jax.Array,
        d: int | None = None,
        owners: Mapping[int, str] | None = None,
        n_deletions: int,
        setup: DataCollector | None = None,
    ) -> None:
        super().__init__(party)
        parties = check_clients(party, parties, noun="parties")
        if setup is not None and (d is not None or owners is not None or setup.parties != parties):
            raise ValueError("a coordinator with the setup phase learns d and the id table there, with the parties")
        if setup is None and (d is None or owners is None):
            raise ValueError("give the coordinator d and owners, or the setup phase")
        if n_deletions < 0:
            raise ValueError("n_deletions must be non-negative")
        self.parties, self.config, self.n_deletions = parties, config, n_deletions
        self._key = key
        self._seed_key = jax.random.fold_in(key, SEEDING_STREAM)
        self._setup = setup
        if setup is not None:
            self._state = CoordinatorState.SETUP
        else:
            self._take_data(d, owners)  # type: ignore[arg-type]
        self._deleted: set[int] = set()
        self._model: QKMeansModel | None = None
        self._history: list[np.ndarray] = []
        self._reasons: list[str] = []
        self._certified = self._retrained = 0
        self._trainings = 0
        self._retraining = False
        self._replies: dict[str, object] = {}

    def _take_data(self, d: int, owners: Mapping[int, str]) -> None:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError("d must be a positive integer")
        self.owners = {int(i): str(p) for i, p in owners.items()}
        strangers = set(self.owners.values()) - set(self.parties)
        if strangers:
            raise ValueError(f"owners name parties outside the roster: {sorted(strangers)}")
        k = self.config.k
        if len(self.owners) - self.n_deletions < k:
            raise ValueError(f"{self.n_deletions} deletions of {len(self.owners)} points would leave fewer than k = {k}")
        self.d = d
        self._thetas = np.asarray(
            _kernels.random_phases(jax.random.fold_in(self._key, PHASE_STREAM), self.config.iterations, d)
        )
        self._n = len(self.owners)

    @property
    def phase(self) -> str:
        return {
            CoordinatorState.SETUP: SETUP_PHASE,
            CoordinatorState.SEED: "seed",
            CoordinatorState.PICK: "seed-point",
            CoordinatorState.LLOYD: "lloyd",
            CoordinatorState.SERVING: "request",
        }.get(self._state, "model")

    def pending(self) -> Sequence[str]:
        if self._state is CoordinatorState.SETUP:
            assert self._setup is not None
            return self._setup.pending()
        if self._state in (CoordinatorState.SEED, CoordinatorState.LLOYD):
            return [p for p in self.parties if p not in self._replies]
        if self._state is CoordinatorState.PICK:
            return [self._winner[0]]
        if self._state is CoordinatorState.SERVING:
            return list(self.parties)
        return []

    # -- training ---------------------------------------------------------------------------------

    def _start(self) -> list[Outgoing]:
        if self._setup is not None:
            return []
        return self._begin_training()

    def _begin_training(self) -> list[Outgoing]:
        k, t_max, d = self.config.k, self.config.iterations, self.d
        self._trainings += 1
        self._seed_ids: list[int] = []
        self._seeds: list[np.ndarray] = []
        self._step = 0
        self._iteration = 0
        self._indices = np.zeros((t_max, k, d), dtype=np.int64)
        self._sums = np.zeros((t_max, k, d))
        self._counts = np.zeros((t_max, k))
        self._losses = np.zeros(t_max + 1)
        self._accepted = np.zeros(t_max, dtype=bool)
        self._replies = {}
        self.move_to(CoordinatorState.SEED)
        return [self.broadcast(self.parties, messages.SeedStep(step=0, centre=np.zeros((0, d))), phase="seed")]

    def _check_party(self, sender: str) -> None:
        if sender not in self.parties:
            raise remote_error(f"{sender} is not a party of this run", sender, self)
        if sender in self._replies:
            raise remote_error(f"second reply from {sender} in this round", sender, self)

    def _on_score(self, sender: str, message: messages.SeedScore) -> list[Outgoing]:
        self._check_party(sender)
        if message.step != self._step:
            raise remote_error(f"{sender} scored step {message.step}, the current step is {self._step}", sender, self)
        if message.score > -np.inf and (
            self.owners.get(message.point_id) != sender or message.point_id in self._deleted
        ):
            raise remote_error(f"{sender} proposed point {message.point_id}, which it does not hold", sender, self)
        self._replies[sender] = message
        return []

    def _on_point(self, sender: str, message: messages.SeedPoint) -> list[Outgoing]:
        party, point_id = self._winner
        if sender != party or message.step != self._step or message.point_id != point_id:
            raise remote_error(f"{sender} sent point {message.point_id} of step {message.step}; expected point "
                          f"{point_id} of step {self._step} from {party}", sender, self)
        if message.point.shape != (self.d,):
            raise remote_error(f"{sender} sent a point of dimension {message.point.shape[0]}, expected {self.d}",
                          sender, self)
        self._replies[sender] = message
        return []

    def _on_statistics(self, sender: str, message: messages.ClusterStatistics) -> list[Outgoing]:
        self._check_party(sender)
        if message.iteration != self._iteration:
            raise remote_error(f"{sender} sent statistics of round {message.iteration}, expected {self._iteration}",
                          sender, self)
        if message.sums.shape != (self.config.k, self.d):
            raise remote_error(f"{sender} sent sums of shape {message.sums.shape}, expected {(self.config.k, self.d)}",
                          sender, self)
        self._replies[sender] = message
        return []

    def _advance(self) -> list[Outgoing]:
        state = self._state
        if state is CoordinatorState.SETUP and self._setup is not None and self._setup.complete:
            agreed = self._setup.agree(self)
            self._take_data(agreed.d, agreed.owners())
            agreements = [self.send(p, m, phase=SETUP_PHASE) for p, m in agreed.agreements().items()]
            return agreements + self._begin_training()
        if state is CoordinatorState.SEED and len(self._replies) == len(self.parties):
            return self._choose_seed()
        if state is CoordinatorState.PICK and self._replies:
            return self._add_seed()
        if state is CoordinatorState.LLOYD and len(self._replies) == len(self.parties):
            return self._aggregate()
        return []

    def _choose_seed(self) -> list[Outgoing]:
        scores = [(p, self._replies[p]) for p in self.parties]
        live = [(m.score, -m.point_id, p) for p, m in scores if m.score > -np.inf]
        if not live:
            k = self.config.k
            raise ValueError(f"fewer than k = {k} distinct points: k-means++ cannot place {k} seeds")
        _, neg_id, party = max(live)  # Gumbel-max; equal scores go to the lowest id, as a pooled argmax
        self._winner = (party, -neg_id)
        self._replies = {}
        self.move_to(CoordinatorState.PICK)
        return [self.send(party, messages.SeedPick(step=self._step, point_id=-neg_id), phase="seed-point")]

    def _add_seed(self) -> list[Outgoing]:
        message = self._replies.pop(self._winner[0])
        assert isinstance(message, messages.SeedPoint)
        self._seed_ids.append(message.point_id)
        self._seeds.append(np.array(message.point, dtype=np.float64))
        self._replies = {}
        self._step += 1
        self.round_idx += 1
        if self._step < self.config.k:
            self.move_to(CoordinatorState.SEED)
            step = messages.SeedStep(step=self._step, centre=self._seeds[-1][None, :])
            return [self.broadcast(self.parties, step, phase="seed")]
        self._prev = np.stack(self._seeds)
        self.move_to(CoordinatorState.LLOYD)
        first = messages.IterationCentroids(iteration=0, centroids=self._prev)
        return [self.broadcast(self.parties, first, phase="lloyd")]

    def _aggregate(self) -> list[Outgoing]:
        cfg, k = self.config, self.config.k
        j = self._iteration
        sums, counts, loss = np.zeros((k, self.d)), np.zeros(k), 0.0
        for p in self.parties:  # roster order: the result does not depend on arrival order
            stats = self._replies[p]
            assert isinstance(stats, messages.ClusterStatistics)
            sums = sums + stats.sums
            counts = counts + stats.counts.astype(np.float64)
            loss = loss + float(stats.loss)
        self._replies = {}
        if j == 0:
            if int(counts.sum()) != self._n:
                raise remote_error(f"the parties report {int(counts.sum())} points, the table lists {self._n}",
                              self.parties[0], self)
            self._eps = cfg.resolve_eps(self._n, self.d)
            self._mass = cfg.gamma * self._n / k
            self._losses[0] = loss
        else:
            self._losses[j] = loss
            accepted = bool(loss < self._losses[j - 1])  # strict: Alg. 4's early stop
            self._accepted[j - 1] = accepted
            if not accepted:
                return self._finish_training(executed=j)
            self._prev = self._next
            if j == cfg.iterations:
                return self._finish_training(executed=j)
        self._sums[j], self._counts[j] = sums, counts
        indices, chat = _variant_kernels.quantized_step(
            jnp.asarray(sums), jnp.asarray(counts), jnp.asarray(self._prev), jnp.asarray(self._thetas[j]),
            self._eps, self._mass,
        )
        self._indices[j] = np.asarray(indices)
        self._next = np.asarray(chat)
        self._iteration = j + 1
        self.round_idx += 1
        message = messages.IterationCentroids(iteration=j + 1, centroids=self._next)
        return [self.broadcast(self.parties, message, phase="lloyd")]

    def _finish_training(self, executed: int) -> list[Outgoing]:
        cfg = self.config
        self._model = QKMeansModel(
            k=cfg.k, n=self._n, d=self.d, eps=self._eps, gamma=cfg.gamma, mass_threshold=self._mass,
            seed_ids=np.asarray(self._seed_ids, dtype=np.int64), seed_centroids=np.stack(self._seeds),
            thetas=self._thetas, indices=self._indices, sums=self._sums, counts=self._counts,
            losses=self._losses, accepted=self._accepted, executed=executed,
        )
        retrained, self._retraining = self._retraining, False
        return self._publish(retrained)

    def _publish(self, retrained: bool) -> list[Outgoing]:
        assert self._model is not None
        centroids = self._model.centroids
        self._history.append(centroids)
        version = len(self._history) - 1
        model = messages.ModelUpdate(version=version, retrained=retrained, centroids=centroids)
        out = [self.broadcast(self.parties, model, phase="model")]
        if version == self.n_deletions:
            self._finish(FederatedQKMeansResult(
                centroids, self._model, tuple(self._history), tuple(self._reasons), self._certified,
                self._retrained, self._trainings,
            ))
        else:
            self.move_to(CoordinatorState.SERVING)
            self.round_idx += 1
        return out

    # -- deletion ---------------------------------------------------------------------------------

    def _on_removal(self, sender: str, message: messages.PointRemoval) -> list[Outgoing]:
        point_id, model = message.point_id, self._model
        assert model is not None
        owner = self.owners.get(point_id)
        if owner is None:
            raise remote_error(f"{sender} asked to delete point {point_id}, which is not in the data set", sender, self)
        if owner != sender:
            raise remote_error(f"{sender} asked to delete point {point_id}, which {owner} owns", sender, self)
        if point_id in self._deleted:
            raise remote_error(f"{sender} asked to delete point {point_id}, which was already deleted", sender, self)
        if message.point.shape != (self.d,):
            raise remote_error(f"{sender} sent a point of dimension {message.point.shape[0]}, expected {self.d}",
                          sender, self)
        seeds = model.seed_ids.tolist()
        if point_id in seeds and not np.array_equal(message.point, model.seed_centroids[seeds.index(point_id)]):
            raise remote_error(f"{sender} sent coordinates of seed {point_id} that differ from the seed's", sender, self)
        if self._n - 1 < self.config.k:
            raise remote_error(f"deleting point {point_id} would leave fewer than k = {self.config.k} points",
                          sender, self)
        reason, updated = removal_decision(model, message.point, point_id, self.config)
        self._deleted.add(point_id)
        self._n -= 1
        self._reasons.append(reason)
        if updated is not None:
            self._model = updated
            self._certified += 1
            return self._publish(False)
        self._retrained += 1
        self._retraining = True
        self.round_idx += 1
        return self._begin_training()


class QKMeansParty(FollowsRounds, StreamClient):
    """A data-holding party of federated Q-k-means.

    Args:
        party: its name; coordinator: the coordinator's name.
        points: ``[n_i, d]`` float64 (may be empty); ids: their stable ids.
        config: hyper-parameters (k, T); key: the run's `jax.random` key.
        requests: position in the global stream -> id of one of this party's points.
        n_deletions: length of the global stream.
        patience: phase deadlines to wait without input.
        local: instead of ``points``, ``ids`` and ``requests``, the party's raw points: it first
            takes part in the setup phase ``setup.data`` (state ``SETUP``; `local_data`), which
            gives their scaling and ids, and draws its requests from ``stream``.
        stream: with ``local``: the terms of the deletion stream (``removals == n_deletions``).

    Raises:
        ValueError: bad points or ids, a request for a point the party does not hold, a
            position outside the stream, or both or neither of ``points`` and ``local``.
    """

    ROLE, HUB_ROLE = "party", "coordinator"
    State = PartyState
    INITIAL_STATE = PartyState.WAITING
    SERVING_STATES = (PartyState.WAITING, PartyState.SEEDING, PartyState.LLOYD)
    TRANSITIONS = {
        **StreamClient.stream_transitions(PartyState),
        (PartyState.WAITING, messages.SeedStep): ("_on_seed_step", PartyState.SEEDING),
        (PartyState.SEEDING, messages.SeedStep): ("_on_seed_step", PartyState.SEEDING),
        (PartyState.SEEDING, messages.SeedPick): ("_on_pick", PartyState.SEEDING),
        (PartyState.SEEDING, messages.IterationCentroids): ("_on_centroids", PartyState.LLOYD),
        (PartyState.LLOYD, messages.IterationCentroids): ("_on_centroids", PartyState.LLOYD),
        (PartyState.LLOYD, messages.ModelUpdate): ("_on_model", PartyState.WAITING),
    }

    def __init__(
        self,
        party: str,
        *,
        coordinator: str,
        points: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        config: QKMeansConfig,
        key: jax.Array,
        requests: Mapping[int, int] | None = None,
        n_deletions: int,
        patience: int = 1,
        local: LocalPoints | None = None,
        stream: StreamTerms | None = None,
    ) -> None:
        super().__init__(party, patience=patience)
        self.coordinator = self.hub = coordinator
        self.config, self.n_deletions = config, n_deletions
        self._hold(points, ids, requests, local, stream)
        self._seed_key = jax.random.fold_in(key, SEEDING_STREAM)
        self._removed: list[int] = []

    def _take(self, points: np.ndarray, ids: np.ndarray, requests: Mapping[int, int]) -> None:
        self._store = PointStore(points, ids)
        self._take_requests(self._store.ids, requests)

    @property
    def phase(self) -> str:
        return {PartyState.SETUP: SETUP_PHASE, PartyState.SEEDING: "seed", PartyState.LLOYD: "lloyd"}.get(
            self._state, "request"
        )

    def pending(self) -> Sequence[str]:
        return [self.coordinator] if self._state in (PartyState.SETUP, *self.SERVING_STATES) else []

    def _ready(self) -> list[Outgoing]:
        return []  # the coordinator starts training

    def _on_seed_step(self, sender: str, message: messages.SeedStep) -> list[Outgoing]:
        self._check_hub(sender)
        d = self._store.d
        if message.centre.shape[1] != d:
            raise remote_error(f"centre of dimension {message.centre.shape[1]}, this party's points have {d}", sender, self)
        if self._state is PartyState.WAITING:
            if message.step != 0:
                raise remote_error(f"training must start at step 0, got step {message.step}", sender, self)
            self._x, self._ids, self._valid = _kernels.pad_rows(self._store.x, self._store.ids)
            self._mind = jnp.where(self._valid, jnp.inf, 0.0)
        elif message.step != self._step + 1:
            raise remote_error(f"seeding step {message.step} after step {self._step}", sender, self)
        self._step = message.step
        has_centre = message.step > 0
        centre = message.centre[0] if has_centre else np.zeros(d)
        self._mind, score, row = _variant_kernels.seeding_scores(
            self._seed_key, self._x, self._ids, self._valid, self._mind, jnp.asarray(centre), has_centre,
            message.step,
        )
        score, row = float(score), int(row)
        self._candidate = (int(self._store.ids[row]), row) if score > -np.inf else None
        point_id = self._candidate[0] if self._candidate else 0
        return [self.send(self.coordinator, messages.SeedScore(step=message.step, point_id=point_id, score=score),
                          phase="seed")]

    def _on_pick(self, sender: str, message: messages.SeedPick) -> list[Outgoing]:
        self._check_hub(sender)
        if message.step != self._step or self._candidate is None or message.point_id != self._candidate[0]:
            raise remote_error(f"picked point {message.point_id} at step {message.step}, which {self.party} did not "
                          "propose", sender, self)
        point = self._store.x[self._candidate[1]]
        reply = messages.SeedPoint(step=message.step, point_id=message.point_id, point=point)
        return [self.send(self.coordinator, reply, phase="seed-point")]

    def _on_centroids(self, sender: str, message: messages.IterationCentroids) -> list[Outgoing]:
        self._check_hub(sender)
        k, d = self.config.k, self._store.d
        if self._state is PartyState.SEEDING:
            if message.iteration != 0 or self._step != k - 1:
                raise remote_error(f"Lloyd round {message.iteration} before seeding finished", sender, self)
        elif message.iteration != self._iteration + 1:
            raise remote_error(f"Lloyd round {message.iteration} after round {self._iteration}", sender, self)
        if message.centroids.shape != (k, d):
            raise remote_error(f"centroids of shape {message.centroids.shape}, expected {(k, d)}", sender, self)
        self._iteration = message.iteration
        sums, counts, loss = _variant_kernels.local_statistics(
            self._x, self._valid, jnp.asarray(message.centroids), k
        )
        stats = messages.ClusterStatistics(
            iteration=message.iteration, loss=float(loss), sums=np.asarray(sums),
            counts=np.asarray(counts).astype(np.int64),
        )
        return [self.send(self.coordinator, stats, phase="lloyd")]

    def _final(self, message: messages.ModelUpdate) -> FederatedPartyResult:
        return FederatedPartyResult(
            message.centroids, message.version, tuple(self._retrained), self._store.n, tuple(self._removed)
        )

    def _request(self, point_id: int) -> Outgoing:
        row = self._store.row_of(point_id)  # held: the stream was checked at construction
        point = self._store.x[row].copy()
        self._store.remove(row)
        self._removed.append(point_id)
        return self.send(self.coordinator, messages.PointRemoval(point_id=point_id, point=point), phase="request")
