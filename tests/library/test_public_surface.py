"""What each repository offers by public name: what the ``kernels`` package and the benchmarks
call (no private name of a repository is reached from outside it), and a ``layers`` module whose
``dir()`` lists only layers that ``getattr`` gives."""

import inspect

import pytest

# What callers outside the repositories use: kernels/overrides/loading.py and
# benchmarks/decode_mlp.py (``kernels.generation`` and ``kernels.compile`` load them too).
CALLED = {
    "norm": [
        "layer_norm_forward",
        "layer_norm_backward",
        "rms_norm_forward",
        "rms_norm_backward",
        "LLAMA",
        "GEMMA",
    ],
    "activation": [
        "activation_forward",
        "activation_backward",
        "SILU",
        "GELU",
        "GELU_TANH",
        "candidate_configs",
        "gemv_config",
        "gemv",
        "gated_gemv",
        "GemvConfig",
        "gated_mlp_decode",
    ],
}


@pytest.mark.parametrize("repo", ["activation", "loss", "norm", "rotary"])
def test_every_exported_name_resolves(request, repo):
    package = request.getfixturevalue(repo)
    for name in package.__all__:
        assert hasattr(package, name), f"{repo}.{name}"


@pytest.mark.parametrize("repo", sorted(CALLED))
def test_what_the_package_calls_is_exported(request, repo):
    package = request.getfixturevalue(repo)
    for name in CALLED[repo]:
        assert name in package.__all__, f"{repo} does not export {name}"
        value = getattr(package, name)
        if callable(value) and not isinstance(value, type):
            assert inspect.getdoc(value), f"{repo}.{name} has no docstring"


def test_the_overrides_bind_the_exported_launchers(norm, activation):
    from kernels.overrides.loading import activation_kernels, norm_kernels

    kernels = norm_kernels()
    assert kernels.layer_norm_forward.__name__ == "layer_norm_forward"
    assert kernels.rms_norm_backward.__name__ == "rms_norm_backward"
    assert kernels.llama == norm.LLAMA
    assert activation_kernels().forward.__name__ == "activation_forward"


def test_the_loss_layers_list_only_what_they_give(loss):
    """``dir(layers)`` names only layers that ``getattr`` returns for the transformers in this
    process (under 4.57 there is no MoeRouterCausalLMFusedLoss), so code that walks ``dir()``
    and gets each name (kernel checks, mapping builders) does not fail; the other line's
    layers stay refused with a message that names the line."""
    layers = loss.layers
    names = dir(layers)
    for name in names:
        getattr(layers, name)
    line = set(layers._causal_lm_layers())  # the layers of this transformers line
    assert {"CausalLMFusedLoss", "GemmaCausalLMFusedLoss", "MoeCausalLMFusedLoss"} <= line
    assert set(names) & layers._LAYER_NAMES == line and "ForCausalLMLoss" in names
    # The other line's (under 4.57: MoeRouterCausalLMFusedLoss) are refused, naming the line.
    for name in layers._LAYER_NAMES - line:
        with pytest.raises(AttributeError, match="transformers in this process"):
            getattr(layers, name)
