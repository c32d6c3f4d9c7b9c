"""MUFC over SecAgg+ (``secagg_plus=``, ``fedproto run mufc --secagg plus``): issue 12, part 3.

* without dropouts the model, the counts and every version equal the SCMA run's with the same
  keys (the server decodes the same syndrome sum), and removal streams still equal retraining on
  the remaining data; no SCMA setup or SCMA frame is sent;
* a client crashed at ``masked-input`` of training and one crashed at ``unmask`` of a removal
  round: the run completes without re-opening a round, each version is the server's clustering
  of the syndromes of exactly the clients whose inputs reached the sum (computed here from their
  data), and the dropouts are recorded; told at once by the transport or found at the deadline;
* too few survivors for SecAgg+'s threshold, or for ``min_clients``: a clear
  ``InsufficientParticipants`` naming the dropped clients, never a model;
* a dropped client's late frame is ignored; a leaving client is absent, not a dropout;
* the command line: ``--secagg plus`` with ``--dropout`` completes and reports the dropouts.
"""

from __future__ import annotations

import json

import jax
import jsonschema
import numpy as np
import pytest
import trio

from fedproto.algorithms.mufc.messages import AggregationRequest, MaskedSyndromes, PeerKeys, PublicKey
from fedproto.algorithms.mufc.protocol import (
    SERVER,
    MUFCParties,
    ServerModel,
    check_secagg_plus,
    make_config,
    secagg_plus_config,
)
from fedproto.algorithms.mufc.replay import replay
from fedproto.algorithms.mufc.seeding import LocalSeeding
from fedproto.algorithms.secagg_plus.engine import AGGREGATION_STAGES, STAGES, Modulus, complete_config
from fedproto.algorithms.secagg_plus.messages import CIPHERTEXT_BYTES, MaskedInput
from fedproto.codec import decode_frame, encode_frame
from fedproto.errors import InsufficientParticipants
from fedproto.messages import PhaseTimedOut
from fedproto.metering import Meter, report_schema
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import CrashPoint, Faults
from fedproto.testing.harness import Harness
from fedproto.transports.memory import MemoryNetwork

KEY = jax.random.PRNGKey(3)
SESSION = 9
#: Seven clients: the complete graph with t = 4, so up to two of them may drop in an aggregation.
L = 7


def federation(n_clients: int = L, *, k: int = 3, sizes=(40, 40, 40), seed: int = 0, **options):
    """Points of a 2-D mixture dealt round-robin to the clients, ids = row numbers (+100)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(len(sizes), 2))
    x = np.clip(np.concatenate([rng.normal(c, 0.04, size=(s, 2)) for c, s in zip(centres, sizes)]), 0, 1)
    ids = np.arange(len(x)) + 100
    parts = [(x[r], ids[r]) for r in (np.arange(c, len(x), n_clients) for c in range(n_clients))]
    config = make_config(len(x), x.shape[1], k, n_clients, n_init=3, **options)
    return parts, config


def parties_for(parts, config, kind: str, requests=()):
    plus = secagg_plus_config(config, kind, session=SESSION)
    return MUFCParties(parts, config, key=KEY, requests=requests, secagg_plus=plus, session=SESSION)


def run_harness(parties: MUFCParties):
    harness = Harness(parties.machines(), session=SESSION)
    return harness.run(), harness


def survivors_model(parts, config, clients, removals=()):
    """The server's clustering of the given clients' data after ``removals`` (``(client, ids)``),
    computed from the data directly: each client's seeding, its count vector, their sum.

    Returns:
        ``(centroids [k, d], counts {bin: count})``.
    """
    counts: dict[int, int] = {}
    for c in clients:
        x, ids = parts[c]
        local = LocalSeeding(x, ids, config.k_client, jax.random.fold_in(KEY, c + 1))
        for owner, batch in removals:
            if owner == c:
                local.remove(tuple(batch))
        for j, q in local.counts(config.grid).items():
            counts[j] = counts.get(j, 0) + q
    model = ServerModel(config, jax.random.fold_in(KEY, 0))
    model.adopt(dict(counts), 0)
    return model.centroids, counts


def test_without_dropout_secagg_plus_gives_the_scma_model_exactly():
    parts, config = federation()
    requests = [(1, (int(parts[1][1][0]),)), (4, None), (3, (int(parts[3][1][2]), int(parts[3][1][5])))]
    scma_results, _ = run_harness(parties_for(parts, config, "scma", requests))
    plus_results, harness = run_harness(parties_for(parts, config, "plus", requests))
    scma, plus = scma_results[SERVER], plus_results[SERVER]
    assert len(plus.history) == len(requests) + 1
    for a, b in zip(scma.history, plus.history, strict=True):
        np.testing.assert_array_equal(a, b)
    assert plus.counts == scma.counts and plus.totals == scma.totals
    assert plus.reclustered == scma.reclustered and plus.support_sizes == scma.support_sizes
    # the leaving client is absent from later rounds, not a dropout
    assert plus.active == scma.active == (0, 1, 2, 3, 5, 6)
    assert plus.dropped == () and plus.dropouts == {}
    assert plus_results["client-4"].left and plus_results["client-4"].version == 1
    for c in (0, 1, 2, 3, 5, 6):
        np.testing.assert_array_equal(plus_results[f"client-{c}"].centroids, plus.centroids)
    # no SCMA setup and no SCMA frame; round 0 agrees SecAgg+'s keys, every round is SecAgg+'s two
    # aggregation stages, each masked input carries T field elements and one encrypted share per
    # neighbour it masks with (at most the other six clients of the complete graph)
    width = Modulus.field(config.prime).width
    sizes = {
        len(encode_frame(MaskedInput(masked=np.zeros((config.n_syndromes, width), np.uint8),
                                     shares=np.zeros((m, CIPHERTEXT_BYTES), np.uint8)),
                         session=SESSION, round_idx=r, phase=STAGES[1]))
        for m in range(1, L) for r in range(len(requests) + 1)
    }
    tags, phases = set(), {}
    for (round_idx, phase, sender, receiver, tag), counter in harness.meter.sent.items():
        tags.add(tag)
        phases.setdefault(round_idx, set()).add(phase)
        if tag == MaskedInput.TAG:
            assert counter[0] == 1 and counter[1] in sizes
    assert not tags & {PublicKey.TAG, PeerKeys.TAG, AggregationRequest.TAG, MaskedSyndromes.TAG}
    assert phases[0] == {*STAGES, "model"}
    assert all(phases[s] == {"removal", *AGGREGATION_STAGES, "model"} for s in (1, 2, 3))


def test_a_removal_stream_over_secagg_plus_equals_retraining_after_every_request():
    """The exactness oracle of the SCMA test (coupled keys) with SecAgg+ on, on the complete
    graph of classic SecAgg too."""
    parts, config = federation()
    rng = np.random.default_rng(5)
    requests, used = [], set()
    for s in range(5):
        c = (2 * s) % L
        pool = [int(i) for i in parts[c][1] if int(i) not in used]
        chosen = tuple(int(i) for i in rng.choice(pool, size=3, replace=False))
        used.update(chosen)
        requests.append((c, chosen))
    seeds0 = MUFCParties(parts, config, key=KEY).make_machine("client-0")._local.seeds
    requests.append((0, (next(int(i) for i in seeds0 if int(i) not in used),)))  # a seed: re-seeding
    results, _ = run_harness(parties_for(parts, config, "complete", requests))
    server = results[SERVER]
    assert all(server.reclustered) and any(results["client-0"].reseeded)
    for s in (1, 3, len(requests)):
        gone = {i for _, batch in requests[:s] for i in batch}
        kept = [(x[~np.isin(ids, list(gone))], ids[~np.isin(ids, list(gone))]) for x, ids in parts]
        np.testing.assert_array_equal(server.history[s], replay(kept, config, KEY, (), evaluate=False).centroids)
    assert server.totals[-1] == sum(len(ids) for _, ids in parts) - sum(len(b) for _, b in requests)


@pytest.mark.parametrize("report_drops", [True, False], ids=["reported", "deadline"])
async def test_dropouts_at_masked_input_and_unmask_complete_with_the_survivors(autojump_clock, report_drops):
    """client-2 crashes sending its masked input in training, client-5 sending its unmask shares
    in the first removal round: no round is re-run, and each version is the clustering of exactly
    the inputs in its sum (client-5's input is in round 1's sum, and out from round 2)."""
    parts, config = federation()
    requests = [(0, (int(parts[0][1][1]),)), (1, (int(parts[1][1][3]),))]
    parties = parties_for(parts, config, "plus", requests)
    faults = Faults(crash_at={"client-2": CrashPoint("masked-input", 0), "client-5": CrashPoint("unmask", 1)})
    network = MemoryNetwork(list(parties.roster), faults=faults, report_drops=report_drops)
    meter = Meter(trio.current_time)
    results = await run_parties(
        parties.machines(), network, config=RuntimeConfig(session=SESSION, deadline_s=5.0), meter=meter
    )
    server = results[SERVER]
    assert server.dropouts == {"client-2": (0, "masked-input"), "client-5": (1, "unmask")}
    assert server.dropped == (2, 5) and server.active == (0, 1, 3, 4, 6)
    assert set(results) == {SERVER, "client-0", "client-1", "client-3", "client-4", "client-6"}
    # one aggregation per version, nothing re-run: one masked input per survivor per round
    inputs: dict[int, int] = {}
    for (round_idx, phase, sender, receiver, tag), (messages, _) in meter.sent.items():
        if tag == MaskedInput.TAG:
            inputs[round_idx] = inputs.get(round_idx, 0) + messages
    assert len(server.history) == 3 and inputs == {0: 6, 1: 6, 2: 5}
    others = [c for c in range(L) if c != 2]
    expected = [
        survivors_model(parts, config, others),
        survivors_model(parts, config, others, requests[:1]),
        survivors_model(parts, config, [c for c in others if c != 5], requests),
    ]
    for version, (centroids, counts) in enumerate(expected):
        np.testing.assert_array_equal(server.history[version], centroids)
        assert server.totals[version] == sum(counts.values())
    assert server.counts == expected[-1][1]
    # the survivors' model differs from the full federation's: the dropouts changed the data
    assert not np.array_equal(server.history[0], survivors_model(parts, config, range(L))[0])
    for c in (0, 1, 3, 4, 6):
        np.testing.assert_array_equal(results[f"client-{c}"].centroids, server.centroids)


@pytest.mark.parametrize("stage", AGGREGATION_STAGES)  # the keys were agreed in round 0
async def test_a_dropout_at_any_stage_of_a_removal_round(autojump_clock, stage):
    """client-5 crashes at ``stage`` of round 1: its input is in round 1's sum only if it sent it
    (it dropped at ``unmask``); either way it is out of round 2 and recorded at that stage."""
    parts, config = federation()
    requests = [(0, (int(parts[0][1][1]),)), (1, (int(parts[1][1][3]),))]
    parties = parties_for(parts, config, "plus", requests)
    network = MemoryNetwork(list(parties.roster), faults=Faults(crash_at={"client-5": CrashPoint(stage, 1)}),
                            report_drops=True)
    results = await run_parties(parties.machines(), network, config=RuntimeConfig(session=SESSION, deadline_s=5.0))
    server = results[SERVER]
    assert server.dropouts == {"client-5": (1, stage)} and server.active == (0, 1, 2, 3, 4, 6)
    others = [c for c in range(L) if c != 5]
    in_round_1 = range(L) if stage == "unmask" else others
    np.testing.assert_array_equal(server.history[0], survivors_model(parts, config, range(L))[0])
    np.testing.assert_array_equal(server.history[1], survivors_model(parts, config, in_round_1, requests[:1])[0])
    np.testing.assert_array_equal(server.history[2], survivors_model(parts, config, others, requests)[0])


@pytest.mark.parametrize("report_drops", [True, False], ids=["reported", "deadline"])
async def test_a_client_leaving_while_another_drops_is_absent_not_a_dropout(autojump_clock, report_drops):
    parts, config = federation()
    requests = [(4, None), (0, (int(parts[0][1][2]),))]
    parties = parties_for(parts, config, "plus", requests)
    network = MemoryNetwork(list(parties.roster), report_drops=report_drops,
                            faults=Faults(crash_at={"client-3": CrashPoint("masked-input", 1)}))
    results = await run_parties(parties.machines(), network, config=RuntimeConfig(session=SESSION, deadline_s=5.0))
    server = results[SERVER]
    assert server.dropouts == {"client-3": (1, "masked-input")} and server.dropped == (3,)
    assert server.active == (0, 1, 2, 5, 6) and results["client-4"].left
    rest = (0, 1, 2, 5, 6)
    np.testing.assert_array_equal(server.history[1], survivors_model(parts, config, rest)[0])
    np.testing.assert_array_equal(server.history[2], survivors_model(parts, config, rest, requests[1:])[0])


async def test_too_few_survivors_for_the_threshold_name_the_dropped_clients(autojump_clock):
    """Three of seven clients lost at masked-input: each survivor keeps 3 < t = 4 neighbours
    with inputs, so its self mask cannot be removed: an error, never a model."""
    parts, config = federation()
    parties = parties_for(parts, config, "plus")
    assert parties.secagg_plus.threshold == 4
    crashed = ("client-1", "client-3", "client-6")
    faults = Faults(crash_at={c: CrashPoint("masked-input", 0) for c in crashed})
    network = MemoryNetwork(list(parties.roster), faults=faults, report_drops=True)
    machines = parties.machines()
    with pytest.raises(InsufficientParticipants) as info:
        await run_parties(machines, network, config=RuntimeConfig(session=SESSION, deadline_s=5.0))
    assert info.value.missing == crashed
    assert machines[SERVER].failed and "t = 4" in str(machines[SERVER].error)


async def test_fewer_survivors_than_min_clients_fail_naming_them(autojump_clock):
    parts, config = federation(min_clients=6)
    parties = parties_for(parts, config, "plus")
    crashed = ("client-0", "client-4")
    faults = Faults(crash_at={c: CrashPoint("masked-input", 0) for c in crashed})
    network = MemoryNetwork(list(parties.roster), faults=faults, report_drops=True)
    with pytest.raises(InsufficientParticipants, match="quorum of 6") as info:
        await run_parties(parties.machines(), network, config=RuntimeConfig(session=SESSION, deadline_s=5.0))
    assert info.value.missing == crashed


def test_a_late_frame_of_a_dropped_client_is_ignored():
    """client-6 is slow: its masked input is held back until the deadline has dropped it; the
    round completes without it, and its late frame, stamped with a round now past, is ignored
    rather than failing the round check."""
    parts, config = federation()
    requests = [(0, (int(parts[0][1][1]),))]
    machines = parties_for(parts, config, "plus", requests).machines()
    held = []

    def hold(frame):
        if frame.sender == "client-6" and isinstance(decode_frame(frame.data)[1], MaskedInput):
            held.append(frame)
            return None
        return frame.data

    harness = Harness(machines, session=SESSION, tamper=hold)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    server = machines[SERVER]
    assert server.pending() == ["client-6"] and server.phase == "masked-input"
    harness.inject(SERVER, PhaseTimedOut(round_idx=0, phase="masked-input", deadline_s=1.0))
    while server.round_idx == 0:
        harness.deliver_one()
    envelope, late = decode_frame(held[0].data)
    assert envelope.round_idx == 0 and server.receive("client-6", late, round_idx=envelope.round_idx) == []
    while harness.deliver_one() is not None:
        pass
    result = server.result()
    assert result.dropouts == {"client-6": (0, "masked-input")} and result.active == (0, 1, 2, 3, 4, 5)
    np.testing.assert_array_equal(result.history[0], survivors_model(parts, config, range(6))[0])
    np.testing.assert_array_equal(result.history[1], survivors_model(parts, config, range(6), requests)[0])


def test_secagg_plus_parameters_must_fit_the_run():
    parts, config = federation()
    assert secagg_plus_config(config, "scma") is None
    plus = secagg_plus_config(config, "plus", session=1)
    assert (plus.n_clients, plus.vector_length, plus.modulus.prime) == (L, config.n_syndromes, config.prime)
    assert plus.complete  # seven clients: too few for Bell et al.'s bounds, the complete graph
    assert secagg_plus_config(config, "plus", session=2).graph_seed != plus.graph_seed
    with pytest.raises(ValueError, match="one of"):
        secagg_plus_config(config, "masks")
    _, single = federation(1)
    with pytest.raises(ValueError, match="at least 2 clients"):
        secagg_plus_config(single, "plus")
    with pytest.raises(ValueError, match="syndromes"):
        check_secagg_plus(config, complete_config(L, config.n_syndromes - 1, Modulus.field(config.prime)))
    with pytest.raises(ValueError, match="F_"):
        check_secagg_plus(config, complete_config(L, config.n_syndromes, Modulus.ring(32)))
    with pytest.raises(ValueError, match="syndromes"):
        MUFCParties(parts, config, key=KEY, secagg_plus=complete_config(6, config.n_syndromes,
                                                                         Modulus.field(config.prime)))


def test_the_command_line_runs_secagg_plus_with_dropouts(tmp_path, capsys):
    from fedproto.cli import main

    out = tmp_path / "run.json"
    argv = ["run", "mufc", "--data", "iris", "--clients", "8", "--removals", "2", "--secagg", "plus",
            "--no-timing", "--no-baselines", "--n-init", "2", "--quiet", "--report", str(out),
            "--dropout", "client-3@masked-input:0", "--dropout", "client-5@unmask:1"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, report_schema())
    results = doc["results"]
    assert results["secagg"] == "plus" and (results["secagg_degree"], results["secagg_threshold"]) == (7, 5)
    assert results["dropouts"] == ["client-3@masked-input:0", "client-5@unmask:1"]
    assert results["n_clients_dropped"] == 2 and results["clients_agree"] is True
    assert results["n_points_removed"] == 2 and results["model_equals_retrain"] is None
