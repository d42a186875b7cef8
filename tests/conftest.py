"""Test setup: kernels run on the GPU when there is one, else through Triton's interpreter.

Importing kernelwright first sets TRITON_INTERPRET=1 on machines without CUDA, before any
kernel is decorated. Shapes are chosen per backend: small under the interpreter (every
program instance costs milliseconds), realistic on the GPU.
"""

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


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)


__all__ = ["DEVICE", "H100", "ON_GPU", "interpreter_mode"]
