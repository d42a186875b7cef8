"""kernelwright.compile's loop capture (compile/loops.py): Python loops that mean-pool jagged
segments become one jagged_mean launch, with eager's values and gradients, before Dynamo."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

import kernelwright
from kernelwright.compile import loops
from kernelwright.ops import jagged_mean as jm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


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
    assert "source: segment-mean for loop" in report.summary()
    # new offsets of another length: no recompile of the pooled part (it is outside the graph)
    ids2, offsets2, _ = make_batch(samples=5, parts=3, max_len=6, vocab=50, device=DEVICE, seed=4)
    torch.testing.assert_close(compiled(ids2, offsets2), eager(ids2, offsets2))
    assert type(model).forward is Encoder.forward  # the class is untouched
    assert "forward" in vars(model)


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
