"""benchmarks/e2e.py's parts that run without a GPU: ModuleState and build_contenders (each
contender of the interleaved benchmark runs with the modelling-module state its set-up left;
ours and Liger both patch transformers' Llama module), the report, and how a run's rows are
kept (one entry per setting in results.json, a shape's rows replaced by its next run)."""

import json

import pytest

modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
from benchmarks import e2e  # noqa: E402  (after the skip: it times transformers' Llama)


@pytest.fixture
def module_state():
    state = e2e.ModuleState()
    yield state
    state.restore()


def test_each_setup_gets_its_module_globals_and_class_attributes_back(module_state):
    original = modeling.apply_rotary_pos_emb

    def rope_a(*args, **kwargs):
        return original(*args, **kwargs)

    def rope_b(*args, **kwargs):
        return original(*args, **kwargs)

    modeling.apply_rotary_pos_emb = rope_a
    modeling.LlamaForCausalLM.patched_by_a = True
    state_a = module_state.capture()
    module_state.restore()
    assert modeling.apply_rotary_pos_emb is original
    assert "patched_by_a" not in vars(modeling.LlamaForCausalLM)

    modeling.apply_rotary_pos_emb = rope_b
    state_b = module_state.capture()
    module_state.restore(state_a)
    assert modeling.apply_rotary_pos_emb is rope_a
    assert modeling.LlamaForCausalLM.patched_by_a is True
    module_state.restore(state_b)
    assert modeling.apply_rotary_pos_emb is rope_b
    assert "patched_by_a" not in vars(modeling.LlamaForCausalLM)


def test_attributes_set_at_run_time_are_left_alone(module_state):
    state = module_state.capture()
    modeling.LlamaModel.set_while_running = 1  # e.g. a lazily filled class cache
    try:
        module_state.restore(state)
        assert modeling.LlamaModel.set_while_running == 1
    finally:
        del modeling.LlamaModel.set_while_running


def test_build_contenders_builds_each_from_a_clean_module_and_keeps_its_state(module_state):
    original = modeling.apply_rotary_pos_emb
    seen = []

    def patching_maker(name):
        def make():
            # Each set-up must start from transformers' own function, not another's patch.
            seen.append(modeling.apply_rotary_pos_emb is original)

            def rope(*args, **kwargs):
                return original(*args, **kwargs)

            rope.contender = name
            modeling.apply_rotary_pos_emb = rope
            return name

        return make

    makers = {"a": patching_maker("a"), "b": patching_maker("b"), "unused": None}
    contenders = e2e.build_contenders(makers, ["a", "b"], module_state)
    assert seen == [True, True]
    assert list(contenders) == ["a", "b"]
    assert modeling.apply_rotary_pos_emb is original
    for name, (model, state) in contenders.items():
        assert model == name
        module_state.restore(state)
        assert modeling.apply_rotary_pos_emb.contender == name


def _row(shape, contender, train, host=None, transformers="4.57.6", vocab=32000):
    row = {
        "shape": shape, "contender": contender, "device": "GPU", "date": "2026-11-23",
        "torch": "2", "transformers": transformers, "triton": "3", "liger_kernel": "0.7",
        "config": {"vocab_size": vocab}, "train_ms": train, "prefill_ms": train / 3,
        "train_peak_gib": 1.0,
    }  # fmt: skip
    if host is not None:
        row["train_host_ms"] = host
    return row


def test_report_gives_host_time_beside_wall_time_when_recorded():
    rows = [_row("8x512", "eager", 70.0, 45.5), _row("8x512", "ours (kernelized)", 50.0, 48.25)]
    text = e2e.markdown(rows)
    assert "| eager | 70.0 ms (1.00x) | 23.3 ms (1.00x) | 1.0 |" in text
    assert "| ours (kernelized) | 50.0 ms (1.40x) |" in text
    assert "| contender | host / wall 8x512 |" in text
    assert "| eager | 45.5 / 70.0 ms |" in text
    assert "| ours (kernelized) | 48.2 / 50.0 ms |" in text


def test_report_of_runs_without_host_time_has_no_host_table():
    text = e2e.markdown([_row("1x4096", "eager", 80.0), _row("1x4096", "ours (kernelized)", 60.0)])
    assert "host / wall" not in text
    assert "| ours (kernelized) | 60.0 ms (1.33x) |" in text


def test_max_batch_table():
    meta = {"device": "GPU", "gpu_gib": 79.6, "config": {"vocab_size": 128256}}
    rows = [
        {**meta, "contender": "eager", "seq": 2048, "batch": 3, "tokens": 6144},
        {**meta, "contender": "ours (kernelized, fused CE)", "seq": 2048, "batch": 9},
        {**meta, "contender": "ours (kernelized, fused CE)", "seq": 4096, "batch": 4},
    ]
    rows[1]["tokens"], rows[2]["tokens"] = 9 * 2048, 4 * 4096
    lines = e2e._max_batch_table(rows)
    assert "Largest batch of a training step that fits (GPU, 80 GiB; vocab 128256):" in lines
    assert "| eager | 3 (6144 tokens) | — |" in lines
    assert "| ours (kernelized, fused CE) | 9 (18432 tokens) | 4 (16384 tokens) |" in lines
    assert e2e._max_batch_table([]) == []


def _store_shape(out, rows):
    e2e.store(out, rows[0], lambda entry: e2e._replace_shape(entry, rows[0]["shape"], rows))


def test_a_run_replaces_its_shape_in_its_setting_and_keeps_the_others(tmp_path):
    """One folder for every setting: each (transformers line, vocabulary) is one entry of
    results.json, recorded as data; a new run of a shape replaces only that shape's rows of its
    own setting, whatever patch release of the line it ran on."""
    _store_shape(tmp_path, [_row("8x512", "eager", 70.0), _row("8x512", "ours (kernelized)", 50.0)])
    _store_shape(tmp_path, [_row("1x4096", "eager", 90.0)])
    _store_shape(tmp_path, [_row("8x512", "eager", 80.0, transformers="5.24.0")])
    _store_shape(tmp_path, [_row("8x512", "eager", 60.0, vocab=128256)])
    # The latest 8x512 run on 4.57 (another patch release): only its rows remain for that shape.
    _store_shape(tmp_path, [_row("8x512", "eager", 75.0, transformers="4.57.1")])

    entries = json.loads((tmp_path / "results.json").read_text())["entries"]
    settings = [e["setting"] for e in entries]
    assert settings == [
        {"transformers": "4.57", "vocab": 32000},
        {"transformers": "4.57", "vocab": 128256},
        {"transformers": "5.24", "vocab": 32000},
    ]
    tf457 = entries[0]["rows"]
    assert sorted((r["shape"], r["contender"], r["train_ms"]) for r in tf457) == [
        ("1x4096", "eager", 90.0),
        ("8x512", "eager", 75.0),
    ]
    text = (tmp_path / "results.md").read_text()
    for title in ("transformers 4.57, vocab 32000", "transformers 5.24, vocab 32000"):
        assert f"## {title}" in text
    assert text == e2e.report_text(entries)


def test_max_batch_run_is_kept_in_its_setting(tmp_path):
    meta = {"device": "GPU", "gpu_gib": 80.0, "transformers": "4.57.6"}
    meta["config"] = {"vocab_size": 128256}
    rows = [{**meta, "contender": "eager", "seq": 2048, "batch": 3, "tokens": 6144}]
    e2e.store(tmp_path, rows[0], lambda entry: {**entry, "max_batch": rows})
    _store_shape(tmp_path, [_row("8x512", "eager", 60.0, vocab=128256)])
    (entry,) = json.loads((tmp_path / "results.json").read_text())["entries"]
    assert entry["max_batch"] == rows and [r["shape"] for r in entry["rows"]] == ["8x512"]
    assert "| eager | 3 (6144 tokens) |" in (tmp_path / "results.md").read_text()


def test_report_without_results_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run a shape first"):
        e2e.report(tmp_path)
