"""The model analyser: any Hugging Face causal LM or image-text-to-text model in, a
ModelProfile out.

`patch(model)` runs it on the model it is given; the autopatch workflow runs it on a model
type, a config or a modeling file and writes the profile for review. It reads the source of
the model's classes (`ast`), builds a tiny CPU instance (`load.py`) and confirms every "patch"
decision numerically (`checks.py`) against exactly what the patcher will run, then the whole
tiny model patched against unpatched (`..parity`).
"""

from kernelwright.integrations.transformers.analysis.analyze import analyze

__all__ = ["analyze"]
