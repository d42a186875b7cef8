"""Pydantic schemas of the profiles the workflows write and review (YAML on disk)."""

from kernelwright.profiles.debug import CompiledDebugProfile, DebugProfile, ModelDebugProfile
from kernelwright.profiles.kernel import KernelProfile
from kernelwright.profiles.model import ModelProfile
from kernelwright.profiles.optimization import OptimizationProfile

__all__ = [
    "CompiledDebugProfile",
    "DebugProfile",
    "KernelProfile",
    "ModelDebugProfile",
    "ModelProfile",
    "OptimizationProfile",
]
