"""Find protocol and transport plugins, importing only the ones a command needs.

Installed plugins are entry points (``fedproto.protocols``, ``fedproto.transports`` in
``pyproject.toml``); listing their names imports nothing. A protocol can also come from the
user's own code, without packaging:

* ``path/to/my_proto.py`` or ``path/to/my_proto.py:ATTR``: a Python file;
* ``package.module:ATTR`` (or ``package.module``): an importable module (the working directory is
  searched too, as ``python -m`` would).

``ATTR`` defaults to ``PROTOCOL``. A plugin that fails to import raises :class:`PluginLoadError`
with one line saying why; it does not stop other plugins from loading (``fedproto list`` shows
it as broken).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, entry_points, requires
from pathlib import Path
from typing import Any

__all__ = [
    "PROTOCOL_GROUP",
    "TRANSPORT_GROUP",
    "DEFAULT_ATTRIBUTE",
    "UnknownPluginError",
    "PluginLoadError",
    "PluginInfo",
    "protocol_names",
    "transport_names",
    "load_protocol",
    "load_transport",
    "is_protocol_path",
    "resolve_protocol_spec",
    "describe_protocols",
    "describe_transports",
    "suggest",
]

PROTOCOL_GROUP = "fedproto.protocols"
TRANSPORT_GROUP = "fedproto.transports"
#: The attribute a module spec without ``:ATTR`` names.
DEFAULT_ATTRIBUTE = "PROTOCOL"


class UnknownPluginError(ValueError):
    """No installed plugin, file or module has that name (a usage error).

    Attributes:
        name: the name asked for.
        suggestions: close installed names ("did you mean").
    """

    def __init__(self, message: str, *, name: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.name = name
        self.suggestions = suggestions


class PluginLoadError(ImportError):
    """A plugin exists but cannot be loaded (its import failed or it is not a plugin)."""


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """One line of ``fedproto list``.

    Attributes:
        name: the registered name.
        description: one line describing it ("" when it has none).
        error: why it cannot be loaded (one line), or ``None`` when it loads.
    """

    name: str
    description: str
    error: str | None = None


#: The protocols this package installs, described without importing them (``fedproto list`` and
#: ``fedproto --help`` import no protocol module): entry-point value -> (one-line description,
#: the top-level modules its import needs, looked up without being imported). A test checks
#: each description against the plugin's own ``description``. An entry point whose value is not
#: here (another package's plugin) is imported to be described.
BUILTIN_PROTOCOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "fedproto.algorithms.fastlloyd.cli:PROTOCOL": (
        "differentially private federated k-means with masked secure aggregation (FastLloyd)",
        ("jax", "cryptography"),  # FLINT only with --secagg plus/complete, imported then
    ),
    "fedproto.algorithms.kzclustering.cli:KZCENTER": (
        "distributed (k,z)-center with (1+slack)z outliers (Guo & Li, NeurIPS 2018)", ("jax", "scipy"),
    ),
    "fedproto.algorithms.kzclustering.cli:KZMEDIAN": (
        "distributed (k,z)-median with truncated-cost coresets (Guo & Li, Appendix C)", ("jax", "scipy"),
    ),
    "fedproto.algorithms.kzclustering.cli:KZMEANS": (
        "distributed (k,z)-means with truncated-cost coresets (Guo & Li, Appendix C)", ("jax", "scipy"),
    ),
    "fedproto.algorithms.deletion.cli:QKMEANS": (
        "Q-k-means (quantised Lloyd's) with exact deletion: clients request deletions of their points", ("jax",),
    ),
    "fedproto.algorithms.deletion.cli:DCKMEANS": (
        "DC-k-means as a tree of parties: a deletion recomputes only its leaf-to-root path", ("jax",),
    ),
    "fedproto.algorithms.mufc.cli:PROTOCOL": (
        "MUFC: one-shot secure federated K-means++ (SCMA) with exact federated unlearning",
        ("jax", "flint", "cryptography"),
    ),
}


def _group(name: str) -> dict[str, Any]:
    """``{name: entry point}`` of an entry-point group (a new dict each call), read once a process:
    each read scans every installed distribution's metadata (5-7 ms), and a run asks for its
    groups about six times. A plugin installed while a process runs is seen by the next one."""
    return dict(_scanned(name, entry_points))


@functools.cache
def _scanned(name: str, scan: Callable[..., Any]) -> tuple[tuple[str, Any], ...]:
    # keyed on the scanning function too, so that a test replacing ``entry_points`` is obeyed
    return tuple((ep.name, ep) for ep in scan(group=name))


#: Least similarity (:class:`difflib.SequenceMatcher` ratio) of a suggestion to the name typed.
SUGGEST_CUTOFF = 0.6
#: How far below the best suggestion's similarity another may score and still be offered.
SUGGEST_MARGIN = 0.1


def suggest(name: str, choices: list[str] | tuple[str, ...] | set[str]) -> list[str]:
    """Close matches of ``name`` among ``choices``, best first (for "did you mean").

    Names are compared without their leading dashes, which every option shares (with them,
    ``--clinets`` looked like ``--deadline`` and ``--quiet``). A choice is offered when its
    similarity is at least :data:`SUGGEST_CUTOFF` and within :data:`SUGGEST_MARGIN` of the best
    one's: the evident fix alone, or the few that are about as close (at most 3). A choice that
    the name (of 3 characters or more) begins counts as just close enough (options may not be
    abbreviated, so ``--iter`` is refused, and names ``--iterations``).

    Returns:
        Up to 3 of ``choices``, most similar first (ties in name order); empty when none is close.
    """
    typed = name.lstrip("-")
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(typed)
    scored = []
    for choice in sorted(choices):
        body = choice.lstrip("-")
        matcher.set_seq1(body)
        ratio = matcher.ratio()
        if len(typed) >= 3 and body.startswith(typed):
            ratio = max(ratio, SUGGEST_CUTOFF)
        if ratio >= SUGGEST_CUTOFF:
            scored.append((-ratio, choice))
    scored.sort()
    if not scored:
        return []
    best = -scored[0][0]
    return [choice for ratio, choice in scored[:3] if -ratio >= best - SUGGEST_MARGIN]


def _did_you_mean(suggestions: list[str]) -> str:
    if not suggestions:
        return ""
    return "; did you mean " + " or ".join(repr(s) for s in suggestions) + "?"


def protocol_names() -> list[str]:
    """Names of the installed protocol plugins (nothing is imported)."""
    return sorted(_group(PROTOCOL_GROUP))


def transport_names() -> list[str]:
    """Names of the installed transports (nothing is imported)."""
    return sorted(_group(TRANSPORT_GROUP))


def _install_hint(exc: ImportError) -> str:
    """``" (pip install 'fedproto[extra]')"`` when the missing module is an optional dependency."""
    missing = getattr(exc, "name", None)
    if not missing:
        return ""
    top = missing.split(".")[0]
    try:
        requirements = requires("fedproto") or []
    except PackageNotFoundError:
        return ""
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9._-]+).*;.*extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if match and match.group(1).lower().replace("-", "_") == top.lower().replace("-", "_"):
            if match.group(2) != "test":
                return f" (pip install 'fedproto[{match.group(2)}]')"
    return ""


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _load_entry_point(kind: str, name: str, entry: Any) -> Any:
    try:
        return entry.load()
    except ImportError as exc:
        raise PluginLoadError(f"cannot load {kind} {name!r}: {_one_line(exc)}{_install_hint(exc)}") from exc
    except Exception as exc:  # a plugin module may fail in any way while importing
        raise PluginLoadError(f"cannot load {kind} {name!r}: {_one_line(exc)}") from exc


# --- protocols -------------------------------------------------------------------------------------


def is_protocol_path(spec: str) -> bool:
    """Whether ``spec`` names a file or module rather than an installed protocol."""
    module = _split_spec(spec)[0]
    return module.endswith(".py") or "/" in module or os.sep in module or "." in module or ":" in spec


def _split_spec(spec: str) -> tuple[str, str | None]:
    """``"mod.py:ATTR"`` -> ``("mod.py", "ATTR")``; the attribute is ``None`` when absent."""
    module, sep, attribute = spec.rpartition(":")
    if not sep or not attribute.isidentifier():
        return spec, None
    return module, attribute


def resolve_protocol_spec(spec: str) -> str:
    """``spec`` as another process (another working directory) can load it: a file path made
    absolute; names and module paths unchanged."""
    module, attribute = _split_spec(spec)
    if module.endswith(".py") or "/" in module or os.sep in module:
        module = str(Path(module).expanduser().resolve())
    return module if attribute is None else f"{module}:{attribute}"


def _check_plugin(plugin: Any, where: str) -> Any:
    if not callable(getattr(plugin, "plan", None)):
        raise PluginLoadError(f"{where} is not a protocol plugin (it has no plan(args, dataset) method)")
    return plugin


def _load_file(path: Path, attribute: str, spec: str) -> Any:
    if not path.is_file():
        raise UnknownPluginError(f"no protocol file {str(path)!r}", name=spec, suggestions=[])
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    module_name = f"fedproto_user_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', resolved.stem)}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(module_name, resolved)
        if module_spec is None or module_spec.loader is None:
            raise PluginLoadError(f"cannot load protocol {spec!r}: not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        # Like `python file.py`: modules beside the file are importable from it.
        if str(resolved.parent) not in sys.path:
            sys.path.insert(0, str(resolved.parent))
        sys.modules[module_name] = module  # before executing: dataclasses look the module up
        try:
            module_spec.loader.exec_module(module)
        except BaseException as exc:
            del sys.modules[module_name]
            if isinstance(exc, Exception):
                hint = _install_hint(exc) if isinstance(exc, ImportError) else ""
                raise PluginLoadError(f"cannot load protocol {spec!r}: {_one_line(exc)}{hint}") from exc
            raise
    if not hasattr(module, attribute):
        raise PluginLoadError(f"{resolved} has no attribute {attribute!r} (name the plugin with FILE:ATTRIBUTE)")
    return _check_plugin(getattr(module, attribute), f"{spec} ({attribute})")


def _load_module(module_name: str, attribute: str, spec: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # after everything installed, so it shadows nothing
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name) and (
            exc.name == module_name or module_name.startswith(exc.name + ".")
        ):
            raise UnknownPluginError(
                f"unknown protocol {spec!r}: no installed protocol, file or module of that name",
                name=spec,
                suggestions=suggest(module_name, protocol_names()),
            ) from None
        raise PluginLoadError(f"cannot load protocol {spec!r}: {_one_line(exc)}{_install_hint(exc)}") from exc
    except Exception as exc:
        raise PluginLoadError(f"cannot load protocol {spec!r}: {_one_line(exc)}") from exc
    if not hasattr(module, attribute):
        raise PluginLoadError(f"module {module_name} has no attribute {attribute!r}")
    return _check_plugin(getattr(module, attribute), f"{module_name}:{attribute}")


def load_protocol(spec: str) -> Any:
    """The protocol plugin ``spec`` names: an installed name, a file or a module (see above).

    Only that plugin is imported.

    Raises:
        UnknownPluginError: nothing has that name (with close installed names).
        PluginLoadError: it exists but its import fails or it is not a plugin.
    """
    group = _group(PROTOCOL_GROUP)
    if spec in group:
        return _check_plugin(_load_entry_point("protocol", spec, group[spec]), f"protocol {spec!r}")
    if not is_protocol_path(spec):
        suggestions = suggest(spec, list(group))
        installed = ", ".join(sorted(group)) or "none"
        raise UnknownPluginError(
            f"unknown protocol {spec!r}{_did_you_mean(suggestions)} (installed: {installed}; "
            f"or give a file path.py[:ATTR] or a module:ATTR)",
            name=spec,
            suggestions=suggestions,
        )
    module, attribute = _split_spec(spec)
    attribute = attribute or DEFAULT_ATTRIBUTE
    if module.endswith(".py") or "/" in module or os.sep in module:
        return _load_file(Path(module).expanduser(), attribute, spec)
    return _load_module(module, attribute, spec)


def describe_protocols() -> list[PluginInfo]:
    """One :class:`PluginInfo` per installed protocol; a broken one is reported, not raised.

    This package's own protocols are described from :data:`BUILTIN_PROTOCOLS` without being
    imported (broken when a module they need cannot be found); any other is imported."""
    return _describe(
        PROTOCOL_GROUP, "protocol", lambda name, obj: _check_plugin(obj, f"protocol {name!r}"), BUILTIN_PROTOCOLS
    )


def _builtin_info(name: str, entry: Any, table: dict[str, tuple[str, tuple[str, ...]]]) -> PluginInfo | None:
    """The :class:`PluginInfo` of a plugin ``table`` describes (``None`` for any other): its
    description, or why it is broken when a module it imports cannot be found."""
    known = table.get(getattr(entry, "value", None))  # type: ignore[arg-type]
    if known is None:
        return None
    description, modules = known
    for module in modules:
        if importlib.util.find_spec(module) is None:
            exc = ModuleNotFoundError(f"No module named {module!r}", name=module)
            return PluginInfo(name, "", f"{_one_line(exc)}{_install_hint(exc)}")
    return PluginInfo(name, description)


# --- transports ------------------------------------------------------------------------------------


def load_transport(name: str) -> Any:
    """The network class registered as ``name``.

    Raises:
        UnknownPluginError: no such transport is installed (with close names).
        PluginLoadError: its import fails, e.g. a missing optional dependency (the message says
            which ``pip install 'fedproto[...]'`` brings it).
    """
    group = _group(TRANSPORT_GROUP)
    if name not in group:
        suggestions = suggest(name, list(group))
        raise UnknownPluginError(
            f"unknown transport {name!r}{_did_you_mean(suggestions)} (installed: {', '.join(sorted(group)) or 'none'})",
            name=name,
            suggestions=suggestions,
        )
    return _load_entry_point("transport", name, group[name])


def describe_transports() -> list[PluginInfo]:
    """One :class:`PluginInfo` per installed transport (a broken one is reported, not raised)."""
    return _describe(TRANSPORT_GROUP, "transport", lambda name, obj: obj)


def _describe(
    group: str,
    kind: str,
    check: Callable[[str, Any], Any],
    table: dict[str, tuple[str, tuple[str, ...]]] | None = None,
) -> list[PluginInfo]:
    """Load every entry point of ``group`` that ``table`` does not describe (``check`` validates
    what it loads); a plugin that fails is described by its error, never raised."""
    out = []
    for name, entry in sorted(_group(group).items()):
        known = _builtin_info(name, entry, table) if table else None
        if known is not None:
            out.append(known)
            continue
        try:
            obj = check(name, _load_entry_point(kind, name, entry))
        except PluginLoadError as exc:
            out.append(PluginInfo(name, "", str(exc).removeprefix(f"cannot load {kind} {name!r}: ")))
            continue
        out.append(PluginInfo(name, _description(obj)))
    return out


def _description(obj: Any) -> str:
    """``obj.description``, else the first line of its docstring (its class's for instances)."""
    text = getattr(obj, "description", None)
    if not isinstance(text, str) or not text.strip():
        doc = getattr(obj, "__doc__", None) or getattr(type(obj), "__doc__", None) or ""
        text = doc.strip().splitlines()[0] if doc.strip() else ""
    return " ".join(text.split())
