"""The seed papers' public data sets by name: where they come from, their pinned sha256, and
where fedproto finds them.

Each registered set (:data:`REGISTRY`) names its file, the address it is downloaded from (a raw
file of a repository at a pinned commit), the sha256 of that file, its licence, what to cite, its
shape and the protocol whose paper uses it. A bare name given to ``--data`` (or to
:func:`fedproto.data.load_dataset`) is looked up in this order:

1. scikit-learn's bundled sets (``iris``, ``wine``, ``breast_cancer``, ``digits``): they take
   precedence, so ``--data iris`` is scikit-learn's copy, not the registered ``iris.txt``;
2. the directories listed in ``FEDPROTO_DATA`` (``os.pathsep``-separated): an offline mirror,
   read in place and never copied;
3. the user's cache directory, :func:`cache_dir` (``$XDG_CACHE_HOME/fedproto/data``, or
   ``~/.cache/fedproto/data``), where ``fedproto data fetch NAME`` downloads with :mod:`pooch`.

A registered set found in a mirror or the cache is checked against its sha256 before it is used;
a file whose hash differs is refused (:class:`DatasetCorrupted`). A set found nowhere raises
:class:`DatasetNotFound`, whose one line names the directories searched and the command that
fetches it. Nothing here touches the network except :func:`fetch`.

Sources: the six text files are the ones the FastLloyd authors distribute with their earlier
code (github.com/D-Diaa/privateclustering, ``data/``), which reads them in
``data_io/data_handler.py`` and lists their k in ``configs/defaults.py``. ``celltype.npz`` is a
conversion to npz of the MUFC authors' ``celltype_processed.pkl`` (github.com/thupchnsky/mufc).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from fedproto.compilation import cache_root

__all__ = [
    "RegisteredDataset",
    "REGISTRY",
    "DatasetError",
    "DatasetNotFound",
    "DatasetCorrupted",
    "DownloadFailed",
    "FetchResult",
    "mirror_dirs",
    "cache_dir",
    "locate",
    "dataset_path",
    "fetch",
    "fetch_command",
    "sha256_of",
]

#: The FastLloyd authors' repository and the commit whose ``data/`` folder the addresses pin.
PRIVATECLUSTERING = "D-Diaa/privateclustering"
PRIVATECLUSTERING_COMMIT = "e873e0bfaa2282617a8e1bd361756104d50d1efb"
#: The MUFC authors' repository and the commit that holds ``celltype_processed.pkl``.
MUFC = "thupchnsky/mufc"
MUFC_COMMIT = "700db1f95459bf1d5124c0e56802fd83a6c4bbcc"

_FASTLLOYD = (
    "Diaa, Humphries, Kerschbaum: differentially private federated k-means with masked secure "
    "aggregation (FastLloyd), arXiv:2405.02437"
)


@dataclasses.dataclass(frozen=True)
class RegisteredDataset:
    """One data set of the registry.

    Attributes:
        name: the bare name ``--data`` accepts (the file's stem).
        file_name: the file's name in a mirror directory and in the cache.
        url: the address :func:`fetch` downloads from, or ``None`` for a mirror-only set (then
            ``mirror_only`` says why and where the upstream copy is).
        sha256: hex sha256 of the file; a copy with another hash is refused.
        licence: the licence it is distributed under (SPDX identifier where there is one): the
            distributing repository's (Apache-2.0 for D-Diaa/privateclustering as the project's
            data mirror states it; MIT for thupchnsky/mufc, from its LICENSE file).
        citation: what to cite: the set's origin and the paper that uses it.
        rows: number of points n.
        cols: number of features d.
        k: the number of clusters the paper uses for it.
        used_by: the fedproto protocol whose paper uses it (``fastlloyd``, ``mufc``).
        provenance: where the file comes from, and what of that could not be confirmed.
        mirror_only: for a set without ``url``: one sentence saying why and where upstream is.
    """

    name: str
    file_name: str
    url: str | None
    sha256: str
    licence: str
    citation: str
    rows: int
    cols: int
    k: int
    used_by: str
    provenance: str
    mirror_only: str | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, cols)``: the points and features of the set."""
        return (self.rows, self.cols)


def _privateclustering(
    name: str, sha256: str, rows: int, cols: int, k: int, origin: str, *, confirmed: bool = True
) -> RegisteredDataset:
    file_name = f"{name}.txt"
    where = f"github.com/{PRIVATECLUSTERING} at commit {PRIVATECLUSTERING_COMMIT[:12]}, data/{file_name}"
    # The licence is the one the project's mirror README gives for that repository; no LICENSE
    # file of it was readable from fedproto's side to confirm it.
    if confirmed:
        provenance = f"{where} (the FastLloyd authors' earlier code)."
    else:
        provenance = (
            f"{where}: the authors' configs/defaults.py lists {name!r} among the sets of their accuracy "
            f"experiments, but that path could not be confirmed from fedproto's side (the repository "
            f"index it was checked against holds only adult, birch2, house and lsun under data/); the "
            f"pinned sha256 is that of the copy in the project's offline mirror, so a download that "
            f"differs is refused."
        )
    return RegisteredDataset(
        name=name,
        file_name=file_name,
        url=f"https://raw.githubusercontent.com/{PRIVATECLUSTERING}/{PRIVATECLUSTERING_COMMIT}/data/{file_name}",
        sha256=sha256,
        licence="Apache-2.0",
        citation=f"{origin}; used in {_FASTLLOYD}",
        rows=rows,
        cols=cols,
        k=k,
        used_by="fastlloyd",
        provenance=provenance,
    )


#: The FastLloyd authors' six text files: name, sha256, rows n, cols d, the k of their experiments,
#: and whether the file's path in their repository could be confirmed (see ``_privateclustering``).
_PRIVATECLUSTERING_SETS = (
    ("adult", "c1e172cf71e5fc44969e82771bf36cdd6ec356db384a24fd7bec8f3af999d900", 48842, 6, 3, True),
    ("birch2", "9e25e770b75a7be5a5393563035217871d31fa27a47a3a4a88aaf7a8f23d2c52", 25000, 2, 100, True),
    ("house", "4fe2d6a1e2ed597e4fc88cf5f5764ee287916d4094a5e1ec5bccc7e155dbcec1", 1837, 3, 3, True),
    ("iris", "9ce133ca49ddb86b6e2e50b7ea3e122771cf5d2872bb5e7649276bd190d7edb9", 150, 4, 3, False),
    ("lsun", "b26e46019547f7342bb833bfbe29fa9b5a3e99c21a586dda701dbc1b713b162b", 400, 2, 3, True),
    ("s1", "07e4fb6008159b06285165b330b40d112367a0de240898e8d45d17c2d2df02a6", 5000, 2, 15, False),
)
#: What each of them is (its origin, for the citation).
_ORIGINS = {
    "adult": "Becker, Kohavi: Adult, UCI Machine Learning Repository, 1996 (its 6 numeric attributes)",
    "birch2": (
        "Zhang, Ramakrishnan, Livny: BIRCH, Data Mining and Knowledge Discovery 1(2), 1997 "
        "(the Birch2 set of Franti's clustering benchmark)"
    ),
    "house": "origin not stated by the distributing repository",
    "iris": (
        "Fisher: the use of multiple measurements in taxonomic problems, Annals of Eugenics 7(2), 1936 "
        "(UCI Iris)"
    ),
    "lsun": "Ultsch: the Fundamental Clustering Problems Suite (FCPS), Lsun",
    "s1": (
        "Franti, Virmajoki: iterative shrinking method for clustering problems, Pattern Recognition "
        "39(5), 2006 (the S1 set)"
    ),
}

_ENTRIES = (
    *(
        _privateclustering(name, sha256, rows, cols, k, _ORIGINS[name], confirmed=confirmed)
        for name, sha256, rows, cols, k, confirmed in _PRIVATECLUSTERING_SETS
    ),
    RegisteredDataset(
        name="celltype",
        file_name="celltype.npz",
        url=None,
        sha256="9e05623173dd7663b4e3027afa4135bcddf7b88ee608d24ed73607ab7eaae6b8",
        licence="MIT",
        citation=(
            "Pan, Sima, Prakash, Rana, Milenkovic: machine unlearning of federated clusters, ICLR 2023 "
            "(the authors' processed Celltype set)"
        ),
        rows=12009,
        cols=10,
        k=4,
        used_by="mufc",
        provenance=(
            f"a conversion to npz (X, y, n_clusters, kmeans_loss, client_X, client_sizes: the 100-client "
            f"split of the authors' experiments) of celltype_processed.pkl in github.com/{MUFC} at commit "
            f"{MUFC_COMMIT[:12]}."
        ),
        mirror_only=(
            f"upstream it is a Python pickle (https://github.com/{MUFC}/blob/{MUFC_COMMIT}/celltype_processed.pkl), "
            f"which fedproto never unpickles, and the npz conversion has no public address; place "
            f"celltype.npz (sha256 9e05623173dd7663b4e3027afa4135bcddf7b88ee608d24ed73607ab7eaae6b8) "
            f"in a directory named in FEDPROTO_DATA"
        ),
    ),
)

#: The registered data sets by name, in the order ``fedproto data list`` shows them.
REGISTRY: Mapping[str, RegisteredDataset] = MappingProxyType({entry.name: entry for entry in _ENTRIES})


class DatasetError(ValueError):
    """A registered data set cannot be used: missing, corrupted, or its download failed. The
    message is one line (the CLI prints it as ``fedproto: error: ...``)."""


class DatasetNotFound(DatasetError):
    """The set is in no ``FEDPROTO_DATA`` directory and not in the cache.

    Attributes:
        name: the set's name.
        searched: the directories looked in, in order.
    """

    def __init__(self, message: str, *, name: str, searched: tuple[Path, ...]) -> None:
        super().__init__(message)
        self.name = name
        self.searched = searched


class DatasetCorrupted(DatasetError):
    """A copy's sha256 differs from the pinned one.

    Attributes:
        path: the refused file.
        expected: the pinned hex sha256.
        found: the file's hex sha256.
    """

    def __init__(self, path: Path, expected: str, found: str, *, hint: str) -> None:
        super().__init__(f"{path}: sha256 {found} differs from the pinned {expected}; refused ({hint})")
        self.path = path
        self.expected = expected
        self.found = found


class DownloadFailed(DatasetError):
    """The download could not be made (no network, an HTTP error) or served other bytes."""


@dataclasses.dataclass(frozen=True)
class FetchResult:
    """What :func:`fetch` did for one set.

    Attributes:
        name: the set's name.
        path: the verified file.
        where: ``"mirror"`` (found in a ``FEDPROTO_DATA`` directory, not copied), ``"cache"``
            (already in the cache) or ``"downloaded"`` (downloaded into the cache now).
    """

    name: str
    path: Path
    where: str


def _entry(name: str) -> RegisteredDataset:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no registered data set {name!r}") from None


def fetch_command(name: str) -> str:
    """The command line that fetches the set ``name`` (``fedproto data fetch s1``)."""
    return f"fedproto data fetch {name}"


def mirror_dirs() -> list[Path]:
    """The directories named in ``FEDPROTO_DATA`` (``os.pathsep``-separated, empty entries
    skipped), in order; they need not exist."""
    return [Path(part) for part in os.environ.get("FEDPROTO_DATA", "").split(os.pathsep) if part]


def cache_dir() -> Path:
    """Where :func:`fetch` downloads: ``data/`` in fedproto's cache directory
    (:func:`fedproto.compilation.cache_root`: ``$XDG_CACHE_HOME/fedproto``, or
    ``~/.cache/fedproto``), beside ``jax/``, the compiled kernels' cache. Not created here."""
    return cache_root() / "data"


def sha256_of(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (:func:`hashlib.file_digest`: a run that only reads a
    verified set does not import pooch, which only downloads).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _verified(entry: RegisteredDataset, path: Path, hint: str) -> Path:
    found = sha256_of(path)
    if found != entry.sha256:
        raise DatasetCorrupted(path, entry.sha256, found, hint=hint)
    return path


def _in_mirror(entry: RegisteredDataset) -> Path | None:
    for directory in mirror_dirs():
        candidate = directory / entry.file_name
        if candidate.is_file():
            return candidate
    return None


def locate(name: str) -> tuple[Path, str] | None:
    """Where the registered set ``name`` is now, verified: the first ``FEDPROTO_DATA`` directory
    that holds its file, else the cache. No download.

    Args:
        name: a key of :data:`REGISTRY`.

    Returns:
        ``(path, where)`` with ``where`` ``"mirror"`` or ``"cache"``, or ``None`` when neither holds it.

    Raises:
        KeyError: ``name`` is not registered.
        DatasetCorrupted: the copy found has another sha256 (a corrupted mirror copy is refused,
            not passed over for the cache, so the mirror gets mended).
        OSError: a copy cannot be read.
    """
    entry = _entry(name)
    mirrored = _in_mirror(entry)
    if mirrored is not None:
        return _verified(entry, mirrored, "mend or remove that mirror copy"), "mirror"
    cached = cache_dir() / entry.file_name
    if cached.is_file():
        return _verified(entry, cached, f"{fetch_command(name)} downloads it again"), "cache"
    return None


def _searched() -> tuple[Path, ...]:
    return (*mirror_dirs(), cache_dir())


def _not_found(entry: RegisteredDataset) -> DatasetNotFound:
    mirrors = mirror_dirs()
    looked = (
        f"in {', '.join(str(d) for d in mirrors)} (FEDPROTO_DATA) and {cache_dir()} (the cache)"
        if mirrors
        else f"in {cache_dir()} (the cache; FEDPROTO_DATA is not set)"
    )
    if entry.url is None:
        advice = f"it cannot be downloaded: {entry.mirror_only}"
    else:
        advice = f"run `{fetch_command(entry.name)}` to download it"
    return DatasetNotFound(
        f"data set {entry.name!r} ({entry.file_name}) not found: looked {looked}; {advice}",
        name=entry.name,
        searched=_searched(),
    )


def dataset_path(name: str) -> Path:
    """The verified file of the registered set ``name`` (see :func:`locate`). No download.

    Raises:
        KeyError: ``name`` is not registered.
        DatasetNotFound: no mirror directory and not the cache holds it; the message names the
            directories searched and ``fedproto data fetch NAME`` (or, for a mirror-only set, why
            it cannot be fetched and where to put it).
        DatasetCorrupted: the copy found has another sha256.
    """
    found = locate(name)
    if found is None:
        raise _not_found(_entry(name))
    return found[0]


@contextlib.contextmanager
def _pooch_quiet() -> Iterator[None]:
    """Pooch logs each download at INFO on stderr; the CLI prints its own line instead."""
    import pooch

    logger = pooch.get_logger()
    previous = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(previous)


#: pooch's words for a download whose hash differs ("expected sha256:X but got Y").
_HASH_MISMATCH = re.compile(
    r"expected (?:\w+:)?(?P<expected>[0-9a-fA-F]{64}),? (?:but )?got (?P<found>[0-9a-fA-F]{64})"
)


def _download_error(entry: RegisteredDataset, exc: BaseException) -> DownloadFailed:
    """One line for a failed download (requests' own messages run over several nested reprs)."""
    import requests

    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        reason = f"HTTP {exc.response.status_code} {exc.response.reason or ''}".rstrip()
    elif isinstance(exc, requests.Timeout):
        reason = "the connection timed out"
    elif isinstance(exc, requests.ConnectionError):
        reason = "cannot connect (no network?)"
    else:
        reason = " ".join(str(exc).split()) or type(exc).__name__
    hint = f"; or place {entry.file_name} in a directory named in FEDPROTO_DATA"
    return DownloadFailed(f"cannot download {entry.name!r} from {entry.url}: {reason}{hint}")


def fetch(name: str, *, timeout_s: float = 60.0) -> FetchResult:
    """Make the registered set ``name`` available: verify it in a ``FEDPROTO_DATA`` directory
    (reported, not copied) or in the cache, else download it into the cache with
    :func:`pooch.retrieve`, which checks the pinned sha256 before keeping the file.

    Args:
        name: a key of :data:`REGISTRY`.
        timeout_s: seconds to wait for the server at each step of the download (seconds).

    Returns:
        The :class:`FetchResult`.

    Raises:
        KeyError: ``name`` is not registered.
        DatasetCorrupted: the mirror's copy has another sha256.
        DatasetNotFound: a mirror-only set that no mirror holds (the message says why and where
            to put it).
        DownloadFailed: the download failed, or the server sent a file with another sha256
            (then nothing is kept).
        OSError: the cache directory cannot be written.
    """
    import pooch
    import requests

    entry = _entry(name)
    mirrored = _in_mirror(entry)
    if mirrored is not None:
        return FetchResult(name, _verified(entry, mirrored, "mend or remove that mirror copy"), "mirror")
    if entry.url is None:
        raise _not_found(entry)
    target = cache_dir()
    cached = (target / entry.file_name).is_file() and sha256_of(target / entry.file_name) == entry.sha256
    if cached:
        return FetchResult(name, target / entry.file_name, "cache")
    try:
        with _pooch_quiet():
            path = pooch.retrieve(
                entry.url,
                known_hash=f"sha256:{entry.sha256}",
                fname=entry.file_name,
                path=target,
                downloader=pooch.HTTPDownloader(progressbar=False, timeout=timeout_s),
            )
    except requests.RequestException as exc:
        raise _download_error(entry, exc) from None
    except ValueError as exc:
        match = _HASH_MISMATCH.search(str(exc))
        if match is None:
            raise _download_error(entry, exc) from None
        raise DownloadFailed(
            f"{entry.url} served {entry.file_name} with sha256 {match['found']}, not the pinned "
            f"{match['expected']}; refused (nothing kept)"
        ) from None
    return FetchResult(name, Path(path), "downloaded")
