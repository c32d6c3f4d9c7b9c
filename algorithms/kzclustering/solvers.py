"""Sequential solvers of (k,z)-clustering: aggregation, greedy covers, radius searches, costs.

Everything here is a pure function of arrays (NumPy, float64 distances, int64 weights), with
deterministic tie-breaks (the smallest index wins) and no randomness. The procedures are greedy
loops whose steps depend on each other; they keep per-point counts up to date incrementally (when
a set S of points is removed, subtract the rows of S of the ball adjacency), which costs O(n^2)
per call in total, instead of one O(n^2) matrix-vector product per step (see
:mod:`fedproto.algorithms.kzclustering._kernels` for the dense, jitted parts).

Conventions (spec kz-clustering.md, section 1.1):

* balls are closed: ``ball_S(p, r) = {q in S : d(p, q) <= r}``;
* radii are compared with *distances* (not squared distances), and every radius the searches try
  is a breakpoint ``v / g`` rounded up so that ``g * (v / g) >= v`` holds in floating point: the
  pair at distance ``v`` is then inside the ball at its own breakpoint, which keeps the exact
  searches exact;
* weights are positive integers (multiplicities); outlier budgets may be fractional.

References:
    Guo & Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS 2018 (arXiv
    1810.07852), Algorithms 1 and 2, Section 2 and Appendix B.
    Charikar, Khuller, Mount, Narasimhan, "Algorithms for facility location problems with
    outliers", SODA 2001.
    Gonzalez, "Clustering to minimize the maximum intercluster distance", TCS 38, 1985.

The solvers live in four modules, by problem; this module gathers them under one name
(``solvers.aggregate``, ``solvers.trimmed_cost``, ...), as every caller uses them:

* :mod:`~fedproto.algorithms.kzclustering.solvers_shared`: the radius grid (center and
  median/means);
* :mod:`~fedproto.algorithms.kzclustering.solvers_aggregation`: (k,z)-center, the machines' side
  (Algorithm 2, memory-lean aggregation, sub-machines);
* :mod:`~fedproto.algorithms.kzclustering.solvers_covers`: (k,z)-center, the coordinator's side
  (Algorithm 1 and Charikar's covers, exact radius searches, farthest-first, costs);
* :mod:`~fedproto.algorithms.kzclustering.solvers_means`: (k,z)-median and (k,z)-means
  (Appendix C: truncated costs, seeding, Lloyd, coresets, reverse greedy).
"""

from __future__ import annotations

from fedproto.algorithms.kzclustering.solvers_aggregation import (
    CANDIDATES,
    DEFAULT_SUB_MACHINE_POINTS,
    METHODS,
    Aggregation,
    Extent,
    PointIndex,
    SubMachines,
    aggregate,
    aggregate_points,
    local_extent,
    split_sub_machines,
    sub_machine_count,
)
from fedproto.algorithms.kzclustering.solvers_covers import (
    Cover,
    center_cost,
    cover_breakpoints,
    farthest_first,
    greedy_cover,
    kzc,
    pad_centres,
    smallest_cover_radius,
)
from fedproto.algorithms.kzclustering.solvers_means import (
    bel_coreset,
    kmeans_minus_minus,
    kmeanspp_seeding,
    minmax_scores,
    polish_minmax,
    reverse_greedy,
    sup_cost,
    trimmed_cost,
    weighted_lloyd,
    weighted_sample,
)
from fedproto.algorithms.kzclustering.solvers_shared import radius_grid

__all__ = [
    "CANDIDATES",
    "DEFAULT_SUB_MACHINE_POINTS",
    "METHODS",
    "Aggregation",
    "Cover",
    "Extent",
    "PointIndex",
    "SubMachines",
    "aggregate",
    "aggregate_points",
    "bel_coreset",
    "center_cost",
    "cover_breakpoints",
    "farthest_first",
    "greedy_cover",
    "kmeans_minus_minus",
    "kmeanspp_seeding",
    "kzc",
    "local_extent",
    "minmax_scores",
    "pad_centres",
    "polish_minmax",
    "radius_grid",
    "reverse_greedy",
    "smallest_cover_radius",
    "split_sub_machines",
    "sub_machine_count",
    "sup_cost",
    "trimmed_cost",
    "weighted_lloyd",
    "weighted_sample",
]
