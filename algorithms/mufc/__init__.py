"""MUFC (Pan et al., ICLR 2023): one-shot secure federated clustering with exact unlearning.

Clients run K-means++ seeding, quantize their seeds to a public grid and send the cluster sizes
as SCMA syndromes (:mod:`fedproto.algorithms.scma`); the server decodes the exact sum and clusters the
weighted bin centres. Removal requests re-seed only from the first removed seed (Algorithm 3).
Spec: ``../shared/specs/mufc.md``.
"""
