"""create · saved vs recomputed: `profile.stored` decides what the forward kernel stores for
the backward kernel, which loads it instead of recomputing it and drops the inputs it no longer
needs. The default policy ("recompute") stores nothing and generates what it always did."""

from __future__ import annotations

import functools
import importlib
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import DEVICE

from kernelwright.profiles.kernel import KernelProfile, StoredTensor
from kernelwright.workflows.create import understand
from kernelwright.workflows.create.codegen import UnsupportedNode, render, write

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "create"
# min-bytes on the corpus: (stored name, dtype), the inputs the backward kernel drops
MIN_BYTES = {
    "leaky_relu": ([("gt", "bool")], ["x"]),
    "rowwise_mse": ([("mul", "same")], ["x", "target"]),
}


@functools.cache
def _yaml(stem: str, policy: str = "recompute") -> str:
    return understand(str(CORPUS / f"{stem}.py"), save_policy=policy).to_yaml()


def profile_of(stem: str, policy: str = "recompute") -> KernelProfile:
    return KernelProfile.from_yaml(_yaml(stem, policy))  # a fresh copy: tests edit it


def _signature(op: str, kernel: str) -> str:
    return op.split(f"def {kernel}(")[1].split("):")[0]


@pytest.mark.parametrize("stem", sorted(MIN_BYTES))
def test_min_bytes_stores_what_lets_the_backward_drop_inputs(stem):
    stored, dropped = MIN_BYTES[stem]
    p = profile_of(stem, "min-bytes")
    assert p.save_policy == "min-bytes"
    assert [(t.name, t.dtype) for t in p.stored] == stored
    assert all(f"drop {dropped[0]} (" in t.reason and " B " in t.reason for t in p.stored)
    op = render(p)[f"{stem}/{stem}.py"]
    bwd = _signature(op, f"_{stem}_bwd_kernel")
    fwd = _signature(op, f"_{stem}_fwd_kernel")
    assert "st0_ptr" in bwd and "st0_ptr" in fwd
    for i, name in enumerate(s.name for s in p.inputs):
        # the backward kernel takes no input it dropped; the forward still reads them all
        assert (f"in{i}_ptr" in bwd) == (name not in dropped) and f"in{i}_ptr" in fwd
    assert "ctx.save_for_backward(*[inputs[i] for i in []], *stored)" in op
    # deterministic, also through the reviewed YAML
    assert render(p) == render(profile_of(stem, "min-bytes"))
    assert render(KernelProfile.from_yaml(p.to_yaml())) == render(p)


def test_default_policy_stores_nothing():
    # (every corpus profile renders without stored-intermediate code: test_create_codegen)
    for stem in MIN_BYTES:
        p = profile_of(stem)
        assert p.save_policy == "recompute" and p.stored == []
        op = render(p)[f"{stem}/{stem}.py"]
        assert "st0_ptr" not in op and "STORED_KINDS" not in op
        assert "ctx.save_for_backward(*inputs)" in op


def test_leaky_relu_min_bytes_end_to_end(tmp_path):
    # through the workflow: Understand with the policy, Act, Verify (the generated tests:
    # fp32/fp16/bf16, odd and non-contiguous shapes, poisoned outputs, torch.compile fullgraph)
    from kernelwright.workflows.create.run import create

    result = create(
        str(CORPUS / "leaky_relu.py"), yes=True, bench="none", runs=tmp_path,
        save_policy="min-bytes", name="leaky_relu_st",
    )  # fmt: skip
    log = (tmp_path / "leaky_relu_st" / "test_attempt0.log").read_text()
    assert result.passed and not result.profile.repairs, log[-3000:]
    assert [t.name for t in KernelProfile.load(tmp_path / "leaky_relu_st/profile.yaml").stored] == [
        "gt"
    ]
    # in this process too: autograd keeps the 1-byte mask only, not x
    sys.path.insert(0, str(tmp_path / "leaky_relu_st" / "pkg"))
    try:
        mod = importlib.import_module("leaky_relu_st.leaky_relu_st")
    finally:
        sys.path.pop(0)
    x = torch.randn(6, 40, dtype=torch.bfloat16, device=DEVICE)[:, ::2]  # non-contiguous
    x.requires_grad_(True)
    y = mod.leaky_relu_st(x)  # the public function takes the op's name
    saved = y.grad_fn.saved_tensors
    assert [(t.dtype, tuple(t.shape)) for t in saved] == [(torch.bool, (6, 20))]
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    ref = torch.nn.functional.leaky_relu(x.detach().float(), 0.01)
    torch.testing.assert_close(y.float(), ref, atol=1.6e-2, rtol=1.6e-2)
    dx_ref = torch.where(x.detach().float() > 0, 1.0, 0.01)
    torch.testing.assert_close(dx.float(), dx_ref, atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize(
    "stem, edit",
    [
        ("rowwise_mse", None),  # min-bytes: a full-size difference in the input dtype
        ("rms_norm", [StoredTensor(name="rsqrt", dtype="fp32")]),  # a per-row statistic
    ],
)
def test_stored_row_kernel_passes_its_tests(stem, edit, tmp_path):
    from kernelwright.workflows.create.verify import verify

    p = profile_of(stem, "min-bytes")
    if edit is not None:
        p.stored = edit
    result = verify(p, tmp_path)
    assert result.passed and not p.repairs, result.attempts[-1].log.read_text()[-3000:]
    op = (tmp_path / "pkg" / stem / f"{stem}.py").read_text()
    if stem == "rms_norm":  # one value per row, loaded as a [ROWS, 1] tile
        assert "s_rsqrt = tl.load(st0_ptr + rows * st0_sr, mask=rmask" in op
        assert "STORED_KINDS = ['row1']" in op


def _edited(stem: str, stored: list[dict]) -> str:
    data = yaml.safe_load(_yaml(stem))
    data["stored"] = stored
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize(
    "stored, message",
    [
        ([{"name": "nope"}], r"'nope' names no node of the forward graph.*gt, mul, y"),
        ([{"name": "x"}], r"'x' is an input, not a forward intermediate"),
        ([{"name": "output"}], r"'output' is the graph's output node"),
        (
            [{"name": "gt", "dtype": "same"}],
            r"'gt' is a torch.bool value; store it with dtype bool",
        ),
        ([{"name": "mul", "dtype": "bool"}], r"store a non-bool value as same or fp32"),
        ([{"name": "gt", "dtype": "bool"}] * 2, r"'gt' is listed twice"),
        ([{"name": "gt", "dtype": "int8"}], r"dtype"),
    ],
    ids=["unknown", "input", "output", "bool_as_same", "float_as_bool", "twice", "bad_dtype"],
)
def test_bad_stored_edit_fails_validation(stored, message):
    with pytest.raises(ValueError, match=message):
        KernelProfile.from_yaml(_edited("leaky_relu", stored))


def test_stored_but_never_read_stops_generation():
    p = KernelProfile.from_yaml(_edited("leaky_relu", [{"name": "mul", "dtype": "same"}]))
    with pytest.raises(UnsupportedNode, match=r"'mul'.*the backward never reads it"):
        render(p)


def test_profiles_without_the_new_fields_load():
    data = yaml.safe_load(_yaml("leaky_relu"))
    del data["stored"], data["save_policy"]
    data["repairs"] = [{"attempt": 1, "change": "launch config a -> b", "reason": "r"}]
    p = KernelProfile.model_validate(data)
    assert p.stored == [] and p.save_policy == "recompute" and p.repairs[0].kind == "launch"


def test_verify_repairs_stored_dtype_then_recomputes(tmp_path, monkeypatch):
    # a backward tolerance failure: the stored difference is widened to fp32, then recomputed;
    # the launch config does not move for those repairs
    from kernelwright.workflows.create import verify as verify_mod

    failure = "E       AssertionError: grad of input 0: Tensor-likes are not close!\n"
    outputs = iter([(1, failure), (1, failure), (0, "")])
    monkeypatch.setattr(verify_mod, "run_tests", lambda root, name, log: next(outputs))
    p = profile_of("rowwise_mse", "min-bytes")
    result = verify_mod.verify(p, tmp_path)
    assert result.passed and [r.kind for r in p.repairs] == ["stored", "stored"]
    assert "mul: input dtype -> fp32" in p.repairs[0].change
    assert "grad of input 0" in p.repairs[0].reason
    assert p.stored == [] and "recomputed" in p.repairs[1].change
    assert [a.config for a in result.attempts].count(result.attempts[0].config) == 3
    op = (tmp_path / "pkg/rowwise_mse/rowwise_mse.py").read_text()
    assert "st0_ptr" not in op
    # and a forward failure moves the launch config as before
    p = profile_of("rowwise_mse", "min-bytes")
    outputs = iter([(1, "E       AssertionError: forward: Tensor-likes are not close!\n"), (0, "")])
    verify_mod.verify(p, tmp_path)
    assert [r.kind for r in p.repairs] == ["launch"] and p.stored


def test_verify_names_a_crash_and_never_repeats_a_launch_config(tmp_path, monkeypatch):
    # a generated test that raises is a crash, not wrong numbers; each repair moves to a new,
    # smaller config and the loop stops (saying so) when the smallest has failed too
    from kernelwright.workflows.create import verify as verify_mod
    from kernelwright.workflows.create.codegen import launch_configs

    crash = "E       RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n"
    monkeypatch.setattr(verify_mod, "run_tests", lambda root, name, log: (1, crash))
    p = profile_of("leaky_relu")
    configs = launch_configs(p)
    assert 2 <= len(configs) <= verify_mod.MAX_REPAIRS  # the configs run out before the repairs
    result = verify_mod.verify(p, tmp_path)
    assert not result.passed and result.gate == "hard"
    assert all(a.reason.startswith("crash: RuntimeError") for a in result.attempts)
    changes = [r.change for r in p.repairs]
    assert all(r.kind == "launch" for r in p.repairs) and len(set(changes)) == len(changes)
    tried = [a.config for a in result.attempts]
    assert tried == configs  # each config once, in order
    assert len(tried) == len(configs) and "no smaller launch config" in result.attempts[-1].reason
    wrong = (
        "E   AssertionError: forward: Tensor-likes are not close!\nE   Mismatched elements: 3 / 8\n"
    )
    assert verify_mod.classify(1, wrong)[1].startswith("wrong numbers")
    assert verify_mod.classify(-11, "Fatal Python error: Segmentation fault")[1].startswith("crash")


def test_widened_stored_dtype_is_rendered(tmp_path):
    p = profile_of("rowwise_mse", "min-bytes")
    p.stored[0].dtype = "fp32"
    files = write(p, tmp_path)
    op = next(f for f in files if f.name == "rowwise_mse.py").read_text()
    assert re.search(r"STORED_DTYPES = \[torch\.float32\]", op)
