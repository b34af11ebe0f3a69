"""The benchmarks' 1.1B Llama-style model and its contenders: what `benchmarks.e2e`,
`benchmarks.decode`, `benchmarks.distributed` and `benchmarks.cold_start` build and run.

The model (``CONFIG``, `build`): transformers' ``LlamaForCausalLM`` at hidden 2048, intermediate
8192, 16 layers, 32 heads, 8 KV heads, vocabulary 32000, SDPA attention, bf16, random weights
from seed 0, on ``DEVICE``. Its steps: `training_step` (forward and backward of the causal-LM
loss, no optimizer) and `prefill_step` (forward without grad, the last position's logits), on
`tokens_for` a shape.

The contenders (``CONTENDERS``, by key ``BY_KEY`` and by name ``BY_NAME``): eager transformers,
``torch.compile``, ours (`build_ours`: our kernels through ``kernelize``, with or without our
fused loss, our attention, ``torch.compile``) and Liger-Kernel's own patching (`build_liger`),
each built by `contender_makers` on the same weights. Ours and Liger patch transformers'
modelling module for the whole process, so each contender is built from a clean module and
runs with the state its set-up left (`ModuleState`, `build_contenders`). `free` drops a group
of them; `no_silent_fallback` keeps a compiled one from running eagerly under its name;
`package_version` is what the results record of each package.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

CONFIG = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=4096,
)

#: Where the models are built: a CUDA GPU when timing (the tests build on the CPU).
DEVICE = "cuda"

#: The shapes (batch x sequence) `benchmarks.e2e` times by default: many short sequences, a few
#: long ones, one sequence of the model's whole context.
SHAPES = ("8x512", "4x2048", "1x4096")


@dataclass(frozen=True)
class Contender:
    """One configuration the benchmark times."""

    key: str  # its name on the command line (--contenders)
    name: str  # its name in results.json and the tables
    ours: bool  # one of our configurations (else a peer: what a user has without us)
    compiled: bool  # torch.compile'd: built and timed after every eager-mode contender
    liger: bool  # needs Liger-Kernel


CONTENDERS = (
    Contender("eager", "eager", ours=False, compiled=False, liger=False),
    Contender("compile", "torch.compile", ours=False, compiled=True, liger=False),
    Contender("ours", "ours (kernelized)", ours=True, compiled=False, liger=False),
    Contender("ours-fce", "ours (kernelized, fused CE)", ours=True, compiled=False, liger=False),
    Contender(
        "ours-compile",
        "ours (kernelized + compile, fused CE)",
        ours=True,
        compiled=True,
        liger=False,
    ),
    Contender(
        "ours-attn",
        "ours (kernelized, fused CE, our attention)",
        ours=True,
        compiled=False,
        liger=False,
    ),
    Contender(
        "ours-attn-compile",
        "ours (kernelized + compile, fused CE, our attention)",
        ours=True,
        compiled=True,
        liger=False,
    ),
    Contender("liger", "liger (no fused CE)", ours=False, compiled=False, liger=True),
    Contender(
        "liger-compile",
        "liger (no fused CE) + compile",
        ours=False,
        compiled=True,
        liger=True,
    ),
    Contender("liger-flce", "liger (fused linear CE)", ours=False, compiled=False, liger=True),
    Contender(
        "liger-flce-compile",
        "liger (fused linear CE) + compile",
        ours=False,
        compiled=True,
        liger=True,
    ),
)
BY_KEY = {c.key: c for c in CONTENDERS}
BY_NAME = {c.name: c for c in CONTENDERS}

#: Ours + compile (with the fused loss) and compile alone: what issue 38's first target compares.
OURS_COMPILED, COMPILE_ALONE = BY_KEY["ours-compile"].name, BY_KEY["compile"].name


def select_contenders(keys: str | None = None, skip=()) -> list[Contender]:
    """The contenders ``keys`` names (comma-separated keys; all of them when None) but those in
    ``skip`` (keys or names), in ``CONTENDERS``'s order. Raises ValueError naming the valid
    keys when one is not."""
    chosen = list(CONTENDERS) if keys is None else []
    for key in [] if keys is None else [k.strip() for k in keys.split(",") if k.strip()]:
        if key not in BY_KEY:
            raise ValueError(f"unknown contender {key!r}: choose from {', '.join(BY_KEY)}")
        chosen.append(BY_KEY[key])
    for item in skip:
        if item not in BY_KEY and item not in BY_NAME:
            raise ValueError(
                f"cannot skip {item!r}: not a contender; its keys are {', '.join(BY_KEY)}"
            )
    skipped = {BY_KEY[s].name if s in BY_KEY else s for s in skip}
    return [c for c in CONTENDERS if c in chosen and c.name not in skipped]


def runnable(
    contenders: list[Contender], liger_installed: bool
) -> tuple[list[Contender], list[str]]:
    """(the contenders this process can run, a note for each one it cannot)."""
    if liger_installed:
        return list(contenders), []
    notes = [
        f"{c.name}: skipped, Liger-Kernel is not installed (pip install liger-kernel: 0.8.5 on "
        "transformers 5, 0.7.0 on 4.57; benchmarks/README.md)"
        for c in contenders
        if c.liger
    ]
    return [c for c in contenders if not c.liger], notes


def build(state_dict=None):
    """The model (``CONFIG``, bf16, SDPA) on ``DEVICE``: random weights from seed 0, or
    ``state_dict``'s."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


_MISSING = object()


def build_ours(
    state_dict,
    compile_mode: bool,
    fused_ce: bool = False,
    attention: bool = False,
    compile_model: bool = True,
):
    """Our kernels through ``kernelize`` (TRAINING mode, or TRAINING | TORCH_COMPILE and then
    ``torch.compile``, unless not `compile_model`: the caller compiles it, e.g. after
    sharding it); with ``fused_ce`` also our fused linear cross-entropy (library/loss); with
    ``attention`` our flash attention (library/attention) in place of SDPA, through
    transformers' attention registry as a user would set it."""
    import torch

    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
    from kernels.library import tag_causal_lm_losses, tag_gated_mlps, tag_rotary_embeddings

    model = build(state_dict)
    # transformers 4.57 leaves LlamaMLP and apply_rotary_pos_emb untagged, 5.x LlamaMLP: tag
    # them, so that kernelize reaches them (SwiGLUMLP fuses SiLU and the multiply;
    # rotary_pos_emb rotates q and k in one kernel). On 5.x the rotary tag is a no-op.
    tag_gated_mlps(model)
    tag_rotary_embeddings(model)
    if fused_ce:  # LlamaForCausalLM's loss without logits in training (CausalLMFusedLoss)
        tag_causal_lm_losses(model)
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compile_mode else Mode.TRAINING
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(model, mode=mode)
    check_kernelized(model, fused_ce)
    if attention:
        from kernels.library.attention import ATTENTION_IMPLEMENTATION, register_attention

        register_attention()
        model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    return torch.compile(model) if compile_mode and compile_model else model


def check_kernelized(model, fused_ce: bool) -> None:
    """Raise unless ``kernelize`` gave ``model`` our layers (and with ``fused_ce`` our loss):
    otherwise ours would be timed as eager transformers under ours' name. transformers 5.x
    tags its layers for ``kernelize`` only when it sees this package installed (its
    ``is_kernels_available`` reads the installed metadata, not ``sys.path``)."""
    from kernels.layer.swap import kernel_layer_of

    layers = {"model.norm": model.model.norm, "model.layers.0.mlp": model.model.layers[0].mlp}
    if fused_ce:
        layers["the causal-LM loss (LlamaForCausalLM.forward)"] = model
    missing = [path for path, module in layers.items() if kernel_layer_of(module) is None]
    if missing:
        raise RuntimeError(
            f"kernelize left {', '.join(missing)} running transformers' own forward, so "
            "'ours' would be timed as eager: install this package where transformers finds it "
            "(pip install -e . here; on the GPU machine its wheel beside the others, "
            "benchmarks/README.md)"
        )


def build_liger(state_dict, flce: bool):
    """Liger-Kernel's own transformers patching: rope, rms_norm, swiglu, and with ``flce`` its
    fused linear cross-entropy."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    model = build(state_dict)
    apply_liger_kernel_to_llama(
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=flce,
        model=model,
    )
    return model


def contender_makers(state_dict) -> dict:
    """{contender name: function building it on ``state_dict``'s weights}, for every contender of
    ``CONTENDERS``."""
    import torch

    # The compiled contender of ours keeps the fused loss: without it, compile's graph holds the
    # logits (tokens x vocabulary), which issue 38 saw as ours + compile's extra memory.
    return {
        "eager": lambda: build(state_dict),
        "torch.compile": lambda: torch.compile(build(state_dict)),
        "ours (kernelized)": lambda: build_ours(state_dict, False),
        "ours (kernelized, fused CE)": lambda: build_ours(state_dict, False, fused_ce=True),
        OURS_COMPILED: lambda: build_ours(state_dict, True, fused_ce=True),
        "ours (kernelized, fused CE, our attention)": lambda: build_ours(
            state_dict, False, fused_ce=True, attention=True
        ),
        "ours (kernelized + compile, fused CE, our attention)": lambda: build_ours(
            state_dict, True, fused_ce=True, attention=True
        ),
        "liger (no fused CE)": lambda: build_liger(state_dict, False),
        "liger (no fused CE) + compile": lambda: torch.compile(build_liger(state_dict, False)),
        "liger (fused linear CE)": lambda: build_liger(state_dict, True),
        "liger (fused linear CE) + compile": lambda: torch.compile(build_liger(state_dict, True)),
    }


class ModuleState:
    """The attributes of transformers' Llama modelling module and of its classes, so that each
    contender runs with the module state its set-up left.

    Both ours (``tag_rotary_embeddings``) and Liger (``apply_liger_kernel_to_llama``) patch
    that module for the whole process: its ``apply_rotary_pos_emb`` global, and for Liger's
    fused cross-entropy ``LlamaForCausalLM.forward``. On transformers 5.x that global is a
    function module; since kernels 0.19 ``kernelize`` gives each attention layer a copy of its
    own and leaves the global be, but a forward set on the global by hand would still be shared
    by every model of the process, so such module instances stay owners. Contenders run in
    interleaved rounds, so each one's state is captured after its set-up and put back before
    each of its steps.
    """

    def __init__(self):
        import torch
        import transformers.models.llama.modeling_llama as modeling

        self.owners = [modeling] + [
            v
            for v in vars(modeling).values()
            if (isinstance(v, type) and v.__module__ == modeling.__name__)
            or isinstance(v, torch.nn.Module)
        ]
        self._module = torch.nn.Module
        self.baseline = self._attributes()
        # (owner index, name) of every attribute some set-up changed: only these are put back,
        # so that what transformers or dynamo set at run time is left alone.
        self.patched: set[tuple[int, str]] = set()

    def _attributes(self) -> list[dict]:
        # A module instance's class too: kernelize binds most kernels by giving the instance a
        # class of its own (kernels.layer.swap).
        return [
            {**vars(owner), "__class__": type(owner)}
            if isinstance(owner, self._module)
            else dict(vars(owner))
            for owner in self.owners
        ]

    def capture(self) -> list[dict]:
        """The state now; remembers which attributes differ from the state at construction."""
        state = self._attributes()
        for i, (before, after) in enumerate(zip(self.baseline, state, strict=True)):
            for name in set(before) | set(after):
                if before.get(name, _MISSING) is not after.get(name, _MISSING):
                    self.patched.add((i, name))
        return state

    def restore(self, state: list[dict] | None = None) -> None:
        """Put back ``state`` (by default the state at construction) for the patched attributes."""
        state = self.baseline if state is None else state
        for i, name in self.patched:
            owner, value = self.owners[i], state[i].get(name, _MISSING)
            current = type(owner) if name == "__class__" else vars(owner).get(name, _MISSING)
            if current is value:
                continue
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def build_contenders(makers: dict, names, module_state: ModuleState) -> dict:
    """{name: (model, the modelling-module state its set-up left)}, each built from a clean
    module state (nothing tagged or patched), which is put back at the end."""
    from kernels.library import untag

    contenders = {}
    for name in names:
        module_state.restore()
        untag()
        contenders[name] = (makers[name](), module_state.capture())
    module_state.restore()
    return contenders


def free(contenders: dict) -> None:
    """Drop the models of ``contenders`` (the dict is emptied) and what else holds their memory:
    reference cycles, dynamo's compiled code and guards, the allocator's cached blocks; prints
    what stays resident (the benchmark's own copy of the weights, 2.2 GB)."""
    import torch

    contenders.clear()
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    print(f"  freed; resident now {torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)


def no_silent_fallback() -> None:
    """Make dynamo raise instead of running a frame eagerly when it hits its recompile limit: a
    compiled contender that fell back would be timed as an eager one under its compiled name.
    The limit is raised for the contenders sharing a frame (``nn.Module.__call__``), each with
    a training and an inference graph per shape, and for Liger's graph breaks (its SwiGLU calls
    an ``lru_cache``'d helper, which splits every decoder layer's frame): at 16, Liger + compile
    hit the limit at its first shape (H100, transformers 5.24, Liger-Kernel 0.8.5)."""
    import torch._dynamo.config as config

    if hasattr(config, "recompile_limit"):  # cache_size_limit before torch 2.6
        config.recompile_limit = max(config.recompile_limit, 64)
    if hasattr(config, "fail_on_recompile_limit_hit"):  # torch >= 2.6
        config.fail_on_recompile_limit_hit = True


def tokens_for(shape: str):
    """The input ids of ``shape`` (batch x sequence), the same in every run."""
    import torch

    batch, seq = (int(v) for v in shape.split("x"))
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    return torch.randint(0, CONFIG["vocab_size"], (batch, seq), device=DEVICE, generator=generator)


def training_step(model, tokens) -> None:
    """Forward and backward of the causal-LM loss (no optimizer): what the benchmark trains."""
    model(input_ids=tokens, labels=tokens).loss.backward()


def prefill_step(model, tokens) -> None:
    """Forward without grad, logits of the last position only."""
    import torch

    with torch.no_grad():
        model(input_ids=tokens, logits_to_keep=1)


def package_version(package: str) -> str | None:
    """The installed version of distribution ``package``, None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
