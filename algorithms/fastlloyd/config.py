"""Public parameters of a FastLloyd run and of its baselines (spec fastlloyd.md, sections 2-3).

Every party of a run is built from the same :class:`FastLloydConfig`: k, d, the number of
iterations T, the per-iteration assignment radii, the post-processing, the noise scales, the
fixed-point and ring parameters and the initialisation seed are all public (spec 1.3). The
variants share one federated framework (same split, same sphere-packing initialisation, same
masked secure aggregation) and differ only in noise and constraints (spec 3):

=============  ==========  =========  =================  ==========  =======
variant        sums        radius     noise              clip        post
=============  ==========  =========  =================  ==========  =======
``fastlloyd``  relative    Step       Gaussian (GDP)     yes         fold
``lloyd``      absolute    none       none               no          none
``glloyd``     absolute    none       Gaussian (GDP)     no          none
``sulloyd``    absolute    none       Laplace (pure DP)  no          none
=============  ==========  =========  =================  ==========  =======
"""

from __future__ import annotations

import dataclasses
import math

from fedproto.algorithms import dp
from fedproto.algorithms.secagg import headroom

__all__ = ["FastLloydConfig", "FastLloydOptions", "SECAGG_CHOICES", "VARIANTS", "make_config"]

VARIANTS = ("fastlloyd", "lloyd", "glloyd", "sulloyd")
#: The secure aggregation of a run: the paper's masked secure aggregation (``msa``), SecAgg+ on a
#: sparse graph (``plus``) or classic SecAgg, SecAgg+ on the complete graph (``complete``).
SECAGG_CHOICES = ("msa", "plus", "complete")
_POSTS = ("fold", "truncate", "none")
_NOISES = ("gaussian", "laplace", "none")


@dataclasses.dataclass(frozen=True)
class FastLloydConfig:
    """Public parameters shared by the server and every client.

    Attributes:
        variant: one of :data:`VARIANTS` (for reports).
        k: number of clusters.
        d: number of features.
        iterations: number of Lloyd iterations T.
        radii: assignment radius of each iteration (``inf`` = unconstrained), length T.
        relative: send relative sums ``sum (x - mu_prev)`` (FastLloyd) instead of absolute sums.
        clip: clip each centroid's move to the iteration's radius (radius clipping, spec 2.9).
        post: domain post-processing: ``"fold"``, ``"truncate"`` or ``"none"``.
        noise: ``"gaussian"``, ``"laplace"`` or ``"none"``.
        noise_sum: per-iteration noise std (Gaussian) or scale (Laplace) per sum coordinate.
        noise_count: per-iteration noise std or scale per count.
        frac_bits: fixed-point fractional bits q of the sums (16).
        count_frac_bits: fractional bits of the counts (0: counts are integers, as in the
            authors' code; the quantised-noise argument of App. A.3 holds on the integer grid).
        ring_bits: ring width w of Z_{2^w} (32 or 64).
        bound: half-width B of the data domain ``[-B, B]^d``.
        init_seed: public seed of the sphere-packing initialisation.
        epsilon: total privacy budget (``None`` when non-private).
        delta: the delta of (epsilon, delta)-DP (``None`` for pure DP or non-private).
    """

    variant: str
    k: int
    d: int
    iterations: int
    radii: tuple[float, ...]
    relative: bool
    clip: bool
    post: str
    noise: str
    noise_sum: tuple[float, ...]
    noise_count: tuple[float, ...]
    frac_bits: int = 16
    count_frac_bits: int = 0
    ring_bits: int = 32
    bound: float = 1.0
    init_seed: int = 0
    epsilon: float | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.k < 1 or self.d < 1 or self.iterations < 1:
            raise ValueError("k, d and iterations must be positive")
        for name in ("radii", "noise_sum", "noise_count"):
            if len(getattr(self, name)) != self.iterations:
                raise ValueError(f"{name} must have one entry per iteration ({self.iterations})")
        if any(not r > 0 for r in self.radii):
            raise ValueError("radii must be positive")
        if self.post not in _POSTS:
            raise ValueError(f"post must be one of {_POSTS}")
        if self.noise not in _NOISES:
            raise ValueError(f"noise must be one of {_NOISES}")
        if self.ring_bits not in (32, 64):
            raise ValueError("ring_bits must be 32 or 64")
        if not 0 <= self.frac_bits < self.ring_bits - 1 or not 0 <= self.count_frac_bits < self.ring_bits - 1:
            raise ValueError("fractional bits must leave room in the ring")
        if not self.bound > 0:
            raise ValueError("bound must be positive")

    @property
    def shape(self) -> tuple[int, int]:
        """Shape ``[k, d+1]`` of one update (sums in columns ``0..d-1``, counts in column ``d``)."""
        return (self.k, self.d + 1)

    @property
    def element_bytes(self) -> int:
        """Bytes per ring element on the wire."""
        return self.ring_bits // 8

    def payload_bytes_per_iteration(self, n_clients: int) -> int:
        """Raw ring-element bytes of one iteration: ``2 M k (d+1) w/8`` (spec oracle 11)."""
        return 2 * n_clients * self.k * (self.d + 1) * self.element_bytes

    def privacy_releases(self) -> tuple[dp.Release, ...]:
        """The noisy releases of a run at this configuration, with the noise the server draws.

        Each iteration t releases the ``[k, d]`` sums with noise ``noise_sum[t]`` and the ``[k]``
        counts with noise ``noise_count[t]``, exactly the standard deviations (Gaussian) or
        scales (Laplace) the server's noise kernel is called with. The sensitivities under
        add/remove-one adjacency are those the protocol enforces: one point changes one
        cluster's count by 1 (L1 = L2 = 1) and its sum by ``x - mu_prev`` (relative sums, L2 at
        most the iteration's radius, never more than the domain diagonal ``2 sqrt(d) B``) or by
        ``x`` (absolute sums, L2 at most ``sqrt(d) B``, L1 at most ``d B``); a Laplace release of
        relative sums is bounded in L1 by ``sqrt(d)`` times their L2 sensitivity.

        Returns:
            ``2 T`` :class:`~fedproto.algorithms.dp.Release` (sums then counts, per iteration),
            or ``()`` when the run adds no noise (``noise == "none"``).

        References:
            FastLloyd Thm 5.1 (relative sums' sensitivity), App. B.1 (GLloyd); Su et al. 2016
            (SuLloyd); spec fastlloyd.md sections 2.3, 3.2 and 3.3.
        """
        if self.noise == "none":
            return ()
        diagonal = 2.0 * math.sqrt(self.d) * self.bound
        releases = []
        for t in range(self.iterations):
            if self.relative:
                l2 = min(self.radii[t], diagonal)
                l1 = math.sqrt(self.d) * l2
            else:
                l2 = math.sqrt(self.d) * self.bound
                l1 = self.d * self.bound
            releases.append(
                dp.Release(t, "sums", (self.k, self.d), self.noise, l2 if self.noise == "gaussian" else l1,
                           self.noise_sum[t])
            )
            releases.append(dp.Release(t, "counts", (self.k,), self.noise, 1.0, self.noise_count[t]))
        return tuple(releases)

    def aggregate_bound(self, n: int) -> float:
        """A public bound on ``|aggregate sum coordinate|`` (data plus a noise margin).

        ``n * r`` for relative sums within radius r (``2B`` per coordinate when unconstrained),
        ``n * B`` for absolute sums, plus 10 Gaussian stds or 40 Laplace scales of noise (the
        chance of exceeding that is below 1e-17 per coordinate).
        """
        if self.relative:
            spread = max(min(r, 2 * self.bound * math.sqrt(self.d)) for r in self.radii)
        else:
            spread = self.bound
        factor = {"gaussian": 10.0, "laplace": 40.0, "none": 0.0}[self.noise]
        return n * spread + factor * max(self.noise_sum)


def _choose_ring(cfg: FastLloydConfig, n: int, ring_bits: int | str) -> FastLloydConfig:
    bound = cfg.aggregate_bound(n)
    if ring_bits == "auto":
        bits = 32 if bound < headroom(cfg.frac_bits, 32) else 64
    elif ring_bits in (32, 64):
        bits = int(ring_bits)
    else:
        raise ValueError("ring_bits must be 32, 64 or 'auto'")
    if bound >= headroom(cfg.frac_bits, bits):
        raise ValueError(
            f"aggregates of {n} points can reach {bound:.6g}, beyond the {bits}-bit ring's head-room "
            f"{headroom(cfg.frac_bits, bits):.6g} at q = {cfg.frac_bits}; use a 64-bit ring (ring_bits='auto')"
        )
    return dataclasses.replace(cfg, ring_bits=bits)


def make_config(
    variant: str,
    *,
    n: int,
    k: int,
    d: int,
    epsilon: float | None = None,
    delta: float | None = None,
    alpha: float = 0.8,
    iterations: int | None = None,
    ring_bits: int | str = "auto",
    init_seed: int = 0,
    noise: bool = True,
    bound: float = 1.0,
) -> FastLloydConfig:
    """Calibrate a run's public parameters.

    Args:
        variant: ``"fastlloyd"``, ``"lloyd"``, ``"glloyd"`` or ``"sulloyd"``.
        n: total number of points N (public, spec 1.3).
        k: clusters; d: features.
        epsilon: total privacy budget over all iterations; required by the private variants.
            FastLloyd and GLloyd are (epsilon, delta)-DP under add/remove-one adjacency (GDP
            accounting, spec 2.3); SuLloyd is epsilon-DP (basic composition).
        delta: defaults to ``1/(N ln N)``.
        alpha: FastLloyd's radius scale (0.8).
        iterations: override the iteration heuristic (Lloyd's default is 7).
        ring_bits: 32, 64 or ``"auto"`` (32 when the public aggregate bound fits, else 64).
        init_seed: public seed of the sphere-packing initialisation.
        noise: ``False`` keeps the variant's calibration but adds no noise (for testing).
        bound: half-width B of the data domain.

    Returns:
        The configuration.

    Raises:
        ValueError: unknown variant, missing or non-positive epsilon for a private variant, k > n,
            or a ring too small for the aggregates.

    References:
        FastLloyd (Diaa, Humphries, Kerschbaum), Alg. 1 and Sec. 5.5 (calibration, Eq. 7, 21);
        App. B.1 (GLloyd); Su et al. 2016 (SuLloyd).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    if k < 1 or d < 1:
        raise ValueError("k and d must be positive")
    if k > n:
        raise ValueError(f"k = {k} is larger than the number of points n = {n}")
    inf = math.inf
    if variant == "lloyd":
        t = iterations or 7
        cfg = FastLloydConfig(
            variant, k, d, t, (inf,) * t, False, False, "none", "none", (0.0,) * t, (0.0,) * t,
            bound=bound, init_seed=init_seed,
        )
        return _choose_ring(cfg, n, ring_bits)
    if epsilon is None or not epsilon > 0:
        raise ValueError(f"{variant} needs a positive epsilon")
    if variant == "fastlloyd":
        cal = dp.calibrate_fastlloyd(epsilon, n, k, d, delta=delta, alpha=alpha, bound=bound, iterations=iterations)
        t = cal.iterations
        cfg = FastLloydConfig(
            variant, k, d, t, tuple(cal.radii), True, True, "fold", "gaussian",
            tuple(cal.std_sum), (cal.std_count,) * t, bound=bound, init_seed=init_seed,
            epsilon=epsilon, delta=cal.delta,
        )
    elif variant == "glloyd":
        cal = dp.calibrate_glloyd(epsilon, n, k, d, delta=delta, bound=bound, iterations=iterations)
        t = cal.iterations
        cfg = FastLloydConfig(
            variant, k, d, t, (inf,) * t, False, False, "none", "gaussian",
            tuple(cal.std_sum), (cal.std_count,) * t, bound=bound, init_seed=init_seed,
            epsilon=epsilon, delta=cal.delta,
        )
    else:
        su = dp.sulloyd_parameters(epsilon, n, k, d, iterations=iterations)
        t = su.iterations
        cfg = FastLloydConfig(
            variant, k, d, t, (inf,) * t, False, False, "none", "laplace",
            (su.scale_sum,) * t, (su.scale_count,) * t, bound=bound, init_seed=init_seed,
            epsilon=epsilon, delta=None,
        )
    if not noise:
        cfg = dataclasses.replace(cfg, noise="none")
    return _choose_ring(cfg, n, ring_bits)



@dataclasses.dataclass(frozen=True)
class FastLloydOptions:
    """The public options of a run, fixed before any party looks at the data.

    A :class:`FastLloydConfig` also depends on the federation's total number of points N (the
    default delta ``1/(N ln N)``, the iteration heuristic, the ring's head-room) and on the
    number of features d. When each party holds only its own data, the parties agree N and d in
    the setup phase ``setup.data`` and each then calls :meth:`config` with them (see
    :mod:`fedproto.algorithms.fastlloyd.protocol`), so every party derives the same config.

    Attributes:
        variant: one of :data:`VARIANTS`.
        k: number of clusters (>= 1).
        epsilon: total privacy budget; required (positive) by the private variants, ignored by
            ``lloyd``.
        delta: the delta of (epsilon, delta)-DP (FastLloyd, GLloyd); ``None``: ``1/(N ln N)``
            once N is known.
        alpha: FastLloyd's radius scale (> 0).
        iterations: Lloyd iterations T; ``None``: the variant's heuristic at N.
        ring_bits: 32, 64 or ``"auto"`` (32 when the public aggregate bound at N fits).
        init_seed: public seed of the sphere-packing initialisation.
        noise: ``False`` calibrates as usual but adds no noise (testing).
        bound: half-width B of the data domain ``[-B, B]^d`` the data are normalised to.
        secagg: the secure aggregation, one of :data:`SECAGG_CHOICES`.

    Raises:
        ValueError: an unknown variant, ring width or secure aggregation; ``k < 1``; a private
            variant without a positive epsilon; a delta outside (0, 1); ``alpha`` or ``bound``
            not positive; ``iterations < 1``.
    """

    variant: str = "fastlloyd"
    k: int = 3
    epsilon: float | None = 1.0
    delta: float | None = None
    alpha: float = 0.8
    iterations: int | None = None
    ring_bits: int | str = "auto"
    init_seed: int = 0
    noise: bool = True
    bound: float = 1.0
    secagg: str = "msa"

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {VARIANTS}")
        if self.k < 1:
            raise ValueError("k must be at least 1")
        if self.variant != "lloyd" and (self.epsilon is None or not self.epsilon > 0):
            raise ValueError(f"{self.variant} needs a positive epsilon")
        if self.variant in ("fastlloyd", "glloyd") and self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in the open interval (0, 1), got {self.delta!r}")
        if not self.alpha > 0:
            raise ValueError("alpha must be positive")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError("iterations must be at least 1")
        if self.ring_bits not in ("auto", 32, 64):
            raise ValueError("ring_bits must be 32, 64 or 'auto'")
        if not self.bound > 0:
            raise ValueError("bound must be positive")
        if self.secagg not in SECAGG_CHOICES:
            raise ValueError(f"unknown secure aggregation {self.secagg!r}; choose one of {SECAGG_CHOICES}")

    def config(self, n: int, d: int) -> FastLloydConfig:
        """The run's public parameters for a federation of ``n`` points with ``d`` features.

        Args:
            n: the federation's total number of points N (>= k).
            d: the number of features (>= 1).

        Returns:
            :func:`make_config` of these options at ``n`` and ``d`` (``epsilon`` is dropped for
            the non-private ``lloyd``).

        Raises:
            ValueError: ``k > n``, ``d < 1``, or a ring too small for the aggregates.
        """
        return make_config(
            self.variant,
            n=n,
            k=self.k,
            d=d,
            epsilon=None if self.variant == "lloyd" else self.epsilon,
            delta=self.delta,
            alpha=self.alpha,
            iterations=self.iterations,
            ring_bits=self.ring_bits,
            init_seed=self.init_seed,
            noise=self.noise,
            bound=self.bound,
        )
