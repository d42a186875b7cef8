"""What every part of the analysis reads: the resolved target, its tiny instance, the config."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.integrations.transformers.analysis.load import Target
from kernelwright.profiles.model import Evidence


@dataclass
class Context:
    target: Target
    tiny: nn.Module
    text_config: object  # the original text config: values reported come from it
    text_prefix: str  # "" or "text_config." for evidence keys of multimodal configs
    modules: dict[str, nn.Module] = field(default_factory=dict)  # text-path modules of tiny
    # modules of the vision tower and projector (components whose norms and MLPs are analysed)
    component_modules: dict[str, nn.Module] = field(default_factory=dict)
    text_model_path: str = ""
    notes: list[str] = field(default_factory=list)

    def cfg(self, key: str):
        return getattr(self.text_config, key, None)

    def cfg_ev(self, key: str) -> Evidence:
        return S.config_evidence(self.text_prefix + key, self.cfg(key))

    def classes(self, components: bool = False) -> dict[str, list[tuple[str, nn.Module]]]:
        """class name -> [(path, module)] over the text path (and the analysed components),
        in registration order."""
        out: dict[str, list[tuple[str, nn.Module]]] = {}
        modules = {**self.modules, **self.component_modules} if components else self.modules
        for path, m in modules.items():
            out.setdefault(type(m).__name__, []).append((path, m))
        return out


def text_config(config):
    """The decoder's config (a multimodal config's text_config; the config itself otherwise)."""
    get = getattr(config, "get_text_config", None)
    return (get() if get else None) or config
