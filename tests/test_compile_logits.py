"""kernelwright.compile(model, logits="drop_with_labels"): a Hugging Face causal LM trained with
labels returns logits=None, its lm-head + loss becomes fused linear cross-entropy and no
[tokens, vocab] tensor is saved for the backward; the loss and gradients equal eager's, and
calls that may read the logits (no labels, no_grad, logits_to_keep, return_dict=False) get them.
"""

import copy
import math

import pytest
import torch
from conftest import DEVICE

import kernelwright
from kernelwright.compile import CompileReport

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("fresh_dynamo")]

B, S, V, H = 2, 5, 96, 32  # T = B * S = 10 tokens: a [10, 96] tensor is the logits


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    # relu: no gated-MLP site (not what this file tests), fewer kernels under the interpreter
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, hidden_act="relu", use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(DEVICE)
    ids = torch.randint(0, V, (B, S), device=DEVICE)
    labels = torch.randint(0, V, (B, S), device=DEVICE)
    labels[0, 2] = -100
    return model, ids, labels


def _saved_for_backward(shapes: list):
    """An aot_eager backend recording the shapes of the tensors the backward reads from the
    forward (its inputs that are not upstream gradients)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def fw(gm, _):
        return make_boxed_func(gm.forward)

    def bw(gm, _):
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if n.op == "placeholder" and not n.name.startswith("tangents") and v is not None:
                shapes.append(tuple(getattr(v, "shape", ())))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=fw, bw_compiler=bw)


def _is_logits(shape) -> bool:
    return len(shape) >= 2 and shape[-1] == V and math.prod(shape[:-1]) == B * S


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_drop_with_labels_fuses_the_loss_and_keeps_logits_where_read():
    model, ids, labels = _llama()
    ref = copy.deepcopy(model)
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()

    # default: the output as HF returns it; the logits are a graph output, and saved (no site
    # replaced: the interpreter's kernels cost time, and none is what this part checks)
    saved: list = []
    report = CompileReport()
    keep = copy.deepcopy(model)
    backend = _saved_for_backward(saved)
    out = kernelwright.compile(keep, report=report, backend=backend, only=())(
        input_ids=ids, labels=labels
    )
    out.loss.backward()
    torch.testing.assert_close(out.logits, want.logits)
    assert not report.notes and "fused_linear_cross_entropy" not in [s.op for s in report]
    assert any(_is_logits(s) for s in saved), saved

    # drop_with_labels: logits None, one fused site, no [T, V] saved, loss and grads as eager
    saved.clear()
    report = CompileReport()
    compiled = kernelwright.compile(
        model, report=report, backend=_saved_for_backward(saved), logits="drop_with_labels"
    )
    out = compiled(input_ids=ids, labels=labels)
    assert out.logits is None and "logits" not in out
    out.loss.backward()
    torch.testing.assert_close(out.loss, want.loss, atol=2e-5, rtol=2e-5)
    got, ref_grads = _grads(model), _grads(ref)
    for name, g in got.items():
        torch.testing.assert_close(g, ref_grads[name], atol=2e-5, rtol=2e-5, msg=name)
    flce = [s for s in report if s.op == "fused_linear_cross_entropy"]
    assert len(flce) == 1 and flce[0].replaced, report.summary()
    assert saved and not any(_is_logits(s) for s in saved), saved
    assert report.notes == ["LlamaForCausalLM: logits=None in the output (called with labels, "
                            "grad enabled)"]  # fmt: skip

    # the same compiled model without labels (generation, evaluation): the logits
    with torch.no_grad():
        out = compiled(input_ids=ids)
    torch.testing.assert_close(out.logits, want.logits, atol=2e-5, rtol=2e-5)
    assert report.notes[-1] == "LlamaForCausalLM: logits kept: called without labels: no loss"
    assert "logits=None" in report.summary()


def test_the_calls_that_keep_their_logits_and_bad_uses():
    """Eager calls of the wrapped forward (the option sets it on the instance): every case
    that may read the logits gets them, equal to the unwrapped model's; bad uses raise."""
    model, ids, labels = _llama()
    ref = copy.deepcopy(model)
    report = CompileReport()
    kernelwright.compile(model, report=report, logits="drop_with_labels")  # nothing traced yet
    wrapped = model.forward.__func__
    assert wrapped.kernelwright_drops_logits
    kernelwright.compile(model, logits="drop_with_labels")  # wraps once
    assert model.forward.__func__ is wrapped
    out = model(ids, None, None, None, None, labels)  # labels given positionally
    want = ref(input_ids=ids, labels=labels)
    assert out.logits is None
    torch.testing.assert_close(out.loss, want.loss)
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, want.logits)
    out = model(input_ids=ids, labels=labels, logits_to_keep=S)  # every position, as a count
    torch.testing.assert_close(out.logits, want.logits)
    out = model(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(out, tuple) and len(out) == 2
    torch.testing.assert_close(out[1], want.logits)
    kept = "LlamaForCausalLM: logits kept: "
    assert report.notes == [
        "LlamaForCausalLM: logits=None in the output (called with labels, grad enabled)",
        kept + "grad disabled (evaluation may read them)",
        kept + "logits_to_keep asks for them",
        kept + "not a ModelOutput (return_dict=False: a tuple's positions would move)",
    ]
    twin = copy.deepcopy(model)  # the copy's forward is bound to the copy
    assert twin.forward.__self__ is twin and twin(input_ids=ids, labels=labels).logits is None

    with pytest.raises(ValueError, match="choose from 'keep', 'drop_with_labels'"):
        kernelwright.compile(ref, logits="skip")
    with pytest.raises(ValueError, match="PreTrainedModel"):
        kernelwright.compile(torch.nn.Linear(2, 2), logits="drop_with_labels")
    with pytest.raises(ValueError, match="takes no labels"):
        kernelwright.compile(ref.model, logits="drop_with_labels")
    assert "forward" not in vars(ref)  # the default changes nothing
