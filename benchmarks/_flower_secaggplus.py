"""Flower's SecAgg+ workflow driven in one process, for ``benchmarks/secagg.py`` (not a benchmark itself).

Run with a Python that has ``flwr`` installed (never the project's environment: Flower is not a
dependency), e.g. ``/tmp/flwr-venv/bin/python benchmarks/_flower_secaggplus.py --clients 100``.
It prints one JSON object on stdout; ``secagg.py --flower-python PATH`` starts it and prints its
table beside ours.

How it is driven: Flower's own server workflow (``flwr.server.workflow.SecAggPlusWorkflow``) runs
over a :class:`LoopbackGrid`, a ``flwr.serverapp.grid.Grid`` that hands each instruction message to
the addressed client's own ``flwr.client.mod.secaggplus_mod`` (with a ``Context`` per client, as a
SuperNode keeps one) and returns the replies, with no SuperLink, SuperNode, gRPC or Ray. Every
message crosses the "wire" as Flower serialises it: ``flwr.common.serde.message_to_proto``, the
``flwr.proto.message_pb2.Message`` bytes, decoded again on the far side
(``message_from_proto``), so the client and the server only ever see what travelled. We also
count the deflated object tree (``Message``, ``RecordDict``, ``ConfigRecord``, ``ArrayRecord``,
``Array`` objects, each ``obj.deflate()``), which is what Flower 1.2x+ pushes between SuperLink
and SuperNode; neither count includes gRPC/HTTP2 framing or the object IDs (64 hex characters
per object) sent beside them.

The client's training step returns the benchmark's vector as one ``float32 [L]`` array with
``num_examples = 1`` (Flower quantises floats into ``[0, quantization_range)``, prepends the weight
as a one-element array, and masks in ``int64`` arrays mod ``modulus_range``).

Output: ``{"flwr_version", "n_clients", "vector_length", "num_shares", "threshold",
"public_key_bytes", "ciphertext_bytes", "share_bytes" (the distinct sizes seen),
"stages": {stage: {"sent_bytes", "received_bytes", "sent_object_bytes",
"received_object_bytes", "client_s", "server_s"}}, "total_s", "max_abs_error"}``, bytes as means
over clients, ``client_s`` the mean client seconds, ``server_s`` the server's seconds in the stage
(the stage's wall time less the clients' work and the serialisation).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid

import numpy as np

import flwr
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import FitRes, Status, Code, ndarrays_to_parameters, serde
from flwr.common.logger import FLOWER_LOGGER
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.common.secure_aggregation.secaggplus_constants import Key as SaKey
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp.grid import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.task_identity import TaskIdentity

SUPERLINK_NODE_ID = 1  # flwr.common.constant.SUPERLINK_NODE_ID: the server's node ID in message metadata

STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")


def _wire(message: Message) -> tuple[Message, int, int]:
    """Serialise ``message`` as Flower does; return the decoded copy, proto bytes, object bytes."""
    raw = serde.message_to_proto(message).SerializeToString()
    objects = sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())
    return serde.message_from_proto(type(serde.message_to_proto(message)).FromString(raw)), len(raw), objects


class LoopbackGrid(Grid):
    """A Grid that delivers every instruction to the client's ``secaggplus_mod`` in this process."""

    def __init__(self, vectors: dict[int, np.ndarray]) -> None:
        self.vectors = vectors
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={}) for nid in vectors
        }
        self.stage = STAGES[0]
        self.sent = {s: dict.fromkeys(vectors, 0) for s in STAGES}
        self.received = {s: dict.fromkeys(vectors, 0) for s in STAGES}
        self.sent_objects = {s: dict.fromkeys(vectors, 0) for s in STAGES}
        self.received_objects = {s: dict.fromkeys(vectors, 0) for s in STAGES}
        self.client_s = dict.fromkeys(STAGES, 0.0)
        self.grid_s = dict.fromkeys(STAGES, 0.0)
        self.sizes: dict[str, set[int]] = {"public_key": set(), "ciphertext": set(), "share": set()}

    def _note_sizes(self, reply: Message) -> None:
        """Record the sizes of the keys, ciphertexts and shares a client sent."""
        configs = reply.content.config_records[RECORD_KEY_CONFIGS]
        if self.stage == "setup":
            self.sizes["public_key"].add(len(configs[SaKey.PUBLIC_KEY_1]))
        elif self.stage == "share_keys":
            self.sizes["ciphertext"].update(len(c) for c in configs[SaKey.CIPHERTEXT_LIST])
        elif self.stage == "unmask":
            self.sizes["share"].update(len(c) for c in configs[SaKey.SHARE_LIST])

    def set_run(self, run):  # noqa: D102 - the Grid interface
        self._run = run

    @property
    def run(self):  # noqa: D102
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: D102
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self):  # noqa: D102
        return list(self.vectors)

    def push_messages(self, messages):  # noqa: D102
        raise NotImplementedError("the loopback grid only answers send_and_receive")

    def pull_messages(self, message_ids):  # noqa: D102
        raise NotImplementedError("the loopback grid only answers send_and_receive")

    def _train(self, msg: Message, ctxt: Context) -> Message:
        """The client's training step: its vector as the 'updated parameters'."""
        fitres = FitRes(
            status=Status(code=Code.OK, message=""),
            parameters=ndarrays_to_parameters([self.vectors[msg.metadata.dst_node_id]]),
            num_examples=1,
            metrics={},
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        start = time.perf_counter()
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            nid = msg.metadata.dst_node_id
            delivered, nbytes, obytes = _wire(msg)
            self.received[self.stage][nid] += nbytes
            self.received_objects[self.stage][nid] += obytes
            t0 = time.perf_counter()
            reply = secaggplus_mod(delivered, self.contexts[nid], self._train)
            self.client_s[self.stage] += time.perf_counter() - t0
            self._note_sizes(reply)
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            back, nbytes, obytes = _wire(reply)
            self.sent[self.stage][nid] += nbytes
            self.sent_objects[self.stage][nid] += obytes
            replies.append(back)
        self.grid_s[self.stage] += time.perf_counter() - start
        return replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--num-shares", type=int, required=True, help="neighbours per client + 1 (Flower counts itself)")
    parser.add_argument("--threshold", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    FLOWER_LOGGER.setLevel(logging.ERROR)
    # What a ServerApp process is told by the SuperLink: its run, its node and its task.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1

    rng = np.random.default_rng(args.seed)
    node_ids = [int(x) for x in rng.choice(2**40, size=args.clients, replace=False) + 2]
    vectors = {nid: rng.uniform(-1, 1, size=args.length).astype(np.float32) for nid in node_ids}
    grid = LoopbackGrid(vectors)
    manager = SimpleClientManager()
    for nid in node_ids:
        manager.register(GridClientProxy(node_id=nid, grid=grid, run_id=1))
    strategy = FedAvg(fraction_fit=1.0, min_fit_clients=args.clients, min_available_clients=args.clients)
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = LegacyContext(base, strategy=strategy, client_manager=manager)
    # No model travels with the fit instruction: SecAgg+ alone is measured, as in fedproto's
    # aggregation (Flower would otherwise send the global model to every client in stage 3).
    initial: list[np.ndarray] = []
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters(initial), keep_input=True
    )
    workflow = SecAggPlusWorkflow(num_shares=args.num_shares, reconstruction_threshold=args.threshold)

    stage_s = dict.fromkeys(STAGES, 0.0)
    for name, attr in zip(STAGES, ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage", "unmask_stage")):
        method = getattr(workflow, attr)

        def timed(grid_, context_, state_, method=method, name=name):
            grid.stage = name
            t0 = time.perf_counter()
            ok = method(grid_, context_, state_)
            stage_s[name] = time.perf_counter() - t0
            return ok

        setattr(workflow, attr, timed)

    t0 = time.perf_counter()
    workflow(grid, context)
    total_s = time.perf_counter() - t0
    result = compat.arrayrecord_to_parameters(context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True)
    mean = flwr.common.parameters_to_ndarrays(result)[0]
    expected = np.mean(np.stack(list(vectors.values())), axis=0)
    n = args.clients
    out = {
        "flwr_version": flwr.__version__,
        "n_clients": n,
        "vector_length": args.length,
        "num_shares": args.num_shares,
        "threshold": args.threshold,
        "total_s": total_s,
        "max_abs_error": float(np.max(np.abs(mean - expected))),
        "public_key_bytes": sorted(grid.sizes["public_key"]),
        "ciphertext_bytes": sorted(grid.sizes["ciphertext"]),
        "share_bytes": sorted(grid.sizes["share"]),
        "stages": {
            s: {
                "sent_bytes": sum(grid.sent[s].values()) / n,
                "received_bytes": sum(grid.received[s].values()) / n,
                "sent_object_bytes": sum(grid.sent_objects[s].values()) / n,
                "received_object_bytes": sum(grid.received_objects[s].values()) / n,
                "client_s": grid.client_s[s] / n,
                "server_s": stage_s[s] - grid.grid_s[s],
            }
            for s in STAGES
        },
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
