"""``kernels explain MODEL``: what `kernelize` would do with each tagged layer of a model, and why."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import CommandError

if TYPE_CHECKING:
    from torch import nn

HELP = "show which kernel kernelize would give each tagged layer of a model, and why"
DESCRIPTION = """\
For each tagged layer of a transformers model, list the kernels registered for the device,
which one wins (by device, capability range and mode) and why the others are passed over,
and whether the winner would run or the layer would keep its own forward. The model is built
on the meta device from its config only: no weights are loaded and nothing is changed.
Kernels are loaded (Hub kernels downloaded if needed) to check that they would run.

MODEL is one of:
  PATH        a folder written by save_pretrained (only its config.json is read)
  MODEL_TYPE  a transformers model type (llama, qwen2, qwen3, mistral, gemma, gpt2, ...)
              or config class (LlamaConfig): a tiny random model of that architecture
  demo        the Llama-style model of `kernels demo`, at its size for the device
A folder whose name is also a model type is read as a folder when written as ./NAME.

--mapping lists where kernels come from, applied in order (later sources win for the same
layer and device):
  transformers  transformers' default mapping of Hub kernels, which transformers registers
                at import (4.57) or at every use_kernels (5.x)
                (transformers.integrations.hub_kernels)
  library       our Triton kernels (kernels.library_mapping), registered for the device,
                with the gated MLPs (and on 4.57 the rotary embeddings) and the
                *ForCausalLM loss tagged as kernels.library.register_library_kernels() has
                kernelize tag them; for demo, only what `kernels demo` tags (no loss)
  none          no kernels at all: lists the tagged layers only
The default, transformers,library, is what a program sees that calls
register_library_kernels() and loads with use_kernels=True.

For --device cuda (or rocm) the GPU's capability decides between kernels registered for
capability ranges; without a visible GPU give it with --capability (e.g. 90 for an H100)."""
EPILOG = """\
examples:
  kernels explain llama --device cpu
  kernels explain qwen3 --device cuda --capability 90 --mode training+compile
  kernels explain ./my-model --mode inference --mapping transformers
  kernels explain demo --mode training --json"""

#: --mode values and the kernels.Mode flags they stand for (names of Mode members).
MODES: dict[str, tuple[str, ...]] = {
    "inference": ("INFERENCE",),
    "training": ("TRAINING",),
    "inference+compile": ("INFERENCE", "TORCH_COMPILE"),
    "training+compile": ("TRAINING", "TORCH_COMPILE"),
}
MAPPING_SOURCES = ("transformers", "library", "none")

#: Sizes of the tiny models built for a model type (on the meta device, so size costs nothing).
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)


def parse_mode(value: str) -> str:
    """An argparse type: a --mode value, normalised to a key of `MODES`."""
    mode = value.strip().lower().replace(" ", "")
    if mode not in MODES:
        raise argparse.ArgumentTypeError(f"invalid mode {value!r}; choose from {', '.join(MODES)}")
    return mode


def parse_mapping(value: str) -> tuple[str, ...]:
    """An argparse type: a comma-separated list of mapping sources."""
    sources = tuple(s.strip().lower() for s in value.split(",") if s.strip())
    unknown = [s for s in sources if s not in MAPPING_SOURCES]
    if unknown or not sources:
        raise argparse.ArgumentTypeError(
            f"invalid mapping {value!r}; give one or more of {', '.join(MAPPING_SOURCES)}, "
            "separated by commas"
        )
    if "none" in sources and len(sources) > 1:
        raise argparse.ArgumentTypeError("--mapping none cannot be combined with other sources")
    if len(set(sources)) != len(sources):
        raise argparse.ArgumentTypeError(f"invalid mapping {value!r}: a source is repeated")
    return sources


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a save_pretrained folder, a model type such as llama, or demo",
    )
    parser.add_argument(
        "--mode",
        type=parse_mode,
        default="inference",
        metavar="MODE",
        help=f"what the model is kernelized for: {', '.join(MODES)} (default: inference)",
    )
    parser.add_argument(
        "--device",
        help="the device type kernels are chosen for, e.g. cuda, cuda:1, cpu, rocm "
        "(default: cuda when torch sees a GPU, else cpu)",
    )
    parser.add_argument(
        "--mapping",
        type=parse_mapping,
        default=("transformers", "library"),
        metavar="SOURCES",
        help="where kernels come from, comma-separated, later ones winning: "
        f"{', '.join(MAPPING_SOURCES)} (default: transformers,library)",
    )
    parser.add_argument(
        "--capability",
        type=parse_capability,
        metavar="N",
        help="the GPU capability to choose kernels for, as 10 * major + minor (90 for 9.0); "
        "default: read from the GPU, unknown when none is visible",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a report")


def parse_capability(value: str) -> int:
    """An argparse type: a capability such as 90 (or 9.0)."""
    major, dot, minor = value.strip().partition(".")
    if not major.isdigit() or (dot and not (minor.isdigit() and len(minor) == 1)):
        raise argparse.ArgumentTypeError(
            f"invalid capability {value!r}; give 10 * major + minor, e.g. 90 for 9.0 or 86 for 8.6"
        )
    return int(major) * 10 + int(minor) if dot else int(major)


@dataclass
class BuiltModel:
    model: nn.Module  # on the meta device
    description: str
    # Whether the run being explained has kernelize tag the *ForCausalLM loss, as
    # register_library_kernels() does; `kernels demo` tags only the MLPs and rotary, and a plan
    # that listed the fused loss would describe a kernel the demo never runs.
    tags_losses: bool = True


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import Mode, explain, register_kernel_mapping, use_kernel_mapping
    from ..layer.kernelize import find_target

    mode = Mode[MODES[args.mode][0]]
    for name in MODES[args.mode][1:]:
        mode = mode | Mode[name]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.split(":")[0] == "meta":
        raise CommandError(
            "--device meta: the model is already built on the meta device; --device names where "
            "it would run, e.g. --device cuda or --device cpu"
        )

    if importlib.util.find_spec("transformers") is None:
        raise CommandError("kernels explain needs transformers: pip install 'kernels[demo]'")
    with _quiet_transformers():
        built = build_model(args.model, device)
    notes = _transformers_notes()
    # The device type kernels are registered under (ROCm GPUs are "cuda" to torch, "rocm" here).
    try:
        device_type = find_target(built.model, device).device_type
    except RuntimeError as exc:  # torch.device() of a malformed name
        raise CommandError(f"--device {device}: {exc}") from exc
    parts, described = mapping_parts(args.mapping, device_type)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device_type == "cpu" and "library" in args.mapping and not interpreted:
        notes.append(
            "our Triton kernels run on the CPU only through Triton's interpreter "
            "(TRITON_INTERPRET=1, for checking numerics); library_mapping() registers cpu "
            "only when it is set"
        )

    # A scope of its own, starting empty: the process-wide mapping (which transformers fills
    # at import) is neither used nor changed; registering inside the scope changes only it,
    # later sources replacing earlier ones per layer and device key.
    from ..library.transformers_tags import (
        tag_causal_lm_losses,
        tag_transformers_layers,
        untag_on_exit,
    )

    with (
        untag_on_exit(),
        use_kernel_mapping({}, inherit_mapping=False),
        _capability(args.capability),
    ):
        if "library" in args.mapping:
            # What register_library_kernels has kernelize tag: the gated MLPs (and rotary on
            # 4.57), and the *ForCausalLM forward for the fused loss.
            tag_transformers_layers(built.model)
            if built.tags_losses:
                tag_causal_lm_losses(built.model)
        for part in parts:
            register_kernel_mapping(part)
        explanation = explain(built.model, mode=mode, device=device)
    if device_type in ("cuda", "rocm") and explanation.capability is None:
        notes.append(
            f"no {device} GPU is visible, so its capability is unknown: kernels registered for "
            "a capability range (ours among them) are not chosen; give one with --capability "
            "(e.g. 90 for an H100), or run it on the GPU machine"
        )

    if args.json:
        print(json.dumps(explanation_dict(explanation, built, described, notes), indent=2))
        return 0
    print(f"model: {built.description}")
    print(f"mapping: {described}")
    for note in notes:
        print(f"note: {note}")
    print(explanation)
    return 0


def explanation_dict(explanation, built: BuiltModel, mapping: str, notes: list[str]) -> dict:
    """The explanation as plain data for --json."""
    layers = []
    for layer in explanation.layers:
        entry = dataclasses.asdict(layer)
        entry["paths"] = list(layer.paths)
        entry["candidates"] = [{"candidate": c, "why": why} for c, why in layer.candidates]
        layers.append(entry)
    return {
        "model": built.description,
        "mapping": mapping,
        "notes": notes,
        "mode": str(explanation.mode),
        "device_type": explanation.device_type,
        "capability": explanation.capability,
        "layers": layers,
    }


def build_model(spec: str, device: str) -> BuiltModel:
    """The model MODEL names, built on the meta device (no weights)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    path = Path(spec).expanduser()
    looks_like_path = spec.startswith((".", "~", "/")) or os.sep in spec or "/" in spec
    if looks_like_path:
        return _from_folder(path, spec)
    if spec == "demo":
        return _demo_model(device)
    model_type = _model_type(spec, CONFIG_MAPPING)
    if model_type is not None:
        config = AutoConfig.for_model(model_type, **TINY)
        model = _on_meta(config, f"model type {model_type}")
        return BuiltModel(
            model,
            f"a tiny {type(model).__name__} ({model_type}, {TINY['num_hidden_layers']} layers, "
            f"hidden {TINY['hidden_size']}) on the meta device",
        )
    if path.is_dir():
        return _from_folder(path, spec)
    raise CommandError(
        f"{spec!r} is neither a folder nor a transformers model type{_close_types(spec, CONFIG_MAPPING)}; "
        "pass a folder written by save_pretrained, a model type such as llama, qwen2, qwen3 or "
        "mistral, or demo"
    )


def _model_type(spec: str, config_mapping) -> str | None:
    """The model type `spec` names, as a model type or a config class name, or None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    lowered = spec.lower()
    if lowered in config_mapping:
        return lowered
    for model_type, class_name in CONFIG_MAPPING_NAMES.items():
        if class_name.lower() == lowered:
            # Several types share a config class (code_llama uses LlamaConfig): take its own.
            return getattr(config_mapping[model_type], "model_type", None) or model_type
    return None


def _close_types(spec: str, config_mapping) -> str:
    import difflib

    close = difflib.get_close_matches(spec.lower(), list(config_mapping), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _from_folder(path: Path, spec: str) -> BuiltModel:
    from transformers import AutoConfig

    if not path.exists():
        hub = ""
        if not spec.startswith((".", "/", "~")) and re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
            hub = " (Hub model ids are not fetched: save the model or its config locally first)"
        raise CommandError(
            f"{spec}: no such folder{hub}; pass a folder written by save_pretrained "
            "(with its config.json), or a model type such as llama"
        )
    if not (path / "config.json").is_file():
        raise CommandError(
            f"{spec} has no config.json; pass a folder written by save_pretrained "
            "(model.save_pretrained(folder) or config.save_pretrained(folder))"
        )
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise CommandError(f"transformers cannot read {path / 'config.json'}: {exc}") from exc
    model = _on_meta(config, str(path))
    return BuiltModel(
        model,
        f"{type(model).__name__} from {path} ({getattr(config, 'model_type', '?')}), "
        "config only, on the meta device",
    )


def _demo_model(device: str) -> BuiltModel:
    from ..demo import demo_config, shape_for

    shape = shape_for(device)
    config = demo_config(shape)
    model = _on_meta(config, "the demo's model")
    return BuiltModel(
        model,
        f"the demo's {type(model).__name__} ({shape.layers} layers, hidden {shape.hidden}) "
        "on the meta device",
        tags_losses=False,
    )


def _on_meta(config, what: str):
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    errors = []
    for auto in (AutoModelForCausalLM, AutoModel):
        try:
            with torch.device("meta"):
                return auto.from_config(config)
        except (ValueError, ImportError, OSError) as exc:
            errors.append(f"{auto.__name__}: {exc}")
    raise CommandError(f"transformers cannot build a model for {what}: " + "; ".join(errors))


def mapping_parts(sources: tuple[str, ...], device_type: str) -> tuple[list[dict], str]:
    """The kernel mappings `sources` stand for, to register in order, and a description."""
    from ..library import library_mapping

    parts, described = [], []
    for source in sources:
        if source == "none":
            described.append("none (no kernels registered)")
        elif source == "library":
            parts.append(library_mapping(devices=[device_type]))
            described.append(f"our Triton kernels (library_mapping) for {device_type}")
        else:
            parts.append(_transformers_mapping())
            described.append("transformers' default Hub mapping")
    return parts, ", then ".join(described)


def _transformers_mapping() -> dict:
    try:
        from transformers.integrations import hub_kernels
    except ImportError as exc:
        raise CommandError(f"cannot import transformers.integrations.hub_kernels: {exc}") from exc
    # transformers 5.x builds it lazily; 4.57 builds it at import.
    build = getattr(hub_kernels, "get_kernel_mapping_transformers", None)
    mapping = build() if callable(build) else getattr(hub_kernels, "_KERNEL_MAPPING", None)
    if mapping is None:
        raise CommandError(
            "this transformers version has no default kernel mapping "
            "(transformers.integrations.hub_kernels._KERNEL_MAPPING); use --mapping library"
        )
    return mapping


def _transformers_notes() -> list[str]:
    try:
        from transformers.utils.import_utils import is_kernels_available
    except ImportError:
        return []
    if is_kernels_available():
        return []
    return [
        "transformers did not find the kernels package, so it tags no layers; install this "
        "package (transformers checks the installed distribution, not the import path)"
    ]


@contextmanager
def _capability(capability: int | None) -> Iterator[None]:
    """Read `capability` for every GPU inside the block (nothing changes when None)."""
    if capability is None:
        yield
        return
    from ..mapping.capability import use_capability_reader

    with use_capability_reader(lambda device_type, index: capability):
        yield


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings about random initialisation say nothing here."""
    from transformers.utils import logging as transformers_logging

    saved = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(saved)
