"""Where a command's latest results live and how they are written.

Each command writes into ``benchmarks/results/<device>/<command>/`` (``default_out``) only its
latest run: ``results.json`` and ``results.md`` (and plots). A command that runs in several
settings (``e2e``: each transformers line and vocabulary; ``decode``: each transformers line)
keeps one entry per setting in that one ``results.json`` (``{"entries": [{"setting": {...},
...}]}``), the setting recorded as data, and a new run replaces only its own setting's entry.
Earlier runs live in git history.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: benchmarks/results/, where each device has a folder of each command's latest results.
RESULTS = Path(__file__).resolve().parent / "results"


def device_folder(device_name: str) -> str:
    """The results folder name of a GPU, from ``torch.cuda.get_device_name()``: its model,
    lower case (``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``)."""
    words = [w for w in device_name.split() if w.lower() not in ("nvidia", "geforce", "tesla")]
    # The model is the words up to the first with a digit ("RTX 4090"); memory and the rest
    # ("80GB HBM3") do not name another folder.
    model = next((words[: i + 1] for i, w in enumerate(words) if re.search(r"\d", w)), words)
    folder = re.sub(r"[^a-z0-9-]", "", "-".join(model).lower())
    if not folder:
        raise ValueError(f"cannot name a results folder after the device {device_name!r}")
    return folder


def default_out(command: str) -> Path:
    """``benchmarks/results/<device>/<command>`` for the CUDA device of this process."""
    import torch

    return RESULTS / device_folder(torch.cuda.get_device_name()) / command


def save_results(out, meta: dict, results: list, write_markdown) -> None:
    """A benchmark's two result files in ``out``: ``results.json`` (``{"meta", "results"}``)
    and ``results.md``, the tables ``write_markdown(meta, results, path)`` renders."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    write_markdown(meta, results, os.path.join(out, "results.md"))


def transformers_line(version: str) -> str:
    """``"4.57.6"`` -> ``"4.57"``: results are kept per line, the latest patch release's."""
    return ".".join(version.split(".")[:2])


def read_entries(path: Path) -> list[dict]:
    """The entries of a ``results.json`` kept per setting (none when the file does not exist)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("setting"), dict) for e in entries
    ):
        raise ValueError(
            f"{path} is not a results file kept per setting ({{'entries': [{{'setting': ...}}]}}); "
            "move it away or delete it, and run again"
        )
    return entries


def entry_for(entries: list[dict], setting: dict) -> dict:
    """The entry of ``setting`` (an empty one with that setting when there is none)."""
    for entry in entries:
        if entry["setting"] == setting:
            return entry
    return {"setting": dict(setting)}


def replace_entry(entries: list[dict], entry: dict) -> list[dict]:
    """``entries`` with ``entry`` in place of the one of its setting (added if new), ordered by
    setting so that results.md reads the same whatever order the runs came in."""
    kept = [e for e in entries if e["setting"] != entry["setting"]]
    return sorted([*kept, entry], key=lambda e: sorted(e["setting"].items()))


def write_entries(path: Path, entries: list[dict]) -> None:
    """``results.json`` of a command kept per setting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"entries": entries}, indent=1) + "\n")
