"""FastLloyd with SecAgg+ (``--secagg plus``): same results as the paper's MSA without dropouts,
the survivors' result with them, and a clear error below the threshold."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from fedproto.algorithms.fastlloyd.config import make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.algorithms.secagg_plus import engine
from fedproto.data import normalize, partition
from fedproto.errors import InsufficientParticipants, RunAborted
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import Faults
from fedproto.transports.memory import MemoryNetwork

RNG = np.random.default_rng(77)
BLOBS = normalize(np.concatenate([RNG.normal(c, 0.4, size=(50, 2)) for c in ((0, 0), (4, 0), (0, 4))]))
SESSION = 11


def _plus(config, n_clients, *, complete=False):
    modulus = engine.Modulus.ring(config.ring_bits)
    length = config.k * (config.d + 1)
    if complete:
        return engine.complete_config(n_clients, length, modulus)
    return engine.plus_config(n_clients, length, modulus)


def _machines(config, x, names, parts, plus, *, noise_seed=3):
    machines = {
        "server": FastLloydServer(
            "server", config=config, clients=names, noise_seed=noise_seed, session=SESSION, secagg_plus=plus
        )
    }
    for i, name in enumerate(names):
        machines[name] = FastLloydClient(
            name,
            config=config,
            server="server",
            clients=names,
            points=x[parts[i]],
            entropy=bytes([i + 1]) * 32,
            session=SESSION,
            secagg_plus=plus,
        )
    return machines


def _run(machines, *, faults=None, deadline_s=30.0):
    network = MemoryNetwork(list(machines), faults=faults, report_drops=faults is not None)
    meter = Meter(trio.current_time)

    async def go():
        return await run_parties(machines, network, config=RuntimeConfig(session=SESSION, deadline_s=deadline_s), meter=meter)

    return trio.run(go), meter


def _config():
    return make_config("fastlloyd", n=len(BLOBS), k=3, d=2, epsilon=2.0, iterations=4, init_seed=1)


def test_without_dropouts_plus_equals_the_papers_aggregation_exactly():
    config = _config()
    names = [f"client-{i}" for i in range(5)]
    parts = partition(len(BLOBS), 5, scheme="iid", seed=0)
    msa, _ = _run(_machines(config, BLOBS, names, parts, None))
    plus, meter = _run(_machines(config, BLOBS, names, parts, _plus(config, 5)))
    for name in names:
        assert np.array_equal(plus[name].centroids, msa[name].centroids)
        assert np.array_equal(plus[name].history, msa[name].history)
    summary = plus["server"]
    assert summary.dropouts == {} and all(len(s) == 5 for s in summary.survivors)
    phases = {link.phase for link in meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(plus)).links}
    assert set(engine.STAGES) <= phases and "update" not in phases


@pytest.mark.parametrize("dropped", [2, 4])
def test_a_client_dropped_before_its_first_update_leaves_the_others_result(dropped):
    """A client that drops at the first advertise-keys never contributes: the survivors' centroids
    equal the paper's MSA run over the other clients' data with the same configuration and noise.
    Client 4 is the last one, whose shared-seed mask closes the total: the survivors then sum
    their masks directly rather than take the dropped ones from the total."""
    config = _config()
    names = [f"client-{i}" for i in range(5)]
    parts = partition(len(BLOBS), 5, scheme="iid", seed=0)
    gone = f"client-{dropped}"
    faults = Faults(crash_at={gone: ("advertise-keys", 0)})
    plus, _ = _run(_machines(config, BLOBS, names, parts, _plus(config, 5)), faults=faults)
    assert gone not in plus
    assert plus["server"].dropouts == {gone: (0, "advertise-keys")}
    others = [n for n in names if n != gone]
    reference, _ = _run(_machines(config, BLOBS, others, [parts[i] for i in range(5) if i != dropped], None))
    for name in others:
        assert np.array_equal(plus[name].centroids, reference[name].centroids)


@pytest.mark.parametrize("stage", ["masked-input", "unmask"])
def test_dropout_in_a_later_iteration_keeps_the_earlier_ones(stage):
    """A client dropped in iteration 2: iterations 0 and 1 are the full federation's; the run
    completes with the survivors, who agree; the server records the dropout."""
    config = _config()
    names = [f"client-{i}" for i in range(6)]
    parts = partition(len(BLOBS), 6, scheme="iid", seed=1)
    full, _ = _run(_machines(config, BLOBS, names, parts, _plus(config, 6)))
    faults = Faults(crash_at={"client-4": (stage, 2)})
    got, _ = _run(_machines(config, BLOBS, names, parts, _plus(config, 6)), faults=faults)
    survivors = [n for n in names if n != "client-4"]
    assert "client-4" not in got
    assert got["server"].dropouts == {"client-4": (2, stage)}
    reference = got[survivors[0]]
    for name in survivors:
        assert np.array_equal(got[name].centroids, reference.centroids)
        assert np.array_equal(got[name].history[:3], full[name].history[:3])
    # From iteration 2 on, the aggregates hold five clients (six if the client dropped at unmask:
    # its input was in).
    expected = 6 if stage == "unmask" else 5
    assert [len(s) for s in got["server"].survivors] == [6, 6, expected, 5]


def _aggregate_bytes_per_client(meter, parties):
    report = meter.report(protocol="fastlloyd", transport="memory", session=SESSION, parties=list(parties))
    links = [link for link in report.links if link.phase == "aggregate"]
    return {link.payload_bytes // link.messages for link in links}


def test_the_aggregate_names_the_dropped_clients_so_its_size_does_not_grow_with_n():
    """Issue 34: every client receives the aggregate, so it must not list the n survivors. Without
    dropouts it is the same size at 5 and at 9 clients; each dropped client adds one index."""
    config = _config()
    sizes = []
    for n in (5, 9):
        names = [f"client-{i}" for i in range(n)]
        parts = partition(len(BLOBS), n, scheme="iid", seed=0)
        _, meter = _run(_machines(config, BLOBS, names, parts, _plus(config, n, complete=True)))
        sizes.append(_aggregate_bytes_per_client(meter, names))
    assert sizes[0] == sizes[1] and len(sizes[0]) == 1
    names = [f"client-{i}" for i in range(9)]
    parts = partition(len(BLOBS), 9, scheme="iid", seed=0)
    faults = Faults(crash_at={"client-1": ("advertise-keys", 0), "client-3": ("advertise-keys", 0)})
    _, meter = _run(_machines(config, BLOBS, names, parts, _plus(config, 9, complete=True)), faults=faults)
    (with_two,) = _aggregate_bytes_per_client(meter, names)
    (without,) = sizes[0]
    assert with_two == without + 2 * 4  # two uint32 indices


def test_a_client_refuses_an_aggregate_whose_dropped_list_contradicts_what_it_knows():
    from fedproto.algorithms.fastlloyd.messages import SurvivorAggregate
    from fedproto.errors import RemoteProtocolError

    config = _config()
    names = [f"client-{i}" for i in range(3)]
    parts = partition(len(BLOBS), 3, scheme="iid", seed=0)
    client = _machines(config, BLOBS, names, parts, _plus(config, 3, complete=True))["client-1"]

    class Done:
        stage = "done"
        revealed = ((0,), (2,))  # client 0's input is in the sum, client 2's is not

    masked = np.zeros(config.shape, dtype=np.uint32)
    # itself listed; an index past the clients; a neighbour whose self-mask seed it revealed listed
    # as dropped; one whose masking key it revealed not listed
    for dropped in ([1, 2], [0, 1, 2], [2, 3], [0, 2], []):
        client._aggregation = Done()
        with pytest.raises(RemoteProtocolError):
            client._on_survivor_aggregate("server", SurvivorAggregate(masked=masked, dropped=np.asarray(dropped, dtype=np.uint32)))
    # The consistent list is taken: the masks of the clients outside the sum come off the total.
    from fedproto.algorithms.secagg import MaskGenerator

    client._masks = MaskGenerator(bytes(32), 3, config.shape, ring_bits=config.ring_bits)
    unmasked = []
    client._unmask_aggregate = lambda sender, got, mask: unmasked.append(mask) or []
    client._aggregation = Done()
    client._on_survivor_aggregate("server", SurvivorAggregate(masked=masked, dropped=np.asarray([2], dtype=np.uint32)))
    (mask,) = unmasked
    assert np.array_equal(mask, client._masks.party_mask(0, 0) + client._masks.party_mask(1, 0))


def test_too_many_dropouts_fail_naming_the_parties():
    config = _config()
    names = [f"client-{i}" for i in range(4)]
    parts = partition(len(BLOBS), 4, scheme="iid", seed=0)
    plus = _plus(config, 4, complete=True)  # t = 3 of 4
    faults = Faults(crash_at={"client-1": ("masked-input", 1), "client-3": ("masked-input", 1)})
    with pytest.raises((InsufficientParticipants, RunAborted)) as caught:
        _run(_machines(config, BLOBS, names, parts, plus), faults=faults)
    assert "client-1" in str(caught.value) and "client-3" in str(caught.value)


def test_a_secagg_config_that_does_not_fit_is_refused():
    config = _config()
    wrong = engine.plus_config(5, 99, engine.Modulus.ring(config.ring_bits))
    with pytest.raises(ValueError, match="k \\(d\\+1\\)"):
        FastLloydServer("server", config=config, clients=[f"client-{i}" for i in range(5)], secagg_plus=wrong)


def test_the_command_line_run_of_the_issue_survives_two_dropouts(tmp_path, capsys):
    """``fedproto run fastlloyd --data s1 --clients 10 --secagg plus --dropout client-3@masked-input
    --dropout client-7@unmask`` completes with the survivors' result and reports the dropouts."""
    import json

    import jsonschema

    from fedproto.cli import main
    from fedproto.data import find_data_file
    from fedproto.metering import report_schema

    if find_data_file("s1") is None:
        pytest.skip("s1.txt is in no FEDPROTO_DATA directory")
    out = tmp_path / "run.json"
    code = main([
        "run", "fastlloyd", "--data", "s1", "--clients", "10", "--secagg", "plus",
        "--dropout", "client-3@masked-input", "--dropout", "client-7@unmask", "--quiet", "--no-plot",
        "--report", str(out),
    ])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, report_schema())
    results = doc["results"]
    assert results["dropouts"] == ["client-3@masked-input:0", "client-7@unmask:0"]
    assert results["survivors_final"] == [f"client-{i}" for i in range(10) if i not in (3, 7)]
    assert results["clients_agree"] is True
    assert results["nicv"] < 5 * results["nicv_sklearn"]
    assert {d["party"] for d in doc["faults"]["dropouts"]} == {"client-3", "client-7"}
    assert all(d["crashed"] for d in doc["faults"]["dropouts"])
    assert set(doc["parties"]) >= {"server", "client-0"}
