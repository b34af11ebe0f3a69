"""Registering mappings: validation, replacement, scoping, threads and asyncio tasks."""

import asyncio
import threading

import pytest

from kernels import (
    CUDAProperties,
    Device,
    KernelMappingError,
    LocalLayerRepository,
    Mode,
    register_kernel_mapping,
    use_kernel_mapping,
)
from kernels.mapping.registry import current_mapping


def repo(name: str, layer: str = "SiluAndMul") -> LocalLayerRepository:
    return LocalLayerRepository(f"/repos/{name}", layer_name=layer)


def registered(layer="SiluAndMul", device_type="cuda"):
    """{(device, mode): repo path name} of the current mapping, for compact assertions."""
    return {
        (str(entry.device), str(mode)): r.repo_path.name
        for entry in current_mapping().entries(layer, device_type)
        for mode, r in entry.repositories.items()
    }


@pytest.fixture(autouse=True)
def empty_global_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


def test_repository_without_mode_is_registered_as_fallback():
    register_kernel_mapping({"SiluAndMul": {"cuda": repo("a")}})
    assert registered() == {("cuda", "FALLBACK"): "a"}


def test_same_device_key_replaces_all_its_modes():
    register_kernel_mapping(
        {"SiluAndMul": {"cuda": {Mode.INFERENCE: repo("a"), Mode.TRAINING: repo("b")}}}
    )
    register_kernel_mapping({"SiluAndMul": {Device("cuda"): {Mode.TRAINING: repo("c")}}})
    assert registered() == {("cuda", "TRAINING"): "c"}


def test_same_capability_range_replaces_other_ranges_stay():
    register_kernel_mapping(
        {
            "SiluAndMul": {
                Device("cuda", CUDAProperties(80, 89)): repo("a"),
                Device("cuda", CUDAProperties(90, 100)): repo("b"),
                "cuda": repo("any"),
            }
        }
    )
    register_kernel_mapping({"SiluAndMul": {Device("cuda", CUDAProperties(80, 89)): repo("c")}})
    assert registered() == {
        ("cuda (capability 80..89)", "FALLBACK"): "c",
        ("cuda (capability 90..100)", "FALLBACK"): "b",
        ("cuda", "FALLBACK"): "any",
    }


def test_other_layers_and_devices_are_kept():
    register_kernel_mapping(
        {"SiluAndMul": {"cuda": repo("a")}, "RMSNorm": {"cuda": repo("n", "RMSNorm")}}
    )
    register_kernel_mapping({"SiluAndMul": {"rocm": repo("r")}})
    assert registered() == {("cuda", "FALLBACK"): "a"}
    assert registered(device_type="rocm") == {("rocm", "FALLBACK"): "r"}
    assert registered("RMSNorm") == {("cuda", "FALLBACK"): "n"}


def test_inherit_false_clears_the_mapping():
    register_kernel_mapping({"RMSNorm": {"cuda": repo("n", "RMSNorm")}})
    register_kernel_mapping({"SiluAndMul": {"cuda": repo("a")}}, inherit_mapping=False)
    assert current_mapping().layer_names() == ("SiluAndMul",)


@pytest.mark.parametrize(
    "mapping, message",
    [
        ([], "must be a dict of layer name"),
        ({"": {"cuda": repo("a")}}, "layer names"),
        ({"SiluAndMul": repo("a")}, "must be a dict of device -> repository"),
        ({"SiluAndMul": {"metal": repo("a")}}, "Unknown device type 'metal'. Did you mean 'mps'"),
        ({"SiluAndMul": {"cuda": "kernels-community/activation"}}, "must be a repository"),
        (
            {"SiluAndMul": {"cuda": {Mode.TORCH_COMPILE: repo("a")}}},
            "cannot register a repository for mode",
        ),
        (
            {"SiluAndMul": {"cuda": {Mode.INFERENCE: object()}}},
            "mode INFERENCE, must be a repository",
        ),
        ({"SiluAndMul": {"cuda": {}}}, "registers no repository"),
    ],
)
def test_malformed_mappings_are_refused_and_change_nothing(mapping, message):
    register_kernel_mapping({"RMSNorm": {"cuda": repo("n", "RMSNorm")}})
    with pytest.raises(KernelMappingError, match=message):
        register_kernel_mapping(mapping)
    with pytest.raises(KernelMappingError, match=message):
        use_kernel_mapping(mapping)
    assert current_mapping().layer_names() == ("RMSNorm",)


def test_a_bad_entry_late_in_a_mapping_registers_nothing_of_it():
    with pytest.raises(KernelMappingError):
        register_kernel_mapping({"SiluAndMul": {"cuda": repo("a"), "rocm": "oops"}})
    assert current_mapping().layer_names() == ()


def test_scope_extends_then_restores():
    register_kernel_mapping({"SiluAndMul": {"cuda": repo("global")}})
    with use_kernel_mapping({"SiluAndMul": {"rocm": repo("scoped")}}):
        assert registered() == {("cuda", "FALLBACK"): "global"}
        assert registered(device_type="rocm") == {("rocm", "FALLBACK"): "scoped"}
    assert registered(device_type="rocm") == {}


def test_scope_without_inheritance_starts_empty():
    register_kernel_mapping({"RMSNorm": {"cuda": repo("n", "RMSNorm")}})
    with use_kernel_mapping({"SiluAndMul": {"cuda": repo("a")}}, inherit_mapping=False):
        assert current_mapping().layer_names() == ("SiluAndMul",)
    assert current_mapping().layer_names() == ("RMSNorm",)


def test_scope_is_restored_on_exceptions():
    with pytest.raises(RuntimeError), use_kernel_mapping({"SiluAndMul": {"cuda": repo("a")}}):
        raise RuntimeError("boom")
    assert current_mapping().layer_names() == ()


def test_register_inside_a_scope_changes_only_the_scope():
    with use_kernel_mapping({"SiluAndMul": {"cuda": repo("a")}}):
        register_kernel_mapping({"RMSNorm": {"cuda": repo("n", "RMSNorm")}})
        assert set(current_mapping().layer_names()) == {"SiluAndMul", "RMSNorm"}
    assert current_mapping().layer_names() == ()


def test_nested_scopes_and_reuse_of_one_scope_object():
    outer = use_kernel_mapping({"SiluAndMul": {"cuda": repo("outer")}})
    with outer:
        with use_kernel_mapping({"SiluAndMul": {"cuda": repo("inner")}}):
            assert registered() == {("cuda", "FALLBACK"): "inner"}
        assert registered() == {("cuda", "FALLBACK"): "outer"}
        with outer:  # re-entering the same object nests correctly
            assert registered() == {("cuda", "FALLBACK"): "outer"}
        assert registered() == {("cuda", "FALLBACK"): "outer"}
    assert registered() == {}


def test_global_registration_is_seen_by_other_threads_scopes_are_not():
    register_kernel_mapping({"SiluAndMul": {"cuda": repo("global")}})
    seen = {}
    entered = threading.Event()
    release = threading.Event()

    def scoped_worker():
        with use_kernel_mapping({"SiluAndMul": {"cuda": repo("worker")}}):
            seen["worker-inside"] = registered()
            entered.set()
            release.wait(5)
        seen["worker-after"] = registered()

    def observer():
        entered.wait(5)
        seen["observer"] = registered()
        release.set()

    threads = [threading.Thread(target=scoped_worker), threading.Thread(target=observer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["worker-inside"] == {("cuda", "FALLBACK"): "worker"}
    assert seen["observer"] == {("cuda", "FALLBACK"): "global"}
    assert seen["worker-after"] == {("cuda", "FALLBACK"): "global"}
    assert registered() == {("cuda", "FALLBACK"): "global"}


def test_concurrent_global_registrations_are_not_lost():
    layers = [f"Layer{i}" for i in range(32)]

    def register(name):
        register_kernel_mapping({name: {"cuda": repo(name, name)}})

    threads = [threading.Thread(target=register, args=(n,)) for n in layers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert set(current_mapping().layer_names()) == set(layers)


def test_asyncio_tasks_have_their_own_scopes():
    async def task(name, started, other_started):
        with use_kernel_mapping({"SiluAndMul": {"cuda": repo(name)}}):
            started.set()
            await other_started.wait()  # both scopes are open at once
            return registered()

    async def main():
        a_started, b_started = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(
            task("a", a_started, b_started), task("b", b_started, a_started)
        )

    a, b = asyncio.run(main())
    assert a == {("cuda", "FALLBACK"): "a"}
    assert b == {("cuda", "FALLBACK"): "b"}
    assert registered() == {}
