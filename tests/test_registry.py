"""The op registry: one entry per op module, every entry resolves, the tools read it (demo,
bench, optimize, autopatch), unknown names get a clear error, generated ops are discovered."""

import ast
import sys
import typing
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

from kernelwright import registry
from kernelwright.bench.specs import SPECS, get_spec
from kernelwright.registry import generated
from kernelwright.testing.cases import MAKERS

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "kernelwright"
LIBRARY = registry.entries(generated=False)


def _op_modules() -> list[str]:
    return sorted(p.stem for p in (PKG / "ops").glob("*.py") if not p.stem.startswith("_"))


# --------------------------------------------------------------------------- one entry per op


def test_every_op_module_has_exactly_one_entry():
    modules = [e.module for e in LIBRARY]
    for stem in _op_modules():
        assert modules.count(f"kernelwright.ops.{stem}") == 1, stem
    assert sorted(m.rsplit(".", 1)[1] for m in modules) == _op_modules()
    names = [e.name for e in registry.entries()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("entry", LIBRARY, ids=lambda e: e.name)
def test_every_entry_resolves(entry):
    assert callable(entry.fn()) and callable(entry.ref())
    assert entry.load().__name__ == entry.module
    if entry.module_class:
        assert issubclass(entry.cls(), torch.nn.Module)
    if entry.eager:
        assert callable(entry.attr(entry.eager))
    if entry.table:
        assert isinstance(entry.table_module().TABLE, dict)
    for case in entry.demo:
        assert case.inputs in MAKERS, case.label
        assert callable(entry.attr(case.function or entry.function))
        assert callable(entry.attr(case.reference or entry.reference))
    for p in entry.replaces:
        assert p.kind in {"norm", "mlp", "rope", "loss", "moe"}
        if p.fused:
            assert callable(entry.attr(p.fused))
    assert (ROOT / entry.tests).is_file(), entry.tests
    assert entry.family and entry.summary


def test_resolve_reads_dotted_paths_and_says_what_is_missing():
    assert registry.resolve("kernelwright.ops.rms_norm:rms_norm").__name__ == "rms_norm"
    assert registry.resolve("kernelwright.bench.specs", "SPECS") is SPECS
    with pytest.raises(AttributeError, match=r"kernelwright.ops.rms_norm has no 'nope'"):
        registry.resolve("kernelwright.ops.rms_norm", "nope")


# --------------------------------------------------------------------------- unknown names


def test_unknown_op_lists_the_known_ones_with_a_guess():
    with pytest.raises(registry.UnknownOpError) as info:
        registry.get("rms_nrom")
    message = str(info.value)
    assert "no op 'rms_nrom'. Did you mean 'rms_norm'?" in message
    assert all(name in message for name in registry.names())
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(KeyError, match="Did you mean 'swiglu'"):
        get_spec("swiglo")
    with pytest.raises(KeyError, match="moe_experts has no benchmark spec"):
        get_spec("moe_experts")


def test_optimize_reports_an_unknown_op():
    from kernelwright.workflows.optimize.setup import OptimizeOptions, PreflightError, preflight
    from kernelwright.workflows.optimize.tables import table_module

    with pytest.raises(PreflightError, match="no op 'layer_nrom'. Did you mean 'layer_norm'"):
        preflight(OptimizeOptions("layer_nrom", dry_run=True))
    with pytest.raises(ValueError, match="l2_norm: no launch-config table"):
        table_module("l2_norm")
    assert table_module("rms_norm").__name__ == "kernelwright.runtime.tables.rms_norm"


# --------------------------------------------------------------------------- the tools read it


def test_demo_cases_come_from_the_registry():
    from kernelwright import demo

    labels = [c.label for e in registry.entries() for c in e.demo]
    assert [c.op for c in demo.cases()] == labels
    assert "l2_norm" in labels  # the op added by following docs/adding-an-op.md
    # demo.py imports no op itself
    tree = ast.parse((PKG / "demo.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m and m.startswith("kernelwright.ops")]
    # an entry's case becomes a demo case, its reference taking int64 targets back
    entry = registry.get("cross_entropy")
    (case, _) = demo.cases((entry,))
    assert case.fn is entry.fn() and case.make is MAKERS["logits_target"]


def test_bench_specs_exist_for_each_entry_that_declares_one():
    from conftest import generated_lock

    declared = [e.bench for e in LIBRARY if e.bench]
    assert list(SPECS) == declared
    # the created ops follow the library's; read while no other test worker adds or removes one
    with generated_lock():
        created = [e.bench for e in registry.entries() if e.generated and e.bench]
        assert registry.benchmarked() == declared + created
    for e in LIBRARY:
        if e.bench:
            assert get_spec(e.bench).op == e.bench


def test_bench_providers_call_the_registry_function(monkeypatch):
    # the "kernelwright" provider resolves the entry's module and function when it is built
    entry = registry.get("relu_squared")
    calls = []
    monkeypatch.setattr(entry.load(), entry.function, lambda x: calls.append(x))
    spec = SPECS["relu_squared"]
    x = torch.ones(2, 3)
    spec.provider("kernelwright").build({"x": x})()
    assert calls == [x]


def test_cli_help_lists_the_ops():
    from typer.testing import CliRunner

    from kernelwright.cli import app

    runner = CliRunner()
    bench = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "400"})
    assert all(op in bench.output for op in registry.benchmarked())
    optimize = runner.invoke(app, ["optimize", "--help"], env={"COLUMNS": "400"})
    assert all(op in optimize.output for op in registry.tuned())


def test_hf_patterns_feed_autopatch():
    from kernelwright.integrations.transformers.analysis.mlp import ACTIVATIONS
    from kernelwright.integrations.transformers.replacements import _GATED
    from kernelwright.profiles.model import MLPActivation

    assert registry.hf_activations() == ACTIVATIONS
    assert ACTIVATIONS["silu"] == "swiglu" and ACTIVATIONS["gelu"] == "geglu_erf"
    assert set(ACTIVATIONS.values()) == set(typing.get_args(MLPActivation))
    assert set(_GATED) == {"swiglu", "geglu_tanh", "geglu_erf"}
    gate, up = torch.randn(2, 8, device=DEVICE), torch.randn(2, 8, device=DEVICE)
    separate, fused = _GATED["geglu_erf"]
    from kernelwright.ops.geglu import geglu_ref

    torch.testing.assert_close(separate(gate, up), geglu_ref(gate, up, approximate="none"))
    torch.testing.assert_close(fused(torch.cat([gate, up], -1)), separate(gate, up))


# --------------------------------------------------------------------------- layering


def test_registry_imports_nothing_above_ops_and_runtime():
    allowed = ("kernelwright.registry", "kernelwright.ops", "kernelwright.runtime")
    for path in (PKG / "registry").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("kernelwright"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"


def test_no_importlib_by_op_name_outside_the_registry():
    files = [PKG / "demo.py", PKG / "testing" / "gpu_compile.py"]
    files += list((PKG / "bench" / "specs").glob("*.py"))
    files += [PKG / "workflows" / "optimize" / f for f in ("setup.py", "tables.py", "measure.py")]
    files += [PKG / "workflows" / "optimize" / "resources.py"]
    for path in files:
        assert "importlib" not in path.read_text(), path


# --------------------------------------------------------------------------- generated ops

# A module as `kernelwright create --into-library` writes one (its exports only).
GENERATED = """
import torch

__all__ = ["KwtestRelu", "kwtest_relu_fn", "kwtest_relu_ref", "kwtest_relu_ref_grads"]


def kwtest_relu_fn(x):
    return torch.relu(x)


class KwtestRelu(torch.nn.Module):
    def forward(self, x):
        return kwtest_relu_fn(x)


def kwtest_relu_ref(x):
    return torch.relu(x.float())


def kwtest_relu_ref_grads(inputs, dys):
    return [dys[0] * (inputs[0] > 0)]
"""


def test_a_generated_op_is_discovered(tmp_path, monkeypatch):
    package = tmp_path / "kwtest_generated"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kwtest_relu.py").write_text(GENERATED)
    (package / "notes.py").write_text("x = 1\n")  # not an op: no <name>_ref export
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(generated, "DIRECTORY", package)
    monkeypatch.setattr(generated, "PACKAGE", "kwtest_generated")

    assert registry.names()[-1] == "kwtest_relu"
    entry = registry.get("kwtest_relu")
    assert entry.generated and entry.family == "generated"
    assert entry.function == "kwtest_relu_fn" and entry.module_class == "KwtestRelu"
    assert entry.tests == "tests/generated/test_generated_kwtest_relu.py"
    x = torch.tensor([-1.0, 2.0])
    assert torch.equal(entry.fn()(x), entry.ref()(x)) and entry.cls()()(x)[1] == 2.0
    monkeypatch.undo()
    sys.modules.pop("kwtest_generated.kwtest_relu", None)
    sys.modules.pop("kwtest_generated", None)
    assert "kwtest_relu" not in registry.names()


def test_the_checkout_generated_package_is_read():
    # whatever `create --into-library` added to this checkout is listed, nothing else (read
    # while no other test worker writes there)
    from conftest import generated_lock

    with generated_lock():
        stems = {p.stem for p in generated.DIRECTORY.glob("[!_]*.py")}
        assert {e.name for e in registry.entries() if e.generated} <= stems


def test_parse_dtype_takes_every_spelling():
    # every command's --dtype: the short names and torch's, one parser
    spellings = {
        "bfloat16": ["bf16", "bfloat16", "BF16", "torch.bfloat16"],
        "float16": ["fp16", "float16", "half"],
        "float32": ["fp32", "float32", "float"],
    }
    for name, ways in spellings.items():
        assert {registry.parse_dtype(w) for w in ways} == {name}
    with pytest.raises(ValueError, match="'fp64': one of .*bf16/bfloat16"):
        registry.parse_dtype("fp64")
    with pytest.raises(ValueError, match="'half': one of fp32/float32/float, bf16/bfloat16$"):
        registry.parse_dtype("half", ("float32", "bfloat16"))
