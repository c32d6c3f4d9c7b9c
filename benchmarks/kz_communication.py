"""Communication and cost of distributed (k,z)-center against z: Guo & Li against the authors'
scheme and every baseline.

What it measures
----------------
Two data sets, each with 10% of n outliers injected by the spec's recipe and split at random
over m machines (issue 15): the spec's synthetic Gaussian mixture (``gmm``, 4,000 points in
d = 5) and a 4,000-point sample of S1 (``s1``, d = 2, from ``FEDPROTO_DATA`` or the cache of
``fedproto data fetch s1``). For each z
from 0 to the number injected (0, 50, 100, 200, 400), in the same run:

* ``dist-kzc`` (Guo & Li, this project's protocol, eps = 0.1): the default (``probe`` search:
  bisection on count probes, one fetch; tight count test; polishing), the ``linear`` search with
  the paper's count test and no polishing (the default before issue 15), the ``binary`` search,
  and the default at eps = 1;
* ``authors (clusterz scheme)``: a re-implementation (this file's own code, not theirs) of what
  the authors' ``DistributedKZCenter`` (multiplicative mode, repository xyguo/clusterz) sends:

  - every machine's ``n_i`` (m words: their covered-points test needs n);
  - the diameter estimate: 10 random base points requested from random machines (10 words),
    uploaded (10 d), broadcast to every machine (10 d m), each machine's farthest distance from
    each (10 m);
  - bisection on a continuous L from ``[0, min over base points of twice that distance]`` until
    ``ub <= 1.01 lb``: each probe sends L to every machine (m words) and gets back the number of
    balls and of covered points (2 m);
  - the upload request (m words) and the representatives with their weights at the final L
    (``(d + 1)`` words each).

  Their aggregation (a machine's candidate centres are its k + z farthest-first points, the first
  with at least ``eps z / (k m)`` uncovered points within 2L is taken, iterations capped at
  ``k m (1 + 1/eps) - m + 1``) and their coordinator (Charikar with radii 2/4 on the
  representatives, (1+eps)z outliers, its own bisection from 5 ub with ``delta = 0.05``) are
  emulated too, for their radius. Their code draws its randomness from NumPy's global state, so
  each figure is over ``--authors-seeds`` runs (median, and the range). The emulation follows
  their code's structure but not its set-iteration order (which ball is "first"), so its radii
  need not match theirs run for run; issue 15 quotes their measured totals as about 735 to 3,800
  words.
* the distributed baselines ``random-random``, ``random-kzc``, ``mkcwm``, ``glz``, ``glz-z``;
* the centralised ``greedy``, ``charikar`` and ``kzc`` (their "communication" is shipping all the
  data: n d words, shown for scale).

Every distributed method of this project runs as sans-IO machines through the synchronous
harness, so its frames go through the real codec; dist-kzc's words are counted on the frames
themselves (every number of every message, both directions) and checked against the
coordinator's own count. The main table gives, per method and z: words, paper words (points x d
of the data uploads, the paper's unit), payload bytes, message phases, and the radius after
removing z points (the paper's objective). The comparison table gives, per data set and z:
dist-kzc's words (metered), the protocol's formula evaluated on the run (probes P, fetches F,
representatives R), its a-priori bound (``P <= ceil(log2 T) + 1``, one fetch, ``R <=`` the count
bound), the authors' words and the ratio, and both radii. Issue 15's target: ours at most theirs,
in words and in radius, for every z on both data sets, and z = 0 not the most expensive z.

``--means`` adds the (k,z)-means table on the mixture: Guo & Li's truncated coresets against BEL
(words and trimmed cost) and centralised k-means-- (cost only).

A plot (words against z on a log scale, and the radius against z, one row per data set) is
written to ``--plot`` (default: ``kz_communication.png`` in the system's temporary directory).

``--json PATH`` writes one record per row: table ``kz_center`` (``data_set``, ``method``, ``z``,
``centralised``, ``words_total``, ``words_points``, ``payload_bytes``, ``message_phases``,
``radius_z_removed``, ``time_s``; the centralised methods' words are the whole data set, n d, and
their bytes and phases are ``null``; the authors' row gives the medians, bytes ``null``), table
``kz_authors`` (``data_set``, ``z``, ``words_ours``, ``words_formula``, ``words_bound``,
``words_authors_median``/``_min``/``_max``, ``words_ratio_to_authors``, ``radius_ours``,
``radius_authors_median``/``_min``/``_max``, ``radius_ratio_to_authors``, ``authors_runs``,
``quoted_authors_words_low``/``_high``), table ``kz_center_growth`` (``data_set``, ``method``,
``words_ratio_max_z_to_zero``) and, with ``--means``, table ``kz_means``.

Run::

    python benchmarks/kz_communication.py            # n = 4000 + 400 outliers per data set, m = 5, k = 10
    python benchmarks/kz_communication.py --quick    # n = 300 + 30, z in {0, 30}: a smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from _common import add_common_arguments, make_console, parse_args, print_machine_facts, record, write_records
from rich.table import Table

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels, baselines, solvers
from fedproto.algorithms.kzclustering.config import KzCenterConfig
from fedproto.algorithms.kzclustering.data import synthetic_dataset, with_outliers
from fedproto.algorithms.kzclustering.means import (
    KzMeansConfig,
    KzMeansCoordinator,
    KzMeansMachine,
    centralised_kmeans_minus_minus,
)
from fedproto.algorithms.kzclustering.messages import message_words
from fedproto.algorithms.kzclustering.protocol import COORDINATOR, KzCoordinator, KzMachine, machine_name
from fedproto.codec import decode_frame
from fedproto.data import Dataset, find_data_file, load_dataset, partition
from fedproto.testing.harness import Harness

#: Issue 15's quote of the authors' measured totals (all messages), in words.
QUOTED_AUTHORS_WORDS = (735, 3800)

#: dist-kzc variants of the main table: name -> (eps, options).
DIST_KZC = {
    "dist-kzc (default: probe)": (0.1, {}),
    "dist-kzc (linear, paper test)": (0.1, {"search": "linear", "count_test": "paper", "polish": False}),
    "dist-kzc (binary)": (0.1, {"search": "binary"}),
    "dist-kzc (eps=1)": (1.0, {}),
}
AUTHORS = "authors (clusterz scheme)"
CENTRALISED = ("greedy", "charikar", "kzc")


# --- data ------------------------------------------------------------------------------------------


def s1_instance(n: int, outliers: int, seed: int) -> Dataset:
    """A sample of ``n`` points of S1 (without replacement) plus ``outliers`` injected ones."""
    path = find_data_file("s1")
    if path is None:
        raise SystemExit("s1 is in no FEDPROTO_DATA directory nor fetched (fedproto data fetch s1)")
    full = load_dataset(str(path))
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(full.x.shape[0], size=min(n, full.x.shape[0]), replace=False))
    sample = Dataset(f"s1[{idx.shape[0]}]", full.x[idx].astype(np.float64), None, full.paper_k)
    return with_outliers(sample, outliers, seed=seed + 1)


# --- running the protocols -------------------------------------------------------------------------


def run_machines(machines: dict, tamper=None) -> tuple[object, object]:
    harness = Harness(machines, tamper=tamper)
    results = harness.run()
    report = harness.meter.report(protocol="bench", transport="harness", session=0, parties=list(machines))
    return results[COORDINATOR], report


@dataclasses.dataclass
class OurRun:
    centres: np.ndarray
    words: int  # counted on the frames
    words_formula: int
    words_bound: int | None
    paper_words: int
    report: object


def dist_kzc(x: np.ndarray, parts: list[np.ndarray], k: int, z: int, eps: float, options: dict) -> OurRun:
    """One dist-kzc run; words counted on the wire and by the protocol's formula."""
    d = x.shape[1]
    m = len(parts)
    config = KzCenterConfig(k=k, z=z, eps=eps, n_machines=m, d=d, **options)
    names = [machine_name(i) for i in range(m)]
    machines = {COORDINATOR: KzCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = KzMachine(name, config=config, points=x[parts[i]])
    wire = [0]

    def count(frame):
        wire[0] += message_words(decode_frame(frame.data)[1])
        return frame.data

    result, report = run_machines(machines, tamper=count)
    if wire[0] != result.total_words:
        raise AssertionError(f"words on the wire {wire[0]} != the coordinator's count {result.total_words}")
    formula = bound = None
    if config.search == "probe":
        probes = sum(len(p) for p in result.probe_rounds)
        per_probe = 2 + int(config.sends_discarded)
        fixed = m * (d + 3) + m * (k * d + 1) + m
        formula = fixed + m * probes * per_probe + m * len(result.fetches) + (d + 1) * result.representatives
        t = result.grid.shape[0]
        bound = fixed + m * (math.ceil(math.log2(t)) + 1) * per_probe + m + (d + 1) * config.count_bound
        if formula != result.total_words:
            raise AssertionError(f"formula {formula} != metered {result.total_words}")
    return OurRun(result.centres, wire[0], formula or wire[0], bound, result.representatives * d, report)


def baseline(method, x, parts, k, z, seed):
    config = baselines.BaselineConfig(method, k=k, z=z, n_machines=len(parts), d=x.shape[1], seed=seed)
    names = [machine_name(i) for i in range(len(parts))]
    machines = {COORDINATOR: baselines.BaselineCoordinator(COORDINATOR, config=config, machines=names)}
    for i, name in enumerate(names):
        machines[name] = baselines.BaselineMachine(name, config=config, points=x[parts[i]], index=i)
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


# --- the authors' scheme (clusterz, DistributedKZCenter, multiplicative mode), re-implemented ---------


@dataclasses.dataclass(frozen=True)
class AuthorsRun:
    """One emulated run of the authors' scheme: words per part, probes, representatives, centres."""

    words: dict[str, int]
    probes: int
    representatives: int
    centres: np.ndarray

    @property
    def total_words(self) -> int:
        return sum(self.words.values())


def _authors_cover(dist: np.ndarray, facilities: np.ndarray, radius: float, threshold: float, cap: float):
    """Their local covering: repeatedly take the first remaining facility (in index order) with at
    least ``threshold`` uncovered points within 2L; its 4L ball becomes one weighted representative."""
    n = dist.shape[0]
    alive = np.ones(n, dtype=bool)
    order = np.sort(facilities)
    inner = dist[order] <= 2.0 * radius
    outer = dist[order] <= 4.0 * radius
    open_ = np.ones(order.shape[0], dtype=bool)
    reps, weights = [], []
    while alive.any() and len(reps) <= cap:
        sizes = (inner & alive).sum(axis=1)
        ok = np.flatnonzero(open_ & (sizes >= threshold))
        if ok.size == 0:
            break
        j = int(ok[0])
        absorbed = outer[j] & alive
        alive &= ~absorbed
        open_ &= alive[order]
        reps.append(int(order[j]))
        weights.append(int(absorbed.sum()))
    return np.asarray(reps, dtype=np.int64), np.asarray(weights, dtype=np.int64)


def _authors_charikar(points: np.ndarray, weights: np.ndarray, k: int, budget: float, guess: float,
                      rng: np.random.Generator, delta: float = 0.05) -> np.ndarray:
    """Their coordinator: Charikar (densest weighted 2g ball among uncovered points, remove 4g),
    bisecting g from ``min(guess, their diameter estimate)`` until ``ub <= (1 + delta) lb``; the
    last iteration's centres, padded by farthest-first."""
    q = points.shape[0]
    if q <= k:
        return np.arange(q)
    dist = _kernels.pairwise_distances(points)
    bases = [0, *rng.choice(np.arange(1, q), size=min(9, q - 1), replace=False).tolist()]
    ub = 2.0 * min(float(dist[b].max()) for b in bases)
    lb = float(np.sort(dist[int(rng.integers(0, q))])[1])
    g = min(guess, ub)
    total = float(weights.sum())
    centres: list[int] = []
    w = weights.astype(np.float64)
    while ub > (1.0 + delta) * lb:
        alive = np.ones(q, dtype=bool)
        centres = []
        for _ in range(k):
            if not alive.any():
                break
            score = np.where(alive, (dist <= 2.0 * g) @ (w * alive), -1.0)
            p = int(np.argmax(score))
            centres.append(p)
            alive &= dist[p] > 4.0 * g
        if total - float(w[alive].sum()) >= total - budget:
            ub, g = g, (lb + g) / 2.0
        else:
            lb, g = g, (g + ub) / 2.0
    return solvers.pad_centres(points, np.asarray(centres, dtype=np.int64), k)


def authors_scheme(x: np.ndarray, parts: list[np.ndarray], k: int, z: int, eps: float, seed: int,
                   *, base_points: int = 10, delta: float = 0.01) -> AuthorsRun:
    """Emulate the authors' DistributedKZCenter (multiplicative) and count its words (see the module
    docstring for what is counted)."""
    rng = np.random.default_rng(seed)
    m, d = len(parts), x.shape[1]
    local = [x[p] for p in parts]
    dists = [_kernels.pairwise_distances(xi) for xi in local]
    n = sum(xi.shape[0] for xi in local)
    facilities = []
    for xi in local:
        start = int(rng.integers(0, xi.shape[0]))
        facilities.append(solvers.farthest_first(xi, min(k + z, xi.shape[0]), start=start)[0])
    owners = rng.integers(0, m, size=base_points)
    base = np.asarray([local[o][int(rng.integers(0, local[o].shape[0]))] for o in owners])
    farthest = np.max([_kernels.pairwise_distances(base, xi).max(axis=1) for xi in local], axis=0)
    lb, ub = 0.0, float(2.0 * farthest.min())
    threshold = eps * z / (k * m)
    cap = k * m * (1.0 + 1.0 / eps) - m + 1
    most_balls = k * m * (1.0 + 1.0 / eps)
    least_covered = max(n - (1.0 + eps) * z, 1)
    probes, state, settled = 0, None, False
    g = (lb + ub) / 2.0
    while ub > (1.0 + delta) * lb and ub > 1e-3:
        covers = [_authors_cover(dist, f, g, threshold, cap) for dist, f in zip(dists, facilities, strict=True)]
        probes += 1
        balls = sum(c[0].shape[0] for c in covers)
        covered = sum(int(c[1].sum()) for c in covers)
        if balls > most_balls or covered < least_covered:
            lb = g
        else:
            ub, state = g, covers
            if ub <= (1.0 + delta) * lb or ub <= 1e-3:
                settled = True
                break
        g = (lb + ub) / 2.0
    if not settled:
        state = [_authors_cover(dist, f, ub, threshold, cap) for dist, f in zip(dists, facilities, strict=True)]
    points = np.concatenate([xi[c[0]] for xi, c in zip(local, state, strict=True)], axis=0)
    weights = np.concatenate([c[1] for c in state])
    chosen = _authors_charikar(points, weights, k, (1.0 + eps) * z, 5.0 * ub, rng)
    words = {
        "n_i": m,
        "diameter": base_points + base_points * d + base_points * d * m + base_points * m,
        "probes": 3 * m * probes,
        "upload": m + points.shape[0] * (d + 1),
    }
    return AuthorsRun(words, probes, int(points.shape[0]), points[chosen])


# --- the run ---------------------------------------------------------------------------------------


def radius_z(x: np.ndarray, centres: np.ndarray, z: int) -> float:
    return float(solvers.center_cost(_kernels.nearest_centres(x, centres)[0], z))


def run_instance(console, data: Dataset, args, k: int, zs: list[int], records: list) -> dict:
    x = data.x
    total, d = x.shape
    parts = partition(total, args.machines, seed=args.seed)
    methods = [*DIST_KZC, AUTHORS, *baselines.METHODS, *CENTRALISED]
    rows: dict[str, list[dict]] = {name: [] for name in methods}
    compare = []
    for z in zs:
        for name in methods:
            t0 = time.perf_counter()
            report = None
            row: dict = {"z": z}
            if name in DIST_KZC:
                eps, options = DIST_KZC[name]
                run = dist_kzc(x, parts, k, z, eps, options)
                centres, words, paper, report = run.centres, run.words, run.paper_words, run.report
                if not options and eps == 0.1:
                    ours = run
            elif name == AUTHORS:
                runs = [authors_scheme(x, parts, k, z, 0.1, seed=args.seed + s) for s in range(args.authors_seeds)]
                totals = np.asarray([r.total_words for r in runs])
                radii = np.asarray([radius_z(x, r.centres, z) for r in runs])
                centres = None
                words = int(np.median(totals))
                paper = int(np.median([r.representatives * d for r in runs]))
                row["phases"] = int(np.median([7 + 2 * r.probes for r in runs]))
                row["radius"] = float(np.median(radii))
                authors = (totals, radii)
            elif name in baselines.METHODS:
                centres, words, paper, report = baseline(name, x, parts, k, z, args.seed)
            else:
                idx = (baselines.greedy(x, k) if name == "greedy" else baselines.charikar(x, k, z)[0]
                       if name == "charikar" else baselines.centralised_kzc(x, k, z))
                centres, words, paper = x[idx], total * d, total * d
            row.update({"words": words, "paper": paper, "s": time.perf_counter() - t0, "kind": (
                "central" if name in CENTRALISED else "authors" if name == AUTHORS else "ours")})
            if centres is not None:
                row["radius"] = radius_z(x, centres, z)
            row["bytes"] = report.payload_bytes if report else None
            row.setdefault("phases", report.communication_rounds if report else None)
            rows[name].append(row)
        totals, radii = authors
        ours_radius = rows[next(iter(DIST_KZC))][-1]["radius"]
        compare.append({
            "z": z, "ours": ours.words, "formula": ours.words_formula, "bound": ours.words_bound,
            "authors": float(np.median(totals)), "authors_min": int(totals.min()), "authors_max": int(totals.max()),
            "radius": ours_radius, "authors_radius": float(np.median(radii)),
            "authors_radius_min": float(radii.min()), "authors_radius_max": float(radii.max()),
        })

    table = Table(title=f"(k,z)-center: communication and radius (z points removed) against z, {data.name} "
                        f"(n = {total:,}, d = {d}, m = {args.machines}, k = {k})", title_justify="left")
    for col in ("method", "z", "words (all)", "paper words", "payload bytes", "phases", "radius", "time s"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for name in methods:
        for row in rows[name]:
            central = row["kind"] == "central"
            records.append(record(
                "kz_center", data_set=data.name, method=name, z=row["z"], centralised=central,
                words_total=row["words"], words_points=None if central else row["paper"],
                payload_bytes=row["bytes"], message_phases=row["phases"], radius_z_removed=row["radius"],
                time_s=row["s"],
            ))
            table.add_row(
                name, str(row["z"]),
                f"{row['words']:,}" + (" (all data)" if central else " (median)" if row["kind"] == "authors" else ""),
                f"{row['paper']:,}" if not central else "-",
                f"{row['bytes']:,}" if row["bytes"] is not None else "-",
                str(row["phases"]) if row["phases"] is not None else "-",
                f"{row['radius']:.4g}", f"{row['s']:.2f}",
            )
        table.add_section()
    console.print(table)

    low, high = QUOTED_AUTHORS_WORDS
    ctable = Table(
        title=f"dist-kzc (default) against the authors' scheme on {data.name}: words (all messages, both "
              f"directions) and radius (z removed); authors: median \\[min-max] over {args.authors_seeds} emulated "
              f"runs (issue 15 quotes their measured totals as about {low:,} to {high:,} words)",
        title_justify="left",
    )
    for col in ("z", "ours (metered)", "formula", "a-priori bound", "authors' scheme", "ours / authors",
                "our radius", "authors' radius", "ours / authors "):
        ctable.add_column(col, justify="right")
    for c in compare:
        words_ratio = c["ours"] / c["authors"]
        radius_ratio = c["radius"] / c["authors_radius"] if c["authors_radius"] > 0 else math.nan
        ctable.add_row(
            str(c["z"]), f"{c['ours']:,}", f"{c['formula']:,}",
            f"{c['bound']:,}" if c["bound"] is not None else "-",
            f"{c['authors']:,.0f} \\[{c['authors_min']:,}-{c['authors_max']:,}]",
            f"{words_ratio:.2f} {'ok' if words_ratio <= 1 else 'MISS'}",
            f"{c['radius']:.4g}",
            f"{c['authors_radius']:.4g} \\[{c['authors_radius_min']:.4g}-{c['authors_radius_max']:.4g}]",
            f"{radius_ratio:.3f} {'ok' if radius_ratio <= 1 else 'MISS'}",
        )
        records.append(record(
            "kz_authors", data_set=data.name, z=c["z"], words_ours=c["ours"], words_formula=c["formula"],
            words_bound=c["bound"], words_authors_median=c["authors"], words_authors_min=c["authors_min"],
            words_authors_max=c["authors_max"], words_ratio_to_authors=words_ratio, radius_ours=c["radius"],
            radius_authors_median=c["authors_radius"], radius_authors_min=c["authors_radius_min"],
            radius_authors_max=c["authors_radius_max"], radius_ratio_to_authors=radius_ratio,
            authors_runs=args.authors_seeds, quoted_authors_words_low=low, quoted_authors_words_high=high,
        ))
    console.print(ctable)
    ours_words = [c["ours"] for c in compare]
    console.print(
        f"{data.name}: dist-kzc's words at z = 0: {ours_words[0]:,}, the largest over z: {max(ours_words):,} "
        f"({'z = 0 is not the largest' if ours_words[0] < max(ours_words) else 'z = 0 is the largest'})"
    )

    growth = Table(title=f"words at the largest z / words at z = 0 on {data.name} (flat = 1)", title_justify="left")
    growth.add_column("method")
    growth.add_column("ratio", justify="right")
    for name in methods:
        if name in CENTRALISED:
            continue
        first, last = rows[name][0]["words"], rows[name][-1]["words"]
        growth.add_row(name, f"{last / first:.2f}")
        records.append(record("kz_center_growth", data_set=data.name, method=name,
                              words_ratio_max_z_to_zero=last / first))
    console.print(growth)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, quick="small instances, two values of z (smoke test)")
    parser.add_argument("--n", type=int, default=None, help="inliers per data set (default 4000; 300 with --quick)")
    parser.add_argument("--d", type=int, default=5, help="features of the mixture (default 5)")
    parser.add_argument("--k", type=int, default=10, help="centres (default 10)")
    parser.add_argument("--machines", type=int, default=5, help="machines m (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default="gmm,s1", help="data sets, a comma list of gmm and s1 (default both)")
    parser.add_argument("--authors-seeds", type=int, default=None,
                        help="emulated runs of the authors' scheme per z (default 9; 3 with --quick)")
    parser.add_argument("--means", action="store_true", help="also run the (k,z)-means comparison (mixture)")
    parser.add_argument("--plot", default=None, help="where to write the plot (PNG/SVG/PDF)")
    args = parse_args(parser)
    names = [s.strip() for s in args.data.split(",") if s.strip()]
    if not names or not set(names) <= {"gmm", "s1"}:
        parser.error(f"--data takes a comma list of gmm and s1, got {args.data!r}")
    args.authors_seeds = args.authors_seeds or (3 if args.quick else 9)
    n = args.n or (300 if args.quick else 4000)
    injected = n // 10
    zs = sorted({0, injected} if args.quick else {0, injected // 8, injected // 4, injected // 2, injected})
    datasets = []
    for name in names:
        if name == "gmm":
            datasets.append(synthetic_dataset(n, args.d, args.k, injected, seed=args.seed))
        else:
            datasets.append(s1_instance(n, injected, args.seed))
    console = make_console()
    print_machine_facts(console, "distributed (k,z)-center: communication against z", {
        "data": "; ".join(f"{ds.name} (n = {ds.x.shape[0]}, d = {ds.x.shape[1]}, {injected} injected outliers)"
                          for ds in datasets),
        "machines m": args.machines, "k": args.k, "z": ", ".join(map(str, zs)),
        "authors' scheme": f"emulated, {args.authors_seeds} runs per z",
    })

    records: list = []
    all_rows = {ds.name: run_instance(console, ds, args, args.k, zs, records) for ds in datasets}

    if args.means:
        x = datasets[0].x
        parts = partition(x.shape[0], args.machines, seed=args.seed)
        eps = 0.3
        means_rows: dict[str, list[dict]] = {"ours (truncated coresets)": [], "bel": [], "k-means-- (central)": []}
        for z in zs:
            for name in means_rows:
                if name == "k-means-- (central)":
                    centres, words = centralised_kmeans_minus_minus(x, args.k, z, seed=args.seed), x.size
                    budget = z
                else:
                    mode = "bel" if name == "bel" else "truncated"
                    centres, words, _ = kz_means(x, parts, args.k, z, eps, mode, args.seed)
                    budget = (1 + eps) * z if mode == "truncated" else z
                cost = solvers.trimmed_cost(_kernels.nearest_centres(x, centres)[0], budget, 2)
                means_rows[name].append({"z": z, "words": words, "cost": cost})
        mtable = Table(title=f"(k,z)-means on {datasets[0].name}: words and trimmed cost ((1+eps)z removed for ours, "
                             "z for the others)", title_justify="left")
        for col in ("method", "z", "words", "cost"):
            mtable.add_column(col, justify="right" if col != "method" else "left")
        for name, items in means_rows.items():
            for row in items:
                mtable.add_row(name, str(row["z"]), f"{row['words']:,}", f"{row['cost']:.1f}")
                records.append(record("kz_means", method=name, z=row["z"], words_total=row["words"],
                                      trimmed_cost=row["cost"]))
            mtable.add_section()
        console.print(mtable)

    plot(all_rows, args, console)
    write_records(args.json, records, console)


def plot(all_rows: dict[str, dict[str, list[dict]]], args, console) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(all_rows), 2, figsize=(13, 4.5 * len(all_rows)), layout="constrained", squeeze=False)
    tab20 = plt.get_cmap("tab20")
    colours = [tab20(i) for i in (*range(0, 20, 2), *range(1, 20, 2))]
    markers = "osD^v<>pPXh*"
    for r, (name, rows) in enumerate(all_rows.items()):
        by_method: dict[str, list[dict]] = defaultdict(list, rows)
        for i, (method, items) in enumerate(by_method.items()):
            zs = [row["z"] for row in items]
            style = "--" if method in CENTRALISED else ":" if method == AUTHORS else "-"
            for ax, key in ((axes[r][0], "words"), (axes[r][1], "radius")):
                ax.plot(zs, [row[key] for row in items], style, marker=markers[i % len(markers)],
                        color=colours[i % len(colours)], label=method)
        axes[r][0].set_yscale("log")
        axes[r][0].set_ylabel("words (all messages, log scale)")
        axes[r][0].set_title(f"{name}: communication against z")
        radii = [row["radius"] for items in rows.values() for row in items if row["radius"] > 0]
        if radii and max(radii) > 100 * min(radii):
            axes[r][1].set_yscale("log")
        axes[r][1].set_ylabel("radius with z outliers removed")
        axes[r][1].set_title(f"{name}: cost against z")
        for ax in axes[r]:
            ax.set_xlabel("z (outliers allowed)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", frameon=False)
    fig.suptitle(f"distributed (k,z)-center (m = {args.machines}, k = {args.k})")
    path = Path(args.plot) if args.plot else Path(tempfile.gettempdir()) / "kz_communication.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    console.print(f"plot written to {path}")


if __name__ == "__main__":
    main()
