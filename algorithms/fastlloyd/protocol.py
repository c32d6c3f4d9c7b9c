"""FastLloyd: federated differentially private k-means with masked secure aggregation.

Theory of operation (Diaa, Humphries, Kerschbaum, "FastLloyd", Sec. 5, Alg. 1 and Fig. 1;
spec fastlloyd.md sections 2.4-2.10).

Roles: one :class:`FastLloydServer` (semi-honest: it aggregates and adds the DP noise, and sees
only masked values) and M :class:`FastLloydClient` s (each holds a horizontal slice of the data).

A machine is built in one of two ways:

* from the run's :class:`~fedproto.algorithms.fastlloyd.config.FastLloydOptions` (``options=``):
  each client holds only its own *raw* points, and the server holds nothing. The parties first
  agree the federation's public quantities (phase ``setup.data``, round 0, metered as setup):
  each client sends its count n_i and per-feature minimum and maximum (:class:`DataSummary`);
  the server checks that every client has the same number of features d, and broadcasts the
  total N and the element-wise minimum of the minima and maximum of the maxima
  (:class:`FederationSummary`). That extent is the pooled data's, so each client's
  ``normalize(x_i, extent=...)`` gives exactly its rows of the pooled data normalised at once
  (:func:`fedproto.data.normalize`, FastLloyd Sec. 6.1). Every party then derives the same
  :class:`~fedproto.algorithms.fastlloyd.config.FastLloydConfig` from the options at N and d
  (``options.config(N, d)``: the default delta ``1/(N ln N)``, the iteration heuristic, the
  ring) and, with SecAgg+, the same SecAgg+ parameters (:func:`secagg_plus_config`). This is
  how ``fedproto run fastlloyd`` builds every run, in one process or one per party.
* from a ready :class:`~fedproto.algorithms.fastlloyd.config.FastLloydConfig` (``config=``):
  the public parameters are known in advance and each client's points are already normalised
  to ``[-B, B]^d``; there is no ``setup.data`` phase (the benchmarks and examples build runs
  this way).

Setup of the mask seed (phases ``setup.keys`` to ``setup.relay``, round 0, metered as setup):
the clients need a mask seed the server never learns. Every client sends its X25519 public key (:class:`PublicKey`); the server sends all
keys to client 0 (:class:`PublicKeys`); client 0 draws the seed and seals it for each other client
under a ChaCha20-Poly1305 key derived (HKDF) from their X25519 shared secret
(:class:`SealedSeeds`); the server relays each sealed seed (:class:`SealedSeed`). A semi-honest
server relays faithfully; it cannot open the seeds.

One Lloyd iteration t (round ``t``, 0-based), state-triggered:

1. client i (phase ``update``): assign each local point to its nearest public centroid, keeping
   it only if the distance is below the iteration's radius ``eta_t`` (Alg. 1 lines 6-9); compute
   per-cluster relative sums ``R_ij = sum (x - mu_j)`` (or absolute sums for the baselines) and
   counts (lines 11-13); encode in fixed point (q = 16, round-half-up) in Z_{2^w}; add the mask
   r_i; send :class:`MaskedUpdate`.
2. server (phase ``aggregate``), once every client's update is in: sum them mod 2^w, add
   quantised noise ``round(2^q * N(0, std_t^2))`` per entry (Gaussian for FastLloyd/GLloyd,
   Laplace for SuLloyd, none for Lloyd), broadcast :class:`NoisyAggregate`, move to round t+1.
3. client i: subtract the total mask, decode, divide, shift by the previous centroid, clip the move
   to ``eta_t`` and fold into the domain (lines 18-20); the result is the next public centroids.

After T iterations every client holds the same centroids; the server holds none (it never sees
an unmasked value). Messages per iteration: M uploads and M downloads of ``k (d+1)`` ring
elements each, so the payload is ``2 M k (d+1) w/8`` bytes plus one envelope per frame.

Dropout: FastLloyd has no dropout recovery (spec 1.2): the masks of all M clients are needed. A
client that stays silent past the phase deadline makes the server fail with
:class:`~fedproto.errors.InsufficientParticipants` naming it; a silent server makes each client
fail naming the server.

With SecAgg+ (``secagg_plus=`` a :class:`~fedproto.algorithms.secagg_plus.SecAggPlusConfig`,
``fedproto run fastlloyd --secagg plus``) each iteration is one SecAgg+ aggregation
(:mod:`fedproto.algorithms.secagg_plus.engine`: phases ``masked-input`` and ``unmask``, after the
keys are agreed once in the first iteration's ``advertise-keys``) of the same masked updates, and
clients may drop at any stage of any iteration after setup:

* the update a client sends in ``masked-input`` is its fixed-point statistics plus its shared-seed
  mask ``r_i`` (as above) plus the SecAgg+ masks; SecAgg+ gives the server the sum over the
  survivors ``S`` of ``enc_i + r_i``, still hidden by ``sum_{i in S} r_i``, which only clients can
  compute. The server adds its noise as above and sends :class:`SurvivorAggregate` (phase
  ``aggregate``) naming the clients outside ``S`` (``O(D)`` indices for ``D`` dropped, none
  without dropouts); each client subtracts ``sum_{i in S} r_i`` and decodes. So the
  server still never sees an unmasked value, and a client colluding with it (who knows every
  ``r_i``) still sees only sums: an individual update stays hidden by the SecAgg+ masks.
* a client dropped in iteration t takes no part in later iterations; the next centroids come from
  the survivors' statistics with the noise of the full budget.
* privacy of the survivors' data: each iteration's release is the same Gaussian (or Laplace)
  mechanism on the data of the clients in ``S``, with the sensitivity and noise of the paper's
  analysis (a point's change moves one client's statistics by the same bounded amount), and a
  point enters at most T releases, so the composed (epsilon, delta) is the paper's. Dropout is
  taken to be independent of the data (a crash, a lost link).
* setup (``setup.data`` and the shared seed) still needs every client: a dropout before the first
  iteration ends the run with the error above.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from fedproto.algorithms.fastlloyd.client import ClientState, FastLloydClient, FastLloydResult
from fedproto.algorithms.fastlloyd.config import FastLloydOptions
from fedproto.algorithms.fastlloyd.server import FastLloydServer, ServerState, ServerSummary
from fedproto.algorithms.fastlloyd.shared import check_secagg_plus, initial_centroids, secagg_plus_config
from fedproto.star import StarParties

__all__ = [
    "ClientState",
    "FastLloydClient",
    "FastLloydParties",
    "FastLloydResult",
    "FastLloydServer",
    "ServerState",
    "ServerSummary",
    "check_secagg_plus",
    "initial_centroids",
    "secagg_plus_config",
]


class FastLloydParties(StarParties):
    """The parties of a FastLloyd run built from the public options: ``server`` first, then the
    clients, each holding only its own raw rows (``own_data``; ``setup.data`` agrees N and the
    extent, see the module docstring).

    ``make_machine(party, rows)`` builds the server (``rows`` ``None``) or a client from its raw
    rows ``[n_i, d]`` float64; :meth:`~fedproto.star.StarParties.machine_factory` turns
    ``{party: rows}`` into a plan's ``make_machine``. Each client draws fresh entropy for its keys
    (``os.urandom(32)``) when it is built.

    Args:
        options: the run's public options.
        clients: the clients' party names, in client order.
        session: the run's session id.
        noise_seed: the seed of the server's noise key.

    Raises:
        ValueError: no clients, repeated names or ``server`` among the clients; building a
            client without its rows, or anything :class:`FastLloydClient` refuses.
    """

    own_data = True

    def __init__(self, options: FastLloydOptions, *, clients: Sequence[str], session: int, noise_seed: int) -> None:
        super().__init__(clients=clients)
        self.options, self.session, self.noise_seed = options, session, noise_seed

    def hub_machine(self) -> FastLloydServer:
        return FastLloydServer(
            self.hub, options=self.options, clients=self.clients, noise_seed=self.noise_seed, session=self.session
        )

    def client_machine(self, index: int, party: str, data: np.ndarray) -> FastLloydClient:
        return FastLloydClient(
            party,
            options=self.options,
            server=self.hub,
            clients=self.clients,
            points=data,
            entropy=os.urandom(32),
            session=self.session,
        )
