"""Imports flow one way: algorithms -> fedproto <- transports (ARCHITECTURE.md section 1).

The repository's ``algorithms/`` and ``transports/`` folders install as ``fedproto.algorithms``
and ``fedproto.transports``; the core is every other ``fedproto.*`` module.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"fedproto": "fedproto", "fedproto.algorithms": "algorithms", "fedproto.transports": "transports"}


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / FOLDERS[package])], prefix=f"{package}."):
        names.append(info.name)
    return names


def _loaded_after_import(modules: list[str]) -> set[str]:
    """Import every module in a fresh interpreter; return the names in ``sys.modules``."""
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _packages(loaded: set[str], package: str) -> set[str]:
    return {m for m in loaded if m == package or m.startswith(package + ".")}


def test_core_imports_neither_algorithms_nor_transports():
    # the CLI's registry is the one place allowed to wire them (through entry points, lazily)
    modules = [m for m in _modules("fedproto") if m not in ("fedproto.__main__",)]
    assert "fedproto.cli" in modules and "fedproto.testing" in modules
    loaded = _loaded_after_import(modules)
    assert not _packages(loaded, "fedproto.algorithms")
    assert not _packages(loaded, "fedproto.transports")


def test_algorithms_never_import_transports():
    modules = _modules("fedproto.algorithms")
    assert "fedproto.algorithms.fastlloyd.protocol" in modules
    loaded = _loaded_after_import(modules)
    assert not _packages(loaded, "fedproto.transports")


def test_transports_never_import_algorithms():
    modules = _modules("fedproto.transports")
    assert "fedproto.transports.tcp" in modules
    loaded = _loaded_after_import(modules)
    assert not _packages(loaded, "fedproto.algorithms")


def test_nothing_generic_at_the_top_level():
    # importing everything puts no top-level ``algorithms`` or ``transports`` module in sys.modules
    loaded = _loaded_after_import(_modules("fedproto.algorithms") + _modules("fedproto.transports"))
    assert not _packages(loaded, "algorithms")
    assert not _packages(loaded, "transports")


def test_nothing_pickles_on_the_wire():
    for folder in FOLDERS.values():
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "from pickle" not in text, path
