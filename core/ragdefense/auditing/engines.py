"""Where the audit's steps run. Both engines run the same step objects on the same parts and
write the same files; only the placement differs.

* :class:`LocalEngine`: in this process, one part after another (nothing to start).
* :class:`RayEngine`: Ray Data's ``map_batches`` over the pending parts, one part per batch, a
  pool of ``workers`` actors each loading its models and index shard once; ``ray.init()`` on this
  machine, or an existing cluster through ``address`` / ``RAY_ADDRESS``. On a cluster of several
  machines the working folder must be on storage every machine can read and write.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["Engine", "LocalEngine", "RayEngine", "make_engine"]

logger = logging.getLogger("ragdefense")

Step = Callable[[int], int]

#: the errors a step raises on bad input or files (a damaged part, a missing file): on Ray they
#: reach the caller as they do in process, not inside Ray's task error
_OWN = (ValueError, TypeError, OSError, ImportError)


class Engine(Protocol):
    """Runs a step on parts."""

    workers: int

    def map(self, step: Step, parts: Sequence[int], desc: str, progress: bool) -> int:
        """Run ``step`` on every part; the total it returned (items processed)."""
        ...


class LocalEngine:
    """In this process, part after part."""

    workers = 1

    def map(self, step: Step, parts: Sequence[int], desc: str, progress: bool) -> int:
        from ..progress import progress_bar

        return sum(step(p) for p in progress_bar(list(parts), desc if progress else None))


class _RayStep:
    """A Ray Data actor around a step: built once per actor, one part per batch."""

    def __init__(self, step: Step) -> None:
        self.step = step

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        done, errors = [], []
        for p in batch["part"]:
            try:
                done.append(self.step(int(p)))
                errors.append("")
            except _OWN as exc:  # handed back as data: Ray's wrapper would lose it
                done.append(0)
                try:
                    errors.append(pickle.dumps(exc).hex())  # text: a column Ray keeps whole
                except Exception:  # an error holding what does not pickle: its words
                    errors.append(pickle.dumps(ValueError(f"{type(exc).__name__}: {exc}")).hex())
        return {"part": batch["part"], "items": np.asarray(done), "error": np.asarray(errors)}


class RayEngine:
    """Ray Data ``map_batches`` over the parts with ``workers`` actors.

    Args:
        address: A running cluster (``ray://...`` or ``auto``); default ``RAY_ADDRESS``, else a
            local Ray started here.
        workers: Actors per step (default: the CPUs Ray sees).
    """

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ImportError(
                "the Ray engine needs Ray Data: pip install 'ray[data]' (or 'ragdefense[ray]')"
            ) from None
        if ray.is_initialized():
            if address:
                warnings.warn(
                    f"Ray is already initialised here: address {address!r} unused", stacklevel=3
                )
        else:
            address = address or os.environ.get("RAY_ADDRESS")
            _reachable(address)
            os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # quiet core-worker logs
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
        cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
        self.workers = workers or max(1, int(cpus))

    def map(self, step: Step, parts: Sequence[int], desc: str, progress: bool) -> int:
        import ray

        from ..progress import progress_bar

        if not parts:
            return 0
        dataset = ray.data.from_items([{"part": int(p)} for p in parts])
        dataset.context.enable_progress_bars = False  # ours is shown; the user's context stays
        if hasattr(dataset.context, "execution_no_progress_timeout_s"):
            # one part can legitimately outlast Ray Data's no-progress limit (a shard's index
            # built and searched for every chunk yields nothing until it is done)
            dataset.context.execution_no_progress_timeout_s = -1
        results = dataset.map_batches(
            _RayStep,
            fn_constructor_args=(step,),
            batch_size=1,
            # one part at a time per actor: a part queued behind another on a busy actor waits
            # while the others idle (a step over a few shards would run one after the other)
            compute=ray.data.ActorPoolStrategy(
                size=min(self.workers, len(parts)), max_tasks_in_flight_per_actor=1
            ),
            num_cpus=1,
        )
        total = 0
        rows: Any = results.iter_rows()
        log = logging.getLogger("ray.data")  # quiet while it runs, as the user had it after
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            for row in progress_bar(rows, desc if progress else None, total=len(parts)):
                if row["error"]:  # a step's own error, raised here as in process
                    raise pickle.loads(bytes.fromhex(row["error"]))
                total += int(row["items"])
        finally:
            log.setLevel(level)
        return total


def _reachable(address: str | None, timeout: float = 10.0) -> None:
    """A cluster ``host:port`` (or ``ray://host:port``) answers a connection, else a
    ``ConnectionError`` now: ``ray.init`` waits on an unreachable one without end."""
    if not address or address == "auto" or address.startswith("local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # a form Ray reads its own way
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def check_engine(engine: Any, workers: Any, address: Any = None) -> None:
    """The engine's arguments, checked before any work (Ray would refuse them only once the
    working folder is written, and from deep inside Ray Data); ``address`` and ``workers``
    are Ray's (given with another engine they would be dropped without a word)."""
    if isinstance(engine, str) and engine not in ("local", "ray"):
        raise ValueError(f"unknown engine {engine!r}: use 'local' or 'ray'")
    if not isinstance(engine, str) and not callable(getattr(engine, "map", None)):
        raise TypeError(f"engine must be 'local', 'ray' or an object with map(), got {engine!r}")
    if engine != "ray" and (address is not None or workers is not None):
        raise ValueError("address and workers are for engine='ray'")
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ValueError(
            f"workers must be a whole number >= 1 (None: the CPUs Ray sees), got {workers!r}"
        )


def make_engine(engine: str | Engine, address: str | None, workers: int | None) -> Engine:
    """``"local"``, ``"ray"`` or an engine object (checked by :func:`check_engine`)."""
    check_engine(engine, workers, address)
    if not isinstance(engine, str):
        return engine
    return LocalEngine() if engine == "local" else RayEngine(address, workers)
