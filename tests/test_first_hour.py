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


# ----------------------------------------------------------------------------------- import order

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


class _Scope:
    """The interpreter's patch scope, as far as `_patch_lang_tensor` uses it."""

    def __init__(self):
        self.changes = []

    def set_attr(self, obj, name, value):
        self.changes.append((obj, name, getattr(obj, name, None)))
        setattr(obj, name, value)


def _triton_36_patch(tensor, scope):
    # Triton 3.6's scalar conversion: int() of the handle's 1-element array
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


def test_a_scalar_argument_is_a_loop_bound_under_any_numpy(monkeypatch):
    """Triton 3.6 turns a scalar argument (a 1-element array) into an int with
    int(array), which NumPy 2.4 refuses: every kernel looping to a runtime bound failed under
    the interpreter (a GPU machine's Triton 3.6 with NumPy 2.5, CUDA hidden). ensure_backend
    wraps that patch where the installed Triton has it."""
    import numpy as np
    from triton.runtime import interpreter

    from kernelwright.runtime import device

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", _triton_36_patch)
    device.ensure_backend()
    assert interpreter._patch_lang_tensor is not _triton_36_patch

    class Handle:
        data = np.array([7], dtype=np.int32)

    class Tensor:
        handle = Handle()

    scope = _Scope()
    interpreter._patch_lang_tensor(Tensor, scope)
    assert range(0, Tensor(), 3) == range(0, 7, 3)
    for obj, name, value in reversed(scope.changes):
        setattr(obj, name, value)


def test_a_created_package_works_on_its_own_after_triton(tmp_path):
    from kernelwright.workflows.create.codegen import write
    from kernelwright.workflows.create.run import understand_source

    name = "kwfirst_softmax"
    write(understand_source(str(ROOT / "examples" / "create" / "softmax.py"), name), tmp_path)
    code = f"""
import triton
import torch
from {name} import {name} as softmax, {name}_ref
x = torch.randn(5, 24, generator=torch.Generator().manual_seed(0))
torch.testing.assert_close(softmax(x), {name}_ref(x), rtol=1e-4, atol=1e-5)
print("ok")
"""
    proc = _cpu_python(code, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ------------------------------------------------------------------------------ reviewed profiles


def _edit(path: Path) -> str:
    """A reviewer's edit: a comment is enough to make the file theirs."""
    text = path.read_text() + "# reviewed: keep as it is\n"
    path.write_text(text)
    return text


def test_create_keeps_an_edited_profile(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from kernelwright.cli import app

    monkeypatch.chdir(tmp_path)
    src = str(ROOT / "examples" / "create" / "relu_squared.py")
    args = ["create", src, "--name", "kwfirst_relu_sq"]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    ws = tmp_path / "kernelwright-runs" / "create" / "kwfirst_relu_sq"
    profile = ws / "profile.yaml"
    fresh = profile.read_text()
    assert runner.invoke(app, args).exit_code == 0  # unedited: re-running rewrites it quietly
    assert profile.read_text() == fresh and not (ws / "profile.new.yaml").exists()

    # an edit of the profile itself (create writes no profile.new.yaml equal to the reviewed one)
    edited = _edit(profile).replace("notes:\n", "notes:\n- reviewed\n", 1)
    profile.write_text(edited)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert profile.read_text() == edited
    assert (ws / "profile.new.yaml").read_text() == fresh
    assert "profile.new.yaml" in result.output and "--force" in result.output

    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert profile.read_text() == fresh


def test_autopatch_keeps_an_edited_profile(tmp_path):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from kernelwright.cli import app

    out = tmp_path / "llama" / "profile.yaml"
    args = ["autopatch", "llama", "--no-check", "--out", str(out)]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    fresh = out.read_text()
    edited = _edit(out)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert out.read_text() == edited and (out.parent / "profile.new.yaml").read_text() == fresh
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert out.read_text() == fresh


def test_optimize_keeps_an_edited_profile(tmp_path):
    from kernelwright.profiles.optimization import OptimizationProfile
    from kernelwright.workflows.optimize import OptimizeOptions, optimize

    ws = tmp_path / "ws"
    shapes = [{"tokens": 64, "hidden": 256}]
    opts = dict(workspace=ws, max_variants=1, dry_run=True, gpu="hopper", shapes=shapes)
    assert optimize(OptimizeOptions("rms_norm", **opts)).stage == "review"
    edited = _edit(ws / "profile.yaml")
    again = optimize(OptimizeOptions("rms_norm", yes=True, **opts))
    assert again.stage == "kept" and not (ws / "v1.json").exists()
    assert (ws / "profile.yaml").read_text() == edited
    assert again.profile_path == ws / "profile.new.yaml" and again.profile_path.is_file()
    assert "--force" in again.saved.message
    # resuming from the edited profile: the new one beside it is stale, profile.md is the edit's
    profile = OptimizationProfile.load(ws / "profile.yaml")
    profile.max_variants = 1
    profile.save(ws / "profile.yaml")
    resume = dict(workspace=ws, dry_run=True, resume=True)
    optimize(OptimizeOptions("rms_norm", **resume))
    assert not (ws / "profile.new.yaml").exists() and not (ws / "profile.new.md").exists()
    assert "variant budget 1" in (ws / "profile.md").read_text()
    forced = optimize(OptimizeOptions("rms_norm", force=True, **opts))
    assert forced.stage == "review" and (ws / "profile.yaml").read_text() != edited


# ------------------------------------------------------------------------------ patch and the RNG


def _tiny_llama(**overrides):
    from transformers import AutoModelForCausalLM

    from kernelwright.testing.model_configs import tiny_config

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("llama", **overrides))


def test_patch_and_the_callback_leave_the_rng_alone():
    pytest.importorskip("transformers")
    import torch

    from kernelwright.integrations.transformers import KernelwrightCallback, patch, unpatch

    model = _tiny_llama()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    patch(model)
    assert torch.equal(torch.get_rng_state(), before)
    unpatch(model)
    callback = KernelwrightCallback()
    callback.on_init_end(None, None, None, model=model)
    assert callback.applied is not None
    assert torch.equal(torch.get_rng_state(), before)


def test_patched_and_unpatched_runs_draw_the_same_dropout_masks(monkeypatch):
    pytest.importorskip("transformers")
    import copy

    import torch
    from conftest import DEVICE

    from kernelwright.integrations.transformers import patch

    model = _tiny_llama(attention_dropout=0.5).to(DEVICE)
    masks: list[torch.Tensor] = []
    dropout = torch.nn.functional.dropout

    def recording(x, *args, **kwargs):
        out = dropout(x, *args, **kwargs)
        masks.append(out == 0)
        return out

    monkeypatch.setattr(torch.nn.functional, "dropout", recording)
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    def run(m, patched: bool) -> list[torch.Tensor]:
        masks.clear()
        torch.manual_seed(7)  # as a training script seeds once, then builds and patches
        if patched:
            patch(m)  # its numerical checks run a tiny copy (their dropout is not recorded)
            masks.clear()
        m.train()
        m(ids)
        return list(masks)

    want = run(copy.deepcopy(model), patched=False)
    got = run(model, patched=True)
    assert want and len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# ------------------------------------------------------------------------- patch says what it did


def test_patch_logs_one_line_and_the_record_reads(caplog):
    pytest.importorskip("transformers")
    from kernelwright.integrations.transformers import patch, patch_record

    model = _tiny_llama()
    with caplog.at_level("INFO", logger="kernelwright"):
        patch(model, mlp=False)
    lines = [r for r in caplog.records if r.name == "kernelwright"]
    assert len(lines) == 1 and lines[0].levelname == "INFO"
    line = lines[0].getMessage()
    assert "\n" not in line
    assert "norm (LlamaRMSNorm)" in line and "rope (LlamaAttention)" in line
    assert "left alone: mlp (mlp=False)" in line
    text = str(patch_record(model))
    assert text == patch_record(model).summary()
    assert text.startswith("kernelwright patched LlamaForCausalLM (llama): ")
    assert "left alone: mlp: mlp=False" in text


# ------------------------------------------------------------------------------- the command line


def test_cli_version_and_help():
    from typer.testing import CliRunner

    import kernelwright
    from kernelwright.cli import app
    from kernelwright.testing.model_configs import ARCHITECTURES

    runner = CliRunner(env={"COLUMNS": "200"})
    version = runner.invoke(app, ["--version"])
    assert (
        version.exit_code == 0
        and version.output.strip() == f"kernelwright {kernelwright.__version__}"
    )
    top = runner.invoke(app, ["--help"]).output
    for workflow in ("create", "autopatch", "optimize", "bench", "demo"):
        assert f"{workflow} (" in top, workflow  # named and said what it does, not only listed
    autopatch = " ".join(runner.invoke(app, ["autopatch", "--help"]).output.split())
    assert "Tested model types" in autopatch
    assert all(arch in autopatch for arch in ARCHITECTURES)


def test_help_texts_wrap_to_the_terminal_not_to_the_source():
    # a docstring's line breaks would cut sentences in two in a wide terminal; every command's
    # paragraphs reach the help as one line each (the terminal wraps them)
    import inspect

    from typer.testing import CliRunner

    from kernelwright.cli import app

    runner = CliRunner(env={"COLUMNS": "400"})
    checked = 0

    def walk(typer_app, prefix):
        nonlocal checked
        for command in typer_app.registered_commands:
            name = command.name or command.callback.__name__.replace("_", "-")
            out = runner.invoke(app, [*prefix, name, "--help"]).output
            lines = [line.strip(" │") for line in out.splitlines()]
            doc = inspect.cleandoc(inspect.getdoc(command.callback) or command.help or "")
            for para in doc.split("\n\n"):
                # rich's markup (escaped brackets) aside, each paragraph is one output line
                joined = " ".join(para.split()).replace("\\[", "[")
                assert any(joined in line for line in lines), (name, joined)
                checked += 1
        for group in typer_app.registered_groups:
            walk(group.typer_instance, [*prefix, group.name])

    walk(app, [])
    assert checked >= 20


def test_python_dash_m_runs_the_command_line(monkeypatch, capsys):
    import runpy

    import kernelwright

    monkeypatch.setattr(sys, "argv", ["kernelwright", "--version"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("kernelwright", run_name="__main__")
    assert done.value.code in (0, None)
    assert capsys.readouterr().out.strip() == f"kernelwright {kernelwright.__version__}"


def test_ctrl_c_is_reported(monkeypatch, capsys):
    # typer turns Ctrl-C into a silent exit 130; the command line says it was interrupted
    from kernelwright import cli

    def interrupted():
        raise SystemExit(130)

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 130
    assert capsys.readouterr().err == "kernelwright: interrupted\n"
