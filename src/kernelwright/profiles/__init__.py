"""Pydantic schemas of the profiles the workflows write and review (YAML on disk)."""

from kernelwright.profiles.debug import DebugProfile, ModelDebugProfile
from kernelwright.profiles.kernel import KernelProfile
from kernelwright.profiles.model import ModelProfile
from kernelwright.profiles.optimization import OptimizationProfile

__all__ = [
    "DebugProfile",
    "KernelProfile",
    "ModelDebugProfile",
    "ModelProfile",
    "OptimizationProfile",
]
