"""SCMA (MUFC Algorithm 2): decoding time as the support grows, and upload bytes against dense aggregation.

What it measures
----------------
(a) Server decoding (`fedproto.algorithms.scma.decode_syndromes`: Berlekamp-Massey, root finding, Forney,
    validity checks) as the number of non-zeros ``m = K * L`` of the aggregate grows, for a
    Celltype-like field (n = 12,009, d = 10, B = 111: a 68-bit p) and a TCGA-like field (d = 57,
    B = 45: a 314-bit p); ``--tmi`` adds a TMI-like field (d = 984, B = 35: a 5048-bit p, whose
    prime search alone takes tens of seconds) at small support. Every client holds K distinct
    bins, all distinct across clients (the worst case: the full support ``KL``), masked with
    dealer masks; the decoded sum is checked against the truth. Beside the decoding time, measured
    in the same run: one client's encoding (`rs_syndromes` + `mask_syndromes`), the server's sum of
    the L masked messages (`aggregate_syndromes`, the work any secure aggregation has), and one
    pairwise mask expansion per peer (Bonawitz masks cost ``L - 1`` of them per client; the paper
    excludes mask generation from its costs). Ratios: decoding / summation, and the growth of the
    decoding time against the previous m.
(b) Client upload bytes ``T * ceil(bitlength(p) / 8)`` (T = 2KL = 800, K = 4, L = 100, as for
    Celltype) against dense secure aggregation of the length-``B^d`` count vector (``B^d`` field
    elements of the same width, analytic), as d grows with B = 111 fixed: SCMA grows linearly in
    d (logarithmically in B^d), the dense vector exponentially. The SCMA figure is measured: the
    length of one client's real message in fixed-width big-endian bytes.

A two-panel figure (decode time against m; bytes against d) is written to ``--plot`` if given.

``--json PATH`` writes one record per row: table ``scma_decoding`` (``field``, ``prime_bits``,
``m``, ``k``, ``n_clients``, ``n_syndromes``, ``encode_s``, ``pair_mask_s``, ``sum_s``,
``berlekamp_massey_s``, ``decode_s``, ``decode_over_sum``, ``decode_growth`` against the previous
m, ``null`` for the first) and table ``scma_upload`` (``d``, ``prime_bits``, ``d_log2_b``,
``width_bytes``, ``scma_bytes``, ``dense_bytes_log10``, ``dense_over_scma_log10``,
``clear_float32_bytes``; the dense vector's bytes as a base-10 logarithm, since B^d overflows
a float long before d = 200).

Run::

    python benchmarks/scma.py                 # full (a few minutes: m up to 10,000)
    python benchmarks/scma.py --tmi           # also the 5048-bit field
    python benchmarks/scma.py --quick         # smoke test (seconds)
    python benchmarks/scma.py --plot scma.png
"""

from __future__ import annotations

import argparse
import math
import random

import flint
from rich.table import Table

from _common import (
    add_common_arguments,
    best_of,
    fmt_bytes,
    make_console,
    parse_args,
    print_machine_facts,
    record,
    timed,
    write_records,
)
from fedproto.algorithms import scma

#: name -> (n, B, d): the data size and grid of the field (spec mufc.md 2.7).
FIELDS = {
    "celltype-like": (12_009, 111, 10),
    "tcga-like": (1_000, 45, 57),
    "tmi-like": (1_000, 35, 984),
}


def split_support(m: int) -> tuple[int, int]:
    """``(K, L)`` with ``K * L = m`` and L = min(m, 100) clients."""
    n_parties = min(m, 100)
    return m // n_parties, n_parties


def decode_row(rng: random.Random, p: int, n: int, n_bins: int, m: int) -> dict[str, float | int]:
    """Encode, mask, sum and decode one aggregate with ``m`` distinct non-zeros; return seconds."""
    k, n_parties = split_support(m)
    n_syndromes = 2 * m
    bins: set[int] = set()
    while len(bins) < m:
        bins.add(rng.randrange(1, n_bins + 1))
    ordered = sorted(bins, key=lambda _: rng.random())
    per_count = max(1, n // m)
    vectors = [{j: rng.randrange(1, per_count + 1) for j in ordered[l * k : (l + 1) * k]} for l in range(n_parties)]
    masks = scma.dealer_masks(n_parties, p, n_syndromes, rng.randbytes(32))
    repeats = 3 if m <= 1000 else 1

    def encode() -> float:
        seconds, _ = timed(lambda: scma.mask_syndromes(scma.rs_syndromes(vectors[0], p, n_syndromes), masks[0], p))
        return seconds

    encode_s = best_of(encode, repeats)
    seed = rng.randbytes(32)
    pair_s = best_of(lambda: timed(lambda: scma.pairwise_masks(0, {1: seed}, p, n_syndromes, 0))[0], repeats)
    messages = [
        scma.mask_syndromes(scma.rs_syndromes(q, p, n_syndromes), z, p) for q, z in zip(vectors, masks, strict=True)
    ]
    sum_s, sums = timed(lambda: scma.aggregate_syndromes(messages, p, n_syndromes))
    del messages
    bm_s, _ = timed(lambda: scma.error_locator(sums, p))
    decode_s, decoded = timed(
        lambda: scma.decode_syndromes(sums, p, max_support=m, max_index=n_bins, max_total=n if n >= m else None)
    )
    expected: dict[int, int] = {}
    for q in vectors:
        for j, c in q.items():
            expected[j] = expected.get(j, 0) + c
    if decoded != dict(sorted(expected.items())):
        raise AssertionError(f"decoding returned a wrong sum for m = {m}")
    return {"K": k, "L": n_parties, "T": n_syndromes, "encode_s": encode_s, "pair_s": pair_s, "sum_s": sum_s,
            "bm_s": bm_s, "decode_s": decode_s}


def fmt_s(seconds: float) -> str:
    """Seconds with 3 significant digits, in ms below one second."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def fmt_power(value: int) -> str:
    """A possibly astronomically large integer as ``1.23e+456``."""
    digits = len(str(value))
    if digits <= 12:
        return fmt_bytes(value)
    head = str(value)[:3]
    return f"{head[0]}.{head[1:]}e+{digits - 1}"


def fmt_ratio_big(numerator: int, denominator: int) -> str:
    """``numerator / denominator`` for integers of any size (3 significant digits)."""
    if numerator < 10**15 * denominator:
        return f"{numerator / denominator:.3g}"
    return fmt_power(numerator // denominator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, quick="m up to 100, d up to 20 (seconds)")
    parser.add_argument("--tmi", action="store_true", help="add the 5048-bit TMI-like field at m = 2 and 8")
    parser.add_argument("--plot", default=None, help="write a PNG figure to this path (default: no figure)")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser)

    plan = {
        "celltype-like": [10, 100] if args.quick else [10, 100, 1000, 10_000],
        "tcga-like": [10] if args.quick else [10, 100, 1000],
    }
    if args.tmi:
        plan["tmi-like"] = [2, 8]
    dims = [1, 2, 5, 10, 20] if args.quick else [1, 2, 3, 5, 10, 20, 50, 100, 200]

    console = make_console()
    print_machine_facts(console, "SCMA: exact decoding time and upload bytes", {
        "python-flint": f"{flint.__version__} (FLINT {flint.__FLINT_VERSION__})",
        "non-zeros m per field": "; ".join(f"{k}: {v}" for k, v in plan.items()),
        "d for the byte table": dims,
    })

    rng = random.Random(args.seed)
    rows, curves, records = [], {}, []
    for name, ms in plan.items():
        n, b, d = FIELDS[name]
        prime_s, p = timed(lambda n=n, b=b, d=d: scma.field_prime(n, b**d))
        console.print(f"{name}: n = {n:,}, B = {b}, d = {d}: p has {p.bit_length()} bits "
                      f"(field_prime took {fmt_s(prime_s)})")
        previous = None
        curves[name] = []
        for m in ms:
            r = decode_row(rng, p, n, b**d, m)
            growth = "" if previous is None else f"{r['decode_s'] / previous:.1f}x"
            records.append(record(
                "scma_decoding", field=name.replace("-", "_"), prime_bits=p.bit_length(), m=m, k=r["K"],
                n_clients=r["L"], n_syndromes=r["T"], encode_s=r["encode_s"], pair_mask_s=r["pair_s"],
                sum_s=r["sum_s"], berlekamp_massey_s=r["bm_s"], decode_s=r["decode_s"],
                decode_over_sum=r["decode_s"] / r["sum_s"],
                decode_growth=None if previous is None else r["decode_s"] / previous,
            ))
            previous = r["decode_s"]
            curves[name].append((m, r["decode_s"], r["sum_s"], r["encode_s"]))
            rows.append([
                name, str(p.bit_length()), f"{m:,}", str(r["K"]), str(r["L"]), f"{r['T']:,}",
                fmt_s(r["encode_s"]), fmt_s(r["pair_s"]), fmt_s(r["sum_s"]), fmt_s(r["bm_s"]),
                fmt_s(r["decode_s"]), f"{r['decode_s'] / r['sum_s']:.3g}", growth,
            ])

    table = Table(title="SCMA decoding time as the support m = K*L grows (full support, exact result checked); "
                        "baseline: summing the L masked messages", title_justify="left")
    for col in ("field", "bits of p", "m", "K", "L", "T", "encode 1 client", "pair mask/peer", "sum L msgs",
                "BM", "decode", "decode / sum", "vs previous m"):
        table.add_column(col, justify="left" if col == "field" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)

    n, b, _ = FIELDS["celltype-like"]
    k, n_parties = 4, 100
    n_syndromes = 2 * k * n_parties
    byte_rows, byte_curve = [], []
    for d in dims:
        p = scma.field_prime(n, b**d)
        width = scma.field_width(p)
        counts = {rng.randrange(1, b**d + 1): 3 for _ in range(k)}
        mask = scma.dealer_masks(n_parties, p, n_syndromes, rng.randbytes(32))[0]
        message = scma.mask_syndromes(scma.rs_syndromes(counts, p, n_syndromes), mask, p)
        scma_bytes = len(b"".join(v.to_bytes(width, "big") for v in message))
        if scma_bytes != n_syndromes * width:
            raise AssertionError("a message does not fit T * width bytes")
        dense_bytes = b**d * width
        byte_curve.append((d, scma_bytes, dense_bytes))
        records.append(record(
            "scma_upload", d=d, prime_bits=p.bit_length(), d_log2_b=d * math.log2(b), width_bytes=width,
            scma_bytes=scma_bytes, dense_bytes_log10=math.log10(dense_bytes),
            dense_over_scma_log10=math.log10(dense_bytes) - math.log10(scma_bytes), clear_float32_bytes=4 * k * d,
        ))
        byte_rows.append([
            str(d), str(p.bit_length()), f"{d * math.log2(b):.1f}", str(width), fmt_bytes(scma_bytes),
            fmt_power(dense_bytes), fmt_ratio_big(dense_bytes, scma_bytes), fmt_bytes(4 * k * d),
        ])
    table = Table(title=f"Client upload bytes, SCMA (T = 2KL = {n_syndromes} syndromes, measured) vs dense "
                        f"secure aggregation of the B^d-vector (analytic), B = {b}, n = {n:,}, K = {k}, "
                        f"L = {n_parties}", title_justify="left")
    for col in ("d", "bits of p", "d log2 B", "width B", "SCMA bytes", "dense bytes", "dense / SCMA",
                "K*d float32 (clear)"):
        table.add_column(col, justify="right")
    for row in byte_rows:
        table.add_row(*row)
    console.print(table)

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from matplotlib.ticker import MaxNLocator

        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8), layout="constrained")
        for i, (name, points) in enumerate(curves.items()):
            ms = [pt[0] for pt in points]
            color = f"C{i}"
            left.plot(ms, [pt[1] for pt in points], color=color, marker="o", label=f"decode ({name})")
            left.plot(ms, [pt[2] for pt in points], color=color, linestyle="--", marker=".",
                      label=f"sum L msgs ({name})")
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xlabel("non-zeros m = K L")
        left.set_ylabel("seconds")
        left.set_title("Server time")
        left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small", frameon=False)
        ds = [pt[0] for pt in byte_curve]
        right.plot(ds, [math.log10(pt[1]) for pt in byte_curve], marker="o", label="SCMA: T * width")
        right.plot(ds, [math.log10(pt[2]) for pt in byte_curve], marker="o", label="dense: B^d * width")
        right.set_xlabel("d (B = 111)")
        right.xaxis.set_major_locator(MaxNLocator(integer=True))
        right.set_ylabel("log10 bytes per client")
        right.set_title("Upload per client")
        right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small", frameon=False)
        fig.savefig(args.plot, dpi=110)
        plt.close(fig)
        console.print(f"plot written to {args.plot}")
    write_records(args.json, records, console)


if __name__ == "__main__":
    main()
