"""create · Understand: every corpus reference → a KernelProfile with the expected tier.

CPU only, no Triton: tracing runs AOT Autograd on fake tensors.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import package_beside_cwd

from kernelwright.profiles.kernel import KernelProfile
from kernelwright.workflows.create import understand
from kernelwright.workflows.create.load import ReferenceError, load_reference

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "create"

# file stem -> (tier, input form, closest library kernel)
EXPECTED = {
    "relu_squared": (1, "function", "relu_squared"),
    "hardsigmoid": (1, "function", "relu_squared"),
    "rounding": (1, "function", "relu_squared"),
    "hyperbolic": (1, "function", "relu_squared"),
    "swiglu": (1, "function", "swiglu"),
    "geglu_tanh": (1, "function", "geglu"),
    "gelu_exact": (1, "module", "relu_squared"),
    "silu": (1, "kernelbench", "relu_squared"),
    "mish": (1, "function", "relu_squared"),
    "softplus": (1, "kernelbench", "relu_squared"),
    "hardswish": (1, "function", "relu_squared"),
    "elu": (1, "module", "relu_squared"),
    "leaky_relu": (1, "function", "relu_squared"),
    "logit_softcap": (1, "function", "relu_squared"),
    "dyt": (2, "module", "rms_norm"),
    "rms_norm": (2, "kernelbench", "rms_norm"),
    "layer_norm": (2, "module", "layer_norm"),
    "l2_normalize": (2, "function", "rms_norm"),
    "softmax": (2, "kernelbench", "softmax"),
    "log_softmax": (2, "function", "log_softmax"),
    "softmax_temperature": (2, "function", "softmax"),
    "logsumexp": (2, "function", "log_softmax"),
    "rowwise_mse": (2, "function", "rms_norm"),
    "matmul_bias": (3, "kernelbench", None),
    "cumsum": (2, "function", "rms_norm"),
    "gather_rows": (2, "function", "cross_entropy"),
    "cross_entropy_one_hot": (2, "kernelbench", "cross_entropy"),
    "data_dependent": (3, "function", None),
}
# tier-3 references: the aten op the profile must name
STOPS = {
    "matmul_bias": "aten.addmm",
    "data_dependent": "aten._local_scalar_dense",
}


@functools.cache
def profile_of(stem: str) -> KernelProfile:
    return understand(str(CORPUS / f"{stem}.py"))


def declared(path: Path) -> tuple[int, list[str]]:
    """(tier, the aten ops a tier-3 reference says may stop it): from its docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    tier = re.search(r"\bTier ([123])\b", doc)
    stop = re.search(r"Stops at (.*)", doc, re.S)
    assert tier, f"{path.name}: the docstring names no tier"
    return int(tier.group(1)), re.findall(r"aten\.\w+", stop.group(1)) if stop else []


def test_corpus_is_complete():
    on_disk = {p.stem for p in CORPUS.glob("*.py")}
    assert set(EXPECTED) <= on_disk and len(on_disk) >= 60
    tiers = [declared(p)[0] for p in CORPUS.glob("*.py")]
    assert sum(1 for t in tiers if t in (1, 2)) >= 45 and tiers.count(3) >= 10
    assert {form for _, form, _ in EXPECTED.values()} == {"function", "module", "kernelbench"}


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.py")), ids=lambda p: p.stem)
def test_corpus_reference_is_the_tier_it_declares(path):
    tier, stop = declared(path)
    p = profile_of(path.stem)
    assert p.tier == tier, p.unsupported_reason or p.tier_reason
    if tier == 3:
        assert p.unsupported_node and p.unsupported_reason
        assert any(op in p.unsupported_node for op in stop or [STOPS[path.stem]])


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_corpus_profile(stem):
    tier, form, closest = EXPECTED[stem]
    p = profile_of(stem)
    assert (p.tier, p.input_form, p.closest_kernel) == (tier, form, closest), p.tier_reason
    assert p.name == p.function_name == stem
    assert KernelProfile.from_yaml(p.to_yaml()) == p
    if tier == 3:
        assert STOPS[stem] in p.unsupported_node and p.unsupported_reason
        assert p.launch is None
        return
    assert p.unsupported_node is None and p.launch is not None and p.benchmark_sweep
    assert p.forward.nodes and p.forward.readable and p.backward.nodes
    # one gradient formula per differentiable input, named d<input>
    diff = [s.name for s in p.inputs if s.requires_grad]
    assert [g.split(" = ")[0] for g in p.gradients] == [f"d{n}" for n in diff]
    assert p.outputs and all(s.role == "output" for s in p.outputs)
    assert (p.reduction_dim is not None) == (tier == 2 and stem != "dyt")


def test_relu_squared_profile_details():
    p = profile_of("relu_squared")
    assert [s.name for s in p.inputs] == ["x"] and p.inputs[0].requires_grad
    assert p.saved == ["x"]  # relu is recomputed in the backward, not saved
    assert p.save_policy == "recompute" and p.stored == []  # the default: nothing stored
    assert "relu" in p.recomputed
    assert p.notes[0] == "forward: y = relu(x) ** 2"
    assert p.module_name == "ReluSquared"
    assert p.launch.configs[-1]["block_n"] <= p.launch.configs[0]["block_n"]


def test_parameters_and_broadcast():
    p = profile_of("dyt")
    specs = {s.name: (s.role, s.broadcast, s.requires_grad) for s in p.inputs}
    assert specs == {
        "x": ("input", "full", True),
        "alpha": ("parameter", "scalar", True),
        "gamma": ("parameter", "col", True),
        "beta": ("parameter", "col", True),
    }
    rms = profile_of("rms_norm")
    assert rms.reduction_dim == -1 and "rsqrt: transcendental" in rms.upcast_fp32
    assert {s.name: s.broadcast for s in rms.inputs} == {"x": "full", "weight": "col"}
    lse = profile_of("logsumexp")
    assert lse.outputs[0].broadcast == "row" and lse.outputs[0].example_shape == [4, 8]


def test_gelu_decomposes_to_primitives():
    targets = {n.target for n in profile_of("geglu_tanh").forward.nodes}
    assert "aten.tanh.default" in targets and not any("gelu" in t for t in targets)


def test_deterministic():
    for stem in ("rms_norm", "geglu_tanh", "cumsum"):
        path = str(CORPUS / f"{stem}.py")
        assert understand(path).to_yaml() == understand(path).to_yaml()


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_module_function_form(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _write(
        pkg,
        "acts.py",
        """
        import torch

        def squareplus(x):
            return 0.5 * (x + torch.sqrt(x * x + 4.0))

        def other(x):
            return x

        def get_inputs():
            return [torch.randn(3, 5, 33)]
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    p = understand("mypkg.acts:squareplus")
    assert (p.name, p.tier, p.input_form) == ("squareplus", 1, "function")
    assert p.source == "mypkg.acts:squareplus"
    # a file with several functions: path.py:name picks one
    p = understand(f"{pkg / 'acts.py'}:other", name="identity")
    assert (p.name, p.module_name, p.tier) == ("identity", "Identity", 1)


def test_a_package_in_the_current_directory_imports(tmp_path, monkeypatch):
    # `kernelwright create mypkg.ref:sq` run beside mypkg/, as `python -m` would import it
    pkg = package_beside_cwd(tmp_path, monkeypatch, "kw_cwd_create_pkg")
    _write(
        pkg,
        "ref.py",
        """
        import torch

        def sq(x):
            return x * x

        def get_inputs():
            return [torch.randn(4, 8)]
        """,
    )
    ref = load_reference("kw_cwd_create_pkg.ref:sq")
    assert (ref.name, ref.input_form) == ("sq", "function")
    assert str(tmp_path) not in sys.path  # on it for the import alone
    with pytest.raises(ReferenceError, match="No module named 'kw_no_such_pkg'"):
        load_reference("kw_no_such_pkg.ref:sq")


def test_constants_from_get_inputs(tmp_path):
    path = _write(
        tmp_path,
        "scaled.py",
        """
        import torch

        def scaled(x, scale):
            return torch.exp(x * scale)

        def get_inputs():
            return [torch.randn(5, 7), 0.5]
        """,
    )
    ref = load_reference(str(path))
    assert ref.input_names == ["x"] and ref.constants == {1: 0.5}
    p = understand(str(path))
    assert p.tier == 1 and [s.name for s in p.inputs] == ["x"]


def test_inputs_named_like_an_output_gradient_or_traced_op_get_their_own_names(tmp_path):
    # `y` is the output's name and `exp` a traced node's: the same name for two values made
    # the readable formula recurse forever (a RecursionError instead of a profile)
    path = tmp_path / "clash.py"
    path.write_text(
        "import torch\n\ndef clash(x, y, exp, dx):\n"
        "    return torch.tanh(x) * torch.sigmoid(y) + torch.exp(exp) * dx\n\n"
        "def get_inputs():\n    return [torch.randn(3, 5) for _ in range(4)]\n"
    )
    p = understand(str(path))
    assert [s.name for s in p.inputs] == ["x", "y_in", "exp", "dx_in"]
    assert p.tier == 1 and any("sigmoid(y_in)" in n and "exp(exp)" in n for n in p.notes)


@pytest.mark.parametrize(
    "body, message",
    [
        ("import torch\nX = 1\n\ndef get_inputs():\n    return [torch.randn(3)]\n", "defines no"),
        ("import torch\n\ndef f(x):\n    return x * 2\n", "get_inputs"),
        (
            "import torch\n\ndef f(x):\n    return x\n\ndef g(x):\n    return x\n\n"
            "def get_inputs():\n    return [torch.randn(3)]\n",
            "several candidates",
        ),
        ("import nonexistent_module_xyz\n", "importing"),
    ],
)
def test_clear_errors(tmp_path, body, message):
    path = _write(tmp_path, "bad.py", body)
    with pytest.raises(ReferenceError, match=message):
        load_reference(str(path))


def test_missing_sources():
    with pytest.raises(ReferenceError, match="does not exist"):
        load_reference("no/such/file.py")
    with pytest.raises(ReferenceError, match="neither"):
        load_reference("just_a_name")
    with pytest.raises(ReferenceError, match="cannot import"):
        load_reference("no_such_pkg_xyz.mod:fn")


def _create(*args):
    from typer.testing import CliRunner

    from kernelwright.cli import app

    return CliRunner().invoke(app, ["create", *args])


def test_cli_needs_a_source_or_a_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _create()
    assert result.exit_code == 2 and "give a SOURCE file or --from-profile FILE" in result.output
    result = _create("--from-profile", "missing.yaml")
    assert result.exit_code == 2, result.output
    assert "'--from-profile'" in result.output and "missing.yaml" in result.output
    assert "does not exist" in result.output and "SOURCE" not in result.output


def test_cli_from_a_bad_profile_is_one_sentence_not_a_bug_report(tmp_path, monkeypatch):
    from kernelwright.profiles.model import (
        DecoderDecision,
        LMHeadDecision,
        LogitsDecision,
        ModelProfile,
        MoEDecision,
        NormDecision,
        OutputDecision,
        RopeDecision,
    )

    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text("a: [1\n")
    result = _create("--from-profile", "bad.yaml")
    assert result.exit_code == 2 and "report" not in result.output, result.output
    assert result.output.startswith("bad.yaml is not valid YAML (line 2): expected ',' or ']'")
    # autopatch's profile given to create
    ModelProfile(
        model_type="llama",
        architecture="LlamaForCausalLM",
        transformers_version="0",
        modeling_file="models/llama/modeling_llama.py",
        config_source="model_type:llama",
        norms=[NormDecision(class_name="LlamaRMSNorm", kind="rms_norm", casting_mode="llama")],
        decoder=DecoderDecision(class_name="LlamaDecoderLayer"),
        moe=MoEDecision(status="absent"),
        rope=RopeDecision(),
        output=OutputDecision(causal_lm_class="LlamaForCausalLM"),
        logits=LogitsDecision(status="absent"),
        lm_head=LMHeadDecision(),
    ).save("model.yaml")
    result = _create("--from-profile", "model.yaml")
    assert result.exit_code == 2
    assert (
        result.output
        == "model.yaml is a model profile (autopatch), not a kernel profile (create)\n"
    )
    # a kernel profile with a broken field: that field, one line
    Path("k.yaml").write_text(profile_of("relu_squared").to_yaml().replace("tier: 1", "tier: 4"))
    result = _create("--from-profile", "k.yaml")
    assert result.exit_code == 2
    assert result.output == "k.yaml: tier: Input should be 1, 2 or 3 (got 4)\n"


def test_a_reduction_over_the_rows_values_becomes_the_tail(tmp_path):
    # cross-entropy's mean over rows: the kernel computes each row's loss (the head, traced
    # again on its own), the mean runs after it in PyTorch
    p = profile_of("cross_entropy_mean")
    assert p.tier == 2 and p.reduction_dims == [-1]
    assert [(s.name, s.example_shape, s.broadcast) for s in p.outputs] == [("y", [32], "row")]
    assert [n.target for n in p.tail.nodes if n.op == "call_function"] == [
        "aten.mean.default", "aten.neg.default"]  # fmt: skip
    assert any(n.startswith("tail (PyTorch") and "mean(row0)" in n for n in p.notes)
    assert KernelProfile.from_yaml(p.to_yaml()).tail == p.tail
    # a division by the traced row count is read from the rows at run time; any other use of
    # that count would be wrong at other sizes: it stops
    for op, tier in (("/", 2), ("+", 3)):
        path = _write(tmp_path, "rows_baked.py", f"""
            import torch

            def rows_baked(x):
                return x.pow(2).sum(-1).sum() {op} 4

            def get_inputs():
                return [torch.randn(4, 96)]
            """)  # fmt: skip
        baked = understand(str(path))
        assert baked.tier == tier, baked.unsupported_reason
        if tier == 2:
            assert "sum(row0, []) / sym_numel(row0)" in " ".join(baked.notes)
        else:
            assert "size 4 of the rows' values is baked into aten.add" in baked.unsupported_reason


@pytest.mark.parametrize(
    "expr, stops",
    [
        ("x.permute(0, 1, 2)", False),
        ("x.transpose(-1, 2)", False),
        ("x.permute(0, 2, 1)", True),
    ],
)
def test_a_permute_to_the_same_order_is_no_layout_change(tmp_path, expr, stops):
    path = _write(
        tmp_path,
        "same_order.py",
        f"""
        import torch

        def same_order(x):
            return torch.relu({expr}) * 2

        def get_inputs():
            return [torch.randn(2, 3, 16)]
        """,
    )
    p = understand(str(path))
    assert (p.unsupported_node is not None) == stops, p.unsupported_reason
    if stops:
        assert "layout change permute" in p.unsupported_reason
    else:
        assert p.tier == 1
        assert not any("permute" in n.target or "transpose" in n.target
                       for g in (p.forward, p.backward) for n in g.nodes)  # fmt: skip
