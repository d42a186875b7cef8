"""The kernel library: one module per op (kernels → launcher → autograd → function → module)."""
