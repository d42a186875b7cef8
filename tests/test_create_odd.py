"""create · Understand on odd references: each ends in a profile (tier 3 naming the node and the
reason where no kernel can be made) or a ReferenceError saying what to change — never another
exception. These are the shapes of reference that used to end `kernelwright create` in a
traceback (or in generated tests that failed for a reason of their own).

CPU only, no Triton: Understand runs the reference eagerly and traces it on fake tensors.
"""

from __future__ import annotations

import textwrap

import pytest

from kernelwright.workflows.create import understand
from kernelwright.workflows.create.load import ReferenceError, name_problem, op_identifier

X = "def get_inputs():\n    return [torch.randn(4, 16)]\n"
XW = "def get_inputs():\n    return [torch.randn(4, 16), torch.randn(16)]\n"

# file stem -> (source after the imports, expected): "error: <text>" for a ReferenceError
# whose message holds <text>, else "tier N" or "stop <node>" (tier 3, the unsupported node)
CASES = {
    "shapes_mismatch": ("def f(x, w):\n    return x @ w.t() @ w.t()\n" + XW,
                        "error: fails on the inputs"),
    "exits": ("import sys\ndef f(x):\n    sys.exit(3)\n" + X, "error: SystemExit"),
    "recurses": ("def f(x):\n    return f(x)\n" + X, "error: RecursionError"),
    "keyword_only": ("def f(*, x):\n    return x\n" + X, "error: fails on the inputs"),
    "inputs_none": ("def f(x):\n    return x\ndef get_inputs():\n    return None\n",
                    "error: get_inputs() failed"),
    "inputs_tensor": ("def f(x):\n    return x\ndef get_inputs():\n    return torch.randn(4)\n",
                      "error: returned a Tensor"),
    "inputs_raise": ("def f(x):\n    return x\ndef get_inputs():\n    raise RuntimeError('no')\n",
                     "error: get_inputs() failed"),
    "init_not_list": (
        "class Model(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
        "        self.w = nn.Parameter(torch.randn(n))\n    def forward(self, x):\n"
        "        return x * self.w\ndef get_init_inputs():\n    return 16\n" + X,
        "error: get_init_inputs() failed",
    ),
    "writes_input": ("def f(x):\n    x.mul_(2)\n    return x + 1\n" + X, "stop x"),
    "no_grad": ("def f(x, w):\n    with torch.no_grad():\n        s = w * 2\n    return x * s\n"
                + XW, "stop no_grad"),
    "buffer": (
        "class Buf(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.register_buffer('scale', torch.randn(16))\n"
        "    def forward(self, x):\n        return x * self.scale\n" + X,
        "stop buffer scale",
    ),
    "tensor_constant": ("def f(x, v):\n    return x.index_put((torch.tensor([0, 2]),), v)\n" + XW,
                        "stop _tensor_constant0"),
    "returns_none": ("def f(x):\n    x.relu()\n" + X, "stop output"),
    "returns_dict": ("def f(x):\n    return {'a': x.relu()}\n" + X, "stop output"),
    "returns_float": ("def f(x):\n    return 3.0\n" + X, "stop output"),
    "float_from_ints": ("def f(m):\n    return m.float() * 2\n"
                        "def get_inputs():\n    return [torch.rand(4, 16) > 0.5]\n", "stop y"),
    "not_a_module": ("class Model:\n    def forward(self, x):\n        return x\n" + X,
                     "error: class Model is not an nn.Module subclass"),
    "nested_inputs": ("def f(x, ws):\n    return x * ws[0]\n"
                      "def get_inputs():\n    return [torch.randn(4, 16), [torch.randn(16)]]\n",
                      "error: argument 1 is a list holding tensors"),
    "closure": ("def make(k):\n    def g(x):\n        return x * k\n    return g\n"
                "f = make(3.0)\n" + X, "error: several candidates (f, make)"),
    "no_derivative": ("def f(x):\n    return x // 2 + x\n" + X, "stop aten.floor_divide"),
    "reads_item": ("def f(x):\n    return x / x.abs().max().item()\n" + X,
                   "stop aten._local_scalar_dense.default"),
    "numpy": ("def f(x):\n    return torch.from_numpy(x.detach().numpy() * 2)\n" + X,
              "stop numpy"),
    "mask_index": ("def f(x):\n    return x[x > 0].sum() * x\n" + X, "stop aten.nonzero.default"),
    "complex_input": ("def f(x, z):\n    return x * z.abs()\n"
                      "def get_inputs():\n    return [torch.randn(4, 16), "
                      "torch.randn(4, 16, dtype=torch.complex64)]\n", "stop z"),
    "constant_output": ("def f(x):\n    return torch.zeros(4, 16) + 1\n" + X, "stop y"),
    # verified by `kernelwright create` (the generated tests pass) once Understand gets these
    "passthrough": ("def f(x, w):\n    return x, x * w\n" + XW, "tier 2"),
    "detached": ("def f(x, w):\n    return x * w.detach()\n" + XW, "tier 1"),
    "detached_first": ("def f(x):\n    return x.detach() * 2, x.relu() * 3\n" + X, "tier 1"),
    "names": ("def f(self, _device, torch):\n    return self * _device + torch\n"
              "def get_inputs():\n    return [randn(4, 16) for _ in range(3)]\n", "tier 1"),
    "123start": ("def f(x):\n    return x.relu()\n" + X, "tier 1"),
    "torch": ("def f(x):\n    return x.relu()\n" + X, "tier 1"),
}  # fmt: skip


def _write(tmp_path, stem: str) -> str:
    body, _ = CASES[stem]
    head = "import torch\nfrom torch import nn\nfrom torch import randn\n\n"
    path = tmp_path / f"{stem}.py"
    path.write_text(head + textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("stem", sorted(CASES))
def test_odd_reference_ends_cleanly(tmp_path, stem):
    expected = CASES[stem][1]
    source = _write(tmp_path, stem)
    if expected.startswith("error: "):
        with pytest.raises(ReferenceError) as e:
            understand(source)
        assert expected.removeprefix("error: ") in str(e.value)
        return
    p = understand(source)
    if expected.startswith("stop "):
        assert p.tier == 3 and p.unsupported_node == expected.removeprefix("stop ")
        assert p.unsupported_reason and "data-dependent" not in p.unsupported_reason
        return
    assert p.tier == int(expected.removeprefix("tier ")), p.unsupported_reason
    assert name_problem(p.name) is None
    names = [s.name for s in p.inputs]
    if stem == "names":  # renamed apart from what the generated code uses beside them
        assert names == ["self_in", "_device_in", "torch_in"]
    if stem in ("123start", "torch"):
        assert p.name == {"123start": "op_123start", "torch": "torch_op"}[stem]
    if stem == "passthrough":  # an input returned as is still carries its output's gradient
        assert p.gradients[0].startswith("dx = dy0 +"), p.gradients
    if stem == "detached":  # the stop-gradient is kept, so the reference's autograd agrees
        assert "aten.detach.default" in {n.target for n in p.forward.nodes}
        assert [s.requires_grad for s in p.inputs] == [True, False]
    if stem == "detached_first":  # the gradient is the second output's, not the first's
        assert "dy1" in p.gradients[0] and "dy0" not in p.gradients[0], p.gradients


def test_op_names():
    assert [op_identifier(n) for n in ("class", "123start", "torch", "c", "test_x", "softmax")] == [
        "class_op", "op_123start", "torch_op", "c_op", "op_test_x", "softmax"
    ]  # fmt: skip
    assert name_problem("my-op") and name_problem("triton") and not name_problem("my_op")


RANDOM = {  # the forward's expression of x -> the call the stop names ("" where none)
    "x + torch.randn_like(x)": "randn_like",
    "x * torch.rand(x.shape)": "rand",
    "torch.bernoulli(torch.sigmoid(x)) * x": "bernoulli",
    "F.dropout(x, p=0.5)": "dropout",
    "nn.Dropout(0.1)(x)": "dropout",
    "x + torch.randn(x.shape, generator=torch.Generator().manual_seed(1))": "randn",
    "F.dropout(x, p=0.5, training=False) * 2": "",
    "F.dropout(x, p=0.0) * 2": "",
}


@pytest.mark.parametrize("expr", sorted(RANDOM))
def test_a_reference_that_draws_random_numbers_stops_saying_so(tmp_path, expr):
    path = tmp_path / "noisy.py"
    path.write_text(
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\n"
        f"class Model(nn.Module):\n    def forward(self, x):\n        return {expr}\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 16)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    p = understand(str(path))
    if not RANDOM[expr]:  # dropout that is the identity draws nothing
        assert p.tier == 1, p.unsupported_reason
        return
    assert p.tier == 3 and p.unsupported_node == RANDOM[expr]
    assert "draws random numbers" in p.unsupported_reason
    assert "cannot reproduce bit for bit" in p.unsupported_reason
    if RANDOM[expr] == "dropout":
        assert "model.eval()" in p.unsupported_reason and "p=0" in p.unsupported_reason
        assert "mask as an input" in p.unsupported_reason


def test_cli_create_stops_cleanly_on_dropout(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from kernelwright.cli import app

    ref = tmp_path / "drop.py"
    ref.write_text("import torch.nn.functional as F\nimport torch\n\n\ndef drop(x):\n"
                   "    return F.dropout(x, 0.2)\n\n\ndef get_inputs():\n"
                   "    return [torch.randn(4, 16)]\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    got = CliRunner().invoke(app, ["create", str(ref), "--yes"], terminal_width=400)
    assert got.exit_code == 2, got.output
    assert "stopped: node 'dropout': the reference draws random numbers" in got.output
    assert "Traceback" not in got.output


def test_a_target_picked_in_a_file_names_the_op(tmp_path):
    path = tmp_path / "ops.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\n\ndef squared_relu(x):\n"
        "    return torch.relu(x) ** 2\n\n\nclass ScaledTanh(nn.Module):\n"
        "    def forward(self, x):\n        return torch.tanh(x) * 2\n\n\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x * 3\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 16)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    assert understand(f"{path}:squared_relu").name == "squared_relu"
    assert understand(f"{path}:ScaledTanh").function_name == "scaled_tanh"
    assert understand(f"{path}:ScaledTanh", name="my_tanh").name == "my_tanh"
    # KernelBench's class is always Model: the file names it, as without a target
    assert understand(f"{path}:Model").name == understand(str(path)).name == "ops"
