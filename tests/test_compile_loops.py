"""kernelwright.compile's jagged mean: Python loops that mean-pool jagged segments become one
jagged_mean launch before Dynamo (compile/loops.py); segment_reduce, index_add / scatter_add over
counts and scatter_reduce "mean" become one in the graph (compile/patterns_jagged.py) — each with
eager's values and gradients."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

import kernelwright
from kernelwright.compile import loops
from kernelwright.ops import jagged_mean as jm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def launches(monkeypatch):
    count = [0]
    real = jm.jagged_mean_fwd_launch

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(jm, "jagged_mean_fwd_launch", counting)
    return count


OFFSETS = [0, 3, 4, 9, 11, 17]


# Each spelling as a plain function of (values, offsets); offsets a list of ints.
def by_range(v, o):
    return torch.stack([v[o[i] : o[i + 1]].mean(0) for i in range(len(o) - 1)])


def by_zip(v, o):
    return torch.stack([v[s:e].mean(dim=0) for s, e in zip(o[:-1], o[1:], strict=True)], dim=0)


def by_torch_mean(v, o):
    return torch.stack([torch.mean(v[o[i] : o[i + 1]], 0) for i in range(0, len(o) - 1)])


def by_split(v, o):
    lengths = [b - a for a, b in zip(o[:-1], o[1:])]  # noqa: B905
    return torch.stack([c.mean(0) for c in torch.split(v, lengths)])


def by_method_split(v, o):
    lengths = [b - a for a, b in zip(o[:-1], o[1:])]  # noqa: B905
    return torch.stack([c.mean(dim=0) for c in v.split(lengths)])


def by_loop(v, o):
    out = []
    for i in range(len(o) - 1):
        out.append(v[o[i] : o[i + 1]].mean(dim=0))
    out = torch.stack(out)
    return out * 1.0


SPELLINGS = [by_range, by_zip, by_torch_mean, by_split, by_method_split, by_loop]


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
def test_each_spelling_is_one_launch_with_eager_values(fn, launches):
    new, captures = loops.rewrite_function(fn)
    assert len(captures) == 1 and captures[0].line > fn.__code__.co_firstlineno
    v = torch.randn(OFFSETS[-1], 12, device=DEVICE, requires_grad=True)
    dy = torch.randn(len(OFFSETS) - 1, 12, device=DEVICE)
    want = fn(v, OFFSETS)
    (want_grad,) = torch.autograd.grad(want, v, dy)
    got = new(v, OFFSETS)
    assert launches[0] == 1
    (got_grad,) = torch.autograd.grad(got, v, dy)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_offsets_as_a_tensor_a_count_and_a_subset(launches):
    new, _ = loops.rewrite_function(by_range)
    v = torch.randn(20, 3, 4, device=DEVICE)  # feature dims beyond the first are kept
    offsets = torch.tensor([2, 5, 5, 9, 14])  # starts past 0, an empty segment
    want = by_range(v, offsets)
    got = new(v, offsets)
    assert torch.isnan(want[1]).all() and torch.isnan(got[1]).all()  # eager's NaN, kept
    torch.testing.assert_close(got, want, equal_nan=True)
    assert launches[0] == 0  # an empty segment: the loop as written
    offsets = torch.tensor([2, 5, 6, 9, 14])
    torch.testing.assert_close(new(v, offsets), by_range(v, offsets))
    assert launches[0] == 1
    # a count past the offsets fails as the loop does
    with pytest.raises(IndexError):
        loops.segment_means(v, [0, 2, 4], count=3)


def test_a_loop_that_falls_back_says_so(launches):
    new, (capture,) = loops.rewrite_function(by_range)
    site = kernelwright.compile.loop_site(capture)
    assert "falls back to the loop as written where the kernel would differ" in site.line()
    v = torch.randn(OFFSETS[-1], 5, device=DEVICE)
    torch.testing.assert_close(new(v, OFFSETS), by_range(v, OFFSETS))
    empty = [0, 3, 3, 9]
    torch.testing.assert_close(new(v, empty), by_range(v, empty), equal_nan=True)
    v64 = v.double()
    torch.testing.assert_close(new(v64, OFFSETS), by_range(v64, OFFSETS))
    assert launches[0] == 1 and capture.kernel_calls == 1
    assert capture.fallbacks == {
        "an empty segment (eager's mean is NaN)": 1,
        f"float64 on {DEVICE.type}: the kernel takes float32/float16/bfloat16 on CUDA": 1,
    }
    assert site.line().endswith(
        "; calls so far: 1 by the kernel, 1 by the loop (an empty segment (eager's mean is NaN)),"
        f" 1 by the loop (float64 on {DEVICE.type}: the kernel takes float32/float16/bfloat16"
        " on CUDA)"
    )


def test_loop_sites_are_logged_with_the_env_var_alone(monkeypatch, capsys):
    """KERNELWRIGHT_LOG=registry, no logging configured: the loop's line reaches stderr
    (the loops are captured when compile is called, before any graph)."""
    import logging

    monkeypatch.setenv("KERNELWRIGHT_LOG", "registry")
    log, root = logging.getLogger("kernelwright.compile"), logging.getLogger()
    saved = root.handlers[:], log.handlers[:], log.level
    root.handlers.clear()  # as in a script: pytest's own capture handlers out of the way
    log.handlers.clear()
    log.setLevel(logging.NOTSET)
    try:
        kernelwright.compile(by_loop, backend="aot_eager")
    finally:
        root.handlers[:], log.handlers[:] = saved[0], saved[1]
        log.setLevel(saved[2])
    err = capsys.readouterr().err
    assert "kernelwright.compile: source: segment-mean for loop at" in err
    assert "by_loop" in err and "rewritten to call kernelwright" in err


def pooled_then_len(v, o):
    out = []
    for i in range(len(o) - 1):
        out.append(v[o[i] : o[i + 1]].mean(0))
    return torch.stack(out) * len(out)


def whole_mean(v, o):
    return torch.stack([v[o[i] : o[i + 1]].mean() for i in range(len(o) - 1)])


def other_dim(v, o):
    return torch.stack([v[o[i] : o[i + 1]].mean(1) for i in range(len(o) - 1)])


def stacked_on_dim1(v, o):
    return torch.stack([v[o[i] : o[i + 1]].mean(0) for i in range(len(o) - 1)], 1)


def shifted(v, o):
    return torch.stack([v[o[i] : o[i + 2]].mean(0) for i in range(len(o) - 2)])


@pytest.mark.parametrize(
    "fn",
    [pooled_then_len, whole_mean, other_dim, stacked_on_dim1, shifted],
    ids=lambda f: f.__name__,
)
def test_what_is_not_a_segment_mean_stays(fn):
    assert loops.rewrite_function(fn) is None


def test_decorated_and_closures_stay():
    scale = 2.0

    def closure(v, o):
        return torch.stack([v[s:e].mean(0) for s, e in zip(o[:-1], o[1:])]) * scale  # noqa: B905

    assert loops.rewrite_function(closure) is None
    assert loops.rewrite_function(torch.no_grad()(by_range)) is None


def test_encoder_example_compiles_without_unrolling(launches):
    from pooling_encoder import Encoder, make_batch

    torch.manual_seed(0)
    eager = Encoder(vocab=50, dim=8, parts=3, hidden=16).to(DEVICE)
    torch.manual_seed(0)
    model = Encoder(vocab=50, dim=8, parts=3, hidden=16).to(DEVICE)
    ids, offsets, _ = make_batch(samples=4, parts=3, max_len=6, vocab=50, device=DEVICE)
    report = kernelwright.compile.CompileReport()
    compiled = kernelwright.compile(model, report=report, backend="aot_eager")
    out = compiled(ids, offsets)
    assert launches[0] == 1
    want = eager(ids, offsets)
    torch.testing.assert_close(out, want)
    dy = torch.randn_like(out)
    out.backward(dy)
    want.backward(dy)
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    (site,) = [s for s in report if s.graph == -1]
    assert site.replaced and site.op == "jagged_mean" and "Encoder.forward" in site.nodes[0]
    assert site.line().endswith("calls so far: 1 by the kernel")
    assert "source: segment-mean for loop" in report.summary()
    # new offsets of another length: no recompile of the pooled part (it is outside the graph)
    ids2, offsets2, _ = make_batch(samples=5, parts=3, max_len=6, vocab=50, device=DEVICE, seed=4)
    torch.testing.assert_close(compiled(ids2, offsets2), eager(ids2, offsets2))
    assert type(model).forward is Encoder.forward  # the class is untouched
    assert "forward" in vars(model)


def test_encoder_example_measures_and_writes_its_table(tmp_path):
    """The example's harness, tiny: eager and kernelwright.compile in this process (the error
    against eager measured), plain torch.compile in a child killed at its time limit."""
    import csv

    import pooling_encoder as pe

    tiny = "--samples 4 --parts 2 --max-len 4 --dim 8 --hidden 8 --vocab 50 --reps 1"
    args = pe.parser().parse_args([*tiny.split(), "--device", DEVICE.type, "--backend",
                                   "aot_eager", "--limit", "1"])  # fmt: skip
    ref = tmp_path / "eager.pt"
    rows = [pe.measure("eager", args, ref), pe.measure("kernelwright", args, ref)]
    assert 0 <= rows[1]["max_rel_err"] < 1e-5 and "max_rel_err" not in rows[0]
    rows.append(pe.run_provider("torch_compile", args, {}, ref))  # import alone takes > 1 s
    assert rows[2]["status"] == "did not finish compiling in 1 s"
    for r in rows:
        r.setdefault("status", "ok")
        r.update(partitions=8, samples=4, parts=2, max_len=4, dim=8, hidden=8)
    env = pe.environment(DEVICE.type)
    table, md = pe.write_outputs(pe.with_speedups(rows), tmp_path, env, "the command")
    got = list(csv.DictReader(table.open()))
    assert [r["provider"] for r in got] == ["eager", "kernelwright", "torch_compile"]
    assert float(got[0]["encoder_x_eager"]) == 1.0 and float(got[1]["step_ms"]) > 0
    text = md.read_text()
    assert "did not finish compiling in 1 s" in text and "| kernelwright.compile |" in text
    assert "rewritten to call kernelwright" in text and env["torch"] in text


def test_capture_can_be_turned_off():
    from pooling_encoder import Encoder

    model = Encoder(vocab=50, dim=8, parts=3, hidden=16)
    report = kernelwright.compile.CompileReport()
    kernelwright.compile(model, report=report, capture_loops=False)
    assert "forward" not in vars(model) and not report


def test_segment_reduce_mean_in_the_graph(launches):
    """`torch.segment_reduce(x, "mean", lengths=...)` and its `offsets=` form are graph
    sites: one jagged_mean launch each, NaN for an empty segment as eager; "sum" stays."""

    def fn(x, lengths, offsets):
        a = torch.segment_reduce(x, "mean", lengths=lengths)
        b = torch.segment_reduce(x * 2, "mean", offsets=offsets, axis=0)
        c = torch.segment_reduce(x, "sum", lengths=lengths)
        return a + b + c

    x = torch.randn(9, 4, device=DEVICE, requires_grad=True)
    lengths = torch.tensor([2, 0, 4, 3], device=DEVICE)
    offsets = torch.tensor([0, 2, 2, 6, 9], device=DEVICE)
    report = kernelwright.compile.CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager")
    got, want = compiled(x, lengths, offsets), fn(x, lengths, offsets)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isnan(got[1]).all()
    assert [(s.op, s.replaced) for s in report] == [("jagged_mean", True)] * 2
    assert launches[0] == 2
    dy = torch.randn_like(got)
    (g,) = torch.autograd.grad(got.nan_to_num(), x, dy)
    (w,) = torch.autograd.grad(want.nan_to_num(), x, dy)
    torch.testing.assert_close(g, w)


# --------------------------------------------------------------------------- index_add / scatter

SEGMENTS, ROWS, DIM = 6, 13, 5  # ids 2 and 5 have no row; the ids are not sorted
IDS = [4, 0, 3, 0, 1, 4, 4, 1, 0, 3, 0, 4, 1]


def bincount_divisor(x, ids):  # bincount breaks the graph: its counts arrive as an input
    counts = torch.bincount(ids, minlength=SEGMENTS).clamp(min=1).to(x.dtype)
    return torch.zeros(SEGMENTS, DIM, device=x.device).index_add_(0, ids, x) / counts[:, None]


def index_add_statements(x, ids):  # counted by index_add of ones, unclamped: 0 / 0 = NaN
    sums = torch.zeros(SEGMENTS, x.shape[1], device=x.device)
    sums.index_add_(0, ids, x)
    counts = torch.zeros(SEGMENTS, device=x.device)
    counts.index_add_(0, ids, torch.ones(x.shape[0], device=x.device))
    return sums / counts.unsqueeze(1)


def index_add_out_of_place(x, ids):
    sums = torch.index_add(x.new_zeros(SEGMENTS, DIM), 0, ids, x)
    counts = x.new_zeros(SEGMENTS).index_add(0, ids, torch.ones_like(ids, dtype=x.dtype))
    return sums / counts.clamp_min(1).reshape(SEGMENTS, 1)


def scatter_add_counts(x, ids):
    sums = torch.zeros(SEGMENTS, DIM, device=x.device).scatter_add_(
        0, ids[:, None].expand(-1, DIM), x
    )
    ones = x.new_ones(x.shape[0], 1)
    counts = torch.zeros(SEGMENTS, 1, device=x.device).scatter_add_(0, ids.view(-1, 1), ones)
    return torch.div(sums, torch.clamp(counts, min=1))


def scatter_reduce_mean(x, ids):
    index = ids.unsqueeze(1).expand_as(x)
    return torch.zeros(SEGMENTS, DIM, device=x.device).scatter_reduce(
        0, index, x, "mean", include_self=False
    )


def index_reduce_statement(x, ids):
    out = torch.zeros(SEGMENTS, DIM, device=x.device)
    out.index_reduce_(0, ids, x, "mean", include_self=False)
    return out * 2


SCATTERS = {
    bincount_divisor: "index_add(zeros, 0, ids, x) / a per-segment divisor",
    index_add_statements: "index_add(zeros, 0, ids, x) / counts",
    index_add_out_of_place: "index_add(zeros, 0, ids, x) / counts",
    scatter_add_counts: "scatter_add(zeros, 0, ids column, x) / counts",
    scatter_reduce_mean: "scatter_reduce(zeros, 0, ids column, x, 'mean', include_self=False)",
    index_reduce_statement: "index_reduce(zeros, 0, ids, x, 'mean', include_self=False)",
}


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("fn", list(SCATTERS), ids=lambda f: f.__name__)
def test_index_add_and_scatter_means_in_the_graph(fn, launches):
    """Sums by unsorted ids over counts (or a reduce-mean) become one jagged_mean launch with
    eager's values (0 or NaN for an id without rows, as the spelling gives) and gradients."""
    x = torch.randn(ROWS, DIM, device=DEVICE, requires_grad=True)
    ids = torch.tensor(IDS, device=DEVICE)
    report = kernelwright.compile.CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager")
    got, want = compiled(x, ids), fn(x, ids)
    assert launches[0] == 1
    assert [(s.pattern, s.replaced) for s in report] == [(SCATTERS[fn], True)]
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got[2].isnan().all() == (fn is index_add_statements)
    dy = torch.randn_like(got)
    (g,) = torch.autograd.grad(got.nan_to_num(), x, dy)
    (w,) = torch.autograd.grad(want.nan_to_num(), x, dy)
    torch.testing.assert_close(g, w)
    # An id past the segments fails, as eager's index error. On CUDA that is a device-side
    # assert, which leaves the process's CUDA context unusable: checked on the CPU only.
    if fn is index_add_statements and x.device.type == "cpu":
        with pytest.raises(RuntimeError, match="out of range"):
            compiled(x.detach(), torch.tensor(IDS[:-1] + [SEGMENTS], device=DEVICE))


def test_index_add_sites_left_alone(launches):
    """Sites the kernel cannot compute as written are reported with the reason, not replaced."""

    def fn(x, x3, ids):
        index = ids[:, None].expand(-1, DIM)
        counts = torch.zeros(SEGMENTS, 1, device=x.device).index_add_(
            0, ids, torch.ones(ROWS, 1, device=x.device)
        )
        a = torch.zeros(SEGMENTS, DIM, device=x.device).scatter_reduce(
            0, index, x, "mean"
        )  # the zero averaged
        sums = torch.zeros(SEGMENTS, DIM, device=x.device).index_add_(
            0, ids, x
        )  # read below as well
        b = sums / counts
        c = torch.zeros(SEGMENTS, 2, 3, device=x.device).index_add_(0, ids, x3) / counts[:, :, None]
        return a, b + sums, c

    x, x3 = torch.randn(ROWS, DIM, device=DEVICE), torch.randn(ROWS, 2, 3, device=DEVICE)
    ids = torch.tensor(IDS, device=DEVICE)
    report = kernelwright.compile.CompileReport()
    got = kernelwright.compile(fn, report=report, backend="aot_eager")(x, x3, ids)
    for g, w in zip(got, fn(x, x3, ids), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert launches[0] == 0 and not report.replaced()
    reasons = [s.reason for s in report]
    assert "include_self=True" in reasons[0]
    assert "also used outside the pattern" in reasons[1]
    assert "x is 3-D" in reasons[2]


def test_index_add_mean_through_inductor(launches):
    """The replacement's sort, gather and offsets compile with Inductor around the kernel."""
    x = torch.randn(ROWS, DIM, device=DEVICE, requires_grad=True)
    ids = torch.tensor(IDS, device=DEVICE)
    report = kernelwright.compile.CompileReport()
    got = kernelwright.compile(index_add_out_of_place, report=report)(x, ids)
    want = index_add_out_of_place(x, ids)
    assert launches[0] == 1 and len(report.replaced()) == 1
    torch.testing.assert_close(got, want)
    dy = torch.randn_like(got)
    torch.testing.assert_close(*(torch.autograd.grad(y, x, dy)[0] for y in (got, want)))
