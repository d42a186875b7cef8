"""kernelwright inside TRL's trainers (kernelwright.integrations.trl), TRL as the oracle.

- The adapter against TRL's own chunked log-prob function: every output and the gradients.
- Our loss formulas against the loss TRL's DPOTrainer computes on the same batch.
- DPO, KTO and GRPO trainers train a tiny Llama a few steps with TRL's path and with ours:
  the loss curves match.
- Distillation: fused_linear_distill against TRL's generalized JSD (GKD's, on full logits), the
  adapter against DistillationTrainer's own loss function, and that trainer's curves.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
try:  # TRL's trainers need datasets, pandas, accelerate (the GPU machine has TRL's wheel alone)
    import datasets
    import trl.trainer.utils  # noqa: F401
except ImportError:
    datasets = None
needs_trainers = pytest.mark.skipif(datasets is None, reason="needs TRL's trainer dependencies")
if datasets is None:  # TRL's kernels import one context manager (DeepSpeed's) from there
    import contextlib
    import sys
    import types

    sys.modules["trl.trainer.utils"] = types.ModuleType("trl.trainer.utils")
    sys.modules["trl.trainer.utils"].maybe_gather_lm_head_ctx = lambda *p: contextlib.nullcontext()

from kernelwright.integrations import trl as kw_trl  # noqa: E402
from kernelwright.losses import dpo_loss, fused_linear_logprobs, sequence_logprobs  # noqa: E402
from kernelwright.losses.logprobs import fused_linear_logprobs_ref  # noqa: E402

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "log",
    "red",
    "blue",
    "big",
    "small",
    "yes",
    "no",
    "good",
    "bad",
]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def _model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


def _sentences(n: int, length: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(WORDS), (n, length), generator=g)
    return [" ".join(WORDS[i] for i in row) for row in idx.tolist()]


def _preference_data(n: int = 8):
    prompts = _sentences(n, 3, 1)
    return datasets.Dataset.from_dict(
        {"prompt": prompts, "chosen": _sentences(n, 4, 2), "rejected": _sentences(n, 3, 3)}
    )


def _common(tmp_path, **kw):
    return dict(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=5e-2,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=DEVICE.type == "cpu", seed=0,
        dataloader_num_workers=0, bf16=False, **kw,
    )  # fmt: skip


def _losses(trainer) -> list[float]:
    """Each logged step's loss and gradient norm."""
    return [v for row in trainer.state.log_history if "loss" in row
            for v in (row["loss"], row["grad_norm"])]  # fmt: skip


# ---- the adapter against TRL's function ----------------------------------------------------


@pytest.mark.parametrize(
    "opts", [dict(temperature=1.0), dict(temperature=0.7, softcap=5.0, logit_scale=1.3)]
)
def test_adapter_matches_trls_chunked_logprob_function(opts):
    from trl.kernels import ChunkedLogProbFunction

    g = torch.Generator().manual_seed(0)
    N, H, V = 29, 16, 61
    outputs = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    h = torch.randn(N, H, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(V, H, generator=g).mul(0.5).to(DEVICE).requires_grad_()
    b = torch.randn(V, generator=g).to(DEVICE).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g).to(DEVICE)
    args = (h, w, b, t, opts["temperature"], 16, opts.get("softcap"), opts.get("logit_scale", 1.0))
    got = kw_trl.KernelwrightLogProbs.apply(*args, outputs)
    want = ChunkedLogProbFunction.apply(*args, outputs)
    for name, a, e in zip(outputs, got, want, strict=True):
        if name == "is_top1":
            assert a.dtype == e.dtype == torch.bool and (a == e).all()
        else:
            torch.testing.assert_close(a, e, atol=2e-5, rtol=1e-5, msg=name)
    dl, de = (torch.randn(N, generator=g).to(DEVICE) for _ in range(2))
    ga = torch.autograd.grad((got[0] * dl + got[1] * de).sum(), [h, w, b])
    ge = torch.autograd.grad((want[0] * dl + want[1] * de).sum(), [h, w, b])
    for a, e in zip(ga, ge, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    # only what is asked is computed
    few = kw_trl.KernelwrightLogProbs.apply(*args, ("log_probs",))
    assert few[1:] == (None, None, None, None)


@pytest.mark.parametrize("head_grad", [True, False])
def test_adapter_options_give_the_default_values_and_gradients(head_grad):
    # backward="stored" (the logits kept for a trainable head; a frozen head's metric entropy
    # lets it keep one gradient row per token) against the default recomputing function
    g = torch.Generator().manual_seed(1)
    N, H, V = 23, 12, 37
    outputs = ("log_probs", "entropy", "mean_logits", "is_top1")  # what DPOTrainer asks
    h = torch.randn(N, H, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(V, H, generator=g).mul(0.5).to(DEVICE).requires_grad_(head_grad)
    b = torch.randn(V, generator=g).to(DEVICE).requires_grad_(head_grad)
    t = torch.randint(0, V, (N,), generator=g).to(DEVICE)
    dl, de = (torch.randn(N, generator=g).to(DEVICE) for _ in range(2))
    args = (h, w, b, t, 0.8, 16, None, 1.0, outputs)
    params = [p for p in (h, w, b) if p.requires_grad]
    fn = kw_trl.KernelwrightLogProbs.configured(backward="stored", entropy_grad=head_grad)
    assert (fn.backward, fn.entropy_grad) == ("stored", head_grad)
    assert kw_trl.KernelwrightLogProbs.configured() is kw_trl.KernelwrightLogProbs
    got, want = fn.apply(*args), kw_trl.KernelwrightLogProbs.apply(*args)
    assert got[2] is None and want[2] is None  # log_sum_sq_probs: not asked
    for name, a, e in zip(outputs, (got[:2] + got[3:]), (want[:2] + want[3:]), strict=True):
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=name)

    def loss(out):  # the entropy is trained on only when it may be
        return (out[0] * dl + (out[1] * de if head_grad else 0)).sum()

    for a, e in zip(_grads(loss(got), params), _grads(loss(want), params), strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
    if not head_grad:
        with pytest.raises(RuntimeError, match="entropy_grad=False"):
            torch.autograd.grad((got[0] * dl + got[1] * de).sum(), h)
    with pytest.raises(ValueError, match="backward must be one of"):
        kw_trl.KernelwrightLogProbs.configured(backward="keep")


def _grads(loss, params):
    return torch.autograd.grad(loss, params, retain_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 rounding of the GPU")
def test_adapter_in_bf16_is_as_accurate_as_trls_function():
    # On the GPU, in bf16: the log-probs, the entropy and the gradients are as close to the
    # fp32 reference as TRL's own function's (the interpreter's bf16 casts truncate).
    from trl.kernels import ChunkedLogProbFunction

    g = torch.Generator(device="cuda").manual_seed(0)
    N, H, V = 3000, 1024, 32003
    h = torch.randn(N, H, generator=g, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(V, H, generator=g, device="cuda") * H**-0.5).bfloat16().requires_grad_()
    t = torch.randint(0, V, (N,), generator=g, device="cuda")
    dl, de = torch.randn(N, 2, generator=g, device="cuda").unbind(-1)
    outs = ("log_probs", "entropy")
    ref_l, ref_e = fused_linear_logprobs_ref(h, w, t, return_entropy=True)
    ref = torch.autograd.grad((ref_l * dl + ref_e * de).sum(), [h, w])

    def errors(f):
        lp, ent = f.apply(h, w, None, t, 1.0, 32768, None, 1.0, outs)[:2]
        grads = torch.autograd.grad((lp * dl + ent * de).sum(), [h, w])
        return [(a.float() - b.float()).abs().max().item()
                for a, b in zip((lp, ent, *grads), (ref_l, ref_e, *ref), strict=True)]  # fmt: skip

    ours, theirs = errors(kw_trl.KernelwrightLogProbs), errors(ChunkedLogProbFunction)
    for name, a, b in zip(("log_probs", "entropy", "grad_h", "grad_w"), ours, theirs, strict=True):
        assert a <= 1.5 * b + 1e-3, f"{name}: ours {a:.3g}, TRL's {b:.3g}"


@needs_trainers
def test_enable_swaps_and_restores_trls_function():
    import trl.trainer.utils as utils

    original = utils._ChunkedLogProbFunction
    with kw_trl.enabled():
        assert utils._ChunkedLogProbFunction is kw_trl.KernelwrightLogProbs
        kw_trl.enable()  # idempotent
    assert utils._ChunkedLogProbFunction is original and not kw_trl.is_enabled()


@needs_trainers
def test_enable_passes_the_options_and_restores_the_earlier_ones():
    import trl.trainer.utils as utils

    original = utils._ChunkedLogProbFunction
    with kw_trl.enabled(backward="stored"):
        stored = utils._ChunkedLogProbFunction
        assert (stored.backward, stored.entropy_grad) == ("stored", True)
        with kw_trl.enabled(backward="stored", entropy_grad=False):
            inner = utils._ChunkedLogProbFunction
            assert (inner.backward, inner.entropy_grad) == ("stored", False)
            kw_trl.enable(backward="stored", entropy_grad=False)  # idempotent
            assert utils._ChunkedLogProbFunction is inner
        assert utils._ChunkedLogProbFunction is stored
        kw_trl.enable()  # back to the defaults, TRL's function still the one to restore
        assert utils._ChunkedLogProbFunction is kw_trl.KernelwrightLogProbs
    assert utils._ChunkedLogProbFunction is original and not kw_trl.is_enabled()
    with pytest.raises(ValueError, match="backward must be one of"):
        kw_trl.enable(backward="keep")
    assert utils._ChunkedLogProbFunction is original


@needs_trainers
def test_enable_refuses_a_function_with_another_signature(monkeypatch):
    import trl.trainer.utils as utils

    class Other(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, targets):  # a future TRL's, say
            return hidden

    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", Other)
    with pytest.raises(RuntimeError, match="not supported"):
        kw_trl.enable()
    assert utils._ChunkedLogProbFunction is Other


# ---- our loss formulas against TRL's DPOTrainer ---------------------------------------------


@needs_trainers
@pytest.mark.filterwarnings("ignore:dpo_loss. label_smoothing has no effect")
@pytest.mark.parametrize("loss_type, smoothing", [("sigmoid", 0.2), ("ipo", 0.2)])
def test_dpo_loss_equals_trls_dpo_trainer(tmp_path, loss_type, smoothing):
    # end to end through a real trainer's batch (prompt masks, IPO's length normalisation);
    # every loss type and smoothing, with gradients, is in tests/test_losses_trl.py
    from trl import DPOConfig, DPOTrainer

    model, ref = _model(0), _model(1)
    cfg = DPOConfig(**_common(tmp_path, beta=0.3, loss_type=loss_type,
                              label_smoothing=smoothing))  # fmt: skip
    trainer = DPOTrainer(model=model, ref_model=ref, args=cfg, train_dataset=_preference_data(),
                         processing_class=_tokenizer())  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, batch)

        def seq_logps(m):
            ids, mask = batch["input_ids"], batch["completion_mask"]
            hidden = m.model(input_ids=ids, attention_mask=batch["attention_mask"])[0]
            target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            lp = fused_linear_logprobs(hidden[:, :-1], m.lm_head.weight, target)
            return sequence_logprobs(lp, mask[:, 1:]), mask[:, 1:].sum(-1)

        pol, n_tok = seq_logps(model)
        refl, _ = seq_logps(ref)
        pc, pr = pol.chunk(2)
        rc, rr = refl.chunk(2)
        lc, lr = n_tok.chunk(2)
        kw = dict(beta=0.3, loss_type=loss_type, label_smoothing=smoothing)
        if loss_type == "ipo":
            pc, pr, rc, rr = pc / lc, pr / lr, rc / lc, rr / lr
        ours = dpo_loss(pc, pr, rc, rr, **kw)
        ours = ours[0] if isinstance(ours, tuple) else ours
    torch.testing.assert_close(ours.mean(), trl_loss, atol=1e-4, rtol=1e-4)


# ---- trainers: TRL's path vs ours ------------------------------------------------------------


def _run(build) -> list[float]:
    trainer = build()
    trainer.train()
    return _losses(trainer)


def _check_curves(build, monkeypatch):
    want = _run(build)
    calls = []
    apply = kw_trl.KernelwrightLogProbs.apply

    def counted(*args):
        calls.append(args[0].shape)
        return apply(*args)

    monkeypatch.setattr(kw_trl.KernelwrightLogProbs, "apply", staticmethod(counted))
    with kw_trl.enabled():
        got = _run(build)
    assert calls, "the trainer never reached kernelwright's log-prob function"
    assert len(want) == len(got) >= 6
    assert all(torch.isfinite(torch.tensor(want)))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=1e-4)
    return want[::2]


@needs_trainers
def test_dpo_trainer_trains_the_same_on_kernelwright(tmp_path, monkeypatch):
    from trl import DPOConfig, DPOTrainer

    def build():
        cfg = DPOConfig(**_common(tmp_path, beta=0.2))
        data, tok = _preference_data(), _tokenizer()
        return DPOTrainer(model=_model(0), ref_model=_model(1), args=cfg, train_dataset=data,
                          processing_class=tok)  # fmt: skip

    curve = _check_curves(build, monkeypatch)
    assert curve[-1] < curve[0]  # it learns: the loss falls


@needs_trainers
def test_kto_trainer_trains_the_same_on_kernelwright(tmp_path, monkeypatch):
    from trl import KTOConfig, KTOTrainer

    n = 8
    data = datasets.Dataset.from_dict({
        "prompt": _sentences(n, 3, 4), "completion": _sentences(n, 4, 5),
        "label": [i % 2 == 0 for i in range(n)],
    })  # fmt: skip

    def build():
        return KTOTrainer(model=_model(0), ref_model=_model(1),
                          args=KTOConfig(**_common(tmp_path, beta=0.2)),
                          train_dataset=data, processing_class=_tokenizer())  # fmt: skip

    _check_curves(build, monkeypatch)


@needs_trainers
def test_grpo_trainer_trains_the_same_on_kernelwright(tmp_path, monkeypatch):
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kwargs):  # longer completions with "good" score higher
        return [c.count("good") + 0.1 * len(c.split()) for c in completions]

    data = datasets.Dataset.from_dict({"prompt": _sentences(8, 3, 6)})
    # with beta > 0 GRPO loads its reference model from the policy's path
    path = tmp_path / "policy"
    _model(0).save_pretrained(path)

    def build():
        torch.manual_seed(0)
        cfg = GRPOConfig(**_common(tmp_path, beta=0.1, num_generations=2,
                                   max_completion_length=6, temperature=0.9))  # fmt: skip
        return GRPOTrainer(model=str(path), reward_funcs=reward, args=cfg, train_dataset=data,
                           processing_class=_tokenizer())  # fmt: skip

    _check_curves(build, monkeypatch)


# ---- distillation: TRL's DistillationTrainer loss on fused_linear_distill -------------------


@needs_trainers
@pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'")
@pytest.mark.parametrize("beta, temperature", [(0.0, 1.0), (1.0, 0.7), (0.5, 2.0), (0.2, 1.0)])
def test_fused_linear_distill_equals_trls_generalized_jsd_loss(beta, temperature):
    # TRL's generalized JSD on full logits (GKDTrainer's, the formula of the GKD paper)
    from trl.experimental.gkd import GKDTrainer

    from kernelwright.losses import fused_linear_distill

    g = torch.Generator().manual_seed(int(beta * 10) + 1)
    B, T, Hs, Ht, V = 2, 7, 16, 12, 37
    hs = torch.randn(B, T, Hs, generator=g).to(DEVICE).requires_grad_()
    ws = torch.randn(V, Hs, generator=g).mul(0.5).to(DEVICE).requires_grad_()
    ht = torch.randn(B, T, Ht, generator=g).to(DEVICE)
    wt = torch.randn(V, Ht, generator=g).mul(0.5).to(DEVICE)
    labels = torch.randint(0, V, (B, T), generator=g).to(DEVICE)
    labels[0, :3] = -100
    kw = dict(beta=beta, temperature=temperature)
    for n_items in (None, 17):
        want = GKDTrainer.generalized_jsd_loss(hs @ ws.T, ht @ wt.T, labels,
                                               num_items_in_batch=n_items, **kw)  # fmt: skip
        got = fused_linear_distill(hs, ws, ht, wt, labels, num_items_in_batch=n_items, **kw)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for a, e in zip(torch.autograd.grad(got, [hs, ws]), torch.autograd.grad(want, [hs, ws]),
                        strict=True):  # fmt: skip
            torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)


@needs_trainers
@pytest.mark.parametrize(
    "opts",
    [dict(beta=0.5, temperature=1.0), dict(beta=0.0, temperature=0.8, num_items_in_batch=9.0,
     bias=True, student_logit_scale=1.3, teacher_logit_scale=0.7)],
)  # fmt: skip
def test_adapter_matches_trls_distillation_loss(opts):
    import trl.trainer.distillation_trainer as dt

    opts = dict(opts)
    g = torch.Generator().manual_seed(3)
    B, K, Hs, Ht, V = 2, 6, 16, 24, 41
    hs = torch.randn(B, K, Hs, generator=g).to(DEVICE).requires_grad_()
    ws = torch.randn(V, Hs, generator=g).mul(0.5).to(DEVICE).requires_grad_()
    ht = torch.randn(B, K, Ht, generator=g).to(DEVICE)
    wt = torch.randn(V, Ht, generator=g).mul(0.5).to(DEVICE)
    mask = (torch.rand(B, K, generator=g) > 0.3).long().to(DEVICE)
    if opts.pop("bias", False):
        opts["student_lm_head_bias"] = torch.randn(V, generator=g).to(DEVICE).requires_grad_()
        opts["teacher_lm_head_bias"] = torch.randn(V, generator=g).to(DEVICE)
    beta = opts.pop("beta")
    args = (hs, ht, ws, wt, mask, beta)
    got = kw_trl.kernelwright_divergence_loss(*args, **opts)
    want = dt._chunked_divergence_loss(*args, **opts)
    for a, e in zip(got, want, strict=True):  # loss, entropy sum, token count
        torch.testing.assert_close(a.float(), e.float(), atol=2e-5, rtol=1e-5)
    params = [hs, ws] + [opts[k] for k in ("student_lm_head_bias",) if k in opts]
    for a, e in zip(torch.autograd.grad(got[0], params), torch.autograd.grad(want[0], params),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)


@needs_trainers
def test_enable_swaps_the_distillation_loss_and_refuses_another(monkeypatch):
    import trl.trainer.distillation_trainer as dt

    original = dt._chunked_divergence_loss
    with kw_trl.enabled():
        assert dt._chunked_divergence_loss is kw_trl.kernelwright_divergence_loss
    assert dt._chunked_divergence_loss is original and not kw_trl.is_enabled()

    def other(student_hidden_states, teacher_hidden_states, completion_mask):  # a future TRL's
        return None

    monkeypatch.setattr(dt, "_chunked_divergence_loss", other)
    with pytest.raises(RuntimeError, match="DistillationTrainer does not compute its loss"):
        kw_trl.enable()
    assert dt._chunked_divergence_loss is other and not kw_trl.is_enabled()  # nothing swapped
    kw_trl.enable(distillation=False)
    assert kw_trl.is_enabled() and dt._chunked_divergence_loss is other
    kw_trl.disable()


@needs_trainers
def test_distillation_trainer_trains_the_same_on_kernelwright(tmp_path, monkeypatch):
    from trl import DistillationConfig, DistillationTrainer

    data = datasets.Dataset.from_dict({"prompt": _sentences(8, 3, 7)})

    def build():
        torch.manual_seed(0)
        cfg = DistillationConfig(**_common(tmp_path, beta=0.5, temperature=0.9,
                                           max_completion_length=6,
                                           gradient_checkpointing=False))  # fmt: skip
        tok = _tokenizer()
        tok.padding_side = "left"  # as the trainer requires
        return DistillationTrainer(model=_model(0), teacher_model=_model(1), args=cfg,
                                   train_dataset=data, processing_class=tok)  # fmt: skip

    def run():  # each step's loss, gradient norm and the student's entropy (TRL's metric)
        trainer = build()
        trainer.train()
        rows = [r for r in trainer.state.log_history if "loss" in r]
        return [r[k] for r in rows for k in ("loss", "grad_norm", "entropy")]

    want = run()
    calls = []
    ours = kw_trl.kernelwright_divergence_loss

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return ours(*args, **kwargs)

    monkeypatch.setattr(kw_trl, "kernelwright_divergence_loss", counted)
    with kw_trl.enabled():
        got = run()
    assert calls, "the trainer never reached kernelwright's distillation loss"
    assert len(want) == len(got) >= 9 and all(torch.isfinite(torch.tensor(want)))
    # the divergence of two tiny random models is small (~1e-2): a tight absolute tolerance
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-6, rtol=1e-4)
