"""Session-wide test set-up: compiled JAX kernels are cached in a temporary directory.

``fedproto run`` keeps compiled kernels in the user's cache directory (``$XDG_CACHE_HOME``); the
tests run the command line in this process and in subprocesses, so they point that variable at
a directory of their own, removed at the end, and never touch the user's cache.

The subprocesses' Python bytecode goes to that directory too (``PYTHONPYCACHEPREFIX``): where the
environment sets ``PYTHONDONTWRITEBYTECODE`` (and the checkout has no ``__pycache__``), every
``fedproto`` process the tests start would otherwise compile the project's modules from source
again, a quarter of a second each. Nothing is written into the working tree.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE_HOME = tempfile.mkdtemp(prefix="fedproto-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(_CACHE_HOME, "pycache")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # for the subprocesses; this process keeps its setting


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_HOME, ignore_errors=True)
