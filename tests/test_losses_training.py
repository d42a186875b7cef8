"""kernelwright.losses as a training step uses them: gradient accumulation (`num_items_in_batch`),
ignored tokens, data-parallel gradients (DDP, FSDP2; 2 gloo processes, one spawn for every
case) and tied embeddings. Each gradient is compared with the one of the whole batch in one
process, on a tiny policy: a Linear backbone (tanh) and a Linear lm_head with a bias."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import DEVICE

from kernelwright.losses import (
    dpo_loss,
    fused_linear_distill,
    fused_linear_logprobs,
    fused_linear_logprobs_ref,
    grpo_loss,
    head_weight,
    sequence_logprobs,
)
from kernelwright.losses.distill import divergence
from kernelwright.losses.logprobs import logits_ref

H, HT, V, T = 16, 12, 37, 6  # hidden (student, teacher), vocabulary, tokens per row
KINDS = ("sft", "dapo", "grpo", "distill", "dpo")


class _Policy(torch.nn.Module):
    """The backbone and lm_head of a policy; forward(kind, batch) is that loss on the batch,
    through the fused functions or (fused=False) through the full fp32 logits."""

    def __init__(self, params: dict):
        super().__init__()
        self.body = torch.nn.Linear(H, H)
        self.head = torch.nn.Linear(H, V)
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(params[name])

    def forward(self, kind, b, n=None, ga=1, fused=True):
        w, bias = self.head.weight, self.head.bias
        logprobs = fused_linear_logprobs if fused else fused_linear_logprobs_ref
        if kind == "dpo":  # chosen and rejected in one pass, as TRL concatenates them
            h = torch.tanh(self.body(torch.cat([b["xc"], b["xr"]])))
            t = torch.cat([b["tc"], b["tr"]])
            seq = sequence_logprobs(logprobs(h, w, t, bias=bias), t != -100)
            c, r = seq.chunk(2)
            return dpo_loss(c, r, b["refc"], b["refr"], beta=0.5)[0].mean()
        h, t = torch.tanh(self.body(b["x"])), b["target"]
        if kind == "sft":  # a caller's own token-mean, with a non-default ignore_index
            t = torch.where(t == -100, -1, t)
            return -logprobs(h, w, t, bias=bias, ignore_index=-1).sum() / n
        if kind == "distill":
            if fused:
                kw = {"beta": 0.5, "temperature": 0.9, "num_items_in_batch": n}
                return fused_linear_distill(h, w, b["ht"], b["wt"], t, student_bias=bias, **kw)
            keep = t != -100
            s_logits = logits_ref(h[keep], w, bias)
            return divergence(s_logits, b["ht"][keep] @ b["wt"].T, 0.5, 0.9).sum() / n
        logps = logprobs(h, w, t, bias=bias)
        loss, _ = grpo_loss(logps, b["adv"], t != -100, loss_type=kind,
                            num_items_in_batch=n, gradient_accumulation_steps=ga)  # fmt: skip
        return loss


def _data(seed: int = 0) -> dict:
    """Initial parameters and one batch per loss: 4 rows (4 pairs for DPO) whose prompts
    (ignored targets) differ in length, so that micro-batches and ranks hold different token
    counts."""
    g = torch.Generator().manual_seed(seed)
    params = {"body.weight": torch.randn(H, H, generator=g) * 0.4,
              "body.bias": torch.randn(H, generator=g) * 0.1,
              "head.weight": torch.randn(V, H, generator=g) * 0.5,
              "head.bias": torch.randn(V, generator=g) * 0.2}  # fmt: skip

    def target(prompts):
        t = torch.randint(0, V, (len(prompts), T), generator=g)
        for i, p in enumerate(prompts):
            t[i, :p] = -100
        return t

    def rows(prompts):
        return {"x": torch.randn(len(prompts), T, H, generator=g), "target": target(prompts)}

    batches = {k: rows((1, 4, 0, 2)) for k in ("sft", "dapo", "grpo", "distill")}
    for k in ("dapo", "grpo"):
        batches[k]["adv"] = torch.randn(4, generator=g)
    batches["distill"]["ht"] = torch.randn(4, T, HT, generator=g)
    batches["distill"]["wt"] = torch.randn(V, HT, generator=g) * 0.5
    batches["dpo"] = {"xc": torch.randn(4, T, H, generator=g), "tc": target((2, 0, 3, 1)),
                      "xr": torch.randn(4, T, H, generator=g), "tr": target((2, 0, 3, 1)),
                      "refc": torch.randn(4, generator=g) - 20,
                      "refr": torch.randn(4, generator=g) - 20}  # fmt: skip
    return {"params": params, "batches": batches}


def _rows(batch: dict, sl: slice) -> dict:
    """The rows `sl` of a batch (the teacher's lm_head is not per row)."""
    return {k: v if k == "wt" else v[sl] for k, v in batch.items()}


def _count(kind: str, batch: dict) -> int:
    """The target tokens of a batch: the `num_items_in_batch` of the token-normalised losses."""
    return int(batch["target"].ne(-100).sum()) if kind in ("sft", "dapo", "distill") else None


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _whole_batch_grads(data: dict, kind: str, fused: bool) -> dict[str, torch.Tensor]:
    b = {k: v.to(DEVICE) for k, v in data["batches"][kind].items()}
    model = _Policy(data["params"]).to(DEVICE)
    model(kind, b, _count(kind, b), fused=fused).backward()
    return _grads(model)


def _assert_grads_equal(got: dict, want: dict) -> None:
    for name in want:
        assert want[name].abs().sum() > 0, name  # a gradient that can be wrong
        torch.testing.assert_close(got[name], want[name], atol=2e-6, rtol=1e-5, msg=name)


# ---- gradient accumulation -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sft", "dapo", "grpo", "distill"])
def test_micro_batch_gradients_sum_to_the_whole_batch_gradient(kind):
    # two micro-batches of 2 rows (5 and 10 target tokens), backward on each into the same
    # .grad: with num_items_in_batch = the window's target tokens ("grpo": a per-sequence mean,
    # divided by gradient_accumulation_steps), the sum is the whole batch's gradient through the
    # full fp32 logits
    data = _data(1)
    batch = {k: v.to(DEVICE) for k, v in data["batches"][kind].items()}
    model = _Policy(data["params"]).to(DEVICE)
    n = _count(kind, batch)
    for sl in (slice(0, 2), slice(2, 4)):
        model(kind, _rows(batch, sl), n, ga=2).backward()
    _assert_grads_equal(_grads(model), _whole_batch_grads(data, kind, fused=False))


# ---- DDP and FSDP2: 2 gloo processes, one spawn --------------------------------------------


def _ddp_grads(kind: str, data: dict, rank: int, world: int) -> dict[str, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_Policy(data["params"]))
    b = data["batches"][kind]
    per_rank = b[next(iter(b))].shape[0] // world
    mine = _rows(b, slice(rank * per_rank, (rank + 1) * per_rank))
    # DDP averages the ranks' gradients. A token-normalised loss divides by the global target
    # count over the world size (each rank its own tokens: the mean of the ranks' gradients is
    # then the global sum / the global count); a mean over sequences or pairs, with as many on
    # every rank, is the global mean as it is.
    n = _count(kind, b)
    model(kind, mine, None if n is None else n / world).backward()
    return _grads(model.module)


def _fsdp_grad(data: dict, rank: int, world: int) -> torch.Tensor:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(data["params"]["head.weight"])
    fully_shard(head, mesh=init_device_mesh("cpu", (world,)))
    weight, _ = head_weight(head)  # outside the module's forward: the sharded DTensor, gathered
    b = data["batches"]["sft"]
    rows = slice(rank * 2, rank * 2 + 2)
    fused_linear_logprobs(b["x"][rows], weight, b["target"][rows]).sum().backward()
    # FSDP2 reduce-scatters the gradient as a mean over ranks
    return head.weight.grad.full_tensor()


def _rank_main(rank: int, world: int, init: str, data: dict, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        results = {kind: _ddp_grads(kind, data, rank, world) for kind in KINDS}
        results["fsdp"] = _fsdp_grad(data, rank, world)
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    os._exit(0)  # saved: skip C++ teardown, where gloo's threads abort now and then


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[dict, list[dict]]:
    if DEVICE.type == "cuda":
        pytest.skip("gloo processes on CPU tensors: the CPU suite runs it")
    import torch.multiprocessing as mp

    tmp, data = tmp_path_factory.mktemp("ddp"), _data(2)
    mp.spawn(_rank_main, args=(2, str(tmp / "init"), data, str(tmp)), nprocs=2)
    return data, [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_under_ddp_equals_the_global_batch(ranks, kind):
    # each rank its half of the batch (other target counts), the loss written as _ddp_grads
    # says: every rank's all-reduced gradient, backbone and lm_head, is the whole batch's.
    # fused_linear_distill computes its gradient in the forward: it must still reach DDP's hooks
    data, results = ranks
    want = _whole_batch_grads(data, kind, fused=True)
    for got in results:
        _assert_grads_equal(got[kind], want)


def test_head_weight_gathers_an_fsdp2_sharded_lm_head(ranks):
    data, results = ranks
    b = data["batches"]["sft"]
    w = data["params"]["head.weight"].clone().requires_grad_()
    (fused_linear_logprobs_ref(b["x"], w, b["target"]).sum() / 2).backward()
    for got in results:
        torch.testing.assert_close(got["fsdp"], w.grad, atol=1e-5, rtol=1e-5)


# ---- tied embeddings -----------------------------------------------------------------------


class _Tied(torch.nn.Module):
    """Token embeddings, a Linear backbone, and an lm_head that shares the embedding's weight
    (as `tie_word_embeddings` ties them)."""

    def __init__(self, g: torch.Generator):
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.body = torch.nn.Linear(H, H)
        self.lm_head = torch.nn.Linear(H, V, bias=False)
        self.lm_head.weight = self.embed.weight
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, ids):
        return torch.tanh(self.body(self.embed(ids)))


@pytest.mark.parametrize("loss", ["logprobs", "distill"])
def test_tied_embedding_gets_both_gradients(loss):
    # the shared weight's gradient is the embedding lookup's plus the lm_head's: through the
    # fused functions as through the module's full logits
    g = torch.Generator().manual_seed(3)
    model = _Tied(g).to(DEVICE)
    ids = torch.randint(0, V, (3, T), generator=g).to(DEVICE)
    target = torch.roll(ids, -1, dims=1)
    target[:, -1], target[0, :2] = -100, -100
    ht, wt = torch.randn(3, T, HT, generator=g).to(DEVICE), torch.randn(V, HT, generator=g)
    wt, dy = wt.to(DEVICE), torch.randn(3, T, generator=g).to(DEVICE)
    keep = target != -100

    def step(fused: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        h = model(ids)
        weight, _ = head_weight(model.lm_head)
        assert weight is model.embed.weight
        if loss == "logprobs" and fused:
            out = (fused_linear_logprobs(h, weight, target) * dy).sum()
        elif loss == "logprobs":
            logp = model.lm_head(h).log_softmax(-1)
            picked = logp.gather(-1, target.clamp(min=0)[..., None])[..., 0]
            out = (torch.where(keep, picked, 0.0) * dy).sum()
        elif fused:
            out = fused_linear_distill(h, weight, ht, wt, target, beta=0.3)
        else:
            out = divergence(model.lm_head(h)[keep], ht[keep] @ wt.T, 0.3, 1.0).mean()
        out.backward()
        return _grads(model)

    got, want = step(fused=True), step(fused=False)
    assert set(got) == {"embed.weight", "body.weight", "body.bias"}  # one shared parameter
    _assert_grads_equal(got, want)
