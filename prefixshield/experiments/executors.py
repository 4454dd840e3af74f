"""Executors: where tasks run. In-process, a local process pool, or Ray.

Each executor maps a pure task function over tasks and yields ``(task, result)`` as results
arrive (any order); the caller writes them. Results do not depend on the executor: a task carries
everything it needs and the simulation reads no clock, no global RNG and no environment.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator

EXECUTORS = ("process", "inprocess", "ray")


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _bounded_map(submit: Callable, wait_one: Callable, tasks: Iterable,
                 limit: int) -> Iterator[tuple[Any, Any]]:
    """Submit tasks keeping at most ``limit`` in flight (an interrupted run has not queued work
    it will throw away); ``wait_one(pending handles)`` returns ``[(handle, result)]`` of at least
    one finished task. Yields ``(task, result)`` as they finish."""
    it = iter(tasks)
    pending: dict = {}

    def fill() -> None:
        while len(pending) < limit:
            try:
                t = next(it)
            except StopIteration:
                return
            pending[submit(t)] = t

    fill()
    while pending:
        for handle, result in wait_one(pending):
            yield pending.pop(handle), result
        fill()


class InProcessExecutor:
    """Runs tasks one after another in this process (debuggable, no start-up cost)."""

    name = "inprocess"

    def map(self, fn: Callable, tasks: Iterable) -> Iterator[tuple[Any, Any]]:
        """Yield ``(task, fn(task))`` in task order."""
        for t in tasks:
            yield t, fn(t)

    def close(self) -> None:
        """Nothing to release."""


class ProcessPoolExecutorAdapter:
    """A local process pool (``forkserver``: workers fork from a clean server that has imported
    the simulator once, so no worker inherits this process's threads, and numba's on-disk cache
    makes their first task cheap)."""

    name = "process"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["prefixshield.experiments.cells"])
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)

    def map(self, fn: Callable, tasks: Iterable) -> Iterator[tuple[Any, Any]]:
        """Yield ``(task, result)`` as each finishes."""
        def wait_one(pending):
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            return [(f, f.result()) for f in finished]

        return _bounded_map(lambda t: self._pool.submit(fn, t), wait_one, tasks,
                            2 * self.workers)

    def close(self) -> None:
        """Stop the workers (cancelling queued tasks)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    """Each task an independent Ray task (``ray.init(address)``: a cluster, or a local Ray when
    no address is given). Needs the optional ``ray`` extra."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("--executor ray needs Ray: pip install 'prefixshield[ray]'") \
                from None
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            if address:
                kwargs["address"] = address
            else:
                kwargs["num_cpus"] = workers or default_workers()
            # Local workers import this package from the same interpreter and sys.path.
            ray.init(**kwargs)
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def map(self, fn: Callable, tasks: Iterable) -> Iterator[tuple[Any, Any]]:
        """Yield ``(task, result)`` as Ray returns them."""
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)

        def wait_one(pending):
            ready, _ = ray.wait(list(pending), num_returns=1)
            return [(ref, ray.get(ref)) for ref in ready]

        return _bounded_map(remote.remote, wait_one, tasks, 2 * self.workers)

    def close(self) -> None:
        """Shut down a Ray this executor started (a cluster it joined stays up)."""
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


def make_executor(name: str = "process", workers: int | None = None,
                  address: str | None = None):
    """The executor ``name`` (``process``: default, ``inprocess``, ``ray``)."""
    if name == "inprocess":
        return InProcessExecutor()
    if name == "process":
        if (workers or default_workers()) == 1:
            return InProcessExecutor()
        return ProcessPoolExecutorAdapter(workers)
    if name == "ray":
        return RayExecutor(address, workers)
    raise ValueError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
