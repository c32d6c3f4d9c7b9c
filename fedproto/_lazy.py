"""Public names that load on first use (PEP 562), for packages whose imports should stay light.

A package lists, for each such name, the module that defines it, and gets the module-level
``__getattr__`` and ``__dir__`` that load it there on first access::

    _LAZY = {"launch_local": "fedproto.launcher", "SumServer": ".protocol"}
    __getattr__, __dir__ = lazy_exports(globals(), _LAZY)

``from package import name`` and ``package.name`` work as for an eager import; the name is then
kept in the package's namespace, so the lookup happens once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose ``names`` load on first use.

    Args:
        namespace: the package's ``globals()``.
        names: ``{public name: module defining it}``; a module name starting with ``"."`` is
            relative to the package (``namespace["__name__"]``).

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level. ``__getattr__`` raises
        :class:`AttributeError` for a name that is neither defined nor listed.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:  # noqa: N807 (PEP 562's name)
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*namespace, *names, *namespace.get("__all__", ())})

    return __getattr__, __dir__
