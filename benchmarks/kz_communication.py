"""Communication and cost of distributed (k,z)-center against z: Guo & Li against every baseline.

What it measures
----------------
One data set (the spec's synthetic Gaussian mixture, with 10% of n outliers injected by the
spec's recipe), split at random over m machines. For each z from 0 to 10% of n, in the same run:

* ``dist-kzc`` (Guo & Li, this project's protocol: extent round, PASS2, search over the grid,
  refinement), with eps = 0.1 (linear search, and binary search: fewer fetches) and eps = 1 (the
  paper's cheaper variant);
* the distributed baselines ``random-random``, ``random-kzc``, ``mkcwm``, ``glz``, ``glz-z``;
* the centralised ``greedy``, ``charikar`` and ``kzc`` (their "communication" is shipping all
  the data: n d words, shown for scale).

Every distributed method runs as sans-IO machines through the synchronous harness, so its frames
go through the real codec and its bytes are metered exactly as over a transport. The table gives,
per method and z: words (scalars, all messages), paper words (points x d of the data uploads, the
paper's unit), payload bytes, message phases, and the radius after removing z points (the
paper's objective). The claim under test (Guo & Li, Fig. 3 and Theorem 1.1): dist-kzc's
communication stays flat as z grows, while random-*, MKCWM and GLZ-z grow as m d (k+z).

``--means`` adds the (k,z)-means table: Guo & Li's truncated coresets against BEL (words and
trimmed cost) and centralised k-means-- (cost only).

A plot (words against z on a log scale, and the radius against z) is written to ``--plot``
(default: ``kz_communication.png`` in the system's temporary directory).

``--json PATH`` writes one record per row: table ``kz_center`` (``method``, ``z``, ``centralised``,
``words_total``, ``words_points``, ``payload_bytes``, ``message_phases``, ``radius_z_removed``,
``time_s``; the centralised methods' words are the whole data set, n d, and their bytes and phases
are ``null``), table ``kz_center_growth`` (``method``, ``words_ratio_max_z_to_zero``) and, with
``--means``, table ``kz_means`` (``method``, ``z``, ``words_total``, ``trimmed_cost``).

Run::

    python benchmarks/kz_communication.py            # n = 4000 + 400 outliers, m = 5, k = 10
    python benchmarks/kz_communication.py --quick    # n = 300 + 30, z in {0, 30}: a smoke test
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from rich.table import Table

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, solvers
from fedproto.algorithms.kzclustering.baselines import (
    METHODS,
    BaselineConfig,
    BaselineCoordinator,
    BaselineMachine,
    centralised_kzc,
    charikar,
    greedy,
)
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.data import synthetic_dataset
from fedproto.algorithms.kzclustering.means import (
    KzMeansConfig,
    KzMeansCoordinator,
    KzMeansMachine,
    centralised_kmeans_minus_minus,
)
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine, machine_name
from fedproto.data import partition
from fedproto.testing.harness import Harness


def run_machines(machines: dict) -> tuple[object, object]:
    harness = Harness(machines)
    results = harness.run()
    report = harness.meter.report(protocol="bench", transport="harness", session=0, parties=list(machines))
    return results[COORDINATOR], report


def dist_kzc(x, parts, k, z, eps, search="linear"):
    config = KzCenterConfig(k=k, z=z, eps=eps, n_machines=len(parts), d=x.shape[1], search=search)
    names = [machine_name(i) for i in range(len(parts))]
    machines = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMachine(name, config=config, points=x[parts[i]])
    result, report = run_machines(machines)
    return result.centres, result.total_words, result.representatives * x.shape[1], report


def baseline(method, x, parts, k, z, seed):
    config = BaselineConfig(method, k=k, z=z, n_machines=len(parts), d=x.shape[1], seed=seed)
    names = [machine_name(i) for i in range(len(parts))]
    machines = {COORDINATOR: BaselineCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = BaselineMachine(name, config=config, points=x[parts[i]], index=i)
    result, report = run_machines(machines)
    return result.centres, result.total_words, result.points_received * x.shape[1], report


def kz_means(x, parts, k, z, eps, mode, seed):
    config = KzMeansConfig(k=k, z=z, eps=eps, n_machines=len(parts), d=x.shape[1], mode=mode, seed=seed)
    names = [machine_name(i) for i in range(len(parts))]
    machines = {COORDINATOR: KzMeansCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMeansMachine(name, config=config, points=x[parts[i]], index=i)
    result, report = run_machines(machines)
    return result.centres, result.total_words, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, quick="small instance, two values of z (smoke test)")
    parser.add_argument("--n", type=int, default=None, help="inliers (default 4000; 300 with --quick)")
    parser.add_argument("--d", type=int, default=5, help="features (default 5)")
    parser.add_argument("--k", type=int, default=10, help="centres (default 10)")
    parser.add_argument("--machines", type=int, default=5, help="machines m (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--means", action="store_true", help="also run the (k,z)-means comparison")
    parser.add_argument("--plot", default=None, help="where to write the plot (PNG/SVG/PDF)")
    args = parse_args(parser)
    n = args.n or (300 if args.quick else 4000)
    injected = n // 10
    data = synthetic_dataset(n, args.d, args.k, injected, seed=args.seed)
    x = data.x
    total = x.shape[0]
    parts = partition(total, args.machines, seed=args.seed)
    zs = sorted({0, injected} if args.quick else {0, injected // 8, injected // 4, injected // 2, injected})
    console = make_console()
    print_machine_facts(console, "distributed (k,z)-center: communication against z", {
        "data": f"{data.name} (n = {total}, d = {args.d}, {injected} injected outliers)",
        "machines m": args.machines, "k": args.k, "z": ", ".join(map(str, zs)),
    })

    methods = ["dist-kzc (eps=0.1)", "dist-kzc (eps=0.1, binary)", "dist-kzc (eps=1)", *METHODS,
               "greedy", "charikar", "kzc"]
    rows: dict[str, list[dict]] = {name: [] for name in methods}
    for z in zs:
        for name in methods:
            t0 = time.perf_counter()
            report = None
            if name.startswith("dist-kzc"):
                eps = 0.1 if "0.1" in name else 1.0
                search = "binary" if "binary" in name else "linear"
                centres, words, paper, report = dist_kzc(x, parts, args.k, z, eps, search)
            elif name in METHODS:
                centres, words, paper, report = baseline(name, x, parts, args.k, z, args.seed)
            else:
                if name == "greedy":
                    idx = greedy(x, args.k)
                elif name == "charikar":
                    idx = charikar(x, args.k, z)[0]
                else:
                    idx = centralised_kzc(x, args.k, z)
                centres, words, paper = x[idx], total * args.d, total * args.d
            elapsed = time.perf_counter() - t0
            radius = solvers.center_cost(_kernels.nearest_centres(x, centres)[0], z)
            rows[name].append({
                "z": z, "words": words, "paper": paper, "radius": radius, "s": elapsed,
                "bytes": report.payload_bytes if report else None,
                "phases": report.communication_rounds if report else None,
            })

    table = Table(title="(k,z)-center: communication and radius (z points removed) against z", title_justify="left")
    for col in ("method", "z", "words (all)", "paper words", "payload bytes", "phases", "radius", "time s"):
        table.add_column(col, justify="right" if col != "method" else "left")
    records = []
    for name in methods:
        for row in rows[name]:
            central = row["bytes"] is None
            records.append(record(
                "kz_center", method=name, z=row["z"], centralised=central, words_total=row["words"],
                words_points=None if central else row["paper"], payload_bytes=row["bytes"],
                message_phases=row["phases"], radius_z_removed=row["radius"], time_s=row["s"],
            ))
            table.add_row(
                name, str(row["z"]),
                f"{row['words']:,}" + (" (all data)" if central else ""),
                f"{row['paper']:,}" if not central else "-",
                f"{row['bytes']:,}" if not central else "-",
                str(row["phases"]) if not central else "-",
                f"{row['radius']:.3f}", f"{row['s']:.2f}",
            )
        table.add_section()
    console.print(table)

    growth = Table(title="words at the largest z / words at z = 0 (flat = 1)", title_justify="left")
    growth.add_column("method")
    growth.add_column("ratio", justify="right")
    for name in methods[:-3]:
        first, last = rows[name][0]["words"], rows[name][-1]["words"]
        growth.add_row(name, f"{last / first:.2f}")
        records.append(record("kz_center_growth", method=name, words_ratio_max_z_to_zero=last / first))
    console.print(growth)

    means_rows: dict[str, list[dict]] = {}
    if args.means:
        eps = 0.3
        means_rows = {"ours (truncated coresets)": [], "bel": [], "k-means-- (central)": []}
        for z in zs:
            for name in means_rows:
                if name == "k-means-- (central)":
                    centres, words = centralised_kmeans_minus_minus(x, args.k, z, seed=args.seed), total * args.d
                    budget = z
                else:
                    mode = "bel" if name == "bel" else "truncated"
                    centres, words, _ = kz_means(x, parts, args.k, z, eps, mode, args.seed)
                    budget = (1 + eps) * z if mode == "truncated" else z
                cost = solvers.trimmed_cost(_kernels.nearest_centres(x, centres)[0], budget, 2)
                means_rows[name].append({"z": z, "words": words, "cost": cost})
        mtable = Table(title="(k,z)-means: words and trimmed cost ((1+eps)z removed for ours, z for the others)",
                       title_justify="left")
        for col in ("method", "z", "words", "cost"):
            mtable.add_column(col, justify="right" if col != "method" else "left")
        for name, items in means_rows.items():
            for row in items:
                mtable.add_row(name, str(row["z"]), f"{row['words']:,}", f"{row['cost']:.1f}")
                records.append(record("kz_means", method=name, z=row["z"], words_total=row["words"],
                                      trimmed_cost=row["cost"]))
            mtable.add_section()
        console.print(mtable)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    # 11 methods: tab20's ten strong hues, then a light one; centralised methods dashed.
    tab20 = plt.get_cmap("tab20")
    colours = [tab20(i) for i in (*range(0, 20, 2), *range(1, 20, 2))]
    markers = "osD^v<>pPXh*"
    for i, name in enumerate(methods):
        zs_ = [r["z"] for r in rows[name]]
        style = "--" if name in ("greedy", "charikar", "kzc") else "-"
        for ax, key in ((axes[0], "words"), (axes[1], "radius")):
            ax.plot(zs_, [r[key] for r in rows[name]], style, marker=markers[i % len(markers)],
                    color=colours[i % len(colours)], label=name)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("words (all messages, log scale)")
    axes[0].set_title("communication against z")
    radii = [r["radius"] for name in methods for r in rows[name] if r["radius"] > 0]
    if radii and max(radii) > 100 * min(radii):
        axes[1].set_yscale("log")
    axes[1].set_ylabel("radius with z outliers removed" + (" (log scale)" if axes[1].get_yscale() == "log" else ""))
    axes[1].set_title("cost against z")
    for ax in axes:
        ax.set_xlabel("z (outliers allowed)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", frameon=False)
    fig.suptitle(f"distributed (k,z)-center on {data.name} (n = {total:,}, m = {args.machines}, k = {args.k})")
    path = Path(args.plot) if args.plot else Path(tempfile.gettempdir()) / "kz_communication.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    console.print(f"plot written to {path}")
    write_records(args.json, records, console)


if __name__ == "__main__":
    main()
