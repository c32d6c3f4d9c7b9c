"""The registry of the papers' data sets: mirrors, the cache, hashes, fetching, the CLI.

No test touches the network: downloads come from an HTTP server on 127.0.0.1 started here, whose
address replaces the registry entry's. The papers' files come from the offline mirror that
``tests/conftest.py`` names in ``FEDPROTO_DATA``; tests that need it skip without it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedproto import datasets
from fedproto.cli import main
from fedproto.data import PAPER_K, find_data_file, load_dataset
from fedproto.datasets import REGISTRY, DatasetCorrupted, DatasetNotFound, DownloadFailed

MIRROR = [Path(p) for p in os.environ.get("FEDPROTO_DATA", "").split(os.pathsep) if p]
TOY_TEXT = b"0 0\n1 0\n0 1\n5 5\n6 5\n5 6\n"


def _mirrored(name: str) -> Path:
    for directory in MIRROR:
        if (directory / REGISTRY[name].file_name).is_file():
            return directory / REGISTRY[name].file_name
    pytest.skip(f"{REGISTRY[name].file_name} is in no FEDPROTO_DATA directory")


@pytest.fixture
def places(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """An empty mirror directory (the only one in FEDPROTO_DATA) and an empty cache home."""
    mirror, home = tmp_path / "mirror", tmp_path / "home"
    mirror.mkdir()
    home.mkdir()
    monkeypatch.setenv("FEDPROTO_DATA", str(mirror))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return mirror, home


def _register(monkeypatch, entry: datasets.RegisteredDataset) -> None:
    monkeypatch.setattr(datasets, "REGISTRY", {**REGISTRY, entry.name: entry})


def _toy(url: str | None = "http://127.0.0.1:9/toy.txt") -> datasets.RegisteredDataset:
    return datasets.RegisteredDataset(
        name="toy", file_name="toy.txt", url=url, sha256=hashlib.sha256(TOY_TEXT).hexdigest(),
        licence="CC0-1.0", citation="none", rows=6, cols=2, k=2, used_by="fastlloyd", provenance="this test",
    )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a fresh directory: ``(base URL, directory)``."""
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


# --- the registry against the mirror -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(REGISTRY))
def test_a_mirrored_set_passes_its_hash_and_has_the_registered_shape(name, monkeypatch, tmp_path):
    path = _mirrored(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: the mirror alone
    assert datasets.locate(name) == (path, "mirror")
    assert datasets.dataset_path(name) == path
    entry = REGISTRY[name]
    ds = load_dataset(str(path))
    assert ds.x.shape == entry.shape and entry.k == PAPER_K[name]
    assert not any(tmp_path.iterdir())  # read in place, nothing copied


def test_registry_entries_pin_a_source_or_say_why_not():
    for entry in REGISTRY.values():
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        assert entry.file_name.startswith(entry.name + ".")
        assert entry.licence and entry.citation and entry.provenance
        if entry.url is None:
            assert entry.mirror_only and "FEDPROTO_DATA" in entry.mirror_only
        else:
            # a raw file at a pinned commit, never a moving branch
            assert entry.url.startswith("https://raw.githubusercontent.com/D-Diaa/privateclustering/")
            assert datasets.PRIVATECLUSTERING_COMMIT in entry.url and entry.url.endswith("/data/" + entry.file_name)
    assert REGISTRY["celltype"].url is None and "celltype_processed.pkl" in REGISTRY["celltype"].mirror_only


def test_builtin_names_keep_precedence_over_the_registry(places):
    mirror, _ = places
    (mirror / "iris.txt").write_bytes(b"not even numbers\n")  # would be refused if it were read
    ds = load_dataset("iris")
    assert ds.x.shape == (150, 4) and ds.y is not None  # scikit-learn's, with labels


# --- corrupted copies, missing sets ------------------------------------------------------------------


def test_a_corrupted_mirror_copy_is_refused_with_both_hashes(places, monkeypatch):
    mirror, _ = places
    _register(monkeypatch, _toy())
    flipped = bytearray(TOY_TEXT)
    flipped[0] ^= 1  # "0" -> "1": still a valid data file, but another file
    (mirror / "toy.txt").write_bytes(bytes(flipped))
    with pytest.raises(DatasetCorrupted) as caught:
        load_dataset("toy")
    message = str(caught.value)
    found = hashlib.sha256(bytes(flipped)).hexdigest()
    assert str(mirror / "toy.txt") in message and _toy().sha256 in message and found in message
    assert "\n" not in message
    assert caught.value.found == found and caught.value.expected == _toy().sha256


def test_a_corrupted_real_set_is_refused(places):
    mirror, _ = places
    data = bytearray(_mirrored("lsun").read_bytes())
    data[len(data) // 2] ^= 0x01
    (mirror / "lsun.txt").write_bytes(bytes(data))
    with pytest.raises(DatasetCorrupted, match="lsun.txt: sha256 [0-9a-f]{64} differs from the pinned " + REGISTRY["lsun"].sha256):
        load_dataset("lsun")


def test_a_corrupted_mirror_copy_is_not_passed_over_for_the_cache(places, monkeypatch):
    mirror, _ = places
    _register(monkeypatch, _toy())
    datasets.cache_dir().mkdir(parents=True)
    (datasets.cache_dir() / "toy.txt").write_bytes(TOY_TEXT)  # a good copy in the cache
    assert datasets.locate("toy") == (datasets.cache_dir() / "toy.txt", "cache")
    (mirror / "toy.txt").write_bytes(TOY_TEXT + b"7 7\n")
    with pytest.raises(DatasetCorrupted):
        datasets.locate("toy")


def test_a_corrupted_cache_copy_is_refused(places, monkeypatch):
    _register(monkeypatch, _toy())
    datasets.cache_dir().mkdir(parents=True)
    (datasets.cache_dir() / "toy.txt").write_bytes(TOY_TEXT[:-1])
    with pytest.raises(DatasetCorrupted, match="fedproto data fetch toy"):
        find_data_file("toy")


def test_a_missing_set_names_the_directories_and_the_fetch_command(places, tmp_path, monkeypatch):
    mirror, home = places
    second = tmp_path / "second"
    monkeypatch.setenv("FEDPROTO_DATA", os.pathsep.join([str(mirror), str(second)]))
    with pytest.raises(DatasetNotFound) as caught:
        load_dataset("s1")
    message = str(caught.value)
    assert "`fedproto data fetch s1`" in message and "\n" not in message
    for directory in (mirror, second, home / "fedproto" / "data"):
        assert str(directory) in message
    assert caught.value.searched == (mirror, second, home / "fedproto" / "data")


def test_without_fedproto_data_the_error_says_it_is_unset(places, monkeypatch):
    monkeypatch.delenv("FEDPROTO_DATA")
    with pytest.raises(DatasetNotFound, match="FEDPROTO_DATA is not set.*fedproto data fetch house"):
        load_dataset("house")


def test_celltype_is_mirror_only_and_fetch_says_why_in_one_line(places, capsys):
    with pytest.raises(DatasetNotFound) as caught:
        datasets.fetch("celltype")
    message = str(caught.value)
    assert "pickle" in message and "celltype_processed.pkl" in message and REGISTRY["celltype"].sha256 in message
    assert main(["data", "fetch", "celltype"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fedproto: error: ") and err.count("\n") == 1 and "FEDPROTO_DATA" in err


def test_unregistered_names_still_find_files_in_a_mirror(places):
    mirror, _ = places
    np.save(mirror / "mine.npy", np.arange(6.0).reshape(3, 2))
    assert find_data_file("mine") == mirror / "mine.npy"
    assert load_dataset("mine").x.shape == (3, 2)
    with pytest.raises(ValueError, match="neither a bundled name .* a registered set"):
        load_dataset("nothing-by-this-name")


def test_shared_data_beside_the_working_directory_is_no_longer_searched(places, tmp_path, monkeypatch):
    beside = tmp_path / "shared" / "data"
    beside.mkdir(parents=True)
    (beside / "toy.txt").write_bytes(TOY_TEXT)
    _register(monkeypatch, _toy())
    monkeypatch.chdir(tmp_path)
    assert find_data_file("toy") is None


# --- fetching through pooch from a local server ------------------------------------------------------


def test_fetch_downloads_verifies_then_reuses_the_cache(places, server, monkeypatch):
    base, served = server
    (served / "toy.txt").write_bytes(TOY_TEXT)
    _register(monkeypatch, _toy(f"{base}/toy.txt"))
    first = datasets.fetch("toy")
    assert first.where == "downloaded" and first.path == datasets.cache_dir() / "toy.txt"
    assert first.path.read_bytes() == TOY_TEXT
    (served / "toy.txt").unlink()  # the second fetch must not need the server
    assert datasets.fetch("toy") == datasets.FetchResult("toy", first.path, "cache")
    assert load_dataset("toy").x.shape == (6, 2)


def test_fetch_refuses_a_served_file_whose_hash_differs(places, server, monkeypatch):
    base, served = server
    (served / "toy.txt").write_bytes(TOY_TEXT + b"9 9\n")
    _register(monkeypatch, _toy(f"{base}/toy.txt"))
    with pytest.raises(DownloadFailed) as caught:
        datasets.fetch("toy")
    message = str(caught.value)
    assert hashlib.sha256(TOY_TEXT + b"9 9\n").hexdigest() in message and _toy().sha256 in message
    assert "\n" not in message
    assert not (datasets.cache_dir() / "toy.txt").exists()  # nothing kept


def test_fetch_reports_an_http_error_in_one_line(places, server, monkeypatch, capsys):
    base, _ = server
    _register(monkeypatch, _toy(f"{base}/missing.txt"))
    assert main(["data", "fetch", "toy"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTTP 404" in err and "Traceback" not in err


def test_fetch_of_an_unreachable_server_is_one_line(places, monkeypatch, capsys):
    _register(monkeypatch, _toy("http://127.0.0.1:9/toy.txt"))  # the discard port: refused
    assert main(["data", "fetch", "toy"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot download 'toy'" in err and "Traceback" not in err


def test_cli_fetch_downloads_a_registered_set_from_its_address(places, server, monkeypatch, capsys):
    base, served = server
    shutil.copyfile(_mirrored("s1"), served / "s1.txt")
    monkeypatch.delenv("FEDPROTO_DATA")
    _register(monkeypatch, dataclasses.replace(REGISTRY["s1"], url=f"{base}/s1.txt"))
    assert main(["data", "fetch", "s1"]) == 0
    cached = datasets.cache_dir() / "s1.txt"
    assert capsys.readouterr().out.strip() == f"s1: downloaded to {cached}"
    assert datasets.sha256_of(cached) == REGISTRY["s1"].sha256
    assert load_dataset("s1").x.shape == (5000, 2)


# --- the command line ---------------------------------------------------------------------------------


def test_cli_list_shows_where_each_set_is(places, capsys):
    mirror, _ = places
    shutil.copyfile(_mirrored("lsun"), mirror / "lsun.txt")
    assert main(["data", "list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert list(lines) == list(REGISTRY)
    assert lines["lsun"].endswith(f"mirror: {mirror / 'lsun.txt'}") and "400 x 2" in lines["lsun"]
    assert lines["s1"].endswith("not fetched") and "Apache-2.0" in lines["s1"] and "fastlloyd" in lines["s1"]
    assert "mirror only" in lines["celltype"]
    (mirror / "s1.txt").write_bytes(b"1 2\n")
    assert main(["data", "list"]) == 0
    s1_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("s1 "))
    assert s1_line.endswith(f"refused (sha256 differs): {mirror / 's1.txt'}")


def test_cli_path_prints_the_verified_path_or_fails_in_one_line(places, capsys):
    mirror, _ = places
    shutil.copyfile(_mirrored("lsun"), mirror / "lsun.txt")
    assert main(["data", "path", "lsun"]) == 0
    assert capsys.readouterr().out == f"{mirror / 'lsun.txt'}\n"
    assert main(["data", "path", "s1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fedproto data fetch s1" in err


def test_cli_fetch_of_a_mirrored_set_verifies_without_copying(places, capsys):
    mirror, _ = places
    shutil.copyfile(_mirrored("lsun"), mirror / "lsun.txt")
    assert main(["data", "fetch", "lsun"]) == 0
    assert capsys.readouterr().out.strip() == f"lsun: verified in the mirror {mirror / 'lsun.txt'}"
    assert not datasets.cache_dir().exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["data", "path", "lsn"], "unknown data set 'lsn'; did you mean lsun?"),
        (["data", "fetch", "s1", "brich2"], "unknown data set 'brich2'; did you mean birch2?"),
        (["data", "fetch", "wine"], "scikit-learn's bundled set"),
        (["data", "fetch"], "name the sets to fetch, or give --all"),
        (["data", "fetch", "s1", "--all"], "name the sets to fetch, or give --all"),
        (["data"], "required"),
    ],
)
def test_cli_bad_names_are_usage_errors(places, capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedproto: usage error: ") and words in err and err.count("\n") == 1


def test_top_level_help_lists_the_data_command(capsys):
    assert main(["--help"]) == 0
    assert "list, fetch and locate the papers' data sets" in capsys.readouterr().out


# --- the README's example in a fresh process -------------------------------------------------------------


def test_readme_example_runs_with_a_mirror_and_fails_naming_fetch_without(tmp_path):
    _mirrored("s1")
    env = {k: v for k, v in os.environ.items() if k != "FEDPROTO_DATA"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "empty-cache")
    command = [
        sys.executable, "-m", "fedproto", "run", "fastlloyd", "--data", "s1", "--clients", "2",
        "--epsilon", "0.5", "--iterations", "2", "--seed", "0", "--quiet", "--no-plot", "--no-compile-cache",
    ]
    without = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert without.returncode == 1
    assert without.stderr.count("\n") == 1 and "`fedproto data fetch s1`" in without.stderr
    env["FEDPROTO_DATA"] = os.pathsep.join(str(d) for d in MIRROR)
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "fastlloyd on s1" in done.stdout and "5,000" in done.stdout
