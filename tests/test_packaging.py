"""What ``pip install .`` installs: one top-level package, ``fedproto``, holding the repository's
``transports/`` and ``algorithms/`` folders as ``fedproto.transports`` and ``fedproto.algorithms``
(setuptools ``package-dir``), with the report schema and ``py.typed`` as package data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"fedproto": "fedproto", "fedproto/transports": "transports", "fedproto/algorithms": "algorithms"}


def test_the_build_holds_one_top_level_package_with_every_module(tmp_path):
    # build_py is the step of a wheel build that lays out the installed tree
    code = "import setuptools, sys; sys.argv = ['setup.py', '-q', 'build_py', '--build-lib', sys.argv[1]]; setuptools.setup()"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # a subpackage missing from ``packages`` would still be copied, as deprecated "data"
    assert "Package would be ignored" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fedproto"]
    built = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    for installed, folder in FOLDERS.items():
        for source in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            name = f"{installed}/{source.relative_to(ROOT / folder).as_posix()}"
            if installed == "fedproto" and name.split("/")[1] in ("transports", "algorithms"):
                continue  # not a folder of fedproto/ in the repository
            assert name in built, f"{source} is not installed (add its package to pyproject.toml)"
    for data in ("fedproto/py.typed", "fedproto/report.schema.json"):
        assert data in built
    assert not any(name.startswith(("fedproto/tests", "fedproto/docs", "fedproto/benchmarks")) for name in built)
