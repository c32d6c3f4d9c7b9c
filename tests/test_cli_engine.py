"""``fedproto run --engine lean`` (the memory transport's one-loop simulation engine).

* the lean engine gives the task runtime's result and the same links and payload bytes;
* it refuses what it cannot do in one usage-error line: another transport, fault injection.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    from fedproto.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _links(report: dict) -> dict:
    return {(l["round_idx"], l["phase"], l["sender"], l["receiver"], l["tag"]): (l["messages"], l["payload_bytes"]) for l in report["links"]}


def test_lean_engine_gives_the_task_runtimes_result_and_bytes(tmp_path: Path, capsys):
    reports = {}
    for engine in ("tasks", "lean"):
        path = tmp_path / f"{engine}.json"
        code, _, err = _run(
            ["run", "fastlloyd", "--data", "iris", "--clients", "6", "--seed", "3", "--engine", engine,
             "--quiet", "--no-plot", "--report", str(path)],
            capsys,
        )
        assert code == 0, err
        reports[engine] = json.loads(path.read_text())
    tasks, lean = reports["tasks"], reports["lean"]
    assert _links(lean) == _links(tasks)
    assert lean["payload_bytes"] == tasks["payload_bytes"] and lean["messages"] == tasks["messages"]
    assert lean["results"]["centroids"] == tasks["results"]["centroids"]
    assert lean["results"]["clients_agree"] is True


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--transport", "tcp"], "argument --engine: lean runs only on --transport memory, not tcp"),
        (["--dropout", "client-1@update"], "argument --dropout: fault injection needs --engine tasks"),
    ],
)
def test_lean_engine_refuses_what_it_cannot_do_in_one_line(extra, message, capsys):
    code, _, err = _run(["run", "fastlloyd", "--data", "iris", "--clients", "3", "--engine", "lean", *extra], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0]
