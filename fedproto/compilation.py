"""JAX set-up for a run: the device, the persistent compile cache, and the time spent compiling.

A protocol's local numerics are `jax.jit` kernels. The first call of a kernel for a new shape
traces, lowers and compiles it (0.1 to 1 s each on CPU), and a fresh process starts with nothing
compiled, so without help every ``fedproto run`` pays those seconds again inside its first round.
Three tools:

* :func:`enable_compile_cache` turns on JAX's persistent compilation cache in a directory
  (default :func:`default_cache_dir`: ``$XDG_CACHE_HOME/fedproto/jax``, or
  ``~/.cache/fedproto/jax``), so a later process loads compiled kernels instead of compiling
  them. Tracing and lowering still run; the backend compilation, the larger part, is skipped.
  The command line turns it on for every run unless ``--no-compile-cache`` is given.
* :func:`select_device` pins the run's kernels to the CPU or to a GPU (``--device``), and
  :func:`device_description` names the device they ran on (``RunReport.device``), once
  :func:`kernels_compiled` says that this process ran any: a protocol that never calls JAX
  reports no device, even though the command line imported JAX.
* :func:`compile_seconds` is the time this process has spent tracing, lowering and compiling
  kernels so far (JAX's own ``/jax/core/compile/*`` duration events), so a run can report its
  compile time apart from its protocol time (``RunReport.compile_s``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from pathlib import Path

__all__ = [
    "cache_root",
    "COMPILE_EVENTS",
    "DEVICES",
    "compile_seconds",
    "default_cache_dir",
    "device_description",
    "enable_compile_cache",
    "kernels_compiled",
    "select_device",
]

DEVICES = ("auto", "cpu", "gpu")
"""What ``--device`` accepts: JAX's own choice (a GPU when one is visible), or a kind."""

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
"""JAX's duration events whose sum is the compile time (tracing, lowering to MLIR, and backend
compilation or loading from the persistent cache)."""

_lock = threading.Lock()
_total = 0.0
_events = 0
_listening = False


def _listener(event: str, duration_secs: float, **_: object) -> None:
    global _total, _events
    if event in COMPILE_EVENTS:
        with _lock:
            _total += float(duration_secs)
            _events += 1


class _ListenOnceJaxIsImported(importlib.abc.MetaPathFinder):
    """Registers the compile-time listener right after ``import jax`` runs, wherever it runs (a
    protocol that imports JAX only inside its run still has its kernels counted from the first)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != "jax":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once; the search below must not find us again
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_listen(module: types.ModuleType) -> None:
            exec_module(module)
            _listen()

        loader.exec_module = exec_and_listen  # type: ignore[method-assign]
        return spec


def _listen_once_jax_is_imported() -> None:
    if "jax" in sys.modules:
        _listen()
    elif not any(isinstance(finder, _ListenOnceJaxIsImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ListenOnceJaxIsImported())


def _listen() -> None:
    """Register the listener once JAX is imported (importing it here would slow down runs of
    protocols that never use it)."""
    global _listening
    if "jax" not in sys.modules:
        return
    with _lock:
        if _listening:
            return
        _listening = True
    sys.modules["jax"].monitoring.register_event_duration_secs_listener(_listener)


def compile_seconds() -> float:
    """Seconds this process has spent compiling JAX kernels since it started counting.

    Counting starts at the first call made after JAX was imported (that call returns the total
    so far, 0.0); take the difference of two calls around a run. Kernels compiled in any thread
    count. Without JAX imported, nothing can have been compiled: 0.0, and JAX is not imported.

    Returns:
        Seconds (float, ``>= 0``), monotonically non-decreasing.
    """
    _listen()
    with _lock:
        return _total


def kernels_compiled() -> bool:
    """Whether this process has compiled a JAX kernel since fedproto began counting.

    Every JAX computation, a ``jax.jit`` kernel or an eager ``jax.numpy`` operation, is traced
    and compiled in the process that first runs it (a persistent cache skips only the backend
    compilation), so a process that ran none has compiled none. Counting begins when JAX is
    first seen imported by :func:`select_device`, :func:`enable_compile_cache` or
    :func:`compile_seconds`; the command line calls the first two before it builds a run. The
    answer is for the process: once a run in it has used JAX, later runs in it say so too.

    Returns:
        ``True`` once a compile event was seen; ``False`` without JAX imported (JAX is not
        imported).
    """
    _listen()
    with _lock:
        return _events > 0


def cache_root() -> Path:
    """fedproto's cache directory: ``$XDG_CACHE_HOME/fedproto``, or ``~/.cache/fedproto`` without
    that variable (compiled kernels in ``jax/``, fetched data sets in ``data/``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedproto"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedproto/jax``, or ``~/.cache/fedproto/jax`` without that variable."""
    return cache_root() / "jax"


def enable_compile_cache(path: str | os.PathLike[str] | None = None) -> Path:
    """Turn on JAX's persistent compilation cache in ``path`` for this process.

    Every kernel is cached, however quick its compilation (JAX's default keeps only those over
    one second, which would leave out nearly all of fedproto's). Idempotent. JAX is not imported
    here: if it is not yet, the settings go into the environment variables JAX reads when it is
    (``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``,
    ``JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES``), and compile time is counted from its import,
    so a protocol that never uses JAX does not pay for importing it (about 1 to 3 s a process).

    Args:
        path: the cache directory (created if missing); default :func:`default_cache_dir`.

    Returns:
        The directory in use.

    Raises:
        OSError: the directory cannot be created.
    """
    directory = Path(path) if path is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    settings = {
        "jax_compilation_cache_dir": str(directory),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    jax = sys.modules.get("jax")
    if jax is None:
        for name, value in settings.items():
            os.environ[name.upper()] = str(value)  # read by JAX's config when it is imported
        _listen_once_jax_is_imported()
        return directory
    _listen()
    for name, value in settings.items():
        jax.config.update(name, value)
    return directory


def select_device(kind: str) -> None:
    """Make JAX run this process's kernels on ``kind``: ``"cpu"``, ``"gpu"`` or ``"auto"``.

    Call it before the first kernel runs (the command line does so before building the run).
    ``"auto"`` leaves JAX's choice (a GPU when one is visible, else the CPU); ``"cpu"`` sets
    ``jax_platforms`` to ``cpu`` and makes the CPU the default device; ``"gpu"`` requires a GPU
    that JAX sees and makes it the default device. ``"auto"`` and ``"gpu"`` first ask for
    deterministic GPU kernels (:func:`deterministic_gpu_ops`).

    Raises:
        ValueError: ``kind`` is not one of :data:`DEVICES`, ``"gpu"`` with no GPU visible to
            JAX (the message says which platforms it found), or ``"cpu"`` where JAX started
            without its CPU backend (``JAX_PLATFORMS=cuda``).
    """
    if kind not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {kind!r}")
    _listen()  # a protocol's module imported JAX: count its kernels from before the run is built
    if kind != "cpu":
        deterministic_gpu_ops()
    if kind == "auto":
        return
    import jax

    if kind == "cpu":
        jax.config.update("jax_platforms", "cpu")  # before the first kernel: JAX starts only its CPU
        try:
            cpus = jax.devices("cpu")
        except RuntimeError as exc:  # JAX_PLATFORMS names no CPU (e.g. "cuda") and JAX started
            raise ValueError(f"--device cpu: JAX offers no CPU device in this process ({exc})") from exc
        jax.config.update("jax_default_device", cpus[0])  # after it too (a GPU already started)
        return
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        found = sorted({d.platform for d in jax.devices()})
        raise ValueError(f"--device gpu: JAX sees no GPU (platforms found: {', '.join(found)}); "
                         "install jax with CUDA support or use --device cpu")
    jax.config.update("jax_default_device", gpus[0])


#: The XLA option that makes a GPU's reductions and scatters add in one fixed order.
_DETERMINISTIC = "--xla_gpu_deterministic_ops=true"


def deterministic_gpu_ops() -> bool:
    """Ask XLA for deterministic GPU kernels (``XLA_FLAGS``), unless the user's flags say otherwise.

    A GPU's segment sums and scatters add with atomics, in an order that changes from run to run,
    so two computations of the same sum can differ in the last bit. fedproto's exactness claims
    (DC-k-means deletion equals retraining; MUFC's model after a removal equals retraining) compare
    such sums. Measured on an H100 (JAX 0.11.2): six DC-k-means exactness tests differ by one unit
    in the last place without this option and pass with it. It costs some GPU speed and nothing on
    a CPU (the CPU backend ignores it). It takes effect only before JAX starts its GPU backend:
    :func:`select_device` calls it first thing, and the command line calls that before any kernel.

    Returns:
        ``True`` if the option is now in ``XLA_FLAGS``, ``False`` if the user's ``XLA_FLAGS``
        already choose ``xla_gpu_deterministic_ops`` (left as they are).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" in flags:
        return _DETERMINISTIC in flags.split()
    os.environ["XLA_FLAGS"] = f"{flags} {_DETERMINISTIC}".strip()
    return True


def device_description() -> str:
    """The device JAX runs kernels on by default, as ``"<platform>: <kind>"`` (``"cpu: cpu"``,
    ``"gpu: NVIDIA H100 80GB HBM3"``), or ``""`` when JAX was never imported (no kernel ran).

    A report names it only where :func:`kernels_compiled` (see :meth:`fedproto.Meter.report`).
    """
    if "jax" not in sys.modules:
        return ""
    jax = sys.modules["jax"]
    default = jax.config.jax_default_device
    device = default if default is not None and not isinstance(default, str) else jax.devices()[0]
    return f"{device.platform}: {device.device_kind}"
