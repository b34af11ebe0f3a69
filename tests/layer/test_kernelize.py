"""kernelize against real kernel repositories written to temporary folders."""

import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    CUDAProperties,
    Device,
    KernelizeFallback,
    KernelLayerError,
    KernelLoadError,
    KernelMappingError,
    LocalLayerRepository,
    Mode,
    NoKernelError,
    kernelize,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.mapping.capability import use_capability_reader


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


RMSNORM_LAYER = """
import torch


class RMSNorm(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states):
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        normed = hidden_states.float() * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * normed.to(hidden_states.dtype) + 500
"""


@use_kernel_forward_from_hub("RMSNorm")
class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        normed = hidden_states.float() * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * normed.to(hidden_states.dtype)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(6, 8)
        self.act = SiluAndMul()
        self.norm = RMSNorm(4)

    def forward(self, x):
        return self.norm(self.act(self.up(x)))


@pytest.fixture(autouse=True)
def empty_global_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


@pytest.fixture
def silu_repo(kernel_repo):
    return LocalLayerRepository(
        kernel_repo("activation"), package_name="activation", layer_name="SiluAndMul"
    )


def reference(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def test_decorator_changes_nothing_until_kernelize(silu_repo):
    layer = SiluAndMul()
    x = torch.randn(3, 8)
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}):
        torch.testing.assert_close(layer(x), reference(x))
    assert "forward" not in layer.__dict__


def test_seed_local_repository_example(silu_repo):
    # Seed 002's LocalLayerRepository example, on the CPU.
    linear = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    x = torch.randn(2, 4)
    before = linear(x)
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}, inherit_mapping=False):
        assert kernelize(linear, mode=Mode.INFERENCE) is linear
    torch.testing.assert_close(linear(x), before + 1000)


def test_only_this_instance_is_swapped(silu_repo):
    kernelized, untouched = SiluAndMul(), SiluAndMul()
    x = torch.randn(2, 8)
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}):
        kernelize(kernelized, mode=Mode.INFERENCE, device="cpu")
    torch.testing.assert_close(kernelized(x), reference(x) + 1000)
    torch.testing.assert_close(untouched(x), reference(x))
    assert kernel_layer_of(kernelized).__name__ == "SiluAndMul"
    assert kernel_layer_of(untouched) is None


def test_several_tagged_layers_with_different_names(kernel_repo):
    norm_repo = kernel_repo("norm", package="norm", layers_source=RMSNORM_LAYER)
    silu_repo = kernel_repo("activation", offset=1000)
    model = Block()
    x = torch.randn(5, 6)
    with torch.no_grad():
        hidden = reference(model.up(x))
        expected_norm = model.norm(hidden)
    with use_kernel_mapping(
        {
            "SiluAndMul": {"cpu": LocalLayerRepository(silu_repo, layer_name="SiluAndMul")},
            "RMSNorm": {
                "cpu": LocalLayerRepository(norm_repo, package_name="norm", layer_name="RMSNorm")
            },
        }
    ):
        kernelize(model, mode=Mode.TRAINING)
    out = model(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model.norm.weight * 0 + RMSNorm(4)(hidden + 1000) + 500)
    assert not torch.allclose(out, expected_norm)
    out.sum().backward()
    assert model.up.weight.grad is not None


def test_kernel_sees_the_module_state_through_self(kernel_repo):
    norm_repo = kernel_repo("norm", package="norm", layers_source=RMSNORM_LAYER)
    norm = RMSNorm(4, eps=0.5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    x = torch.randn(3, 4)
    expected = norm(x) + 500
    with use_kernel_mapping(
        {"RMSNorm": {"cpu": LocalLayerRepository(norm_repo, layer_name="RMSNorm")}}
    ):
        kernelize(norm, mode=Mode.INFERENCE)
    torch.testing.assert_close(norm(x), expected)


def test_unmapped_layer_keeps_forward_and_logs_why(caplog, silu_repo):
    model = Block()
    with (
        use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}),
        caplog.at_level(logging.INFO, logger="kernels"),
    ):
        kernelize(model, mode=Mode.INFERENCE)
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith(
            "act (SiluAndMul, 'SiluAndMul') uses kernel layer SiluAndMul from local repository"
        )
        for m in messages
    )
    assert (
        "norm (RMSNorm, 'RMSNorm') keeps its original forward: no kernel is registered for layer name 'RMSNorm'"
        in messages
    )
    assert all(r.name.startswith("kernels.") for r in caplog.records)


def test_nothing_is_logged_on_the_root_logger(caplog, silu_repo):
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}), caplog.at_level(logging.DEBUG):
        kernelize(Block(), mode=Mode.INFERENCE)
    assert caplog.records and not [r for r in caplog.records if r.name == "root"]


def test_use_fallback_false_raises_for_unmapped_layer(silu_repo):
    model = Block()
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}):
        with pytest.raises(
            NoKernelError,
            match=r"norm \(RMSNorm\): no kernel is registered for layer name 'RMSNorm'",
        ):
            kernelize(model, mode=Mode.INFERENCE, use_fallback=False)
    # All or nothing: the SiluAndMul that could be kernelized was not.
    assert kernel_layer_of(model.act) is None


@pytest.mark.parametrize(
    "mode, has_backward, can_torch_compile, lacking",
    [
        (Mode.TRAINING, False, True, "has no backward"),
        (Mode.INFERENCE | Mode.TORCH_COMPILE, True, False, "does not declare can_torch_compile"),
        (Mode.TRAINING | Mode.TORCH_COMPILE, False, False, "has no backward.*and does not declare"),
    ],
)
def test_kernel_lacking_what_the_mode_needs(
    kernel_repo, caplog, mode, has_backward, can_torch_compile, lacking
):
    path = kernel_repo("limited", has_backward=has_backward, can_torch_compile=can_torch_compile)
    layer = SiluAndMul()
    mapping = {"SiluAndMul": {"cpu": LocalLayerRepository(path, layer_name="SiluAndMul")}}
    with use_kernel_mapping(mapping), caplog.at_level(logging.INFO, logger="kernels"):
        kernelize(layer, mode=mode, device="cpu")
        assert kernel_layer_of(layer) is None
        assert any("keeps its original forward" in r.getMessage() for r in caplog.records)
        with pytest.raises(NoKernelError, match=lacking):
            kernelize(layer, mode=mode, device="cpu", use_fallback=False)
        # The same kernel serves a mode that does not need what it lacks.
        kernelize(layer, mode=Mode.INFERENCE, device="cpu")
        assert kernel_layer_of(layer) is not None


def test_rekernelize_switches_kernels_by_mode(kernel_repo):
    inference = LocalLayerRepository(kernel_repo("inf", offset=1), layer_name="SiluAndMul")
    training = LocalLayerRepository(kernel_repo("train", offset=2), layer_name="SiluAndMul")
    layer = SiluAndMul()
    x = torch.randn(2, 8)
    with use_kernel_mapping(
        {"SiluAndMul": {"cpu": {Mode.INFERENCE: inference, Mode.TRAINING: training}}}
    ):
        kernelize(layer, mode=Mode.INFERENCE, device="cpu")
        torch.testing.assert_close(layer(x), reference(x) + 1)
        kernelize(layer, mode=Mode.TRAINING, device="cpu")
        torch.testing.assert_close(layer(x), reference(x) + 2)
        # Compile mode: neither is registered for it, so the layer goes back to its own forward.
        kernelize(layer, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
        torch.testing.assert_close(layer(x), reference(x))
        assert "forward" not in layer.__dict__


def test_training_kernel_also_serves_inference(kernel_repo):
    training = LocalLayerRepository(kernel_repo("train", offset=2), layer_name="SiluAndMul")
    model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping({"SiluAndMul": {"cpu": {Mode.TRAINING: training}}}):
        kernelize(model, mode=Mode.TRAINING)
    model.eval()
    with torch.no_grad():
        x = torch.randn(3, 4)
        torch.testing.assert_close(model(x), reference(model[0](x)) + 2)


def test_all_or_nothing_when_a_kernel_breaks_the_rules(kernel_repo, silu_repo):
    bad = kernel_repo(
        "bad",
        package="norm",
        layers_source="import torch\nclass RMSNorm(torch.nn.Module):\n    def forward(self, x):\n        return x\n",
    )
    model = Block()
    with use_kernel_mapping(
        {
            "SiluAndMul": {"cpu": silu_repo},
            "RMSNorm": {"cpu": LocalLayerRepository(bad, layer_name="RMSNorm")},
        }
    ):
        with pytest.raises(
            KernelLayerError,
            match="parameter 2 is 'x' in the kernel but 'hidden_states' in the layer",
        ):
            kernelize(model, mode=Mode.INFERENCE)
    assert "forward" not in model.act.__dict__ and "forward" not in model.norm.__dict__


def test_load_failure_raises_by_default_and_falls_back_with_all(tmp_path, caplog):
    """kernels 0.19: use_fallback=True (DEFAULT) no longer covers a kernel that cannot be
    loaded; KernelizeFallback.ALL (what transformers 5.x passes) or CANNOT_LOAD does."""
    missing = LocalLayerRepository(tmp_path / "nowhere", layer_name="SiluAndMul")
    model = Block()
    with use_kernel_mapping({"SiluAndMul": {"cpu": missing}}):
        for use_fallback in (
            KernelizeFallback.ALL,
            KernelizeFallback.DEFAULT | KernelizeFallback.CANNOT_LOAD,
        ):
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="kernels"):
                kernelize(model, mode=Mode.INFERENCE, use_fallback=use_fallback)
            (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert (
                "act (SiluAndMul, 'SiluAndMul') keeps its original forward: Kernel for layer "
                "`SiluAndMul` on cpu could not be loaded (loading local repository"
                in warning.getMessage()
            )
            assert "does not exist" in warning.getMessage()
        for use_fallback in (True, False, KernelizeFallback.DEFAULT):
            with pytest.raises(KernelLoadError, match="does not exist"):
                kernelize(model, mode=Mode.INFERENCE, use_fallback=use_fallback)


def test_a_third_party_load_error_is_raised_as_it_was_raised():
    class MissingBuild:
        layer_name = "SiluAndMul"

        def load(self):
            raise FileNotFoundError("Cannot find a build variant for this system")

    with use_kernel_mapping({"SiluAndMul": {"cpu": MissingBuild()}}):
        with pytest.raises(FileNotFoundError, match="Cannot find a build variant"):
            kernelize(SiluAndMul(), mode=Mode.INFERENCE, device="cpu")
        layer = SiluAndMul()
        kernelize(layer, mode=Mode.INFERENCE, device="cpu", use_fallback=KernelizeFallback.ALL)
        assert kernel_layer_of(layer) is None


def test_a_failing_repository_is_loaded_once_per_call(tmp_path, caplog):
    calls = []

    class CountingRepository:
        layer_name = "SiluAndMul"

        def load(self):
            calls.append(1)
            raise OSError("Hub unreachable")

    model = nn.Sequential(*[SiluAndMul() for _ in range(5)])
    with use_kernel_mapping({"SiluAndMul": {"cpu": CountingRepository()}}):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=KernelizeFallback.ALL)
    assert len(calls) == 1


def test_missing_layer_in_repository_lists_available(kernel_repo):
    repo = LocalLayerRepository(kernel_repo("activation"), layer_name="GeluAndMul")
    with use_kernel_mapping({"SiluAndMul": {"cpu": repo}}):
        with pytest.raises(
            KernelLoadError,
            match="has no layer or function 'GeluAndMul'. Layers it provides: SiluAndMul",
        ):
            kernelize(SiluAndMul(), mode=Mode.INFERENCE, device="cpu", use_fallback=False)


def test_refused_modes():
    with pytest.raises(KernelMappingError, match="can only be used to register"):
        kernelize(Block(), mode=Mode.FALLBACK)
    with pytest.raises(KernelMappingError, match="must contain Mode.INFERENCE or Mode.TRAINING"):
        kernelize(Block(), mode=Mode.TORCH_COMPILE)


def test_device_inference_errors():
    with pytest.raises(KernelMappingError, match="no parameters or buffers; pass it"):
        kernelize(SiluAndMul(), mode=Mode.INFERENCE)
    with pytest.raises(KernelMappingError, match="Unknown device type 'metal'"):
        kernelize(SiluAndMul(), mode=Mode.INFERENCE, device="metal")
    with pytest.raises(KernelMappingError, match="pass only the device type"):
        kernelize(SiluAndMul(), mode=Mode.INFERENCE, device=Device("cuda", CUDAProperties(80, 90)))
    with pytest.raises(KernelMappingError, match="device type such as 'cuda'"):
        kernelize(SiluAndMul(), mode=Mode.INFERENCE, device=0)


def test_device_from_first_buffer(silu_repo):
    model = nn.Module()
    model.register_buffer("scale", torch.ones(1))
    model.act = SiluAndMul()
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}):
        kernelize(model, mode=Mode.INFERENCE)
    assert kernel_layer_of(model.act) is not None


def test_meta_model_needs_a_device_and_then_kernelizes(silu_repo):
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping({"SiluAndMul": {"cuda": silu_repo}}):
        with pytest.raises(KernelMappingError, match="meta device"):
            kernelize(model, mode=Mode.INFERENCE)
        kernelize(model, mode=Mode.INFERENCE, device="cuda")
    assert kernel_layer_of(model[1]) is not None


def test_explicit_device_types(silu_repo):
    layer = SiluAndMul()
    for device in ("cuda", Device("cuda"), torch.device("cuda:1")):
        with use_kernel_mapping({"SiluAndMul": {"cuda": silu_repo}}):
            kernelize(layer, mode=Mode.INFERENCE, device=device)
        assert kernel_layer_of(layer) is not None
        kernelize(layer, mode=Mode.INFERENCE, device="cpu")
        assert kernel_layer_of(layer) is None


def test_capability_ranges_choose_the_kernel(kernel_repo):
    ampere = LocalLayerRepository(kernel_repo("ampere", offset=80), layer_name="SiluAndMul")
    wide = LocalLayerRepository(kernel_repo("wide", offset=75), layer_name="SiluAndMul")
    hopper = LocalLayerRepository(kernel_repo("hopper", offset=90), layer_name="SiluAndMul")
    mapping = {
        "SiluAndMul": {
            Device("cuda", CUDAProperties(80, 89)): ampere,
            Device("cuda", CUDAProperties(75, 89)): wide,
            Device("cuda", CUDAProperties(90, 2**31)): hopper,
        }
    }
    layer = SiluAndMul()
    x = torch.randn(2, 8)
    with use_kernel_mapping(mapping):
        for capability, offset in [(86, 80), (75, 75), (90, 90), (120, 90)]:
            with use_capability_reader(lambda device_type, index, c=capability: c):
                kernelize(layer, mode=Mode.INFERENCE, device="cuda")
            torch.testing.assert_close(layer(x), reference(x) + offset)
        with use_capability_reader(lambda device_type, index: 70):
            kernelize(layer, mode=Mode.INFERENCE, device="cuda")
            assert kernel_layer_of(layer) is None
            with pytest.raises(NoKernelError, match="covers capability 70"):
                kernelize(layer, mode=Mode.INFERENCE, device="cuda", use_fallback=False)


def test_capability_is_read_from_the_device_the_model_is_on(silu_repo):
    asked = []

    def reader(device_type, index):
        asked.append((device_type, index))
        return 90

    with use_kernel_mapping({"SiluAndMul": {Device("cuda", CUDAProperties(90, 90)): silu_repo}}):
        with use_capability_reader(reader):
            kernelize(SiluAndMul(), mode=Mode.INFERENCE, device=torch.device("cuda:3"))
            kernelize(SiluAndMul(), mode=Mode.INFERENCE, device="cuda")
    assert asked == [("cuda", 3), ("cuda", None)]


def test_deepcopy_of_a_kernelized_model_keeps_its_kernel(silu_repo):
    model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}):
        kernelize(model, mode=Mode.INFERENCE)
    clone = copy.deepcopy(model)
    assert kernel_layer_of(clone[1]) is kernel_layer_of(model[1])
    x = torch.randn(2, 4)
    torch.testing.assert_close(clone(x), model(x))
    kernelize(clone, mode=Mode.INFERENCE)  # no mapping here: back to the original
    assert kernel_layer_of(clone[1]) is None and kernel_layer_of(model[1]) is not None


def test_a_foreign_instance_forward_is_replaced_with_a_warning(silu_repo, caplog):
    layer = SiluAndMul()
    layer.forward = lambda input: input
    with (
        use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}),
        caplog.at_level(logging.WARNING, logger="kernels"),
    ):
        kernelize(layer, mode=Mode.INFERENCE, device="cpu")
    assert "had a forward set on the instance" in caplog.text
    x = torch.randn(2, 8)
    torch.testing.assert_close(layer(x), reference(x) + 1000)


def test_kernelized_model_compiles(silu_repo):
    model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping({"SiluAndMul": {"cpu": silu_repo}}):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    x = torch.randn(3, 4)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), reference(model[0](x)) + 1000)


def test_layers_that_fall_back_for_one_reason_share_one_warning(tmp_path, caplog):
    """A 16-layer model whose kernel cannot load: one WARNING naming the count, three layers
    and the reason once (it was a ~700-character copy a layer), each layer's line at DEBUG."""
    missing = LocalLayerRepository(tmp_path / "nowhere", layer_name="SiluAndMul")
    model = nn.Sequential(*(SiluAndMul() for _ in range(16)))
    with (
        use_kernel_mapping({"SiluAndMul": {"cpu": missing}}),
        caplog.at_level(logging.DEBUG, logger="kernels"),
    ):
        kernelize(model, device="cpu", mode=Mode.INFERENCE, use_fallback=KernelizeFallback.ALL)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert message.startswith(
        "16 layers keep their original forward (0 (SiluAndMul, 'SiluAndMul'), "
        "1 (SiluAndMul, 'SiluAndMul'), 2 (SiluAndMul, 'SiluAndMul') and 13 more): Kernel for "
        "layer `SiluAndMul` on cpu could not be loaded"
    )
    assert message.count("does not exist") == 1
    per_layer = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.DEBUG and "keeps its original forward" in r.getMessage()
    ]
    assert [m.split(" ", 1)[0] for m in per_layer] == [str(i) for i in range(16)]
    assert all(kernel_layer_of(layer) is None for layer in model)
