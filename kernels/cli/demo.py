"""``kernels demo``: the main job, `kernels.demo` (also ``python -m kernels.demo``)."""

from __future__ import annotations

import argparse
import importlib.util

# kernels.demo imports only the standard library at module level (torch and transformers
# inside run()), so importing it here keeps `kernels --help` fast.
from .. import demo as _demo
from . import CommandError

_SUMMARY, _, _DETAILS = (_demo.__doc__ or "").strip().partition("\n")
HELP = _SUMMARY.split(": ", 1)[-1].rstrip(".")
DESCRIPTION = f"{HELP[:1].upper()}{HELP[1:]}.\n{_DETAILS.rstrip()}"
EPILOG = """\
examples:
  kernels demo                      # on a GPU: bf16 model, checks and timings
  kernels demo --device cpu         # tiny model through Triton's interpreter: checks only
  kernels demo --no-timing --seed 1
See also `kernels explain demo` for the kernel plan with every candidate."""


def configure(parser: argparse.ArgumentParser) -> None:
    _demo.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # kernels.demo prints these two failures on stdout; as a command they are errors.
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise CommandError(
                "--device cuda, but torch sees no CUDA GPU; use --device cpu, or install a "
                "CUDA build of torch"
            )
    # Only looked up, not imported: on the CPU, kernels.demo sets TRITON_INTERPRET=1 first.
    if importlib.util.find_spec("transformers") is None:
        raise CommandError("the demo needs transformers: pip install 'kernels[demo]'")
    return _demo.run(args)
