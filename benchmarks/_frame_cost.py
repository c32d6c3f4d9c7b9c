"""The per-frame cost of a deployment, measured on the link-model check's own path.

For the link-model check (issue 31, part 3), not part of fedproto. The link model charges every
frame ``per_frame_s`` of CPU at its sender and at its receiver (``docs/transports.md``, "The link
model"). In the check's measured federation a frame leaves one party process, crosses a veth
into the hub's namespace, passes through the user-space delaying relay (:mod:`_delay_relay`:
two threads and two sockets per direction) and wakes the receiving process: the relay's CPU and
the wake-ups of both processes run on the same cores as the parties.

:func:`deployment_per_frame_s` measures that path with a different protocol than the check's, so
that nothing is fitted to the check: two party processes in two namespaces (the star of
:func:`fedproto.testing.netns.star_namespaces`), TLS kits from ``fedproto provision``, the
client's link through the relay at latency 0, and a ping and a pong machine
(``benchmarks/_common.py``: 24 B payloads, ``fedproto.runtime.run_party`` over
``TcpNetwork.from_roster``) exchanging ``round_trips`` round trips after a few untimed ones. One
round trip is two frames, each charged at its sender and its receiver in the model, so the
per-frame cost is the round trip over 4: the same division as the loopback figure of
``tcp_rate.py``, which leaves out the relay and the processes' wake-ups.

Run as a party (the harness does this inside a namespace)::

    python benchmarks/_frame_cost.py --roster KIT/roster.json --party ping --peer pong --rounds 2000

It prints ``elapsed SECONDS`` (the timed round trips) and exits 0.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _netns_star import HUB_INNER, SUBNET, provision_kits, start_relay

#: Untimed round trips first (the handshake, the first frames, the codec's first calls).
WARM_ROUND_TRIPS = 50
#: The two parties: the hub (listening behind the relay) answers, the client asks.
PONG, PING = "pong", "ping"


def deployment_per_frame_s(round_trips: int = 2_000, repeats: int = 3, timeout_s: float = 300) -> float:
    """The per-frame cost of the check's deployment path on this machine (seconds; the median of
    ``repeats`` runs of ``round_trips`` timed round trips, over 4; see the module docstring). The
    median, not the best run: the check compares medians of runs made in the same conditions.

    Raises:
        NetnsUnavailable: namespaces cannot be made here.
        RuntimeError: a party or the relay failed (its error output is in the message).
    """
    from fedproto.testing.netns import star_namespaces

    with tempfile.TemporaryDirectory(prefix="fedproto-framecost-") as tmp:
        work = Path(tmp)
        kits = work / "kits"
        provision_kits([PONG, PING], kits, work)
        elapsed: list[float] = []
        with star_namespaces([PONG, PING], subnet=SUBNET, prefix="fc") as hosts:
            inner = f"{HUB_INNER[0]}:{HUB_INNER[1]}"
            relay = start_relay(hosts, PONG, 0.0, work)
            for _ in range(max(1, repeats)):
                pong = hosts.start(PONG, _party_argv(kits, PONG, PING, round_trips, listen=inner), work)
                ping = hosts.start(PING, _party_argv(kits, PING, PONG, round_trips), work)
                out, err = ping.communicate(timeout=timeout_s)
                _, pong_err = pong.communicate(timeout=timeout_s)
                if ping.returncode != 0 or pong.returncode != 0:
                    raise RuntimeError(f"the ping-pong parties failed: ping {(err or '')[-1000:]}; "
                                       f"pong {(pong_err or '')[-1000:]}")
                line = next((x for x in out.splitlines() if x.startswith("elapsed ")), None)
                if line is None:
                    raise RuntimeError(f"the ping party printed no time: {out[-1000:]}")
                elapsed.append(float(line.split()[1]))
            relay.terminate()
            relay.communicate(timeout=30)
    return statistics.median(elapsed) / round_trips / 4


def _party_argv(kits: Path, party: str, peer: str, rounds: int, *, listen: str | None = None) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--roster", str(kits / party / "roster.json"),
            "--party", party, "--peer", peer, "--rounds", str(rounds), *(["--listen", listen] if listen else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one party of the per-frame cost's ping-pong")
    parser.add_argument("--roster", required=True)
    parser.add_argument("--party", required=True, choices=(PING, PONG))
    parser.add_argument("--peer", required=True)
    parser.add_argument("--rounds", required=True, type=int)
    parser.add_argument("--listen", default=None, metavar="HOST:PORT", help="listen here (the hub, behind the relay)")
    args = parser.parse_args(argv)

    import trio
    from _common import PAYLOAD_SHAPES, PingMachine, PongMachine, payload_array

    from fedproto.roster import Roster
    from fedproto.runtime import RuntimeConfig, run_party
    from fedproto.transports.tcp import TcpNetwork

    roster = Roster.load(args.roster)
    listen_fds = None
    if args.listen is not None:
        host, _, port = args.listen.rpartition(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(16)
        listen_fds = {args.party: listener.fileno()}
    network = TcpNetwork.from_roster(roster, listen_fds=listen_fds, session=roster.session or 1)
    array = payload_array(PAYLOAD_SHAPES["24 B"], seed=0)
    config = RuntimeConfig(session=roster.session or 1, deadline_s=60)

    def machine(rounds: int):
        if args.party == PING:
            return PingMachine(PING, peer=args.peer, payload=array, rounds=rounds)
        return PongMachine(PONG, peer=args.peer, rounds=rounds)

    async def body() -> float:
        async with network.endpoints(list(roster.parties), [args.party]) as endpoints:
            await run_party(machine(WARM_ROUND_TRIPS), endpoints[args.party], config=config)
            began = time.perf_counter()
            await run_party(machine(args.rounds), endpoints[args.party], config=config)
            return time.perf_counter() - began

    elapsed = trio.run(body)
    print(f"elapsed {elapsed!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
