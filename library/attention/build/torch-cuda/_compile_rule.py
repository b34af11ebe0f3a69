"""Which side of a kernel ``torch.compile`` gets: the opaque op or the PyTorch formula.

Every kernel of this package is a ``torch.library`` custom op with its fake and its backward
registered, so a compiled graph can hold it as one node (AOTAutograd, inductor and CUDA graphs
accept it), and every one has its formula in PyTorch ops, which inductor fuses with the ops
around it. Which of the two is faster depends on the layer, its sizes and whether a backward
is recorded; this file holds that choice as data, in one place: ``RULE``. The public functions
ask `compile_side` while Dynamo traces them, and call the op or the formula.

``RULE`` is a tuple of rows ``(layer, pass, min_hidden, min_tokens, side)``:

* ``layer``: one of `LAYERS` (docs/compile-backend.md#the-compile-rule says which functions
  each names);
* ``pass``: ``"train"`` (a backward is recorded), ``"infer"`` (none) or ``"*"`` (either);
* ``min_hidden``, ``min_tokens``: the row holds from these sizes up (the last dimension, and
  the rows before it);
* ``side``: ``"op"`` or ``"formula"``.

Of the rows that hold for a call, the one with the largest ``min_hidden``, then the largest
``min_tokens``, then an exact ``pass`` over ``"*"`` wins. A layer without a row takes the op.
The sizes are compared only where the rows of a layer disagree, so that under
``dynamic=True`` a layer whose rows agree adds no guard; where they disagree the guard is the
size class (``tokens >= 4096``), and a new shape recompiles only when it changes class.

The values are measured by ``benchmarks/compile_rule.py`` on a GPU (it prints rows in this
format); rows nobody measured keep what the functions did before the rule existed. The fused
lm_head + cross-entropy is an op whatever is measured: its formula computes the logits,
``[tokens, vocab]`` in memory, which no fusion of inductor's avoids.

The choice can be forced, for measurements: ``KERNELS_COMPILE_RULE`` in the environment when
the package is imported (``op``, ``formula``, or ``layer=side`` pairs separated by commas, such
as ``rms_norm=op,rotary=formula``), or `force` at run time (a graph compiled under another
choice is recompiled: Dynamo guards on what the rule read).

Each kernel repository carries its own copy of this file (the one source is
``library/_shared/_compile_rule.py`` in the ``kernels`` project, copied by ``make library``).
"""

import os

OP = "op"
FORMULA = "formula"
SIDES = (OP, FORMULA)
PASSES = ("train", "infer", "*")

#: The layers the rule decides for.
LAYERS = (
    "rms_norm",
    "gemma_rms_norm",
    "fused_add_rms_norm",
    "layer_norm",
    "activation",
    "gated_activation",
    "gated_mlp",
    "gated_mlp_decode",
    "rotary",
    "fused_linear_cross_entropy",
    "cross_entropy",
)

#: The layers that stay ops whatever the table says: their formula materialises the logits.
ALWAYS_OP = ("fused_linear_cross_entropy", "cross_entropy")

#: The environment variable that forces a side (read when the package is imported).
ENVIRONMENT = "KERNELS_COMPILE_RULE"

# One row a layer, from the probe's run on an H100
# (benchmarks/results/h100/compile_rule/, docs/compile.md): a side changed only where it won
# across its row of sizes (LayerNorm's formula, the gated activation's op); where the cells
# split, the side that a compiled 1.1B Llama's step measured best keeps its row.
RULE = (
    ("rms_norm", "*", 0, 0, FORMULA),
    ("gemma_rms_norm", "*", 0, 0, FORMULA),
    ("fused_add_rms_norm", "*", 0, 0, OP),
    ("layer_norm", "*", 0, 0, FORMULA),
    ("activation", "*", 0, 0, FORMULA),
    ("gated_activation", "*", 0, 0, OP),
    ("gated_mlp", "*", 0, 0, FORMULA),
    ("gated_mlp_decode", "*", 0, 0, OP),
    ("rotary", "*", 0, 0, FORMULA),
    ("fused_linear_cross_entropy", "*", 0, 0, OP),
    ("cross_entropy", "*", 0, 0, OP),
)


class CompileRuleError(ValueError):
    """A rule row or a forced side that names no layer, pass or side."""


def check_rule(rule) -> tuple:
    """``rule`` as a tuple of rows, each checked.

    Raises:
        CompileRuleError: a row that is not ``(layer, pass, min_hidden, min_tokens, side)``
            with known values, or one that makes a layer of `ALWAYS_OP` a formula.
    """
    rows = []
    for row in rule:
        if not isinstance(row, tuple) or len(row) != 5:
            raise CompileRuleError(
                f"compile rule row {row!r}: expected (layer, pass, min_hidden, min_tokens, side)."
            )
        layer, pass_, hidden, tokens, side = row
        if layer not in LAYERS:
            raise CompileRuleError(f"compile rule row {row!r}: layer must be one of {LAYERS}.")
        if pass_ not in PASSES:
            raise CompileRuleError(f"compile rule row {row!r}: pass must be one of {PASSES}.")
        if any(type(n) is not int or n < 0 for n in (hidden, tokens)):
            raise CompileRuleError(
                f"compile rule row {row!r}: min_hidden and min_tokens must be integers >= 0."
            )
        if side not in SIDES:
            raise CompileRuleError(f"compile rule row {row!r}: side must be one of {SIDES}.")
        if layer in ALWAYS_OP and side != OP:
            raise CompileRuleError(
                f"compile rule row {row!r}: {layer} stays an op under compile (its formula "
                "puts the logits in memory); force it with KERNELS_COMPILE_RULE to measure."
            )
        rows.append(row)
    return tuple(rows)


def parse_forced(text: str | None) -> dict:
    """``KERNELS_COMPILE_RULE``'s value as ``{layer or "*": side}``: ``op`` or ``formula``
    forces every layer, ``layer=side,...`` some of them; empty or None forces nothing.

    Raises:
        CompileRuleError: an unknown layer or side, naming the accepted ones.
    """
    forced = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        layer, _, side = item.rpartition("=")
        layer, side = layer.strip() or "*", side.strip()
        if layer != "*" and layer not in LAYERS:
            raise CompileRuleError(
                f"{ENVIRONMENT}: unknown layer {layer!r}; the layers are {', '.join(LAYERS)}."
            )
        if side not in SIDES:
            raise CompileRuleError(
                f"{ENVIRONMENT}: unknown side {side!r} for {layer}; write op or formula."
            )
        forced[layer] = side
    return forced


# Rebound (never mutated) on each change: Dynamo guards a compiled graph on the values it read,
# so a graph traced under other rows or another forced side is not reused. Keyed by layer and
# pass, so that a traced call reads (and guards on) its own entry only, not every layer's rows.
_rows: dict = {}  # {(layer, pass): its side where every row agrees, else its rows}
_forced = ()  # ((layer or "*", side), ...)


def _index(rule) -> dict:
    rows = {}
    for row in check_rule(rule):
        rows.setdefault(row[0], []).append(row)
    index = {}
    for layer, layer_rows in rows.items():
        for pass_ in PASSES[:2]:
            # Most specific first: hidden, then tokens, then an exact pass over "*".
            kept = sorted(
                (r for r in layer_rows if r[1] in (pass_, "*")),
                key=lambda r: (r[2], r[3], r[1] != "*"),
                reverse=True,
            )
            if kept:
                same = all(r[4] == kept[0][4] for r in kept)
                index[(layer, pass_)] = kept[0][4] if same else tuple(kept)
    return index


def set_rule(rule=RULE) -> None:
    """Use ``rule`` (rows as ``RULE``'s) from now on; ``set_rule()`` restores ``RULE``.

    Raises:
        CompileRuleError: a bad row (`check_rule`).
    """
    global _rows
    _rows = _index(rule)


def force(side: str | None = None, layers=None) -> None:
    """Force ``side`` (``"op"`` or ``"formula"``) for ``layers`` (default: all), or, with
    ``side=None``, stop forcing them (``force()`` stops forcing any).

    Raises:
        CompileRuleError: an unknown side or layer.
    """
    global _forced
    names = ["*"] if layers is None else list(layers)
    for name in names:
        if name != "*" and name not in LAYERS:
            raise CompileRuleError(f"unknown layer {name!r}; the layers are {', '.join(LAYERS)}.")
    if side is not None and side not in SIDES:
        raise CompileRuleError(f"unknown side {side!r}; write op or formula.")
    if side is None and layers is None:
        _forced = ()
        return
    kept = tuple((name, s) for name, s in _forced if name not in names)
    _forced = kept if side is None else kept + tuple((name, side) for name in names)


def forced() -> dict:
    """The sides forced now, ``{layer or "*": side}``."""
    return dict(_forced)


def compile_side(layer: str, hidden, tokens, training: bool) -> str:
    """``"op"`` or ``"formula"``: what ``layer`` hands a compiled graph for a call of ``tokens``
    rows of ``hidden`` elements, recording a backward or not (``training``). Called while
    Dynamo traces; ``hidden`` and ``tokens`` may be symbolic sizes."""
    for name, side in _forced:
        if name == layer:
            return side
    for name, side in _forced:
        if name == "*":
            return side
    rows = _rows.get((layer, "train" if training else "infer"))
    if rows is None:
        return OP
    if isinstance(rows, str):
        return rows  # every row agrees: no size compared, no guard on the shape
    for _, _, min_hidden, min_tokens, side in rows:
        if hidden >= min_hidden and tokens >= min_tokens:
            return side
    return OP


def sizes(x, hidden_dims: int = 1) -> tuple:
    """``(hidden, tokens)`` of ``x``: the product of its last ``hidden_dims`` sizes, and the
    product of the others."""
    hidden = 1
    for n in x.shape[x.dim() - hidden_dims :]:
        hidden = hidden * n
    tokens = 1
    for n in x.shape[: x.dim() - hidden_dims]:
        tokens = tokens * n
    return hidden, tokens


set_rule(RULE)
_forced = tuple(parse_forced(os.environ.get(ENVIRONMENT)).items())
