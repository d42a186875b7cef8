"""`kernelwright.compile(model, logits="drop_with_labels")`: a Hugging Face model trained with
labels returns its loss and `logits=None`, so that the lm-head + cross-entropy site of its graph
becomes fused linear cross-entropy and the [tokens, vocab] logits are never stored.

Dynamo captures what the forward returns as graph outputs. A causal LM's forward returns its
logits beside the loss, so the graph must produce them and the pass keeps the plain
cross-entropy site (patterns_loss.py: "the logits are also read outside the loss"). Here the
model's `forward` is wrapped on the instance before Dynamo runs (the class is untouched, as
loop capture does): the wrapper calls the forward as it was and, on a training call with
labels, returns the same output without its logits. The loss and its gradients are the
forward's own; only the returned value changes, and only where nothing is expected to read the
logits:

- labels given and grad enabled (a training step; evaluation under `no_grad` keeps them for
  metrics, and a call without labels, generation included, computes no loss);
- `logits_to_keep` left at its default 0 (asking for some logits keeps them);
- a `ModelOutput` that holds a loss (`return_dict=False` returns a tuple whose positions would
  move without the logits: kept).

Each case is written once into `CompileReport.notes` (and logged) as the forward is traced.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch

OPTIONS = ("keep", "drop_with_labels")


def check(option: str, model) -> None:
    """Raise ValueError unless `option` is one of OPTIONS and applies to `model`."""
    if option not in OPTIONS:
        raise ValueError(f"logits={option!r}; choose from {', '.join(map(repr, OPTIONS))}")
    if option == "keep":
        return
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        raise ValueError(
            f'logits="drop_with_labels" applies to a Hugging Face PreTrainedModel, not '
            f"{type(model).__name__}: a function or another module's output is kept as it is"
        )
    if "labels" not in inspect.signature(_inner(model)).parameters:
        raise ValueError(
            f'logits="drop_with_labels": {type(model).__name__}.forward takes no labels, '
            "so it computes no loss"
        )


def _inner(model) -> types.FunctionType:
    """The forward the model runs now, as a function of (self, ...): the class's, or one set
    on the instance (a rewritten loop) as a method of the model."""
    current = vars(model).get("forward")
    if current is None:
        return type(model).forward
    if isinstance(current, types.MethodType) and current.__self__ is model:
        return current.__func__
    raise ValueError(
        f"{type(model).__name__}.forward is replaced on the instance by "
        f"{type(current).__name__}; the logits option wraps a method of the model only"
    )


def drop_with_labels(model, report: list | None, log) -> None:
    """Wrap `model.forward` on the instance (see the module's docstring); `report.notes` (when
    the report has them) and `log` get one line per case as calls are traced."""
    from transformers.utils import ModelOutput

    inner = _inner(model)
    if getattr(inner, "kernelwright_drops_logits", False):
        return  # compiled with the option before
    signature = inspect.signature(inner)
    positional = [
        p.name
        for p in list(signature.parameters.values())[1:]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    name = type(model).__name__
    notes = getattr(report, "notes", None)

    # Dynamo calls this once while tracing and keeps its result as a constant: a list append
    # traced in the forward would be replayed on every call of the compiled graph.
    @torch._dynamo.assume_constant_result
    def note(line: str) -> bool:
        if notes is not None and line not in notes:
            notes.append(line)
            log.info(line)
        return True

    def given(args, kwargs, key, default=None):
        if key in kwargs:
            return kwargs[key]
        if key in positional and positional.index(key) < len(args):
            return args[positional.index(key)]
        return default

    def forward(self, *args, **kwargs):
        out = inner(self, *args, **kwargs)
        keep_to = given(args, kwargs, "logits_to_keep", 0)
        if given(args, kwargs, "labels") is None:
            why = "called without labels: no loss"
        elif not torch.is_grad_enabled():
            why = "grad disabled (evaluation may read them)"
        elif not (isinstance(keep_to, int) and keep_to == 0):
            why = "logits_to_keep asks for them"
        elif not isinstance(out, ModelOutput):
            why = "not a ModelOutput (return_dict=False: a tuple's positions would move)"
        elif out.get("loss") is None or out.get("logits") is None:
            why = "the output holds no loss or no logits"
        else:
            note(f"{name}: logits=None in the output (called with labels, grad enabled)")
            return type(out)(**{k: v for k, v in out.items() if k != "logits"})
        note(f"{name}: logits kept: {why}")
        return out

    forward.__name__ = "forward"
    forward.__qualname__ = f"{name}.forward"
    forward.__doc__ = (
        f"kernelwright.compile: {name}.forward, returning logits=None when called with labels "
        "and grad enabled (the loss unchanged); otherwise the forward as it was."
    )
    forward.__signature__ = signature  # Trainer reads the parameters (label names, columns)
    forward.kernelwright_drops_logits = True
    model.forward = types.MethodType(forward, model)  # a deepcopy rebinds it to the copy
