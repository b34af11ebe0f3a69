"""`kernelize`: give every tagged layer of a model the kernel the mapping chooses for it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import (
    KernelLayerError,
    KernelLoadError,
    KernelMappingError,
    NoKernelError,
    as_sentence,
)
from ..mapping.capability import read_capability
from ..mapping.device import Device, validate_device_type
from ..mapping.mode import Mode, validate_kernelize_mode
from ..mapping.registry import current_mapping
from ..mapping.resolve import (
    NO_COMPATIBLE_MODE,
    NO_COMPATIBLE_PROPERTIES,
    NO_DEVICE,
    Candidate,
    Resolution,
    resolve,
)
from ..repos.hub import falls_back_when_unloadable
from .decisions import Decision, DeviceSpec, ExampleInputs, Plan, Target
from .fallback import KernelizeFallback, as_fallback
from .func import attached_functions
from .kernelized import forget_repository, remember_repository
from .loading import load_kernel_layer, repository_error
from .swap import use_kernel_forward, use_original_forward
from .taggers import run_taggers
from .tagging import condition_of, tag_of
from .validation import validate_kernel_layer
from .verify import verify_plan

if TYPE_CHECKING:
    import torch
    from torch import nn

logger = logging.getLogger(__name__)


def kernelize(
    model: nn.Module,
    *,
    mode: Mode,
    device: DeviceSpec | None = None,
    use_fallback: bool | KernelizeFallback = True,
    verify: ExampleInputs | None = None,
) -> nn.Module:
    """Replace the `forward` of every tagged layer in `model` with a kernel from the mapping.

    Each module whose class was tagged (`use_kernel_forward_from_hub`) gets the kernel the
    active mapping registers for its layer name, the device type, the device's capability
    and `mode`; where none fits, or the kernel lacks backward (TRAINING) or torch.compile
    support (TORCH_COMPILE), the module keeps its original forward and the reason is logged.
    Every kernel is resolved, loaded and validated before the model changes: if anything
    raises, the model is left exactly as it was. Kernelizing again with another mode
    switches kernels. The model is changed in place and returned. Taggers added with
    `kernels.layer.taggers.add_tagger` are called with the model first. With
    ``Mode.TORCH_COMPILE`` on torch < 2.13, transformers 5.x's SDPA masks are made to skip the
    causal mask under ``torch.compile`` as they do in eager mode
    (`kernels.compile.causal_mask`; docs/compile.md).

    Args:
        model: the model to kernelize.
        mode: ``Mode.INFERENCE`` or ``Mode.TRAINING``, optionally ``| Mode.TORCH_COMPILE``.
            A model kernelized for TRAINING also serves inference.
        device: the device type to choose kernels for (``"cuda"``, a `Device` or a
            ``torch.device``); by default the device of the model's first parameter or buffer.
            On ROCm builds of torch, ``cuda`` means ``rocm``.
        use_fallback: for which causes a layer keeps its original forward (logged) instead
            of raising: a `KernelizeFallback` set, ``True`` (`KernelizeFallback.DEFAULT`, the
            default: fall back where no kernel fits, raise `KernelLoadError` where a
            registered one cannot be loaded, as Hugging Face's kernels 0.19 does) or
            ``False`` (`KernelizeFallback.NONE`: also raise `NoKernelError` where no kernel
            fits). `KernelizeFallback.ALL` (what transformers 5.x passes) also falls back
            where a kernel cannot be loaded or fails `verify`.
        verify: example inputs for the model (a tensor, a tuple of positional arguments or a
            dict of keyword arguments). The model is run once on them to capture each tagged
            layer's real input; every chosen kernel's output (and, for TRAINING, its
            gradients) is compared with the layer's own forward on that input, and a kernel
            that disagrees, or raises, is not used, or raises `KernelVerificationError` where
            ``KernelizeFallback.VERIFICATION_FAILURE`` is not in `use_fallback` (it is in
            `ALL`, not in `DEFAULT`). The model is left exactly as it was whether verification
            passes, falls back or raises: buffers (BatchNorm statistics), parameters and
            their ``.grad``, ``training`` flags, hooks, the random generators and torch's grad,
            autocast and determinism flags are restored, the same tensor objects in place, so
            the next forward gives what it would without ``verify=``. This holds one copy of
            the model's parameters, buffers and gradients on their devices while it runs
            (about the model's size again). A model with uninitialised lazy modules is refused.
            See `kernels.layer.verify`.

    Example:
        ```python
        from kernels import Mode, kernelize

        model = kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
        ```
    """
    _check_model(model)
    fallback = as_fallback(use_fallback)
    run_taggers(model)
    the_plan = plan(model, mode=mode, device=device, use_fallback=fallback)
    if not the_plan.decisions:
        # Not a missing kernel (nothing asked for one), so no NoKernelError even with
        # use_fallback=False; but a silent no-op is the commonest first surprise.
        logger.warning(
            "kernelize found no tagged layer in %s, so nothing was kernelized. Tag its layers "
            "with @use_kernel_forward_from_hub('Name') or a tagger "
            "(kernels.layer.taggers.add_tagger(kernels.library.tag_gated_mlps)), or use the "
            "aten overrides (kernels.overrides) or the compile backend (kernels.compile), which "
            "need no tags: see docs/untagged.md.",
            type(model).__name__,
        )
    if verify is not None:
        the_plan = verify_plan(
            model,
            the_plan,
            verify,
            use_fallback=KernelizeFallback.VERIFICATION_FAILURE in fallback,
        )
    fallbacks = [decision for decision in the_plan.decisions if decision.kernel is None]
    for decision in the_plan.decisions:
        label = _label(decision)
        if decision.kernel is None:
            use_original_forward(decision.module)
            forget_repository(decision.module)
        else:
            use_kernel_forward(decision.module, decision.kernel, path=decision.path)
            chosen = decision.resolution.chosen
            assert chosen is not None  # a decision with a kernel loaded it from the chosen one
            remember_repository(decision.module, chosen.repository)
            logger.info(
                "%s uses kernel layer %s from %s (%s)",
                label,
                decision.kernel.__name__,
                chosen.repository,
                decision.resolution.reason,
            )
    _log_fallbacks(fallbacks)
    if Mode.TORCH_COMPILE in the_plan.mode:
        # Without it, torch < 2.13 makes transformers 5.x hand SDPA a materialised causal mask
        # in every compiled graph (see kernels.compile.causal_mask).
        from ..compile.causal_mask import restore_causal_mask_skip

        restore_causal_mask_skip()
    return model


def plan(
    model: nn.Module,
    *,
    mode: Mode,
    device: DeviceSpec | None = None,
    use_fallback: bool | KernelizeFallback = True,
    raise_invalid: bool = True,
) -> Plan:
    """Decide, without changing `model`, what `kernelize` would do with each tagged module.

    With ``raise_invalid=False`` a kernel layer that breaks the layer rules becomes a
    fallback decision (logged at ERROR) instead of raising, as `explain` needs.
    """
    _check_model(model)
    mode = validate_kernelize_mode(mode)
    use_fallback = as_fallback(use_fallback)
    target = find_target(model, device)
    mapping = current_mapping()
    decisions: list[Decision] = []
    resolutions: dict[str, Resolution] = {}
    loaded: dict[int, type | KernelLoadError] = {}
    for path, module, layer_name in _kernelizable_modules(model):
        resolution = resolutions.get(layer_name)
        if resolution is None:
            resolution = resolve(
                mapping,
                layer_name,
                device_type=target.device_type,
                capability=target.capability,
                mode=mode,
            )
            resolutions[layer_name] = resolution
        skip = _condition_skip(module, layer_name)
        tensor_parallel = _tensor_parallel_forward(module)
        if tensor_parallel is not None:
            decisions.append(Decision(path, module, layer_name, resolution, None, tensor_parallel))
            continue
        if skip is not None:
            decisions.append(
                Decision(
                    path, module, layer_name, resolution, None, skip, skipped_by_condition=True
                )
            )
            continue
        decisions.append(
            _decide(path, module, layer_name, resolution, mode, use_fallback, loaded, raise_invalid)
        )
    return Plan(mode, target, tuple(decisions))


def _check_model(model: object) -> None:
    """Refuse what is not a module instance before anything touches it."""
    from torch import nn

    if isinstance(model, type) and issubclass(model, nn.Module):
        raise KernelMappingError(
            f"kernelize takes a model instance, got the class {model.__module__}."
            f"{model.__qualname__}; create the model first, e.g. "
            f"kernelize({model.__name__}(...), mode=...)."
        )
    if not isinstance(model, nn.Module):
        raise KernelMappingError(
            f"kernelize takes a torch.nn.Module instance, got {type(model).__qualname__} "
            f"({_short_repr(model)})."
        )


def _short_repr(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kernelizable_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """(path, module, layer name) for every tagged module of `model`, and for every tagged
    function module attached to one of its modules with `use_kernelized_func` (path
    ``"<owner path>:<name>"``).

    Each module object comes once, at its first path: a function attached to every attention
    layer is one module, swapped once for all of them.
    """
    seen: set[int] = set()
    for path, module in model.named_modules():
        layer_name = tag_of(type(module))
        if layer_name is not None and id(module) not in seen:
            seen.add(id(module))
            yield path, module, layer_name
        for name, fn in attached_functions(module):
            layer_name = tag_of(type(fn))
            if layer_name is not None and id(fn) not in seen:
                seen.add(id(fn))
                yield f"{path or '<model>'}:{name}", fn, layer_name


def _condition_skip(module: nn.Module, layer_name: str) -> str | None:
    """Why the layer's condition skips `module`, or None when it has none or it holds."""
    condition = condition_of(type(module))
    if condition is None or condition(module):
        return None
    name = getattr(condition, "__qualname__", None) or repr(condition)
    # Hugging Face's sentence first (kernels 0.19 logs it at INFO), then which condition.
    return (
        f"Skipping kernelization for `{type(module).__name__}` using `{layer_name}` due to "
        f"kernel_condition (its condition {name} returned False for this instance)"
    )


def _tensor_parallel_forward(module: nn.Module) -> str | None:
    """Why `module` keeps the forward transformers' tensor parallelism set on it, or None.

    transformers 5.x (``from_pretrained(..., tp_plan=...)``) installs its parallel styles as an
    instance ``forward`` wrapping the class's, and marks the module ``_is_hooked``; some do more
    than convert tensors around the call: ``replicated_with_grad_allreduce`` (Qwen3's and
    Gemma3's ``q_norm`` / ``k_norm``) hooks the all-reduce of the weight's gradient in it. A
    kernel bound over it would drop that, and the gradients would be one rank's share.
    """
    from .swap import kernel_layer_of

    if not getattr(module, "_is_hooked", False) or "forward" not in module.__dict__:
        return None
    if kernel_layer_of(module) is not None:
        return None
    forward = module.__dict__["forward"]
    name = getattr(forward, "__qualname__", None) or repr(forward)
    return (
        f"transformers' tensor parallelism set its own forward on this module ({name}), which "
        "the kernel would replace, and with it what that forward does (e.g. the all-reduce of "
        "the weight's gradient of replicated_with_grad_allreduce); kernelize before "
        "parallelising to have the parallel forward wrap the kernel"
    )


def _decide(
    path: str,
    module: nn.Module,
    layer_name: str,
    resolution: Resolution,
    mode: Mode,
    use_fallback: KernelizeFallback,
    loaded: dict[int, type | KernelLoadError],
    raise_invalid: bool = True,
) -> Decision:
    def fallback(
        reason: str,
        cause: KernelizeFallback,
        headline: str,
        level=logging.INFO,
    ) -> Decision:
        if cause not in use_fallback:
            # Hugging Face's message first (code matches on it), then ours, which says why.
            raise NoKernelError(
                f"{headline}: {path or '<model>'} ({type(module).__name__}): {as_sentence(reason)}"
            )
        return Decision(path, module, layer_name, resolution, None, reason, level)

    chosen: Candidate | None = resolution.chosen
    if chosen is None:
        cause, headline = _no_kernel_cause(resolution)
        return fallback(resolution.reason, cause, headline)
    # Load each repository once per kernelize call, failures included, so a model with
    # many layers of one kind does not retry an unreachable repository for each of them.
    kernel = loaded.get(id(chosen.repository))
    if kernel is None:
        try:
            kernel = load_kernel_layer(chosen.repository)
        except KernelLoadError as exc:
            kernel = exc
        loaded[id(chosen.repository)] = kernel
    if isinstance(kernel, KernelLoadError):
        if KernelizeFallback.CANNOT_LOAD not in use_fallback and not falls_back_when_unloadable(
            chosen.repository
        ):
            # As Hugging Face's: what a third-party repository's load() raised, as it raised it.
            raise repository_error(kernel) or kernel
        reason = (
            f"Kernel for layer `{layer_name}` on {resolution.device_type} could not be loaded "
            f"(loading {chosen.repository} failed: {kernel})"
        )
        return Decision(path, module, layer_name, resolution, None, reason, logging.WARNING)
    try:
        validate_kernel_layer(
            kernel, type(module), kernel_source=str(chosen.repository), layer_name=layer_name
        )
    except KernelLayerError as exc:
        if raise_invalid:
            raise
        return Decision(path, module, layer_name, resolution, None, str(exc), logging.ERROR)
    missing = _missing_support(kernel, mode)
    if missing:
        lacks = "backward" if "backward" in missing else "torch.compile"
        return fallback(
            f"kernel layer {kernel.__name__} from {chosen.repository} {missing}",
            KernelizeFallback.NO_COMPATIBLE_MODE,
            f"Function/layer from repo {chosen.repository} does not support {lacks}, needed "
            f"for mode `{mode}`",
        )
    return Decision(path, module, layer_name, resolution, kernel)


def _no_kernel_cause(resolution: Resolution) -> tuple[KernelizeFallback, str]:
    """The fallback cause of a resolution that chose nothing, and Hugging Face's headline."""
    name, device_type = resolution.layer_name, resolution.device_type
    if resolution.cause == NO_DEVICE:
        return (
            KernelizeFallback.NO_DEVICE,
            f"No layer mapping for `{name}` with device type `{device_type}`",
        )
    if resolution.cause == NO_COMPATIBLE_PROPERTIES:
        return (
            KernelizeFallback.NO_COMPATIBLE_PROPERTIES,
            f"No layer mapping for `{name}` device `{device_type}` with the right properties",
        )
    if resolution.cause == NO_COMPATIBLE_MODE:
        return (
            KernelizeFallback.NO_COMPATIBLE_MODE,
            f"No repository for `{name}` for configuration mode={resolution.mode}",
        )
    return KernelizeFallback.NO_LAYER, f"No layer mapping for `{name}`"


def _missing_support(kernel: type, mode: Mode) -> str | None:
    lacks = []
    # Defaults as in Hugging Face's kernels: backward unless denied, compile only if declared.
    if Mode.TRAINING in mode and not getattr(kernel, "has_backward", True):
        lacks.append("has no backward (has_backward = False), which Mode.TRAINING needs")
    if Mode.TORCH_COMPILE in mode and not getattr(kernel, "can_torch_compile", False):
        lacks.append("does not declare can_torch_compile = True, which Mode.TORCH_COMPILE needs")
    return " and ".join(lacks) or None


def find_target(model: nn.Module, device: DeviceSpec | None) -> Target:
    """The device type kernels are chosen for, and its capability."""
    import torch

    model_device = _first_tensor_device(model)
    if device is None:
        if model_device is None:
            raise KernelMappingError(
                "Cannot infer the device of a model with no parameters or buffers; pass it to "
                "kernelize, e.g. kernelize(model, device='cuda', mode=...)."
            )
        if model_device.type == "meta":
            raise KernelMappingError(
                "The model is on the meta device, so it does not say where it will run; pass the "
                "device type to kernelize, e.g. kernelize(model, device='cuda', mode=...)."
            )
        torch_device = model_device
        device_type = model_device.type
    elif isinstance(device, torch.device):
        torch_device, device_type = device, device.type
    elif isinstance(device, Device):
        if device.properties is not None:
            raise KernelMappingError(
                f"kernelize(device={device!r}): pass only the device type; the capability is read "
                "from the device itself."
            )
        torch_device, device_type = None, device.type
    elif isinstance(device, str):
        if ":" in device:
            torch_device = torch.device(device)
            device_type = torch_device.type
        else:
            torch_device, device_type = None, device
    else:
        raise KernelMappingError(
            f"kernelize(device=...) takes a device type such as 'cuda', a kernels.Device or a "
            f"torch.device, got {device!r}."
        )

    if device_type == "cuda" and torch.version.hip is not None:
        device_type = "rocm"  # torch calls ROCm GPUs "cuda"; ROCm kernels are registered as rocm
    validate_device_type(device_type)

    # Read the capability of the GPU the model is on, not whichever is current.
    if torch_device is None and model_device is not None and model_device.type == "cuda":
        torch_device = model_device
    return Target(device_type, read_capability(device_type, torch_device))


def _first_tensor_device(model: nn.Module) -> torch.device | None:
    for parameter in model.parameters():
        return parameter.device
    for buffer in model.buffers():
        return buffer.device
    return None


#: How many layers a grouped fallback line names before "and N more".
_NAMED_IN_A_GROUP = 3


def _log_fallbacks(fallbacks: list[Decision]) -> None:
    """One line for each reason layers keep their forward, not one a layer: a Hub kernel
    that cannot load would otherwise repeat the same long explanation for every norm of a
    deep model. Each layer's own line goes to DEBUG."""
    groups: dict[tuple[int, str], list[Decision]] = {}
    for decision in fallbacks:
        key = (decision.fallback_level, str(decision.fallback_reason))
        groups.setdefault(key, []).append(decision)
    for (level, reason), group in groups.items():
        labels = [_label(decision) for decision in group]
        if len(group) == 1:
            logger.log(level, "%s keeps its original forward: %s", labels[0], reason)
            continue
        named = ", ".join(labels[:_NAMED_IN_A_GROUP])
        more = len(labels) - _NAMED_IN_A_GROUP
        if more > 0:
            named += f" and {more} more"
        logger.log(
            level, "%d layers keep their original forward (%s): %s", len(labels), named, reason
        )
        for label in labels:
            logger.debug("%s keeps its original forward: %s", label, reason)


def _label(decision: Decision) -> str:
    return (
        f"{decision.path or '<model>'} ({type(decision.module).__name__}, '{decision.layer_name}')"
    )
