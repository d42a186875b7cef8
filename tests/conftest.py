"""Test setup: kernels run on the GPU when there is one, else through Triton's interpreter.

Importing kernelwright first sets TRITON_INTERPRET=1 on machines without CUDA, before any
kernel is decorated. Shapes are chosen per backend: small under the interpreter (every
program instance costs milliseconds), realistic on the GPU.
"""

import contextlib
from pathlib import Path

import pytest
import torch

import kernelwright  # noqa: F401  (selects the backend before kernels are defined)
from kernelwright.runtime import DeviceInfo, default_device, interpreter_mode

DEVICE = default_device()
ON_GPU = DEVICE.type == "cuda"
# A Hopper GPU for tests of launch decisions that depend on the device (no GPU needed).
H100 = DeviceInfo("cuda", "NVIDIA H100", "hopper", (9, 0), 132, 50 << 20, 80 << 30)


def pytest_report_header(config):
    if ON_GPU:
        return f"kernelwright: CUDA, {torch.cuda.get_device_name()}"
    return "kernelwright: Triton interpreter on CPU (TRITON_INTERPRET=1)"


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches reset before and after a test: compiled graphs of one test never serve
    another's."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _return_cached_gpu_memory():
    """Under `pytest -n N` every worker shares the GPU: the caching allocator of each would keep
    its largest test's blocks reserved, and N such caches fill the GPU's memory."""
    yield
    if ON_GPU:
        torch.cuda.empty_cache()


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture(autouse=True, scope="session")
def _results_db(tmp_path_factory):
    # bench, optimize and create append their rows to the results database: not the checkout's
    mp = pytest.MonkeyPatch()
    mp.setenv("KERNELWRIGHT_RESULTS_DB", str(tmp_path_factory.mktemp("results") / "results.db"))
    yield
    mp.undo()


# Tests past 2^31 elements: tens of GiB each on a GPU. They are marked `large_memory` (run them
# alone: `-m large_memory`, then the rest with `-m "not large_memory"`), and under
# `-n N --dist loadgroup` they share one worker, so no two of them hold the GPU's memory at once.
LARGE_MEMORY = ("int64_offsets", "int64_row_offsets")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        if item.originalname.endswith(LARGE_MEMORY):
            item.add_marker(pytest.mark.large_memory)
        if "large_memory" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("large_memory"))


__all__ = ["DEVICE", "H100", "ON_GPU", "interpreter_mode"]


@contextlib.contextmanager
def generated_lock():
    """Held while a test writes or reads this checkout's ops/generated (a file lock across the
    test workers): two writers at once would each restore an __init__.py holding the other's
    op, and a reader would see an export whose module is gone."""
    import fcntl
    import hashlib
    import tempfile

    from kernelwright.workflows.create.library import checkout_paths

    key = hashlib.sha1(str(checkout_paths()[1].resolve()).encode()).hexdigest()[:12]
    lock = Path(tempfile.gettempdir()) / f"kernelwright-generated-{key}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def written_op(name: str):
    """The files `create --into-library` writes into the checkout for op `name` (yielded): the
    block may write them; afterwards they are removed and ops/generated/__init__.py is as it
    was, so the checkout ends as it began (one such block at a time: `generated_lock`)."""
    from kernelwright.workflows.create.library import checkout_paths

    package_dir, repo = checkout_paths()
    paths = [package_dir / "ops" / "generated" / f"{name}.py",
             repo / "tests" / "generated" / f"test_generated_{name}.py",
             repo / "benchmarks" / "generated" / f"bench_{name}.py"]  # fmt: skip
    init = package_dir / "ops" / "generated" / "__init__.py"
    with generated_lock():
        before = init.read_text()
        try:
            yield paths
        finally:
            for path in paths:
                path.unlink(missing_ok=True)
            init.write_text(before)


def rope_agrees(hf_fn, ours, q, k, cos, sin, gen):
    """A model's RoPE function `hf_fn(q, k, cos, sin)` against `ours(q, k, cos, sin)`, each on
    its own copies of q and k, forward and backward for the same random upstream gradients:
    equal bit for bit under the interpreter, within 1e-6 (relative norm) on a GPU. Returns our
    outputs and that comparison, for further checks."""
    from kernelwright.testing import rand, rel_norm_error

    qs, ks = ([t.detach().clone().requires_grad_() for t in (q, k)] for _ in range(2))
    ref, out = hf_fn(*qs, cos, sin), ours(*ks, cos, sin)
    grads = [rand(t.shape, torch.float32, t.device, gen=gen) for t in ref]
    torch.autograd.backward(ref, grads)
    torch.autograd.backward(out, grads)
    close = (lambda a, b: rel_norm_error(a, b) < 1e-6) if ON_GPU else torch.equal
    for a, b in (*zip(ref, out, strict=True), (qs[0].grad, ks[0].grad), (qs[1].grad, ks[1].grad)):
        assert close(a, b)
    return out, close


def package_beside_cwd(tmp_path, monkeypatch, name: str):
    """An empty package `name` in `tmp_path`, made the working directory and kept off sys.path
    (as a console script starts): a `name.module:function` target must import it from there."""
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    return pkg
