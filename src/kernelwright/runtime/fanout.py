"""Run independent tasks side by side, one task per GPU at a time.

The workflows' searches (optimize's launch sweep, the create corpus, the registry's benchmark
fill) are lists of independent measurements. `Fanout(workers).run(fn, items)` calls `fn(item)`
for every item and returns one `TaskResult` per item, in the items' order:

- `workers=1` (the default): in this process, one item after the other, as before.
- Ray installed (`pip install ray`): one Ray actor per worker, each holding one
  GPU (`num_gpus=1`, so Ray does the placement and no two actors share a GPU). With a cluster
  address (the `address` argument, else $KERNELWRIGHT_RAY_ADDRESS, else $RAY_ADDRESS) the
  actors spread over the cluster's machines; without one Ray starts on this machine.
- Ray absent: spawned local processes, one per visible GPU, each started with
  `CUDA_VISIBLE_DEVICES` naming its GPU alone (before it could initialise CUDA). On a machine
  without a GPU, `workers` CPU processes.

`workers="auto"` is the number of visible GPUs (the Ray cluster's, given an address); more
workers than GPUs are cut to one per GPU: a measurement never shares its GPU with another.
A task's exception comes back as that task's `error` with its traceback text; a worker process
that dies fails its task only and is replaced. With `timeout_s`, a task still running after
that long fails with a timeout error and its worker is stopped and replaced (a task that hangs,
such as a compile that does not finish, cannot hold the rest up); tasks then run in worker
processes even with one worker, since a task in this process could not be stopped. Each
result names the worker, host, GPU index and GPU name that ran it. `fn` and the items are
pickled to reach a worker: `fn` must be a module-level function (a script's own functions work
with both backends). `env` is set in every worker's environment (the callers pass the run's
commit as $KERNELWRIGHT_COMMIT: a worker then need not ask git, and every row names the commit
the run started from).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

ENV_ADDRESS = "KERNELWRIGHT_RAY_ADDRESS"
BACKENDS = ("auto", "ray", "local")
_POLL_S = 0.5  # the longest the parent waits on its workers before dispatching again

Progress = Callable[[str], None]


class FanoutError(RuntimeError):
    """A task failed (see `TaskResult.unwrap`), or the fan-out was asked something it cannot do."""


@dataclass
class TaskResult:
    index: int  # the item's position
    label: str
    value: Any = None
    error: str = ""  # "ValueError: ..." when the task raised (or its worker died)
    traceback: str = ""
    skipped: bool = False  # never started: the stop condition held before its turn
    worker: int = 0  # the worker slot that ran it
    host: str = ""
    device: str = ""  # the GPU's index on its host ("3"), or "cpu"
    gpu: str = ""  # the device's name as the worker saw it (what measured rows record)
    pid: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and not self.skipped

    def unwrap(self) -> Any:
        """The value, or a FanoutError carrying the task's error and traceback."""
        if self.skipped:
            raise FanoutError(f"{self.label}: not run (stopped before its turn)")
        if self.error:
            raise FanoutError(f"{self.label}: {self.error}\n{self.traceback}")
        return self.value


# --------------------------------------------------------------------------- devices


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (else 0..n-1); none
    when kernels run through the interpreter."""
    import torch

    from kernelwright.runtime.device import interpreter_mode

    if interpreter_mode() or not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    named = [s.strip() for s in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    named = [s for s in named if s]
    return named[:n] if named else [str(i) for i in range(n)]


def parse_workers(text: str | int) -> int | str:
    """A `--workers` value: a positive count or "auto" (ValueError otherwise)."""
    if isinstance(text, int) or str(text).strip().isdigit():
        n = int(text)
        if n < 1:
            raise ValueError(f"workers must be at least 1, got {n}")
        return n
    if str(text).strip().lower() == "auto":
        return "auto"
    raise ValueError(f"workers must be a count or 'auto', got {text!r}")


def ray_address(address: str | None = None) -> str | None:
    return address or os.environ.get(ENV_ADDRESS) or os.environ.get("RAY_ADDRESS") or None


def ray_available() -> bool:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    # a folder named ray on the path (Ray's own /tmp/ray session folder) is no Ray
    return spec is not None and spec.origin not in (None, "namespace")


def _device_name() -> str:
    from kernelwright.runtime.device import default_device, device_info

    return device_info(default_device()).name


def _failed_cuda() -> bool:
    """True when this process has used CUDA: after a failed task its context may be broken."""
    import torch

    return torch.cuda.is_initialized()


def _execute(fn: Callable, item: Any, dumps: Callable[[Any], Any]) -> dict:
    t0 = time.perf_counter()
    try:
        return dict(value=dumps(fn(item)), error="", tb="", s=time.perf_counter() - t0)
    except Exception as e:
        return dict(
            value=None,
            error=f"{type(e).__name__}: {e}",
            tb=traceback.format_exc(),
            s=time.perf_counter() - t0,
        )


def _same(x: Any) -> Any:
    return x


# --------------------------------------------------------------------------- the front


class Fanout:
    """Workers that start on the first `run` and serve every later one until `close`."""

    def __init__(
        self,
        workers: int | str = 1,
        *,
        backend: str = "auto",
        address: str | None = None,
        progress: Progress | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ):
        self.workers = parse_workers(workers)
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.env = dict(env or {})  # set in every worker's environment
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.address = ray_address(address)
        self.progress = progress or (lambda _: None)
        self._pool: Any = None  # _LocalPool, or fanout_ray.RayPool
        self._kind = ""
        self._devices: list[str] = []

    @property
    def sequential(self) -> bool:
        """True when tasks run in this process (one worker, no Ray asked for)."""
        return self._choose() == "sequential"

    def _choose(self) -> str:
        if self._kind:
            return self._kind
        if self.workers == 1 and self.backend != "ray" and self.timeout_s is None:
            self._kind = "sequential"
        elif self.backend == "ray" or (self.backend == "auto" and self.address and ray_available()):
            self._kind = "ray"  # a cluster: its GPUs, not this machine's, set the count
        else:
            gpus = visible_gpus()
            n = len(gpus) if self.workers == "auto" else self.workers
            if gpus and n > len(gpus):
                self.progress(f"[fan-out] {n} workers asked, {len(gpus)} GPU(s): one per GPU")
                n = len(gpus)
            self._devices = gpus[:n] if gpus else ["cpu"] * n
            if n <= 1 and self.timeout_s is None:
                self._kind = "sequential"
            elif n <= 1:  # one worker process: a task overrunning its time can be stopped
                self._devices = self._devices[:1] or ["cpu"]
                self._kind = "local"
            else:
                self._kind = "ray" if self.backend == "auto" and ray_available() else "local"
        return self._kind

    def run(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        *,
        labels: Sequence[str] | None = None,
        stop: Callable[[], bool] | None = None,
        on_result: Callable[[TaskResult], None] | None = None,
    ) -> list[TaskResult]:
        """`fn(item)` for every item; `stop()`, checked before each task starts, skips the
        rest once it holds. Prints one progress line per finished task, and hands each
        finished (not skipped) task's result to `on_result` as it arrives, so a caller can
        keep what was done if the run is cut short."""
        items = list(items)
        labels = list(labels) if labels is not None else [str(x)[:60] for x in items]
        if len(labels) != len(items):
            raise ValueError("labels: one per item")
        job = _Job(items, labels, self.progress, stop or (lambda: False), on_result)
        if not items:
            return []
        kind = self._choose()
        if kind == "sequential":
            _run_here(fn, job)
        else:
            if self._pool is None:
                if kind == "ray":
                    # this machine's GPUs were counted already, unless a cluster is named
                    n = len(self._devices) or self.workers
                    from kernelwright.runtime.fanout_ray import RayPool

                    self._pool = RayPool(n, self.address, self.progress, self.env, self.timeout_s)
                else:
                    self._pool = _LocalPool(self._devices, self.progress, self.env, self.timeout_s)
            self._pool.run(fn, job)
        return job.results  # type: ignore[return-value]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Fanout:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_tasks(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    workers: int | str = 1,
    labels: Sequence[str] | None = None,
    backend: str = "auto",
    address: str | None = None,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
    env: dict[str, str] | None = None,
    on_result: Callable[[TaskResult], None] | None = None,
    timeout_s: float | None = None,
) -> list[TaskResult]:
    """One `Fanout` for one list of tasks (workers started and stopped around it)."""
    with Fanout(
        workers, backend=backend, address=address, progress=progress, env=env, timeout_s=timeout_s
    ) as f:
        return f.run(fn, items, labels=labels, stop=stop, on_result=on_result)


class _Job:
    """One `run`: the items, their results as they come, the progress lines."""

    def __init__(
        self, items: list, labels: list[str], progress: Progress, stop: Callable, on_result=None
    ):
        self.items, self.labels, self.progress, self.stop = items, labels, progress, stop
        self.on_result = on_result
        self.results: list[TaskResult | None] = [None] * len(items)
        self.pending = deque(range(len(items)))
        self.finished = 0

    @property
    def done(self) -> bool:
        return self.finished == len(self.items)

    def next_index(self) -> int | None:
        """The next item to start; None when there is none or `stop()` holds (then every
        item not yet started is marked skipped)."""
        if self.pending and self.stop():
            while self.pending:
                i = self.pending.popleft()
                self.finish(TaskResult(i, self.labels[i], skipped=True), quiet=True)
            self.progress("[fan-out] stopped: the remaining tasks are skipped")
        return self.pending.popleft() if self.pending else None

    def finish(self, r: TaskResult, quiet: bool = False) -> None:
        self.results[r.index] = r
        self.finished += 1
        if quiet:
            return
        where = f"worker {r.worker}"
        if r.device:
            where += f", {'GPU ' + r.device if r.device != 'cpu' else 'cpu'}"
        if r.gpu and r.device != "cpu":
            where += f" {r.gpu}"
        if r.host and r.host != socket.gethostname():
            where += f" on {r.host}"
        status = "ok" if r.ok else f"FAILED: {r.error.splitlines()[0][:200] if r.error else ''}"
        self.progress(
            f"[fan-out {self.finished}/{len(self.items)}] {r.label}: {status} "
            f"({r.seconds:.2f} s, {where})"
        )
        if self.on_result is not None:
            self.on_result(r)

    def from_worker(self, index: int, res: dict, ident: dict, loads=pickle.loads) -> None:
        value, error, tb = None, res["error"], res["tb"]
        if not error:
            try:
                value = loads(res["value"])
            except Exception as e:
                error = f"the result could not be read back: {type(e).__name__}: {e}"
                tb = traceback.format_exc()
        self.finish(
            TaskResult(
                index,
                self.labels[index],
                value=value,
                error=error,
                traceback=tb,
                seconds=res["s"],
                **ident,
            )
        )


def _run_here(fn: Callable, job: _Job) -> None:
    ident = dict(worker=0, host=socket.gethostname(), pid=os.getpid(), gpu=_device_name())
    ident["device"] = (visible_gpus() or ["cpu"])[0]
    while (i := job.next_index()) is not None:
        job.from_worker(i, _execute(fn, job.items[i], _same), ident, loads=_same)


# --------------------------------------------------------------------------- local processes


def _local_worker(slot: int, device: str, tasks, results) -> None:
    """A spawned worker: say it is ready, then run what the parent sends until it sends None.

    Each worker has its own pipes: a worker that dies mid-write blocks no other worker."""
    ident = dict(worker=slot, host=socket.gethostname(), device=device, pid=os.getpid())
    try:
        ident["gpu"] = _device_name()
    except Exception as e:  # a GPU that cannot start: said in every row it runs
        ident["gpu"] = f"unavailable ({type(e).__name__}: {e})"
    results.send(("ready", ident))
    while (msg := tasks.recv()) is not None:
        index, data = msg
        try:
            fn, item = pickle.loads(data)
        except Exception as e:
            res = dict(value=None, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())
            res["s"] = 0.0
        else:
            res = _execute(fn, item, pickle.dumps)
        leaving = bool(res["error"]) and device != "cpu" and _failed_cuda()
        results.send(("done", (index, res, leaving)))
        if leaving:
            return


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """Set `values` in os.environ while the block runs (a spawned process inherits them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Slot:
    def __init__(self, index: int, device: str):
        self.index, self.device = index, device
        self.proc = None
        self.tasks = None  # the parent's ends of the worker's two pipes
        self.results = None
        self.ident: dict | None = None  # set by its "ready" message
        self.task: int | None = None  # the item it is running
        self.since = 0.0  # when that item was sent (time.monotonic)
        self.ever_ready = False
        self.dead = False  # failed to start: not restarted


def _timed_out(timeout_s: float) -> str:
    return f"timed out: still running after {timeout_s:g} s (its worker was stopped)"


class _LocalPool:
    def __init__(
        self,
        devices: list[str],
        progress: Progress,
        env: dict[str, str],
        timeout_s: float | None = None,
    ):
        self.mp = multiprocessing.get_context("spawn")
        self.progress, self.env, self.timeout_s = progress, env, timeout_s
        self.slots = [_Slot(i, d) for i, d in enumerate(devices)]
        for s in self.slots:
            self._start(s)

    def _start(self, s: _Slot) -> None:
        task_r, s.tasks = self.mp.Pipe(duplex=False)
        s.results, result_w = self.mp.Pipe(duplex=False)
        s.ident, s.task = None, None
        s.proc = self.mp.Process(
            target=_local_worker, args=(s.index, s.device, task_r, result_w), daemon=True
        )
        # the worker's only GPU, fixed before its interpreter starts (and so before CUDA)
        env = dict(self.env)
        if s.device != "cpu":
            env["CUDA_VISIBLE_DEVICES"] = s.device
        with _env(env):
            s.proc.start()
        task_r.close()  # the worker holds these now; its exit closes the results pipe
        result_w.close()

    def _retire(self, s: _Slot) -> int | None:
        s.tasks.close()
        s.results.close()
        s.proc.join(timeout=30)
        if s.proc.is_alive():
            s.proc.terminate()
            s.proc.join(timeout=5)
        return s.proc.exitcode

    def _receive(self, s: _Slot, job: _Job) -> None:
        try:
            kind, body = s.results.recv()
        except (EOFError, OSError):
            self._died(s, job)
            return
        if kind == "ready":
            s.ident, s.ever_ready = body, True
            return
        index, res, leaving = body
        s.task = None
        job.from_worker(index, res, s.ident or {})
        if leaving:  # a fresh process for this GPU: the old CUDA context may be unusable
            self._retire(s)
            self._start(s)

    def _died(self, s: _Slot, job: _Job) -> None:
        """Fail the dead worker's task; start another unless it never started at all."""
        code = self._retire(s)
        if s.task is not None:
            i, s.task = s.task, None
            why = f"the worker process died (exit code {code}) running this task"
            ident = s.ident or dict(worker=s.index, device=s.device)
            job.finish(TaskResult(i, job.labels[i], error=why, **ident))
        if s.ever_ready:
            self.progress(f"[fan-out] worker {s.index} exited ({code}): starting another")
            self._start(s)
            return
        s.dead = True
        self.progress(f"[fan-out] worker {s.index} could not start (exit code {code})")
        if all(x.dead for x in self.slots):
            while (i := job.next_index()) is not None:
                job.finish(TaskResult(i, job.labels[i], error="no worker process could start"))

    def run(self, fn: Callable, job: _Job) -> None:
        from multiprocessing.connection import wait

        while not job.done:
            for s in self.slots:
                if s.ident is None or s.task is not None or s.dead:
                    continue
                i = job.next_index()
                if i is None:
                    break
                try:
                    data = pickle.dumps((fn, job.items[i]))
                except Exception as e:
                    err = f"cannot send the task to a worker process: {type(e).__name__}: {e}"
                    job.finish(TaskResult(i, job.labels[i], error=err))
                    continue
                s.task, s.since = i, time.monotonic()
                s.tasks.send((i, data))
            if job.done:
                break
            live = {s.results: s for s in self.slots if not s.dead}
            for conn in wait(list(live), timeout=_POLL_S):
                self._receive(live[conn], job)
            if self.timeout_s is not None:
                self._stop_overdue(job)

    def _stop_overdue(self, job: _Job) -> None:
        """Fail each task running past the timeout; its worker is stopped and started again."""
        now = time.monotonic()
        for s in self.slots:
            if s.task is None or s.dead or now - s.since <= self.timeout_s:
                continue
            i, s.task = s.task, None
            s.proc.terminate()
            self._retire(s)
            ident = s.ident or dict(worker=s.index, device=s.device)
            job.finish(TaskResult(i, job.labels[i], error=_timed_out(self.timeout_s),
                                  seconds=now - s.since, **ident))  # fmt: skip
            self.progress(f"[fan-out] worker {s.index} stopped ({job.labels[i]} timed out): "
                          "starting another")  # fmt: skip
            self._start(s)

    def close(self) -> None:
        for s in self.slots:
            if s.dead or s.proc is None:
                continue
            if s.ident is not None and s.proc.is_alive():
                with suppress(OSError):
                    s.tasks.send(None)
            else:  # still starting: nothing to finish
                s.proc.terminate()
        for s in self.slots:
            if not s.dead and s.proc is not None:
                self._retire(s)
