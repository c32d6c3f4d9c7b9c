"""Q-k-means and DC-k-means deletion streams against retraining, beside the paper's Tables 1-4.

What it measures
----------------
The paper's online-deletion protocol (Ginart et al. 2019, Sec. 5; spec deletion-kmeans.md 5.2):
train once, then serve m deletion requests drawn uniformly without replacement (m = 1,000; 10 with
``--quick``), timing each; amortised time = (training + all deletions) / m. Per data set and
replicate (5; 1 with ``--quick``), with the replicate's key ``PRNGKey(r)`` and its own stream:

* Q-k-means (T = 10, gamma = 0.2, eps from the paper's rule) and DC-k-means (depth 1, w from the
  paper's rule, random leaves), centralised (`fedproto.algorithms.deletion.streams.time_stream`), every
  deletion exact (certified or retrained for Q, leaf-to-root path for DC);
* the baseline, plain k-means (the same in-house keyed k-means++ seeding and 10 Lloyd iterations,
  jitted), which retrains from scratch on every request. Retraining 1,000 times is the cost being
  avoided, so only ``--retrains`` retrains (default 20; 2 with ``--quick``), spread over
  the stream, are timed and the other requests are charged their mean.

Compilation is excluded (`streams.warm_up` compiles every padded shape the stream meets first),
except with ``--quick``: compiling those shapes takes tens of seconds, so the smoke test skips the
warm-up and its times include compilation (the output says so; they are not measurements).
Absolute times are not comparable with the paper's: its baseline is pure-Python loops on one core
of a Xeon E5-2640v4, ours is jitted (which is why our speedups are smaller). The second table
shows loss ratio (to k-means++ with Lloyd's to convergence, same key), silhouette (on at most
10,000 points) and NMI (arithmetic mean) of the *trained* models, next to the paper's.

Data sets: Celltype (``celltype.npz`` in a ``FEDPROTO_DATA`` directory, already in [0, 1]); the paper's Gaussian
recipe (5 components, d = 25, variance 0.8, min-max scaled; n = 100,000; ``--quick`` runs this set
alone, with n = 500, unless ``--data`` names others);
scikit-learn's digits divided by 16 (pixels in [0, 1]) as the offline stand-in for MNIST (the
paper's MNIST has n = 60,000 and d = 784; digits has 1,797 x 64, so its row is not the same
experiment, only the closest offline one).

A figure of the cumulative time over the stream (replicate 0; one panel per data set) is written
to ``--plot`` (default: ``deletion_streams.png`` in the system's temporary directory).

``--json PATH`` writes one record per row: table ``deletion_timing`` (``data_set``, ``n_points``,
``d``, ``k``, ``lattice_step`` (Q-k-means' eps), ``dc_width``, ``n_deletions``, ``replicates``,
``kmeans_amortised_s_mean``/``_std``, ``q_amortised_s_mean``/``_std``, ``q_speedup``,
``paper_q_speedup``, ``dc_amortised_s_mean``/``_std``, ``dc_speedup``, ``paper_dc_speedup``,
``q_retrains_mean``) and table ``deletion_quality`` (``data_set``, ``method``,
``loss_ratio_mean``/``_std``, ``paper_loss_ratio``, ``silhouette_mean``/``_std``,
``paper_silhouette``, ``nmi_mean``/``_std``, ``paper_nmi``); a ``*_std`` is ``null`` with one
replicate.

Run::

    python benchmarks/deletion_streams.py            # full (5 replicates x 1,000 deletions; minutes)
    python benchmarks/deletion_streams.py --quick    # smoke test: Gaussian n = 500, 10 deletions, no warm-up
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import jax
import numpy as np

from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.dckmeans import DCKMeansConfig, default_width
from fedproto.algorithms.deletion.qkmeans import QKMeansConfig, default_epsilon
from fedproto.data import load_dataset
from fedproto.datasets import DatasetError, dataset_path
from rich.table import Table


def load(name: str, quick: bool) -> tuple[np.ndarray, np.ndarray, int, str]:
    """``(x in [0, 1]^d, labels, k, paper row)``."""
    if name == "celltype":
        try:
            path = dataset_path("celltype")
        except DatasetError as exc:
            raise SystemExit(str(exc)) from None
        with np.load(path, allow_pickle=False) as archive:
            return np.asarray(archive["X"], dtype=np.float64), archive["y"].astype(np.int64), 4, "celltype"
    if name == "gaussian":  # the builder behind ``fedproto run ... --data gaussian`` / ``gaussian-small``
        ds = streams.gaussian_dataset(0, 100 if quick else 20_000)
        return ds.x, ds.y, 5, "gaussian"
    if name == "digits":
        ds = load_dataset("digits")
        return ds.x / 16.0, ds.y, 10, "mnist"
    raise ValueError(name)


def spread(values: list[float]) -> tuple[float, float | None]:
    """``(mean, sample std)``; the std is ``None`` for one replicate."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def mean_std(values: list[float], digits: int = 3) -> str:
    """``mean ± std`` (one replicate: the value)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}g}"
    return f"{statistics.mean(values):.{digits}g} ± {statistics.stdev(values):.2g}"


def mean_rel(values: list[float]) -> str:
    """``mean ±relative std`` for times (one replicate: the value)."""
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.3g}"
    return f"{mean:.3g} ±{100 * statistics.stdev(values) / mean:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, quick="1 replicate, 10 deletions, a 500-point Gaussian set only, no warm-up: "
                         "times include compilation (a smoke test)")
    parser.add_argument("--data", nargs="*", default=None, choices=["celltype", "gaussian", "digits"],
                        help="data sets (default: all three; gaussian alone with --quick)")
    parser.add_argument("--removals", "--deletions", dest="removals", type=int, default=None,
                        help="deletions per stream (1000; 20 quick)")
    parser.add_argument("--replicates", type=int, default=None, help="replicates (5; 1 quick)")
    parser.add_argument("--retrains", "--baseline-retrains", dest="retrains", type=int, default=None,
                        help="timed baseline retrains (20; 2 quick)")
    parser.add_argument("--plot", default=str(Path(tempfile.gettempdir()) / "deletion_streams.png"))
    args = parse_args(parser)
    if args.data is None:
        args.data = ["gaussian"] if args.quick else ["celltype", "gaussian", "digits"]
    m = args.removals or (10 if args.quick else 1000)
    reps = args.replicates or (1 if args.quick else 5)
    retrains = args.retrains or (2 if args.quick else 20)

    console = make_console()
    print_machine_facts(console, "Deletion streams: Q-k-means and DC-k-means vs retraining",
                        {"deletions per stream": m, "replicates": reps, "timed baseline retrains": retrains,
                         "compilation": "INCLUDED in the times (--quick skips the warm-up: not measurements)"
                         if args.quick else "excluded (warm-up)"})

    timing_rows, quality_rows, curves, records = [], [], {}, []
    for name in args.data:
        x, y, k, paper_row = load(name, args.quick)
        n, d = x.shape
        ids = np.arange(n)
        eps, w = default_epsilon(n, k, d), default_width(n)
        q_config = QKMeansConfig(k=k)
        dc_config = DCKMeansConfig(k=k)
        if not args.quick:
            streams.warm_up(x, k, m, method="q")
            streams.warm_up(x, k, m, method="dc", widths=(w,))
        rec: dict[str, list[float]] = {key: [] for key in (
            "base", "q", "dc", "q_retrains", "q_loss", "dc_loss", "q_sil", "dc_sil", "b_sil", "q_nmi", "dc_nmi",
            "b_nmi")}
        for r in range(reps):
            key = jax.random.PRNGKey(r)
            stream = streams.deletion_stream(ids, m, seed=1000 + r)
            tq = streams.time_stream("q", x, ids, stream, q_config=q_config, key=key)
            tdc = streams.time_stream("dc", x, ids, stream, dc_config=dc_config, key=key)
            tb = streams.time_baseline(x, ids, stream, k, key=key, retrains=retrains)
            if r == 0:
                curves[name] = (tq.cumulative_s, tdc.cumulative_s, tb.cumulative_s)
            base = streams.quality(x, y, streams.converged_kmeans(x, ids, k, key), seed=r)
            qq = streams.quality(x, y, tq.centroids, seed=r)
            qd = streams.quality(x, y, tdc.centroids, seed=r)
            rec["base"].append(tb.amortised_s)
            rec["q"].append(tq.amortised_s)
            rec["dc"].append(tdc.amortised_s)
            rec["q_retrains"].append(sum(tq.retrained))
            rec["q_loss"].append(qq["loss"] / base["loss"])
            rec["dc_loss"].append(qd["loss"] / base["loss"])
            for tag, qual in (("q", qq), ("dc", qd), ("b", base)):
                rec[f"{tag}_sil"].append(qual["silhouette"])
                rec[f"{tag}_nmi"].append(qual["nmi"])
        paper = streams.PAPER_TABLES[paper_row]["amortised s"]
        base_s, q_s, dc_s = (statistics.mean(rec[t]) for t in ("base", "q", "dc"))
        (b_mean, b_std), (q_mean, q_std), (dc_mean, dc_std) = (spread(rec[t]) for t in ("base", "q", "dc"))
        records.append(record(
            "deletion_timing", data_set=name, n_points=n, d=d, k=k, lattice_step=eps, dc_width=w, n_deletions=m,
            replicates=reps, kmeans_amortised_s_mean=b_mean, kmeans_amortised_s_std=b_std,
            q_amortised_s_mean=q_mean, q_amortised_s_std=q_std, q_speedup=base_s / q_s,
            paper_q_speedup=paper[0] / paper[1], dc_amortised_s_mean=dc_mean, dc_amortised_s_std=dc_std,
            dc_speedup=base_s / dc_s, paper_dc_speedup=paper[0] / paper[2],
            q_retrains_mean=statistics.mean(rec["q_retrains"]),
        ))
        timing_rows.append([
            name, f"{n:,}", str(d), str(k), f"2^{int(np.log2(eps))}", str(w), mean_rel(rec["base"]),
            mean_rel(rec["q"]), f"{base_s / q_s:.1f}x", f"{paper[0] / paper[1]:.1f}x", mean_rel(rec["dc"]),
            f"{base_s / dc_s:.1f}x", f"{paper[0] / paper[2]:.1f}x", mean_std(rec["q_retrains"], 3),
        ])
        pq = streams.PAPER_TABLES[paper_row]
        for label, col, loss, sil, nmi in (
            ("k-means++", 0, [1.0] * reps, rec["b_sil"], rec["b_nmi"]),
            ("Q-k-means", 1, rec["q_loss"], rec["q_sil"], rec["q_nmi"]),
            ("DC-k-means", 2, rec["dc_loss"], rec["dc_sil"], rec["dc_nmi"]),
        ):
            quality_rows.append([
                name, label, mean_std(loss, 3), f"{pq['loss ratio'][col]:.3f}", mean_std(sil, 3),
                f"{pq['silhouette'][col]:.3f}", mean_std(nmi, 3), f"{pq['nmi'][col]:.3f}",
            ])
            (loss_mean, loss_std), (sil_mean, sil_std), (nmi_mean, nmi_std) = spread(loss), spread(sil), spread(nmi)
            records.append(record(
                "deletion_quality", data_set=name, method=label, loss_ratio_mean=loss_mean, loss_ratio_std=loss_std,
                paper_loss_ratio=pq["loss ratio"][col], silhouette_mean=sil_mean, silhouette_std=sil_std,
                paper_silhouette=pq["silhouette"][col], nmi_mean=nmi_mean, nmi_std=nmi_std,
                paper_nmi=pq["nmi"][col],
            ))

    table = Table(title=f"Amortised seconds per deletion, (train + {m} deletions) / {m}, mean ±relative std over "
                        f"{reps} replicate(s); paper = Table 4 speedup", title_justify="left")
    for col in ("data set", "n", "d", "k", "eps", "w", "k-means s", "Q s", "Q speedup", "paper Q", "DC s",
                "DC speedup", "paper DC", "Q retrains"):
        table.add_column(col, justify="left" if col == "data set" else "right")
    for row in timing_rows:
        table.add_row(*row)
    console.print(table)

    table = Table(title="Quality of the trained models (loss ratio to k-means++, silhouette, NMI arithmetic) "
                        "beside the paper's Tables 1-3 (digits beside MNIST)", title_justify="left")
    for col in ("data set", "method", "loss ratio", "paper", "silhouette", "paper", "NMI", "paper"):
        table.add_column(col, justify="left" if col in ("data set", "method") else "right")
    for row in quality_rows:
        table.add_row(*row)
    console.print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4.4), squeeze=False, layout="constrained")
    for ax, (name, (cq, cdc, cb)) in zip(axes[0], curves.items()):
        for curve, label in ((cq, "Q-k-means"), (cdc, "DC-k-means"), (cb, "k-means (retrain)")):
            ax.plot(range(len(curve)), curve, label=label)
        times = [t for curve in (cq, cdc, cb) for t in curve if t > 0]
        log = len(times) >= 2 and max(times) > 100 * min(times)
        if log:
            ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("deletions served")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("cumulative s (train + deletions)" + (", log scale" if log else ""))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize="small", frameon=False)
    fig.suptitle("Cumulative time over the deletion stream (replicate 0)")
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)
    console.print(f"plot written to {args.plot}")
    if args.quick:
        console.print("--quick: no warm-up, so the times above include JAX compilation (a smoke test, not a "
                      "measurement)")
    write_records(args.json, records, console)


if __name__ == "__main__":
    main()
