"""Tools for tuning a kernel's launch configuration rather than measuring it, run from the
repository root as ``python -m benchmarks.diagnose.<name>``; each prints its findings."""
