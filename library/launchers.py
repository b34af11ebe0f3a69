"""Build the C modules Triton's CUDA driver needs for compiled kernels, under any Python, on a
machine without a GPU: ``library/binaries.py build``'s second step, run by the Python whose
modules they are, with only Triton on its path (no torch, nothing of ours)::

    TRITON_CACHE_DIR=<cache> TRITON_LIBCUDA_PATH=<stub folder> PYTHONPATH=<triton> \\
        python3.12 library/launchers.py <kernels.json>

Triton 3.6 builds, with the machine's C compiler, a launcher per kernel signature
(``__triton_launcher``) and its driver's utils (``cuda_utils``), each into its cache under a
key that hashes the C source and the platform, when a process first needs them. Here they are
built the way Triton builds them (its own ``CudaLauncher`` and ``CudaUtils``, for the
signatures in ``kernels.json``: one ``{"signature", "constants", "arg_names",
"tensordesc_meta"}`` object a kernel, as the compile step wrote it), linked against a stub of
``libcuda.so.1`` (the user's driver is the one loaded). Loading them needs that driver, so the
load that follows each build fails here; what matters is the file in the cache, which is
checked. Triton versions without per-signature launchers (3.9 launches through one generic
function) build nothing here: their driver utils' key hashes the install path, so it cannot be
shipped.

Standalone: the standard library and Triton only, for any Python Triton supports.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace


def _tuple_keys(pairs: list) -> dict:
    return {tuple(path): value for path, value in pairs}


def _modules_in(cache: Path) -> set[Path]:
    return {p for p in cache.glob("*/*.so") if p.is_file()}


def build(entries: list[dict], cache: Path) -> list[str]:
    """Build the modules for ``entries`` into ``cache`` (Triton's cache folder, which
    ``TRITON_CACHE_DIR`` must name); return what could not be built."""
    from triton.backends.nvidia import driver as nvidia

    if not hasattr(nvidia, "make_launcher"):
        return []
    problems = []
    builds = [("cuda_utils", lambda: nvidia.CudaUtils())]
    for entry in entries:
        src = SimpleNamespace(
            constants=_tuple_keys(entry["constants"]),
            signature=entry["signature"],
            fn=SimpleNamespace(arg_names=entry["arg_names"]),
        )
        metadata = SimpleNamespace(tensordesc_meta=entry["tensordesc_meta"])
        builds.append(
            (entry["name"], lambda src=src, metadata=metadata: nvidia.CudaLauncher(src, metadata))
        )
    for name, make in builds:
        before = _modules_in(cache)
        try:
            make()
        except ImportError as exc:
            # Built into the cache, then loaded, which needs the user's driver. (Without a new
            # file, the module was in the cache already: two kernels of one signature share a
            # launcher.)
            if "libcuda" not in str(exc) and not _modules_in(cache) - before:
                problems.append(f"{name}: {exc}")
        except Exception as exc:  # a C compiler error, or Triton refusing the signature
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: launchers.py <kernels.json>", file=sys.stderr)
        return 2
    cache = os.environ.get("TRITON_CACHE_DIR")
    if not cache or not os.environ.get("TRITON_LIBCUDA_PATH"):
        print("error: set TRITON_CACHE_DIR and TRITON_LIBCUDA_PATH", file=sys.stderr)
        return 2
    entries = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    problems = build(entries, Path(cache))
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
