"""kernelwright.compile: the graph pass and the per-call-site selection of implementations."""
