"""Data sets: loading, normalisation and partitioning across parties.

Sources:

* scikit-learn's bundled sets by name: ``iris``, ``wine``, ``breast_cancer``, ``digits``;
* the papers' registered sets by name (``s1``, ``lsun``, ``celltype``, ...: :mod:`fedproto.datasets`),
  found in the directories named in ``FEDPROTO_DATA`` (``os.pathsep``-separated: an offline
  mirror), then in the user's cache directory where ``fedproto data fetch NAME`` puts them, and
  checked against their pinned sha256;
* another file in a ``FEDPROTO_DATA`` directory by its stem;
* any file by path: whitespace-separated or CSV text (one point per line; non-numeric lines
  before the first row, e.g. a header, are skipped), ``.npy`` (a 2-D array) or ``.npz`` (array ``X``, optional ``y``, and the ``name`` and
  ``paper_k`` that :func:`save_dataset` records: ``fedproto split`` writes each party's file so).
  The FastLloyd text files (``s1.txt``, ``lsun.txt``, ...) load this way too.

Every set is min-max normalised per feature to ``[-B, B]`` (FastLloyd spec 2.2; constant features
map to 0) before it is split. Partitions are deterministic given their seed.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedproto import datasets

__all__ = [
    "Dataset",
    "HoldsPoints",
    "BUNDLED",
    "PAPER_K",
    "load_dataset",
    "save_dataset",
    "find_data_file",
    "feature_extent",
    "check_extent",
    "agree_feature_count",
    "normalize",
    "partition",
    "PARTITIONS",
]

BUNDLED = ("iris", "wine", "breast_cancer", "digits")
#: k used by the seed papers for each data set (FastLloyd spec 4.1 / 5; digits as the MNIST stand-in).
PAPER_K = {
    "iris": 3,
    "wine": 3,
    "breast_cancer": 2,
    "digits": 10,
    "lsun": 3,
    "s1": 15,
    "house": 3,
    "adult": 3,
    "birch2": 100,
    "celltype": 4,
}
PARTITIONS = ("iid", "uneven", "label-skew")
_HAS_LETTER = re.compile(r"[A-Za-df-z]")  # letters other than 'e'/'E' (exponents)


class HoldsPoints:
    """Mixin: the size of the points ``x`` (``[n, d]``) a class holds, as ``n`` and ``d``.

    The class provides ``x``, a 2-D array (an attribute, a dataclass field or a property); the
    data sets here, the deletion protocols' point store and a party's raw local points share it.
    """

    x: np.ndarray

    @property
    def n(self) -> int:
        """Number of points (rows of ``x``)."""
        return int(self.x.shape[0])

    @property
    def d(self) -> int:
        """Dimension (columns of ``x``)."""
        return int(self.x.shape[1])


@dataclasses.dataclass(frozen=True)
class Dataset(HoldsPoints):
    """A loaded data set.

    Attributes:
        name: short name (bundled name or file stem).
        x: points ``[n, d]`` float64.
        y: labels ``[n]`` int64, or ``None``.
        paper_k: the k the papers use for it, if known.
    """

    name: str
    x: np.ndarray
    y: np.ndarray | None
    paper_k: int | None


#: The file of each bundled set in scikit-learn's ``sklearn/datasets/data`` (what its
#: ``load_iris``, ``load_wine``, ``load_breast_cancer`` and ``load_digits`` read).
_BUNDLED_FILES = {
    "iris": "iris.csv",
    "wine": "wine_data.csv",
    "breast_cancer": "breast_cancer.csv",
    "digits": "digits.csv.gz",
}


def _bundled_file(name: str) -> Path | None:
    """scikit-learn's file of the bundled set ``name``, found without importing scikit-learn
    (its import brings scipy.stats: about 2 s of every process that loads a bundled set), or
    ``None`` when scikit-learn is absent or keeps its data elsewhere."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(base) / "datasets" / "data" / _BUNDLED_FILES[name]
        if path.is_file():
            return path
    return None


def _read_bundled_file(name: str, path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The points and labels in scikit-learn's file ``path`` of the set ``name``, read as its
    loaders read them (``sklearn.datasets._base.load_csv_data``: a header line ``n_samples,
    n_features,target names...`` then one row of features and an integer label per point;
    ``digits.csv.gz``: rows of 64 pixels and the label, no header), or ``None`` when the file
    does not have that layout."""
    try:
        if name == "digits":
            table = np.loadtxt(path, delimiter=",", ndmin=2)  # numpy opens .gz itself
            expected = (table.shape[0], 8 * 8 + 1)  # rows of 8x8 pixels and the label, no header
        else:
            with path.open("r", encoding="utf-8") as handle:
                header = handle.readline().split(",")
                expected = (int(header[0]), int(header[1]) + 1)
                table = np.loadtxt(handle, delimiter=",", ndmin=2)
    except (OSError, ValueError, IndexError):
        return None
    if table.shape != expected or table.shape[1] < 2:
        return None
    labels = table[:, -1]
    if not np.all(labels == np.round(labels)):
        return None
    points = table[:, :-1]  # laid out as scikit-learn's: digits a view of the table, the others a copy
    return (points if name == "digits" else np.ascontiguousarray(points)), labels.astype(np.int64)


def _load_bundled(name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x [n, d] float64, y [n] int64)`` of a bundled set: scikit-learn's file read directly
    (:func:`_read_bundled_file`; the same values as its loader), else its loader."""
    path = _bundled_file(name)
    found = _read_bundled_file(name, path) if path is not None else None
    if found is not None:
        return found
    from sklearn import datasets

    loader = {
        "iris": datasets.load_iris,
        "wine": datasets.load_wine,
        "breast_cancer": datasets.load_breast_cancer,
        "digits": datasets.load_digits,
    }[name]
    bunch = loader()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def _load_text(path: Path) -> np.ndarray:
    rows: list[list[float]] = []
    width = None
    with path.open("r", encoding="utf-8", errors="strict") as handle:
        for lineno, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = [f for f in re.split(r"[,\s;]+", line) if f]
            try:
                row = [float(f) for f in fields]
            except ValueError:
                if not rows and _HAS_LETTER.search(line):
                    continue  # a header line (e.g. R's "x1 x2 ...")
                raise ValueError(f"{path}:{lineno}: not a row of numbers: {line[:60]!r}") from None
            if width is None:
                width = len(row)
            elif len(row) != width:
                raise ValueError(f"{path}:{lineno}: {len(row)} columns, earlier rows have {width}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows of numbers found")
    return np.asarray(rows, dtype=np.float64)


DATA_SUFFIXES = (".npz", ".npy", ".txt", ".csv")


def find_data_file(name: str) -> Path | None:
    """The data file for a bare name (``celltype`` -> ``.../celltype.npz``), or ``None``.

    A registered set (:data:`fedproto.datasets.REGISTRY`) is looked for in the directories of
    ``FEDPROTO_DATA`` (``os.pathsep``-separated), then in the cache that ``fedproto data fetch``
    fills, and verified against its sha256 (:func:`fedproto.datasets.locate`). Any other name is
    the stem of a ``.npz``, ``.npy``, ``.txt`` or ``.csv`` file in a ``FEDPROTO_DATA`` directory.

    Raises:
        fedproto.datasets.DatasetCorrupted: the registered set's copy has another sha256.
    """
    if not name or any(sep in name for sep in ("/", "\\", os.sep)) or name.startswith("."):
        return None
    if name in datasets.REGISTRY:
        found = datasets.locate(name)
        return None if found is None else found[0]
    for directory in datasets.mirror_dirs():
        for suffix in DATA_SUFFIXES:
            candidate = directory / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    return None


def load_dataset(source: str) -> Dataset:
    """Load a data set by bundled name or by file path (not normalised).

    Args:
        source: ``iris``, ``wine``, ``breast_cancer``, ``digits``, the stem of a file in a data
            directory or a registered set (see :func:`find_data_file`), or a path to a text,
            ``.npy`` or ``.npz`` file.

    Returns:
        The :class:`Dataset` with raw values.

    Raises:
        fedproto.datasets.DatasetNotFound: a registered set that is not fetched (a ``ValueError``
            whose one line names the directories searched and ``fedproto data fetch NAME``).
        fedproto.datasets.DatasetCorrupted: a registered set's copy has another sha256.
        ValueError: unknown name, unreadable or malformed file, not 2-D, empty, or NaN/inf values.
    """
    paper_k: int | None = None
    if source in BUNDLED:
        x, y = _load_bundled(source)
        name = source
    else:
        path = Path(source)
        if not path.is_file():
            path = find_data_file(source) or path
        if not path.is_file():
            if source in datasets.REGISTRY:
                datasets.dataset_path(source)  # raises: where it looked and how to fetch it
            raise ValueError(
                f"data set {source!r} is neither a bundled name ({', '.join(BUNDLED)}), a registered set "
                f"({', '.join(datasets.REGISTRY)}; fedproto data list) nor a readable file"
            )
        name = path.stem
        y = None
        paper_k = None
        try:
            if path.suffix == ".npy":
                x = np.load(path, allow_pickle=False)
            elif path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as archive:
                    if "X" not in archive:
                        raise ValueError(f"{path}: an .npz data set needs an array named 'X'")
                    x = archive["X"]
                    y = archive["y"] if "y" in archive else None
                    name, paper_k = _archive_metadata(path, archive, name)
            else:
                x = _load_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        except ValueError as exc:
            if str(exc).startswith(str(path)):
                raise
            raise ValueError(f"cannot read {path}: {exc}") from exc
        x = np.asarray(x)
        if x.dtype.kind not in "fiub":
            raise ValueError(f"{path}: values must be numeric, got dtype {x.dtype}")
        x = x.astype(np.float64)
        if y is not None:
            y = np.asarray(y).astype(np.int64).reshape(-1)
    if x.ndim != 2:
        raise ValueError(f"data set {name!r} must be 2-D [n, d], got shape {x.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"data set {name!r} is empty (shape {x.shape})")
    if not np.all(np.isfinite(x)):
        bad = int(np.sum(~np.isfinite(x)))
        raise ValueError(f"data set {name!r} has {bad} NaN or infinite values")
    if y is not None and y.shape[0] != x.shape[0]:
        raise ValueError(f"data set {name!r}: {y.shape[0]} labels for {x.shape[0]} points")
    return Dataset(name, x, y, PAPER_K.get(name) if paper_k is None else paper_k)


def _archive_metadata(path: Path, archive: Any, stem: str) -> tuple[str, int | None]:
    """The ``name`` and ``paper_k`` an ``.npz`` written by :func:`save_dataset` records."""
    name, paper_k = stem, None
    if "name" in archive:
        value = archive["name"]
        if value.shape != () or value.dtype.kind != "U" or not str(value):
            raise ValueError(f"{path}: 'name' must be a non-empty string")
        name = str(value)
    if "paper_k" in archive:
        value = archive["paper_k"]
        if value.shape != () or value.dtype.kind not in "iu":
            raise ValueError(f"{path}: 'paper_k' must be an integer")
        paper_k = int(value) if int(value) > 0 else None
    return name, paper_k


def save_dataset(path: str | os.PathLike[str], dataset: Dataset) -> Path:
    """Write a data set as ``.npz`` that :func:`load_dataset` reads back unchanged.

    The archive holds ``X`` (``[n, d]`` float64), ``y`` (``[n]`` int64, when the set has labels),
    ``name`` (the data set's name, so a party's file remembers which set it was cut from) and
    ``paper_k`` (the papers' k for it, -1 for none). ``fedproto split`` writes one per party.

    Args:
        path: where to write; ``.npz`` is appended when missing.
        dataset: the data to write.

    Returns:
        The path written.

    Raises:
        OSError: the file cannot be written.
    """
    target = Path(path)
    if target.suffix != ".npz":
        target = target.with_name(target.name + ".npz")
    arrays: dict[str, np.ndarray] = {
        "X": np.asarray(dataset.x, dtype=np.float64),
        "name": np.asarray(dataset.name),
        "paper_k": np.asarray(-1 if dataset.paper_k is None else int(dataset.paper_k), dtype=np.int64),
    }
    if dataset.y is not None:
        arrays["y"] = np.asarray(dataset.y, dtype=np.int64)
    with target.open("wb") as handle:
        np.savez(handle, **arrays)
    return target


def feature_extent(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature minimum and maximum of ``x``: what :func:`normalize` needs of the data.

    Over several parties' data the extent is the element-wise minimum of their minima and maximum
    of their maxima, so a federation can agree it without pooling its points.

    Args:
        x: ``[n, d]`` float64 (n >= 1).

    Returns:
        ``(lo, hi)``, each ``[d]`` float64.
    """
    x = np.asarray(x, dtype=np.float64)
    return x.min(axis=0), x.max(axis=0)


def check_extent(extent: np.ndarray, *, empty: bool = False) -> None:
    """Check a per-feature extent as the setup messages carry it (``setup.data``).

    Args:
        extent: ``float64 [2, d]``, row 0 the per-feature minima and row 1 the maxima
            (:func:`feature_extent` stacked), over one party's points or the federation's.
        empty: the extent is of no points: it must then be the identities of min and max,
            ``+inf`` in row 0 and ``-inf`` in row 1 for every feature.

    Raises:
        ValueError: ``extent`` is not ``[2, d]`` with ``d >= 1``; with ``empty``, it is not
            ``[+inf, -inf]`` per feature; else it holds NaN or inf, or a minimum above its
            maximum.
    """
    if extent.ndim != 2 or extent.shape[0] != 2 or extent.shape[1] < 1:
        raise ValueError(f"extent must have shape [2, d] with d >= 1, got {extent.shape}")
    if empty:
        if not (np.all(extent[0] == np.inf) and np.all(extent[1] == -np.inf)):
            raise ValueError("the extent of no points must be [+inf, -inf] per feature")
        return
    if not np.all(np.isfinite(extent)):
        raise ValueError("extent holds NaN or infinite values")
    if np.any(extent[0] > extent[1]):
        raise ValueError("extent has a minimum above its maximum")


def agree_feature_count(features: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """The number of features d the parties' data sets agree on, and who disagrees.

    The set-up phase (``setup.data``) of every protocol whose parties each hold their own file
    takes the number most parties' data have as right, the earliest party's on a tie, and names
    the others (one party with a stray column is then the one blamed, not the rest).

    Args:
        features: each party's number of features, in roster (client) order; at least one.

    Returns:
        ``(d, odd)``: the agreed number, and the positions in ``features`` of the parties whose
        number differs from it (empty when all agree), in order.

    Raises:
        ValueError: ``features`` is empty.
    """
    counts = [int(f) for f in features]
    if not counts:
        raise ValueError("no party's number of features to agree on")
    d = collections.Counter(counts).most_common(1)[0][0]  # a stable sort: ties go to the earliest
    return d, tuple(i for i, f in enumerate(counts) if f != d)


def normalize(
    x: np.ndarray, bound: float = 1.0, *, extent: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Min-max normalise each feature to ``[-bound, bound]``; constant features become 0.

    Args:
        x: ``[n, d]`` float64.
        bound: half-width B of the target domain.
        extent: the per-feature ``(lo, hi)`` to scale by (``[d]`` each, e.g. the whole
            federation's, agreed in a setup phase); default: ``x``'s own
            (:func:`feature_extent`). Normalising each party's rows by the federation's extent
            gives exactly the rows of the pooled data normalised at once (same arithmetic).

    Returns:
        ``[n, d]`` float64 in ``[-B, B]`` (values outside ``extent`` are clipped).

    Raises:
        ValueError: ``extent`` does not have ``d`` entries per bound.

    References:
        FastLloyd Sec. 6.1; spec 2.2 step 1.
    """
    x = np.asarray(x, dtype=np.float64)
    if extent is None:
        extent = feature_extent(x)
    lo_raw, hi_raw = (np.asarray(v, dtype=np.float64).reshape(-1) for v in extent)
    if lo_raw.shape[0] != x.shape[1] or hi_raw.shape[0] != x.shape[1]:
        raise ValueError(f"the extent has {lo_raw.shape[0]} and {hi_raw.shape[0]} entries for {x.shape[1]} features")
    # Halving first keeps hi - lo finite for any finite data (features near +-1.8e308 would
    # overflow to inf); a factor of 2 is exact, and it cancels in the ratio. (The minimum of the
    # halved values is the halved minimum, so an extent agreed on raw values gives the same.)
    half = x * 0.5
    lo = lo_raw * 0.5
    span = hi_raw * 0.5 - lo
    safe = np.where(span > 0, span, 1.0)
    out = (half - lo) / safe * (2 * bound) - bound
    out[:, span == 0] = 0.0
    return np.clip(out, -bound, bound)


def partition(
    n: int,
    n_parties: int,
    *,
    scheme: str = "iid",
    seed: int = 0,
    labels: np.ndarray | None = None,
    concentration: float = 0.5,
) -> list[np.ndarray]:
    """Split point indices ``0..n-1`` across parties.

    Args:
        n: number of points.
        n_parties: number of parties M.
        scheme: ``"iid"`` (shuffle, near-equal sizes: the paper's balanced random split),
            ``"uneven"`` (shuffle, sizes from a Dirichlet(``concentration``) draw, at least one
            point each), or ``"label-skew"`` (each label's points spread over parties by a
            Dirichlet(``concentration``) draw; needs ``labels``).
        seed: seed of the split (a local ``numpy.random.Generator``).
        labels: ``[n]`` labels for ``label-skew``.
        concentration: Dirichlet concentration; smaller is more skewed.

    Returns:
        ``n_parties`` sorted index arrays (int64) that together cover ``0..n-1`` once.

    Raises:
        ValueError: unknown scheme, ``n_parties < 1``, more parties than points for a scheme that
            gives every party a point, or ``label-skew`` without labels.
    """
    if n_parties < 1:
        raise ValueError("the number of parties must be at least 1")
    if scheme not in PARTITIONS:
        raise ValueError(f"unknown partition {scheme!r}; choose one of {PARTITIONS}")
    if not concentration > 0:
        raise ValueError("concentration must be positive")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        if n_parties > n:
            raise ValueError(f"{n_parties} parties for {n} points: every party needs at least one point")
        perm = rng.permutation(n)
        return [np.sort(part) for part in np.array_split(perm, n_parties)]
    if scheme == "uneven":
        if n_parties > n:
            raise ValueError(f"{n_parties} parties for {n} points: every party needs at least one point")
        perm = rng.permutation(n)
        share = rng.dirichlet(np.full(n_parties, concentration))
        sizes = 1 + np.floor(share * (n - n_parties)).astype(np.int64)
        sizes[np.argmax(share)] += n - int(sizes.sum())
        cuts = np.cumsum(sizes)[:-1]
        return [np.sort(part) for part in np.split(perm, cuts)]
    if labels is None:
        raise ValueError("label-skew partitioning needs labels (this data set has none)")
    labels = np.asarray(labels)
    if labels.shape[0] != n:
        raise ValueError("labels must have one entry per point")
    parts: list[list[int]] = [[] for _ in range(n_parties)]
    for label in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == label))
        share = rng.dirichlet(np.full(n_parties, concentration))
        cuts = np.floor(np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
        for party, chunk in enumerate(np.split(idx, cuts)):
            parts[party].extend(chunk.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def session_id(*parts: object) -> int:
    """A 32-bit session id derived from the run's public parameters (stable across processes)."""
    import hashlib

    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "big")
