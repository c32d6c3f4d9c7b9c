"""Issue 10, part 1, for kzcenter, kzmedian and kzmeans: each party holds only its own data.

The simulation's plan (every party in one process) and the plans of parties that each hold only
their own file (``split`` written with ``save_dataset``, read back with ``load_dataset``, and
``plan_party``) build the same machines, so their results and payload bytes per link are equal;
``--normalize minmax`` adds the metered setup phase ``setup.data`` whose bytes follow the
formula of the docs; a machine whose data has another number of features is refused by name.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401  (turns on JAX's 64-bit mode)
from fedproto import cli as core_cli
from fedproto.algorithms.kzclustering.cli import KZCENTER, KZMEANS, KZMEDIAN, prepare_data
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.means import KzMeansConfig, KzMeansCoordinator, KzMeansMachine
from fedproto.algorithms.kzclustering.messages import DataSummary, FederationSummary
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine
from fedproto.algorithms.kzclustering.setup import SETUP_PHASE
from fedproto.codec import encode_frame
from fedproto.data import Dataset, load_dataset, normalize
from fedproto.errors import InsufficientParticipants, RemoteProtocolError
from fedproto.metering import Meter, RunReport
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.testing import other_feature_count, plan_per_party, run_over_tcp
from fedproto.testing.faults import Faults
from fedproto.transports.memory import MemoryNetwork

PLUGINS = {"kzcenter": KZCENTER, "kzmedian": KZMEDIAN, "kzmeans": KZMEANS}
#: a small run of every plugin: iris, 3 machines, 5 injected outliers
RUN = ["--data", "iris", "--machines", "3", "--k", "3", "--z", "5", "--inject-outliers", "5", "--compare", "none",
       "--seed", "3"]


def parse_run(plugin, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    core_cli._common_arguments(parser, party=False)
    plugin.add_arguments(parser)
    return parser.parse_args(argv)


def parse_party(plugin, argv: list[str], party: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    core_cli._common_arguments(parser, party=True, local_data=True)
    plugin.add_arguments(parser)
    return parser.parse_args([*argv, "--party", party, "--roster", "unused.json"])


async def run_machines(machines: dict, session: int) -> tuple[dict, RunReport]:
    meter = Meter()
    results = await run_parties(machines, MemoryNetwork(list(machines)), config=RuntimeConfig(session=session),
                                meter=meter)
    return results, meter.report(protocol="kz", transport="memory", session=session, parties=list(machines))


# --- 1. the simulation and the per-party plans agree ----------------------------------------------------------


@pytest.mark.parametrize("scale", [False, True], ids=["raw", "normalize"])
@pytest.mark.parametrize("name", sorted(PLUGINS))
async def test_per_party_plans_give_the_simulations_results_and_bytes(tmp_path, name, scale):
    plugin = PLUGINS[name]
    run_argv = [*RUN, *(["--normalize"] if scale else [])]
    args, dataset = parse_run(plugin, run_argv), load_dataset("iris")
    plan = plugin.plan(args, dataset)
    simulated, simulated_report = await run_machines({p: plan.make_machine(p) for p in plan.roster}, plan.session)
    # each party's machine from its own plan (plan_party), given only its own file read back
    built = plan_per_party(name, run_argv, tmp_path)
    assert all(own.roster == plan.roster and own.session == plan.session for own in built.plans.values())
    own, own_report = await run_machines(built.machines(), plan.session)
    as_json = {p: plan.result_to_json(p, r) for p, r in simulated.items()}
    assert {p: plan.result_to_json(p, r) for p, r in own.items()} == as_json
    assert own_report.links == simulated_report.links  # payload bytes per (round, phase, sender, receiver, tag)
    assert own_report.payload_bytes == simulated_report.payload_bytes > 0
    phases = {link.phase for link in own_report.links}
    assert (SETUP_PHASE in phases) == scale and (plan.phases[0] == SETUP_PHASE) == scale
    # the split holds every point once, raw (the outliers injected, nothing scaled)
    parts = plugin.split(args, dataset)
    pooled, _ = prepare_data(parse_run(plugin, [*RUN]), dataset)
    assert list(parts) == [p for p in plan.roster if p != COORDINATOR]
    assert sorted(map(tuple, np.concatenate([p.x for p in parts.values()]))) == sorted(map(tuple, pooled.x))
    assert all(part.name == "iris+5" for part in parts.values())
    summary = plan.summarize(as_json)
    assert summary["n_points"] == 155 and summary["n_outliers"] == as_json[COORDINATOR]["outliers"]


async def test_the_machines_work_on_the_pooled_scaling_and_the_setup_is_metered_apart(tmp_path):
    """With ``--normalize`` each machine scales its own part by the agreed extent: the algorithm's
    frames and words are those of machines given the pooled data scaled at once (the paper's words
    unchanged), and the setup's frames come on top, as setup."""
    args, dataset = parse_run(KZCENTER, [*RUN, "--normalize", "--sub-machines", "1"]), load_dataset("iris")
    plan = KZCENTER.plan(args, dataset)
    results, report = await run_machines({p: plan.make_machine(p) for p in plan.roster}, plan.session)
    # each machine's rows: its raw part scaled by the whole set's extent, i.e. the pooled scaling
    split = KZCENTER.split(args, dataset)
    raw = np.concatenate([p.x for p in split.values()])
    parts = [normalize(p.x, extent=(raw.min(axis=0), raw.max(axis=0))) for p in split.values()]
    np.testing.assert_array_equal(np.concatenate(parts), normalize(raw))
    config = KzCenterConfig(k=3, z=5, eps=0.1, n_machines=3, d=4)  # RUN's options, the default slack
    names = [p for p in plan.roster if p != COORDINATOR]
    direct = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=names)}
    direct.update({n: KzMachine(n, config=config, points=x) for n, x in zip(names, parts)})
    expected, direct_report = await run_machines(direct, plan.session)
    np.testing.assert_array_equal(results[COORDINATOR].centres, expected[COORDINATOR].centres)
    assert results[COORDINATOR].words == expected[COORDINATOR].words  # the paper's words, setup apart
    algorithm = tuple(link for link in report.links if link.phase != SETUP_PHASE)
    assert algorithm == direct_report.links
    assert report.setup_bytes == report.payload_bytes - direct_report.payload_bytes > 0


# --- 3. the setup phase's bytes ---------------------------------------------------------------------------------


def _envelope(message_cls, d: int, session: int) -> int:
    """A setup frame's bytes beyond its ``[2, d]`` float64 extent (encoded independently)."""
    zeros = np.zeros((2, d))
    frame = encode_frame(message_cls(extent=zeros), session=session, round_idx=0, phase=SETUP_PHASE)
    return len(frame) - zeros.nbytes


@pytest.mark.parametrize(("name", "m", "d"), [("kzcenter", 3, 4), ("kzmeans", 2, 3), ("kzmedian", 4, 2)])
async def test_setup_bytes_follow_the_formula(name, m, d):
    """``setup.data``: m frames up and m down, each a ``[2, d]`` float64 extent and an envelope:
    ``16 d`` bytes of payload each, ``32 d m`` in all, plus ``m`` envelopes each way (the docs'
    formula); 4 d m words; one communication round, and no algorithm round."""
    plugin = PLUGINS[name]
    argv = ["--synthetic", "60", "--synthetic-d", str(d), "--machines", str(m), "--k", "2", "--z", "2",
            "--compare", "none", "--normalize", "minmax"]
    args = parse_run(plugin, argv)
    plan = plugin.plan(args, Dataset("unused", np.zeros((1, 1)), None, None))
    _, report = await run_machines({p: plan.make_machine(p) for p in plan.roster}, plan.session)
    setup = [link for link in report.links if link.phase == SETUP_PHASE]
    up, down = _envelope(DataSummary, d, plan.session), _envelope(FederationSummary, d, plan.session)
    assert up <= 80 and down <= 80
    assert report.setup_bytes == sum(link.payload_bytes for link in setup) == 32 * d * m + m * (up + down)
    assert sorted((link.sender, link.receiver) for link in setup) == sorted(
        [(f"machine-{i}", COORDINATOR) for i in range(m)] + [(COORDINATOR, f"machine-{i}") for i in range(m)]
    )
    assert all(link.round_idx == 0 and link.messages == 1 for link in setup)
    without = plugin.plan(parse_run(plugin, argv[:-2]), Dataset("unused", np.zeros((1, 1)), None, None))
    _, plain = await run_machines({p: without.make_machine(p) for p in without.roster}, without.session)
    assert plain.setup_bytes == 0 and report.communication_rounds == plain.communication_rounds + 1
    assert report.algorithm_rounds == plain.algorithm_rounds


# --- 4. bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [False, True], ids=["raw", "normalize"])
@pytest.mark.parametrize("name", sorted(PLUGINS))
async def test_a_machine_with_another_feature_count_is_refused_by_name(tmp_path, name, scale):
    """Without ``--normalize`` the coordinator compares the machines' first points (the extents'
    anchors); with it, the setup's extents. Either way the odd machine is named."""
    run_argv = [*RUN, *(["--normalize"] if scale else [])]
    built = plan_per_party(name, run_argv, tmp_path, tamper=other_feature_count("machine-1", 1))  # one too many
    machines, plan = built.machines(), built.plan
    with pytest.raises(RemoteProtocolError, match="machine-1 has 5 features where the other machines have 4") as err:
        await run_machines(machines, plan.session)
    assert err.value.party == "machine-1"
    assert err.value.phase == (SETUP_PHASE if scale else "extent")


async def test_with_radius_bounds_the_feature_count_is_checked_on_the_first_points(tmp_path):
    """No extent round: the coordinator learns d from the first fetched points."""
    run_argv = [*RUN, "--radius-bounds", "0.05", "10"]
    args, dataset = parse_run(KZCENTER, run_argv), load_dataset("iris")
    plan = KZCENTER.plan(args, dataset)
    good, _ = await run_machines({p: plan.make_machine(p) for p in plan.roster}, plan.session)
    assert good[COORDINATOR].centres.shape == (3, 4)
    machines = plan_per_party("kzcenter", run_argv, tmp_path, tamper=other_feature_count("machine-2", 1)).machines()
    with pytest.raises(RemoteProtocolError, match="machine-2 has 5 features") as err:
        await run_machines(machines, plan.session)
    assert err.value.party == "machine-2" and err.value.phase == "points"


async def test_a_machine_silent_in_the_setup_fails_the_coordinator_naming_it():
    """The setup uses the runtime's phase deadline: a machine that crashes before its data summary
    leaves the coordinator waiting, and the deadline names it."""
    args = parse_run(KZMEANS, [*RUN, "--normalize"])
    plan = KZMEANS.plan(args, load_dataset("iris"))
    network = MemoryNetwork(list(plan.roster), faults=Faults(crash_at={"machine-2": (SETUP_PHASE, 0)}))
    machines = {p: plan.make_machine(p) for p in plan.roster}
    with pytest.raises(InsufficientParticipants, match="machine-2") as err:
        await run_parties(machines, network, config=RuntimeConfig(session=plan.session, deadline_s=0.5))
    assert err.value.missing == ("machine-2",) and err.value.phase == SETUP_PHASE


def test_two_machines_that_disagree_are_both_named():
    from fedproto.algorithms.kzclustering.setup import agree_feature_count

    with pytest.raises(RemoteProtocolError, match=r"machine-0 has 4, machine-1 has 5"):
        agree_feature_count({"machine-0": 4, "machine-1": 5})
    with pytest.raises(RemoteProtocolError, match="machine-1 has 5 features") as err:
        agree_feature_count({"machine-0": 4, "machine-1": 5}, 4)
    assert err.value.party == "machine-1"
    assert agree_feature_count({"machine-0": 4, "machine-1": 4, "machine-2": 4}) == 4


@pytest.mark.parametrize(
    ("party", "argv", "data", "match"),
    [
        ("coordinator", ["--sub-machines", "1"], "iris", "holds no data"),
        ("machine-0", ["--sub-machines", "1"], None, "give its own file with --data"),
        ("machine-0", [], "iris", "--sub-machines auto needs the largest machine"),
        ("machine-0", ["--sub-machines", "1", "--machines", "4"], "iris", "--machines 4 but the roster names 3"),
        ("machine-0", ["--sub-machines", "1", "--slack", "2"], "iris", "slack"),
    ],
)
def test_plan_party_refuses_what_it_cannot_run(party, argv, data, match):
    roster = ("coordinator", "machine-0", "machine-1", "machine-2")
    given = load_dataset(data) if data else None
    with pytest.raises(ValueError, match=match):
        KZCENTER.plan_party(parse_party(KZCENTER, ["--k", "3", *argv], party), party, roster, 7, given)


def test_plan_party_builds_only_its_own_party_and_the_coordinator_learns_d():
    roster = ("coordinator", "machine-0", "machine-1")
    for plugin, config_cls in ((KZCENTER, KzCenterConfig), (KZMEANS, KzMeansConfig)):
        args = parse_party(plugin, ["--k", "3", "--sub-machines", "1"] if plugin is KZCENTER else ["--k", "3"],
                           "coordinator")
        plan = plugin.plan_party(args, "coordinator", roster, 7, None)
        assert plan.roster == roster and plan.session == 7 and plan.summarize({}) == {}
        coordinator = plan.make_machine("coordinator")
        assert isinstance(coordinator.config, config_cls) and coordinator.config.d is None
        assert isinstance(coordinator, KzCoordinator | KzMeansCoordinator)
        with pytest.raises(ValueError, match="cannot build machine-0"):
            plan.make_machine("machine-0")
        args = parse_party(plugin, ["--k", "3", "--sub-machines", "1"] if plugin is KZCENTER else ["--k", "3"],
                           "machine-1")
        machine = plugin.plan_party(args, "machine-1", roster, 7, load_dataset("wine")).make_machine("machine-1")
        assert isinstance(machine, KzMachine | KzMeansMachine) and machine.config.d == 13


def test_resolved_options_spell_out_the_auto_sub_machine_count():
    dataset = load_dataset("iris")
    assert KZCENTER.resolved_options(parse_run(KZCENTER, RUN), dataset) == ["--sub-machines", "1"]
    big = parse_run(KZCENTER, ["--synthetic", "25000", "--synthetic-d", "2", "--machines", "2", "--k", "2"])
    assert KZCENTER.resolved_options(big, dataset) == ["--sub-machines", "2"]  # 12,500 points per machine
    assert KZCENTER.resolved_options(parse_run(KZCENTER, [*RUN, "--sub-machines", "3"]), dataset) == []
    assert KZMEANS.resolved_options(parse_run(KZMEANS, RUN), dataset) == []


# --- 2. the command line over TCP, one process per party ----------------------------------------------------------


@pytest.mark.slow  # 110 to 140 s here (5 processes, each starting JAX, on 2 shared cores)
def test_split_files_and_one_party_process_each_over_tcp_match_the_memory_run(tmp_path):
    """``fedproto split``, ``fedproto provision`` (TLS, star) and one ``fedproto party`` process per
    party, each machine given only its own file: the parties' results and payload bytes per link
    are the memory run's, setup phase included."""
    options = ["--machines", "3", "--k", "3", "--z", "5", "--eps", "0.5", "--inject-outliers", "5", "--normalize",
               "--sub-machines", "1", "--compare", "none", "--seed", "2"]
    run = run_over_tcp("kzcenter", ["--data", "iris", *options], [*options, "--deadline", "60"], tmp_path,
                       run_only=["--deadline", "60", "--no-plot"], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    memory = json.loads((tmp_path / "memory.json").read_text())
    manifest, docs, parties = run.manifest, run.docs, memory["parties"]
    assert [entry["party"] for entry in manifest["files"]] == parties[1:]
    assert run.merged.to_dict()["links"] == memory["links"]  # the report's own JSON form of each link
    assert run.merged.setup_bytes == memory["setup_bytes"] > 0
    result, summary = docs[COORDINATOR]["result"], memory["results"]
    assert result["centres"] == summary["centres"] and result["radius"] == summary["radius"]
    assert result["outliers"] == summary["n_outliers"] == sum(docs[p]["result"]["outliers"] for p in parties[1:])
    assert result["total_words"] == summary["words_total"] and result["grid_size"] == summary["grid_size"]
    assert [docs[p]["result"]["n_points"] for p in parties[1:]] == [e["n_points"] for e in manifest["files"]]
