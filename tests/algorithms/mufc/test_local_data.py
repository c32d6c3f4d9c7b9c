"""Each party holds only its own data (issue 10, part 1; docs/protocols/mufc.md, "Each party's own data").

* the per-party plans (``split`` into files, ``plan_party`` for every party, each given only its
  file read back) give the simulation's results and the same payload bytes on every link, with
  SCMA and SecAgg+, removals and a leaving client;
* machines built from raw rows and the public options (``setup.data``) compute the model that
  machines built from a ready config and the pooled data scaled at once compute, and exact
  unlearning still equals retraining;
* the ``setup.data`` bytes are ``16 d`` up and ``8 L + 16 d`` down per client plus one envelope
  per frame;
* a party whose file has another number of features is refused, named, in ``setup.data``;
* through the real command line over TCP: ``fedproto split``, ``fedproto provision`` and one
  ``fedproto party --data FILE`` process per party agree with ``fedproto run --transport memory``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedproto import registry
from fedproto.algorithms.mufc.cli import unit_box
from fedproto.algorithms.mufc.data import Federation
from fedproto.algorithms.mufc.messages import DataSummary, FederationSummary
from fedproto.algorithms.mufc.protocol import SERVER, MUFCParties
from fedproto.algorithms.mufc.setup import DataSetup, LocalDataParties, setup_data_bytes
from fedproto.cli import build_parser
from fedproto.codec import encode_frame
from fedproto.data import Dataset, load_dataset
from fedproto.errors import RemoteProtocolError
from fedproto.metering import RunReport
from fedproto.testing import link_costs, run_in_memory, run_over_tcp, run_per_party
from fedproto.testing.harness import Harness
from fedproto.testing.local_data import run_with_other_feature_count

PLUGIN = registry.load_protocol("mufc")
#: iris, small runs: every phase present, no timed replay, no baselines
BASE = ["--data", "iris", "--seed", "2", "--n-init", "2", "--no-timing", "--no-baselines"]
CASES = {
    "scma": ["--clients", "3", "--removals", "3", "--points-per-removal", "2", "--leave", "1"],
    "secagg-plus": ["--clients", "5", "--removals", "2", "--leave", "1", "--secagg", "plus"],
    "lazy-iid-gamma": ["--clients", "3", "--removals", "2", "--unlearning", "lazy", "--partition", "iid",
                       "--quantization-step", "0.2"],
}


def _args(*extra: str):
    argv = ["run", "mufc", *BASE, *extra]
    return build_parser(argv).parse_args(argv)


def _run(machines: dict, session: int) -> tuple[dict, RunReport]:
    return run_in_memory(machines, session, deadline_s=60, protocol="mufc")


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_per_party_plans_give_the_simulations_results_and_bytes(tmp_path, case):
    # every party's plan as ``fedproto party`` builds it from its own file, read back: the clients
    # run without --k (their files record iris's paper K); the server, which holds no file, gets
    # the resolved_options the TCP launcher passes
    dataset = load_dataset("iris")
    assert PLUGIN.resolved_options(_args(*CASES[case]), dataset) == ["--k", "3"]
    run = run_per_party("mufc", [*BASE, *CASES[case]], tmp_path, resolved_to_data_holders=False)
    simulation, plans, report, sim_report = run.plans.plan, run.plans.plans, run.per_party_report, run.simulation_report
    assert all(plan.roster == simulation.roster and plan.session == simulation.session for plan in plans.values())
    assert all(plan.phases == simulation.phases and plan.phases[0] == "setup.data" for plan in plans.values())
    assert run.per_party_results == run.simulation_results
    assert run.per_party_links == run.simulation_links  # payload bytes per link, phase and round
    assert report.payload_bytes == sim_report.payload_bytes and report.setup_bytes == sim_report.setup_bytes
    summary = simulation.summarize(run.simulation_results)
    assert summary["clients_agree"] is True and summary["n_points"] == dataset.n
    assert summary["n_points_decoded"] == dataset.n - summary["n_points_removed"]


def test_raw_rows_and_options_equal_a_ready_config_on_the_pooled_scaled_data():
    """setup.data agrees what scaling the pooled data at once gives, bit for bit: the machines
    built from raw rows compute the model, every version and the decoded counts of the machines
    built from a ready config (MUFCParties), and exact unlearning still equals retraining."""
    rng = np.random.default_rng(3)
    raw = np.concatenate([rng.normal(c, 1.0, size=(30, 3)) * (1, 10, 0.1) for c in (0, 5, 9)])
    rows = [np.arange(0, 25), np.arange(25, 60), np.arange(60, 90)]
    setup = DataSetup(n_clients=3, k=3, removals=4, points_per_removal=2, leave=0, stream_seed=7, n_init=2)
    key = jax.random.PRNGKey(5)
    local = LocalDataParties(setup, key=key, seed=11, session=9)
    with_setup = Harness({p: local.make_machine(p, None if p == SERVER else raw[rows[local.clients.index(p)]])
                          for p in local.roster}, session=9)
    got = with_setup.run()

    pooled = unit_box(raw)
    agreement = setup.configure(Federation.of([raw[r] for r in rows]), 9)
    assert agreement.federation.n == 90 and np.array_equal(agreement.federation.extent, [raw.min(0), raw.max(0)])
    parts = [(pooled[r], r.astype(np.int64)) for r in rows]  # ids: rows of the pooled data, client-major
    ready = MUFCParties(parts, agreement.config, key=key, requests=agreement.stream, seed=11, session=9)
    expected = Harness(ready.machines(), session=9).run()

    assert with_setup.machines[SERVER].config == agreement.config
    assert with_setup.machines[SERVER].federation == agreement.federation
    for i in range(len(expected[SERVER].history)):
        assert np.array_equal(got[SERVER].history[i], expected[SERVER].history[i])
    assert got[SERVER].counts == expected[SERVER].counts and got[SERVER].totals == (90, 88, 86, 84, 82)
    for c in local.clients:
        assert np.array_equal(got[c].ids, expected[c].ids) and got[c].seeds == expected[c].seeds
    # exactness: the final model is a from-scratch run on the remaining raw rows (same extent, keys)
    removed = {i for _, batch in agreement.stream for i in batch}
    kept = [r[~np.isin(r, list(removed))] for r in rows]
    fresh = MUFCParties([(pooled[r], r.astype(np.int64)) for r in kept], agreement.config, key=key, seed=11,
                        session=9)
    assert np.array_equal(Harness(fresh.machines(), session=9).run()[SERVER].centroids, got[SERVER].centroids)


def _envelope(message: DataSummary | FederationSummary, session: int) -> int:
    """Encoded frame length minus the message's raw array bytes."""
    frame = encode_frame(message, session=session, round_idx=0, phase="setup.data")
    return len(frame) - sum(array.nbytes for array in (getattr(message, "client_points", np.empty(0)), message.extent))


@pytest.mark.parametrize("data, clients", [("iris", 3), ("wine", 5)])
def test_setup_data_bytes_are_16_d_up_and_8_L_plus_16_d_down_plus_one_envelope_per_frame(data, clients):
    argv = ["run", "mufc", "--data", data, "--clients", str(clients), "--removals", "0", "--n-init", "1",
            "--no-timing", "--no-baselines", "--partition", "iid"]
    args = build_parser(argv).parse_args(argv)
    dataset = load_dataset(data)
    plan = PLUGIN.plan(args, dataset)
    _, report = _run({p: plan.make_machine(p) for p in plan.roster}, plan.session)
    d = dataset.d
    assert setup_data_bytes(clients, d) == {"up": 16 * d, "down": 8 * clients + 16 * d}
    assert plan.analytic["analytic_setup_data_bytes_per_client"] == 8 * clients + 32 * d
    links = {(link.sender, link.receiver): link for link in report.links if link.phase == "setup.data"}
    assert len(links) == 2 * clients and all(link.messages == 1 and link.round_idx == 0 for link in links.values())
    parts = PLUGIN.split(args, dataset)
    counts = np.array([part.n for part in parts.values()])
    down = FederationSummary(client_points=counts, extent=np.zeros((2, d)))
    for party, part in parts.items():
        up = DataSummary(n_points=part.n, extent=np.zeros((2, d)))
        assert links[(party, SERVER)].payload_bytes == 16 * d + _envelope(up, plan.session)
        assert links[(SERVER, party)].payload_bytes == 8 * clients + 16 * d + _envelope(down, plan.session)
        assert _envelope(up, plan.session) <= 64 and _envelope(down, plan.session) <= 72
    # setup.data comes first, in round 0, and is metered as setup (with SCMA's key exchange)
    assert plan.phases[:2] == ("setup.data", "setup")
    setup = [link for link in report.links if link.phase.startswith("setup")]
    assert report.setup_bytes == sum(link.payload_bytes for link in setup)
    assert report.setup_bytes >= clients * (8 * clients + 32 * d + 32 + 32 * clients)


def test_a_party_with_another_number_of_features_is_refused_naming_it(tmp_path):
    error, machines = run_with_other_feature_count(
        "mufc", [*BASE, "--clients", "3", "--removals", "1", "--k", "3"], tmp_path, party="client-1", change=-1
    )  # a column short
    assert isinstance(error, RemoteProtocolError) and error.party == "client-1", error
    assert "client-1 has 3" in str(error) and "the other clients 4" in str(error) and "features" in str(error)
    assert machines[SERVER].failed and error.phase == "setup.data" and error.round_idx == 0


def test_plan_party_refuses_what_it_cannot_know():
    args = _args("--clients", "2")
    roster = (SERVER, "client-0", "client-1")
    unnamed = Dataset("mine", np.zeros((4, 2)), None, None)
    args.k = None
    with pytest.raises(ValueError, match="--k is required when a party holds only its own data"):
        PLUGIN.plan_party(args, SERVER, roster, 1, None)
    with pytest.raises(ValueError, match="client-0 is a MUFC client: give it its own data with --data FILE"):
        PLUGIN.plan_party(args, "client-0", roster, 1, None)
    args.k = 2
    with pytest.raises(ValueError, match="the MUFC server holds no data"):
        PLUGIN.plan_party(args, SERVER, roster, 1, unnamed)
    with pytest.raises(ValueError, match="needs a party named 'server'"):
        PLUGIN.plan_party(args, "client-0", ("client-0", "client-1"), 1, unnamed)
    plan = PLUGIN.plan_party(args, "client-0", roster, 1, unnamed)
    assert plan.summarize({}) == {} and plan.max_frame_bytes is None  # n and d are agreed in the run
    with pytest.raises(ValueError, match="holds only client-0's data"):
        plan.make_machine("client-1")
    # --k's default is the only option that depends on the whole data set: the paper's K, else 3
    assert PLUGIN.resolved_options(_args("--k", "5"), load_dataset("iris")) == ["--k", "5"]
    assert PLUGIN.resolved_options(_args(), Dataset("mine", np.zeros((4, 2)), None, None)) == ["--k", "3"]


def test_split_gives_each_client_its_raw_rows_as_the_run_cuts_them():
    args = _args("--clients", "3", "--partition", "noniid", "--removals", "0")
    dataset = load_dataset("iris")
    parts = PLUGIN.split(args, dataset)
    assert list(parts) == ["client-0", "client-1", "client-2"]
    pooled = np.concatenate([part.x for part in parts.values()])
    assert sorted(map(tuple, pooled.tolist())) == sorted(map(tuple, dataset.x.tolist()))  # the raw rows, cut
    for part in parts.values():
        assert (part.name, part.paper_k) == ("iris", 3) and part.x.dtype == np.float64
    plan = PLUGIN.plan(args, dataset)  # its machines hold the plan's session: the run's
    results = _run({p: plan.make_machine(p) for p in (SERVER, *parts)}, plan.session)[0]
    for c, party in enumerate(parts):  # each client's ids number its own rows after the earlier clients'
        start = sum(part.n for part in list(parts.values())[:c])
        assert results[party].ids.tolist() == list(range(start, start + parts[party].n))


# --- through the command line, one OS process per party, over TCP ------------------------------------


@pytest.mark.slow
def test_split_provision_and_one_party_process_each_over_tcp_equal_the_memory_run(tmp_path):
    # a client's --k comes from its file (iris's paper K); the server, without one, is told
    run = run_over_tcp("mufc", ["--data", "iris", "--clients", "3", "--seed", "1", "--removals", "2", "--leave", "1",
                                "--n-init", "2"],
                       ["--removals", "2", "--leave", "1", "--n-init", "2", "--seed", "1", "--deadline", "60"], tmp_path,
                       hub_argv=["--k", "3"], run_only=["--no-timing", "--no-baselines"], timeout_s=300)
    memory, docs, parties = run.memory, run.docs, list(run.memory.parties)
    assert [entry["party"] for entry in run.manifest["files"]] == ["client-0", "client-1", "client-2"]
    # results: the server ends with the memory run's model and decoded count; one client left
    server = docs[SERVER]["result"]
    assert server["centroids"] == memory.results["centroids"]
    assert server["totals"][-1] == memory.results["n_points_decoded"]
    assert sum(docs[p]["result"]["left"] for p in parties[1:]) == memory.results["n_clients_left"] == 1
    # payload bytes: the union of the parties' own reports is the memory run's, link by link
    assert link_costs(run.merged) == link_costs(memory)
    assert run.merged.payload_bytes == memory.payload_bytes and run.merged.setup_bytes == memory.setup_bytes
