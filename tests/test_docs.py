"""The documentation in docs/ stays true.

* Every code block marked ``<!-- snippet: PATH[#SECTION] -->`` is the exact text of that file
  (or of its ``# --8<-- [start:SECTION]`` ... ``# --8<-- [end:SECTION]`` section), and the
  tutorial shows its two files whole and in order, so the page cannot drift from the code.
* The tutorial's code runs: its harness tests pass, its memory run gives the sum and the
  analytic bytes per link and prints what the page shows, and ``fedproto run
  docs/tutorial/secure_sum.py`` works over memory and over TCP (one OS process per party).
* Links between the pages (and from the README) resolve, anchors included, and the index links
  every page.
* The reference tables match the code: each protocol page's option tables list exactly the
  options its plugin shows in ``--help``, the command-line page exactly the common options, the
  report page every field of the shipped JSON Schema; the API overview imports.

Snippet paths are relative to ``docs/``. After editing a tutorial file, paste the changed
section into ``docs/tutorial.md`` (the first test names the block that differs).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import jsonschema
import numpy as np
import pytest

from fedproto import encode_frame
from fedproto.metering import report_schema

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TUTORIAL = DOCS / "tutorial"
PAGES = sorted(DOCS.rglob("*.md"))

SNIPPET = re.compile(
    r"<!-- snippet: (?P<path>[^#\s]+)(?:#(?P<section>\w+))? -->\n```python\n(?P<body>.*?)```\n", re.S
)
OUTPUT = re.compile(r"<!-- output: python (?P<path>\S+) -->\n```text\n(?P<body>.*?)```\n", re.S)
MARKER = re.compile(r"^# --8<-- \[(?P<kind>start|end):(?P<section>\w+)\]\n?$")
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def sections(path: Path) -> dict[str | None, str]:
    """``{section: text}`` of a source file, plus ``None``: the whole file without markers.

    Sections must not nest or overlap, and every line outside them must be blank, so the
    sections together are the whole file.
    """
    lines = path.read_text().splitlines(keepends=True)
    has_sections = any(MARKER.match(line) for line in lines)
    out: dict[str | None, str] = {None: ""}
    current: str | None = None
    for number, line in enumerate(lines, 1):
        marker = MARKER.match(line)
        if marker is None:
            out[None] += line
            if current is not None:
                out[current] += line
            elif has_sections:
                assert not line.strip(), f"{path.name}:{number} lies outside every section"
            continue
        name = marker["section"]
        if marker["kind"] == "start":
            assert current is None and name not in out, f"{path.name}:{number}: section {name} nests or repeats"
            current, out[name] = name, ""
        else:
            assert current == name, f"{path.name}:{number}: end of {name} while in {current}"
            current = None
    assert current is None, f"{path.name}: section {current} never ends"
    return out


def snippets(page: Path) -> list[tuple[Path, str | None, str]]:
    return [(DOCS / m["path"], m["section"], m["body"]) for m in SNIPPET.finditer(page.read_text())]


def test_every_snippet_is_the_text_of_its_file():
    checked = 0
    for page in PAGES:
        for path, section, body in snippets(page):
            assert path.is_file(), f"{page.name} includes {path}, which does not exist"
            where = f"{page.name}: the block of {path.name}#{section}"
            assert body == sections(path)[section], f"{where} differs from the file"
            checked += 1
    assert checked >= 8


def test_the_tutorial_shows_its_files_whole_and_in_order():
    shown = snippets(DOCS / "tutorial.md")
    module = TUTORIAL / "secure_sum.py"
    in_file = [name for name in sections(module) if name is not None]
    assert [s for p, s, _ in shown if p == module] == in_file
    assert [(p, s) for p, s, _ in shown if p != module] == [(TUTORIAL / "test_secure_sum.py", None)]
    blocks = "".join(body for p, _, body in shown if p == module)
    assert [ln for ln in blocks.splitlines() if ln.strip()] == [
        ln for ln in sections(module)[None].splitlines() if ln.strip()
    ]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", [*PAGES, REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_inside_the_repository(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue  # an external address
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        assert path.exists(), f"{page.name} links to {target}, which does not exist"
        assert path.is_relative_to(REPO), f"{page.name} links outside the repository: {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.name} links to {target}: no such heading"


def test_the_index_links_every_page_and_the_readme_links_the_index():
    index = DOCS / "index.md"
    linked = {(index.parent / m["target"].partition("#")[0]).resolve() for m in LINK.finditer(index.read_text())}
    missing = [str(p.relative_to(DOCS)) for p in PAGES if p != index and p not in linked]
    assert not missing, f"docs/index.md does not link {missing}"
    readme = {m["target"] for m in LINK.finditer((REPO / "README.md").read_text())}
    assert {"docs/index.md", "docs/tutorial.md"} <= readme


# --- the tutorial's code runs ---------------------------------------------------------------------


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tutorial():
    """The tutorial module, importable as ``secure_sum`` (as its test file imports it)."""
    saved = {name: sys.modules.get(name) for name in ("secure_sum", "test_secure_sum")}
    try:
        yield _load("secure_sum", TUTORIAL / "secure_sum.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _expected_link_bytes(
    tutorial: ModuleType, d: int, session: int, n_clients: int = 2
) -> dict[tuple[str, str], int]:
    """One frame each way per client, its size from encoding one message of each kind."""
    zeros = np.zeros(d, dtype=np.uint64)
    upload = len(encode_frame(tutorial.MaskedInput(values=zeros), session=session, round_idx=0, phase="upload"))
    total = len(encode_frame(tutorial.Total(values=zeros), session=session, round_idx=0, phase="result"))
    assert 8 * d < upload < 8 * d + 64 and 8 * d < total < 8 * d + 64  # the array's raw bytes + an envelope
    clients = [f"client-{i}" for i in range(n_clients)]
    links = {(client, "server"): upload for client in clients}
    links.update({("server", client): total for client in clients})
    return links


def test_the_tutorials_harness_tests_pass(tutorial):
    tests = _load("test_secure_sum", TUTORIAL / "test_secure_sum.py")
    names = [name for name in vars(tests) if name.startswith("test_")]
    assert len(names) >= 5
    for name in names:
        getattr(tests, name)()


def test_the_memory_run_gives_the_sum_and_the_analytic_bytes(tutorial):
    rng = np.random.default_rng(11)
    values = {c: rng.integers(-(2**40), 2**40, size=20) for c in ("client-0", "client-1")}
    results, report = tutorial.run_in_memory(values, b"sixteen-byte-key and more")
    for party in ("server", "client-0", "client-1"):
        np.testing.assert_array_equal(results[party], values["client-0"] + values["client-1"])
    assert report.bytes_by_link() == _expected_link_bytes(tutorial, d=20, session=0)
    assert report.transport == "memory" and report.framing_overhead_bytes == 0


def test_the_tutorial_shows_what_main_prints(tutorial, capsys):
    tutorial.main()
    printed = capsys.readouterr().out
    shown = [m["body"] for m in OUTPUT.finditer((DOCS / "tutorial.md").read_text())]
    assert shown == [printed]


@pytest.mark.parametrize(("transport", "n_clients"), [("memory", 3), ("tcp", 2)])
def test_the_cli_runs_the_tutorial_file(tutorial, transport: str, n_clients: int, tmp_path: Path):
    report_path = tmp_path / "sum.json"
    command = [sys.executable, "-m", "fedproto", "run", "docs/tutorial/secure_sum.py", "--transport", transport]
    command += ["--clients", str(n_clients), "--d", "8", "--seed", "3", "--no-plot", "--report", str(report_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(report_path.read_text())
    jsonschema.validate(report, report_schema())
    inputs = [tutorial.client_values(3, i, 8) for i in range(n_clients)]
    assert report["results"]["sum"] == sum(inputs).tolist()
    assert report["results"]["sum_correct"] is True and report["results"]["n_clients"] == n_clients
    per_link: Counter[tuple[str, str]] = Counter()
    for link in report["links"]:
        per_link[(link["sender"], link["receiver"])] += link["payload_bytes"]
    assert dict(per_link) == _expected_link_bytes(tutorial, d=8, session=report["session"], n_clients=n_clients)
    assert report["transport"] == transport
    assert report["framing_overhead_bytes"] == (4 * 2 * n_clients if transport == "tcp" else 0)


# --- the pages document what the code has ------------------------------------------------------------

OPTIONS_HEADING = re.compile(r"^### Options of (?P<names>.+)$", re.M)


def documented_options(page: Path) -> dict[str, set[str]]:
    """``{name: options}`` from a page's ``### Options of `a` and `b` `` tables (first column)."""
    text = page.read_text()
    out: dict[str, set[str]] = {}
    headings = list(OPTIONS_HEADING.finditer(text))
    for i, heading in enumerate(headings):
        end = text.find("\n#", heading.end())
        body = text[heading.end() : end if end != -1 else len(text)]
        options = set()
        for row in body.splitlines():
            if row.startswith("|") and not row.startswith("|---"):
                options.update(re.findall(r"`(-{1,2}[a-z][a-z0-9-]*)", row.split("|")[1]))
        for name in re.findall(r"`([^`]+)`", heading["names"]):
            out.setdefault(name, set()).update(options)
    return out


def visible_options(parser) -> set[str]:
    """Option strings of a parser's actions that ``--help`` shows (hidden aliases left out)."""
    import argparse

    return {
        option
        for action in parser._actions
        if action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
    }


def test_every_protocol_page_documents_exactly_its_options():
    import argparse

    from fedproto import registry

    documented: dict[str, set[str]] = {}
    for page in sorted((DOCS / "protocols").glob("*.md")):
        documented.update(documented_options(page))
    names = registry.protocol_names()
    assert set(names) <= set(documented), f"no options table for {sorted(set(names) - set(documented))}"
    for name in names:
        parser = argparse.ArgumentParser(prog=name)
        registry.load_protocol(name).add_arguments(parser)
        assert documented[name] == visible_options(parser), name


def test_the_cli_page_documents_exactly_the_common_options():
    import argparse

    from fedproto import cli, registry

    own = argparse.ArgumentParser()
    registry.load_protocol("fastlloyd").add_arguments(own)
    documented = documented_options(DOCS / "cli.md")
    for command in ("run", "party"):
        parser = cli.build_parser([command, "fastlloyd"])
        sub = parser._subparsers._group_actions[0].choices[command]
        protocol_parser = sub._subparsers._group_actions[0].choices["fastlloyd"]
        assert documented[f"fedproto {command}"] == visible_options(protocol_parser) - visible_options(own), command


def test_the_cli_page_documents_exactly_the_provision_options():
    from fedproto import cli

    parser = cli.build_parser(["provision"])
    provision = parser._subparsers._group_actions[0].choices["provision"]
    assert documented_options(DOCS / "cli.md")["fedproto provision"] == visible_options(provision)


def test_the_api_overview_imports():
    text = (DOCS / "index.md").read_text()
    block = text.split("## The public API at a glance", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/index.md", "exec"), {})


def test_the_report_page_lists_every_field_of_the_schema():
    text = (DOCS / "report.md").read_text()
    fields = text.split("## Fields", 1)[1].split("\n## ", 1)[0]
    links = text.split("## Links", 1)[1].split("\n## ", 1)[0]
    schema = report_schema()

    def first_column(section: str) -> set[str]:
        rows = [row.split("|")[1] for row in section.splitlines() if row.startswith("| `")]
        return {name for cell in rows for name in re.findall(r"`([a-z_]+)`", cell)}

    assert first_column(fields) == set(schema["properties"])
    assert first_column(links) == set(schema["$defs"]["link"]["properties"])
    ledger = text.split("## Privacy ledger", 1)[1].split("\n## ", 1)[0]
    assert first_column(ledger) == set(schema["properties"]["privacy"]["properties"]) | set(
        schema["$defs"]["privacy_release"]["properties"]
    )


def test_the_tutorials_messages_without_fields_and_with_plain_ints_work_as_it_says():
    from fedproto import Message, decode_frame

    text = (DOCS / "tutorial.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```\n", text, re.S) if "class Ready(Message" in b)
    space: dict = {"Message": Message}
    exec(compile(block, "tutorial.md", "exec"), space)  # noqa: S102 - the page's own example
    ready, progress = space["Ready"](), space["Progress"](rows_done=2**64 - 1, party_ids=(-(2**63),))
    for message in (ready, progress):
        assert decode_frame(encode_frame(message, session=0, round_idx=0, phase="p"))[1] == message
    with pytest.raises(ValueError) as raised:
        encode_frame(space["Progress"](rows_done=2**70), session=0, round_idx=0, phase="p")
    quoted = re.search(r"`(Progress\.rows_done \(tutorial\.progress\): [^`]*?) \.\.\.`", text.replace("\n", " "))
    assert quoted is not None and str(raised.value).startswith(quoted[1])
