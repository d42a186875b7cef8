"""autopatch: any Hugging Face causal LM → a reviewed ModelProfile → the patched model.

Understand: `analyze(source)` builds the profile; the analyser itself lives with the patcher
that runs it at runtime (`kernelwright.integrations.transformers.analysis`). This workflow adds
what the command line needs around it: the one-screen summary (`summary.py`) and the generated
convergence test (`emit.py`).
"""

from kernelwright.integrations.transformers.analysis import analyze

__all__ = ["analyze"]
