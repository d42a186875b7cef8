"""kernelwright debug: the planted-bug corpus (tests/debug_planted.py) localised to the right
pass and regime, each repro failing while its bug is there and passing on the fixed op; the
clean library op without a divergence; the review stop, resume and edited profiles; targets
(a function with its own reference, a created op's workspace) and the command's exit codes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import debug_planted as planted
import pytest
import yaml
from conftest import ON_GPU, package_beside_cwd
from typer.testing import CliRunner

from kernelwright.cli import app
from kernelwright.profiles import reviewed
from kernelwright.profiles.debug import DebugProfile
from kernelwright.workflows.debug import DebugOptions, TargetError, debug_op, plan
from kernelwright.workflows.debug.bisect import bisect, probed_values

# The corpus probes every dtype, shape regime and launch-table row of each planted op: under the
# interpreter that is milliseconds a probe, on a GPU a compilation each (minutes a bug).
pytestmark = pytest.mark.skipif(ON_GPU, reason="the planted corpus runs in the CPU suite")

GOAL = 0.9  # share of the planted bugs localised to the right pass and regime
TESTS = Path(__file__).resolve().parent

# Runs each repro.py as a script (runpy, __main__) in one child process, and prints one JSON
# line: path -> "failed: <exception>" or "passed" (one process: an import costs seconds here).
RUNNER = textwrap.dedent(
    """
    import json, runpy, sys
    out = {}
    for path in sys.argv[1:]:
        try:
            runpy.run_path(path, run_name="__main__")
            out[path] = "passed"
        except BaseException as e:  # AssertionError: the divergence; anything else: broken
            out[path] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(out))
    """
)


def run_scripts(paths: list[Path]) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=TESTS.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fixed_copy(repro: Path, bug: planted.Bug) -> Path:
    """The repro with the library op in place of the planted one (the bug fixed)."""
    text = repro.read_text()
    planted_import = f"from debug_planted import {bug.name} as op"
    assert planted_import in text
    module = f"kernelwright.ops.{bug.ref}"
    fixed = repro.with_name("repro_fixed.py")
    fixed.write_text(text.replace(planted_import, f"from {module} import {bug.ref} as op"))
    return fixed


def localised(bug: planted.Bug, profile: DebugProfile) -> list[str]:
    """Why `profile` does not localise `bug` (empty: it does)."""
    d = profile.divergence
    if d is None:
        return ["no divergence found"]
    problems = []
    if d.pass_name != bug.pass_name:
        problems.append(f"pass {d.pass_name}, expected {bug.pass_name}")
    probed = probed_values(profile, profile.probes)
    for axis, value in bug.regime.items():
        failed = d.regime.get(axis, [])
        if not any(value in v for v in failed):
            problems.append(f"{axis}: {value!r} not among the failing values {failed}")
        elif len(failed) == len(probed[axis]):
            problems.append(f"{axis}: every value fails, not confined to {value!r}")
    return problems


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every planted bug debugged (autonomously, --yes), then every repro run as a script and
    every repro with the library op in place of the planted one."""
    root = tmp_path_factory.mktemp("debug_corpus")
    results = {}
    for bug in planted.BUGS:
        opts = DebugOptions(
            f"debug_planted:{bug.name}", ref=bug.ref, yes=True, workspace=root / bug.name
        )
        results[bug.name] = debug_op(opts)
    repros = [r.repro for r in results.values() if r.repro is not None]
    fixed = [fixed_copy(results[b.name].repro, b) for b in planted.BUGS if results[b.name].repro]
    return results, run_scripts(repros + fixed)


def test_the_corpus_has_twenty_bugs_or_more():
    names = [b.name for b in planted.BUGS]
    assert len(names) >= 20 and len(set(names)) == len(names)
    assert all(callable(getattr(planted, n)) for n in names)


@pytest.mark.parametrize("bug", planted.BUGS, ids=lambda b: b.name)
def test_planted_bug_is_localised_and_its_repro_fails(corpus, bug):
    results, scripts = corpus
    result = results[bug.name]
    assert result.stage == "done" and result.diverged, bug.what
    assert localised(bug, result.profile) == [], result.profile.divergence.summary
    d = result.profile.divergence
    assert math.prod(d.minimal_shape) <= math.prod(d.shape)
    assert result.repro is not None and result.report is not None
    assert scripts[str(result.repro)].startswith("failed: AssertionError"), scripts[
        str(result.repro)
    ]
    fixed = str(result.repro.with_name("repro_fixed.py"))
    assert scripts[fixed] == "passed", scripts[fixed]
    # the workspace: the profile reads back, the report names the pass
    profile = DebugProfile.load(result.workspace / "profile.yaml")
    assert profile.verdict == "diverged" and profile.divergence.pass_name == d.pass_name
    assert d.pass_name in result.report.read_text()


def test_ref_and_inputs_are_refused_for_an_op_target(tmp_path):
    # an op carries its own reference and inputs: --ref on one is named, not a "no op" error
    for extra in (["--ref", "softmax"], ["--inputs", "rows"]):
        got = CliRunner().invoke(app, ["debug", "rms_norm", *extra, "--out", str(tmp_path)],
                                 env={"COLUMNS": "300"})  # fmt: skip
        assert got.exit_code == 2, got.output
        assert f"{extra[0]} applies to a package.module:function target" in got.output
    # a path that does not exist is named as such, not as an unknown op
    missing = tmp_path / "nope" / "config.json"
    got = CliRunner().invoke(app, ["debug", str(missing)], env={"COLUMNS": "300"})
    assert got.exit_code == 2 and f"{missing}: no such file or directory" in got.output


def test_a_path_that_is_no_model_or_created_op_is_named_as_such(tmp_path):
    # a directory without config.json (or a file that is neither): what it lacks, not "no op"
    for path in (tmp_path, tmp_path / "notes.txt"):
        (tmp_path / "notes.txt").write_text("mine")
        got = CliRunner().invoke(app, ["debug", str(path), "--yes"], env={"COLUMNS": "300"})
        assert got.exit_code == 2, got.output
        assert "is neither a model" in got.output and "no op" not in got.output, got.output


def test_an_unknown_ref_op_is_a_usage_error(tmp_path):
    # --ref naming no registry op: one line naming it and the known ops, exit 2 (not 1, which
    # says a divergence was localised), before any probe runs
    for ref, hint in (("nope", "Known: "), ("rms_nrom", "Did you mean 'rms_norm'?")):
        got = CliRunner().invoke(
            app,
            ["debug", "debug_planted:relu_squared_tail_tiles", "--ref", ref, "--yes",
             "--out", str(tmp_path)],
            env={"COLUMNS": "300"},
        )  # fmt: skip
        assert got.exit_code == 2, got.output
        assert f"no op {ref!r}" in got.output and hint in got.output
        assert "Traceback" not in got.output and not (tmp_path / "profile.yaml").exists()


def test_dtype_and_backend_are_checked_for_an_op_target(tmp_path):
    # the op's bisection probes float32, bfloat16 and float16: another dtype is refused, every
    # spelling of those is taken (the plan stops for review: nothing runs)
    def debug(*extra):
        return CliRunner().invoke(app, ["debug", "rms_norm", *extra, "--out", str(tmp_path)],
                                  env={"COLUMNS": "300"})  # fmt: skip

    got = debug("--dtype", "int8", "--yes")
    assert got.exit_code == 2, got.output
    assert "'int8': one of" in got.output and "bf16" in got.output and "fp16" in got.output
    for spelled in ("bf16", "float16", "fp32"):
        got = debug("--dtype", spelled, "--force")
        assert got.exit_code == 0 and "Plan:" in got.output, got.output
    # without --compiled nothing is compiled: --backend is refused, named as such
    for backend in ("foo", "inductor"):
        got = debug("--backend", backend, "--yes")
        assert got.exit_code == 2, got.output
        assert "--backend applies with --compiled only" in got.output


def test_localisation_rate(corpus):
    results, _ = corpus
    missed = {b.name: localised(b, results[b.name].profile) for b in planted.BUGS}
    missed = {k: v for k, v in missed.items() if v}
    rate = 1 - len(missed) / len(planted.BUGS)
    print(f"\nlocalised {len(planted.BUGS) - len(missed)}/{len(planted.BUGS)} = {rate:.0%}")
    assert rate >= GOAL, missed


def test_a_repro_runs_on_its_own(corpus):
    results, _ = corpus
    repro = results["rms_norm_no_offset"].repro
    proc = subprocess.run(
        [sys.executable, str(repro)], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert proc.returncode != 0
    said = "AssertionError: the op differs from its fp32 reference beyond the float32 tolerance"
    assert f"{said} in: forward (" in proc.stderr
    assert "FAIL forward" in proc.stdout


# --------------------------------------------------------------------------- the clean library


def test_the_clean_library_op_has_no_divergence(tmp_path):
    result = CliRunner().invoke(app, ["debug", "rms_norm", "--yes", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "no divergence" in result.output
    profile = DebugProfile.load(tmp_path / "profile.yaml")
    assert profile.verdict == "no divergence" and profile.divergence is None
    assert profile.tolerance_source == "tests/test_rms_norm.py: TOL"
    assert profile.tolerances["bfloat16"].fwd == pytest.approx(1.4e-2)
    assert not (tmp_path / "repro.py").exists()
    # every axis was probed, at every dtype, and every launch-table row
    axes = {p.axis for p in profile.probes}
    assert axes == {"dtype", "case", "shape", "layout", "values", "config"}
    assert {p.dtype for p in profile.probes} == {"float32", "bfloat16", "float16"}
    configs = [p.value for p in profile.probes if p.axis == "config"]
    assert any(v.startswith("table fwd row 1") for v in configs)
    assert any(v.startswith("forced bwd") for v in configs)
    assert "No divergence" in (tmp_path / "report.md").read_text()


# --------------------------------------------------------------------------- checkpoints


def test_review_stop_edit_and_resume(tmp_path):
    runner = CliRunner()
    target = "debug_planted:rms_norm_no_offset"
    args = ["debug", target, "--ref", "rms_norm", "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "--resume" in result.output
    path = tmp_path / "profile.yaml"
    profile = DebugProfile.load(path)
    assert profile.verdict == "pending" and not profile.probes
    assert [c.label for c in profile.cases] == [
        "rms_norm_no_offset (llama)",
        "rms_norm_no_offset (gemma)",
    ]
    # a reviewer narrows the plan
    data = yaml.safe_load(path.read_text())
    data.update(shapes=["pow2"], layouts=["contiguous"], values=["normal"], configs=[])
    data["dtypes"] = ["float32"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # a re-run without --force keeps the edited plan
    kept = runner.invoke(app, args)
    assert kept.exit_code == 2 and (tmp_path / "profile.new.yaml").exists()
    assert DebugProfile.load(path).configs == []

    result = runner.invoke(app, ["debug", target, "--resume", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    profile = DebugProfile.load(path)
    assert {p.axis for p in profile.probes} == {"dtype", "case"}
    assert len(profile.probes) == 2  # float32 base, the gemma case
    assert profile.divergence.case == "rms_norm_no_offset (gemma)"
    assert (tmp_path / "repro.py").exists()


def test_a_workspace_of_other_files_is_refused_before_any_work(tmp_path, monkeypatch):
    # debug replaces profile.yaml and report.md and removes repro.py before bisecting: in a
    # folder it did not write, that would lose a person's files
    def debug(*args):
        return CliRunner().invoke(app, ["debug", *map(str, args)], env={"COLUMNS": "300"})

    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("repro.py", "report.md"):
        (mine / name).write_text(f"my {name}")
    for args in (["rms_norm", "--yes"], ["llama"]):  # an op, a model: refused before it is built
        got = debug(*args, "--out", mine)
        assert got.exit_code == 2, got.output
        line = f"{mine} holds files debug did not write (report.md, repro.py): give another --out"
        assert got.output.count("\n") == 1 and line in got.output and "--force" in got.output
        assert sorted(p.name for p in mine.iterdir()) == ["report.md", "repro.py"]
    from kernelwright.profiles.workspace import WorkspaceError
    from kernelwright.workflows.debug.compiled import debug_compiled

    with pytest.raises(WorkspaceError, match="did not write"):
        debug_compiled("llama", workspace=mine)
    # the default workspace alike
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "kernelwright-runs" / "debug" / "rms_norm"
    default.mkdir(parents=True)
    (default / "notes.txt").write_text("mine")
    got = debug("rms_norm")
    assert got.exit_code == 2 and "did not write (notes.txt)" in got.output, got.output
    # another workflow's profile (optimize's, its digest beside it) is not debug's either
    (default / "notes.txt").unlink()
    (default / "profile.yaml").write_text("op: rms_norm\ngoal: speed\n")
    reviewed.adopt(default / "profile.yaml")
    got = debug("rms_norm")
    assert got.exit_code == 2 and "did not write (.profile.yaml.sha256, profile.yaml)" in got.output
    # --force runs there (the plan stops for review: nothing of mine is removed yet)
    got = debug("rms_norm", "--out", mine, "--force")
    assert got.exit_code == 0 and (mine / "repro.py").read_text() == "my repro.py", got.output
    # an earlier debug run's workspace is debug's own: a new run replaces its outputs
    ws = tmp_path / "ws"
    for _ in range(2):
        got = debug("rms_norm", "--out", ws)
        assert got.exit_code == 0 and "Plan:" in got.output, got.output
    # a plan written by hand may be resumed alone in its folder, not beside others' files
    hand = tmp_path / "hand"
    hand.mkdir()
    (hand / "profile.yaml").write_text((ws / "profile.yaml").read_text())
    (hand / "report.md").write_text("mine")
    got = debug("rms_norm", "--resume", "--out", hand)
    assert got.exit_code == 2 and "did not write (report.md)" in got.output, got.output
    assert (hand / "report.md").read_text() == "mine"


def test_unknown_targets_are_refused():
    result = CliRunner().invoke(app, ["debug", "rms_nrom", "--yes"])
    assert result.exit_code == 2
    assert "rms_norm" in result.output
    with pytest.raises(TargetError, match="no inputs maker matches"):
        plan("debug_planted:_regrad", ref="kernelwright.ops.rms_norm:rms_norm_ref")
    with pytest.raises(TargetError, match="registers no inputs"):
        plan("moe_experts")


# --------------------------------------------------------------------------- other targets


def test_a_function_with_its_own_reference():
    # a Triton kernel of its own; the reference named explicitly, the inputs maker chosen
    # from its argument names (x)
    profile = plan(
        "debug_planted:relu_squared_tail_tiles",
        ref="kernelwright.ops.relu_squared:relu_squared_ref",
    )
    assert profile.kind == "function" and profile.launch_table is None
    assert profile.cases[0].inputs == "kernelwright.testing.cases:x"
    assert profile.tolerance_source.endswith("DEFAULT_TOLERANCES")
    assert profile.sys_path == [str(TESTS)]
    profile.layouts, profile.values = ["contiguous"], ["normal"]
    bisect(profile, lambda _: None)
    d = profile.divergence
    assert d.pass_name == "forward" and "tail" in d.regime["shape"]
    assert "pow2" not in d.regime["shape"]
    assert d.minimal_shape[-1] < 16  # the tile is 16 columns: a shorter row never writes


def test_a_package_in_the_current_directory_imports(tmp_path, monkeypatch):
    # `kernelwright debug mypkg.ops:my_norm --ref rms_norm` run beside mypkg/, as `python -m`
    # would import it: no PYTHONPATH
    pkg = package_beside_cwd(tmp_path, monkeypatch, "kw_cwd_debug_pkg")
    (pkg / "ops.py").write_text(
        "from kernelwright.ops.rms_norm import rms_norm_ref\n\n\n"
        "def my_norm(x, weight, eps=1e-6, **kwargs):\n"
        "    return rms_norm_ref(x, weight, eps, **kwargs)\n"
    )
    profile = plan("kw_cwd_debug_pkg.ops:my_norm", ref="rms_norm")
    assert profile.kind == "function"
    assert profile.sys_path == [str(tmp_path)]  # for the repro and a resumed run
    assert {c.function for c in profile.cases} == {"kw_cwd_debug_pkg.ops:my_norm"}
    assert str(tmp_path) not in sys.path  # on it for the import alone
    with pytest.raises(TargetError, match="cannot import 'kw_no_such_pkg.ops': No module named"):
        plan("kw_no_such_pkg.ops:f", ref="rms_norm")


CREATED_OP = '''
"""A stand-in for an op made by `kernelwright create` (its module's exports and BENCH)."""
import torch

from kernelwright.ops.relu_squared import relu_squared as _lib

__all__ = ["Scaled", "scaled", "scaled_ref"]
BENCH = {
    "inputs": [("x", "full", (4, 96), True, "same")],
    "n_outputs": 1,
    "sweep": [{"rows": 4, "cols": 96}],
    "layout": [(4, 96), (1,), ("full",), False, None],
}


class Scaled(torch.nn.Module):
    def forward(self, x):
        return scaled(x)


def scaled(x):
    y = _lib(x)
    return y * 1.5 if x.shape[-1] % 2 else y  # wrong for odd rows


def scaled_ref(x):
    return torch.relu(x.float()) ** 2
'''


def test_a_created_op_in_its_workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pkg = tmp_path / "kernelwright-runs" / "create" / "scaled" / "pkg" / "scaled"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scaled.py").write_text(CREATED_OP)
    monkeypatch.setattr(sys, "path", list(sys.path))  # plan() puts the workspace on it
    profile = plan("scaled")
    assert profile.kind == "created"
    assert plan("kernelwright-runs/create/scaled").cases == profile.cases  # by its folder
    assert profile.cases[0].inputs == "bench:scaled.scaled"
    profile.layouts, profile.values = ["contiguous"], ["normal"]
    bisect(profile, lambda _: None)
    d = profile.divergence
    assert d.pass_name == "forward" and "tail" in d.regime["shape"]
    assert "pow2" not in d.regime["shape"] and "many_rows" not in d.regime["shape"]
    assert d.minimal_shape[-1] % 2 == 1
