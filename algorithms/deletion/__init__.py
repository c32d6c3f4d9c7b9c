"""Deletion-efficient k-means (Ginart, Guan, Valiant, Zou, NeurIPS 2019): Q-k-means and DC-k-means.

* `fedproto.algorithms.deletion.qkmeans`: Q-k-means (quantised Lloyd's) with exact deletion;
* `fedproto.algorithms.deletion.dckmeans`: DC-k-means (a w-ary tree of k-means++ nodes) with exact deletion;
* `fedproto.algorithms.deletion.protocol`: both as message-passing parties, deletion requests as messages
  (DC-k-means as a tree of parties, optionally mass-weighted; Q-k-means with a data curator or
  federated): the theory of operation and the plans, re-exporting the roles;
* `fedproto.algorithms.deletion.roles`: the parties' roles of those protocols (DC-k-means' leaves,
  internal nodes and root; curated Q-k-means' server and clients);
* `fedproto.algorithms.deletion.federated`: federated Q-k-means, points kept at the parties (a coordinator
  runs keyed k-means++ and one round per Lloyd iteration on their statistics);
* `fedproto.algorithms.deletion.streams`: deletion streams, amortised time, quality metrics and the paper's
  synthetic Gaussian set;
* `fedproto.algorithms.deletion.cli`: the ``qkmeans`` and ``dckmeans`` plugins of the command line.

Exactness: after any stream of deletions the model *equals* a from-scratch run on the remaining
data with the same key (spec deletion-kmeans.md, oracles O-Q-1 and O-DC-1).
"""
