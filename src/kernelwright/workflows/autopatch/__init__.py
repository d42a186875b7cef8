"""autopatch: any Hugging Face causal LM → a reviewed ModelProfile → the patched model.

Understand: `analyze(source)` builds the profile (`analyze.py`), every decision with evidence
and, for what gets patched, a numerical check on a tiny instance (`checks.py`).
"""

from kernelwright.workflows.autopatch.analyze import analyze

__all__ = ["analyze"]
