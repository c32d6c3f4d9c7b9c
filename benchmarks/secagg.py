"""Secure aggregation cost: SecAgg+ against classic SecAgg, FastLloyd's masking and (optionally) Flower.

What it measures
----------------
A SecAgg+ run is one set-up (``advertise-keys``: the clients' keys, agreed once per run) followed
by one aggregation per round (``masked-input`` + ``unmask``), so the cost that matters per round is
an aggregation after the set-up; the set-up is reported beside it, once. Each vector holds ``L``
elements of ``Z_2^w`` (``--length 1000``, ``--ring-bits 32``) per client, for n = 100, 1,000 and
10,000 clients (``--clients``), each run in one process by
:func:`fedproto.algorithms.secagg_plus.simulation.simulate` (``timed=True``): every client and the
server engine of :mod:`fedproto.algorithms.secagg_plus.engine` in a loop, every message encoded by
the runtime's codec (``encode_frame``), so the byte counts are the frames' exact sizes. Every
SecAgg run is the set-up and two aggregations (rounds 0 and 1, ``rounds=2``); its figures are the
set-up's (round 0's ``advertise-keys``) and round 1's, one aggregation after the set-up.
``simulate`` sums the bytes over the rounds, so round 1's are the 2-round run's minus those of a
``rounds=1`` run of the same configuration, inputs and entropy (the same set-up and round 0, byte
for byte: the set-up's bytes are checked equal, and without dropouts round 1's bytes are checked
equal to round 0's, client by client); its seconds are ``server_s[1]`` and
``client_s[1]``, the set-up's ``server_s[0]`` and ``client_s[0]`` at ``advertise-keys``. Per n:

(a) **SecAgg+** (``engine.plus_config``): a random k-regular graph, (k, t) from Bell et al.'s bounds
    (failure probability 2^-40, 20% corrupt clients, 10% dropouts).
(b) **classic SecAgg** (``engine.complete_config``): the complete graph, t = n/2 + 1, run where
    affordable (``--complete-max``, default 1,000); for larger n the row holds the analytic
    bytes of ``engine.stage_bytes`` only (marked "analytic, not run": no envelopes, no times).
(c) **MSA**, FastLloyd's no-dropout masking (``fedproto.algorithms.secagg``): each client sends its
    masked vector (FastLloyd's ``MaskedUpdate``, ``uint [1, L]``, phase ``update``) and receives
    the masked aggregate (``NoisyAggregate``, phase ``aggregate``); the bytes are those two frames.
    Server seconds: summing the n masked vectors in the ring with NumPy (best of 3); client
    seconds: one ``MaskGenerator.party_mask`` and the addition (mean over all n clients, best of
    3; every client's mask costs two expansions, one when the client before it shared its
    generator). MSA's one-time key set-up (the sealed shared seed) is not counted: like SecAgg+'s
    set-up, it is paid once per run, not per aggregation.
(d) **SecAgg+ with 5% dropouts** (``--dropout-rate``): the same as (a), with a seeded random 5% of
    the clients silent from round 1's masked-input on (``{i: ("masked-input", 1)}``), so round 1
    is the aggregation with dropouts: its survivors reveal, for each silent neighbour, the round's
    pair mask key with it (never a long-term key), and the server removes the pairwise masks the
    silent clients left in their neighbours' inputs. (Remasking, ``SumOutcome.attempts == 2``, is
    not triggered: nobody goes silent at unmask; the ``attempts`` field says so.)

Every round's sum (rounds 0 and 1 of every run, and round 0 of the 1-round run) is checked against
the plain sum of that round's survivors' inputs (``sim.outcomes[r].survivors``).

The protocol's sizes: a client sends one 32-byte X25519 key at the set-up and receives each
neighbour's (``k (4 + 32)`` bytes); in each aggregation it sends its masked vector and one
ciphertext per neighbour (``CIPHERTEXT_BYTES`` = 49: one 33-byte Shamir share of that round's
self-mask seed and a 16-byte Poly1305 tag), receives its neighbours' ciphertexts (with the list of
its neighbours without input), and sends back one 33-byte share per neighbour that sent its input
and one 32-byte round pair key per neighbour that did not (``engine.stage_bytes``).

Bytes per client (mean over all n clients, sent + received, per stage, per aggregation after the
set-up and for the set-up) are set beside the analytic ``engine.stage_bytes`` (data bytes without
envelopes; for the dropout run its mean over the n clients: a silent client sends and receives
nothing in round 1, a survivor has ``k D / (n - 1)`` silent neighbours in expectation for ``D``
silent clients, and ``stage_bytes`` is linear in that number): ``overhead/frame`` is the measured
minus the analytic bytes per frame a client sends or receives in the aggregation (3 per survivor),
i.e. the envelope and the msgpack headers. ``x MSA`` is a row's bytes per aggregation per client
over MSA's at the same n. Times: the server's seconds per stage of round 1 (handling the stage's
messages, including reconstruction and unmasking in ``unmask``) and of the set-up, and the
clients' seconds per client (every client's engine calls, plus encoding the frames to count them,
over n), each beside MSA's as a ratio; the set-up's client seconds include the key agreements
(``SecAggPlusClient.receive_keys``). The growth table gives, for each
scheme, bytes per client per aggregation against n, the factor and the increment from the
previous n, next to the factor of n and of log n: SecAgg+'s bytes grow by a roughly constant
increment per decade of n (k = O(log n)), classic SecAgg's by the factor of n (k = n - 1).

Flower (optional, ``--flower-python PATH``)
-------------------------------------------
Flower is not a dependency of this project. With a Python that has ``flwr`` installed (made
outside the repository: ``python -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install flwr``),
``--flower-python /tmp/flwr-venv/bin/python`` runs ``benchmarks/_flower_secaggplus.py`` in that
Python for every n up to ``--flower-max`` (default 100): Flower's own server workflow
(``flwr.server.workflow.SecAggPlusWorkflow``) and client mod (``flwr.client.mod.secaggplus_mod``),
driven in one process by a loopback ``Grid`` (no SuperLink, SuperNode, gRPC or Ray are needed),
with ``num_shares = k + 1`` (Flower counts the client itself) and the same threshold t as our
SecAgg+ at that n, on the same L (as float32 values, which Flower quantises). Its bytes are its
messages' protobuf serialisation (``flwr.common.serde.message_to_proto``), the form each
message takes on Flower's wire, with no gRPC framing; the deflated object tree Flower 1.2x+
pushes is in its detail table. Its four stages are mapped onto our three by content:
advertise-keys = ``setup`` sent + the keys received in ``setup`` and ``share_keys``;
masked-input = the ciphertexts sent in ``share_keys`` + the vector sent in
``collect_masked_vectors``, and received: the ciphertexts received in ``collect_masked_vectors``
+ the node lists received in ``unmask``; unmask = the shares sent in ``unmask``. Server seconds:
advertise-keys = ``setup``; masked-input = ``share_keys`` + ``collect_masked_vectors``; unmask =
``unmask``. **Flower redoes its set-up every round** (new keys, new shares), so its per-round
figures (its ``total_bytes``, ``server_s``, ``client_s_per_client`` and their ratios to MSA) are
its whole round, set-up included: compare them with our set-up plus one aggregation, not with our
aggregation alone. No model is sent with the fit instruction (the aggregation alone is measured).
Measured with flwr 1.41.0: Flower's client encrypts each neighbour's TWO shares (its self-mask
seed's and its secret key's) with Fernet (AES-128-CBC + HMAC-SHA256, base64) under keys agreed on
SECP384R1 and sent as PEM, and shares its PEM-encoded private key (padded to 320 bytes, 20 chunks
of Shamir over GF(2^128)), so one neighbour's ciphertext is 612 bytes. Ours is 49 bytes and
carries ONE share per neighbour per round (the round's self-mask seed; a dropped client's masks
are removed with the round's pair keys its neighbours reveal, not with a shared secret key), so
the ratio of the two sizes is not a like-for-like comparison of the encryption alone. Flower's
masks are NumPy ``RandomState`` streams seeded with 32 bits, in ``int64`` arrays (8 bytes per
element of ``Z_2^32``). At n = 100 and L = 1,000 its run takes about 3 minutes (a minute of it
the server's unmasking: Shamir over GF(2^128) in pure Python, PyCryptodome's ``Shamir.combine``;
most of the rest the clients' share creation), so it is off by default. (Flower was not run
since the protocol change; the mapping above is correct by construction, not re-measured.)

Where the time goes
-------------------
Measured on the 2 cores with nothing else running (load average 1.0: this run alone), the Flower
run excluded, on the engine of main at 62e7095. The full run takes about 12.5 minutes: classic
SecAgg at n = 1,000 about 5.3 minutes (k = 999; its 1-round and 2-round runs: two set-ups of a
million X25519 agreements each and three aggregations), SecAgg+ at n = 10,000 (k = 100) about 4.2
minutes for its 1-round and 2-round runs and 2.4 minutes for the dropout run. ``--quick`` takes
about 50 s. One SecAgg+ aggregation after the set-up costs a client 1.5 ms at n = 100, 1.6 ms at
1,000 and 2.8 ms at 10,000 (per neighbour: one pair-mask expansion of L elements, one share and its
ChaCha20-Poly1305 encryption, one decryption), against 0.04 to 0.07 ms for MSA's one mask; the
set-up costs a client 6 to 8 ms (one X25519 agreement and two HKDF keys per neighbour), paid once.
The server's aggregation takes 11 ms, 0.14 s and 2.9 s at n = 100, 1,000 and 10,000, 80% of it in
``unmask`` (rebuilding each sender's self-mask seed from t shares and removing its self mask); its
set-up 5 ms, 47 ms and 0.94 s. Both grow faster than n from 1,000 to 10,000 (a client's seconds
1.7x, the server's 20x for 10x the clients) with k only 1.09x larger. ``--profile`` shows the
clients' split.

Tables (``--json PATH``, one record per row): ``secagg_bytes`` (``n_clients``, ``scheme``:
``msa``, ``secagg_plus``, ``secagg_plus_dropout``, ``secagg_complete``, ``flower_secagg_plus``;
``measured``, ``degree``, ``threshold``, ``dropped``, ``<stage>_sent_bytes`` and
``<stage>_received_bytes`` for the stages ``advertise_keys`` (the set-up), ``masked_input`` and
``unmask`` (round 1; MSA: its two frames under ``masked_input``, ``null`` set-up), ``total_bytes``
(one aggregation after the set-up, masked-input + unmask; Flower: its whole round),
``setup_bytes``, ``analytic_total_bytes``, ``analytic_setup_bytes``, ``overhead_bytes_per_frame``,
``attempts`` (round 1's), ``ratio_to_msa`` (``total_bytes`` over MSA's)), ``secagg_time``
(``n_clients``, ``scheme``, ``advertise_keys_server_s`` (the set-up), ``masked_input_server_s``,
``unmask_server_s`` (round 1), ``server_s`` (round 1's total; Flower: its whole round),
``server_ratio_to_msa``, ``setup_client_s_per_client``, ``client_s_per_client`` (round 1),
``client_ratio_to_msa``, ``wall_s`` (the whole 2-round run)), ``secagg_growth`` (``scheme``,
``n_clients``, ``degree``, ``total_bytes`` (per aggregation after the set-up), ``measured``,
``growth``, ``increment_bytes``, ``n_growth``, ``log_n_growth``; ``null`` for the first n) and,
with ``--flower-python``, ``secagg_flower`` (``n_clients``, ``stage`` (Flower's),
``sent_bytes``, ``received_bytes``, ``sent_object_bytes``, ``received_object_bytes``,
``client_s_per_client``, ``server_s``). ``--profile`` adds ``secagg_profile`` (``function``,
``calls``, ``tottime_s``, ``cumtime_s``): cProfile of one extra SecAgg+ run (the set-up and two
aggregations) at the middle n.

``--plot PATH``: bytes per client per aggregation after the set-up against n (log-log; measured
solid, analytic dashed) and the server's seconds per stage of that aggregation as stacked bars,
one panel per n (our set-up left out; Flower's bar is its whole round, set-up included).

Run::

    python benchmarks/secagg.py            # n = 100, 1,000, 10,000 (about 13 minutes on 2 cores)
    python benchmarks/secagg.py --quick    # n = 100 and 1,000, complete graph at 100 (about 50 s)
    python benchmarks/secagg.py --plot secagg.png --json secagg.json
    python benchmarks/secagg.py --flower-python /tmp/flwr-venv/bin/python   # + Flower at n = 100

References:
    Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
    ACM CCS 2017. Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
    Overhead", ACM CCS 2020, Table 1. Diaa et al., FastLloyd (arXiv 2405.02437), Sec. 5.3.4.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import re
import subprocess
import time
from pathlib import Path

import cryptography
import flint
import numpy as np
from rich.table import Table

from _common import (
    add_common_arguments,
    best_of,
    fmt_bytes,
    make_console,
    parse_args,
    print_machine_facts,
    record,
    write_records,
)
from fedproto.algorithms import secagg
from fedproto.algorithms.fastlloyd.messages import MaskedUpdate, NoisyAggregate
from fedproto.algorithms.secagg_plus import engine, shamir
from fedproto.algorithms.secagg_plus.messages import CIPHERTEXT_BYTES, KEY_BYTES
from fedproto.algorithms.secagg_plus.simulation import simulate
from fedproto.codec import encode_frame

STAGES = engine.STAGES
STAGE_KEYS = {stage: stage.replace("-", "_") for stage in STAGES}
#: The stages of every aggregation (``STAGES[0]``, ``advertise-keys``, is the run's set-up).
AGGREGATION = engine.AGGREGATION_STAGES
SCHEME_LABELS = {
    "msa": "MSA (no dropouts)",
    "secagg_plus": "SecAgg+",
    "secagg_plus_dropout": "SecAgg+, dropouts",
    "secagg_complete": "SecAgg (complete)",
    "flower_secagg_plus": "Flower SecAgg+",
}
FLOWER_STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")
FLOWER_SCRIPT = Path(__file__).resolve().parent / "_flower_secaggplus.py"


def fmt_s(seconds: float | None) -> str:
    """Seconds with 3 significant digits, in ms below one second; an em dash for none."""
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def msa_run(inputs: np.ndarray, ring_bits: int, seed: int) -> dict:
    """FastLloyd's MSA on the same inputs: frame bytes per client, server and client seconds."""
    n, length = inputs.shape
    masks = secagg.MaskGenerator(np.random.default_rng(seed).bytes(32), n, (1, length), ring_bits=ring_bits)

    def clients() -> float:
        start = time.perf_counter()
        clients.masked = [inputs[i].reshape(1, length) + masks.party_mask(i, 0) for i in range(n)]
        return (time.perf_counter() - start) / n

    client_s = best_of(clients, 3)  # the first pass also pays NumPy's and the PRG's warm-up
    masked = clients.masked

    def server_sum() -> float:
        t0 = time.perf_counter()
        total = np.zeros((1, length), dtype=inputs.dtype)
        for vector in masked:
            total += vector  # the ring's addition: unsigned wrap-around
        seconds = time.perf_counter() - t0
        server_sum.total = total
        return seconds

    server_s = best_of(server_sum, 3)
    if not np.array_equal(server_sum.total - masks.total_mask(0), inputs.sum(axis=0, dtype=inputs.dtype).reshape(1, -1)):
        raise AssertionError("MSA: the unmasked sum is not the sum of the inputs")
    sent = len(encode_frame(MaskedUpdate(masked=masked[0]), session=0, round_idx=0, phase="update"))
    received = len(encode_frame(NoisyAggregate(masked=server_sum.total), session=0, round_idx=0, phase="aggregate"))
    return {"sent": sent, "received": received, "server_s": server_s, "client_s": client_s}


def analytic_mean(config: engine.SecAggPlusConfig, dropped: int) -> dict[str, dict[str, float]]:
    """``stage_bytes`` averaged over all n clients for one aggregation in which ``dropped`` clients
    are silent from its masked-input stage on (they send and receive nothing in it); the
    ``advertise-keys`` entry is the set-up's (nobody drops there).

    A survivor's ``stage_bytes`` is linear in the number ``d`` of its neighbours without input (its
    request lists them, and the forwarded ciphertexts and revealed shares shrink by as many, each
    replaced by a revealed pair key); over a uniformly random dropped set ``d`` is ``k D / (n - 1)``
    in expectation, so the survivors' mean is ``stage_bytes`` at that ``d``.
    """
    n = config.n_clients
    alive = (n - dropped) / n
    setup = engine.stage_bytes(config)[STAGES[0]]
    survivor = engine.stage_bytes(config, dropped=config.degree * dropped / (n - 1))  # type: ignore[arg-type]
    cost = {STAGES[0]: {side: float(v) for side, v in setup.items()}}
    for stage in AGGREGATION:
        cost[stage] = {side: alive * float(v) for side, v in survivor[stage].items()}
    return cost


def check_sums(sim, inputs: np.ndarray, what: str) -> None:
    """Every round's sum against the plain sum of that round's survivors' inputs."""
    for r, outcome in enumerate(sim.outcomes):
        survivors = np.array(sorted(int(name.rsplit("-", 1)[1]) for name in outcome.survivors), dtype=np.int64)
        if not np.array_equal(outcome.total, inputs[survivors].sum(axis=0, dtype=inputs.dtype)):
            raise AssertionError(f"{what}, round {r}: the sum is not the sum of the survivors' inputs")


def secagg_run(config: engine.SecAggPlusConfig, inputs: np.ndarray, dropped: np.ndarray,
               base: dict | None = None) -> dict:
    """The set-up and two aggregations (rounds 0 and 1), ``dropped`` silent from round 1's
    masked-input on: the set-up's bytes and seconds, and round 1's (one aggregation after the
    set-up).

    ``simulate`` sums the bytes over the rounds, so round 1's are this run's minus those of the
    set-up and round 0 alone (``base``: a ``rounds=1`` run of the same configuration, inputs and
    entropy without dropouts, whose set-up and round 0 are this run's; made here when None).
    """
    n = config.n_clients
    what = f"SecAgg (k = {config.degree}, n = {n})"
    if base is None:
        one = simulate(config, list(inputs), rounds=1)
        check_sums(one, inputs, what + ", 1 round")
        base = {"sent": {s: one.sent_bytes[s].copy() for s in STAGES},
                "received": {s: one.received_bytes[s].copy() for s in STAGES}}
    dropouts = {int(i): (STAGES[1], 1) for i in dropped}
    start = time.perf_counter()
    sim = simulate(config, list(inputs), dropouts=dropouts, rounds=2, timed=True)
    wall_s = time.perf_counter() - start
    check_sums(sim, inputs, what)
    if len(sim.outcomes[1].survivors) != n - len(dropped):
        raise AssertionError(
            f"{what}: {len(sim.outcomes[1].survivors)} survivors in round 1, expected {n - len(dropped)}"
        )
    if not (np.array_equal(sim.sent_bytes[STAGES[0]], base["sent"][STAGES[0]])
            and np.array_equal(sim.received_bytes[STAGES[0]], base["received"][STAGES[0]])):
        raise AssertionError(f"{what}: the set-up's bytes differ between the 1- and 2-round runs")
    if not len(dropped) and not all(
        np.array_equal(getattr(sim, f"{side}_bytes")[s] - base[side][s], base[side][s])
        for side in ("sent", "received") for s in AGGREGATION
    ):  # without dropouts, rounds 0 and 1 exchange frames of the same sizes
        raise AssertionError(f"{what}: round 1's bytes differ from round 0's without dropouts")
    sent = {STAGES[0]: float(sim.sent_bytes[STAGES[0]].mean())}
    received = {STAGES[0]: float(sim.received_bytes[STAGES[0]].mean())}
    for s in AGGREGATION:  # round 1 alone
        sent[s] = float((sim.sent_bytes[s] - base["sent"][s]).mean())
        received[s] = float((sim.received_bytes[s] - base["received"][s]).mean())
    analytic = analytic_mean(config, len(dropped))
    total = sum(sent[s] + received[s] for s in AGGREGATION)
    analytic_total = sum(analytic[s]["sent"] + analytic[s]["received"] for s in AGGREGATION)
    attempts = sim.outcomes[1].attempts
    # Round 1's frames: each survivor sends its masked input, receives its unmask request and sends
    # its shares (3 frames); a client silent from masked-input on has none. A remasked round has
    # more: the per-frame overhead is then not given.
    frames = 3 * len(sim.outcomes[1].survivors)
    return {
        "sent": sent,
        "received": received,
        "total": total,
        "setup": sent[STAGES[0]] + received[STAGES[0]],
        "analytic": analytic,
        "analytic_total": analytic_total,
        "analytic_setup": analytic[STAGES[0]]["sent"] + analytic[STAGES[0]]["received"],
        "overhead": (total - analytic_total) / (frames / n) if attempts == 1 else None,
        "attempts": attempts,
        "server_s": {STAGES[0]: sim.server_s[0][STAGES[0]], **{s: sim.server_s[1][s] for s in AGGREGATION}},
        "client_s": sum(sim.client_s[1][s] for s in AGGREGATION) / n,
        "setup_client_s": sim.client_s[0][STAGES[0]] / n,
        "wall_s": wall_s,
        "base": base,
    }


def flower_run(python: str, n: int, length: int, k: int, t: int, seed: int) -> dict:
    """Run Flower's SecAgg+ workflow in ``python`` (see ``_flower_secaggplus.py``); its JSON."""
    out = subprocess.run(
        [python, str(FLOWER_SCRIPT), "--clients", str(n), "--length", str(length), "--num-shares",
         str(min(k + 1, n)), "--threshold", str(t), "--seed", str(seed)],
        capture_output=True, text=True, timeout=3600, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the Flower run failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def flower_as_ours(result: dict) -> dict:
    """Flower's per-stage figures regrouped by content onto our three stages (see the docstring).

    Flower redoes its set-up every round, so its ``total`` (bytes per client), ``server_total``
    and ``client_s`` are its whole round, set-up included: compare them with our set-up plus one
    aggregation, and its ``setup`` entries with our set-up.
    """
    fs = result["stages"]
    sent = {
        STAGES[0]: fs["setup"]["sent_bytes"],
        STAGES[1]: fs["share_keys"]["sent_bytes"] + fs["collect_masked_vectors"]["sent_bytes"],
        STAGES[2]: fs["unmask"]["sent_bytes"],
    }
    received = {
        STAGES[0]: fs["setup"]["received_bytes"] + fs["share_keys"]["received_bytes"],
        STAGES[1]: fs["collect_masked_vectors"]["received_bytes"] + fs["unmask"]["received_bytes"],
        STAGES[2]: 0.0,
    }
    server = {
        STAGES[0]: fs["setup"]["server_s"],
        STAGES[1]: fs["share_keys"]["server_s"] + fs["collect_masked_vectors"]["server_s"],
        STAGES[2]: fs["unmask"]["server_s"],
    }
    return {
        "sent": sent,
        "received": received,
        "total": sum(sent.values()) + sum(received.values()),
        "setup": sent[STAGES[0]] + received[STAGES[0]],
        "server_s": server,
        "server_total": sum(server.values()),
        "client_s": sum(s["client_s"] for s in fs.values()),
        "setup_client_s": fs["setup"]["client_s"],
        "wall_s": result["total_s"],
        "attempts": 1,
    }


def profile_run(config: engine.SecAggPlusConfig, inputs: np.ndarray, top: int = 15) -> list[tuple[str, int, float, float]]:
    """cProfile one SecAgg+ run (the set-up and two aggregations); the ``top`` functions by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(config, list(inputs), rounds=2)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        if filename != "~":
            label = f"{Path(filename).name}:{line}({name})"
        else:  # a built-in: "<method 'exchange' of 'a.b.X25519PrivateKey' objects>" -> X25519PrivateKey.exchange
            found = re.fullmatch(r"<method '(\w+)' of '(?:[\w.]+\.)?(\w+)' objects>", name)
            label = f"{found[2]}.{found[1]}" if found else name
        rows.append((label, calls, tottime, cumtime))
    rows.sort(key=lambda r: -r[2])
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, quick="n = 100 and 1,000, the complete graph at 100 only (about 50 s)")
    parser.add_argument("--clients", type=int, nargs="+", default=None, metavar="N",
                        help="client counts (default 100 1000 10000; --quick: 100 1000)")
    parser.add_argument("--length", type=int, default=1000, help="elements per client vector L (default 1000)")
    parser.add_argument("--ring-bits", type=int, choices=(32, 64), default=32, help="ring width w (default 32)")
    parser.add_argument("--complete-max", type=int, default=None, metavar="N",
                        help="run classic SecAgg up to this n, analytic bytes above (default 1000; --quick: 100)")
    parser.add_argument("--dropout-rate", type=float, default=0.05,
                        help="fraction of clients silent from round 1's masked-input on in the dropout run "
                             "(default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the dropout set")
    parser.add_argument("--flower-python", default=None, metavar="PATH",
                        help="a Python with flwr installed: also run Flower's SecAgg+ workflow (not a dependency)")
    parser.add_argument("--flower-max", type=int, default=100, metavar="N",
                        help="run Flower up to this n (default 100: about 3 minutes at L = 1000)")
    parser.add_argument("--profile", action="store_true", help="cProfile one extra SecAgg+ run at the middle n")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a PNG figure here (default: no figure)")
    args = parse_args(parser)
    if args.clients is None:
        args.clients = [100, 1000] if args.quick else [100, 1000, 10_000]
    if args.complete_max is None:
        args.complete_max = 100 if args.quick else 1000
    if any(n < 2 for n in args.clients):
        parser.error("--clients: every n must be at least 2")
    if args.length < 1:
        parser.error("--length must be at least 1")
    if not 0 <= args.dropout_rate < 1:
        parser.error("--dropout-rate must lie in [0, 1)")
    if args.flower_python is not None and not Path(args.flower_python).exists():
        parser.error(f"--flower-python: {args.flower_python} does not exist")
    plan = sorted(set(args.clients))
    modulus = engine.Modulus.ring(args.ring_bits)
    dtype = modulus.dtype

    console = make_console()
    print_machine_facts(console, "Secure aggregation: SecAgg+ vs classic SecAgg vs MSA", {
        "cryptography": cryptography.__version__,
        "python-flint": flint.__version__,
        "clients n": ", ".join(f"{n:,}" for n in plan),
        "vector": f"L = {args.length:,} elements of {modulus.describe()} ({args.length * modulus.width:,} bytes)",
        "classic SecAgg run up to": f"n = {args.complete_max:,} (analytic bytes above)",
        "dropout run": f"{args.dropout_rate:.0%} of the clients silent from round 1's masked-input on "
                       f"(seed {args.seed})",
        "Flower": f"{args.flower_python} up to n = {args.flower_max:,}" if args.flower_python else "not run (--flower-python)",
    })

    results: dict[tuple[int, str], dict] = {}
    configs: dict[tuple[int, str], engine.SecAggPlusConfig] = {}
    flower_raw: dict[int, dict] = {}
    started = time.perf_counter()

    def progress(text: str) -> None:
        console.print(f"[{time.perf_counter() - started:7.1f} s] {text}", highlight=False)

    for n in plan:
        rng = np.random.default_rng([args.seed, n])
        inputs = rng.integers(0, modulus.size, size=(n, args.length), dtype=dtype)
        progress(f"n = {n:,}: MSA ...")
        results[n, "msa"] = msa_run(inputs, args.ring_bits, args.seed)
        plus = engine.plus_config(n, args.length, modulus)
        configs[n, "secagg_plus"] = configs[n, "secagg_plus_dropout"] = plus
        progress(f"n = {n:,}: SecAgg+ (k = {plus.degree}, t = {plus.threshold}): set-up + 1 round, then + 2 rounds ...")
        results[n, "secagg_plus"] = secagg_run(plus, inputs, np.empty(0, dtype=np.int64))
        n_drop = round(args.dropout_rate * n)
        dropped = rng.choice(n, size=n_drop, replace=False)
        progress(f"n = {n:,}: SecAgg+, set-up + 2 rounds, {n_drop:,} clients silent from round 1's masked-input ...")
        results[n, "secagg_plus_dropout"] = secagg_run(plus, inputs, dropped, base=results[n, "secagg_plus"]["base"])
        results[n, "secagg_plus_dropout"]["dropped"] = n_drop
        complete = engine.complete_config(n, args.length, modulus)
        configs[n, "secagg_complete"] = complete
        if n <= args.complete_max:
            progress(f"n = {n:,}: classic SecAgg (k = {complete.degree}, t = {complete.threshold}): set-up + 1 round, "
                     "then + 2 rounds ...")
            results[n, "secagg_complete"] = secagg_run(complete, inputs, np.empty(0, dtype=np.int64))
        else:
            cost = analytic_mean(complete, 0)
            results[n, "secagg_complete"] = {
                "analytic_only": True,
                "analytic": cost,
                "analytic_total": sum(cost[s]["sent"] + cost[s]["received"] for s in AGGREGATION),
                "analytic_setup": cost[STAGES[0]]["sent"] + cost[STAGES[0]]["received"],
            }
        if args.flower_python and n <= args.flower_max:
            progress(f"n = {n:,}: Flower SecAgg+ (num_shares = {min(plus.degree + 1, n)}, t = {plus.threshold}) ...")
            flower_raw[n] = flower_run(args.flower_python, n, args.length, plus.degree, plus.threshold, args.seed)
            results[n, "flower_secagg_plus"] = flower_as_ours(flower_raw[n])
            configs[n, "flower_secagg_plus"] = plus
    progress("done")

    # -- bytes -------------------------------------------------------------------------------------
    records = []
    schemes = ["msa", "secagg_plus", "secagg_plus_dropout", "secagg_complete", "flower_secagg_plus"]
    table = Table(
        title=f"Bytes per client per stage (sent + received, mean over the n clients), L = {args.length:,} "
              f"elements of {modulus.describe()}: the set-up (advertise-keys, once per run) and ONE aggregation "
              "after it (round 1's masked-input + unmask); baseline: MSA (FastLloyd's masking, no dropouts) in "
              "the same run",
        title_justify="left",
    )
    for col in ("n", "scheme", "k", "t", "set-up: " + STAGES[0], *AGGREGATION, "per aggregation", "analytic",
                "overhead/frame", "x MSA"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    for n in plan:
        msa = results[n, "msa"]
        msa_total = msa["sent"] + msa["received"]
        for scheme in schemes:
            r = results.get((n, scheme))
            if r is None:
                continue
            label = SCHEME_LABELS[scheme]
            if scheme == "msa":
                table.add_row(f"{n:,}", label, "—", "—", "—", fmt_bytes(msa_total), "—", fmt_bytes(msa_total),
                              "—", "—", "1.00")
                records.append(record(
                    "secagg_bytes", n_clients=n, scheme=scheme, measured=True, degree=None, threshold=None, dropped=0,
                    advertise_keys_sent_bytes=None, advertise_keys_received_bytes=None,
                    masked_input_sent_bytes=msa["sent"], masked_input_received_bytes=msa["received"],
                    unmask_sent_bytes=0, unmask_received_bytes=0, total_bytes=msa_total, setup_bytes=None,
                    analytic_total_bytes=None, analytic_setup_bytes=None, overhead_bytes_per_frame=None,
                    attempts=1, ratio_to_msa=1.0,
                ))
                continue
            cfg = configs[n, scheme]
            if r.get("analytic_only"):
                table.add_row(
                    f"{n:,}", f"{label}: analytic, not run", str(cfg.degree), str(cfg.threshold),
                    *(fmt_bytes(r["analytic"][s]["sent"] + r["analytic"][s]["received"]) for s in STAGES),
                    "—", fmt_bytes(r["analytic_total"]), "—", f"{r['analytic_total'] / msa_total:.3g}",
                )
                records.append(record(
                    "secagg_bytes", n_clients=n, scheme=scheme, measured=False, degree=cfg.degree,
                    threshold=cfg.threshold, dropped=0,
                    **{f"{STAGE_KEYS[s]}_sent_bytes": r["analytic"][s]["sent"] for s in STAGES},
                    **{f"{STAGE_KEYS[s]}_received_bytes": r["analytic"][s]["received"] for s in STAGES},
                    total_bytes=None, setup_bytes=None, analytic_total_bytes=r["analytic_total"],
                    analytic_setup_bytes=r["analytic_setup"], overhead_bytes_per_frame=None, attempts=None,
                    ratio_to_msa=r["analytic_total"] / msa_total,
                ))
                continue
            if scheme == "secagg_plus_dropout":
                label = f"SecAgg+, {r['dropped']:,} dropped"
            flower = scheme == "flower_secagg_plus"
            k = min(cfg.degree + 1, n) if flower else cfg.degree
            analytic = r.get("analytic_total")
            table.add_row(
                f"{n:,}", label, str(k), str(cfg.threshold),
                *(fmt_bytes(r["sent"][s] + r["received"][s]) for s in STAGES),
                fmt_bytes(r["total"]) + (" (with set-up)" if flower else ""),
                fmt_bytes(analytic) if analytic is not None else "—",
                f"{r['overhead']:.1f}" if r.get("overhead") is not None else "—", f"{r['total'] / msa_total:.3g}",
            )
            records.append(record(
                "secagg_bytes", n_clients=n, scheme=scheme, measured=True, degree=k, threshold=cfg.threshold,
                dropped=r.get("dropped", 0),
                **{f"{STAGE_KEYS[s]}_sent_bytes": r["sent"][s] for s in STAGES},
                **{f"{STAGE_KEYS[s]}_received_bytes": r["received"][s] for s in STAGES},
                total_bytes=r["total"], setup_bytes=r["setup"], analytic_total_bytes=analytic,
                analytic_setup_bytes=r.get("analytic_setup"), overhead_bytes_per_frame=r.get("overhead"),
                attempts=r["attempts"], ratio_to_msa=r["total"] / msa_total,
            ))
    console.print(table)
    console.print(
        "k, t: degree and threshold (Flower: num_shares = k + 1, itself included). set-up: the run's advertise-keys, "
        "paid once; masked-input, unmask: round 1 alone (the 2-round run's bytes minus a 1-round run's: the same "
        "set-up and round 0); per aggregation: their sum, the cost of every round after the set-up, and x MSA is "
        "it over MSA's. analytic: engine.stage_bytes (data bytes, no envelopes; dropouts: its mean over the n "
        "clients); overhead/frame: (measured - analytic) per frame a client sent or received in the aggregation "
        "(envelope and msgpack headers). MSA's bytes are its two frames (masked vector up, masked aggregate down), "
        "shown under masked-input; SecAgg+ sends no aggregate down (the server learns the sum). Flower: its "
        "protobuf messages regrouped onto our stages by content; it redoes its set-up every round, so its per "
        "aggregation figure includes it (compare it with our set-up + per aggregation).",
        highlight=False,
    )

    # -- time --------------------------------------------------------------------------------------
    table = Table(
        title="Seconds (one process, perf_counter): the set-up (advertise-keys, round 0: the server's, and the "
              "clients' per client) and ONE aggregation after it (round 1: the server's per stage and in total, "
              "the clients' per client); baselines: MSA's server summing the n masked vectors (best of 3) and its "
              "clients' mask and addition",
        title_justify="left",
    )
    for col in ("n", "scheme", "set-up server", "set-up client/client", *(f"{s} server" for s in AGGREGATION),
                "server per aggregation", "x MSA", "client/client per aggregation", "client x MSA", "wall"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    for n in plan:
        msa = results[n, "msa"]
        table.add_row(f"{n:,}", SCHEME_LABELS["msa"], "—", "—", fmt_s(msa["server_s"]), "—", fmt_s(msa["server_s"]),
                      "1.00", fmt_s(msa["client_s"]), "1.00", "—")
        records.append(record(
            "secagg_time", n_clients=n, scheme="msa", advertise_keys_server_s=None,
            masked_input_server_s=msa["server_s"], unmask_server_s=None, server_s=msa["server_s"],
            server_ratio_to_msa=1.0, setup_client_s_per_client=None, client_s_per_client=msa["client_s"],
            client_ratio_to_msa=1.0, wall_s=None,
        ))
        for scheme in schemes[1:]:
            r = results.get((n, scheme))
            if r is None or r.get("analytic_only"):
                continue
            flower = scheme == "flower_secagg_plus"
            server = r["server_total"] if flower else sum(r["server_s"][s] for s in AGGREGATION)
            label = f"SecAgg+, {r['dropped']:,} dropped" if scheme == "secagg_plus_dropout" else SCHEME_LABELS[scheme]
            with_setup = " (with set-up)" if flower else ""
            table.add_row(
                f"{n:,}", label, fmt_s(r["server_s"][STAGES[0]]), fmt_s(r["setup_client_s"]),
                *(fmt_s(r["server_s"][s]) for s in AGGREGATION), fmt_s(server) + with_setup,
                f"{server / msa['server_s']:.3g}", fmt_s(r["client_s"]) + with_setup,
                f"{r['client_s'] / msa['client_s']:.3g}", fmt_s(r["wall_s"]),
            )
            records.append(record(
                "secagg_time", n_clients=n, scheme=scheme,
                **{f"{STAGE_KEYS[s]}_server_s": r["server_s"][s] for s in STAGES}, server_s=server,
                server_ratio_to_msa=server / msa["server_s"], setup_client_s_per_client=r["setup_client_s"],
                client_s_per_client=r["client_s"], client_ratio_to_msa=r["client_s"] / msa["client_s"],
                wall_s=r["wall_s"],
            ))
    console.print(table)
    console.print(
        "set-up client/client: advertise-keys (the key, and agreeing the run's keys with every neighbour) over n; "
        "client/client per aggregation: round 1's masked-input and unmask, every client's engine calls and the "
        "encoding of its frames, over n (dropouts: silent clients count as 0). wall: the whole 2-round simulation "
        "(set-up, rounds 0 and 1, every client and the server one after another). Flower: its whole round, its "
        "set-up included. Timings share 2 cores with other work: treat them as indicative.",
        highlight=False,
    )

    # -- growth ------------------------------------------------------------------------------------
    table = Table(title="Growth with n of bytes per client per aggregation after the set-up (SecAgg+: k = O(log n); "
                        "complete graph: k = n - 1)",
                  title_justify="left")
    for col in ("scheme", "n", "k", "bytes/client", "x previous n", "+ bytes per step", "n x", "log n x"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    growth_lines = []
    for scheme in ("secagg_plus", "secagg_complete", "msa"):
        previous = None
        for n in plan:
            r = results[n, scheme]
            measured = not r.get("analytic_only")
            if scheme == "msa":
                total = analytic = r["sent"] + r["received"]
                k = None
            else:
                analytic = r["analytic_total"]
                total = r["total"] if measured else analytic
                k = configs[n, scheme].degree
            row = [SCHEME_LABELS[scheme], f"{n:,}", "—" if k is None else str(k),
                   fmt_bytes(total) + ("" if measured else " (analytic)")]
            if previous is None:
                row += ["—", "—", "—", "—"]
                growth = increment = n_growth = log_growth = None
            else:
                # Like with like: measured against measured, else analytic against analytic.
                pn, ptotal, panalytic, pmeasured = previous
                a, b = (ptotal, total) if measured and pmeasured else (panalytic, analytic)
                growth, increment = b / a, b - a
                n_growth, log_growth = n / pn, math.log(n) / math.log(pn)
                mark = "" if measured and pmeasured else " (analytic)"
                row += [f"{growth:.3g}{mark}", f"{increment:+,.0f}", f"{n_growth:.3g}", f"{log_growth:.3g}"]
                if scheme != "msa":
                    growth_lines.append(f"{SCHEME_LABELS[scheme]} {pn:,} -> {n:,}: x{growth:.3g}{mark} "
                                        f"(n x{n_growth:.3g}, log n x{log_growth:.3g})")
            table.add_row(*row)
            records.append(record(
                "secagg_growth", scheme=scheme, n_clients=n, degree=k, total_bytes=total, measured=measured,
                growth=growth, increment_bytes=increment, n_growth=n_growth, log_n_growth=log_growth,
            ))
            previous = (n, total, analytic, measured)
    console.print(table)
    if growth_lines:
        console.print("bytes per client: " + "; ".join(growth_lines), highlight=False)

    # -- Flower detail -------------------------------------------------------------------------------
    if flower_raw:
        table = Table(title="Flower SecAgg+ per Flower stage (bytes per client: protobuf Message, and the deflated "
                            "object tree Flower 1.2x+ pushes)", title_justify="left")
        for col in ("n", "stage", "sent", "received", "sent (objects)", "received (objects)", "client s/client",
                    "server s"):
            table.add_column(col, justify="left" if col == "stage" else "right")
        for n, raw in flower_raw.items():
            for stage in FLOWER_STAGES:
                st = raw["stages"][stage]
                table.add_row(f"{n:,}", stage, fmt_bytes(st["sent_bytes"]), fmt_bytes(st["received_bytes"]),
                              fmt_bytes(st["sent_object_bytes"]), fmt_bytes(st["received_object_bytes"]),
                              fmt_s(st["client_s"]), fmt_s(st["server_s"]))
                records.append(record(
                    "secagg_flower", n_clients=n, stage=stage, sent_bytes=st["sent_bytes"],
                    received_bytes=st["received_bytes"], sent_object_bytes=st["sent_object_bytes"],
                    received_object_bytes=st["received_object_bytes"], client_s_per_client=st["client_s"],
                    server_s=st["server_s"],
                ))
        console.print(table)
        for n, raw in flower_raw.items():
            console.print(
                f"Flower {raw['flwr_version']} at n = {n:,}: one neighbour's encrypted shares {raw['ciphertext_bytes']} "
                f"bytes (ours {CIPHERTEXT_BYTES}); shares {raw['share_bytes']} bytes (ours "
                f"{shamir.SHARE_BYTES}); public key {raw['public_key_bytes']} bytes (ours "
                f"{KEY_BYTES}); whole run {fmt_s(raw['total_s'])}; largest error of the mean "
                f"{raw['max_abs_error']:.2g} (Flower's quantisation)",
                highlight=False,
            )

    # -- profile -----------------------------------------------------------------------------------
    if args.profile:
        n = plan[len(plan) // 2]
        progress(f"n = {n:,}: SecAgg+ under cProfile ...")
        rng = np.random.default_rng([args.seed, n])
        inputs = rng.integers(0, modulus.size, size=(n, args.length), dtype=dtype)
        rows = profile_run(configs[n, "secagg_plus"], inputs)
        table = Table(title=f"cProfile of one SecAgg+ run (the set-up and two aggregations), n = {n:,} "
                            f"(own time, top {len(rows)})",
                      title_justify="left")
        for col in ("function", "calls", "own s", "cumulative s"):
            table.add_column(col, justify="left" if col == "function" else "right")
        for name, calls, tottime, cumtime in rows:
            table.add_row(name, f"{calls:,}", f"{tottime:.3f}", f"{cumtime:.3f}")
            records.append(record("secagg_profile", function=name, calls=calls, tottime_s=tottime, cumtime_s=cumtime))
        console.print(table)

    if args.plot:
        plot(args.plot, plan, results, configs, console)
    write_records(args.json, records, console)


def plot(path: str, plan: list[int], results: dict, configs: dict, console) -> None:
    """Bytes per client per aggregation after the set-up against n (log-log), and the server's
    seconds per stage of that aggregation (stacked bars, our set-up left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig = plt.figure(figsize=(12, 8.5), layout="constrained")
    grid = fig.add_gridspec(2, len(plan), height_ratios=[1.15, 1])
    top = fig.add_subplot(grid[0, :])
    styles = {"secagg_plus": "C0", "secagg_plus_dropout": "C4", "secagg_complete": "C3", "msa": "C2",
              "flower_secagg_plus": "C1"}
    for scheme in ("secagg_plus", "secagg_plus_dropout", "secagg_complete", "msa", "flower_secagg_plus"):
        points = []
        for n in plan:
            r = results.get((n, scheme))
            if r is None or r.get("analytic_only"):
                continue
            points.append((n, r["sent"] + r["received"] if scheme == "msa" else r["total"]))
        if points:
            note = " (whole round, set-up included)" if scheme == "flower_secagg_plus" else ""
            top.plot(*zip(*points), color=styles[scheme], marker="o", linestyle="-" if len(points) > 1 else "none",
                     label=f"{SCHEME_LABELS[scheme]} (measured){note}")
    for scheme in ("secagg_plus", "secagg_complete"):
        analytic = [(n, results[n, scheme]["analytic_total"]) for n in plan]
        top.plot(*zip(*analytic), color=styles[scheme], linestyle="--", marker="x",
                 label=f"{SCHEME_LABELS[scheme]} (analytic, no envelopes)")
    top.set_xscale("log")
    top.set_yscale("log")
    top.set_xticks(plan, [f"{n:,}" for n in plan])
    top.set_xlim(plan[0] / 1.4, plan[-1] * 1.6)  # room for the k labels
    top.xaxis.set_minor_formatter(NullFormatter())
    top.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y / 1e3:,.0f} kB" if y >= 1e3 else f"{y:,.0f} B"))
    top.yaxis.set_minor_formatter(NullFormatter())
    for scheme in ("secagg_plus", "secagg_complete"):
        for n in plan:
            r = results[n, scheme]
            y = r["analytic_total"] if r.get("analytic_only") else r["total"]
            top.annotate(f"k = {configs[n, scheme].degree:,}", (n, y), textcoords="offset points",
                         xytext=(6, -12 if scheme == "secagg_plus" else 6), fontsize="small", color=styles[scheme])
    top.set_xlabel("clients n")
    top.set_ylabel("bytes per client (sent + received)")
    top.set_title("Bytes per client per aggregation after the set-up (round 1: masked-input + unmask)")
    top.grid(True, which="major", alpha=0.3)
    top.legend(fontsize="small", loc="upper left")
    colors = {STAGES[0]: "C1", STAGES[1]: "C2", STAGES[2]: "C3"}
    short = {"msa": "MSA", "secagg_plus": "SecAgg+", "secagg_plus_dropout": "SecAgg+\ndropouts",
             "secagg_complete": "SecAgg\ncomplete", "flower_secagg_plus": "Flower\nSecAgg+\n(+ set-up)"}
    labelled: set[str] = set()
    for column, n in enumerate(plan):
        ax = fig.add_subplot(grid[1, column])
        labels, bottoms = [], []
        for scheme in ("msa", "secagg_plus", "secagg_plus_dropout", "secagg_complete", "flower_secagg_plus"):
            r = results.get((n, scheme))
            if r is None or r.get("analytic_only"):
                continue
            x = len(labels)
            labels.append(short[scheme])
            if scheme == "msa":
                stages = {STAGES[1]: r["server_s"]}
            elif scheme == "flower_secagg_plus":  # Flower's round redoes its set-up
                stages = r["server_s"]
            else:
                stages = {s: r["server_s"][s] for s in AGGREGATION}
            bottom = 0.0
            for stage in STAGES:
                value = stages.get(stage, 0.0)
                if value <= 0:
                    continue
                ax.bar(x, value, bottom=bottom, color=colors[stage])
                labelled.add(stage)
                bottom += value
            bottoms.append(bottom)
            ax.annotate(fmt_s(bottom), (x, bottom), textcoords="offset points", xytext=(0, 2), ha="center",
                        va="bottom", fontsize="small")
        ax.set_ylim(0, max(bottoms) * 1.15)
        ax.set_xticks(range(len(labels)), labels, fontsize="small")
        ax.set_title(f"n = {n:,}")
        ax.set_ylabel("server seconds, one aggregation" if column == 0 else "")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[stage]) for stage in STAGES if stage in labelled]
    fig.legend(handles, [stage for stage in STAGES if stage in labelled], loc="outside lower center",
               ncols=len(handles), fontsize="small", title="server seconds by stage", title_fontsize="small")
    fig.suptitle("Secure aggregation after the set-up: SecAgg+ (Bell et al.) vs classic SecAgg vs FastLloyd's MSA\n"
                 "bars: the server's seconds of one aggregation by stage; our once-per-run set-up (advertise-keys) "
                 "is left out (see the tables)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    console.print(f"plot written to {path}")


if __name__ == "__main__":
    main()
