"""benchmarks.cold_start's runs (the GPU measures them): which caches each case gets."""

import sys
import types

import pytest

from benchmarks import cold_start


def test_binaries_runs_get_an_empty_cache_of_their_own_and_kept_caches_one_per_case(
    tmp_path, monkeypatch
):
    runs = []

    def run_case(case, cache_dir, temperature, record=False):
        runs.append((case, temperature, cache_dir))
        assert record == (temperature == "cold")  # a kept cold cache records its compiles
        return {"case": case, "cache": temperature}

    monkeypatch.setattr(cold_start, "run_case", run_case)
    cold_start.measure(["train", "eager-train"], binaries=True, keep_cache=tmp_path / "keep")
    assert [(case, temperature) for case, temperature, _ in runs] == [
        ("train", "binaries"),
        ("train", "cold"),
        ("train", "warm"),
        ("eager-train", "cold"),
    ]
    binaries_cache, cold_cache, warm_cache = (cache for _, _, cache in runs[:3])
    assert binaries_cache != cold_cache == warm_cache == str(tmp_path / "keep" / "train")
    assert runs[3][2] == str(tmp_path / "keep" / "eager-train")


def test_a_capture_for_another_gpu_compiles_our_cases_once_and_launches_nothing(
    tmp_path, monkeypatch
):
    """``--compile-for``: one cold run per case of ours (none of the eager cases, no warm run),
    each child told the GPU to compile for and to launch nothing, each into its kept cache."""
    calls = []

    def run(command, env, **kwargs):
        calls.append((command[command.index("--child") + 1], env))
        result = '{"case": "x", "phases": {}, "triton_compile_s": 0, "kernels_compiled": 0, '
        result += '"c_build_s": 0, "c_builds": 0}'
        return types.SimpleNamespace(returncode=0, stdout=cold_start.MARKER + result, stderr="")

    monkeypatch.setattr(cold_start.subprocess, "run", run)
    keep = tmp_path / "keep"
    cold_start.measure(["train", "eager-train", "generate"], keep_cache=keep, compile_for="a100")
    assert [case for case, _ in calls] == ["train", "generate"]
    for case, env in calls:
        assert env["COLD_START_COMPILE_FOR"] == "a100"
        assert env["KERNELS_TRITON_COMPILE_ONLY"] == "1"
        assert env["TRITON_CACHE_DIR"] == str(keep / case)
        assert env["KERNELS_RECORD_LAUNCHES"] == "1"


@pytest.mark.parametrize(
    "argv",
    [["--compile-for", "a100"], ["--compile-for", "b200", "--keep-cache", "k", "--binaries"]],
)
def test_compile_for_needs_a_kept_cache_and_no_binaries(argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["cold_start.py", *argv])
    with pytest.raises(SystemExit):
        cold_start.main()
    assert "--compile-for captures: it needs --keep-cache DIR" in capsys.readouterr().err


def test_a_pretended_gpu_is_what_triton_and_our_launch_tables_read(monkeypatch):
    """``--compile-for``'s processes: Triton's target, and the capability and SM count torch
    reports (which our launch tables read), are the other GPU's; every other property is the
    real one's. (The driver is a stand-in: this machine has no CUDA.)"""
    import torch
    from triton.runtime import driver

    class Driver:
        def get_current_target(self):
            raise AssertionError("the real target must not be read")

    class Real:
        major, minor, multi_processor_count, total_memory = 9, 0, 132, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Real())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(driver, "_active", Driver())  # (reset_active would look for a GPU)
    cold_start.pretend_gpu(*cold_start.OTHER_GPUS["a100"])
    target = driver.active.get_current_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 80, 32)
    props = torch.cuda.get_device_properties(0)
    assert (props.major, props.minor, props.multi_processor_count) == (8, 0, 108)
    assert props.total_memory == 80 * 2**30  # the rest is the real device's
    assert torch.cuda.get_device_capability(0) == (8, 0)
