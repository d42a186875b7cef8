"""The autopatch sweep: every causal-LM and image-text-to-text model type transformers
registers, patched with parity or left alone with a reason.

    kernelwright autopatch --sweep [--mapping all] [--only llama,qwen2_vl] [--out DIR]
                           [--device cpu|cuda] [--dtype fp32|bf16]

For each model type in `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (mapping "causal-lm", its
`AutoModelForCausalLM` class) and in `MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES` (mapping
"image-text-to-text", its `AutoModelForImageTextToText` class: the VLM whose text decoder and
vision tower are patched) (`sweep_one`):

1. build a tiny random model (`sweep_config`: the convergence suite's config for the
   architectures it trains, else the analyser's shrunken default config; dropout off, seed 0,
   1-D parameters spread off their init) in the sweep's dtype on its device (`build`) and run
   it unpatched on one batch, in
   `train()` and `eval()` (`parity.measure`). The batch holds images where the model takes
   them (`pixels.check_batch`; the row's `inputs` says what, or why text only). A failure here
   is **cannot_build**: the unpatched model itself does not run, so there is nothing to compare;
2. analyse it as `kernelwright.patch(model)` does (`analyze(model)`, every check included);
3. confirm the profile on this model (`parity.confirm`): patched against unpatched, loss,
   every gradient and top-k log-probs in both modes, within `parity.PARITY_TOLERANCES` of
   the model's dtype. A decision that differs is demoted and the model re-checked without it.

Device and dtype: "cpu" runs the kernels through Triton's interpreter (and requires it),
"cuda" on the GPU (worker i on GPU i % n where n are visible); fp32 or bf16, the patched
and the unpatched model in the same dtype. The tables are named `results_name`: cpu_fp32,
gpu_bf16, ..., with `_vlm` for the image-text-to-text mapping.

The type is **patched** when at least one module is patched and the final comparison holds,
else **left_alone** with the reasons from its profile. No row is ever "patched" with a
difference: a model whose comparison still fails has every decision demoted.

`run_sweep` runs the types in worker processes (one type at a time each) so that a type that
hangs or exhausts memory is stopped at `timeout` seconds without stopping the sweep;
`write_results` writes the table as CSV and markdown.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import multiprocessing
import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.connection import Connection, wait
from pathlib import Path

from kernelwright.workflows.autopatch import configs

STATUSES = ("patched", "left_alone", "cannot_build")
# mapping -> (transformers' mapping of model types, the Auto class, the results' name suffix)
MAPPINGS = {
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM", ""),
    "image-text-to-text": (
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
        "AutoModelForImageTextToText",
        "_vlm",
    ),
}
DEVICES = ("cpu", "cuda")
DTYPES = ("fp32", "bf16")
_DEVICE_WORD = {"cpu": "cpu", "cuda": "gpu"}  # in the results' names
# logit conventions the fused loss must reproduce, set where a config has the key: a scale or
# a soft-cap that the default config leaves at 1.0 or None is then exercised
_EXERCISE = {
    "logits_scaling": 4.0,
    "final_logit_softcapping": 30.0,
}
# a tiny model has ~1e5 parameters; a config the shrinker missed would have 1e8 and more
MAX_PARAMETERS = 20_000_000


@dataclasses.dataclass
class SweepRow:
    model_type: str
    status: str = "cannot_build"  # one of STATUSES
    architecture: str = ""
    patched: str = ""  # "4 norm (LlamaRMSNorm), 2 mlp (LlamaMLP), ..."
    left_alone: str = ""  # "what: why; ..." (the profile's reasons)
    demoted: str = ""  # decisions the parity check demoted, with the measured difference
    loss_diff: float | None = None  # the final comparison's largest |loss diff|, both modes
    grad_error: float | None = None  # ... largest relative gradient error
    logprob_diff: float | None = None  # ... largest top-k log-prob diff
    error: str = ""  # cannot_build: what the unpatched model raised
    seconds: float = 0.0
    inputs: str = ""  # beside text: the images of the batch, or why it held text only


def results_name(mapping: str = "causal-lm", device: str = "cpu", dtype: str = "fp32") -> str:
    """The tables' file name (without suffix): cpu_fp32, gpu_bf16_vlm, ..."""
    return f"{_DEVICE_WORD[device]}_{dtype}{MAPPINGS[mapping][2]}"


def torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]


def sweep_types(mapping: str = "causal-lm") -> list[str]:
    """Every model type of `mapping` (MAPPINGS) in the installed transformers, in its order."""
    from transformers.models.auto import modeling_auto

    return list(getattr(modeling_auto, MAPPINGS[mapping][0]))


def _auto_class(mapping: str):
    import transformers

    return getattr(transformers, MAPPINGS[mapping][1])


def sweep_config(model_type: str):
    """The tiny config a type is swept on: the convergence suite's (with its math knobs:
    soft-caps, multipliers, partial rotary) for the architectures it trains, otherwise the
    type's default config through the analyser's shrinker; dropout off, eager attention."""
    from transformers import AutoConfig

    from kernelwright.integrations.transformers.analysis.load import tiny_config as shrink
    from kernelwright.testing import model_configs

    if model_type in model_configs.ARCHITECTURES:
        return model_configs.tiny_config(model_type)
    config, _notes = shrink(AutoConfig.for_model(model_type))
    configs.complete(model_type, config)  # keys the default leaves unset, as checkpoints set them
    for sub in [config, *_sub_configs(config)]:
        values = sub.to_dict()
        for key, value in _EXERCISE.items():
            if key in values and not isinstance(values[key], bool):
                setattr(sub, key, value)
        if values.get("is_decoder") is False:
            # encoder families' causal-LM heads (BERT, RoBERTa, Reformer) are causal only as
            # decoders, and some refuse to build otherwise: as a user trains them
            sub.is_decoder = True
    return model_configs._training_ready(config, {})


def _sub_configs(config) -> list:
    from transformers import PretrainedConfig

    return [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]


def _text(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}"


def _reasons(pairs: Iterable[tuple[str, str]]) -> str:
    seen: dict[str, str] = {}
    for what, why in pairs:
        seen.setdefault(what, " ".join(why.split()))
    return "; ".join(f"{what}: {why}" for what, why in seen.items())


def sweep_one(
    model_type: str,
    *,
    config=None,
    seed: int = 0,
    batch: int = 2,
    seq: int = 16,
    profile_dir: Path | None = None,
    stage: Callable[[str], None] = lambda s: None,
    mapping: str = "causal-lm",
    device: str = "cpu",
    dtype: str = "fp32",
) -> SweepRow:
    """One type through build, analysis and confirmation; see the module docstring.

    config: the model's config (default `sweep_config(model_type)`); profile_dir: write the
    profile there as <model_type>.yaml; stage(name) is called as each stage starts; mapping:
    which Auto class builds the model (MAPPINGS); device, dtype: see the module docstring.
    """
    require_device(device, dtype)

    from kernelwright.integrations.transformers import parity
    from kernelwright.integrations.transformers.analysis import analyze
    from kernelwright.integrations.transformers.pixels import check_batch

    start = time.perf_counter()
    row = SweepRow(model_type)

    def done(status: str) -> SweepRow:
        row.status, row.seconds = status, round(time.perf_counter() - start, 2)
        return row

    stage("build")
    try:
        config = config if config is not None else sweep_config(model_type)
        auto = _auto_class(mapping)
        _check_size(config, auto)
        model = build(auto, config, seed=seed, device=device, dtype=dtype)
        row.architecture = type(model).__name__
        data = check_batch(model, batch=batch, seq=seq, seed=seed)
        row.inputs = data.note
        # images as a processor's fp32 pixels cast to the model's dtype, as a user feeds them
        dt = parity.model_dtype(model)
        data.inputs = {k: v.to(dt) if v.is_floating_point() else v for k, v in data.inputs.items()}
        stage("reference")
        ref = parity.measure(model, data, seed=seed)
        for mode in (ref.train, ref.eval):
            if not math.isfinite(mode.loss):
                raise ValueError(f"the unpatched loss is {mode.loss}")
    except Exception as e:  # the unpatched model is the baseline: without it, no comparison
        row.error = configs.failure_reason(model_type, _text(e))
        return done("cannot_build")

    stage("analyze")
    try:
        profile = analyze(model)
    except Exception as e:  # a model the analyser cannot read is left alone, with why
        row.left_alone = f"analysis: {_text(e)}"
        return done("left_alone")

    stage("confirm")
    conf = parity.confirm(model, profile, batch=data, reference=ref, seed=seed, what="sweep parity")
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        profile.save(profile_dir / f"{model_type}.yaml")
    demoted = [(u.label, u.decision(profile).reason) for u, _ in conf.demoted]
    row.demoted = _reasons(demoted)
    record = conf.record
    skipped = record.skipped if record is not None else []
    row.left_alone = _reasons([*demoted, *skipped])
    if not row.left_alone and record is None:
        row.left_alone = _reasons(profile.unsupported()) or "nothing to patch"
    # confirm keeps only decisions that pass; a failed final comparison is never "patched"
    if conf.result is None or not conf.result.passed or record is None or not record.modules:
        return done("left_alone")
    row.patched = record.patched()
    row.loss_diff = conf.result.loss
    row.grad_error = conf.result.grads
    row.logprob_diff = conf.result.logprobs
    return done("patched")


def build(auto, config, *, seed: int = 0, device: str = "cpu", dtype: str = "fp32"):
    """The tiny model, on `device`: in fp32 every parameter is fp32; in bf16 it is built as a
    user loads a model in bf16 (`from_config(dtype=torch.bfloat16)`, not cast after building).
    Built on the CPU (the same draws on every device), then moved."""
    import torch

    from kernelwright.integrations.transformers import parity

    torch.manual_seed(seed)
    model = auto.from_config(config, dtype=torch_dtype(dtype))
    if dtype == "fp32":
        model = model.float()
    parity.spread_vectors(model, seed)
    return model.to(device) if device != "cpu" else model


def _check_size(config, auto) -> None:
    """Raise when the config still builds a large model (a size key the shrinker does not
    know), counted on the meta device before any memory is allocated."""
    import torch

    try:
        with torch.device("meta"):
            model = auto.from_config(config)
    except Exception:  # some models do not build on meta; the real build then decides
        return
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMETERS:
        raise ValueError(f"the tiny config still has {n:,} parameters (a size key unshrunk)")


# --------------------------------------------------------------------------- worker processes


def _worker(
    conn: Connection,
    profile_dir: str | None,
    memory_gib: float,
    mapping: str,
    device: str = "cpu",
    dtype: str = "fp32",
    gpu: int = 0,
) -> None:
    """Sweep the types the parent sends, one at a time, until it sends None."""
    import resource
    import warnings

    if memory_gib > 0 and device == "cpu":
        # a config the shrinker missed fails its allocation instead of exhausting the machine
        # (not on a GPU: CUDA maps far more address space than it uses)
        limit = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch
    import transformers

    import kernelwright  # noqa: F401  (the Triton interpreter without a GPU)

    if device == "cuda":
        torch.cuda.set_device(gpu)  # "cuda" tensors and kernel launches go to this GPU
    torch.set_num_threads(1)  # one worker per core
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    try:
        conn.send(("ready", None))
        while True:
            model_type = conn.recv()
            if model_type is None:
                return
            row = sweep_one(
                model_type,
                profile_dir=Path(profile_dir) if profile_dir else None,
                stage=lambda s: conn.send(("stage", s)),
                mapping=mapping,
                device=device,
                dtype=dtype,
            )
            if device == "cuda" and _context_lost(torch):
                # a device-side assert leaves this process's CUDA context unusable: every
                # later type would fail here too, so the row is this worker's last
                conn.send(("last_row", dataclasses.asdict(row)))
                return
            conn.send(("row", dataclasses.asdict(row)))
    except (EOFError, BrokenPipeError):
        return  # the parent is gone


def _context_lost(torch) -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001  (torch.AcceleratorError, RuntimeError: CUDA error ...)
        return True


@dataclasses.dataclass
class _Slot:
    process: multiprocessing.Process
    conn: Connection
    model_type: str | None = None
    stage: str = ""
    since: float = 0.0
    ready: bool = False
    gpu: int = 0  # with device "cuda": the GPU its worker runs on


def _stopped_row(model_type: str, stage: str, why: str, seconds: float) -> SweepRow:
    # stopped before the unpatched model ran: it is not known to build; after: left alone
    row = SweepRow(model_type, seconds=round(seconds, 2))
    if stage in ("", "build", "reference"):
        row.status, row.error = "cannot_build", f"{why} while building or running it unpatched"
    else:
        row.status, row.left_alone = "left_alone", f"sweep: {why} during {stage}"
    return row


def require_device(device: str = "cpu", dtype: str = "fp32") -> None:
    """Raise (RuntimeError) where the sweep cannot run on `device` here, ValueError for a
    device or dtype it does not know."""
    import torch

    from kernelwright.runtime import interpreter_mode

    if device not in DEVICES or dtype not in DTYPES:
        raise ValueError(
            f"device {device!r}, dtype {dtype!r}: the sweep runs on one of {DEVICES} "
            f"in one of {DTYPES}"
        )
    if device == "cpu" and not interpreter_mode():
        raise RuntimeError(
            "the autopatch sweep on the CPU runs kernelwright's kernels through Triton's "
            "interpreter: run it with TRITON_INTERPRET=1, on a machine without a GPU, or on the "
            "GPU with --device cuda"
        )
    if device == "cuda" and (interpreter_mode() or not torch.cuda.is_available()):
        why = "no CUDA GPU is visible" if not torch.cuda.is_available() else ""
        why = why or "TRITON_INTERPRET=1 is set (kernels through the CPU interpreter)"
        raise RuntimeError(
            f"the autopatch sweep with --device cuda runs its kernels on a CUDA GPU, but {why}; "
            "without a GPU, sweep with --device cpu (the Triton interpreter)"
        )


def run_sweep(
    model_types: list[str],
    *,
    jobs: int = 2,
    timeout: float = 300.0,
    profile_dir: Path | None = None,
    memory_gib: float = 8.0,
    on_row: Callable[[SweepRow], None] = lambda r: None,
    mapping: str = "causal-lm",
    device: str = "cpu",
    dtype: str = "fp32",
) -> list[SweepRow]:
    """Sweep `model_types` (of `mapping`) and return their rows in the given order.

    jobs: worker processes (each runs one type at a time; on "cuda" they share the visible
    GPUs, worker i on GPU i % n); 0 runs in this process, without timeouts. timeout: seconds a
    type may take once its worker started it; past that the worker is stopped and replaced (on
    the same GPU). memory_gib: each CPU worker's address-space limit (0: none). on_row is
    called as each row arrives.
    """
    require_device(device, dtype)
    if jobs <= 0:
        rows = []
        for t in model_types:
            rows.append(
                sweep_one(t, profile_dir=profile_dir, mapping=mapping, device=device, dtype=dtype)
            )
            on_row(rows[-1])
        return rows
    gpus = 1
    if device == "cuda":
        import torch

        gpus = max(1, torch.cuda.device_count())
    ctx = multiprocessing.get_context("spawn")
    todo = list(model_types)
    rows: dict[str, SweepRow] = {}
    slots: list[_Slot] = []

    def start(gpu: int) -> _Slot:
        parent, child = ctx.Pipe()
        where = str(profile_dir) if profile_dir else None
        args = (child, where, memory_gib, mapping, device, dtype, gpu)
        p = ctx.Process(target=_worker, args=args, daemon=True)
        p.start()
        child.close()
        return _Slot(p, parent, gpu=gpu)

    def finish(slot: _Slot, row: SweepRow) -> None:
        rows[row.model_type] = row
        slot.model_type = None
        on_row(row)

    def stop(slot: _Slot, why: str) -> None:
        if slot.model_type is not None:
            seconds = time.perf_counter() - slot.since
            finish(slot, _stopped_row(slot.model_type, slot.stage, why, seconds))
        slot.process.kill()
        slot.process.join()
        slot.conn.close()

    def assign(slot: _Slot) -> None:
        if todo and slot.ready and slot.model_type is None:
            slot.model_type, slot.stage, slot.since = todo.pop(0), "", time.perf_counter()
            slot.conn.send(slot.model_type)

    slots = [start(i % gpus) for i in range(min(jobs, len(todo)))]
    try:
        while slots:
            for ready in wait([s.conn for s in slots], timeout=1.0):
                slot = next(s for s in slots if s.conn is ready)
                try:
                    kind, value = slot.conn.recv()
                except (EOFError, OSError):
                    slot.process.join(timeout=5)
                    code = slot.process.exitcode
                    if not slot.ready:  # it could not even start: another would not either
                        raise RuntimeError(f"a sweep worker died starting (exit {code})") from None
                    stop(slot, f"the worker died (exit code {code})")
                    slots.remove(slot)
                    if todo:
                        slots.append(start(slot.gpu))
                    continue
                if kind == "last_row":  # its CUDA context is lost: a fresh worker goes on
                    finish(slot, SweepRow(**value))
                    stop(slot, "")
                    slots.remove(slot)
                    if todo:
                        slots.append(start(slot.gpu))
                    continue
                if kind == "ready":
                    slot.ready = True
                elif kind == "stage":
                    slot.stage = value
                else:
                    finish(slot, SweepRow(**value))
                assign(slot)
            now = time.perf_counter()
            for slot in list(slots):
                if slot.model_type is not None and now - slot.since > timeout:
                    stop(slot, f"timed out after {timeout:g} s")
                    slots.remove(slot)
                    if todo:
                        slots.append(start(slot.gpu))
                elif slot.model_type is None and not todo and slot.ready:
                    slot.conn.send(None)
                    slot.process.join()
                    slots.remove(slot)
    finally:
        for slot in slots:
            slot.process.kill()
    return [rows[t] for t in model_types if t in rows]


# --------------------------------------------------------------------------- results


def counts(rows: Iterable[SweepRow]) -> dict[str, int]:
    c = Counter(r.status for r in rows)
    return {s: c.get(s, 0) for s in STATUSES}


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.2g}"


def _cell(text: str, limit: int = 400) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def write_results(
    rows: list[SweepRow],
    out_dir: Path,
    *,
    name: str = "cpu_fp32",
    meta: Mapping[str, str],
    what: str = "causal-LM",
) -> tuple[Path, Path]:
    """<out_dir>/<name>.csv (every field) and <name>.md (counts, then one row per type)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{name}.csv", out_dir / f"{name}.md"
    fields = [f.name for f in dataclasses.fields(SweepRow)]
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            d = dataclasses.asdict(r)
            for k in ("loss_diff", "grad_error", "logprob_diff"):
                d[k] = "" if d[k] is None else f"{d[k]:.3g}"
            w.writerow(d)
    c = counts(rows)
    lines = [f"# autopatch sweep: {len(rows)} {what} model types ({name})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += [f"- {s}: **{n}**" for s, n in c.items()]
    with_inputs = any(r.inputs for r in rows)
    if with_inputs:
        images = sum(1 for r in rows if r.inputs and not r.inputs.startswith("text only"))
        lines.append(f"- checked with images (pixel_values): {images} of {len(rows)}")
    lines += [
        "",
        "Max errors are the patched model's largest difference from the unpatched one over "
        "train() and eval(): |loss diff|, relative gradient error (all parameters), top-5 "
        "log-prob diff.",
        "",
        "| type | status | patched | left alone (why) | max loss / grad / log-prob error | s |"
        + (" inputs |" if with_inputs else ""),
        "|---|---|---|---|---|---|" + ("---|" if with_inputs else ""),
    ]
    for r in rows:
        why = r.error if r.status == "cannot_build" else r.left_alone
        errs = (
            f"{_fmt(r.loss_diff)} / {_fmt(r.grad_error)} / {_fmt(r.logprob_diff)}"
            if r.status == "patched"
            else ""
        )
        lines.append(
            f"| {r.model_type} | {r.status} | {_cell(r.patched)} | {_cell(why)} | {errs} "
            f"| {r.seconds:.1f} |" + (f" {_cell(r.inputs, 160)} |" if with_inputs else "")
        )
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def environment() -> dict[str, str]:
    """Versions and the machine, for the results' header."""
    import torch
    import transformers

    import kernelwright
    from kernelwright.bench.context import git_commit
    from kernelwright.runtime import device_info, interpreter_mode

    d = device_info()
    backend = "Triton interpreter on CPU" if interpreter_mode() else d.name
    return {
        "device": f"{backend} ({platform.machine()}, {os.cpu_count()} CPU cores)",
        "versions": f"kernelwright {kernelwright.__version__} (commit {git_commit()}), "
        f"torch {torch.__version__}, transformers {transformers.__version__}",
    }
