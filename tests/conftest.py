"""Session-wide test set-up: compiled JAX kernels are cached in a temporary directory.

``fedproto run`` keeps compiled kernels in the user's cache directory (``$XDG_CACHE_HOME``); the
tests run the command line in this process and in subprocesses, so they point that variable at
a directory of their own, removed at the end, and never touch the user's cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE_HOME = tempfile.mkdtemp(prefix="fedproto-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_HOME, ignore_errors=True)
