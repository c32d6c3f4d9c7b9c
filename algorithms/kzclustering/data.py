"""Data for (k,z)-clustering: the synthetic Gaussian mixture and the outlier injection recipe.

Both follow the authors' code as the spec describes it (kz-clustering.md, section 5.1), since the
paper gives no recipe:

* `gaussian_mixture`: component means ~ N(0, (f/5)^2 I), every component with covariance
  (f/15) I, component sizes from uniform random cut points (f = ``factor``, default 50);
* `inject_outliers`: ``s = max(mean ||x||, 1)``; pick ``count`` existing points uniformly at
  random, add Gaussian noise N(0, (dist_factor * s) I) (variance ``dist_factor * s`` per
  coordinate) and append the results as new points, so n grows by ``count``.

The bundled scikit-learn sets (iris, wine, breast_cancer, digits) are proxies for the paper's
UCI sets (none of which ships with scikit-learn); `with_outliers` injects outliers into any loaded
set by the same recipe. Randomness comes from a local ``numpy.random.Generator`` seeded by the
caller (never the global RNG); the same seed gives the same data.

References:
    Guo & Li, Appendix D.1-D.2 (experiments); github.com/xyguo/clusterz ``data_gen`` (described in
    the spec, not copied).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedproto.data import Dataset

__all__ = ["OUTLIER_LABEL", "gaussian_mixture", "inject_outliers", "synthetic_dataset", "with_outliers"]

#: Label of injected outliers in a data set's ``y``.
OUTLIER_LABEL = -1


def gaussian_mixture(
    n: int, d: int, components: int, *, factor: float = 50.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Points from a random Gaussian mixture.

    Args:
        n: number of points, ``>= components``.
        d: dimension, ``>= 1``.
        components: number of components, ``>= 1``.
        factor: f: means ~ N(0, (f/5)^2 I), covariance (f/15) I.
        seed: seed of the local generator.

    Returns:
        ``(x, labels)``: float64 ``[n, d]`` and int64 ``[n]`` (the component of each point).

    Raises:
        ValueError: invalid sizes or a non-positive factor.
    """
    if components < 1 or d < 1 or n < components:
        raise ValueError(f"need n >= components >= 1 and d >= 1, got n={n}, components={components}, d={d}")
    if not factor > 0:
        raise ValueError("factor must be positive")
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, factor / 5.0, size=(components, d))
    # sizes from uniform random cut points, each component at least one point
    cuts = np.sort(rng.choice(np.arange(1, n), size=components - 1, replace=False)) if components > 1 else []
    sizes = np.diff(np.concatenate([[0], cuts, [n]])).astype(np.int64)
    labels = np.repeat(np.arange(components, dtype=np.int64), sizes)
    x = means[labels] + rng.normal(0.0, np.sqrt(factor / 15.0), size=(n, d))
    return x, labels


def inject_outliers(
    x: np.ndarray, count: int, *, dist_factor: float = 50.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Append ``count`` outliers: random existing points moved by N(0, (dist_factor * s) I).

    Args:
        x: points ``[n, d]`` float64, ``n >= 1``.
        count: outliers to add, ``>= 0``.
        dist_factor: noise variance per coordinate in units of ``s = max(mean ||x||, 1)``.
        seed: seed of the local generator.

    Returns:
        ``(x_new, is_outlier)``: ``[n + count, d]`` float64 (the original points first) and bool
        ``[n + count]``.

    Raises:
        ValueError: empty ``x``, negative ``count`` or non-positive ``dist_factor``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"x must be a non-empty [n, d] array, got shape {x.shape}")
    if count < 0:
        raise ValueError("count must be >= 0")
    if not dist_factor > 0:
        raise ValueError("dist_factor must be positive")
    rng = np.random.default_rng(seed)
    s = max(float(np.mean(np.linalg.norm(x, axis=1))), 1.0)
    base = rng.choice(x.shape[0], size=count, replace=count > x.shape[0])
    noise = rng.normal(0.0, np.sqrt(dist_factor * s), size=(count, x.shape[1]))
    out = np.concatenate([x, x[base] + noise], axis=0)
    mask = np.concatenate([np.zeros(x.shape[0], dtype=bool), np.ones(count, dtype=bool)])
    return out, mask


def synthetic_dataset(
    n: int, d: int, components: int, outliers: int, *, factor: float = 50.0, dist_factor: float = 50.0, seed: int = 0
) -> Dataset:
    """The synthetic set: a Gaussian mixture of ``n`` points plus ``outliers`` injected ones.

    Labels are the component indices, and :data:`OUTLIER_LABEL` for the injected points. The name
    records the recipe's parameters.
    """
    x, labels = gaussian_mixture(n, d, components, factor=factor, seed=seed)
    x, mask = inject_outliers(x, outliers, dist_factor=dist_factor, seed=seed + 1)
    y = np.concatenate([labels, np.full(outliers, OUTLIER_LABEL, dtype=np.int64)])
    assert mask.sum() == outliers
    return Dataset(f"gmm{n}x{d}k{components}+{outliers}", x, y, components)


def with_outliers(dataset: Dataset, count: int, *, dist_factor: float = 50.0, seed: int = 0) -> Dataset:
    """``dataset`` with ``count`` outliers injected by the recipe (labels -1; no labels stay none).

    Args:
        dataset: a loaded data set.
        count: outliers to append (0 returns the data set unchanged).
        dist_factor: see `inject_outliers`.
        seed: seed of the local generator.
    """
    if count == 0:
        return dataset
    x, _ = inject_outliers(dataset.x, count, dist_factor=dist_factor, seed=seed)
    y = None
    if dataset.y is not None:
        y = np.concatenate([dataset.y, np.full(count, OUTLIER_LABEL, dtype=np.int64)])
    return dataclasses.replace(dataset, name=f"{dataset.name}+{count}", x=x, y=y)
