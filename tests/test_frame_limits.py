"""Per-run frame limits: the largest frame a party accepts follows from its protocol's shapes.

Issue 14 ("bounded decoding cost"): each plugin states, in its plan, the largest frame any party
of the run can legitimately send (:attr:`fedproto.plugin.RunPlan.max_frame_bytes`, computed with
:func:`fedproto.max_frame_bytes` from the run's options and data sizes), and the CLI makes every
party refuse larger frames. These tests run each protocol on tiny data through the CLI over
memory, record every frame's size, and check that the bound holds (no honest frame is refused)
and that it is not loose beyond what the protocol's data-dependent sizes explain.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

import pytest
import trio

import fedproto._cli_run as cli_run
import fedproto.cli as cli
from fedproto import registry
from fedproto.framesize import abort_notice_frame_bytes
from fedproto.metering import Meter
from fedproto.plugin import RunPlan
from fedproto.testing import DelegatingTransport
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transport import Transport
from fedproto.transports.memory import MemoryNetwork

SMALL_RUN = ["--quiet", "--full", "--deadline", "30"]
KZ_DATA = ["--synthetic", "300", "--machines", "3", "--k", "4", "--z", "10", "--inject-outliers", "10",
           "--compare", "none"]


@dataclasses.dataclass(frozen=True)
class Case:
    protocol: str
    argv: tuple[str, ...]
    # How many times the largest observed frame the bound may be (plus 4 KiB); None: only that it
    # holds, for a run whose largest message depends on the data beyond what a plan can know.
    looseness: float | None = 2.0


CASES = {
    "fastlloyd": Case("fastlloyd", ("--data", "iris", "--clients", "3")),
    "mufc": Case("mufc", ("--data", "iris", "--clients", "3", "--removals", "2", "--no-timing", "--no-baselines")),
    # the bound is the largest client's upload, which the largest observed frame is
    "qkmeans": Case("qkmeans", ("--data", "iris", "--clients", "3", "--removals", "2", "--no-timing")),
    "qkmeans federated": Case(
        "qkmeans", ("--data", "iris", "--clients", "3", "--removals", "2", "--no-timing", "--federated")
    ),
    "dckmeans": Case("dckmeans", ("--data", "iris", "--removals", "2", "--no-timing")),
    "dckmeans weighted": Case("dckmeans", ("--data", "iris", "--removals", "2", "--no-timing", "--weighted")),
    # The grid's length depends on the machines' smallest distances, which the plan bounds from
    # the smallest gap between coordinates (exact distances would cost the machines' quadratic
    # work in every process); a fetch reply holds at most k m (1 + 1/slack) representatives per
    # guess, the protocol's own ceiling, and a machine sends as many as its data gives.
    "kzcenter": Case("kzcenter", tuple(KZ_DATA), looseness=4.0),
    # Every PASS2 guess in one fetch: how many guesses pass, and their representatives, depend on
    # the data; the bound is T guesses at the per-guess ceiling.
    "kzcenter all guesses at once": Case("kzcenter", (*KZ_DATA, "--probe-batch", "0"), looseness=None),
    # A machine's coresets hold its share of t samples per guess: all of them when the other
    # machines' costs are zero, so the bound counts t per guess for each machine (here 3 share
    # them), times the grid's bound (see kzcenter).
    "kzmeans": Case("kzmeans", tuple(KZ_DATA), looseness=8.0),
    "kzmedian": Case("kzmedian", ("--data", "iris", "--machines", "3", "--k", "3", "--z", "5", "--compare", "none"),
                     looseness=8.0),
}


@pytest.fixture
def observed(monkeypatch) -> dict[str, Any]:
    """Runs the CLI in this process, recording every frame's size, the plan and the report."""
    seen: dict[str, Any] = {"frames": {}, "plans": [], "reports": []}

    class RecordingMeter(Meter):
        def record_sent(self, round_idx, phase, sender, receiver, tag, nbytes, overhead=0):
            seen["frames"][tag] = max(seen["frames"].get(tag, 0), nbytes)
            super().record_sent(round_idx, phase, sender, receiver, tag, nbytes, overhead)

    frame_limit, print_run = cli._frame_limit, cli._print_run

    def spy_limit(plan, args):
        seen["plans"].append(plan)
        return frame_limit(plan, args)

    def spy_print(plan, args, summary, report, console):
        seen["reports"].append(report)
        print_run(plan, args, summary, report, console)

    # patched where `fedproto run` uses them
    monkeypatch.setattr(cli_run, "Meter", RecordingMeter)
    monkeypatch.setattr(cli_run, "_frame_limit", spy_limit)
    monkeypatch.setattr(cli_run, "_print_run", spy_print)
    return seen


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_largest_frame_follows_from_the_declared_shapes(observed, capsys, case):
    assert cli.main(["run", case.protocol, *case.argv, *SMALL_RUN]) == 0, capsys.readouterr().err
    plan = observed["plans"][0]
    largest = max(observed["frames"].values())
    assert plan.max_frame_bytes is not None
    assert largest <= plan.max_frame_bytes, observed["frames"]
    if case.looseness is not None:
        assert plan.max_frame_bytes <= case.looseness * largest + 4096, observed["frames"]
    # every party ran under the plan's limit (raised to fit the runtime's abort notice), and the
    # report says so beside the option the user gave
    (report,) = observed["reports"]
    in_force = max(plan.max_frame_bytes, abort_notice_frame_bytes(plan.roster))
    assert report.options["max_frame_bytes_in_force"] == in_force
    assert report.options["max_frame_bytes"] == 256 * 1024 * 1024 and report.rejected_frames == 0
    assert re.search(rf"largest frame accepted \(bytes\)\s*│\s*{in_force:,}\s*│", capsys.readouterr().out)


def test_a_smaller_user_limit_wins(observed, capsys):
    # the plan lowers the limit, never raises it: a user's smaller --max-frame-bytes stays in force
    # (this run's frames are far smaller than both)
    argv = ["run", "dckmeans", "--data", "iris", "--removals", "1", "--no-timing", "--max-frame-bytes", "4000"]
    assert cli.main([*argv, *SMALL_RUN]) == 0, capsys.readouterr().err
    (report,) = observed["reports"]
    assert report.options["max_frame_bytes_in_force"] == 4000 and report.options["max_frame_bytes"] == 4000


class SendsFramesFirst(DelegatingTransport):
    """A party's endpoint that first sends ``frames`` to ``dest``, then behaves as ``inner``."""

    def __init__(self, inner: Transport, dest: str, frames: list[bytes]) -> None:
        super().__init__(inner)
        self.dest, self.frames = dest, list(frames)

    async def send(self, dest: str, frame: bytes) -> None:
        while self.frames:
            await self.inner.send(self.dest, self.frames.pop(0))
        await self.inner.send(dest, frame)


async def test_a_frame_one_byte_above_the_plans_limit_is_refused_by_its_receiver():
    # one client uploads all of iris (150 x 4 float64): the plan's bound, above the abort notice's
    argv = ["run", "qkmeans", "--data", "iris", "--clients", "1", "--removals", "1", "--no-timing"]
    args = cli._parse(argv)
    plugin = registry.load_protocol("qkmeans")
    plan = plugin.plan(args, cli._dataset(plugin, args))
    limit = cli._frame_limit(plan, args)
    assert limit == plan.max_frame_bytes > abort_notice_frame_bytes(plan.roster)
    # the transport carries both frames; the server's runtime decides
    network = MemoryNetwork(plan.roster, max_frame_bytes=limit + 1)
    meter = Meter(trio.current_time)
    machines = {p: plan.make_machine(p) for p in plan.roster}
    async with network.endpoints() as endpoints:
        endpoints = dict(endpoints)
        endpoints["client-0"] = SendsFramesFirst(endpoints["client-0"], "server", [bytes(limit), bytes(limit + 1)])
        config = RuntimeConfig(session=plan.session, deadline_s=30, max_frame_bytes=limit)
        results = await run_parties(machines, endpoints, config=config, meter=meter)
    assert results["server"].centroids.shape == (3, 4)  # the run went on
    assert meter.rejected_frames == 2
    at_limit, above = meter.rejected
    assert at_limit["sender"] == above["sender"] == "client-0"
    assert above["cause"] == "undecodable frame"
    assert f"frame of {limit + 1} bytes exceeds the maximum of {limit}" in above["reason"]
    assert "exceeds the maximum" not in at_limit["reason"]  # read and refused as garbage, not for its size


def _plan(**kwargs: Any) -> RunPlan:
    return RunPlan(roster=("a", "b"), session=1, make_machine=lambda p: None, result_to_json=lambda p, r: {},
                   summarize=lambda r: {}, role_of=str, iterations=1, **kwargs)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "100"])
def test_a_plan_states_a_positive_whole_limit_or_none(bad):
    with pytest.raises(ValueError, match="RunPlan.max_frame_bytes must be a positive int or None"):
        _plan(max_frame_bytes=bad)


def test_without_a_stated_limit_the_users_option_is_in_force():
    args = argparse.Namespace(max_frame_bytes=12_345)
    assert cli._frame_limit(_plan(), args) == 12_345
    assert cli._frame_limit(_plan(max_frame_bytes=10), args) == abort_notice_frame_bytes(("a", "b"))
    assert cli._frame_limit(_plan(max_frame_bytes=10_000), args) == 10_000
    assert cli._frame_limit(_plan(max_frame_bytes=99_999), args) == 12_345
