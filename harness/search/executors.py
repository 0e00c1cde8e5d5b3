"""Where a search's seeds run: worker processes on this machine, or the workers of a Ray cluster.

Both are a `concurrent.futures.Executor`, so the driver hands out seeds and gathers results the same way.
Ray (the optional extra `pdchaos[ray]`) is what clusters already run for this kind of fan-out; a seed is one
task needing one CPU. Its result (the found case, shrunk) comes back to the driver, which writes the
scenario files, so worker nodes need no shared folder. One thing does need a shared folder:
`--stop-at-first` tells the other seeds through a file, so on a multi-node cluster they go on to the budget.

    --ray local                 start a Ray instance on this machine for the search (its CPUs, or --jobs)
    --ray auto                  join the cluster this machine is part of (`ray start` was run here)
    --ray ray://HOST:10001      a remote cluster through Ray Client; the project's packages are shipped to it
                                (`runtime_env` py_modules), its nodes need the dependencies installed
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

RAY_EXTRA_HINT = "pip install 'pdchaos[ray]'"
# The packages a seed's code lives in: shipped to a remote cluster whose nodes do not have this checkout.
SHIPPED_PACKAGES = ("harness", "pdchaos", "reference_router", "fake_engines", "scenarios", "reports")


class ExecutorError(RuntimeError):
    """The executor asked for cannot be had (Ray missing, cluster unreachable)."""


class RayExecutor(Executor):
    """Each `submit(fn, *args)` is a Ray task with one CPU; its future is Ray's own concurrent.futures one."""

    def __init__(self, address: str, jobs: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorError(f"--ray needs Ray: {RAY_EXTRA_HINT}") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            try:
                ray.init(**_init_kwargs(address, jobs))
            except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
                raise ExecutorError(f"cannot start or reach Ray at {address!r}: {exc}") from None
        self._tasks: dict[Callable[..., Any], Any] = {}

    @property
    def cpus(self) -> int:
        """CPUs the cluster offers: how many seeds can run at once."""
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        task = self._tasks.get(fn)
        if task is None:
            task = self._tasks[fn] = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        return task.remote(*args, **kwargs).future()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False


def _init_kwargs(address: str, jobs: int | None) -> dict[str, Any]:
    quiet = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address == "local":
        # Its own small instance: the search's objects are a few kilobytes a seed.
        kw: dict[str, Any] = {**quiet, "_node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
        if jobs:
            kw["num_cpus"] = jobs
        return kw
    kw = {"address": address, "log_to_driver": False, "configure_logging": False}
    if address.startswith("ray://"):
        import harness

        root = os.path.dirname(os.path.dirname(os.path.abspath(harness.__file__)))
        kw["runtime_env"] = {"py_modules": [os.path.join(root, p) for p in SHIPPED_PACKAGES]}
    return kw


def parse_ray_address(text: str) -> str:
    """`local`, `auto`, `HOST:PORT` or `ray://HOST:PORT`; ValueError for anything else."""
    text = text.strip()
    if text in ("local", "auto"):
        return text
    rest = text[len("ray://"):] if text.startswith("ray://") else text
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray takes local, auto, HOST:PORT or ray://HOST:PORT, not {text!r}")
    return text


def _leave_ctrl_c_to_the_driver() -> None:
    """A pool worker ignores SIGINT: the driver tells running seeds to stop (`SeedJob.halt_file`) and
    collects what they found; a worker killed by Ctrl-C would break the pool and lose it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def open_executor(ray_address: str | None, jobs: int) -> Iterator[Executor]:
    """This machine's process pool (`jobs` workers), or Ray at `ray_address`; shut down on leaving."""
    pool: Executor = (ProcessPoolExecutor(max_workers=jobs, initializer=_leave_ctrl_c_to_the_driver)
                      if ray_address is None else RayExecutor(ray_address, jobs))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
