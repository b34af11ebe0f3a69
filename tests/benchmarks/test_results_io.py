"""benchmarks.results_io: each command's results folder per device, and results kept per setting."""

import json

import pytest

from benchmarks import results_io


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ],
)
def test_device_folder_is_the_gpu_model(name, folder):
    assert results_io.device_folder(name) == folder


def test_device_folder_refuses_a_name_without_a_model():
    with pytest.raises(ValueError, match="cannot name a results folder"):
        results_io.device_folder("NVIDIA")


def test_entries_replace_their_own_setting_only(tmp_path):
    path = tmp_path / "results.json"
    assert results_io.read_entries(path) == []
    entries = []
    for setting, value in ((("5.24", 1)), ("4.57", 2), ("5.24", 3)):
        entry = results_io.entry_for(entries, {"transformers": setting})
        entries = results_io.replace_entry(entries, {**entry, "value": value})
    results_io.write_entries(path, entries)
    assert results_io.read_entries(path) == [
        {"setting": {"transformers": "4.57"}, "value": 2},
        {"setting": {"transformers": "5.24"}, "value": 3},
    ]


@pytest.mark.parametrize(
    "data",
    [{"meta": {}, "results": []}, {"entries": [{"no": "setting"}]}, [], {"entries": {}}],
)
def test_a_results_file_of_another_form_is_refused_with_the_fix(tmp_path, data):
    """A folder left by an older run (one run's meta and rows) is not silently overwritten."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="move it away or delete it"):
        results_io.read_entries(path)


def test_transformers_line_drops_the_patch_release():
    assert results_io.transformers_line("4.57.6") == "4.57"
    assert results_io.transformers_line("5.24.0.dev0") == "5.24"
