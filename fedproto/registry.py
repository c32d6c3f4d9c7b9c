"""Find protocol and transport plugins through entry points (``fedproto.protocols``,
``fedproto.transports`` in ``pyproject.toml``), so new ones plug in without touching the core."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

__all__ = ["protocol_names", "load_protocol", "transport_names", "load_transport"]


def _group(name: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=name)}


def protocol_names() -> list[str]:
    """Names of the installed protocol plugins."""
    return sorted(_group("fedproto.protocols"))


def load_protocol(name: str) -> Any:
    """The protocol plugin object registered as ``name``.

    Raises:
        ValueError: no such protocol is installed.
    """
    group = _group("fedproto.protocols")
    if name not in group:
        raise ValueError(f"unknown protocol {name!r}; installed: {', '.join(sorted(group)) or 'none'}")
    return group[name].load()


def transport_names() -> list[str]:
    """Names of the installed transports."""
    return sorted(_group("fedproto.transports"))


def load_transport(name: str) -> Any:
    """The transport class registered as ``name``.

    Raises:
        ValueError: no such transport is installed.
        ImportError: its dependencies (e.g. mpi4py) are missing.
    """
    group = _group("fedproto.transports")
    if name not in group:
        raise ValueError(f"unknown transport {name!r}; installed: {', '.join(sorted(group)) or 'none'}")
    return group[name].load()
