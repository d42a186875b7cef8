"""Patched Hugging Face models under DDP and FSDP2 (`fully_shard`), LoRA and activation
checkpointing included: on 2 gloo CPU processes, each rank on its own batch, three AdamW steps
of the patched model give the losses and the parameters of the unpatched model under the same
wrapper (fp32)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import DEVICE

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

# (model type, wrapper, LoRA on q/v, activation checkpointing)
CASES = [
    ("llama", "ddp", False, False),
    ("llama", "fsdp2", False, True),
    ("llama", "fsdp2", True, True),
    ("qwen3", "fsdp2", False, True),
]
STEPS = 3
_PROFILES: dict = {}  # in each rank: one analysis per model type, the later cases patch from it


def _build(model_type: str, patched: bool, lora: bool, ckpt: bool):
    from transformers import AutoModelForCausalLM

    import kernelwright
    from kernelwright.testing.model_configs import ATTN_IMPLEMENTATION, tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type),
                                             attn_implementation=ATTN_IMPLEMENTATION)  # fmt: skip
    if lora:
        cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        model = peft.get_peft_model(model, cfg)
        torch.manual_seed(1)
        for name, p in model.named_parameters():  # B starts at zero: make the adapters matter
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    if patched:
        kernelwright.patch(model, _PROFILES.get(model_type))
        from kernelwright.integrations.transformers import patch_record

        record = patch_record(model)
        _PROFILES.setdefault(model_type, record.profile)
        kinds = {m.kind for m in record.modules}
        assert {"norm", "mlp", "causal_lm"} <= kinds, record.patched()  # not a vacuous patch
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _wrap(model, wrapper: str, mesh):
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in base.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full_params(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name.replace("module.", "")] = t.detach().clone()
    return out


def _rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        results = {}
        for model_type, wrapper, lora, ckpt in CASES:
            for patched in (False, True):
                built = _build(model_type, patched, lora, ckpt)
                vocab = built.config.vocab_size
                model = _wrap(built, wrapper, mesh)
                trainable = [p for p in model.parameters() if p.requires_grad]
                opt = torch.optim.AdamW(trainable, lr=1e-3)
                losses = []
                for step in range(STEPS):
                    g = torch.Generator().manual_seed(100 * step + rank)  # a batch per rank
                    ids = torch.randint(3, vocab, (2, 12), generator=g)
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    losses.append(loss.item())
                results[(model_type, wrapper, lora, ckpt, patched)] = (
                    losses, _full_params(model))  # fmt: skip
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    os._exit(0)  # saved: skip C++ teardown, where gloo's threads abort now and then


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_rank, args=(2, str(tmp / "init"), str(tmp)), nprocs=2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.skipif(DEVICE.type == "cuda", reason="gloo on CPU tensors: the CPU suite runs it")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}{'-lora' if c[2] else ''}"
                         f"{'-ckpt' if c[3] else ''}")  # fmt: skip
def test_patched_model_trains_like_the_unpatched_under_the_wrapper(runs, case):
    model_type, wrapper, lora, ckpt = case
    for rank, results in enumerate(runs):
        want_losses, want_params = results[(model_type, wrapper, lora, ckpt, False)]
        got_losses, got_params = results[(model_type, wrapper, lora, ckpt, True)]
        assert all(a != b for a, b in zip(want_losses, want_losses[1:], strict=False)), (
            "the model must train"
        )
        torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses),
                                   atol=1e-5, rtol=1e-5, msg=f"rank {rank} losses")  # fmt: skip
        assert got_params.keys() == want_params.keys()
        for name, want in want_params.items():
            torch.testing.assert_close(got_params[name], want, atol=1e-5, rtol=1e-4, msg=name)
    # the wrapper keeps the ranks' parameters equal (gradients all-reduced) ...
    for name, p in runs[0][(model_type, wrapper, lora, ckpt, True)][1].items():
        torch.testing.assert_close(runs[1][(model_type, wrapper, lora, ckpt, True)][1][name], p,
                                   msg=name)  # fmt: skip
    # ... while the ranks saw different batches (their losses differ)
    assert runs[0][(model_type, wrapper, lora, ckpt, True)][0] != runs[1][
        (model_type, wrapper, lora, ckpt, True)][0]  # fmt: skip
