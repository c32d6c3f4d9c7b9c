"""scikit-learn's k-means++ on the pooled data, the reference a FastLloyd run is compared with,
kept on disk so that a second run on the same machine does not import scikit-learn again.

scikit-learn (with SciPy under it) costs about 1.5 s of a process's start-up, more than the run
itself; the reference is a pure function of the data, ``k``, the seed and scikit-learn's version
(fitted on one OpenMP thread, so it does not depend on the machine's cores). The first run
computes it and writes ``$XDG_CACHE_HOME/fedproto/references/<sha256>.json`` (beside the compiled
kernels, see :func:`fedproto.compilation.cache_root`); later runs read the same numbers back
(JSON keeps float64 exactly). A cache that cannot be read or written only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from fedproto.compilation import cache_root

__all__ = ["N_INIT", "Reference", "sklearn_reference", "reference_cache_dir"]

_log = logging.getLogger(__name__)

#: k-means++ restarts of the reference (scikit-learn keeps the best).
N_INIT = 10


@dataclass(frozen=True)
class Reference:
    """scikit-learn's fit.

    Attributes:
        inertia: the sum of squared distances to the nearest centroid (``KMeans.inertia_``).
        centroids: ``[k, d]`` float64 (``KMeans.cluster_centers_``).
    """

    inertia: float
    centroids: np.ndarray


def reference_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedproto/references`` (``~/.cache/fedproto/references`` without it)."""
    return cache_root() / "references"


def _sklearn_version() -> str:
    try:
        return version("scikit-learn")
    except PackageNotFoundError:
        return "unknown"


def _key(x: np.ndarray, k: int, seed: int) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(["kmeans++", N_INIT, int(k), int(seed), list(x.shape), str(x.dtype),
                              _sklearn_version()]).encode())
    digest.update(np.ascontiguousarray(x).tobytes())
    return digest.hexdigest()


def _fit(x: np.ndarray, k: int, seed: int) -> Reference:
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    # one OpenMP thread: scikit-learn's threaded sums reduce in an order that depends on the
    # thread count (on a 16-core GPU host two runs differed in the last bit)
    with threadpool_limits(limits=1, user_api="openmp"):
        fitted = KMeans(n_clusters=k, n_init=N_INIT, random_state=seed).fit(x)
    return Reference(float(fitted.inertia_), np.asarray(fitted.cluster_centers_, dtype=np.float64))


def _read(path: Path, k: int, d: int) -> Reference | None:
    try:
        doc = json.loads(path.read_text())
        centroids = np.asarray(doc["centroids"], dtype=np.float64)
        inertia = float(doc["inertia"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if centroids.shape != (k, d):
        return None
    return Reference(inertia, centroids)


def _write(path: Path, reference: Reference) -> None:
    doc = {"inertia": reference.inertia, "centroids": reference.centroids.tolist()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(doc, out)
            os.replace(tmp, path)  # atomic: a concurrent run reads the old file or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        _log.info("scikit-learn reference not cached: %s", exc)


def sklearn_reference(x: np.ndarray, k: int, seed: int, *, cache: bool = True) -> Reference:
    """scikit-learn's ``KMeans(n_clusters=k, n_init=10, random_state=seed).fit(x)`` on one OpenMP
    thread, read from the cache when an earlier run computed it (scikit-learn is then not
    imported).

    Args:
        x: the pooled, normalised points ``[n, d]``.
        k: clusters.
        seed: scikit-learn's ``random_state``.
        cache: look the fit up in, and store it into, :func:`reference_cache_dir` (``False``:
            always fit, store nothing).

    Returns:
        The fit's inertia and centroids (bit for bit those of a fresh fit).

    Raises:
        ImportError: scikit-learn is not installed and the fit is not cached.
        ValueError: scikit-learn refuses the data (e.g. fewer points than ``k``).
    """
    path = None
    if cache:
        try:
            path = reference_cache_dir() / f"{_key(x, k, seed)}.json"
        except RuntimeError:  # no home directory to put it in
            path = None
    if path is not None:
        found = _read(path, k, x.shape[1])
        if found is not None:
            return found
    reference = _fit(x, k, seed)
    if path is not None:
        _write(path, reference)
    return reference
