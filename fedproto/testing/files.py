"""Load a Python file that is not part of a package (a script, a tutorial, a test's helper file).

Examples, benchmarks and tutorials are scripts, not modules of an installed package, and test
files run under ``--import-mode=importlib`` cannot import one another by name. :func:`load_file`
imports such a file by its path, once per name: a second call with the same name returns the
module already loaded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_file"]


def load_file(path: str | Path, name: str | None = None, *, sibling_imports: bool = False) -> ModuleType:
    """Import the Python file at ``path`` as a module named ``name``.

    The module is registered in ``sys.modules`` under ``name`` before it runs (dataclasses and
    pickling look their module up there), and a module already registered under ``name`` is
    returned as it is.

    Args:
        path: the ``.py`` file.
        name: the module's name (default: ``_file_<stem>``, the file name without ``.py``).
        sibling_imports: put the file's folder on ``sys.path`` while it runs, so that it can import
            the files beside it (``import _common`` in a benchmark); it is taken off again after.

    Returns:
        The loaded module.

    Raises:
        FileNotFoundError: no file at ``path``.
        Exception: whatever the file raises while it runs (it is then not left in ``sys.modules``).
    """
    path = Path(path)
    name = name or f"_file_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise FileNotFoundError(f"no Python file at {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    if sibling_imports:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if sibling_imports:
            sys.path.remove(folder)
    return module
