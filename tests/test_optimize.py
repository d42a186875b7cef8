"""The optimize workflow end to end, on the CPU: a dry run of rms_norm (interpreter correctness,
placeholder timings from the launch-config model), the review stop and resume, Finalize's gate
and revert, the planted-regression recovery under the model, and the command line.

The timings here are the FakeClock's: these tests check the plumbing and the loop's logic, not
speed. Shapes are the bench spec's interpreter sweep (64 x 256/512) and 37-row smoke shapes.
"""

from __future__ import annotations

import copy
import csv
import re
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kernelwright.cli import app
from kernelwright.profiles.optimization import OptimizationProfile, VariantRecord
from kernelwright.runtime.launch import LaunchConfig as C
from kernelwright.runtime.tables import rms_norm as rms_table
from kernelwright.workflows.optimize import (
    GateResult,
    OptimizeOptions,
    PreflightError,
    notebook,
    optimize,
)
from kernelwright.workflows.optimize import loop as loop_mod
from kernelwright.workflows.optimize.finalize import finalize
from kernelwright.workflows.optimize.planted import RECOVERY_GOAL_PCT, run_planted
from kernelwright.workflows.optimize.setup import preflight
from kernelwright.workflows.optimize.tables import arch_rows, from_profile, regime_index

OP = "rms_norm"
# tiny shapes on every device; gpu="hopper" makes the placeholder clock and the tuned table key
# the same on a CPU and on a GPU machine, so the numbers (and the tests) are too
SHAPES = [{"tokens": 64, "hidden": 256}, {"tokens": 64, "hidden": 512}]
DRY = dict(dry_run=True, gpu="hopper", shapes=SHAPES)
TABLE_FILE = Path(rms_table.__file__)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One autonomous dry run; the library table file and the in-process table are recorded
    before it, to prove it touches neither."""
    ws = tmp_path_factory.mktemp("optimize") / "ws"
    before_file = TABLE_FILE.read_bytes()
    before_table = copy.deepcopy(rms_table.TABLE)
    lines: list[str] = []
    result = optimize(OptimizeOptions(OP, yes=True, workspace=ws, max_variants=3, **DRY),
                      progress=lines.append)  # fmt: skip
    result.progress_lines = lines  # what the console showed
    return result, before_file, before_table


def test_dry_run_end_to_end(dry_run):
    result, _, _ = dry_run
    ws = result.workspace
    assert result.stage == "done"
    # every time on the console says it is a placeholder (the baseline's and the variants')
    timed = [line for line in result.progress_lines if line.endswith(" ms (placeholder)")]
    assert timed and not [line for line in result.progress_lines if line.endswith(" ms")]
    assert any(line.lstrip().startswith("v1 ") for line in timed)
    for name in ("profile.yaml", "profile.md", "comparison.md", "report.md", "v0_bench.csv"):
        assert (ws / name).exists(), name
    assert (ws / "snapshot" / f"{OP}_table.py").read_bytes() == TABLE_FILE.read_bytes()
    assert 1 <= len(result.records) <= 3
    first = result.records[0]
    assert first.strategy == "launch_sweep"
    for r in result.records:
        for suffix in (".json", "_notes.md", "_table.py"):
            assert (ws / f"v{r.version}{suffix}").exists()
    assert list((ws / "plots").glob("*.png"))
    # the default interpreter entry is far from the model's optimum: the sweep must win
    assert first.verdict == "accepted" and first.gain_pct > 1.0
    assert result.final.winner is not None
    assert (ws / "proposed_table.py").exists()


def test_dry_run_is_marked_placeholder_everywhere(dry_run):
    result, _, _ = dry_run
    ws = result.workspace
    assert result.profile.placeholder
    for name in ("profile.md", "comparison.md", "report.md"):
        assert "PLACEHOLDER" in (ws / name).read_text(), name
    for r in result.records:
        assert r.placeholder
        assert "PLACEHOLDER" in (ws / f"v{r.version}_notes.md").read_text()
    for f in ws.glob("*_bench.csv"):
        with f.open() as fh:
            timings = {row["timing"] for row in csv.DictReader(fh)}
        assert timings == {"placeholder"}, f.name


def test_dry_run_report_says_nothing_was_applied_and_repeats_nothing(dry_run):
    result, _, _ = dry_run
    ws = result.workspace
    report = (ws / "report.md").read_text()
    assert "## Table (dry run: not applied)" in report and "## Table applied" not in report
    assert str(2**31 - 1) not in report  # the open-ended last row reads as ∞
    for name, start in (("report.md", "# optimize"), ("profile.md", "- ")):  # the device line
        line = next(x for x in (ws / name).read_text().splitlines() if x.startswith(start))
        words = re.findall(r"\w+", line.replace("`hopper` table entry", "").lower())
        assert len(words) == len(set(words)), line
    # tuning the device's own entry (the default): its name once, and no empty Plots section
    own = result.profile.model_copy(update={"arch": result.profile.device_arch})
    text = notebook.report_md(own, result.records, stop="x", winner=result.final.winner,
                              applied="", plots=[])  # fmt: skip
    words = re.findall(r"\w+", text.splitlines()[0].lower())
    assert len(words) == len(set(words)) and "## Plots" not in text, text.splitlines()[0]
    for r in result.records:
        notes = (ws / f"v{r.version}_notes.md").read_text()
        assert notes.startswith(f"# v{r.version}: {r.strategy} — ")
        assert not [x for x in notes.splitlines() if x.count("over v0") > 1], r.version


def test_dry_run_leaves_the_library_alone(dry_run):
    _, before_file, before_table = dry_run
    assert TABLE_FILE.read_bytes() == before_file
    assert before_table == rms_table.TABLE


def test_profile_yaml_round_trips(dry_run):
    result, _, _ = dry_run
    path = result.workspace / "profile.yaml"
    loaded = OptimizationProfile.load(path)
    assert loaded.to_yaml() == path.read_text()
    assert loaded.bottleneck.cls == result.profile.bottleneck.cls
    assert [s.name for s in loaded.strategies][0] == "launch_sweep"
    bad = path.read_text().replace("schema_version: 1", "schema_version: 99")
    with pytest.raises(ValueError, match="schema_version 99"):
        OptimizationProfile.from_yaml(bad)


def test_notebooks_round_trip_and_hold_the_table(dry_run):
    result, _, _ = dry_run
    again = loop_mod.read_records(result.workspace)
    assert [r.model_dump_json() for r in again] == [r.model_dump_json() for r in result.records]
    winner = result.final.winner
    assert from_profile(winner.table) == result.final.rows


def test_review_stop_then_resume(tmp_path):
    ws = tmp_path / "ws"
    first = optimize(OptimizeOptions(OP, workspace=ws, max_variants=1, **DRY))
    assert first.stage == "review"
    assert (ws / "profile.yaml").exists() and not (ws / "v1.json").exists()
    # a reviewer edits the profile: the budget is read back from it on resume
    profile = OptimizationProfile.load(ws / "profile.yaml")
    profile.max_variants = 1
    profile.save(ws / "profile.yaml")
    resumed = optimize(OptimizeOptions(OP, dry_run=True, workspace=ws, resume=True, yes=True))
    assert resumed.stage == "done"
    assert len(resumed.records) == 1
    assert "budget" in resumed.stop_reason


def test_resume_says_which_options_the_profile_holds(tmp_path):
    # with --resume the reviewed profile holds the budget, goal, ...: a value given on the
    # command line is named as ignored, not dropped silently
    from typer.testing import CliRunner

    from kernelwright.cli import app

    args = ["optimize", OP, "--resume", "--dry-run", "--out", str(tmp_path / "none")]
    got = CliRunner().invoke(app, [*args, "--max-variants", "2", "--goal", "memory"],
                             env={"COLUMNS": "200"})  # fmt: skip
    assert "--goal, --max-variants ignored with --resume" in got.output, got.output
    got = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert "ignored with --resume" not in got.output


def test_no_gpu_without_dry_run_is_a_clear_stop(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PreflightError, match="no CUDA GPU.*--dry-run"):
        preflight(OptimizeOptions(OP))


def test_preflight_names_what_is_missing():
    with pytest.raises(PreflightError, match="no op 'nope'"):
        preflight(OptimizeOptions("nope", dry_run=True))
    with pytest.raises(PreflightError, match="cannot read target"):
        preflight(OptimizeOptions(OP, dry_run=True, target="fast please"))


def test_failing_smoke_test_discards_the_variant(tmp_path, monkeypatch):
    # a sweep that proposes an illegal block size (not a power of two): the kernels fail to
    # build, so the smoke test fails and the variant is discarded without a benchmark
    def broken_sweep(setup, rows, progress):
        bad = {k: [(m, c.with_(block_n=96)) for m, c in v] for k, v in rows.items()}
        return loop_mod.SweepResult(bad, [], [])

    monkeypatch.setattr(loop_mod, "launch_sweep", broken_sweep)
    ws = tmp_path / "ws"
    result = optimize(OptimizeOptions(OP, yes=True, workspace=ws, max_variants=1, **DRY))
    (v1,) = result.records
    assert v1.verdict == "discarded" and not v1.smoke_passed
    assert "FAIL" in v1.smoke_detail
    assert not v1.measured and not (ws / "v1_bench.csv").exists()
    assert result.final.winner is None


def _setup_with_table_copy(tmp_path, gate_passes: bool):
    table_copy = tmp_path / "rms_norm_table.py"
    shutil.copyfile(TABLE_FILE, table_copy)
    calls = []

    def gate():
        calls.append(table_copy.read_text())  # what the tests would have imported
        return GateResult(gate_passes, "simulated gate")

    opts = OptimizeOptions(
        OP, yes=True, workspace=tmp_path / "ws", table_path=table_copy, gate=gate, **DRY
    )
    setup = preflight(opts)
    setup.workspace.mkdir(parents=True)
    setup.placeholder = False  # as on a GPU: Finalize writes the library table
    return setup, table_copy, calls


def _winner_record(setup) -> VariantRecord:
    rows = arch_rows(setup.table, setup.kernels, setup.arch)
    new = {k: [(m, c.with_(num_warps=2)) for m, c in v] for k, v in rows.items()}
    from kernelwright.workflows.optimize.tables import to_profile

    return VariantRecord(
        version=1,
        strategy="fewer_warps",
        addresses="any",
        parent=0,
        placeholder=False,
        hypothesis="h",
        change=["c"],
        expected="e",
        table=to_profile(new),
        smoke_passed=True,
        verdict="accepted",
        gain_pct=5.0,
    )


@pytest.mark.parametrize("gate_passes", [False, True])
def test_finalize_gate_keeps_or_reverts_the_table(tmp_path, gate_passes):
    setup, table_copy, calls = _setup_with_table_copy(tmp_path, gate_passes)
    original = table_copy.read_bytes()
    before = copy.deepcopy(setup.table)
    profile = OptimizationProfile.load(
        _profile_for(setup, tmp_path)  # a profile with the baseline table
    )
    winner = _winner_record(setup)
    try:
        final = finalize(setup, profile, [winner], "test", lambda _: None)
        assert len(calls) == 1 and f'"{setup.arch}": [' in calls[0]  # the gate saw the new table
        assert "num_warps=2" in calls[0]
        if gate_passes:
            assert final.library_written and table_copy.read_bytes() != original
            assert setup.table["fwd"][setup.arch] == from_profile(winner.table)["fwd"]
            assert "## Table applied" in (setup.workspace / "report.md").read_text()
        else:
            assert "REVERTED" in final.applied
            assert table_copy.read_bytes() == original  # byte for byte
            assert setup.table == before
            report = (setup.workspace / "report.md").read_text()
            assert "REVERTED" in report and "## Table (not applied)" in report
        assert (setup.workspace / "table_backup.py").read_bytes() == original
    finally:
        setup.table.clear()
        setup.table.update(before)


def _profile_for(setup, tmp_path):
    from kernelwright.workflows.optimize.profile_stage import run_profile

    run_profile(setup, lambda _: None)
    return setup.workspace / "profile.yaml"


def test_planted_regression_is_recovered_under_the_model(tmp_path):
    # realistic shapes: the model needs no kernel run (execute=False); the smoke tests still
    # run every variant through the kernels on 37-row shapes
    shapes = [{"tokens": 8192, "hidden": h} for h in (1024, 4096, 16384)]
    before = copy.deepcopy(rms_table.TABLE)
    rows = run_planted(OP, shapes, tmp_path / "ws", dry_run=True, execute=False)
    assert before == rms_table.TABLE  # planted and restored in-process only
    assert {r.timing for r in rows} == {"placeholder"}
    assert rows[0].variants <= 8
    # the plant must hurt (else recovery proves nothing), and the loop must win it back
    assert max(r.planted_ms / r.tuned_ms for r in rows) > 2.0
    assert all(r.recovered_pct >= RECOVERY_GOAL_PCT for r in rows), rows


def test_dry_runs_are_deterministic(tmp_path):
    shapes = [{"tokens": 4096, "hidden": h} for h in (1024, 8192)]
    runs = []
    for i in range(2):
        opts = OptimizeOptions(
            OP,
            yes=True,
            dry_run=True,
            workspace=tmp_path / f"ws{i}",
            shapes=shapes,
            execute=False,
            gpu="hopper",
            max_variants=4,
        )
        result = optimize(opts)
        runs.append([(r.strategy, r.verdict, r.table) for r in result.records])
    assert runs[0] == runs[1]


def test_sweep_only_changes_measured_regimes(dry_run):
    result, _, _ = dry_run
    base = from_profile(result.profile.baseline_table)
    swept = from_profile(result.records[0].table)
    measured = [s["hidden"] for s in SHAPES]
    for k in base:
        assert [m for m, _ in swept[k]] == [m for m, _ in base[k]]  # regime bounds are kept
        hit = {regime_index(base[k], n) for n in measured}
        for i, row in enumerate(base[k]):
            if i not in hit:
                assert swept[k][i] == row, (k, i)


def test_cli_dry_run_review_stop_and_no_gpu_message(tmp_path, monkeypatch):
    runner = CliRunner()
    ws = tmp_path / "ws"
    # rich wraps the messages at the console's width, which depends on where pytest runs
    flat = lambda res: " ".join(res.output.split())  # noqa: E731
    res = runner.invoke(app, ["optimize", OP, "--dry-run", "--quick", "--out", str(ws)])
    assert res.exit_code == 0, res.output
    assert "--resume --yes --dry-run" in flat(res)
    assert (ws / "profile.yaml").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = runner.invoke(app, ["optimize", OP, "--out", str(ws)])
    assert res.exit_code == 2
    assert "no CUDA GPU" in flat(res)


def test_launch_sweep_candidates_are_legal():
    cur = C(block_n=1024, rows=4, num_warps=4)
    cands = loop_mod.candidates(cur, 1024, 700, {"block_n", "num_warps", "rows"})
    assert cands and cur not in cands
    for c in cands:
        assert c.block_n == 1024  # fits every row length the table row serves
        assert c.rows & (c.rows - 1) == 0 and c.num_warps & (c.num_warps - 1) == 0
        assert 2 <= c.block_n * c.rows / (c.num_warps * 32) <= 128
    long = loop_mod.candidates(C(block_n=16384), 16384, 16384, {"block_n", "num_warps"})
    assert {c.block_n for c in long} == {16384, 8192, 4096}  # the looped kernel is a candidate
    assert all(c.rows == 1 for c in long)  # rows is not varied by this table: left alone


def test_measured_path_through_the_harness_is_not_placeholder(tmp_path):
    # what a GPU run does, with the device's own timer instead of the placeholder clock
    from kernelwright.bench.harness import cuda_timer, interpreter_timer
    from kernelwright.workflows.optimize.measure import Bench
    from kernelwright.workflows.optimize.profile_stage import run_profile

    setup = preflight(OptimizeOptions(OP, workspace=tmp_path / "ws", ncu=False, **DRY))
    on_gpu = setup.device.type == "cuda"
    timer = cuda_timer(warmup_ms=1, rep_ms=2) if on_gpu else interpreter_timer(reps=1)
    setup.bench = Bench(setup.spec, ctx=setup.ctx, timer=timer, dtype=setup.dtype)
    setup.placeholder, setup.clock = False, None
    profile = run_profile(setup, lambda _: None)
    assert (
        not profile.placeholder
        and "PLACEHOLDER" not in (setup.workspace / "profile.md").read_text()
    )
    assert {t.mode for t in profile.baseline} == {"forward", "backward"}
    assert all(t.ms_p50 > 0 and not t.error for t in profile.baseline)
    with (setup.workspace / "v0_bench.csv").open() as fh:
        assert {row["timing"] for row in csv.DictReader(fh)} == {setup.ctx.timing}
    if on_gpu:  # the compiler's report of the kernels the baseline launched
        assert profile.resources and all(k.registers_per_thread > 0 for k in profile.resources)
    else:
        assert "interpreter" in profile.resources_note


def test_target_stops_the_loop_and_adds_its_point(tmp_path):
    # already met by the baseline: no variant is run
    opts = OptimizeOptions(
        OP, yes=True, workspace=tmp_path / "a", target="forward < 1000 ms at 64x256", **DRY
    )
    result = optimize(opts)
    assert result.records == [] and result.stop_reason.startswith("target met")
    # a shape and a mode outside the sweep are added to what every variant measures
    opts = OptimizeOptions(
        OP,
        yes=True,
        workspace=tmp_path / "b",
        target="full < 1 us at 32x256",
        max_variants=1,
        execute=False,
        **DRY,
    )
    result = optimize(opts)
    keys = {(t.shape, t.mode) for t in result.profile.baseline}
    assert ("32x256", "full") in keys and ("64x512", "backward") in keys
    assert "budget" in result.stop_reason  # 1 us is out of reach: the budget stops it


def test_memory_goal_runs_on_modelled_memory(tmp_path):
    opts = OptimizeOptions(
        OP, yes=True, goal="memory", workspace=tmp_path / "ws", max_variants=2, **DRY
    )
    result = optimize(opts)
    assert result.profile.goal == "memory"
    assert all(r.verdict in ("accepted", "rejected") for r in result.records)
    for r in result.records:
        if r.measured:  # the time is the non-target metric: guarded at +5%
            assert any("(time)" in c.name for c in r.guardrails)


def test_a_smoke_test_failing_on_the_unchanged_table_stops_stage_1(tmp_path, monkeypatch):
    from kernelwright.ops import rms_norm as ops_mod

    def wrong_ref(x, weight=None, eps=1e-6, **kw):
        return 2 * ops_mod.rms_norm_ref(x, weight, eps, **kw)

    monkeypatch.setattr(ops_mod, "rms_norm_ref", wrong_ref)
    with pytest.raises(PreflightError, match="smoke test fails on the unchanged table"):
        optimize(OptimizeOptions(OP, yes=True, workspace=tmp_path / "ws", **DRY))


@pytest.mark.gpu
def test_gpu_run_measures_for_real(tmp_path):
    # the path the CPU suite cannot take: CUDA-event timings, the compiler's resource report,
    # a real sweep; one shape and the forward alone keep it to a few seconds of GPU time
    from kernelwright.bench.harness import cuda_timer

    opts = OptimizeOptions(
        OP,
        yes=True,
        scope="forward",
        shapes=[{"tokens": 4096, "hidden": 4096}],
        max_variants=2,
        workspace=tmp_path / "ws",
        write_library=False,
        ncu=False,
        timer=cuda_timer(warmup_ms=2, rep_ms=10, hide_host=True),
    )
    before = TABLE_FILE.read_bytes()
    result = optimize(opts)
    assert TABLE_FILE.read_bytes() == before
    assert not result.profile.placeholder and result.profile.arch != "interpreter"
    assert result.profile.resources, result.profile.resources_note
    assert result.records[0].strategy == "launch_sweep"
    assert (result.workspace / "v1_sweep.csv").exists()
    with (result.workspace / "v0_bench.csv").open() as fh:
        assert "placeholder" not in {row["timing"] for row in csv.DictReader(fh)}


def test_sweep_steps_the_l2_flags_where_rows_are_walked_twice(tmp_path):
    # softmax at 600000 columns takes the looped kernel (past the split rows): the sweep times
    # its table row with each L2 flag off and on (the placeholder clock models them as faster),
    # and keeps them on; the fused regime (5000 columns) and the split one (70000) read no
    # flag, so none is stepped there
    from kernelwright.runtime.tables import softmax as sm_table

    before = copy.deepcopy(sm_table.TABLE)
    opts = OptimizeOptions(
        "softmax",
        yes=True,
        workspace=tmp_path / "ws",
        max_variants=1,
        scope="forward",
        dry_run=True,
        gpu="hopper",
        shapes=[{"rows": 2, "n": 5000}, {"rows": 2, "n": 70000}, {"rows": 2, "n": 600000}],
    )
    result = optimize(opts)
    assert before == sm_table.TABLE
    with (result.workspace / "v1_sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    looped = [r for r in rows if r["max_n"] == str(2**31 - 1)]
    fused = [r for r in rows if r["max_n"] == "8192"]
    split = [r for r in rows if r["max_n"] == "524288"]
    assert looped and fused and split
    for flag in ("evict_hints", "reverse_pass"):
        assert any(flag in r["config"] for r in looped)
        assert any(flag not in r["config"] for r in looped)
        assert not any(flag in r["config"] for r in fused + split)
    kept = [r["config"] for r in looped if r["kept"] == "True"]
    assert len(kept) == 1 and "evict_hints" in kept[0] and "reverse_pass" in kept[0]


def test_smoke_shapes_cap_the_elements_but_keep_an_odd_row_count():
    # under the interpreter a 600,000-column row costs seconds: fewer rows there, never under
    # 3 and always odd (a partial last block of rows); short rows keep the full count
    from kernelwright.bench import SPECS
    from kernelwright.workflows.optimize.measure import Point, smoke_shapes

    spec = SPECS["softmax"]
    points = [Point("n", n, {"rows": 2, "n": n}, f"2x{n}") for n in (5000, 70000, 600000)]
    full = smoke_shapes(spec, points, rows=37)
    assert [s["rows"] for s in full] == [37, 37, 37]
    capped = smoke_shapes(spec, points, rows=37, max_elements=1 << 19)
    assert [s["n"] for s in capped] == [5000, 70000, 600000]
    assert [s["rows"] for s in capped] == [37, 7, 3]


def test_a_new_run_loses_nothing_in_its_workspace(dry_run, tmp_path):
    # a folder of the person's own files is refused (optimize would have removed report.md)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my thesis")
    with pytest.raises(PreflightError, match="did not write .*report.md.*--force"):
        optimize(OptimizeOptions(OP, workspace=mine, **DRY))
    assert (mine / "report.md").read_text() == "my thesis"
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(PreflightError, match="is a file"):
        optimize(OptimizeOptions(OP, workspace=afile, **DRY))
    # a finished run's report, notebooks and proposed table stay unless --force
    ws = tmp_path / "ws"
    shutil.copytree(dry_run[0].workspace, ws)
    report = (ws / "report.md").read_text()
    with pytest.raises(PreflightError, match=r"earlier run \(v1.*--resume --yes.*--force"):
        optimize(OptimizeOptions(OP, workspace=ws, **DRY))
    assert (ws / "report.md").read_text() == report and (ws / "v1.json").exists()
    again = optimize(OptimizeOptions(OP, workspace=ws, force=True, **DRY))
    assert again.stage == "review" and not (ws / "report.md").exists()


def test_resume_names_a_bad_profile_instead_of_a_traceback(tmp_path):
    ws = tmp_path / "ws"
    assert optimize(OptimizeOptions(OP, workspace=ws, max_variants=1, **DRY)).stage == "review"
    path = ws / "profile.yaml"
    good = path.read_text()
    resume = OptimizeOptions(OP, dry_run=True, workspace=ws, resume=True, yes=True)
    path.write_text(good.replace("goal: speed", "goal: fast"))
    with pytest.raises(PreflightError, match="--resume: .*goal"):
        optimize(resume)
    path.write_text(good)
    profile = OptimizationProfile.load(path)  # a typo in a strategy's name, listed first
    profile.strategies.insert(
        0, profile.strategies[0].model_copy(update={"name": "bogus_strategy"})
    )
    profile.save(path)
    with pytest.raises(PreflightError, match="strategies that do not exist: bogus_strategy"):
        optimize(resume)


def test_cross_entropys_backward_kernel_is_tuned_as_a_backward_one():
    # the scope and the sweep's timing mode come from the kernel's name
    from kernelwright.runtime.tables import cross_entropy as ce_table
    from kernelwright.workflows.optimize.clock import is_backward_kernel

    assert [k for k in ce_table.TABLE if is_backward_kernel(k)] == ["bwd_scale"]


def test_a_dry_runs_gpu_sized_target_is_modelled_not_interpreted(tmp_path):
    # on the interpreter, 8192x4096 would run for hours: its time is modelled, the rest runs
    opts = OptimizeOptions(OP, yes=True, workspace=tmp_path / "ws", max_variants=1,
                           target="full < 0.3 ms at 8192x4096", **DRY)  # fmt: skip
    result = optimize(opts)
    assert result.stage == "done" and "target met" in result.stop_reason
    rows = list(csv.DictReader((tmp_path / "ws" / "v0_bench.csv").open()))
    assert {r["shape"] for r in rows} >= {"8192x4096", "64x256"}
