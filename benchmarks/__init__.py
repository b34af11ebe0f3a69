"""Benchmarks of this repository's kernels, run from the repository root as
``python -m benchmarks.<command>`` (benchmarks/README.md lists them and their latest results).

``benchmarks.timing`` is how every command times, ``benchmarks.cases`` the ops and the code they
replace, ``benchmarks.results_io`` where each command's latest results are written.
"""
