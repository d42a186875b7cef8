"""Shared set-up of the stand-alone GPU probes in this folder (they print; the benchmark of
record is `kernelwright bench`): the device line every log starts with, the copy figure the
percentages are taken against, and the CSV they leave in $OUT."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import triton

from kernelwright.bench.harness import cuda_timer, measure_copy_bandwidth


def gpu_setup() -> tuple:
    """(timer, SM count, copy GB/s) on the current GPU; prints the GPU, versions and copy."""
    timer = cuda_timer(hide_host=True)
    copy = measure_copy_bandwidth(torch.device("cuda"), timer=timer)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}"
          f"  copy {copy:.0f} GB/s", flush=True)  # fmt: skip
    return timer, sms, copy


def write_csv(out: Path, name: str, rows: list[dict]) -> None:
    """`rows` (dicts with the same keys) as out/name; nothing when there are none."""
    if not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
