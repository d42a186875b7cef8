"""kernelwright.distributed: vocab-parallel cross-entropy and fused linear cross-entropy in 2 and
3 gloo CPU processes against the unsplit loss, F.cross_entropy in fp64 on the whole vocabulary
(z-loss written out), values and every rank's gradients: uneven and empty slices, sizes
gathered or given, DTensor inputs, ignored tokens, every reduction and option, the gradient in
place, every allocated buffer poisoned first; errors raised on every rank; and checks that the
comparison catches a wrong split.

Each world size runs once (one mp.spawn for all its cases, a module fixture); the tests then
compare what the ranks saved. The per-slice kernels are also checked alone in this process
(ranks simulated, the collectives done by hand) on rows of several blocks, and compiled for
sm_90."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.nn.functional as F

from kernelwright.distributed import (
    chunk_sizes,
    vocab_parallel_cross_entropy,
    vocab_parallel_fused_linear_cross_entropy,
)
from kernelwright.distributed._vp_kernels import (
    Options,
    RowStats,
    loss_grad_launch,
    rescale_launch,
    stats_launch,
)
from kernelwright.ops.cross_entropy import cross_entropy_ref
from kernelwright.runtime.alloc import poisoned
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables.vocab_parallel import TABLE

H = 16
IGNORE = -100


def _case(name, kind, world, V, *, sizes=None, mode="gather", dtype=torch.float32, lead=(13,),
          seed=0, **opts):  # fmt: skip
    """`mode`: "gather" (the slice sizes all_gathered), "given" (shard_sizes passed),
    "dtensor" (DTensor inputs), "swapped" (each rank holds another rank's slice: wrong)."""
    return dict(name=name, kind=kind, world=world, V=V, sizes=sizes or chunk_sizes(V, world),
                mode=mode, dtype=dtype, lead=lead, seed=seed, opts=opts)  # fmt: skip


# fmt: off
CASES = [
    # world 2, V = 37 split 19 / 18 unless given
    _case("ce_mean", "ce", 2, 37, label_smoothing=0.1, lse_square_scale=1e-3, chunk_size=4),
    _case("ce_sum", "ce", 2, 37, lead=(3, 5), reduction="sum", seed=1),
    _case("ce_none", "ce", 2, 37, reduction="none", label_smoothing=0.2, lse_square_scale=1e-2,
          softcap=4.0, in_place=True, seed=2),
    _case("ce_weights", "ce", 2, 37, class_weights=True, label_smoothing=0.1,
          lse_square_scale=1e-3, return_z_loss=True, seed=3),
    _case("ce_num_items", "ce", 2, 37, num_items_in_batch=20, lse_square_scale=1e-2,
          return_z_loss=True, seed=4),
    _case("ce_bf16", "ce", 2, 37, dtype=torch.bfloat16, label_smoothing=0.1,
          lse_square_scale=1e-3, seed=5),
    _case("ce_equal", "ce", 2, 36, mode="given", seed=6),
    _case("ce_dtensor", "ce", 2, 37, mode="dtensor", class_weights=True, label_smoothing=0.1,
          lse_square_scale=1e-3, seed=7),
    _case("ce_swapped", "ce", 2, 36, mode="swapped", seed=6),
    _case("flce_mean", "flce", 2, 37, bias=True, label_smoothing=0.1, lse_square_scale=1e-3,
          chunk_size=5, seed=8),
    _case("flce_none", "flce", 2, 37, lead=(3, 5), reduction="none", class_weights=True,
          softcap=3.0, label_smoothing=0.05, chunk_size=4, seed=9),
    _case("flce_sum_z", "flce", 2, 37, reduction="sum", lse_square_scale=1e-2,
          return_z_loss=True, seed=10),
    _case("flce_num_items", "flce", 2, 36, mode="given", bias=True, num_items_in_batch=11,
          chunk_size=6, seed=11),
    _case("flce_bf16", "flce", 2, 37, dtype=torch.bfloat16, bias=True, accum_dtype=torch.float32,
          label_smoothing=0.1, seed=12),
    _case("flce_dtensor", "flce", 2, 37, mode="dtensor", bias=True, label_smoothing=0.1,
          lse_square_scale=1e-3, chunk_size=5, seed=13),
    # world 3: torch.chunk's 13 / 13 / 11, and an empty middle slice
    _case("ce3_mean", "ce", 3, 37, label_smoothing=0.1, lse_square_scale=1e-3, seed=20),
    _case("ce3_empty_none", "ce", 3, 37, sizes=[20, 0, 17], mode="given", reduction="none",
          class_weights=True, softcap=5.0, label_smoothing=0.1, seed=21),
    _case("ce3_dtensor", "ce", 3, 37, mode="dtensor", reduction="sum", in_place=True, seed=22),
    _case("flce3_dtensor", "flce", 3, 37, mode="dtensor", bias=True, label_smoothing=0.1,
          chunk_size=4, seed=23),
    _case("flce3_empty_mean", "flce", 3, 37, sizes=[20, 0, 17], mode="given",
          lse_square_scale=1e-3, seed=24),
]
# fmt: on
BY_NAME = {c["name"]: c for c in CASES}


def _inputs(case) -> dict:
    """The whole (unsplit) inputs of a case, the same in every process."""
    g = torch.Generator().manual_seed(case["seed"])
    V, lead, dt = case["V"], case["lead"], case["dtype"]
    target = torch.randint(0, V, lead, generator=g)
    flat = target.view(-1)
    flat[[1, 4, flat.numel() - 1]] = IGNORE  # ignored tokens, the last row among them
    flat[0], flat[2] = 0, V - 1  # the first and last classes
    out = {"target": target}
    if case["kind"] == "ce":
        out["logits"] = (torch.randn(*lead, V, generator=g) * 2 + 0.5).to(dt)
    else:
        out["hidden"] = torch.randn(*lead, H, generator=g).to(dt)
        out["weight"] = (torch.randn(V, H, generator=g) * 0.5).to(dt)
        if case["opts"].get("bias"):
            out["bias"] = torch.randn(V, generator=g).to(dt)
    if case["opts"].get("class_weights"):
        out["class_weight"] = torch.rand(V, generator=g) + 0.5
    if case["opts"].get("reduction") == "none":
        out["dy"] = torch.randn(lead, generator=g)
    return out


def _loss_kwargs(case) -> dict:
    skip = ("bias", "class_weights")
    return {k: v for k, v in case["opts"].items() if k not in skip}


def _backward(case, loss, inp) -> None:
    if case["opts"].get("return_z_loss"):
        loss = loss[0]
    if loss.dim():
        (loss * inp["dy"]).sum().backward()
    else:
        (loss * 1.7).backward()


# --------------------------------------------------------------------------- the ranks


def _slice(case, rank: int) -> slice:
    sizes = case["sizes"]
    owner = case["world"] - 1 - rank if case["mode"] == "swapped" else rank
    start = sum(sizes[:owner])
    return slice(start, start + sizes[owner])


def _run_case(case, rank: int, mesh) -> dict:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    inp = _inputs(case)
    sl = _slice(case, rank)
    kw = _loss_kwargs(case)
    dtensor = case["mode"] == "dtensor"
    if case["mode"] in ("given", "swapped"):
        kw["shard_sizes"] = case["sizes"]

    def split(t, dim):  # this rank's slice of a vocabulary-sized dimension
        if t is None:
            return None
        if dtensor:
            return distribute_tensor(t.detach(), mesh, [Shard(dim)])
        return t.narrow(dim, sl.start, sl.stop - sl.start).clone()

    def local(grad, leaf):  # this rank's slice of a leaf's gradient
        if not dtensor:
            return grad
        # torch 2.11 hands an unevenly sharded leaf a Replicate gradient (2.13 keeps its Shard):
        # the leaf's own placements make the comparison independent of that
        return grad.redistribute(leaf.device_mesh, leaf.placements).to_local()

    cw = split(inp.get("class_weight"), 0)
    if case["kind"] == "ce":
        x = split(inp["logits"], inp["logits"].dim() - 1).requires_grad_()
        # a model's logits: in place over a leaf that requires grad is refused
        x_in = x.clone() if kw.get("in_place") else x
        loss = vocab_parallel_cross_entropy(x_in, inp["target"], cw, **kw)
        _backward(case, loss, inp)
        grads = {"logits": local(x.grad, x)}
        aliased = not dtensor and x.numel() > 0 and x.grad.data_ptr() == x_in.data_ptr()
    else:
        aliased = False
        h = inp["hidden"].clone()
        if dtensor:  # the replicated hidden states a parallelized model hands the lm-head
            h = distribute_tensor(h, mesh, [Replicate()])
        h.requires_grad_()
        w = split(inp["weight"], 0).requires_grad_()
        b = split(inp.get("bias"), 0)
        if b is not None:
            b.requires_grad_()
        loss = vocab_parallel_fused_linear_cross_entropy(h, w, inp["target"], b, class_weight=cw,
                                                         **kw)  # fmt: skip
        _backward(case, loss, inp)
        grads = {"hidden": local(h.grad, h), "weight": local(w.grad, w)}
        if b is not None:
            grads["bias"] = local(b.grad, b)
    loss = loss if isinstance(loss, tuple) else (loss,)
    return {"loss": [t.detach() for t in loss], "grads": grads, "slice": (sl.start, sl.stop),
            "aliased": aliased}  # fmt: skip


def _error(fn) -> tuple[str, str] | None:
    try:
        fn()
    except Exception as e:  # recorded and checked in the test process
        return type(e).__name__, str(e)
    return None


def _errors(rank: int, mesh) -> dict:
    """Bad calls, each raising on every rank (a rank that went on would wait in a collective)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(99)
    t = torch.randint(0, 37, (6,), generator=g)  # drawn first: the same on both ranks
    x = torch.randn(6, 19 - rank, generator=g)  # 19 / 18 classes
    ce, flce = vocab_parallel_cross_entropy, vocab_parallel_fused_linear_cross_entropy
    bad_t = t.clone()
    bad_t[2] = 37
    other_t = t.clone()
    other_t[0] = (t[0] + rank) % 37  # rank 1's targets differ
    full = distribute_tensor(torch.randn(6, 37, generator=g), mesh, [Shard(1)])
    return {
        "target_out_of_range": _error(lambda: ce(x, bad_t)),
        "target_shape": _error(lambda: ce(x, t[:5])),
        "shard_sizes_mismatch": _error(lambda: ce(x, t, shard_sizes=[18, 19])),
        "shard_sizes_length": _error(lambda: ce(x, t, shard_sizes=[19, 18, 0])),
        "rows_differ": _error(lambda: ce(x[: 6 - rank], t[: 6 - rank])),
        "targets_differ": _error(lambda: ce(x, other_t)),
        "class_weight_shape": _error(lambda: ce(x, t, torch.ones(37))),
        "hidden_width": _error(lambda: flce(torch.randn(6, 8), torch.randn(19 - rank, 16), t)),
        "dtensor_replicated": _error(
            lambda: ce(distribute_tensor(torch.randn(6, 37), mesh, [Replicate()]), t)
        ),
        "dtensor_and_group": _error(lambda: ce(full, t, group=torch.distributed.group.WORLD)),
        # after the bad calls the group still works
        "still_fine": _error(lambda: ce(x, t)),
    }


def _rank_main(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        mesh = init_device_mesh("cpu", (world,))
        with poisoned():  # every buffer the ops allocate starts as NaN: unwritten ones show
            results = {c["name"]: _run_case(c, rank, mesh) for c in CASES if c["world"] == world}
        if world == 2:
            results["errors"] = _errors(rank, mesh)
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    # The results are saved. Leave without running C++ static destructors: gloo's worker
    # threads at teardown abort the process now and then ("terminate called without an active
    # exception"), after every collective has completed.
    os._exit(0)


def _spawn(world: int, tmp) -> list[dict]:
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(world, str(tmp / "init"), str(tmp)), nprocs=world)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, list[dict]]:
    if torch.cuda.is_available():
        # gloo ranks hold CPU tensors, which the Triton kernels take only under the interpreter;
        # on a GPU machine benchmarks/vocab_parallel.py checks the same equalities over NCCL
        pytest.skip("gloo processes on CPU tensors: the CPU suite's test")
    return {w: _spawn(w, tmp_path_factory.mktemp(f"world{w}")) for w in (2, 3)}


# --------------------------------------------------------------------------- the reference


def _reference(case) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """F.cross_entropy in fp64 over the whole vocabulary plus the z-loss written out:
    s * lse^2 on every non-ignored token, reduced as the loss. Returns (losses, gradients)."""
    inp = _inputs(case)
    o = case["opts"]
    reduction = o.get("reduction", "mean")
    eps, s, cap = o.get("label_smoothing", 0.0), o.get("lse_square_scale", 0.0), o.get("softcap")
    n_items = o.get("num_items_in_batch")
    cw = inp.get("class_weight")
    cw = cw.double() if cw is not None else None
    leaves = {}
    if case["kind"] == "ce":
        leaves["logits"] = inp["logits"].double().requires_grad_()
        logits = leaves["logits"]
    else:
        for k in ("hidden", "weight", "bias"):
            if k in inp:
                leaves[k] = inp[k].double().requires_grad_()
        logits = leaves["hidden"] @ leaves["weight"].T
        if "bias" in leaves:
            logits = logits + leaves["bias"]
    V = case["V"]
    z = logits.reshape(-1, V)
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    t = inp["target"].reshape(-1)
    red = "sum" if n_items is not None else reduction
    loss = F.cross_entropy(z, t, weight=cw, ignore_index=IGNORE, reduction=red,
                           label_smoothing=eps)  # fmt: skip
    valid = t != IGNORE
    z_rows = torch.where(valid, s * torch.logsumexp(z, -1) ** 2, 0.0)
    if reduction == "none":
        loss, z_loss = loss.view(inp["target"].shape), z_rows.view(inp["target"].shape)
    elif reduction == "sum":
        z_loss = z_rows.sum()
    else:
        w_t = cw[torch.where(valid, t, 0)] if cw is not None else torch.ones(t.shape)
        denom = n_items if n_items is not None else (w_t * valid).sum()
        z_loss = z_rows.sum() / denom
        if n_items is not None:
            loss = loss / n_items
    loss = loss + z_loss
    _backward(case, (loss, z_loss) if o.get("return_z_loss") else loss, inp)
    losses = [loss.detach(), z_loss.detach()] if o.get("return_z_loss") else [loss.detach()]
    return losses, {k: v.grad for k, v in leaves.items()}


def _tol(case, what: str) -> dict:
    if case["dtype"] == torch.float32:
        return dict(atol=1e-5, rtol=1e-5) if what == "loss" else dict(atol=1e-6, rtol=1e-4)
    if case["kind"] == "ce":  # bf16 logits: fp32 math on the same values, a bf16 gradient
        return dict(atol=1e-5, rtol=1e-5) if what == "loss" else dict(atol=1e-4, rtol=1e-2)
    return dict(atol=5e-2, rtol=5e-2)  # bf16 matmuls: the logits themselves are rounded


def _assert_matches(got: torch.Tensor, want: torch.Tensor, **tol) -> None:
    torch.testing.assert_close(got.double(), want.double(), **tol)


def _check_case(ranks, name: str) -> None:
    case = BY_NAME[name]
    per_rank = ranks[case["world"]]
    want_losses, want_grads = _reference(case)
    for r, res in enumerate(per_rank):
        got = res[name]
        assert len(got["loss"]) == len(want_losses)
        for i, (a, b) in enumerate(zip(got["loss"], want_losses, strict=True)):
            assert a.dtype == torch.float32
            _assert_matches(a, b, **_tol(case, "loss"))
            torch.testing.assert_close(a, per_rank[0][name]["loss"][i])  # the same on every rank
        start, stop = got["slice"]
        in_place = case["opts"].get("in_place", False) and case["mode"] != "dtensor"
        in_place = in_place and stop > start  # (an empty slice has no storage to share)
        assert got["aliased"] == in_place, (r, name)  # the gradient is the logits' storage
        for k, g in got["grads"].items():
            want = want_grads[k]
            if k != "hidden":  # vocabulary-sliced: this rank's part
                want = want.narrow(0 if k in ("weight", "bias") else want.dim() - 1, start,
                                   stop - start)  # fmt: skip
            assert g.dtype == case["dtype"], (r, k)
            assert g.shape == want.shape, (r, k)
            _assert_matches(g, want, **_tol(case, k))


@pytest.mark.parametrize("name", [c["name"] for c in CASES if c["mode"] != "swapped"])
def test_loss_and_gradients_equal_the_unsplit_loss(ranks, name):
    _check_case(ranks, name)


def test_the_cases_exercise_what_they_claim():
    # uneven, even and empty slices; ignored tokens; DTensor's split is torch.chunk's
    assert chunk_sizes(37, 2) == [19, 18] and chunk_sizes(37, 3) == [13, 13, 11]
    assert chunk_sizes(5, 4) == [2, 2, 1, 0]
    for c in CASES:
        t = _inputs(c)["target"]
        assert (t == IGNORE).sum() == 3 and t.ne(IGNORE).sum() >= 9
        assert sum(c["sizes"]) == c["V"]
    # every token's class is owned by one rank and the ranks' targets span the slices
    t = _inputs(BY_NAME["ce_mean"])["target"]
    assert (t[t != IGNORE] < 19).any() and (t[t != IGNORE] >= 19).any()


def test_a_wrong_split_is_detected(ranks):
    # each rank holding the other's half (with the offsets of its own) is a different loss
    case = BY_NAME["ce_swapped"]
    want, _ = _reference(BY_NAME["ce_equal"])  # the same inputs
    for res in ranks[2]:
        with pytest.raises(AssertionError):
            _assert_matches(res["ce_swapped"]["loss"][0], want[0], **_tol(case, "loss"))
    # one rank's slice alone, as if it were the whole vocabulary, is a different loss
    inp = _inputs(case)
    half = inp["logits"][:, :18]
    t = inp["target"]
    local_t = torch.where((t >= 0) & (t < 18), t, IGNORE)
    alone = F.cross_entropy(half.double(), local_t, ignore_index=IGNORE)
    with pytest.raises(AssertionError):
        _assert_matches(alone, want[0], **_tol(case, "loss"))
    assert abs(alone.item() - want[0].item()) > 0.1


def test_errors_are_raised_on_every_rank(ranks):
    expect = {
        "target_out_of_range": ("ValueError", "not a class index"),
        "target_shape": ("ValueError", "leading shape"),
        "shard_sizes_mismatch": ("ValueError", "shard_sizes"),
        "shard_sizes_length": ("ValueError", "one size >= 0 per rank"),
        "rows_differ": ("ValueError", "different numbers of tokens"),
        "targets_differ": ("ValueError", "different targets"),
        "class_weight_shape": ("ValueError", "this rank's slice"),
        "hidden_width": ("ValueError", "H = 16"),
        "dtensor_replicated": ("ValueError", "sharded along its vocabulary"),
        "dtensor_and_group": ("ValueError", "leave group"),
    }
    for res in ranks[2]:
        errors = res["errors"]
        assert errors.pop("still_fine") is None
        assert set(errors) == set(expect)
        for key, (kind, text) in expect.items():
            assert errors[key] is not None, key
            assert errors[key][0] == kind and text in errors[key][1], (key, errors[key])


def test_no_process_group_is_an_error():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(RuntimeError, match="no process group"):
        vocab_parallel_cross_entropy(torch.randn(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="no process group"):
        vocab_parallel_fused_linear_cross_entropy(
            torch.randn(3, 4), torch.randn(5, 4), torch.zeros(3, dtype=torch.long)
        )


def test_local_checks_come_before_any_collective():
    # argument errors need no group: they are raised before the layout is resolved
    with pytest.raises(TypeError, match="int64 or int32"):
        vocab_parallel_cross_entropy(torch.randn(3, 5), torch.zeros(3))
    with pytest.raises(ValueError, match="reduction"):
        vocab_parallel_cross_entropy(torch.randn(3, 5), torch.zeros(3).long(), reduction="avg")


# --------------------------------------------------------------------------- the kernels alone

# Small blocks: rows of several blocks and a masked tail (the interpreter's table row is one
# block for the gloo tests' slices).
STATS_CFG = LaunchConfig(block_n=16)


def _kernels_on_slices(x, t, sizes, cw, o, *, scale, reverse, in_place):
    """The per-slice kernels on each slice of x [M, V] with the collectives done by hand:
    (loss rows, lse, z rows) of every rank, and the gradient slices concatenated."""
    M, V = x.shape
    grad_cfg = LaunchConfig(block_n=8, reverse_pass=reverse)
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    xs = [x[:, a : a + n].clone() for a, n in zip(starts, sizes, strict=True)]
    ws = [cw[a : a + n].float().contiguous() if cw is not None else None
          for a, n in zip(starts, sizes, strict=True)]  # fmt: skip
    stats = []
    for xr, wr, a in zip(xs, ws, starts, strict=True):
        s = RowStats.new(M, o.label_smoothing > 0.0, cw is not None, x.device)
        if wr is not None:
            s.wsum.copy_(wr.sum())
        stats_launch(xr, t, wr, s, a, o, config=STATS_CFG)
        stats.append(s)
    gm = torch.stack([s.gm for s in stats]).amax(0)  # all_reduce(MAX)
    for s in stats:
        s.gm.copy_(gm)
        rescale_launch(s)
    total = torch.stack([s.flat for s in stats]).sum(0)  # all_reduce(SUM)
    outs, grads = [], []
    for xr, wr, s, a in zip(xs, ws, stats, starts, strict=True):
        loss, lse, z = (torch.full((M,), float("nan"), device=x.device) for _ in range(3))
        g = xr if in_place else torch.full_like(xr, float("nan"))
        s.flat.copy_(total)
        loss_grad_launch(xr, t, wr, s, loss, lse, z_loss=z, grad=g, scale=scale, start=a,
                         vocab=V, o=o, config=grad_cfg)  # fmt: skip
        outs.append((loss, lse, z))
        grads.append(g)
    return outs, torch.cat(grads, 1)


# fmt: off
KERNEL_CASES = {
    # uneven slices, class weights with smoothing, z-loss, a per-row scale, reversed blocks
    "weights": dict(sizes=[23, 22], dtype=torch.float32, weights=True, label_smoothing=0.1,
                    lse_square_scale=1e-3, per_row=True, reverse=True, in_place=False),
    # an empty slice, soft-capping, in place, one scale for all rows
    "softcap_empty": dict(sizes=[20, 0, 25], dtype=torch.float32, weights=False,
                          label_smoothing=0.2, softcap=4.0, per_row=False, reverse=False,
                          in_place=True),
    # a row whose second slice is all -inf (a padded vocabulary): exact zeros there
    "neg_inf_slice": dict(sizes=[23, 22], dtype=torch.float32, weights=False,
                          lse_square_scale=1e-2, per_row=True, reverse=False, in_place=False),
    # bf16 logits: fp32 math, a bf16 gradient (the interpreter truncates its stores)
    "bf16": dict(sizes=[23, 22], dtype=torch.bfloat16, weights=True, label_smoothing=0.1,
                 per_row=True, reverse=True, in_place=True),
}
# fmt: on


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_slice_kernels_equal_the_unsplit_loss(name):
    c = KERNEL_CASES[name]
    g = torch.Generator().manual_seed(len(name))
    M, V = 6, sum(c["sizes"])
    x = (torch.randn(M, V, generator=g) * 3).to(c["dtype"])
    t = torch.randint(0, V, (M,), generator=g)
    t[2] = IGNORE
    t[0], t[1] = 0, V - 1
    if name == "neg_inf_slice":
        x[4, 23:] = -float("inf")
        t[4] = 5
    cw = torch.rand(V, generator=g) + 0.5 if c["weights"] else None
    scale = torch.randn(M, generator=g) if c["per_row"] else torch.full((1,), 0.3)
    o = Options(IGNORE, c.get("label_smoothing", 0.0), c.get("lse_square_scale", 0.0),
                c.get("softcap"))  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels run where torch does
    x, t, scale = x.to(device), t.to(device), scale.to(device)
    cw = cw.to(device) if cw is not None else None
    with poisoned():
        outs, grad = _kernels_on_slices(x, t, c["sizes"], cw, o, scale=scale,
                                        reverse=c["reverse"], in_place=c["in_place"])  # fmt: skip
    xr = x.double().requires_grad_()
    kw = dict(ignore_index=IGNORE, label_smoothing=o.label_smoothing,
              lse_square_scale=o.lse_square_scale, softcap=o.softcap,
              dtype=torch.float64)  # fmt: skip
    rows, z_rows = cross_entropy_ref(xr, t, cw, reduction="none", return_z_loss=True, **kw)
    (rows * scale.double()).sum().backward()
    z = xr.detach() if o.softcap is None else o.softcap * torch.tanh(xr.detach() / o.softcap)
    lse = torch.where(t != IGNORE, torch.logsumexp(z, -1), 0.0)
    for loss_r, lse_r, z_r in outs:  # every rank: the whole row's loss
        _assert_matches(loss_r, rows.detach(), atol=1e-5, rtol=1e-5)
        _assert_matches(lse_r, lse, atol=1e-5, rtol=1e-5)
        _assert_matches(z_r, z_rows, atol=1e-6, rtol=1e-5)
    assert grad.dtype == c["dtype"]
    tol = dict(atol=1e-6, rtol=1e-4) if c["dtype"] == torch.float32 else dict(atol=1e-3, rtol=2e-2)
    _assert_matches(grad, xr.grad, **tol)
    assert (grad[2] == 0).all()  # the ignored row
    if name == "neg_inf_slice":
        assert (grad[4, 23:] == 0).all()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run compiles these for real")
def test_slice_kernels_compile_for_hopper():
    # The tables' GPU configs with every option on (bf16 logits, in place), then with none and
    # no gradient; the compiler rejects code the interpreter runs.
    from kernelwright.testing.gpu_compile import check_compiles

    stats_cfg, grad_cfg = (TABLE[k]["default"][0][1] for k in ("stats", "grad"))

    def run():
        x, t = torch.randn(2, 5008, dtype=torch.bfloat16), torch.tensor([3, 7000])
        for full in (True, False):
            w = torch.rand(5008) if full else None
            o = Options(IGNORE, 0.1 * full, 1e-3 * full, 30.0 if full else None)
            s = RowStats.new(2, full, full, "cpu")
            stats_launch(x, t, w, s, 2000, o, config=stats_cfg)
            rescale_launch(s)
            loss_grad_launch(x, t, w, s, torch.empty(2), s.m, z_loss=torch.empty(2) if full
                             else None, grad=x if full else None, scale=torch.ones(2) if full
                             else None, start=2000, vocab=9008, o=o, config=grad_cfg)  # fmt: skip

    results = check_compiles(run)
    failures = [f"{r.launch.name}: {r.error}" for r in results if not r.ok]
    assert not failures, "\n".join(failures)
    assert len(results) == 5
