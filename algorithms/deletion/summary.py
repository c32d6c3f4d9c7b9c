"""The summary of a ``qkmeans`` or ``dckmeans`` run (the report's ``results``), in one place.

After the protocol, :func:`stream_summary` checks and measures the run on the pooled data: the
data set's and the run's terms, the method's own rows (given by the plugin: exactness against
retraining, agreement, counts), the model's quality on the remaining data beside k-means++
(:func:`quality_rows`: loss, silhouette, NMI), the timed centralised replay of the stream
against plain k-means retrained after every deletion (:func:`timed_rows`), the paper's figures
(:func:`paper_figures`) and the final centroids; :data:`HEADLINE` keys first.
:func:`summary_labels` gives each key a readable label, :func:`plot_cumulative` draws the
cumulative time over the stream. The keys are snake_case with units in their names.

References:
    Ginart et al., "Making AI Forget You: Data Deletion in Machine Learning", NeurIPS 2019,
    Tables 1-4 (the paper's figures) and Sec. 5 (the metrics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from fedproto.algorithms.deletion import streams
from fedproto.progress import progress_task

__all__ = [
    "HEADLINE",
    "paper_figures",
    "plot_cumulative",
    "quality_rows",
    "remaining",
    "stream_summary",
    "summary_labels",
    "timed_rows",
]

#: Summary keys printed first (the terminal table shows its first rows unless ``--full``).
HEADLINE = ("data_set", "method", "n_points", "d", "k", "n_removals", "loss_ratio", "model_equals_retrain",
            "federated_equals_centralised", "clients_agree", "removal_ms_mean", "amortised_ms",
            "retrain_amortised_ms", "speedup_over_retrain")

#: Column of each method in :data:`~fedproto.algorithms.deletion.streams.PAPER_TABLES`.
_PAPER_COLUMN = {"k-means": 0, "Q-k-means": 1, "DC-k-means": 2}


def summary_labels(method: str) -> dict[str, str]:
    """Readable label of each summary key (and each :func:`paper_figures` key) of ``method``
    (``"Q-k-means"`` or ``"DC-k-means"``, optionally with a variant in parentheses)."""
    return {
        "data_set": "data set",
        "n_points": "N (points)",
        "n_clients": "clients",
        "n_removals": "deletion requests",
        "lattice_step": "lattice step eps (after the stream)",
        "balance": "balance gamma",
        "iterations": "Lloyd iterations T",
        "n_certified_removals": "certified deletions",
        "n_retrained_removals": "retrained deletions",
        "n_trainings": "federated trainings (1 + retrains)",
        "federated_equals_centralised": "federated equals centralised Q-k-means on the stream (same key)",
        "width": "width w",
        "height": "height h",
        "leaves": "leaves",
        "leaf_size_min": "leaf size min",
        "leaf_size_mean": "leaf size mean",
        "leaf_size_max": "leaf size max",
        "node_recomputations_per_removal": "node recomputations per deletion",
        "root_computations": "root computations",
        "model_equals_retrain": "model equals training on the remaining data (same key)",
        "clients_agree": "clients agree on the model",
        "loss": f"loss ({method}, after the stream)",
        "loss_kmeans": "loss (k-means++ and Lloyd's to convergence)",
        "loss_ratio": "loss ratio",
        "silhouette": f"silhouette ({method})",
        "silhouette_kmeans": "silhouette (k-means++)",
        "nmi": f"NMI ({method}, arithmetic)",
        "nmi_kmeans": "NMI (k-means++, arithmetic)",
        "train_ms": f"train ms ({method}, centralised replay)",
        "removal_ms_mean": f"mean ms per deletion ({method})",
        "removal_ms_std": f"std of ms per deletion ({method})",
        "amortised_ms": f"amortised ms per deletion ({method}, training included)",
        "retrain_ms": "k-means retraining ms (mean of the timed ones)",
        "retrain_amortised_ms": "amortised ms per deletion (k-means, retrain each time)",
        "speedup_over_retrain": "speedup over retraining (amortised)",
        "n_retrains_timed": "k-means retrains timed",
    }


def paper_figures(data_set: str, method: str) -> dict[str, float]:
    """The paper's Tables 1-4 figures of ``method`` on ``data_set``, keyed like the summary.

    Args:
        data_set: the data set's name (the tables have celltype, covtype, mnist, postures,
            gaussian and botnet). method: ``"Q-k-means"`` or ``"DC-k-means"``, optionally
            followed by a variant in parentheses.

    Returns:
        ``loss_ratio``, ``silhouette``, ``nmi``, ``silhouette_kmeans``, ``nmi_kmeans``,
        ``amortised_ms``, ``retrain_amortised_ms`` and ``speedup_over_retrain`` (the ratio of the
        two amortised times, Table 4); empty for other data sets.

    References:
        Ginart et al., "Making AI Forget You: Data Deletion in Machine Learning", NeurIPS 2019,
        Tables 1-4.
    """
    table = streams.PAPER_TABLES.get(data_set)
    if table is None:
        return {}
    col = _PAPER_COLUMN[method.split(" (")[0]]
    amortised_s = table["amortised s"]
    return {
        "loss_ratio": table["loss ratio"][col],
        "silhouette": table["silhouette"][col],
        "nmi": table["nmi"][col],
        "silhouette_kmeans": table["silhouette"][0],
        "nmi_kmeans": table["nmi"][0],
        "amortised_ms": 1e3 * amortised_s[col],
        "retrain_amortised_ms": 1e3 * amortised_s[0],
        "speedup_over_retrain": amortised_s[0] / amortised_s[col],
    }


def _headline_first(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with the keys of :data:`HEADLINE` first, in that order, then the others."""
    return {**{key: summary[key] for key in HEADLINE if key in summary}, **summary}


def _number(value: float) -> float | None:
    """``value`` as a float, or ``None`` where it is not finite (JSON has no NaN or infinity)."""
    value = float(value)
    return value if math.isfinite(value) else None


def quality_rows(
    x: np.ndarray, y: np.ndarray | None, keep: np.ndarray, centroids: np.ndarray, key: jax.Array, k: int
) -> dict[str, Any]:
    """Loss, silhouette and NMI of the model on the remaining data, beside k-means++ with Lloyd's
    to convergence (same key); ``None`` where a figure is not defined (no labels, one cluster)."""
    ids = np.flatnonzero(keep)
    xr, yr = x[keep], (y[keep] if y is not None else None)
    with progress_task("quality: k-means++ to convergence, silhouette, NMI"):
        mine = streams.quality(xr, yr, centroids)
        base = streams.quality(xr, yr, streams.converged_kmeans(xr, ids, k, key))
    return {
        "loss": mine["loss"],
        "loss_kmeans": base["loss"],
        "loss_ratio": _number(mine["loss"] / base["loss"]) if base["loss"] > 0 else None,
        "silhouette": _number(mine["silhouette"]),
        "silhouette_kmeans": _number(base["silhouette"]),
        "nmi": _number(mine["nmi"]),
        "nmi_kmeans": _number(base["nmi"]),
    }


def timed_rows(
    method: str, x: np.ndarray, ids: np.ndarray, stream: tuple[int, ...], k: int, key: jax.Array, retrains: int,
    **stream_options: Any,
) -> dict[str, Any]:
    """Time ``method`` on the stream in one process, and plain k-means retrained after each
    deletion, after compiling every shape they meet (so that compilation is not timed).

    Args:
        method: ``"q"`` (Q-k-means) or ``"dc"`` (DC-k-means).
        x: ``[n, d]`` float64 points; ids: ``[n]`` int64 their ids; stream: the ids to delete.
        k: clusters; key: the model key; retrains: k-means retrains timed (evenly spread; the
            other deletions are charged their mean).
        **stream_options: ``iterations`` (T) and ``widths`` (DC widths) for the warm-up, the rest
            (``q_config``, or ``dc_config`` and ``leaves``) for :func:`streams.time_stream`.

    Returns:
        The timing keys of the summary, in milliseconds (``train_ms``, ``removal_ms_mean``,
        ``removal_ms_std``, ``amortised_ms``, ``retrain_ms``, ``retrain_amortised_ms``), the
        speed-up of the amortised times, and the cumulative times (seconds) for the plot.
    """
    warm = {"iterations": stream_options.pop("iterations"), "widths": stream_options.pop("widths", ())}
    with progress_task("compiling the kernels of the timed replay"):
        streams.warm_up(x, k, len(stream), method=method, **warm)
    with progress_task(f"timed replay of the {len(stream)} deletions"):
        timing = streams.time_stream(method, x, ids, stream, key=key, **stream_options)
    with progress_task(f"k-means baseline: {retrains} timed retrains"):
        baseline = streams.time_baseline(x, ids, stream, k, key=key, retrains=retrains)
    removal_ms = 1e3 * np.asarray(timing.deletion_s)
    measured = 1e3 * np.asarray(baseline.deletion_s)  # estimated entries repeat the measured mean
    return {
        "train_ms": 1e3 * timing.train_s,
        "removal_ms_mean": float(removal_ms.mean()),
        "removal_ms_std": float(removal_ms.std()),
        "amortised_ms": 1e3 * timing.amortised_s,
        "retrain_ms": float(measured.mean()),
        "retrain_amortised_ms": 1e3 * baseline.amortised_s,
        "speedup_over_retrain": _number(baseline.amortised_s / timing.amortised_s),
        "n_retrains_timed": min(retrains, len(stream)),
        "cumulative_time_s": timing.cumulative_s.tolist(),
        "retrain_cumulative_time_s": baseline.cumulative_s.tolist(),
    }


def plot_cumulative(ax: Any, summary: Mapping[str, Any]) -> None:
    """Cumulative time over the deletion stream: the method against retraining from scratch.

    The time axis is logarithmic when the values span more than two decades; deletions (a count)
    get integer ticks; the legend sits below the axes.
    """
    from matplotlib.ticker import MaxNLocator

    mine, base = summary.get("cumulative_time_s"), summary.get("retrain_cumulative_time_s")
    if not mine:
        ax.text(0.5, 0.5, "no timing (--no-timing)", ha="center", va="center")
        ax.set_axis_off()
        return
    ax.plot(range(len(mine)), mine, label=f"{summary.get('method', 'method')} (train, then deletions)")
    ax.plot(range(len(base)), base, label="k-means (retrain on every deletion)")
    times = [t for t in (*mine, *base) if t > 0]
    log = len(times) >= 2 and max(times) > 100 * min(times)
    if log:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("deletions served")
    ax.set_ylabel("cumulative time s" + (" (log scale)" if log else ""))
    ax.set_title("cumulative time over the stream")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, fontsize="small", frameon=False)


def stream_summary(
    variant: Mapping[str, Any], *, data_set: str, method: str, x: np.ndarray, y: np.ndarray | None,
    stream: tuple[int, ...], centroids: np.ndarray, key: jax.Array, k: int, timed: Any,
) -> dict[str, Any]:
    """The summary of a run (the report's ``results``), whichever the method: the data set's and
    the run's terms, ``variant`` (the method's own rows), the model's quality on the remaining
    data beside k-means++ (:func:`quality_rows`), the timed replay (``timed()``, unless it is
    ``None``), the paper's figures and the final centroids; :data:`HEADLINE` keys first.

    Args:
        variant: the method's rows, in order (after ``n_removals``).
        data_set: the data set's name; method: ``"Q-k-means"`` or ``"DC-k-means"``, optionally
            with a variant in parentheses.
        x: ``[n, d]`` float64 pooled points; y: their labels or ``None``; stream: the deleted ids.
        centroids: the final model ``[k, d]``; key: the model key; k: clusters.
        timed: ``None`` or a callable returning the timing rows (:func:`timed_rows`).
    """
    n, d = x.shape
    summary: dict[str, Any] = {"data_set": data_set, "method": method, "n_points": n, "d": d, "k": k,
                               "n_removals": len(stream), **variant}
    summary.update(quality_rows(x, y, remaining(n, stream), centroids, key, k))
    if timed is not None:
        summary.update(timed())
    paper = paper_figures(data_set, method)
    if paper:
        summary["paper"] = paper
    summary["centroids"] = centroids.tolist()
    return _headline_first(summary)


def remaining(n: int, stream: tuple[int, ...]) -> np.ndarray:
    """``bool [n]``: the points left after the deletion stream."""
    keep = np.ones(n, dtype=bool)
    keep[list(stream)] = False
    return keep
