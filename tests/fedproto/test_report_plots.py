"""The report figure stays readable at scale: 100 parties, bytes spanning decades, many phases."""

from __future__ import annotations

import itertools

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedproto.metering import Meter  # noqa: E402
from fedproto.report import plot_report  # noqa: E402


def make_report(n_clients: int, *, phases: tuple[str, ...] = ("update", "aggregate"), rounds: int = 3,
                client_bytes: int = 200, server_bytes: int = 200):
    """A star: each client sends ``client_bytes`` up per round and phase 0, the server sends
    ``server_bytes`` down per round and phase 1 (more phases alternate)."""
    meter = Meter(lambda: 0.0)
    clients = [f"client-{i}" for i in range(n_clients)]
    for round_idx, (i, phase) in itertools.product(range(rounds), enumerate(phases)):
        for client in clients:
            if i % 2 == 0:
                meter.record_sent(round_idx, phase, client, "server", "t", client_bytes + i, 0)
            else:
                meter.record_sent(round_idx, phase, "server", client, "t", server_bytes + i, 0)
    return meter.report(protocol="toy", transport="memory", session=1, parties=["server", *clients])


@pytest.fixture
def figure(monkeypatch, tmp_path):
    """Run ``plot_report`` and hand back the figure it drew (kept open past its ``plt.close``,
    closed at teardown)."""
    captured = []
    close = plt.close
    monkeypatch.setattr(plt, "close", captured.append)

    def draw(report, **kwargs):
        path = plot_report(report, tmp_path / "r.png", **kwargs)
        assert path.stat().st_size > 0
        fig = captured[-1]
        fig.canvas.draw()
        return fig

    yield draw
    for fig in captured:
        close(fig)


def boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_hundred_parties_show_the_busiest_and_summarise_the_rest(figure):
    report = make_report(100, server_bytes=50_000)
    fig = figure(report, max_parties=16)
    ax = fig.axes[1]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 16
    assert labels[0] == "server"  # the busiest first
    assert labels[-1].startswith("86 others")  # 101 parties - 15 shown
    assert "busiest 15 of 101" in ax.get_title()
    renderer = fig.canvas.get_renderer()
    extents = [t.get_window_extent(renderer) for t in ax.get_yticklabels()]
    assert not any(boxes_overlap(a, b) for a, b in itertools.combinations(extents, 2))


def test_few_parties_are_all_shown_in_roster_order(figure):
    fig = figure(make_report(3))
    labels = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert labels == ["server", "client-0", "client-1", "client-2"]


@pytest.mark.parametrize(("n_clients", "scale"), [(100, "log"), (5, "linear")])
def test_bytes_axis_is_logarithmic_only_when_values_span_decades(figure, n_clients, scale):
    # per party, over 3 rounds: a client sends ~600 B and receives ~600 B; the server sends and
    # receives n_clients times that (more than two decades apart only with 100 clients)
    fig = figure(make_report(n_clients))
    assert fig.axes[1].get_xscale() == scale


def test_round_ticks_are_integers(figure):
    fig = figure(make_report(4, rounds=7))
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) > 1 and all(float(t).is_integer() for t in ticks)


def test_eleven_phases_get_eleven_distinct_colours(figure):
    phases = tuple(f"phase-{i}" for i in range(11))
    fig = figure(make_report(2, phases=phases, rounds=1), phases=phases)
    ax = fig.axes[0]
    colours = {tuple(patch.get_facecolor()) for patch in ax.patches}
    assert len(colours) == 11


def test_legends_sit_outside_the_data_area(figure):
    fig = figure(make_report(100, server_bytes=50_000))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:2]:
        legend = ax.get_legend()
        assert legend is not None
        assert not boxes_overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


def test_max_parties_below_two_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_parties"):
        plot_report(make_report(3), tmp_path / "r.png", max_parties=1)


@pytest.mark.parametrize(("plugin_name", "title"), [
    ("KZCENTER", "(k,z)-center"), ("KZMEDIAN", "(k,z)-median"), ("KZMEANS", "(k,z)-means"),
])
def test_each_kz_protocol_titles_its_own_plot(plugin_name, title):
    import argparse

    from fedproto import cli as core_cli
    from fedproto.algorithms.kzclustering import cli as kz_cli
    from fedproto.data import load_dataset

    plugin = getattr(kz_cli, plugin_name)
    parser = argparse.ArgumentParser()
    core_cli._common_arguments(parser, party=False)
    plugin.add_arguments(parser)
    plan = plugin.plan(parser.parse_args(["--data", "iris", "--machines", "2", "--k", "3"]), load_dataset("iris"))
    fig, ax = plt.subplots()
    try:
        plan.plot_results(ax, {"centres": [[0.0] * 4] * 3, "radius": 1.0, "outlier_threshold": 1.0})
        assert ax.get_title().startswith(title + " ")
    finally:
        plt.close(fig)


@pytest.mark.parametrize(("epsilon_spent", "words"), [
    (1.0, "carry DP noise (epsilon = 1 over the run):\na cross far from every point is that noise, not a cluster"),
    (None, "added no DP noise"),
])
def test_the_clusters_panel_has_a_legend_and_says_what_the_noise_does(figure, epsilon_spent, words):
    import numpy as np

    from fedproto.algorithms.fastlloyd.cli import plot_clusters

    x = np.random.default_rng(0).normal(size=(60, 2))
    summary = {"variant": "fastlloyd", "epsilon_spent": epsilon_spent,
               "centroids": [[0.0, 0.0], [5.0, 5.0]],  # the second far from every point
               "sklearn_centroids": [[-1.0, 0.0], [1.0, 0.0]]}
    fig = figure(make_report(2), extra=lambda ax: plot_clusters(ax, x, summary))
    ax = fig.axes[2]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "points, coloured by nearest fastlloyd centroid", "scikit-learn centroids", "fastlloyd centroids"]
    assert words in legend.get_title().get_text()
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert not boxes_overlap(box, ax.get_window_extent(renderer))
    assert not any(boxes_overlap(box, t.get_window_extent(renderer)) for t in ax.get_xticklabels())
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)  # not cut off
