"""The fan-out of independent tasks (runtime/fanout.py): in this process, over spawned local
processes (2 CPU workers here), and over Ray when it is installed (skipped otherwise)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kernelwright.runtime.device import default_device, device_info, interpreter_mode
from kernelwright.runtime.fanout import Fanout, FanoutError, parse_workers, run_tasks

# The worker-process tests run CPU workers. On a CUDA machine the workers are its GPUs, one per
# GPU (two asked on one GPU become one, in this process); `make gpu-multi` times the GPU fan-out.
cpu_workers = pytest.mark.skipif(
    torch.cuda.is_available() and not interpreter_mode(),
    reason="CPU worker processes; on a CUDA machine the fan-out's workers are its GPUs",
)


def task(item):
    """("meet", dir, n): wait until n workers have checked in, so each takes one task;
    ("square", x); ("fail",): raises; ("die",): the process exits without a word; ("sleep", s)."""
    kind = item[0]
    if kind == "meet":
        folder, n = Path(item[1]), item[2]
        (folder / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(list(folder.iterdir())) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.getpid()
    if kind == "square":
        return (os.getpid(), item[1] * item[1])
    if kind == "die":
        os._exit(7)
    if kind == "sleep":
        time.sleep(item[1])
        return os.getpid()
    return 1 / 0


def test_parse_workers():
    assert parse_workers("3") == 3 and parse_workers(2) == 2 and parse_workers("AUTO") == "auto"
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError):
            parse_workers(bad)


def test_sequential_default_runs_here_in_order():
    lines = []
    items = [("square", 3), ("fail",), ("square", -4)]
    got = run_tasks(task, items, labels=["a", "b", "c"], progress=lines.append)
    assert [r.index for r in got] == [0, 1, 2]
    assert got[0].value == (os.getpid(), 9) and got[2].value == (os.getpid(), 16)
    assert not got[1].ok and got[1].error.startswith("ZeroDivisionError")
    assert "in task" in got[1].traceback and "1 / 0" in got[1].traceback
    with pytest.raises(FanoutError, match="ZeroDivisionError"):
        got[1].unwrap()
    assert {r.gpu for r in got} == {device_info(default_device()).name}
    assert len(lines) == 3 and "b: FAILED: ZeroDivisionError" in lines[1]
    # a stop condition skips what has not started
    got = run_tasks(task, items, stop=lambda: True)
    assert all(r.skipped and not r.ok for r in got)


def test_each_result_is_handed_over_as_it_arrives():
    # what a caller keeps if the run is cut short: every finished task, failed ones too, as
    # it finishes; skipped tasks are not handed over
    seen = []

    def arrived(r):
        seen.append((r.index, r.ok))

    items = [("square", 2), ("fail",), ("square", 5)]
    started = []
    got = run_tasks(
        task, items, on_result=arrived, stop=lambda: len(started.append(0) or started) > 2
    )
    assert seen == [(0, True), (1, False)]
    assert got[2].skipped
    seen.clear()
    run_tasks(task, items, on_result=arrived)
    assert seen == [(0, True), (1, False), (2, True)]


@cpu_workers
def test_local_processes_two_workers(tmp_path):
    lines = []
    items = [
        ("meet", str(tmp_path), 2),
        ("meet", str(tmp_path), 2),
        ("fail",),
        ("die",),
        *[("square", x) for x in range(5)],
    ]
    with Fanout(2, backend="local", progress=lines.append) as pool:
        got = pool.run(task, items)
        again = pool.run(task, [("square", 11)])  # the same workers serve a second run
    # one result per item, in the items' order, each naming the worker process that ran it
    assert [r.index for r in got] == list(range(len(items)))
    met = {got[0].value, got[1].value}
    assert len(met) == 2 and os.getpid() not in met
    assert got[0].pid == got[0].value and got[1].pid == got[1].value
    assert {got[0].worker, got[1].worker} == {0, 1}
    # a task that raises fails alone, with its traceback; a worker that dies fails its task,
    # and another process takes its place
    assert got[2].error.startswith("ZeroDivisionError") and "1 / 0" in got[2].traceback
    assert "died (exit code 7)" in got[3].error
    for x, r in zip(range(5), got[4:], strict=True):
        assert r.ok and r.value[1] == x * x and r.value[0] == r.pid != os.getpid()
    assert again[0].ok and again[0].value[1] == 121
    assert {r.device for r in got} == {"cpu"} and all(r.seconds >= 0 for r in got)
    assert {r.gpu for r in got if r.ok} == {device_info(default_device()).name}
    assert len([ln for ln in lines if ln.startswith("[fan-out ")]) == len(items) + 1
    assert any("starting another" in ln for ln in lines)


def test_timeout_must_be_positive():
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="timeout_s must be a positive number"):
            Fanout(1, timeout_s=bad)


@cpu_workers
@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_a_task_past_its_timeout_fails_alone(workers):
    """A task still running after timeout_s fails with that reason, its worker is stopped and
    replaced, and the other tasks run (with one worker too: in a worker process, not here)."""
    lines = []
    items = [("sleep", 60), ("square", 3), ("square", 4)]
    t0 = time.monotonic()
    got = run_tasks(task, items, workers=workers, backend="local", timeout_s=3,
                    progress=lines.append)  # fmt: skip
    assert time.monotonic() - t0 < 45
    assert got[0].error.startswith("timed out: still running after 3 s")
    assert got[0].seconds >= 3
    assert [r.value[1] for r in got[1:]] == [9, 16]
    assert all(r.pid != os.getpid() for r in got[1:])  # worker processes, even for one worker
    assert any("timed out): starting another" in ln for ln in lines)


@cpu_workers
def test_ray_backend_local_mode(tmp_path):
    ray = pytest.importorskip("ray")
    # this test module is not importable in Ray's workers: send its functions by value
    import test_fanout
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(test_fanout)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        items = [("meet", str(tmp_path), 2), ("meet", str(tmp_path), 2), ("fail",)]
        items += [("square", x) for x in range(3)]
        got = run_tasks(task, items, workers=2, backend="ray")
        late = run_tasks(task, [("sleep", 60), ("square", 5)], workers=2, backend="ray",
                         timeout_s=3)  # fmt: skip
    finally:
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(test_fanout)
    assert len({got[0].value, got[1].value}) == 2
    assert got[2].error.startswith("ZeroDivisionError") and "1 / 0" in got[2].traceback
    assert [r.value[1] for r in got[3:]] == [0, 1, 4]
    assert {r.worker for r in got} == {0, 1} and {r.device for r in got} == {"cpu"}
    assert late[0].error.startswith("timed out") and late[1].value[1] == 25


@cpu_workers
def test_optimize_sweep_on_two_workers_matches_one(tmp_path):
    # `optimize --workers 2`: the launch sweep's candidates measured in two worker processes
    # (placeholder clock, no kernel run) give what the sweep gives in one process, and every
    # candidate reports where it ran
    import csv

    from kernelwright.workflows.optimize import OptimizeOptions, optimize
    from kernelwright.workflows.optimize.loop import launch_sweep
    from kernelwright.workflows.optimize.setup import preflight
    from kernelwright.workflows.optimize.tables import arch_rows, to_profile

    opts = OptimizeOptions(
        "rms_norm",
        yes=True,
        dry_run=True,
        execute=False,
        gpu="hopper",
        shapes=[{"tokens": 64, "hidden": h} for h in (256, 512)],
        max_variants=1,
        workspace=tmp_path / "one",
    )
    setup = preflight(opts)
    here = launch_sweep(setup, arch_rows(setup.table, setup.kernels, setup.arch), print)
    lines = []
    two = optimize(replace(opts, workers=2, workspace=tmp_path / "two"), progress=lines.append)
    assert [r.strategy for r in two.records] == ["launch_sweep"]
    assert two.records[0].table == to_profile(here.rows)
    with (two.workspace / "v1_sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(here.csv_rows) > 20
    for a, b in zip(here.csv_rows, rows, strict=True):
        assert {k: str(v) for k, v in a.items() if k != "device"} == {
            k: v for k, v in b.items() if k != "device"
        }
        assert b["device"] == "cpu" and b["gpu"] == device_info(default_device()).name
    assert len([ln for ln in lines if ln.startswith("[fan-out ")]) == len(rows)
