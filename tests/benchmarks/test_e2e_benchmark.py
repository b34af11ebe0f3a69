"""benchmarks/e2e.py's parts that run without a GPU: the contenders of issue 38 (built on a tiny
config on the CPU), which ones a call selects and runs without Liger-Kernel, ModuleState and
build_contenders (each contender of the interleaved benchmark runs with the modelling-module
state its set-up left; ours and Liger both patch transformers' Llama module), the best of ours
against the best peer and issue 38's PASS/FAIL lines (made-up numbers), the report, and how a
run's rows are kept (one entry per setting in results.json, a contender's rows at a shape
replaced by its next run)."""

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
    e2e.store(out, rows[0], lambda entry: e2e.replace_rows(entry, rows))


def test_a_run_replaces_its_contenders_at_its_shapes_in_its_setting_and_keeps_the_others(tmp_path):
    """One folder for every setting: each (transformers line, vocabulary) is one entry of
    results.json, recorded as data; a new run replaces only the rows of the contenders and
    shapes it timed, in its own setting, whatever patch release of the line it ran on."""
    _store_shape(tmp_path, [_row("8x512", "eager", 70.0), _row("8x512", "ours (kernelized)", 50.0)])
    _store_shape(tmp_path, [_row("1x4096", "eager", 90.0)])
    _store_shape(tmp_path, [_row("8x512", "eager", 80.0, transformers="5.24.0")])
    _store_shape(tmp_path, [_row("8x512", "eager", 60.0, vocab=128256)])
    # The latest 8x512 run of eager on 4.57 (another patch release): ours' row stays.
    _store_shape(tmp_path, [_row("8x512", "eager", 75.0, transformers="4.57.1")])

    entries = json.loads((tmp_path / "results.json").read_text())["entries"]
    settings = [e["setting"] for e in entries]
    assert settings == [
        {"transformers": "4.57", "vocab": 32000},
        {"transformers": "4.57", "vocab": 128256},
        {"transformers": "5.24", "vocab": 32000},
    ]
    # Ordered by shape (e2e.SHAPES) and contender (e2e.CONTENDERS), whatever order they ran in.
    assert [(r["shape"], r["contender"], r["train_ms"]) for r in entries[0]["rows"]] == [
        ("8x512", "eager", 75.0),
        ("8x512", "ours (kernelized)", 50.0),
        ("1x4096", "eager", 90.0),
    ]
    text = (tmp_path / "results.md").read_text()
    for title in ("transformers 4.57, vocab 32000", "transformers 5.24, vocab 32000"):
        assert f"## {title}" in text
    assert text == e2e.report_text(entries)


def test_rows_of_retired_contenders_are_dropped_and_mixed_runs_are_named():
    """The compiled contender of ours without the fused loss is no longer built: its old rows
    go at the next run, not beside the new ones. Rows kept from another run say so."""
    old = {**_row("8x512", "ours (kernelized + compile)", 60.0), "run": "2026-11-23T10:00:00"}
    kept = {**_row("8x512", "eager", 70.0), "run": "2026-11-23T10:00:00"}
    new = {**_row("8x512", "ours (kernelized, fused CE)", 50.0), "run": "2026-11-26T09:00:00"}
    entry = e2e.replace_rows({"setting": {}, "rows": [old, kept]}, [new])
    assert [r["contender"] for r in entry["rows"]] == ["eager", "ours (kernelized, fused CE)"]
    text = e2e.markdown(entry["rows"])
    assert "Rows from 2 runs (2026-11-23T10:00:00, 2026-11-26T09:00:00)" in text
    assert "Rows from" not in e2e.markdown([kept])


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


# The contenders: issue 38's list, selected by key, Liger's skipped when it is not installed.


def test_the_contenders_are_issue_38s():
    assert [(c.key, c.name, c.ours, c.compiled) for c in e2e.CONTENDERS] == [
        ("eager", "eager", False, False),
        ("compile", "torch.compile", False, True),
        ("ours", "ours (kernelized)", True, False),
        ("ours-fce", "ours (kernelized, fused CE)", True, False),
        ("ours-compile", "ours (kernelized + compile, fused CE)", True, True),
        ("ours-attn", "ours (kernelized, fused CE, our attention)", True, False),
        ("ours-attn-compile", "ours (kernelized + compile, fused CE, our attention)", True, True),
        ("liger", "liger (no fused CE)", False, False),
        ("liger-compile", "liger (no fused CE) + compile", False, True),
        ("liger-flce", "liger (fused linear CE)", False, False),
        ("liger-flce-compile", "liger (fused linear CE) + compile", False, True),
    ]
    assert [c.key for c in e2e.CONTENDERS if c.liger] == [
        "liger",
        "liger-compile",
        "liger-flce",
        "liger-flce-compile",
    ]
    assert list(e2e.contender_makers({})) == [c.name for c in e2e.CONTENDERS]


@pytest.fixture
def tiny(monkeypatch):
    """e2e's model on the CPU at the tests' tiny Llama size (our kernels through Triton's
    interpreter)."""
    from tests.support.models import TINY_LLAMA

    monkeypatch.setattr(e2e, "DEVICE", "cpu")
    monkeypatch.setattr(e2e, "CONFIG", {**e2e.CONFIG, **TINY_LLAMA, "max_position_embeddings": 64})


def test_ours_compiled_contender_keeps_the_fused_loss(tiny, module_state):
    """Built as a run builds them (tiny model, CPU): the compiled contenders are compiled,
    ours + compile has our fused loss, so its compiled training step holds no logits (the
    issue's ours + compile was built without it), and the attention contenders run ours."""
    from kernels.layer.swap import kernel_layer_of
    from kernels.library import untag

    state = e2e.build().state_dict()
    names = [c.name for c in e2e.CONTENDERS if not c.liger]
    contenders = e2e.build_contenders(e2e.contender_makers(state), names, module_state)
    try:
        fused_loss, attention = {}, {}
        for name, (model, _) in contenders.items():
            assert hasattr(model, "_orig_mod") == e2e.BY_NAME[name].compiled, name
            model = getattr(model, "_orig_mod", model)
            fused_loss[name] = kernel_layer_of(model) is not None
            attention[name] = model.config._attn_implementation
        assert fused_loss == {
            "eager": False,
            "torch.compile": False,
            "ours (kernelized)": False,
            "ours (kernelized, fused CE)": True,
            "ours (kernelized + compile, fused CE)": True,
            "ours (kernelized, fused CE, our attention)": True,
            "ours (kernelized + compile, fused CE, our attention)": True,
        }
        ours_attention = {name for name, impl in attention.items() if impl != "sdpa"}
        assert ours_attention == {n for n in names if "our attention" in n}
        assert {attention[n] for n in ours_attention} == {"kernels_attention"}
        torch = pytest.importorskip("torch")
        model, own = contenders["ours (kernelized, fused CE)"]
        module_state.restore(own)
        tokens = torch.randint(0, 64, (2, 8))
        assert model(input_ids=tokens, labels=tokens).logits is None
    finally:
        e2e.free(contenders)
        untag()
    assert contenders == {}


def test_select_contenders_by_key_in_the_benchmarks_order():
    chosen = e2e.select_contenders("liger-flce,eager, ours-compile")
    assert [c.key for c in chosen] == ["eager", "ours-compile", "liger-flce"]
    assert e2e.select_contenders() == list(e2e.CONTENDERS)
    skipped = e2e.select_contenders(None, ["compile", "liger (no fused CE)"])
    assert [c.key for c in skipped] == [
        "eager", "ours", "ours-fce", "ours-compile", "ours-attn", "ours-attn-compile",
        "liger-compile", "liger-flce", "liger-flce-compile",
    ]  # fmt: skip
    with pytest.raises(
        ValueError, match="unknown contender 'ours-eager': choose from eager, compile"
    ):
        e2e.select_contenders("eager,ours-eager")
    with pytest.raises(ValueError, match="cannot skip 'liger fused'"):
        e2e.select_contenders(None, ["liger fused"])


def test_without_liger_its_contenders_are_skipped_with_a_note():
    chosen = e2e.select_contenders("eager,liger,liger-flce-compile")
    kept, notes = e2e.runnable(chosen, liger_installed=False)
    assert [c.key for c in kept] == ["eager"]
    assert len(notes) == 2
    assert notes[0].startswith("liger (no fused CE): skipped, Liger-Kernel is not installed")
    assert "pip install liger-kernel" in notes[1] and notes[1].startswith(
        "liger (fused linear CE) +"
    )
    assert e2e.runnable(chosen, liger_installed=True) == (chosen, [])


def test_shapes_are_parsed_or_refused_with_their_form():
    assert e2e.parse_shapes("8x512, 4x2048,8x512") == ["8x512", "4x2048"]
    assert e2e.parse_shapes(",".join(e2e.SHAPES)) == ["8x512", "4x2048", "1x4096"]
    for bad in ("8x", "8*512", "0x512", "8x512x2"):
        with pytest.raises(ValueError, match="is not batch x sequence in positive integers"):
            e2e.parse_shapes(bad)
    with pytest.raises(ValueError, match="no shape given"):
        e2e.parse_shapes(" , ")


def test_resume_command_names_what_is_left():
    left = e2e.select_contenders("compile,ours-compile")
    assert e2e.resume_command(128256, ["4x2048", "1x4096"], left) == (
        "python -m benchmarks.e2e --vocab 128256 --shape 4x2048,1x4096 "
        "--contenders compile,ours-compile"
    )


# The best of ours against the best peer, and issue 38's targets, on made-up numbers.


def _timed(contender, train, prefill, train_peak, prefill_peak=None, shape="8x512"):
    row = {"shape": shape, "contender": contender, "train_ms": train, "prefill_ms": prefill}
    row["train_peak_gib"] = train_peak
    if prefill_peak is not None:
        row["prefill_peak_gib"] = prefill_peak
    return row


EAGER = "eager"
COMPILE = "torch.compile"
OURS = "ours (kernelized)"
OURS_FCE = "ours (kernelized, fused CE)"
OURS_COMPILE = "ours (kernelized + compile, fused CE)"
LIGER = "liger (no fused CE)"
LIGER_FLCE = "liger (fused linear CE)"
LIGER_COMPILE = "liger (fused linear CE) + compile"


def test_fastest_breaks_ties_by_peak_then_order():
    a, b = _timed(OURS, 50.0, 10.0, 7.0), _timed(OURS_FCE, 50.0, 10.0, 6.0)
    c = _timed(OURS_COMPILE, 50.0, 10.0, 6.0)
    assert e2e.fastest([a, b, c], "train") is b  # equal times: the lower peak
    assert e2e.fastest([c, b], "train") is c  # equal times and peaks: the first
    assert e2e.fastest([a, _timed(EAGER, 49.9, 30.0, 9.0)], "train")["contender"] == EAGER
    assert e2e.fastest([], "prefill") is None
    # Prefill peaks not recorded (runs before they were): the order decides.
    assert e2e.fastest([a, b], "prefill") is a
    assert e2e.lowest_peak([a, b], "prefill") is None


def test_best_of_ours_against_the_best_peer():
    rows = [
        _timed(EAGER, 86.6, 23.1, 16.4, 4.0),
        _timed(COMPILE, 61.7, 16.8, 11.6, 3.0),
        _timed(OURS, 69.8, 18.7, 7.2, 2.5),
        _timed(OURS_COMPILE, 63.9, 16.7, 8.8, 2.6),
        _timed(LIGER_FLCE, 91.2, 16.2, 8.1, 2.4),
    ]
    # Training: ours eager is the one of ours within Liger's 8.1 GiB, so it is the best of
    # ours (slower than compile alone); prefill: none of ours within 2.4 GiB, the fastest.
    train = e2e.best_against_peers(rows, "train")
    assert (train.ours["contender"], train.peer["contender"]) == (OURS, COMPILE)
    assert train.ratio == pytest.approx(61.7 / 69.8)
    assert train.lowest_peer["contender"] == LIGER_FLCE
    prefill = e2e.best_against_peers(rows, "prefill")
    assert (prefill.ours["contender"], prefill.peer["contender"]) == (OURS_COMPILE, LIGER_FLCE)
    assert prefill.ratio == pytest.approx(16.2 / 16.7)
    assert prefill.lowest_peer["contender"] == LIGER_FLCE
    # A shape where no peer ran (e.g. --contenders ours,ours-fce): nothing to compare.
    alone = e2e.best_against_peers([r for r in rows if r["contender"].startswith("ours")], "train")
    assert alone.peer is None and alone.ratio is None and alone.ours["contender"] == OURS_COMPILE
    # The 4.57 4x2048 row: the fastest of ours is above the lowest peer's peak, the fused-CE
    # configuration (a little slower, still ahead of every peer) is within it: it is the best.
    rows = [
        _timed(OURS, 104.5, 32.2, 12.3, 3.0),
        _timed(OURS_FCE, 105.2, 32.4, 10.0, 3.0),
        _timed(LIGER, 107.5, 33.4, 14.3, 3.0),
        _timed(LIGER_FLCE, 113.7, 33.1, 11.9, 3.0),
    ]
    train = e2e.best_against_peers(rows, "train")
    assert (train.ours["contender"], train.peer["contender"]) == (OURS_FCE, LIGER)
    assert train.lowest_peer["contender"] == LIGER_FLCE
    # None of ours within it: the fastest of ours, whose peak then fails the target.
    rows[1] = _timed(OURS_FCE, 105.2, 32.4, 12.0, 3.0)
    assert e2e.best_against_peers(rows, "train").ours["contender"] == OURS


def _checks(rows):
    return {(c.shape, c.target): c for c in e2e.target_checks(rows)}


def test_targets_fail_where_issue_38_saw_them_fail():
    """The issue's 4x2048 row: ours + compile slower and larger than ours eager."""
    shape = "4x2048"
    rows = [
        _timed(EAGER, 173.0, 46.0, 29.9, 9.0, shape),
        _timed(COMPILE, 140.2, 40.6, 19.8, 8.0, shape),
        _timed(OURS_FCE, 133.8, 33.3, 11.1, 6.0, shape),
        _timed(OURS_COMPILE, 147.6, 41.1, 14.2, 7.0, shape),
        _timed(LIGER_FLCE, 134.8, 33.4, 12.8, 6.5, shape),
        _timed(LIGER_COMPILE, 130.0, 35.0, 12.0, 6.2, shape),
    ]
    checks = _checks(rows)
    compile_check = checks[(shape, e2e.TARGET_COMPILE)]
    assert compile_check.status == "FAIL"
    assert compile_check.line() == (
        "4x2048: ours + compile <= min(ours eager, compile alone) in time and <= ours eager in "
        "peak: FAIL (train 147.6 ms (ours-compile) vs 133.8 ms (ours-fce): FAIL; train peak "
        "14.2 GiB (ours-compile) vs 11.1 GiB (ours-fce): FAIL; prefill 41.1 ms (ours-compile) "
        "vs 33.3 ms (ours-fce): FAIL; prefill peak 7.0 GiB (ours-compile) vs 6.0 GiB "
        "(ours-fce): FAIL)"
    )
    # Liger + compile is the best peer in training: ours (133.8) loses to it (130.0).
    peers_check = checks[(shape, e2e.TARGET_PEERS)]
    assert peers_check.status == "FAIL"
    assert [status for status, _ in peers_check.parts] == ["FAIL", "PASS", "PASS", "PASS"]
    assert peers_check.parts[0][1] == (
        "train 133.8 ms (ours-fce) vs 130.0 ms (liger-flce-compile): FAIL, 0.97x"
    )


def test_targets_pass_when_met_and_ties_pass():
    rows = [
        _timed(EAGER, 86.6, 23.1, 16.4, 4.0),
        _timed(COMPILE, 61.7, 16.8, 11.6, 3.0),
        _timed(OURS, 69.8, 18.7, 7.2, 2.5),
        _timed(OURS_FCE, 70.0, 18.0, 6.1, 2.5),
        _timed(OURS_COMPILE, 61.7, 16.0, 6.1, 2.4),  # a tie with compile alone, in time and peak
        _timed(LIGER_FLCE, 91.2, 16.2, 8.1, 2.4),
    ]
    checks = _checks(rows)
    assert checks[("8x512", e2e.TARGET_COMPILE)].status == "PASS"
    peers = checks[("8x512", e2e.TARGET_PEERS)]
    assert peers.status == "PASS"
    assert peers.parts[0][1] == "train 61.7 ms (ours-compile) vs 61.7 ms (compile): PASS, 1.00x"
    assert peers.parts[3][1] == (
        "prefill peak 2.4 GiB (ours-compile) vs 2.4 GiB (liger-flce): PASS"
    )


def test_targets_without_a_contender_or_a_peak_are_not_passed():
    rows = [_timed(EAGER, 86.6, 23.1, 16.4), _timed(OURS_FCE, 70.0, 18.0, 6.1)]
    checks = _checks(rows)
    compile_check = checks[("8x512", e2e.TARGET_COMPILE)]
    assert compile_check.status == "N/A"
    assert compile_check.parts[0] == (
        "N/A",
        "train: ours (kernelized + compile, fused CE), torch.compile not measured",
    )
    # Both ran, but no prefill peak was recorded: the prefill peak part cannot pass.
    peers = checks[("8x512", e2e.TARGET_PEERS)]
    assert [status for status, _ in peers.parts] == ["PASS", "PASS", "PASS", "N/A"]
    assert peers.status == "N/A" and "prefill peak: not recorded" in peers.line()
    # A failing part outweighs a missing one.
    slow = [_timed(EAGER, 60.0, 23.1, 16.4), _timed(OURS_FCE, 70.0, 18.0, 6.1)]
    assert _checks(slow)[("8x512", e2e.TARGET_PEERS)].status == "FAIL"


def test_report_shows_best_of_ours_and_a_line_per_target_and_shape():
    rows = [
        {**_row("8x512", "eager", 90.0), "prefill_peak_gib": 3.0},
        {**_row("8x512", OURS_FCE, 60.0), "train_peak_gib": 0.5, "prefill_peak_gib": 2.0},
        {**_row("1x4096", "eager", 80.0), "prefill_peak_gib": 3.0},
    ]
    text = e2e.report_text([{"setting": {"transformers": "5.24", "vocab": 32000}, "rows": rows}])
    assert (
        "| 8x512 | train | ours (kernelized, fused CE) | 60.0 | 0.5 | eager | 90.0 | 1.0 | 1.50x "
        "| 1.0 (eager) |" in text
    )
    assert "| 1x4096 | prefill | — | — | — | eager | 26.7 | 3.0 | — | 3.0 (eager) |" in text
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert [line.split(": ")[0:3:2] for line in lines] == [
        ["- 8x512", "N/A (train"],
        ["- 8x512", "PASS (train 60.0 ms (ours-fce) vs 90.0 ms (eager)"],
        ["- 1x4096", "N/A (train"],
        ["- 1x4096", "N/A (train"],
    ]


def test_ours_untouched_by_kernelize_is_refused_not_timed_as_eager(tiny):
    """A model kernelize gave nothing (transformers 5.x without this package installed leaves
    its layers untagged) must not be timed under ours' name."""
    model = e2e.build()
    with pytest.raises(RuntimeError, match="kernelize left model.norm, model.layers.0.mlp"):
        e2e.check_kernelized(model, fused_ce=False)
    with pytest.raises(RuntimeError, match=r"the causal-LM loss .*pip install -e \."):
        e2e.check_kernelized(model, fused_ce=True)


def test_profile_summarises_each_contenders_steps(tiny, module_state, tmp_path, monkeypatch):
    """--profile on the CPU (tiny model, ours through the interpreter, one call of each step):
    a train and a prefill summary per contender, in the JSON it writes and in the tables it
    prints. (A compiled contender would add a minute of inductor's C++ builds on the CPU.)"""
    from kernels.library import untag

    monkeypatch.setattr(e2e, "PROFILE_WARMUP", 1)
    monkeypatch.setattr(e2e, "PROFILED_STEPS", 1)
    monkeypatch.setattr(e2e, "PROFILE_ROUNDS", 1)
    chosen = e2e.select_contenders("eager,ours-fce")
    lines = []
    try:
        summaries = e2e.profile("1x6", tmp_path, chosen, lines.append)
    finally:
        untag()
    assert list(summaries) == ["eager", "ours (kernelized, fused CE)"]
    for steps in summaries.values():
        assert set(steps) == {"train", "prefill"}
        for summary in steps.values():
            assert summary["wall_ms_per_step"] > 0 and summary["host_ms_per_step"] > 0
            assert summary["profiled_cpu_ms_per_step"] > 0
            assert summary["device_ms_per_step"] == 0  # no CUDA kernels on the CPU
    written = json.loads((tmp_path / f"profile_v{e2e.CONFIG['vocab_size']}_1x6.json").read_text())
    assert written["shape"] == "1x6" and written["device"] == "cpu"
    assert written["profiles"] == summaries
    text = "\n".join(lines)
    assert "train at 1x6" in text and "prefill at 1x6" in text
    assert "| ours (kernelized, fused CE) |" in text


def _rounds(row, group, train_rounds):
    """`row` as timed in rounds of `group` (its prefill rounds all at its prefill time)."""
    prefill = [row["prefill_ms"]] * len(train_rounds)
    return {**row, "group": group, "train_rounds_ms": train_rounds, "prefill_rounds_ms": prefill}


def test_times_of_one_group_compare_round_by_round():
    """ours + compile against compile alone, timed in the same rounds: a median 1% slower in 6
    of 10 rounds is a TIE, not a FAIL; the same medians from different groups compare as
    values (FAIL); 9 slower rounds of 10 FAIL."""
    group = "run-1 8x512 compiled"
    alone = _rounds(_timed(COMPILE, 50.0, 15.0, 6.0, 2.4), group, [50.0] * 10)
    tie = _rounds(_timed(OURS_COMPILE, 50.5, 15.0, 6.0, 2.4), group, [50.5] * 6 + [49.8] * 4)
    eager = _rounds(_timed(OURS_FCE, 60.0, 18.0, 6.0, 2.4), "run-1 8x512 eager-mode", [60.0] * 10)
    check = _checks([alone, tie, eager])[("8x512", e2e.TARGET_COMPILE)]
    assert check.parts[0] == (
        "TIE",
        "train 50.5 ms (ours-compile) vs 50.0 ms (compile): paired ratio 1.010, slower in 6 of "
        "10 rounds: TIE",
    )
    assert check.parts[2][0] == "PASS"  # prefill: the same time in every round
    assert check.status == "TIE"
    apart = {**tie, "group": "run-2 8x512 compiled"}
    assert _checks([alone, apart, eager])[("8x512", e2e.TARGET_COMPILE)].parts[0][0] == "FAIL"
    slower = _rounds(tie, group, [50.5] * 9 + [49.8])
    assert _checks([alone, slower, eager])[("8x512", e2e.TARGET_COMPILE)].status == "FAIL"
