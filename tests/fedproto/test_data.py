"""Data loading, normalisation and partitioning."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedproto import data
from fedproto.data import BUNDLED, agree_feature_count, load_dataset, normalize, partition


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_sets_load_with_labels(name):
    ds = load_dataset(name)
    assert ds.x.ndim == 2 and ds.x.dtype == np.float64
    assert ds.y is not None and ds.y.shape == (ds.n,)
    assert ds.paper_k is not None


@pytest.mark.parametrize("name", BUNDLED)
@pytest.mark.parametrize("direct", [True, False], ids=["file", "loader"])
def test_bundled_sets_equal_scikit_learns_loaders(monkeypatch, name, direct):
    """A bundled set is scikit-learn's file read without importing scikit-learn (found where its
    loaders read it), or, where that file is missing, its loader: the same values either way."""
    from sklearn import datasets

    if direct:
        assert data._bundled_file(name) is not None, "scikit-learn's data file not found: sets load through sklearn"
    else:
        monkeypatch.setattr(data, "_bundled_file", lambda name: None)
    bunch = getattr(datasets, f"load_{name}")()
    ds = load_dataset(name)
    assert ds.x.dtype == np.float64 and ds.y.dtype == np.int64
    assert ds.x.tobytes() == np.asarray(bunch.data, dtype=np.float64).tobytes()
    assert ds.x.flags.c_contiguous == bunch.data.flags.c_contiguous
    assert np.array_equal(ds.y, bunch.target)


def test_a_bundled_file_without_the_expected_layout_is_not_used(tmp_path):
    bad = tmp_path / "iris.csv"
    bad.write_text("150,4,setosa,versicolor,virginica\n5.1,3.5,1.4,0.2,0\n")  # one row, not 150
    assert data._read_bundled_file("iris", bad) is None
    bad.write_text("2,1,a,b\n1.0,0.5\n2.0,1\n")  # a label that is not an integer
    assert data._read_bundled_file("iris", bad) is None
    assert data._read_bundled_file("iris", tmp_path / "missing.csv") is None


@pytest.mark.parametrize(
    ("name", "shape", "k"),
    [("iris", (150, 4), 3), ("lsun", (400, 2), 3), ("s1", (5000, 2), 15), ("house", (1837, 3), 3)],
)
def test_shared_text_files_load_by_path(name, shape, k):
    path = data.find_data_file(name)  # the FEDPROTO_DATA mirror (tests/conftest.py)
    if path is None:
        pytest.skip(f"{name}.txt is in no FEDPROTO_DATA directory")
    ds = load_dataset(str(path))
    assert ds.x.shape == shape and ds.paper_k == k and ds.y is None


def test_formats(tmp_path):
    x = np.arange(12.0).reshape(4, 3)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", X=x, y=np.array([0, 1, 0, 1]))
    (tmp_path / "c.csv").write_text("x1,x2,x3\n" + "\n".join(",".join(map(str, r)) for r in x) + "\n")
    (tmp_path / "d.txt").write_text("\n".join(" ".join(f"{v:e}" for v in r) for r in x) + "\n")
    for name in ("a.npy", "b.npz", "c.csv", "d.txt"):
        np.testing.assert_array_equal(load_dataset(str(tmp_path / name)).x, x)
    assert load_dataset(str(tmp_path / "b.npz")).y.tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("1 2\n3\n", "columns"),
        ("1 2\nnan 3\n", "NaN"),
        ("", "no rows"),
        ("1 2\n3 4 %\n", "not a row of numbers"),
    ],
)
def test_bad_text_files(tmp_path, content, match):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_dataset(str(path))


def test_unknown_name_and_unreadable(tmp_path):
    with pytest.raises(ValueError, match="neither a bundled name"):
        load_dataset("no-such-set")
    (tmp_path / "bin.npy").write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match="cannot read"):
        load_dataset(str(tmp_path / "bin.npy"))
    np.save(tmp_path / "one.npy", np.zeros(5))
    with pytest.raises(ValueError, match="2-D"):
        load_dataset(str(tmp_path / "one.npy"))


def test_normalize_maps_to_domain_and_constant_columns_to_zero():
    x = np.array([[1.0, 5.0, 7.0], [3.0, 5.0, -1.0], [2.0, 5.0, 3.0]])
    out = normalize(x)
    np.testing.assert_allclose(out[:, 0], [-1.0, 1.0, 0.0])
    np.testing.assert_array_equal(out[:, 1], 0.0)
    assert out.min() >= -1 and out.max() <= 1
    np.testing.assert_allclose(normalize(x, bound=2.0), 2 * out)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300), st.integers(1, 12), st.sampled_from(["iid", "uneven"]), st.integers(0, 10))
def test_partitions_cover_every_point_once(n, parties, scheme, seed):
    if parties > n:
        with pytest.raises(ValueError, match="at least one point"):
            partition(n, parties, scheme=scheme, seed=seed)
        return
    parts = partition(n, parties, scheme=scheme, seed=seed)
    assert len(parts) == parties and all(len(p) >= 1 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    again = partition(n, parties, scheme=scheme, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_iid_sizes_differ_by_at_most_one_and_label_skew_is_skewed():
    sizes = [len(p) for p in partition(103, 4)]
    assert max(sizes) - min(sizes) <= 1
    labels = np.repeat(np.arange(4), 100)
    parts = partition(400, 4, scheme="label-skew", labels=labels, seed=1, concentration=0.1)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(400))
    # with a small concentration most parties are dominated by one label
    dominant = [np.bincount(labels[p], minlength=4).max() / max(len(p), 1) for p in parts if len(p)]
    assert np.mean(dominant) > 0.5
    with pytest.raises(ValueError, match="needs labels"):
        partition(10, 2, scheme="label-skew")
    with pytest.raises(ValueError, match="unknown partition"):
        partition(10, 2, scheme="zipf")


def test_normalize_extreme_finite_values_without_overflow():
    # a span of 2 * 1.7e308 overflows float64 when computed directly; warnings are errors here
    big = np.finfo(np.float64).max
    x = np.array([[-big, 0.0], [big, 1.0], [0.0, 0.5]])
    out = normalize(x)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])


@pytest.mark.parametrize(
    ("features", "agreed", "odd"),
    [
        ([4, 4, 4], 4, ()),
        ([4, 5, 4], 4, (1,)),  # one party with a stray column is the one named
        ([5, 4, 4], 4, (0,)),
        ([3, 5, 5, 3], 3, (1, 2)),  # a tie: the earliest party's number
        ([5, 3, 3, 5], 5, (1, 2)),
        ([7], 7, ()),
    ],
)
def test_the_parties_agree_the_most_common_feature_count_and_name_the_others(features, agreed, odd):
    assert agree_feature_count(features) == (agreed, odd)


def test_no_feature_count_is_an_error():
    with pytest.raises(ValueError, match="no party"):
        agree_feature_count([])
