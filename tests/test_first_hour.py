"""The first hour of a new user, each step as they would take it.

- importing triton, transformers or peft before kernelwright on a machine without a GPU;
- a package written by `create --out`, imported on its own after triton;
- re-running a workflow over a reviewed profile.yaml;
- patch(model) and KernelwrightCallback leaving torch's random state alone;
- patch saying what it did (a log line, PatchRecord's summary);
- the command line's --version and help.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _cpu_python(code: str, *paths: Path) -> subprocess.CompletedProcess:
    """Run `code` in a fresh process as a CPU machine sees it: no GPU, TRITON_INTERPRET unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*paths, SRC))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )


# ----------------------------------------------------------------------------- import order

OPS_RUN = """
import torch
import kernelwright as kw
g = torch.Generator().manual_seed(0)
x = torch.randn(6, 40, generator=g)
w = torch.rand(40, generator=g) + 0.5
t = torch.randint(0, 40, (6,), generator=g)
for got, want in [
    (kw.rms_norm(x, w), kw.rms_norm_ref(x, w)),
    (kw.softmax(x), kw.softmax_ref(x)),
    (kw.relu_squared(x), kw.relu_squared_ref(x)),
    (kw.cross_entropy(x, t), kw.cross_entropy_ref(x, t)),
]:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("first", ["triton", "transformers", "peft"])
def test_ops_work_whatever_was_imported_first(first):
    if importlib.util.find_spec(first) is None:
        pytest.skip(f"{first} is not installed")
    proc = _cpu_python(f"import {first}\n" + OPS_RUN)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_a_created_package_works_on_its_own_after_triton(tmp_path):
    from kernelwright.workflows.create.codegen import write
    from kernelwright.workflows.create.run import understand_source

    name = "kwfirst_softmax"
    write(understand_source(str(ROOT / "examples" / "create" / "softmax.py"), name), tmp_path)
    code = f"""
import triton
import torch
from {name} import softmax, {name}_ref
x = torch.randn(5, 24, generator=torch.Generator().manual_seed(0))
torch.testing.assert_close(softmax(x), {name}_ref(x), rtol=1e-4, atol=1e-5)
print("ok")
"""
    proc = _cpu_python(code, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
