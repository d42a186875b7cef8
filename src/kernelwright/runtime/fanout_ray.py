"""The fan-out's Ray backend (runtime/fanout.py): one Ray actor per worker, each holding one GPU
(`num_gpus=1`, so Ray does the placement), on this machine or a cluster's."""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kernelwright.runtime.fanout import (
    _POLL_S,
    Progress,
    TaskResult,
    _device_name,
    _execute,
    _Job,
    _timed_out,
)


class _RayWorker:
    """A Ray actor: the GPU Ray gave it (CUDA_VISIBLE_DEVICES) for its whole life."""

    def __init__(self, slot: int):
        import ray

        ids = [str(g) for g in ray.get_gpu_ids()]
        self.ident = dict(
            worker=slot,
            host=socket.gethostname(),
            device=",".join(ids) or "cpu",
            gpu=_device_name(),
            pid=os.getpid(),
        )

    def identity(self) -> dict:
        return self.ident

    def run(self, fn: Callable, item: Any) -> dict:
        from ray import cloudpickle

        return _execute(fn, item, cloudpickle.dumps)


class RayPool:
    def __init__(
        self,
        workers: int | str,
        address: str | None,
        progress: Progress,
        env: dict[str, str],
        timeout_s: float | None = None,
    ):
        import ray

        self.ray, self.progress, self.started = ray, progress, False
        self.timeout_s = timeout_s
        if not ray.is_initialized():
            ray.init(address=address)
            self.started = True
        gpus = int(ray.cluster_resources().get("GPU", 0))
        n = (gpus or 1) if workers == "auto" else int(workers)
        if gpus and n > gpus:
            progress(f"[fan-out] {n} workers asked, {gpus} GPU(s) in the Ray cluster: one per GPU")
            n = gpus
        self.actor = ray.remote(num_gpus=1 if gpus else 0, num_cpus=1)(_RayWorker).options(
            runtime_env={"env_vars": dict(env)}
        )
        self.actors = [self.actor.remote(i) for i in range(n)]
        self.idents = ray.get([a.identity.remote() for a in self.actors])
        progress(
            f"[fan-out] Ray: {n} worker(s) on "
            + ", ".join(f"{d['host']} {d['device']}" for d in self.idents)
        )

    def run(self, fn: Callable, job: _Job) -> None:
        ray = self.ray
        running: dict = {}  # ObjectRef -> (slot, index, when it was sent)
        idle = deque(range(len(self.actors)))
        while not job.done:
            while idle and (i := job.next_index()) is not None:
                slot = idle.popleft()
                try:
                    ref = self.actors[slot].run.remote(fn, job.items[i])
                    running[ref] = (slot, i, time.monotonic())
                except Exception as e:
                    idle.appendleft(slot)
                    err = f"cannot send the task to a Ray worker: {type(e).__name__}: {e}"
                    job.finish(TaskResult(i, job.labels[i], error=err))
            if job.done or not running:
                continue
            wait_s = None if self.timeout_s is None else _POLL_S
            ready, _ = ray.wait(list(running), num_returns=1, timeout=wait_s)
            if not ready:  # only with a timeout: stop the tasks past it
                now = time.monotonic()
                for ref, (slot, i, since) in list(running.items()):
                    if now - since > self.timeout_s:
                        del running[ref]
                        self.ray.kill(self.actors[slot])
                        why = _timed_out(self.timeout_s)
                        job.finish(TaskResult(i, job.labels[i], error=why, seconds=now - since,
                                              **self.idents[slot]))  # fmt: skip
                        self._replace(slot)
                        idle.append(slot)
                continue
            (ref,) = ready
            slot, i, _since = running.pop(ref)
            try:
                res = ray.get(ref)
            except ray.exceptions.RayActorError as e:  # the actor's process died
                job.finish(TaskResult(i, job.labels[i], error=f"the Ray worker died: {e}",
                                      **self.idents[slot]))  # fmt: skip
                self._replace(slot)
            except Exception as e:
                job.finish(TaskResult(i, job.labels[i], error=f"{type(e).__name__}: {e}",
                                      **self.idents[slot]))  # fmt: skip
            else:
                job.from_worker(i, res, self.idents[slot])
                if res["error"] and self.idents[slot]["device"] != "cpu":
                    self.ray.kill(self.actors[slot])  # its CUDA context may be unusable
                    self._replace(slot)
            idle.append(slot)

    def _replace(self, slot: int) -> None:
        self.actors[slot] = self.actor.remote(slot)
        self.idents[slot] = self.ray.get(self.actors[slot].identity.remote())

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        if self.started:
            self.ray.shutdown()
