"""Distributed (k,z)-clustering with outliers: Guo & Li (NeurIPS 2018) and its baselines.

Modules:

* `config`: the public parameters of a (k,z)-center run;
* `_kernels`: jitted dense kernels (distances, nearest centres, truncated costs);
* `solvers`: aggregation (Algorithm 2), kzc (Algorithm 1), Charikar-style covers, exact radius
  searches, farthest-first, costs, the median/means solvers (one name for the modules
  `solvers_shared`, `solvers_aggregation`, `solvers_covers` and `solvers_means`);
* `messages`: wire messages;
* `parties`: party names, the roster (`KzParties`, a `fedproto.star.StarParties`) and the
  machines' shared steps; `collect`: the coordinators' collect-and-check loop;
* `protocol`: the distributed (k,z)-center machines (Algorithm 3 over a grid of guesses;
  `center_machine` and `center_coordinator`, one module per role);
* `baselines`: MKCWM, GLZ / GLZ-z, random-random, random-kzc (distributed) and the centralised
  greedy, Charikar and kzc;
* `means`: (k,z)-median / (k,z)-means (Appendix C): distributed coresets per radius and the
  reverse-greedy coordinator solver, with k-means, k-means-- and BEL as baselines;
* `data`: the synthetic Gaussian mixture and the outlier injection recipe;
* `cli`: the ``kzcenter``, ``kzmedian`` and ``kzmeans`` plugins of the ``fedproto`` CLI, with
  `summaries` (results, summaries, baselines, plot) and `limits` (frame, grid and round bounds).

Reference: Xiangyu Guo and Shi Li, "Distributed k-Clustering for Data with Heavy Noise", NeurIPS
2018 (arXiv 1810.07852); this project's spec ``kz-clustering.md``.
"""
