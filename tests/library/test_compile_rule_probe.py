"""benchmarks/compile_rule.py's CPU-side logic: its arguments, the rows it derives from timings
(in the rule's own format, accepted by the rule's check), and what it writes; and one tiny
run through Triton's interpreter, which checks that each side of each layer is captured in the
probe's graphs."""

import ast
import json
import sys
import time

import pytest

from benchmarks import compile_rule as probe


def test_arguments_are_checked_and_name_the_fix():
    args = probe.parse_args(["--layers", "rotary,rms_norm", "--tokens", "4096,512,512"])
    assert args.layers == ("rms_norm", "rotary")  # in the probe's order
    assert args.tokens == (512, 4096) and args.hidden == probe.HIDDEN
    for argv, message in (
        (["--layers", "rmsnorm"], "the layers are"),
        (["--tokens", "512,x"], "not a comma-separated list"),
        (["--hidden", "0"], "positive integers"),
    ):
        with pytest.raises(probe.ProbeError, match=message):
            probe.parse_args(argv)
    assert probe.main(["--tokens", "-1"]) == 2


def test_the_classes_cover_every_size_and_the_losses_vocabularies():
    args = probe.parse_args(
        ["--layers", "rms_norm,fused_linear_cross_entropy", "--tokens", "8,16", "--hidden", "32",
         "--vocab", "64,128"]
    )  # fmt: skip
    got = [(c.layer, c.hidden, c.vocab, c.tokens) for c in probe.cases(args)]
    assert got == [
        ("rms_norm", 32, 0, 8), ("rms_norm", 32, 0, 16),
        ("fused_linear_cross_entropy", 32, 64, 8), ("fused_linear_cross_entropy", 32, 64, 16),
        ("fused_linear_cross_entropy", 32, 128, 8), ("fused_linear_cross_entropy", 32, 128, 16),
    ]  # fmt: skip


def _timings(table):
    """Timings from ``{(layer, pass, hidden, tokens): (op ms, formula ms)}``."""
    out = []
    for (layer, pass_, hidden, tokens), (op, formula) in table.items():
        for side, ms in (("op", op), ("formula", formula)):
            out.append({"layer": layer, "hidden": hidden, "tokens": tokens, "vocab": 0,
                        "side": side, "pass": pass_, "ms": ms})  # fmt: skip
    return out


def _rule_module():
    from tests.support.library import load

    package = load("norm")
    return sys.modules[f"{package.__name__}._compile_rule"]


def test_rows_are_the_rules_format_and_reproduce_the_winners():
    timings = _timings({
        # rms_norm: the op wins at 4096 tokens and more, in both passes.
        ("rms_norm", "infer", 2048, 512): (1.0, 0.9), ("rms_norm", "train", 2048, 512): (2.0, 1.5),
        ("rms_norm", "infer", 2048, 4096): (1.0, 1.2), ("rms_norm", "train", 2048, 4096): (2.0, 2.5),
        # rotary: the formula everywhere.
        ("rotary", "infer", 2048, 512): (1.0, 0.5), ("rotary", "train", 2048, 4096): (1.0, 0.5),
        # gated_mlp: the passes disagree.
        ("gated_mlp", "infer", 2048, 512): (1.0, 2.0), ("gated_mlp", "train", 2048, 512): (2.0, 1.0),
        # the loss: its formula "wins", and it stays an op.
        ("fused_linear_cross_entropy", "train", 2048, 512): (3.0, 2.0),
    })  # fmt: skip
    won = probe.winners(timings)
    rows = probe.rule_rows(won)
    assert rows == [
        ("rms_norm", "*", 0, 0, "formula"),
        ("rms_norm", "*", 0, 4096, "op"),
        ("gated_mlp", "infer", 0, 0, "op"),
        ("gated_mlp", "train", 0, 0, "formula"),
        ("rotary", "*", 0, 0, "formula"),
        ("fused_linear_cross_entropy", "*", 0, 0, "op"),
    ]
    rule = _rule_module()
    try:
        rule.set_rule(rows)  # the rule's own check takes them
        for w in won:
            hidden = probe.rule_hidden(w["layer"], w["hidden"])
            side = rule.compile_side(w["layer"], hidden, w["tokens"], w["pass"] == "train")
            assert side == ("op" if w["layer"] in probe.ALWAYS_OP else w["winner"]), w
    finally:
        rule.set_rule()
    # The printed rows are Python source for RULE, with the timings as comments.
    source = probe.format_rows(rows, won)
    assert "kept an op" in source and "op 2.000 / formula 1.500 ms" in source
    assert ast.literal_eval(source.removeprefix("RULE = ")) == tuple(rows)


def test_the_hidden_size_of_the_gated_rows_is_their_width():
    timings = _timings({
        ("gated_activation", "train", 2048, 512): (1.0, 2.0),
        ("gated_activation", "train", 4096, 512): (2.0, 1.0),
    })  # fmt: skip
    rows = probe.rule_rows(probe.winners(timings))
    assert rows == [
        ("gated_activation", "train", 0, 0, "op"),
        ("gated_activation", "train", 4 * 4096, 0, "formula"),
    ]


def test_results_are_written(tmp_path):
    timings = _timings({("rms_norm", "train", 32, 8): (1.0, 2.0)})
    meta = {"device": "cpu", "date": "2026-11-26", "torch": "2.13", "dtype": "float32",
            "backend": "aot_eager", "static": False}  # fmt: skip
    data = probe.write_results(tmp_path, timings, meta)
    assert data["rule"] == [["rms_norm", "*", 0, 0, "op"]]
    assert json.loads((tmp_path / "results.json").read_text())["winners"][0]["speedup"] == 2.0
    assert (
        "| rms_norm | train | 32 |  | 8 | 1.000 | 2.000 | op | 2.00x |"
        in (tmp_path / "results.md").read_text()
    )
    assert (tmp_path / "rule.py").read_text().startswith("RULE = (\n    ('rms_norm'")


def test_the_cpu_timing_is_the_median_of_three_calls():
    import torch

    calls = []
    ms = probe.time_ms(lambda: calls.append(1), 60.0, torch.device("cpu"))
    assert len(calls) == 3 and 0 <= ms < 1000


def test_a_tiny_run_on_the_interpreter(tmp_path, capsys, monkeypatch):
    """Every layer's graph is traced by Dynamo on each side and runs forward and
    backward. Dynamo's ``eager`` backend: AOTAutograd over each op and formula, with fullgraph
    and dynamic sizes, is tests/library/test_compile_rule.py's, and here it took three times
    as long. The CPU timings mean nothing, so each is of one call, not the median of three."""

    def one_call(fn, rep_ms, device):
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e3

    monkeypatch.setattr(probe, "time_ms", one_call)
    argv = ["--device", "cpu", "--backend", "eager", "--dtype", "float32", "--tokens", "3,5",
            "--hidden", "64", "--vocab", "40", "--out", str(tmp_path)]  # fmt: skip
    assert probe.main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["timings"]) == len(probe.LAYERS) * 2 * 2 * 2  # tokens, sides, passes
    assert {tuple(r)[0] for r in data["rule"]} == set(probe.LAYERS)
    assert "RULE = (" in capsys.readouterr().out
    _rule_module().check_rule([tuple(r) for r in data["rule"]])
