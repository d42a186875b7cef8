"""Emit a model's convergence test: one standalone pytest file per reviewed ModelProfile.

The file embeds the profile it tests (so it checks exactly what was reviewed, not what a later
analysis would decide), builds a small model from the profile's `config_source`, and runs
`kernelwright.testing.convergence` with the suites' settings: tiny fp32 everywhere (through
Triton's interpreter without a GPU), and the "gpu" size in fp32 and bf16 when CUDA is there.
The same profile always renders the same bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from kernelwright.profiles.model import ModelProfile
from kernelwright.testing.convergence import RUNS

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE = "convergence_test.py.j2"


def _python_literal(text: str) -> str:
    """`text` as a Python string literal that keeps its lines readable in the emitted file."""
    # a raw triple-quoted string keeps YAML's backslash escapes literal; it cannot hold '"""'
    # or end in a backslash, where the one-line repr() form is used instead
    if '"""' in text or text.endswith("\\"):
        return repr(text)
    return 'r"""\n' + text + '"""'


def _identifier(model_type: str) -> str:
    return re.sub(r"\W", "_", model_type)


def render_convergence_test(profile: ModelProfile) -> str:
    """The test file's source for `profile`."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,  # a missing field fails the render, never "" in code
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # Python source, not HTML
    )
    return env.get_template(TEMPLATE).render(
        profile=profile,
        name=_identifier(profile.model_type),  # part of the test functions' names
        profile_literal=_python_literal(profile.to_yaml()),
        unsupported=profile.unsupported(),
        tiny=RUNS["tiny"],
        gpu=RUNS["gpu"],
    )


def emit_convergence_test(profile: ModelProfile, path: str | Path) -> Path:
    """Write the convergence test for `profile` and return the file's path.

    `path` ending in ".py" is the file; anything else is a directory (created if needed) that
    receives `test_convergence_<model_type>.py`.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M

    if profile.model_type in M and M[profile.model_type] != profile.architecture:
        raise ValueError(
            f"{profile.architecture} is an image-text-to-text model: the emitted convergence "
            "test trains causal LMs on text only (tests/test_autopatch_vlm.py trains a VLM with "
            "images)"
        )
    if profile.model_type not in M and profile.config_source.startswith("model_type:"):
        raise ValueError(
            f"{profile.model_type} is not a causal-LM model type: the emitted convergence test "
            "trains causal LMs on text only (tests/test_autopatch_vlm.py trains a VLM with images)"
        )
    path = Path(path)
    if path.suffix != ".py":
        path = path / f"test_convergence_{_identifier(profile.model_type)}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_convergence_test(profile))
    return path
