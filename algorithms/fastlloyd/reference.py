"""scikit-learn's k-means++ on the pooled data, the reference a FastLloyd run is compared with,
kept on disk so that a second run on the same machine does not import scikit-learn again.

scikit-learn (with SciPy under it) costs about 1.5 s of a process's start-up, more than the run
itself; the reference is a pure function of the data, ``k``, the seed and scikit-learn's version
(fitted on one OpenMP thread, so it does not depend on the machine's cores). The first run
computes it and keeps it in fedproto's on-disk memo (:mod:`fedproto.memo`, beside the compiled
kernels: :func:`reference_cache_dir`); later runs read the same numbers back (JSON keeps float64
exactly). A memo that cannot be read or written only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from fedproto import memo

__all__ = ["N_INIT", "Reference", "sklearn_reference", "reference_cache_dir"]

#: The memo's kind for these fits.
_KIND = "fastlloyd-reference"

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
    """Where the fits are kept: ``$XDG_CACHE_HOME/fedproto/memo/fastlloyd-reference``
    (``~/.cache/fedproto/...`` without the variable)."""
    return memo.memo_dir() / _KIND


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


def _from_memo(value: object, k: int, d: int) -> Reference | None:
    try:
        centroids = np.asarray(value["centroids"], dtype=np.float64)  # type: ignore[index]
        inertia = float(value["inertia"])  # type: ignore[index]
    except (ValueError, KeyError, TypeError):
        return None
    if centroids.shape != (k, d):
        return None
    return Reference(inertia, centroids)


def sklearn_reference(x: np.ndarray, k: int, seed: int, *, cache: bool = True) -> Reference:
    """scikit-learn's ``KMeans(n_clusters=k, n_init=10, random_state=seed).fit(x)`` on one OpenMP
    thread, read from the cache when an earlier run computed it (scikit-learn is then not
    imported).

    Args:
        x: the pooled, normalised points ``[n, d]``.
        k: clusters.
        seed: scikit-learn's ``random_state``.
        cache: look the fit up in, and store it into, the memo (:func:`reference_cache_dir`;
            ``False``: always fit, store nothing; so does a memo turned off).

    Returns:
        The fit's inertia and centroids (bit for bit those of a fresh fit).

    Raises:
        ImportError: scikit-learn is not installed and the fit is not cached.
        ValueError: scikit-learn refuses the data (e.g. fewer points than ``k``).
    """
    key = _key(x, k, seed) if cache else None
    if key is not None:
        found = _from_memo(memo.lookup(_KIND, key), k, x.shape[1])
        if found is not None:
            return found
    reference = _fit(x, k, seed)
    if key is not None:
        memo.store(_KIND, key, {"inertia": reference.inertia, "centroids": reference.centroids.tolist()})
    return reference
