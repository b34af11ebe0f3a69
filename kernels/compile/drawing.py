"""Pictures and text of a graph before and after the rewrite.

Pictures (``svg``, ``png``, ``pdf``) go through torch's ``FxGraphDrawer``, which needs the
``pydot`` package and Graphviz's ``dot`` program; ``dot`` writes the Graphviz source, which
needs pydot alone; ``txt`` writes the graph's code (``GraphModule.print_readable``) and needs
nothing. The backend checks what a format needs when it is made, before anything compiles.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from torch import fx

from .errors import DrawingUnavailableError

RENDERED_FORMATS = ("svg", "png", "pdf")
FORMATS = (*RENDERED_FORMATS, "dot", "txt")

_INSTALL = (
    "install it with `pip install 'kernels[draw]'` (pydot), and Graphviz's `dot` program with "
    "your system's package manager (`apt-get install graphviz`, `brew install graphviz`, "
    "`conda install graphviz`)"
)


def check_available(draw_format: str) -> None:
    """Raise `DrawingUnavailableError` when ``draw_format`` needs what is not installed."""
    if draw_format not in FORMATS:
        raise ValueError(
            f"Unknown draw_format {draw_format!r}: use one of {', '.join(FORMATS)} "
            "('txt' needs nothing installed)."
        )
    if draw_format == "txt":
        return
    if importlib.util.find_spec("pydot") is None:
        raise DrawingUnavailableError(
            f"Drawing graphs as {draw_format} needs the pydot package, which is not installed: "
            f"{_INSTALL}. Or use draw_format='txt', which writes the graphs' code and needs "
            "neither."
        )
    if draw_format in RENDERED_FORMATS and shutil.which("dot") is None:
        raise DrawingUnavailableError(
            f"Drawing graphs as {draw_format} needs Graphviz's `dot` program, which is not on "
            f"PATH: {_INSTALL}. Or use draw_format='dot' (the Graphviz source, pydot alone) or "
            "'txt' (the graphs' code, nothing installed)."
        )


def write_graph(gm: fx.GraphModule, path: Path, name: str, draw_format: str) -> Path:
    """Write ``gm`` to ``path`` (its suffix is set from ``draw_format``); return the path."""
    path = Path(path).with_suffix(f".{draw_format}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if draw_format == "txt":
        path.write_text(gm.print_readable(print_output=False))
        return path
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    dot = FxGraphDrawer(gm, name).get_dot_graph()
    if draw_format == "dot":
        path.write_text(dot.to_string())
    else:
        path.write_bytes(dot.create(format=draw_format))
    return path
