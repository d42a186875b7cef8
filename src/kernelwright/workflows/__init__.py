"""Workflows: Understand → Act → Verify, each stage writing a reviewed profile.

- `autopatch`: any Hugging Face causal LM → a ModelProfile (YAML) → the patched model.
"""
