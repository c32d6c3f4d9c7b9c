"""Each party holds only its own data (issue 10, part 1; the contract in docs/protocols/fastlloyd.md,
"Each party's own data").

* the per-party plans (``split`` into files, ``plan_party`` for every party, each given only its
  file read back) give the simulation's results and the same payload bytes on every link, for
  every variant and with SecAgg+;
* a machine built from the options and raw rows gives what one built from a ready config and the
  pooled data normalised at once gives, also for a client with no point;
* the ``setup.data`` bytes are ``32 M d`` plus one envelope per frame;
* a party whose file has another number of features is refused, named, in ``setup.data``;
* through the real command line over TCP: ``fedproto split``, ``fedproto provision`` and one
  ``fedproto party --data FILE`` process per party agree with ``fedproto run --transport memory``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedproto import registry
from fedproto.algorithms.fastlloyd.cli import setup_data_bytes
from fedproto.algorithms.fastlloyd.config import FastLloydOptions
from fedproto.algorithms.fastlloyd.messages import DataSummary, FederationSummary
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.cli import build_parser
from fedproto.codec import encode_frame
from fedproto.data import Dataset, load_dataset, normalize, partition
from fedproto.errors import RemoteProtocolError
from fedproto.testing import link_costs, run_in_memory, run_over_tcp, run_per_party
from fedproto.testing.harness import Harness
from fedproto.testing.local_data import run_with_other_feature_count

PLUGIN = registry.load_protocol("fastlloyd")
#: iris, 3 clients, 2 iterations: small and fast, every phase present
BASE = ["--data", "iris", "--clients", "3", "--iterations", "2", "--seed", "4"]
CASES = {
    "fastlloyd": [],
    "lloyd": ["--variant", "lloyd"],
    "glloyd": ["--variant", "glloyd"],
    "sulloyd": ["--variant", "sulloyd", "--partition", "uneven"],
    "secagg-plus": ["--secagg", "plus"],
}


def _args(*extra: str):
    argv = ["run", "fastlloyd", *BASE, *extra]
    return build_parser(argv).parse_args(argv)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_per_party_plans_give_the_simulations_results_and_bytes(tmp_path, case):
    # every party's plan as ``fedproto party`` builds it from its own file, read back: the clients
    # run without --k (their files record iris's paper k); the server, which holds no file, gets
    # the resolved_options the TCP launcher passes
    run = run_per_party("fastlloyd", [*BASE, *CASES[case]], tmp_path, resolved_to_data_holders=False)
    simulation, dataset, report, sim_report = run.plans.plan, run.plans.dataset, run.per_party_report, run.simulation_report
    assert all(plan.roster == simulation.roster and plan.session == simulation.session
               for plan in run.plans.plans.values())
    assert run.per_party_results == run.simulation_results
    assert run.per_party_links == run.simulation_links  # payload bytes per link, phase and round
    assert report.payload_bytes == sim_report.payload_bytes and report.setup_bytes == sim_report.setup_bytes
    # the server learnt N and d in setup.data; the summary is the pooled data's
    server = run.simulation_results["server"]
    assert (server["n_points"], server["d"]) == (dataset.n, dataset.d)
    summary = simulation.summarize(run.simulation_results)
    assert summary["clients_agree"] is True and summary["n_points"] == dataset.n


def test_raw_rows_and_options_equal_a_ready_config_on_the_pooled_normalised_data():
    """What setup.data agrees is what normalising the pooled data at once gives, bit for bit,
    also when one client holds no point (a label-skewed split can leave one empty)."""
    rng = np.random.default_rng(3)
    raw = np.concatenate([rng.normal(c, 2.0, size=(40, 3)) * (1, 10, 0.1) for c in (0, 5, 9)])
    parts = [np.arange(0, 50), np.arange(50, 50), np.arange(50, 120)]  # client-1 is empty
    clients = ["client-0", "client-1", "client-2"]
    options = FastLloydOptions(variant="fastlloyd", k=3, epsilon=2.0, init_seed=1)
    config = options.config(len(raw), 3)
    pooled = normalize(raw)

    def machines(ready: bool) -> dict:
        kind = {"config": config} if ready else {"options": options}
        out = {"server": FastLloydServer("server", clients=clients, noise_seed=9, session=5, **kind)}
        for i, c in enumerate(clients):
            points = pooled[parts[i]] if ready else raw[parts[i]]
            out[c] = FastLloydClient(c, server="server", clients=clients, points=points, entropy=bytes([i + 1]) * 32,
                                     session=5, **kind)
        return out

    with_setup = Harness(machines(False), session=5)
    got = with_setup.run()
    expected = Harness(machines(True), session=5).run()
    for c in clients:
        assert np.array_equal(got[c].centroids, expected[c].centroids)
        assert np.array_equal(got[c].history, expected[c].history)
    assert got["client-0"].centroids.shape == (3, 3)
    assert with_setup.machines["client-1"].config == config and with_setup.machines["server"].n_points == 120
    assert got["server"].n_points == 120 and expected["server"].n_points is None


def _envelope(message_cls, n_points: int, d: int, session: int) -> int:
    """Encoded frame length minus the raw bytes of a zero ``float64 [2, d]`` extent."""
    extent = np.zeros((2, d))
    frame = encode_frame(message_cls(n_points=n_points, extent=extent), session=session, round_idx=0, phase="setup.data")
    return len(frame) - extent.nbytes


@pytest.mark.parametrize("data, clients", [("iris", 3), ("wine", 5)])
def test_setup_data_bytes_are_32_M_d_plus_one_envelope_per_frame(data, clients):
    argv = ["run", "fastlloyd", "--data", data, "--clients", str(clients), "--iterations", "1"]
    args = build_parser(argv).parse_args(argv)
    dataset = load_dataset(data)
    plan = PLUGIN.plan(args, dataset)
    _, report = run_in_memory({p: plan.make_machine(p) for p in plan.roster}, plan.session, deadline_s=60,
                              protocol="fastlloyd")
    links = [link for link in report.links if link.phase == "setup.data"]
    assert plan.analytic["analytic_setup_data_bytes"] == setup_data_bytes(clients, dataset.d) == 32 * clients * dataset.d
    assert sum(link.messages for link in links) == 2 * clients
    counts = [part.n for part in PLUGIN.split(args, dataset).values()]
    envelopes = sum(_envelope(DataSummary, n_i, dataset.d, plan.session) for n_i in counts)
    envelopes += clients * _envelope(FederationSummary, dataset.n, dataset.d, plan.session)
    assert sum(link.payload_bytes for link in links) == setup_data_bytes(clients, dataset.d) + envelopes
    assert envelopes <= 2 * clients * 56  # about 50 bytes per frame: tag, session, round, phase, count, array header
    # setup.data comes first and is metered as setup: with the key setup, 4M + 1 frames of
    # 32 M d + 64 M + 128 (M - 1) data bytes (docs/protocols/fastlloyd.md)
    assert plan.phases[0] == "setup.data"
    assert all(link.round_idx == 0 for link in links)
    setup = [link for link in report.links if link.phase.startswith("setup")]
    assert sum(link.messages for link in setup) == 4 * clients + 1
    assert report.setup_bytes == sum(link.payload_bytes for link in setup)
    assert report.setup_bytes > 32 * clients * dataset.d + 64 * clients + 128 * (clients - 1)


def test_a_party_with_another_number_of_features_is_refused_naming_it(tmp_path):
    error, machines = run_with_other_feature_count("fastlloyd", [*BASE, "--k", "3"], tmp_path,
                                                   party="client-1", change=-1)  # a column short
    assert isinstance(error, RemoteProtocolError) and error.party == "client-1", error
    assert "client-1 (3)" in str(error) and "(4)" in str(error) and "same features" in str(error)
    assert machines["server"].failed and error.phase == "setup.data" and error.round_idx == 0


def test_plan_party_refuses_what_it_cannot_know(tmp_path):
    args = _args()
    roster = ("server", "client-0", "client-1")
    unnamed = Dataset("mine", np.zeros((4, 2)), None, None)
    args.k = None
    with pytest.raises(ValueError, match="--k is required when a party holds only its own data"):
        PLUGIN.plan_party(args, "client-0", roster, 1, unnamed)
    with pytest.raises(ValueError, match="--k is required"):
        PLUGIN.plan_party(args, "server", roster, 1, None)
    args.k = 2
    with pytest.raises(ValueError, match="client-0 is a client: give it its own data with --data FILE"):
        PLUGIN.plan_party(args, "client-0", roster, 1, None)
    with pytest.raises(ValueError, match="not in the roster"):
        PLUGIN.plan_party(args, "client-9", roster, 1, unnamed)
    plan = PLUGIN.plan_party(args, "server", roster, 1, None)
    assert plan.max_frame_bytes is None  # the server learns d only in setup.data
    client = PLUGIN.plan_party(args, "client-0", roster, 1, unnamed)
    assert client.max_frame_bytes is not None and client.summarize({}) == {}
    # only --k's default depends on the whole data set: the paper's k, else 3
    assert PLUGIN.resolved_options(_args("--k", "5"), load_dataset("iris")) == []
    assert PLUGIN.resolved_options(_args(), load_dataset("digits")) == ["--k", "10"]
    assert PLUGIN.resolved_options(_args(), Dataset("mine", np.zeros((4, 2)), None, None)) == ["--k", "3"]


def test_split_gives_each_client_its_raw_rows_by_the_runs_partition():
    args = _args("--partition", "label-skew")
    dataset = load_dataset("iris")
    parts = PLUGIN.split(args, dataset)
    indices = partition(dataset.n, 3, scheme="label-skew", seed=4, labels=dataset.y)
    assert list(parts) == ["client-0", "client-1", "client-2"]
    for (party, part), idx in zip(parts.items(), indices):
        assert np.array_equal(part.x, dataset.x[idx]) and np.array_equal(part.y, dataset.y[idx])
        assert (part.name, part.paper_k) == ("iris", 3)


# --- through the command line, one OS process per party, over TCP ------------------------------------


def test_split_provision_and_one_party_process_each_over_tcp_equal_the_memory_run(tmp_path):
    # run, split and provision in this process (JAX starts once); a client's --k comes from its
    # file (iris's paper k); the server, without one, is told
    run = run_over_tcp("fastlloyd", ["--data", "iris", "--clients", "2", "--seed", "1", "--iterations", "3"],
                       ["--iterations", "3", "--seed", "1", "--deadline", "60"], tmp_path, hub_argv=["--k", "3"],
                       run_only=["--no-plot"], in_process=True, timeout_s=180)
    memory, docs = run.memory, run.docs
    assert [entry["party"] for entry in run.manifest["files"]] == ["client-0", "client-1"]
    # results: every client ends with the memory run's centroids; the server agreed N and d
    for party in list(memory.parties)[1:]:
        assert docs[party]["result"]["centroids"] == memory.results["centroids"], party
    assert (docs["server"]["result"]["n_points"], docs["server"]["result"]["d"]) == (150, 4)
    # payload bytes: the union of the parties' own reports is the memory run's, link by link
    assert link_costs(run.merged) == link_costs(memory)
    assert run.merged.payload_bytes == memory.payload_bytes and run.merged.setup_bytes == memory.setup_bytes
