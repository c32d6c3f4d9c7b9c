"""MUFC as protocol machines: one-shot secure federated clustering and federated unlearning.

Theory of operation (Pan et al., ICLR 2023, Algorithms 1, 2 and 4; spec mufc.md 1.10, 2, 3.5):

Roles: one :class:`MUFCServer` and ``L`` :class:`MUFCClient` machines (``client-0`` ...). All
public parameters (K, the grid, the prime p, T = 2KL, the modes) are in :class:`MUFCConfig`,
which every party is built with.

Round 0, phase ``setup.data`` (only for machines built with ``setup=``, a
:class:`~fedproto.algorithms.mufc.setup.DataSetup`: each client holds only its raw rows, the
server no data; :mod:`fedproto.algorithms.mufc.setup`): each client sends its count and per-feature
extent (:class:`DataSummary`); the server checks that the clients agree on d, combines them and
sends every client every count and the federation's extent (:class:`FederationSummary`). Every
party then computes the same :class:`MUFCConfig` (n, the grid, p, T), each client scales its rows
into the unit box by the federation's extent, numbers them and takes its removal requests from the
public stream. Machines built with ``config=`` (data already scaled, ids and requests given) skip it.

Round 0, phase ``setup``: each client sends its X25519 :class:`PublicKey`; the server sends every
client :class:`PeerKeys` (all keys). Each pair of clients now shares a mask seed the server does
not know (Diffie-Hellman + HKDF, :func:`fedproto.algorithms.scma.pairwise_seed`).

Round 0, phase ``aggregate`` (Algorithm 1): each client has run K-means++ seeding on its data
(:class:`~fedproto.algorithms.mufc.seeding.LocalSeeding`), assigned its points to the nearest seed and
written each cluster's size into the grid bin of its seed (the sparse count vector q^(l), at most
K non-zeros); it sends the ``T`` power-sum syndromes of q^(l) over F_p plus its zero-sum pairwise
mask (:class:`MaskedSyndromes`, ``T * ceil(bitlength(p) / 8)`` payload bytes). The server sums
the shares (the masks cancel), decodes q = sum_l q^(l) exactly (Berlekamp-Massey, roots,
Forney; :func:`fedproto.algorithms.scma.decode_syndromes`), builds the weighted bin centres (or uniform
samples inside the bins) and runs K-means++ with Lloyd's iterations. Phase ``model``: the server
sends the centroids to every active client (:class:`ModelUpdate`, version 0).

Removal request ``s`` (round ``s``, Algorithm 4): the client holding the points runs Algorithm 3
(re-seeds only from the first removed seed onward) and sends a :class:`RemovalRequest` (phase
``removal``; no data), or leaves the federation (``whole_client``: no computation, it simply stops
contributing). The server opens round ``s`` among the remaining clients
(:class:`AggregationRequest`); every active client uploads its syndromes with fresh masks
(unaffected clients resend their cached q^(l), so their unmasked syndromes are unchanged); the
server decodes q' and re-clusters iff the mode asks for it, then sends version ``s``. A client
without a request expands its mask for the next round as soon as it has the model (masks depend
only on the active set and the round), so its share costs one addition when the round opens.

Unlearning modes (spec 3.5): ``exact`` (default: the requesting client always refreshes q^(l),
so q' != q and the server always re-clusters; the pipeline's output is distributed exactly as a
retrain on the remaining data), ``literal`` (the paper's wording: q^(l) is refreshed only when the
client re-seeds; the server keeps C_s when q' = q, so its model may still count removed points) and
``lazy`` (the authors' code: the server re-clusters only when the support of q changes, i.e. when
a seed moved). Only ``exact`` is exact.

Randomness: client ``c`` seeds with ``fold_in(key, c + 1)``, the server clusters with
``fold_in(key, 0)``. By default removals reuse these keys (coupled randomness: the model after any
removal stream equals a from-scratch run on the remaining data with the same key, which is
checkable exactly); ``fresh_randomness`` draws the re-seeded positions and the server's run from
keys folded with the round, which is exact in distribution (Lemma 5.1).

Dropout: a client silent past the phase deadline during an aggregation is named in an
:class:`~fedproto.errors.InsufficientParticipants` error, unless ``min_clients`` allows going on:
then the server drops the silent clients and re-opens the round among the others with fresh masks
(``attempt`` + 1); the dropped clients' data are no longer in the model (their late shares are
refused). Pairwise masks cannot be unmasked without every active share (no Shamir recovery, spec
2.3), which is why the round is re-run rather than completed. A share that fails decoding (a
corrupted or overloaded share) ends the run with :class:`~fedproto.algorithms.scma.SyndromeDecodingError`;
a wrong sum is never returned.

With SecAgg+ (``secagg_plus=`` a :class:`~fedproto.algorithms.secagg_plus.engine.SecAggPlusConfig`
over ``F_p`` with vectors of ``T`` elements, :func:`secagg_plus_config`; ``fedproto run mufc
--secagg plus`` or ``complete``), every aggregation, training (round 0) and each removal round,
is one SecAgg+ aggregation among the active clients (:mod:`fedproto.algorithms.secagg_plus.engine`;
phases ``masked-input`` and ``unmask``, after SecAgg+'s own key set-up, ``advertise-keys``, in
round 0), and the setup above is not run:

* each client's input is its *unmasked* syndromes (SecAgg+ adds the masks); the server obtains the
  syndrome sum of the survivors, exactly what SCMA reveals for the same clients, and decodes and
  clusters it as above, then sends :class:`ModelUpdate` to the survivors;
* a client sends its masked input for round ``s`` as soon as it has the model of round ``s - 1``
  (the requesting client after its :class:`RemovalRequest`; a leaving client sends its request
  and nothing else), so the server opens round ``s`` at once and needs no :class:`AggregationRequest`;
  a request only names a leaving client (it is then absent from the instance, not a dropout);
* dropout: a client silent past the deadline, or reported gone by the transport, at any stage
  is dropped (:meth:`SecAggPlusServer.drop`); the round completes with the survivors whenever
  SecAgg+ can still remove the masks (t surviving neighbours; a client silent at ``unmask`` whose
  neighbour sent no input makes the others mask once more), else :class:`~fedproto.errors.InsufficientParticipants` names the parties. A
  dropped client leaves the federation: its data leave the model from the next aggregation on
  (one that dropped at ``unmask`` had its input in that round's sum already) and its late frames
  are ignored. ``min_clients`` is kept as a quorum on the clients still in the federation;
  unset, it means no quorum beyond SecAgg+'s own threshold. The server's result records
  ``{party: (round_idx, stage)}``.

Where it lives: the public parameters and the SecAgg+ parameters in
:mod:`fedproto.algorithms.mufc.config`, the server in :mod:`fedproto.algorithms.mufc.server`, the
clients in :mod:`fedproto.algorithms.mufc.client`, the simulation's plan in
:mod:`fedproto.algorithms.mufc.parties` (and the plan of parties that each hold only their own
data in :mod:`fedproto.algorithms.mufc.setup`). This module names them all in one place.

References:
    Bell, Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead", ACM CCS 2020, Sec. 3; Bonawitz et al., ACM CCS 2017, Fig. 4.
"""

from __future__ import annotations

from fedproto.algorithms.mufc.client import (
    ClientState,
    MUFCClient,
    MUFCClientResult,
    bin_powers_ahead,
    client_key_entropy,
    refresh_syndromes,
)
from fedproto.algorithms.mufc.config import (
    MODES,
    SECAGG_CHOICES,
    SERVER,
    SERVER_MODES,
    MUFCConfig,
    MUFCOptions,
    check_secagg_plus,
    make_config,
    secagg_plus_config,
)
from fedproto.algorithms.mufc.parties import MUFCParties
from fedproto.algorithms.mufc.server import MUFCServer, MUFCServerResult, ServerModel, ServerState

__all__ = [
    "MODES",
    "SECAGG_CHOICES",
    "SERVER",
    "SERVER_MODES",
    "ClientState",
    "MUFCClient",
    "MUFCClientResult",
    "MUFCConfig",
    "MUFCOptions",
    "MUFCParties",
    "MUFCServer",
    "MUFCServerResult",
    "ServerModel",
    "ServerState",
    "bin_powers_ahead",
    "check_secagg_plus",
    "client_key_entropy",
    "make_config",
    "refresh_syndromes",
    "secagg_plus_config",
]
