"""The ``fedproto`` commands that prepare a run rather than run one: ``split`` (the simulation's
split of a data set, one file per data-holding party), ``provision`` (a federation's CA and one
TLS kit per party), ``list`` (installed protocols and transports) and ``data`` (the papers'
registered data sets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fedproto import datasets, registry
from fedproto._cli_parser import UsageError, _did_you_mean, holds_local_data
from fedproto._cli_shared import _dataset, _json_ready, _names, _one_line, _options, _resolved_options, _split_parts
from fedproto.data import BUNDLED, save_dataset
from fedproto.roster import _check_address

__all__ = ["_command_data", "_command_list", "_command_provision", "_command_split"]


def _command_split(args: argparse.Namespace) -> int:
    """``fedproto split``: the simulation's split of a data set, one file per data-holding party."""
    prog = f"fedproto split {args.protocol}"
    plugin = registry.load_protocol(args.protocol)
    if not getattr(plugin, "needs_data", True):
        raise UsageError(f"{args.protocol_name} holds no data: there is nothing to split", prog=prog)
    if not holds_local_data(plugin):
        raise UsageError(
            f"{args.protocol_name} cannot run on per-party files (its plugin has no split and plan_party)", prog=prog
        )
    out = Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {args.out}: exists and is not an empty directory", prog=prog)
    parent = out.parent if str(out.parent) else Path(".")
    if not out.exists() and not parent.is_dir():
        raise UsageError(f"--out {args.out}: the directory {parent} does not exist", prog=prog)
    if not os.access(out if out.exists() else parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {args.out}: not writable", prog=prog)
    dataset = _dataset(plugin, args)
    # The roster of the run these files are for: the one plan() describes (it cuts the data the same way).
    plan = plugin.plan(args, dataset)
    parts = _split_parts(plugin, args, dataset, plan.roster)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for party in plan.roster:
        if party not in parts:
            continue
        path = save_dataset(out / f"{party}.npz", parts[party])
        entries.append({"party": party, "file": path.name, "n_points": parts[party].n, "d": parts[party].d})
        print(f"{path}: {parts[party].n} points of {parts[party].d} features for {party}")
    manifest = {
        "protocol": args.protocol_name,
        "data_set": dataset.name,
        "parties": list(plan.roster),
        "files": entries,
        "options": _options(args),
        "resolved_options": _resolved_options(plugin, args, dataset),
        "command": ["fedproto", *args.argv],
    }
    (out / "split.json").write_text(json.dumps(_json_ready(manifest), indent=2) + "\n")
    without = [p for p in plan.roster if p not in parts]
    print(
        f"{out / 'split.json'}: the split of {dataset.name} ({dataset.n} points) over {len(entries)} parties; "
        + (
            f"{_names(without)} {'holds' if len(without) == 1 else 'hold'} no data "
            f"(start {'it' if len(without) == 1 else 'them'} without --data)"
            if without
            else "every party holds data"
        )
    )
    return 0


def _provision_addresses(args: argparse.Namespace, parties: Sequence[str]) -> dict[str, str]:
    """``{party: "host:port"}`` from ``--address`` and ``--hub``/``--base-port`` (see their help).

    In the star only the hub needs one (the others' are kept but not used); in the mesh every
    party does.

    Raises:
        UsageError: a malformed or repeated ``--address``, one for a party not in ``--parties``,
            a bad ``--hub``, ``--base-port`` without ``--hub`` or in the star, a port 0 or past
            65535, a party (the hub, in the star) left without an address.
    """
    prog = "fedproto provision"
    addresses: dict[str, str] = {}
    for spec in args.address or ():
        party, sep, address = spec.partition("=")
        if not sep or not party:
            raise UsageError(f"argument --address: expected PARTY=HOST:PORT, got {spec!r}", prog=prog)
        if party not in parties:
            raise UsageError(f"argument --address: {party!r} is not one of --parties", prog=prog)
        if party in addresses:
            raise UsageError(f"argument --address: {party} is given more than once", prog=prog)
        addresses[party] = _provision_address("--address", party, address)
    if args.base_port is not None and args.hub is None:
        raise UsageError("argument --base-port: needs --hub", prog=prog)
    if args.base_port is not None and args.topology == "star":
        raise UsageError(
            "argument --base-port: numbers the ports of the other parties, which only listen in a mesh "
            "(--topology mesh); in the star they dial out to the hub",
            prog=prog,
        )
    hub = parties[0]
    if args.hub is not None:
        if hub in addresses:
            raise UsageError(f"argument --hub: {hub} (the first party) also has an --address; give one", prog=prog)
        addresses[hub] = _provision_address("--hub", hub, args.hub)
    if args.topology == "star":
        if hub not in addresses:
            raise UsageError(
                f"no address for the hub {hub} (the first party, the only one that listens): give --hub HOST:PORT",
                prog=prog,
            )
        return {p: addresses[p] for p in parties if p in addresses}
    if args.hub is not None:
        host, _, port = addresses[hub].rpartition(":")
        next_port = args.base_port if args.base_port is not None else int(port) + 1
        for party in parties:
            if party not in addresses:
                if next_port > 65535:
                    flag = "--base-port" if args.base_port is not None else "--hub"
                    raise UsageError(f"argument {flag}: no port left for {party} (past 65535)", prog=prog)
                addresses[party] = f"{host}:{next_port}"
                next_port += 1
    missing = [p for p in parties if p not in addresses]
    if missing:
        raise UsageError(
            f"no address for {_names(missing)}: give --address {missing[0]}=HOST:PORT for each, or --hub HOST:PORT",
            prog=prog,
        )
    return {p: addresses[p] for p in parties}


def _provision_address(flag: str, party: str, address: str) -> str:
    try:
        checked = _check_address(party, address)
    except ValueError as exc:
        raise UsageError(f"argument {flag}: {exc}", prog="fedproto provision") from None
    if checked.rpartition(":")[2].lstrip("0") == "":
        raise UsageError(f"argument {flag}: the port of {party} must not be 0", prog="fedproto provision")
    return checked


def _command_provision(args: argparse.Namespace) -> int:
    from fedproto.provision import MAX_VALID_DAYS, check_output_directory, check_party_name, provision

    prog = "fedproto provision"
    try:
        check_output_directory(args.out)
    except ValueError as exc:
        raise UsageError(f"argument --out: {exc}", prog=prog) from None
    parties = [name.strip() for name in args.parties.split(",")]
    if any(not name for name in parties):
        raise UsageError(f"argument --parties: an empty name in {args.parties!r}", prog=prog)
    repeated = sorted({p for p in parties if parties.count(p) > 1})
    if repeated:
        raise UsageError(f"argument --parties: repeated: {', '.join(repeated)}", prog=prog)
    if len(parties) < 2:
        raise UsageError("argument --parties: a federation needs at least two parties", prog=prog)
    for name in parties:
        try:
            check_party_name(name)
        except ValueError as exc:
            raise UsageError(f"argument --parties: {exc}", prog=prog) from None
    if "ca" in parties:
        raise UsageError("argument --parties: 'ca' is the name of the CA's directory; choose another", prog=prog)
    if args.valid_days > MAX_VALID_DAYS:
        raise UsageError(f"argument --valid-days: at most {MAX_VALID_DAYS}, got {args.valid_days}", prog=prog)
    if args.session is not None and args.session >= 2**64:
        raise UsageError(f"argument --session: must be below 2**64, got {args.session}", prog=prog)
    addresses = _provision_addresses(args, parties)
    kits = provision(
        parties, addresses, args.out, valid_days=args.valid_days, session=args.session, topology=args.topology
    )
    out = Path(args.out)
    print(f"federation provisioned in {out} ({args.topology}; certificates valid for {args.valid_days} days)")
    print(f"  {out / 'ca' / 'ca.key'}: the CA's private key; keep it offline, on no party's host")
    width = max(len(str(kit)) for kit in kits.values()) + 1
    for party, kit in kits.items():
        if args.topology == "star" and party != parties[0]:
            role = f"dials out to the hub {parties[0]}"
        else:
            role = f"listens on {addresses[party]}"
        print(f"  {str(kit) + '/':<{width}} {party} {role}; copy this kit to its host only")
    print("start each party with: fedproto party PROTOCOL --party NAME --roster KIT/roster.json [options]")
    return 0


def _command_list() -> int:
    sections = {"protocols": registry.describe_protocols(), "transports": registry.describe_transports()}
    width = max((len(info.name) for infos in sections.values() for info in infos), default=0)
    for title, infos in sections.items():
        print(f"{title}:")
        for info in infos:
            text = info.description if info.error is None else f"(broken) {info.error}"
            print(f"  {info.name:<{width}}  {text}".rstrip())
    return 0


def _registered(name: str, prog: str) -> str:
    """``name`` if it is a registered set, else a usage error with "did you mean"."""
    if name in datasets.REGISTRY:
        return name
    if name in BUNDLED:
        raise UsageError(f"{name!r} is scikit-learn's bundled set: --data {name} needs no fetch", prog=prog)
    hint = _did_you_mean(registry.suggest(name, list(datasets.REGISTRY)))
    raise UsageError(f"unknown data set {name!r}{hint} (registered: {', '.join(datasets.REGISTRY)})", prog=prog)


def _command_data(args: argparse.Namespace) -> int:
    prog = f"fedproto data {args.data_action}"
    if args.data_action == "list":
        return _data_list()
    if args.data_action == "path":
        print(datasets.dataset_path(_registered(args.name, prog)))
        return 0
    if args.all == bool(args.names):
        raise UsageError("name the sets to fetch, or give --all (not both)", prog=prog)
    names = list(datasets.REGISTRY) if args.all else [_registered(name, prog) for name in args.names]
    failed = 0
    for name in dict.fromkeys(names):
        try:
            result = datasets.fetch(name)
        except (datasets.DatasetError, OSError) as exc:
            print(f"fedproto: error: {_one_line(exc)}", file=sys.stderr)
            failed += 1
            continue
        said = {"mirror": "verified in the mirror", "cache": "already in the cache", "downloaded": "downloaded to"}
        print(f"{name}: {said[result.where]} {result.path}")
    return 1 if failed else 0


def _data_list() -> int:
    rows = [("name", "shape", "k", "used by", "licence", "found")]
    for name, entry in datasets.REGISTRY.items():
        try:
            found = datasets.locate(name)
        except datasets.DatasetCorrupted as exc:
            where = f"refused (sha256 differs): {exc.path}"
        else:
            if found is not None:
                where = f"{found[1]}: {found[0]}"
            elif entry.url is None:
                where = f"not fetched (mirror only: fedproto data fetch {name} says why)"
            else:
                where = "not fetched"
        rows.append((name, f"{entry.rows} x {entry.cols}", str(entry.k), entry.used_by, entry.licence, where))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0
