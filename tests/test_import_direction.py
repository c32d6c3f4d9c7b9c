"""Imports flow one way: algorithms -> fedproto <- transports (ARCHITECTURE.md section 1)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str) -> list[str]:
    path = ROOT / package
    names = [package]
    for info in pkgutil.walk_packages([str(path)], prefix=f"{package}."):
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
    loaded = _loaded_after_import(modules)
    assert not _packages(loaded, "algorithms")
    assert not _packages(loaded, "transports")


def test_algorithms_never_import_transports():
    loaded = _loaded_after_import(_modules("algorithms"))
    assert not _packages(loaded, "transports")


def test_transports_never_import_algorithms():
    loaded = _loaded_after_import(_modules("transports"))
    assert not _packages(loaded, "algorithms")


def test_nothing_pickles_on_the_wire():
    for package in ("fedproto", "transports", "algorithms"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "from pickle" not in text, path
