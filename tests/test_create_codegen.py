"""create, Act + Verify: tier-1 profiles → generated Triton package → its tests pass."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from kernelwright.profiles.kernel import Graph, GraphNode, KernelProfile, TensorSpec
from kernelwright.workflows.create.codegen import UnsupportedNode, render

ROOT = Path(__file__).resolve().parents[1]


def _node(n) -> GraphNode:
    def conv(v):
        if isinstance(v, torch.fx.Node):
            return v.name
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, (int, float, bool, str)) or v is None:
            return v
        return str(v)

    target = n.target if n.op == "placeholder" else n.target
    return GraphNode(
        name=n.name,
        op=n.op,
        target=str(target)
        if n.op != "call_function"
        else f"aten.{n.target.__name__}"
        if not str(n.target).startswith("aten.")
        else str(n.target),
        args=[conv(a) for a in n.args],
        kwargs={k: conv(v) for k, v in n.kwargs.items()},
    )


def capture(name: str, fn, *shapes, params=()) -> KernelProfile:
    """A minimal stand-in for Understand: aot_function + core aten decompositions + min-cut."""
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._decomp import core_aten_decompositions

    graphs = {}

    def keep(key):
        def compiler(gm, _):
            graphs[key] = gm
            return make_boxed_func(gm)

        return compiler

    f = aot_function(
        fn,
        fw_compiler=keep("f"),
        bw_compiler=keep("b"),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=core_aten_decompositions(),
    )
    xs = [torch.randn(s, requires_grad=True) for s in shapes]
    y = f(*xs)
    y.sum().backward()
    full = list(shapes[0])
    specs = []
    for i, s in enumerate(shapes):
        s = list(s)
        kind = "full" if s == full else "scalar" if not s else "col" if s == full[-1:] else "row"
        specs.append(
            TensorSpec(
                name=f"x{i}" if i not in params else f"p{i}",
                role="parameter" if i in params else "input",
                example_shape=s,
                broadcast=kind,
                requires_grad=True,
            )
        )
    return KernelProfile(
        name=name,
        function_name=name,
        module_name="".join(p.title() for p in name.split("_")),
        source="tests/test_create_codegen.py",
        input_form="function",
        tier=1,
        tier_reason="element-wise",
        inputs=specs,
        outputs=[TensorSpec(name="y", role="output", example_shape=list(y.shape))],
        forward=Graph(nodes=[_node(n) for n in graphs["f"].graph.nodes]),
        backward=Graph(nodes=[_node(n) for n in graphs["b"].graph.nodes]),
    )


def _softmax(x):
    # spelled out: the core decompositions keep aten._softmax whole (Understand splits it)
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


CASES = {
    "relu_sq": (lambda x: torch.relu(x) ** 2, [(4, 8)], ()),
    "silu_gen": (torch.nn.functional.silu, [(4, 8)], ()),
    "swiglu_gen": (lambda g, u: torch.nn.functional.silu(g) * u, [(4, 8), (4, 8)], ()),
    "softcap_gen": (lambda x: 30.0 * torch.tanh(x / 30.0), [(4, 8)], ()),
    "dyt_gen": (lambda x, a, w, b: w * torch.tanh(a * x) + b, [(4, 8), (), (8,), (8,)], (1, 2, 3)),
    # tier 2, row kernels: a last-dim reduction with a per-feature parameter (its gradient a
    # sum over rows), softmax (max + sum), and one value per row as the output
    "rmsnorm_gen": (
        lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
        [(4, 8), (8,)],
        (1,),
    ),
    "softmax_gen": (lambda x: _softmax(x), [(4, 8)], ()),
    "lse_gen": (lambda x: torch.logsumexp(x, dim=-1), [(4, 8)], ()),
}


# one row kernel with a per-feature parameter and one with two row reductions in `make test`
# (an element-wise kernel's generated tests run there through test_cli_create_yes_relu_squared);
# the other families are marked slow (`make test-all`, the GPU suite)
FAMILIES = ("rmsnorm_gen", "softmax_gen")


@pytest.mark.parametrize(
    "case", [c if c in FAMILIES else pytest.param(c, marks=pytest.mark.slow) for c in sorted(CASES)]
)
def test_generated_kernel_passes_its_tests(case, tmp_path):
    from kernelwright.workflows.create.verify import verify

    fn, shapes, params = CASES[case]
    profile = capture(case, fn, *shapes, params=params)
    result = verify(profile, tmp_path)
    assert result.passed, result.attempts[-1].log.read_text()[-3000:]
    assert not profile.repairs


@pytest.mark.parametrize("case", ["dyt_gen", "lse_gen"])
def test_generation_is_deterministic(case):
    fn, shapes, params = CASES[case]
    a = render(capture(case, fn, *shapes, params=params))
    b = render(capture(case, fn, *shapes, params=params))
    assert a == b
    p = capture(case, fn, *shapes, params=params)
    assert render(KernelProfile.from_yaml(p.to_yaml())) == a  # through the reviewed YAML too


def test_unsupported_node_stops_with_its_name():
    profile = capture("fmod_gen", lambda x: torch.fmod(x, 0.7), (4, 8))
    with pytest.raises(UnsupportedNode, match=r"fmod.*no Triton lowering"):
        render(profile)


@pytest.mark.parametrize(
    "fn, shapes, match",
    [
        (lambda x: x.sum(0, keepdim=True) * x, [(4, 8)], r"only the last dim|reduces the last"),
        (lambda x: _softmax(torch.cumsum(x.flip(-1), -1) * x), [(4, 8)], r"flipped row comb"),
    ],
    ids=["reduce_rows", "flip_mixed"],
)
def test_row_kernel_stops_on_what_it_cannot_lower(fn, shapes, match):
    with pytest.raises(UnsupportedNode, match=match):
        render(capture("row_stop", fn, *shapes))


def test_row_kernel_reference_runs_at_any_row_length():
    # the traced graphs bake in the row length (mean's backward divides by 96): the kernel
    # takes the runtime N and the reference the runtime shape instead
    files = render(capture("rmsnorm_gen", CASES["rmsnorm_gen"][0], [3, 2, 96], [96], params=(1,)))
    op = files["rmsnorm_gen/rmsnorm_gen.py"]
    assert " / N" in op and "96" not in op.split("def rmsnorm_gen_ref")[1]
    assert (
        "tl.sum(tl.where(cmask" in op
        and "(3, 5, 96), (2, 100)" in files["rmsnorm_gen/test_rmsnorm_gen.py"]
    )


def test_unsupported_node_stops_the_workflow(tmp_path):
    from kernelwright.workflows.create.run import create

    path = capture("fmod_gen", lambda x: torch.fmod(x, 0.7), (4, 8)).save(tmp_path / "fmod.yaml")
    result = create(None, from_profile=path, runs=tmp_path / "runs")
    assert result.stage == "stopped" and "fmod" in (result.profile.unsupported_node or "")
    assert "no Triton lowering" in result.report.read_text()
    assert not (tmp_path / "runs" / "fmod_gen" / "pkg").exists()


def test_a_generator_failure_stops_instead_of_crashing(tmp_path, monkeypatch):
    """No input may end in a traceback: a failure inside the generator (a RecursionError on a
    deep graph, a bug) stops the workflow with the reason and keeps the traceback in a log."""
    from kernelwright.workflows.create import run as R

    def deep(profile, **kw):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(R, "render", deep)
    path = capture("relu_gen", torch.relu, (4, 8)).save(tmp_path / "relu.yaml")
    result = R.create(None, from_profile=path, runs=tmp_path / "runs")
    assert result.stage == "stopped" and "RecursionError" in result.message
    log = tmp_path / "runs" / "relu_gen" / "generator_error.log"
    assert "maximum recursion depth" in log.read_text()
    assert "RecursionError" in result.report.read_text()


def test_cli_create_yes_relu_squared(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kernelwright.cli", "create",
         str(ROOT / "examples/create/relu_squared.py"), "--yes", "--out", "pkg"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.perf_counter() - start < 180  # the budget on a CPU-only machine
    ws = tmp_path / "kernelwright-runs/create/relu_squared"
    assert (ws / "profile.yaml").exists() and (ws / "report.md").exists()
    op = (tmp_path / "pkg/relu_squared/relu_squared.py").read_text()
    assert "@triton.jit" in op and "tl.store" in op
    imports = [ln for ln in op.splitlines() if ln.startswith(("import ", "from "))]
    assert all(ln.split()[1].split(".")[0] in ("__future__", "torch", "triton", "kernelwright")
               for ln in imports)  # fmt: skip
    assert "kernelwright.runtime" in op and "kernelwright.ops" not in op


def _create_with_faked_tests(tmp_path, monkeypatch):
    """`create relu_squared.py --yes` in tmp_path, its generated tests faked: they pass while
    outcome["rc"] is 0, fail otherwise. Returns (run, outcome); run(*args): (exit code, output)."""
    from typer.testing import CliRunner

    from kernelwright.cli import app
    from kernelwright.workflows.create import verify

    outcome = {"rc": 0}

    def run_tests(pkg_root, name, log):
        out = "1 passed" if outcome["rc"] == 0 else "E   ImportError: broken"
        log.write_text(out)
        return outcome["rc"], out

    monkeypatch.setattr(verify, "run_tests", run_tests)
    monkeypatch.chdir(tmp_path)
    ref = str(ROOT / "examples/create/relu_squared.py")

    def run(*args):
        got = CliRunner().invoke(app, ["create", ref, "--yes", "--bench", "none", *args],
                                 terminal_width=400)  # fmt: skip
        return got.exit_code, got.output

    return run, outcome


def test_cli_create_refuses_a_file_as_out(tmp_path, monkeypatch):
    create, _ = _create_with_faked_tests(tmp_path, monkeypatch)
    (tmp_path / "a_file").write_text("mine\n")
    code, output = create("--out", "a_file")
    assert code == 2 and "a_file is a file" in output, output
    assert len(output.strip().splitlines()) == 1  # one line, and before any stage ran:
    assert not (tmp_path / "kernelwright-runs").exists()


def test_cli_create_out_keeps_what_it_did_not_write(tmp_path, monkeypatch):
    create, outcome = _create_with_faked_tests(tmp_path, monkeypatch)
    # a package kernelwright generated is replaced by one that passes its tests
    code, output = create("--out", "gen")
    assert code == 0, output
    op = tmp_path / "gen/relu_squared/relu_squared.py"
    op.write_text(op.read_text() + "# the package that passed\n")
    code, output = create("--out", "gen")
    assert code == 0 and "the package that passed" not in op.read_text(), output
    # ... but not by one that fails: that one stays in the run folder, and the output says so
    op.write_text(op.read_text() + "# the package that passed\n")
    outcome["rc"] = 1
    code, output = create("--out", "gen")
    assert code == 1 and "the package that passed" in op.read_text(), output
    assert f"the failing package is {Path('kernelwright-runs/create/relu_squared/pkg')}" in output
    # a folder of the user's own where the package goes: refused before Verify, kept as it is
    outcome["rc"] = 0
    mine = tmp_path / "proj/relu_squared"
    mine.mkdir(parents=True)
    (mine / "important.py").write_text("important\n")
    code, output = create("--out", "proj")
    assert code == 2 and "important.py" in output and "--force" in output, output
    assert (mine / "important.py").read_text() == "important\n"
    # --force replaces it
    code, output = create("--out", "proj", "--force")
    assert code == 0 and not (mine / "important.py").exists(), output
    assert "Generated by `kernelwright create`" in (mine / "relu_squared.py").read_text()


def _edit_notes(path: Path) -> str:
    """A reviewer's edit of the profile itself (not a comment only): one more note."""
    data = yaml.safe_load(path.read_text())
    data["notes"] = [*data["notes"], "reviewed: keep as it is"]
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=100))
    return path.read_text()


def test_cli_create_leaves_no_stale_profile_new(tmp_path, monkeypatch):
    create, _ = _create_with_faked_tests(tmp_path, monkeypatch)
    ws = tmp_path / "kernelwright-runs/create/relu_squared"
    profile, new, digest = (
        ws / "profile.yaml",
        ws / "profile.new.yaml",
        ws / ".profile.new.yaml.sha256",
    )
    assert create()[0] == 0
    fresh = profile.read_text()
    # a comment alone: this run's profile is the reviewed one, nothing to write beside it
    profile.write_text(fresh + "# reviewed\n")
    code, output = create()
    output = " ".join(output.split())  # the console wraps long lines
    assert code == 2 and "none was written beside it" in output and not new.exists(), output
    assert profile.read_text() == fresh + "# reviewed\n"
    # an edit of the profile: this run's goes beside it, and the output says where
    edited = _edit_notes(profile)
    code, output = create()
    where = Path("kernelwright-runs/create/relu_squared/profile.new.yaml")
    assert code == 2 and f"This run's profile is {where}" in " ".join(output.split()), output
    assert profile.read_text() == edited and new.read_text() == fresh
    # resumed from the reviewed profile: the new one is stale
    code, output = create("--from-profile", str(profile))
    assert code == 0 and not new.exists() and not digest.exists(), output
    # so is one that a later run made obsolete by writing profile.yaml (here with --force)
    _edit_notes(profile)
    assert create()[0] == 2 and new.exists()
    code, output = create("--force")
    assert code == 0 and not new.exists() and not digest.exists(), output
    assert "reviewed: keep as it is" not in profile.read_text()


def _cli_create(tmp_path, monkeypatch, name: str, body: str, inputs: str):
    """`kernelwright create` (CliRunner, in tmp_path) on a reference `name` with that body."""
    from typer.testing import CliRunner

    from kernelwright.cli import app

    ref = tmp_path / f"{name}.py"
    ref.write_text(f"import torch\n\n\n{body}\n\n\ndef get_inputs():\n    return {inputs}\n")
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(app, ["create", str(ref)], terminal_width=400)


def test_cli_create_says_what_it_bakes_in(tmp_path, monkeypatch):
    # a non-tensor argument from get_inputs() and a default are constants of the traced graphs
    got = _cli_create(
        tmp_path, monkeypatch, "int_arg", "def int_arg(x, k, eps=1e-3):\n    return x * k + eps",
        "[torch.randn(4, 8), 3]",
    )  # fmt: skip
    assert got.exit_code == 0, got.output
    assert (
        "k=3, eps=0.001 are baked in as constants: the generated int_arg() takes x only"
        in got.output
    )


def test_cli_create_stops_for_review(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kernelwright.cli", "create",
         str(ROOT / "examples/create/silu.py")],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--from-profile" in proc.stdout
    assert "tier 1: element-wise only" in proc.stdout  # what was understood, for the review
    assert not (tmp_path / "kernelwright-runs/create/silu/pkg").exists()


def test_cli_create_stops_at_tier_3_without_a_review(tmp_path, monkeypatch):
    # a reference no template lowers stops with its reason (exit 2), without --yes too: no
    # profile to review and resume from
    got = _cli_create(
        tmp_path, monkeypatch, "matmul_gelu",
        "def matmul_gelu(x, w):\n    return torch.nn.functional.gelu(x @ w)",
        "[torch.randn(8, 16), torch.randn(16, 32)]",
    )  # fmt: skip
    assert got.exit_code == 2, got.output
    assert "stopped: node 'mm (aten.mm.default)'" in got.output
    assert "--from-profile" not in got.output


# ---------------------------------------------------------------- the corpus through Understand

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "create"
# tier 1 and DyT (whose only reductions are its parameter gradients) → element-wise kernels;
# tier 2 with reductions over the row → row kernels; tier 3 → never generated (each reference
# declares its tier in its docstring; test_create_understand checks that)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.py")), ids=lambda p: p.stem)
def test_corpus_reference_renders_or_stops_cleanly(path):
    # Render only (fast); end-to-end verification of the generated tests is covered above and
    # by `kernelwright create <file> --yes` (all 20 generated references verified on CPU).
    from kernelwright.workflows.create import understand

    profile = understand(str(path))
    if profile.tier == 3:
        assert profile.unsupported_node and profile.unsupported_reason
        with pytest.raises(UnsupportedNode):
            render(profile)
        return
    files = render(profile)
    assert sorted(files) == sorted(
        f"{profile.name}/{f}" for f in ("__init__.py", f"{profile.name}.py",
                                         f"test_{profile.name}.py", f"bench_{profile.name}.py")
    )  # fmt: skip
    op = files[f"{profile.name}/{profile.name}.py"]
    assert "@triton.jit" in op
    # the default save policy stores nothing: no stored-intermediate code, inputs saved as before
    assert profile.save_policy == "recompute" and not profile.stored
    assert "st0_ptr" not in op and "STORED_KINDS" not in op and " s_" not in op
    # a row kernel iff the reference reduces over the row's dims; those also get the looped
    # kernels for rows longer than one program holds, but for a forward that reads one element
    # per row (the pick form of a gather)
    assert ("cmask = cols < N" in op) == bool(profile.reduction_dims)
    picks = "_fwd_pick(" in op
    assert ("def _fwd_looped" in op) == (bool(profile.reduction_dims) and not picks)
    # every kernel the launchers call takes the cached re-launch path (runtime/fastlaunch)
    import re

    launched = set(re.findall(r"\b(_\w+)\[[^\]]*\]\(", op))
    jitted = re.findall(r"((?:@fast\n)?)@triton\.jit\ndef (\w+)\(", op)
    assert launched and launched <= {name for _, name in jitted}, launched
    assert all(deco for deco, name in jitted if name in launched), jitted


def test_seeded_row_tables_hold_at_most_32_values_a_thread():
    """A row held whole spreads block_n * rows fp32 values over 32 * num_warps threads; past 32 a
    thread the backward's tiles (x, dy and the recomputed intermediates) spill registers, as
    a 16384-column backward seeded at 4 warps (128 values a thread) did."""
    import re

    fn, shapes, params = CASES["rmsnorm_gen"]
    text = next(t for name, t in render(capture("rmsnorm_gen", fn, *shapes, params=params)).items()
                if name.endswith("/rmsnorm_gen.py"))  # fmt: skip
    table = text[text.index("TABLE = {") : text.index("\n}\n", text.index("TABLE = {"))]
    entries = re.findall(r"\((\d+), C\(block_n=(\d+), rows=(\d+), num_warps=(\d+)\)\)", table)
    assert len(entries) >= 10, table  # fwd and bwd, every row length held whole
    for max_n, block_n, rows, warps in entries:
        per_thread = int(block_n) * int(rows) / (32 * int(warps))
        assert per_thread <= 32, f"n <= {max_n}: {per_thread:.0f} fp32 values a thread"


def test_per_row_inputs_load_once_a_row():
    """A per-row input (take_along_dim's index, a temperature, a one-hot's target) is loaded as
    [ROWS, 1] and its arithmetic (the index's wrap) runs once a row; at every column it cost a
    broadcast load and a float division. Kernels that reduce the row take it so too: the
    reduction's `where` on the row's mask broadcasts it over the columns."""
    import re

    from kernelwright.workflows.create import understand

    def kernels(stem):
        op = render(understand(str(CORPUS / f"{stem}.py")))[f"{stem}/{stem}.py"]
        return dict(re.findall(r"@triton\.jit\ndef (\w+)\((.*?)\n(?=\n\n|# -)", op, re.S))

    tad = kernels("take_along_dim_rows")
    for name in ("_take_along_dim_rows_bwd_kernel", "_take_along_dim_rows_bwd_last"):
        assert "f_idx = tl.load(in1_ptr + rows * in1_sr, mask=" in tad[name], tad[name]
        assert "in1_sc" not in tad[name].split("):  # fmt: skip")[1]
    soft = kernels("row_temperature_softmax")
    body = soft["_row_temperature_softmax_fwd_kernel"]
    assert "axis=" in body and "# per row" in body
    assert "# per row" in soft["_row_temperature_softmax_fwd_last"]  # elementwise after the sums
    # a looped partial kernel that would load nothing but per-row values keeps the full tile:
    # such a loop ran hundreds of times slower on the GPU (cross_entropy_gather's backward)
    ceg = kernels("cross_entropy_gather")
    assert "in1_sc" in ceg["_cross_entropy_gather_bwd_part1"].split("):  # fmt: skip")[1]
    # the gather's level reads the target once a row, then the logits at that column alone
    pick = ceg["_cross_entropy_gather_fwd_part3"]
    assert "pick = tl.load(in1_ptr + rows * in1_sr, mask=rmask" in pick and "for " not in pick
    ce = kernels("cross_entropy_one_hot")
    for name in ("_cross_entropy_one_hot_fwd_kernel", "_cross_entropy_one_hot_bwd_kernel"):
        assert "axis=" in ce[name] and "in1_sc" not in ce[name].split("):  # fmt: skip")[1]


def test_generated_tests_allow_random_inputs_exactly_on_a_kink(tmp_path, monkeypatch):
    """At a few hundred million fp32 draws some land exactly on hardtanh's kinks, where the traced
    backward graph (torch.compile's convention, the kernel's) and eager autograd take different
    one-sided derivatives: the generated test's graph-vs-autograd check allows one element in
    2^20 to differ there; a derivative wrong everywhere still fails it."""
    import importlib
    import sys

    from kernelwright.workflows.create import understand
    from kernelwright.workflows.create.codegen import write

    write(understand(str(CORPUS / "hardtanh.py")), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    test = importlib.import_module("hardtanh.test_hardtanh")
    inputs = test._inputs

    def on_the_kinks(shape, dtype, *args, **kwargs):
        xs = inputs(shape, dtype, *args, **kwargs)
        with torch.no_grad():
            xs[0].view(-1)[0] = 2.0  # the reference's max_val
        return xs

    monkeypatch.setattr(test, "_inputs", on_the_kinks)
    test._check((1024, 1024), torch.float32, True)  # one kink in 2^20 elements: allowed
    ref = test.hardtanh_ref  # the same values, no derivative: autograd's gradient is all 0
    monkeypatch.setattr(test, "hardtanh_ref", lambda x, *a: ref(x, *a).detach() + 0 * x)
    with pytest.raises(AssertionError, match="backward graph vs autograd"):
        test._check((64, 64), torch.float32, True)
    for name in [m for m in sys.modules if m == "hardtanh" or m.startswith("hardtanh.")]:
        del sys.modules[name]


def test_a_name_given_names_the_public_function_too():
    # two ops made from one reference under two names export two functions, not the
    # reference's function name twice (the library's generated __init__ imports both)
    from kernelwright.workflows.create.run import understand_source

    p = understand_source(str(CORPUS / "relu_squared.py"), "relu_sq_v2")
    assert (p.name, p.function_name, p.module_name) == ("relu_sq_v2", "relu_sq_v2", "ReluSqV2")
    files = render(p)
    init = files["relu_sq_v2/__init__.py"]
    assert "import ReluSqV2, relu_sq_v2," in init and "import relu_squared" not in init
    assert "def relu_sq_v2(" in files["relu_sq_v2/relu_sq_v2.py"]
