"""MUFC's baselines, centralised: K-FED, DC-k-means over clients, the induced loss.

Spec mufc.md 1.1 (phi_f >= phi_c), 4.2 (baselines), 4.3 (loss ratio), 5.2 (kfed.py and
dc_kmeans.py). Data are small Gaussian blobs in 3-D; every client holds at most 64 points and k
is 4 (k' = 2 or 1), so the padded kernels compile only a few times.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedproto.algorithms import kmeans
from fedproto.algorithms.deletion.dckmeans import DCKMeans, DCKMeansConfig
from fedproto.algorithms.mufc.baselines import (
    ClientDCKMeans,
    induced_loss,
    kfed,
    kfed_local,
    kfed_server,
    loss_ratio,
)

#: Four blob centres in [0, 1]^3, pairwise at least 0.8 apart (40 blob standard deviations).
CENTRES = np.array([[0.1, 0.1, 0.1], [0.9, 0.1, 0.1], [0.1, 0.9, 0.1], [0.5, 0.5, 0.9]])
SD = 0.02

#: Non-i.i.d. split: client l holds the listed blobs (one or two each; client 0 holds two, as
#: K-FED's server needs the first device to show k' true clusters).
SPLIT = ((0, 1), (2,), (3, 2), (1,), (0, 2), (3,), (0,), (1, 3), (2,), (0, 3), (1, 2), (3,))


def non_iid_blobs(seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per client its points (30 per blob for two blobs, 40 for one) and their blob labels."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for blobs in SPLIT:
        size = 30 if len(blobs) == 2 else 40
        xs.append(np.concatenate([rng.normal(CENTRES[b], SD, size=(size, 3)) for b in blobs]))
        ys.append(np.repeat(np.asarray(blobs), size))
    return xs, ys


def induced_assignment(positions, labels) -> np.ndarray:
    return np.concatenate([lab[pos] for pos, lab in zip(positions, labels, strict=True)])


def assert_same_partition(a: np.ndarray, b: np.ndarray) -> None:
    """``a`` and ``b`` are the same partition up to renaming (a bijection between labels)."""
    pairs = np.unique(np.stack([a, b]), axis=1)
    assert pairs.shape[1] == np.unique(a).size == np.unique(b).size


def optimum(x: np.ndarray, k: int) -> float:
    return float(KMeans(k, n_init=10, random_state=0).fit(x).inertia_)


# -- K-FED ------------------------------------------------------------------------------------------


def test_kfed_recovers_non_iid_blobs():
    xs, ys = non_iid_blobs()
    x, y = np.concatenate(xs), np.concatenate(ys)
    result = kfed(3, xs, 4, 2)
    assert result.centroids.shape == (4, 3)
    assert [c.shape[0] for c in result.local_centroids] == [2] * len(xs)
    assert_same_partition(induced_assignment(result.local_positions, result.local_labels), y)
    # The server starts from the first device's two centres.
    np.testing.assert_array_equal(result.seed_sources[:2], [[0, 0], [0, 1]])
    # With the partition recovered, phi_f - phi* = sum_j n_j ||c_j - mu_j||^2, where c_j is the
    # unit-weight mean of the local centroids of blob j. Those are means of 15-40 points, so c_j
    # is off the blob mean by O(SD sqrt(d / 30)) and the excess is O(1/30) of phi* in the worst
    # case and far less on average: a 5% tolerance cannot be met by a wrong partition (merging
    # two blobs costs about 40^2 times a blob's own cost).
    ratio = loss_ratio(induced_loss(xs, result.local_positions, result.local_labels, result.centroids),
                       optimum(x, 4))
    assert 1.0 - 1e-9 <= ratio <= 1.05
    again = kfed(3, xs, 4, 2)
    np.testing.assert_array_equal(again.centroids, result.centroids)
    for a, b in zip(again.local_positions, result.local_positions, strict=True):
        np.testing.assert_array_equal(a, b)


def test_kfed_local_recovers_a_clients_clusters_and_is_a_lloyd_fixed_point():
    xs, ys = non_iid_blobs(1)
    x, y = xs[2], ys[2]  # blobs 3 and 2
    centroids, positions = kfed_local(jax.random.PRNGKey(7), x, 2)
    assert centroids.shape == (2, 3) and positions.dtype == np.int64
    assert_same_partition(positions, y)
    for j in range(2):
        np.testing.assert_allclose(centroids[j], x[positions == j].mean(axis=0), rtol=0, atol=1e-12)
    d2 = ((x[:, None, :] - centroids[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(positions, d2.argmin(1))


def initial_centres(x: np.ndarray, seeds: np.ndarray, split: bool) -> tuple[float, float]:
    """Reference for K-FED's initial centres in 1-D, sorted. ``split``: the mean of the points at
    most a third as far from their seed as from the other seed (fallback: the seed's Voronoi
    cell); otherwise the Voronoi means (the plain Lloyd update the rule replaces)."""
    d = np.abs(x[:, None] - seeds[None, :])
    nearest = d.argmin(1)
    core = (3 * d.min(1) <= d.max(1)) if split else np.ones(x.size, bool)
    means = [x[(nearest == r) & core].mean() if np.any((nearest == r) & core) else x[nearest == r].mean()
             for r in range(2)]
    return tuple(sorted(means))


def test_kfed_local_initialises_from_the_one_to_three_distance_split():
    # 1-D, k' = 2, no Lloyd (max_iter = 0): the centres are the core means of the two k-means++
    # seeds. With these points most seed pairs leave a point out of every core set.
    x = np.array([0.0, 0.5, 4.0, 10.0, 10.5])
    pairs = [x[[i, j]] for i in range(5) for j in range(5) if i != j]
    for seed in range(6):
        centroids, _ = kfed_local(jax.random.PRNGKey(seed), x[:, None], 2, max_iter=0)
        got = np.sort(centroids[:, 0])
        matching = [p for p in pairs if np.allclose(got, initial_centres(x, p, True), rtol=0, atol=1e-12)]
        assert matching, got
        assert not any(np.allclose(got, initial_centres(x, p, False), rtol=0, atol=1e-12) for p in matching)


def test_kfed_local_with_few_distinct_points_uses_them():
    x = np.array([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3], [0.5, 0.5, 0.5]])
    centroids, positions = kfed_local(jax.random.PRNGKey(1), x, 3)
    np.testing.assert_array_equal(centroids, [[0.5, 0.5, 0.5], [0.1, 0.2, 0.3]])  # first occurrence
    np.testing.assert_array_equal(positions, [0, 1, 0])
    empty_c, empty_p = kfed_local(jax.random.PRNGKey(1), np.zeros((0, 3)), 3)
    assert empty_c.shape == (0, 3) and empty_p.shape == (0,)


#: Hand-built server input (d = 2): three devices with two centres each.
HAND = [np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[10.0, 0.0], [0.4, 0.0]]),
        np.array([[0.0, 5.0], [10.0, 1.0]])]


def test_kfed_server_takes_the_first_device_then_farthest_centres():
    centroids, labels, sources = kfed_server(HAND, 4)
    # Chosen set {(0,0), (1,0)}; farthest is (10,1) (squared distance 82 > 81 of (10,0)); then
    # (0,5) (25 > 1 for (10,0), which (10,1) now covers).
    np.testing.assert_array_equal(sources, [[0, 0], [0, 1], [2, 1], [2, 0]])
    # One Lloyd iteration over the six centres: (0.4,0) joins (0,0), (10,0) joins (10,1).
    np.testing.assert_allclose(centroids, [[0.2, 0.0], [1.0, 0.0], [10.0, 0.5], [0.0, 5.0]], rtol=0, atol=1e-15)
    for got, want in zip(labels, [[0, 1], [2, 0], [3, 2]], strict=True):
        np.testing.assert_array_equal(got, want)


def test_kfed_server_order_of_devices_matters_and_ties_go_to_the_lowest_row():
    _, _, sources = kfed_server([HAND[2], HAND[0], HAND[1]], 4)
    # From {(0,5), (10,1)}: (1,0) is farthest (26); then (0,0) and (10,0) tie at squared
    # distance 1 and the lower row, (0,0) = client 1 row 0, wins.
    np.testing.assert_array_equal(sources, [[0, 0], [0, 1], [1, 1], [1, 0]])


def test_kfed_on_clients_with_few_points_matches_the_hand_built_server():
    clients = [HAND[0], np.array([[10.0, 0.0], [0.4, 0.0], [10.0, 0.0]]), HAND[2], np.zeros((0, 2))]
    result = kfed(0, clients, 4, 2)
    np.testing.assert_array_equal(result.seed_sources, [[0, 0], [0, 1], [2, 1], [2, 0]])
    np.testing.assert_array_equal(result.local_positions[1], [0, 1, 0])
    assert result.local_centroids[3].shape == (0, 2) and result.local_labels[3].shape == (0,)
    # Charged costs: (0.4,0) -> (0.2,0): 0.04; (10,0) twice and (10,1) -> (10,0.5): 0.25 each.
    phi_f = induced_loss(clients, result.local_positions, result.local_labels, result.centroids)
    assert phi_f == pytest.approx(0.83, abs=1e-12)


def test_kfed_server_labels_local_centres_by_the_final_server_centroids():
    # The Lloyd step puts 4.9 with 0 (4.9 < 5.1), the mean moves to -1.7 because of -10, and
    # 4.9 is then nearer to 10: its label is the final nearest centroid, 1.
    centroids, labels, _ = kfed_server([np.array([[0.0], [10.0]]), np.array([[-10.0], [4.9]])], 2)
    np.testing.assert_allclose(centroids[:, 0], [-5.1 / 3, 10.0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(labels[1], [0, 1])


def test_kfed_skips_leading_empty_clients():
    _, _, sources = kfed_server([np.zeros((0, 2)), *HAND], 4)
    np.testing.assert_array_equal(sources, [[1, 0], [1, 1], [3, 1], [3, 0]])


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, HAND, 4, 5), ValueError),  # k' > k
        ((0, HAND, 4, 0), ValueError),
        ((0, HAND, True, 2), TypeError),
        ((0, HAND, 4.0, 2), TypeError),
        ((-1, HAND, 4, 2), ValueError),
        ((0, np.zeros((2, 3, 2)), 4, 2), TypeError),  # one array, not a list of clients
        ((0, [], 4, 2), ValueError),
        ((0, [np.zeros((3, 2)), np.zeros((3, 3))], 2, 2), ValueError),  # dimensions differ
        ((0, [np.array([[0.0, np.nan]])], 1, 1), ValueError),
        ((0, [np.zeros((0, 2)), np.zeros((0, 2))], 1, 1), ValueError),  # no points
        ((0, [np.zeros(3)], 1, 1), ValueError),  # not [n, d]
        ((0, [np.zeros((4, 2)), np.ones((4, 2))], 3, 2), ValueError),  # 2 centroids < k = 3
    ],
)
def test_kfed_rejects_bad_input(args, error):
    with pytest.raises(error):
        kfed(*args)


def test_kfed_server_rejects_a_first_device_with_more_than_k_centres():
    with pytest.raises(ValueError, match="first device"):
        kfed_server([np.eye(3), np.eye(3)], 2)


# -- DC-k-means over clients ------------------------------------------------------------------------


def dc_data(seed: int = 2) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Six clients of the non-i.i.d. blobs with globally unique, increasing ids."""
    xs, _ = non_iid_blobs(seed)
    xs = xs[:6]
    offsets = np.cumsum([0] + [x.shape[0] for x in xs])
    ids = [np.arange(offsets[client], offsets[client + 1]) * 3 + 1 for client in range(len(xs))]
    return xs, ids


def assert_same_model(a: ClientDCKMeans, b: ClientDCKMeans) -> None:
    np.testing.assert_array_equal(a.centroids, b.centroids)
    for name in ("local_centroids", "local_positions", "local_labels", "client_ids", "client_x"):
        for u, v in zip(getattr(a, name), getattr(b, name), strict=True):
            np.testing.assert_array_equal(u, v)


def test_client_dckmeans_is_dckmeans_with_the_clients_as_leaves():
    xs, ids = dc_data()
    model = ClientDCKMeans(5, xs, ids, 4, root_restarts=1)
    leaves = np.concatenate([np.full(x.shape[0], client) for client, x in enumerate(xs)])
    tree = DCKMeans(DCKMeansConfig(k=4, iterations=300, width=len(xs)), seed=5).fit(
        np.concatenate(xs), np.concatenate(ids), leaves=leaves)
    np.testing.assert_array_equal(model.centroids, tree.centroids)
    for client in range(len(xs)):
        np.testing.assert_array_equal(model.local_centroids[client], tree.centroids_of[tree.tree.leaf_node(client)])


def test_client_dckmeans_recovers_blobs_and_induced_loss_bounds_the_central_cost():
    xs, ys = non_iid_blobs()
    model = ClientDCKMeans(0, xs, None, 4)
    x = np.concatenate(xs)
    assert_same_partition(induced_assignment(model.local_positions, model.local_labels), np.concatenate(ys))
    phi_f = induced_loss(xs, model.local_positions, model.local_labels, model.centroids)
    phi_c = float(kmeans.kmeans_cost(x, model.centroids))
    assert phi_f >= phi_c
    # Same argument as for K-FED: the root averages leaf centroids of about 10-30 points with unit
    # weights, so the excess over the optimum is a few percent at most.
    assert 1.0 - 1e-9 <= loss_ratio(phi_f, optimum(x, 4)) <= 1.05
    for positions, centroids, xl in zip(model.local_positions, model.local_centroids, xs, strict=True):
        d2 = ((xl[:, None, :] - centroids[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(positions, d2.argmin(1))


def test_removal_recomputes_only_the_affected_leaf_and_the_root_and_is_exact():
    xs, ids = dc_data()
    model = ClientDCKMeans(7, xs, ids, 4)
    before = {name: [a.copy() for a in getattr(model, name)]
              for name in ("local_centroids", "local_positions", "local_labels")}
    # Every point of client 2 that is a leaf centroid's nearest point, plus two others: the
    # removed points certainly moved the leaf's seeding.
    x2 = xs[2]
    nearest_rows = ((x2[:, None, :] - model.local_centroids[2][None]) ** 2).sum(-1).argmin(0)
    rows = np.unique(np.concatenate([nearest_rows, [0, 5]]))
    seconds = model.remove(2, ids[2][rows].tolist())
    assert seconds > 0
    assert model.leaf_runs == [1, 1, 2, 1, 1, 1] and model.root_runs == 2
    assert model.client_x[2].shape[0] == x2.shape[0] - rows.size
    for client in (0, 1, 3, 4, 5):
        np.testing.assert_array_equal(model.local_centroids[client], before["local_centroids"][client])
        np.testing.assert_array_equal(model.local_positions[client], before["local_positions"][client])
    assert not np.array_equal(model.local_centroids[2], before["local_centroids"][2])
    assert model.local_positions[2].shape == (x2.shape[0] - rows.size,)
    fresh = ClientDCKMeans(7, model.client_x, model.client_ids, 4)
    assert_same_model(model, fresh)
    # A second request on another client, then the whole of a third client.
    model.remove(0, ids[0][[1, 2, 3]])
    model.remove(4, ids[4])
    assert model.local_centroids[4].shape == (0, 3) and model.local_positions[4].shape == (0,)
    assert model.leaf_runs == [2, 1, 2, 1, 2, 1] and model.root_runs == 4
    assert_same_model(model, ClientDCKMeans(7, model.client_x, model.client_ids, 4))


def test_removal_requests_that_cannot_be_served_leave_the_model_unchanged():
    xs, ids = dc_data()
    model = ClientDCKMeans(1, xs, ids, 4)
    model.remove(1, [ids[1][0]])
    reference = ClientDCKMeans(1, model.client_x, model.client_ids, 4)
    runs = (list(model.leaf_runs), model.root_runs)
    with pytest.raises(KeyError, match="already removed"):
        model.remove(1, [ids[1][0]])
    with pytest.raises(KeyError, match="not held"):
        model.remove(1, [ids[2][0]])  # another client's id
    with pytest.raises(KeyError, match="not held"):
        model.remove(1, [ids[1][1], 2])  # one valid id, one unknown: nothing is removed
    with pytest.raises(KeyError, match="does not exist"):
        model.remove(6, [0])
    with pytest.raises(TypeError):
        model.remove(True, [ids[1][1]])
    with pytest.raises(ValueError, match="repeat"):
        model.remove(1, [ids[1][1], ids[1][1]])
    with pytest.raises(ValueError, match="non-empty"):
        model.remove(1, [])
    with pytest.raises(TypeError):
        model.remove(1, [0.5])
    assert (list(model.leaf_runs), model.root_runs) == runs
    assert_same_model(model, reference)


def test_removal_refuses_to_leave_fewer_than_k_points():
    xs = [np.eye(3), np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])]
    model = ClientDCKMeans(0, xs, None, 4, root_restarts=2)
    assert model.centroids.shape == (4, 3)
    with pytest.raises(ValueError, match="fewer than k"):
        model.remove(0, [0, 2])
    model.remove(0, [1])
    assert model.n == 4


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(client_ids=[np.arange(3), np.arange(3)]), ValueError),  # wrong length for client 1
        (dict(client_ids=[np.zeros(3, int), np.arange(4)]), ValueError),  # repeated id
        (dict(client_ids=[np.arange(3) - 1, np.arange(4)]), ValueError),  # negative id
        (dict(client_ids=[np.arange(3.0), np.arange(4)]), ValueError),  # float ids
        (dict(client_ids=[np.arange(3)]), ValueError),  # one array for two clients
        (dict(k=8), ValueError),  # k > n = 7
        (dict(k=0), ValueError),
        (dict(root_restarts=0), ValueError),
        (dict(iterations=-1), ValueError),
        (dict(seed=1.5), TypeError),
    ],
)
def test_client_dckmeans_rejects_bad_input(kwargs, error):
    args = dict(seed=0, client_x=[np.zeros((3, 2)), np.ones((4, 2))], client_ids=None, k=2) | kwargs
    with pytest.raises(error):
        ClientDCKMeans(args.pop("seed"), args.pop("client_x"), args.pop("client_ids"), args.pop("k"), **args)


# -- metrics ----------------------------------------------------------------------------------------


def test_induced_loss_charges_the_local_clusters_server_centroid():
    # Both points belong to one local cluster labelled with server centroid 0 at x = 1, although
    # the point at 2 sits on server centroid 1 (the one-point gap of App. L).
    client_x = [np.array([[0.0], [2.0]])]
    centroids = np.array([[1.0], [2.0]])
    phi_f = induced_loss(client_x, [np.array([0, 0])], [np.array([0])], centroids)
    assert phi_f == 2.0
    assert float(kmeans.kmeans_cost(client_x[0], centroids)) == 1.0
    # With each point in its own local cluster labelled with its nearest centroid, the two agree.
    assert induced_loss(client_x, [np.array([0, 1])], [np.array([0, 1])], centroids) == 1.0


def test_induced_loss_is_at_least_the_central_cost_of_kfed():
    xs, _ = non_iid_blobs(4)
    # k' = 1 forces every two-blob client to merge its blobs into one local cluster.
    result = kfed(0, xs, 4, 1)
    phi_f = induced_loss(xs, result.local_positions, result.local_labels, result.centroids)
    phi_c = float(kmeans.kmeans_cost(np.concatenate(xs), result.centroids))
    assert phi_f > 1.5 * phi_c


@pytest.mark.parametrize(
    "args",
    [
        ([np.zeros((2, 1))], [np.array([0, 1])], [np.array([0])], np.zeros((1, 1))),  # position out of range
        ([np.zeros((2, 1))], [np.array([0, 0])], [np.array([1])], np.zeros((1, 1))),  # label out of range
        ([np.zeros((2, 1))], [np.array([0])], [np.array([0])], np.zeros((1, 1))),  # wrong position count
        ([np.zeros((2, 1))], [], [], np.zeros((1, 1))),  # no arrays for the client
        ([np.zeros((2, 1))], [np.array([0, 0])], [np.array([0])], np.zeros((1, 2))),  # dimension
        ([np.zeros((2, 1))], [np.array([0.0, 0.0])], [np.array([0])], np.zeros((1, 1))),  # float positions
        ([np.zeros((2, 1))], [np.array([0, 0])], [np.array([0])], np.full((1, 1), np.inf)),
    ],
)
def test_induced_loss_rejects_bad_input(args):
    with pytest.raises(ValueError):
        induced_loss(*args)


def test_loss_ratio():
    assert loss_ratio(3.0, 2.0) == 1.5
    for loss, reference in [(1.0, 0.0), (1.0, -1.0), (1.0, np.nan), (-1.0, 1.0), (np.inf, 1.0)]:
        with pytest.raises(ValueError):
            loss_ratio(loss, reference)
