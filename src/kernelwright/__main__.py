"""`python -m kernelwright`: the same command line as the `kernelwright` script."""

from kernelwright.cli import main

main()
