"""Small results of pure functions kept on disk, so that a second run with the same arguments
skips a heavy import (SciPy for a noise calibration, about half a second of start-up).

A result is a JSON value stored under ``$XDG_CACHE_HOME/fedproto/memo/<kind>/<sha256>.json``
(beside the compiled kernels, :func:`fedproto.compilation.cache_root`), the file holding its key
too, so a read checks that it answers the same question. JSON keeps float64 exactly (``repr``
round-trips), so a cached number is bit for bit the computed one. The key must name everything
the result depends on (arguments, the version of the library computing it). A cache that cannot
be read or written only costs the speed-up; ``fedproto run --no-compile-cache`` turns it off for
the process (:func:`set_enabled`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from fedproto.compilation import cache_root

__all__ = ["lookup", "memo_dir", "set_enabled", "store"]

_log = logging.getLogger(__name__)
_enabled = True


def set_enabled(enabled: bool) -> None:
    """Turn the on-disk memo on or off for this process (on by default)."""
    global _enabled
    _enabled = bool(enabled)


def memo_dir() -> Path:
    """``$XDG_CACHE_HOME/fedproto/memo`` (``~/.cache/fedproto/memo`` without the variable)."""
    return cache_root() / "memo"


def _path(kind: str, key: Any) -> Path | None:
    if not _enabled:
        return None
    digest = hashlib.sha256(json.dumps([kind, key], sort_keys=True).encode()).hexdigest()
    try:
        return memo_dir() / kind / f"{digest}.json"
    except RuntimeError:  # no home directory to put it in
        return None


def lookup(kind: str, key: Any) -> Any | None:
    """The stored result of ``kind`` for ``key`` (a JSON-able value), or ``None`` when there is
    none, the memo is off, or the file is unreadable or answers another key."""
    path = _path(kind, key)
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != json.loads(json.dumps(key)):
        return None
    return doc.get("value")


def store(kind: str, key: Any, value: Any) -> None:
    """Keep ``value`` (a JSON-able result) for ``kind`` and ``key``; written atomically, so a
    concurrent run reads the old file or the whole new one. Never raises for the disk: a memo
    that cannot be written is one line on the log."""
    path = _path(kind, key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump({"key": key, "value": value}, out)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        _log.info("%s not kept on disk: %s", kind, exc)
