"""`kernelwright autopatch --sweep`: every model type of transformers' causal-LM and
image-text-to-text mappings, patched with parity or left alone with a reason
(kernelwright.workflows.autopatch.sweep). Called by the `autopatch` command in cli.py."""

from __future__ import annotations

from pathlib import Path

import typer

from kernelwright.cli_bench import dtype_option
from kernelwright.console import make_console
from kernelwright.registry.entry import SHORT_DTYPE


def sweep(
    only: str | None,
    out: Path | None,
    timeout: float,
    jobs: int,
    profiles: bool,
    mapping: str,
    device: str = "cpu",
    dtype: str = "fp32",
) -> None:
    import difflib

    from kernelwright.workflows.autopatch import sweep as S

    mappings = list(S.MAPPINGS) if mapping == "all" else [mapping]
    if any(m not in S.MAPPINGS for m in mappings):
        raise typer.BadParameter(
            f"{mapping!r}: one of {', '.join([*S.MAPPINGS, 'all'])}", param_hint="--mapping"
        )
    if device not in S.DEVICES:
        raise typer.BadParameter(
            f"{device!r}: one of {', '.join(S.DEVICES)}", param_hint="--device"
        )
    # the sweep names its dtypes (and its tables' files) by the short names: fp32, bf16
    short = {name: s for name, s in SHORT_DTYPE.items() if s in S.DTYPES}
    dtype = short[dtype_option(dtype, allowed=tuple(short))]
    try:
        S.require_device(device, dtype)
    except RuntimeError as e:
        raise typer.BadParameter(str(e), param_hint="--device") from None
    known = {m: S.sweep_types(m) for m in mappings}
    wanted = [t.strip() for t in only.split(",") if t.strip()] if only else None
    for t in wanted or []:
        if not any(t in types for types in known.values()):
            every = [t for types in known.values() for t in types]
            close = difflib.get_close_matches(t, every, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            kinds = " or ".join(mappings)
            raise typer.BadParameter(
                f"{t!r} is not a {kinds} model type{hint}", param_hint="--only"
            )
    out = out or Path("kernelwright-runs/autopatch/sweep")
    for m in mappings:
        types = [t for t in known[m] if wanted is None or t in wanted]
        if types:
            _sweep_mapping(m, types, only, out, timeout, jobs, profiles, device, dtype)


def _sweep_mapping(
    mapping: str,
    types: list[str],
    only: str | None,
    out: Path,
    timeout: float,
    jobs: int,
    profiles: bool,
    device: str,
    dtype: str,
) -> None:
    import time

    from rich.markup import escape

    from kernelwright.workflows.autopatch import sweep as S

    console = make_console()
    colour = {"patched": "green", "left_alone": "yellow", "cannot_build": "red"}
    done = 0
    name = S.results_name(mapping, device, dtype)
    console.print(
        f"autopatch sweep ({mapping}, {name}): {len(types)} model types, "
        f"{max(jobs, 1)} worker(s) -> {out}"
    )

    def show(r: S.SweepRow) -> None:
        nonlocal done
        done += 1
        what = r.patched if r.status == "patched" else (r.error or r.left_alone)
        console.print(
            f"[{done:3d}/{len(types)}] {r.model_type:<26} [{colour[r.status]}]{r.status:<12}[/] "
            f"{r.seconds:6.1f}s  {escape(what[:110])}",
            highlight=False,
        )

    start = time.perf_counter()
    # the CPU fp32 sweep's profiles keep their folders; another device or dtype gets its own
    folder = "profiles" if mapping == "causal-lm" else "profiles_vlm"
    if (device, dtype) != ("cpu", "fp32"):
        folder += f"_{S.results_name('causal-lm', device, dtype)}"
    rows = S.run_sweep(
        types,
        jobs=jobs,
        timeout=timeout,
        profile_dir=out / folder if profiles else None,
        on_row=show,
        mapping=mapping,
        device=device,
        dtype=dtype,
    )
    wall = time.perf_counter() - start
    options = (f" --device {device}" if device != "cpu" else "") + (
        f" --dtype {dtype}" if dtype != "fp32" else ""
    )
    meta = {
        "command": f"kernelwright autopatch --sweep --mapping {mapping}"
        + (f" --only {only}" if only else "")
        + options,
        **S.environment(),
        "wall time": f"{wall / 60:.1f} min ({max(jobs, 1)} worker(s))",
    }
    what = "causal-LM" if mapping == "causal-lm" else mapping
    csv_path, md_path = S.write_results(rows, out, name=name, meta=meta, what=what)
    c = S.counts(rows)
    console.print(
        ", ".join(f"{k} {v}" for k, v in c.items()) + f" of {len(rows)} in {wall:.0f} s; "
        f"table: {md_path} and {csv_path}"
    )
