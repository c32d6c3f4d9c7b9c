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

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from fedproto import registry
from fedproto.algorithms.fastlloyd.cli import setup_data_bytes
from fedproto.algorithms.fastlloyd.config import FastLloydOptions
from fedproto.algorithms.fastlloyd.messages import DataSummary, FederationSummary
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.cli import build_parser
from fedproto.codec import encode_frame
from fedproto.data import Dataset, load_dataset, normalize, partition, save_dataset
from fedproto.errors import FedProtoError, RemoteProtocolError
from fedproto.metering import RunReport
from fedproto.testing import link_costs, load_file, run_in_memory
from fedproto.testing.harness import Harness

PLUGIN = registry.load_protocol("fastlloyd")
helpers = load_file(Path(__file__).resolve().parents[2] / "_helpers.py", "tests_helpers")
FEDPROTO = helpers.FEDPROTO
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


def _run(machines: dict, session: int) -> tuple[dict, RunReport]:
    return run_in_memory(machines, session, deadline_s=60, protocol="fastlloyd")


def _per_party_plans(args, dataset, tmp_path: Path, roster, session):
    """Every party's plan as a separate process would build it: its own file, read back. The
    clients run without ``--k`` (their files record iris's paper k); the server, which holds no
    file, gets the ``resolved_options`` the TCP launcher passes."""
    files = {party: save_dataset(tmp_path / f"{party}.npz", part) for party, part in PLUGIN.split(args, dataset).items()}
    own = copy.copy(args)
    own.k = None
    resolved = build_parser(["run", "fastlloyd", *PLUGIN.resolved_options(own, dataset)]).parse_args(
        ["run", "fastlloyd", *PLUGIN.resolved_options(own, dataset)]
    )
    server = copy.copy(own)
    server.k = resolved.k
    return {
        party: PLUGIN.plan_party(own, party, roster, session, load_dataset(str(files[party])))
        if party in files
        else PLUGIN.plan_party(server, party, roster, session, None)
        for party in roster
    }


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_per_party_plans_give_the_simulations_results_and_bytes(tmp_path, case):
    args = _args(*CASES[case])
    dataset = load_dataset("iris")
    simulation = PLUGIN.plan(args, dataset)
    sim_results, sim_report = _run({p: simulation.make_machine(p) for p in simulation.roster}, simulation.session)

    plans = _per_party_plans(args, dataset, tmp_path, simulation.roster, simulation.session)
    assert all(plan.roster == simulation.roster and plan.session == simulation.session for plan in plans.values())
    results, report = _run({p: plans[p].make_machine(p) for p in simulation.roster}, simulation.session)

    for party in simulation.roster:
        assert plans[party].result_to_json(party, results[party]) == simulation.result_to_json(
            party, sim_results[party]
        ), party
    assert link_costs(report) == link_costs(sim_report)  # payload bytes per link, phase and round
    assert report.payload_bytes == sim_report.payload_bytes and report.setup_bytes == sim_report.setup_bytes
    # the server learnt N and d in setup.data; the summary is the pooled data's
    server = simulation.result_to_json("server", sim_results["server"])
    assert (server["n_points"], server["d"]) == (dataset.n, dataset.d)
    summary = simulation.summarize({p: simulation.result_to_json(p, r) for p, r in sim_results.items()})
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
    _, report = _run({p: plan.make_machine(p) for p in plan.roster}, plan.session)
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
    args = _args("--k", "3")
    dataset = load_dataset("iris")
    simulation = PLUGIN.plan(args, dataset)
    parts = PLUGIN.split(args, dataset)
    part = parts["client-1"]
    parts["client-1"] = Dataset(part.name, part.x[:, :3], part.y, part.paper_k)  # a column short
    machines = {"server": PLUGIN.plan_party(args, "server", simulation.roster, simulation.session, None)
                .make_machine("server")}
    for party, data in parts.items():
        machines[party] = PLUGIN.plan_party(args, party, simulation.roster, simulation.session, data).make_machine(party)
    with pytest.raises(FedProtoError) as caught:
        _run(machines, simulation.session)
    error = caught.value
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


def _cli(argv: list[str], capsys) -> None:
    """``fedproto ARGV`` in this process (the same ``main`` as ``python -m fedproto``; JAX starts
    once for the reference run, the split and the kits)."""
    from fedproto.cli import main

    code = main(argv)
    assert code == 0, capsys.readouterr().err[-3000:]


def test_split_provision_and_one_party_process_each_over_tcp_equal_the_memory_run(tmp_path, capsys):
    run_options = ["--data", "iris", "--clients", "2", "--seed", "1", "--iterations", "3"]
    _cli(["run", "fastlloyd", *run_options, "--quiet", "--no-plot", "--report", str(tmp_path / "memory.json")],
         capsys)
    memory = RunReport.from_json((tmp_path / "memory.json").read_text())
    _cli(["split", "fastlloyd", *run_options, "--out", str(tmp_path / "parts")], capsys)
    manifest = json.loads((tmp_path / "parts" / "split.json").read_text())
    assert [entry["party"] for entry in manifest["files"]] == ["client-0", "client-1"]
    parties = list(memory.parties)
    # the memory run's session in the kits' roster: the envelopes (and with SecAgg+ its graph) carry it
    _cli(["provision", "--parties", ",".join(parties), "--hub", f"127.0.0.1:{helpers.free_port()}",
          "--session", str(memory.session), "--out", str(tmp_path / "kits")], capsys)
    party_options = ["--iterations", "3", "--seed", "1", "--deadline", "60"]
    commands = {}
    for party in parties:
        # a client's --k comes from its file (iris's paper k); the server, without one, is told
        own = ["--k", "3"] if party == "server" else ["--data", str(tmp_path / "parts" / f"{party}.npz")]
        commands[party] = [*FEDPROTO, "party", "fastlloyd", *party_options, *own, "--party", party,
                           "--roster", str(tmp_path / "kits" / party / "roster.json"),
                           "--party-report", str(tmp_path / f"{party}.json")]
    for party, (code, _, err) in helpers.run_party_processes(commands, tmp_path, timeout_s=180).items():
        assert code == 0, (party, err[-3000:])
    docs = {party: json.loads((tmp_path / f"{party}.json").read_text()) for party in parties}
    # results: every client ends with the memory run's centroids; the server agreed N and d
    for party in parties[1:]:
        assert docs[party]["result"]["centroids"] == memory.results["centroids"], party
    assert (docs["server"]["result"]["n_points"], docs["server"]["result"]["d"]) == (150, 4)
    # payload bytes: the union of the parties' own reports is the memory run's, link by link
    tcp = RunReport.merge([RunReport.from_dict(doc["report"]) for doc in docs.values()], transport="tcp")
    assert link_costs(tcp) == link_costs(memory)
    assert tcp.payload_bytes == memory.payload_bytes and tcp.setup_bytes == memory.setup_bytes
