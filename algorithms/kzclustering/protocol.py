"""Distributed (k,z)-center with (1+eps)z outliers: Guo & Li's dist-kzc over a grid of radius guesses.

Theory of operation (Guo & Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS 2018,
Section 2, Algorithms 1-3 and Appendix B; spec kz-clustering.md sections 2.1-2.7, with the fixes
of GAPs 1 and 2; the ``probe`` search, the tight count test and the polishing answer issue 15).

Roles: one :class:`KzCoordinator` (party ``coordinator``; module
`fedproto.algorithms.kzclustering.center_coordinator`) and m :class:`KzMachine` s (parties
``machine-0 .. machine-{m-1}``; `fedproto.algorithms.kzclustering.center_machine`), in a
star: machines talk only to the coordinator. Machine i holds P_i (any partition, possibly empty
parts). Everyone knows the :class:`KzCenterConfig` (k, z, eps,
m, d and the search options); a coordinator whose configuration has ``d = None`` (it holds no
data, and the machines hold only their own) learns d from the first round in which every machine
sends points (the extents' anchors, or with ``radius_bounds`` the first fetched points) and
refuses by name a machine whose points have another number of features
(`fedproto.algorithms.kzclustering.setup.agree_feature_count`).

Idea: for a guess L, machine i absorbs every ball ``ball(p, 4L)`` around a point whose ``2L``
ball holds more than ``y = eps z / (k m)`` of its remaining points into one weighted
representative (`solvers.aggregate`); the remaining points are discarded. If L >= L* (the optimal
radius), the machines produce few representatives in total and discard at most ``(1+eps) z``
points (Lemmas 2.6, 2.7), and the coordinator's Charikar-style solver kzc (Algorithm 1, radii
2L'/4L') covers the representatives with ``z' = (1+eps) z - discarded`` outlier weight at
``L' = 5L``. So the coordinator searches the grid of guesses for the smallest one that passes.
Machines aggregate lazily: only at the radii the coordinator asks about, once per radius
(guesses below the local spacing, or above the local reach, share one aggregation).

Sub-machines (Appendix B, spec 2.7). With ``config.sub_machines = t > 1`` every machine splits
its points into t strided parts (`solvers.split_sub_machines`) and aggregates each part as one
machine, so dist-kzc runs over ``m' = m t`` virtual machines: y, the count bound and the cap are
those of m' (`KzCenterConfig.virtual_machines`) and every guarantee is the paper's for m'
machines. A machine still sends one message per request: the sums of its parts' counts, and
their representatives concatenated in part order (the same run as m' machines holding the parts,
in fewer messages; tested). Local work per guess falls from ``n_i^2`` to ``n_i^2 / t``.

The grid. Without ``radius_bounds`` (spec 2.4, practical alternative) machines first send
:class:`LocalExtent` (phase ``extent``: ``n_i``, the local smallest nonzero distance, an anchor,
the radius around it); the coordinator bounds the diameter by ``max (r_i + d(a_i, a_j) + r_j)``
and builds ``[0, g, g(1+eps), ...]`` up to the first value ``>= diameter / 2``, with ``g = min_i
dmin_i / 4``. Every machine aggregates identically for all L in ``[0, g)`` (its 4L balls hold only
copies of a point), so the guess 0 stands for that whole interval (the "bottom" guess; see
below). With ``radius_bounds = (A, B)`` the grid is ``A (1+eps)^t`` up to ``>= B``, known to all,
and there is no extent round.

PASS2 (Round 2 with the fix of GAP 1): ``sum_i |P'_i(L)| <= count_bound`` and ``sum_i |U_i(L)|
<= (1+eps) z`` (with the count test alone, tiny guesses pass because nothing is aggregated).
``count_bound`` is ``k m + floor(z / (floor(y) + 1))`` (``count_test="tight"``, the default;
proof at :attr:`KzCenterConfig.count_bound`) or the paper's ``k m (1 + 1/eps)`` (``"paper"``). Every
L >= L* passes either, so a guess that fails certifies L < L*.

Search ``probe`` (the default): counts before points, and points only for the chosen guess.

* The coordinator keeps lo (a guess known to fail, or the sentinel -1) and hi (a guess known to
  pass PASS2, or the top guess, which always does) and sends :class:`RadiusProbes` (phase
  ``probe``: ``batch`` evenly spaced radii strictly between them; 1 by default, i.e. bisection;
  ``batch = 0``: every guess up to hi at once); each machine aggregates at those radii and answers
  :class:`ProbeCounts` (phase ``counts``: ``|P'_i(L)|`` per radius, and ``|U_i(L)|`` only when
  ``y >= 1``: below that every point's own ball qualifies, so nothing is ever discarded). hi moves
  to the smallest passing probe, lo to the largest failing probe below it.
* When hi follows lo, the coordinator asks for hi's data with :class:`RadiusFetch` (phase
  ``fetch``; a top guess never probed is probed first) and each machine sends
  :class:`Representatives` (phase ``points``). A kzc "No" certifies L_hi < L* (GAP 2); the search
  then bisects ``(hi, top]`` on the full predicate: one guess per round, its counts first and, if
  it passes PASS2, its points; a failure (PASS2 or kzc) moves lo up, an acceptance moves hi down.

lo < L* always holds, so hi is at most the first grid value >= L*, even though the predicate is
not monotone. The tight count test is what keeps the fetch small: with z = 0 at most k
representatives per machine pass it, where the paper's test lets up to ``k m (1 + 1/eps)``
through, most of which kzc then rejects.

Searches ``linear`` and ``binary`` (spec 2.5 as first built): the coordinator sends the whole grid
:class:`RadiusGrid` (phase ``grid``), which asks for the counts of every guess; machines answer
:class:`AggregatedCounts` (phase ``counts``: ``n_i``, ``|P'_i(L_t)|`` and ``|U_i(L_t)|`` for all
t), and the coordinator asks for the data of some candidates with :class:`RadiusGuesses` (phase
``fetch``); machines send :class:`WeightedPoints` (phase ``points``). The coordinator evaluates
the fetched candidates in increasing order and fetches more (one round each) according to
``search``:

- ``linear``: the next ``batch`` untried PASS2 candidates (``batch = 0``: all of them in the
  first fetch). The first success is at the smallest passing guess, which is at most the first
  grid value >= L*.
- ``binary``: lo-fails/hi-passes search over the grid (hi starts at the top guess, which always
  passes), fetching ``batch`` evenly spaced probes per round; ends when hi follows lo.

On success (every search) the coordinator refines (``refine``, spec 2.5): the smallest kzc radius
``L'' <= 5 L_t`` over the exact breakpoints of the fetched points, and certifies ``L_out = 4 L'' +
4 L_t <= 24 L_t`` (without refinement ``L_out = 24 L_t``). It first searches with outlier weight
``z - discarded``, so that at most z points lie beyond L_out, and falls back to z' only when no
radius up to ``5 L_t`` succeeds with that (the bound ``24 L_t``, hence the guarantee, is the
same). The bottom guess uses z', ``upper = 5 g`` and no move term (its representatives absorbed
only copies), so if L* < g it certifies ``L_out <= 4 L*``; if it fails, L* >= g. Then, when ``z >
0`` and ``polish`` is on, it improves the centres by swap local search on the representatives for
the paper's cost (z points removed), accepting only centres whose own certificate stays at most
L_out (`fedproto.algorithms.kzclustering.polish`).

Final round: :class:`FinalCentres` (phase ``centres``, broadcast: the k centres and L_out); each
machine labels its points farther than L_out as outliers and replies with :class:`OutlierCount`
(phase ``outliers``). Guarantee: at most ``(1+eps) z`` outliers in total, and ``L_out <= 24 (1+eps)
L*`` (Claim 2.5, Theorem 1.1).

Words (scalars in either direction; the coordinator's result records them per round and phase),
for m machines, d features, T grid guesses, and ``[y >= 1]`` = 1 when discarded counts travel:

* ``probe``, with P probes in all and one fetch of R representatives::

      extent m (d + 3)  +  probe m P  +  counts m P (1 + [y >= 1])  +  fetch m
      +  points (d + 1) R  +  centres m (k d + 1)  +  outliers m

  (no extent term with ``radius_bounds``). With ``batch = 1``, ``P <= ceil(log2 T) + 1`` and
  ``R <= count_bound``. After a kzc "No" come at most ``ceil(log2 T) + 1`` more rounds, each a
  probe of one guess and, if it passes PASS2, its fetch (``m`` plus its points). Nothing depends
  on n, and z enters only through ``R <= k m + z / (floor(y) + 1)``. Message phases: 2 per probe
  round, 2 per fetch, 2 for the answer, plus the extent.
* ``linear`` and ``binary``: extent ``m (d + 3)``, grid ``m T``, counts ``m (2T + 1)``, each fetch
  ``m b``, each points phase ``<= (d + 1) count_bound`` per fetched guess plus ``2 b m``, centres
  ``m (k d + 1)``, outliers ``m``: 3 round trips plus the outlier upload when the first fetch
  succeeds (7 message phases; 5 with ``radius_bounds``, the paper's 4 rounds plus the outlier
  labels), 2 more phases per extra fetch.

Failure: no dropout tolerance (every machine's data is needed). A silent machine makes the
coordinator fail with :class:`~fedproto.errors.InsufficientParticipants` naming it; a message
out of order, from a stranger, or inconsistent with earlier ones (wrong number of counts, sizes
that do not match the counts, weights plus discarded points not equal to ``n_i``, a fetch of a
radius never probed) is a :class:`~fedproto.errors.RemoteProtocolError`. ``k > n`` or ``z >= n``
fail the coordinator with ``ValueError`` as soon as it knows n (from the extents; with
``radius_bounds``, from the counts or, in the ``probe`` search, the first fetched points).
"""

from __future__ import annotations

from fedproto.algorithms.kzclustering.center_coordinator import CoordinatorResult, CoordinatorState, KzCoordinator
from fedproto.algorithms.kzclustering.center_machine import KzMachine, MachineState
from fedproto.algorithms.kzclustering.parties import COORDINATOR, MachineResult, label_outliers, machine_name

__all__ = [
    "COORDINATOR",
    "CoordinatorResult",
    "CoordinatorState",
    "KzCoordinator",
    "KzMachine",
    "MachineResult",
    "MachineState",
    "label_outliers",
    "machine_name",
]
