"""Pydantic schemas of the profiles the workflows write and review (YAML on disk)."""

from kernelwright.profiles.model import ModelProfile

__all__ = ["ModelProfile"]
