"""Launch-config tables, one module per op (see kernelwright.runtime.launch)."""
