"""library/build.py writes each variant's ``symbols.json`` (kernel-builder's format, read by
``kernels describe-api``) by importing the package in a child Python."""

import json
import re

import pytest

from tests.library.test_layout import GOOD, _repo_with, build

PACKAGE = '''
"""Demo kernel."""

from . import layers
from .ops import scale as alias

SCALE = 2
__all__ = ["SCALE", "alias", "layers", "_private"]


def _private():
    pass
'''
OPS = '''
def scale(x: "torch.Tensor", /, factor: float = 2.0, *, out=None) -> "torch.Tensor":
    """Scale ``x``.

    Returns a new tensor."""
    raise AssertionError("building must not call a kernel")
'''
LAYERS = '''
import torch


class Scale(torch.nn.Module):
    """Scale the input."""

    has_backward = True
    can_torch_compile = "yes"

    def forward(self, x):
        raise AssertionError("building must not run a layer")


class _Hidden(torch.nn.Module):
    pass
'''


def _demo(tmp_path, **files):
    return build.read_repository(
        _repo_with(tmp_path, GOOD, {"ops.py": OPS, "layers.py": LAYERS, **files})
    )


def test_symbols_describe_the_exported_functions_and_layers(tmp_path):
    repo = _demo(tmp_path, **{"__init__.py": PACKAGE})
    files = build.build_files(repo)
    ids = {v: json.loads(files[f"{v}/metadata.json"])["id"] for v in repo.variants}
    symbols = json.loads(files["torch-cuda/symbols.json"])
    assert symbols["schema_version"] == 1 and symbols["module"] == ids["torch-cuda"]
    # Constants, the layers module and private names are not functions of the API.
    (function,) = symbols["functions"]
    assert function == {
        "name": "alias",
        "qualname": "scale",
        "module": f"{ids['torch-cuda']}.ops",
        "kind": "function",
        "doc": "Scale ``x``.\n\nReturns a new tensor.",
        "signature": {
            "parameters": [
                {"name": "x", "kind": "POSITIONAL_ONLY", "default": None, "annotation": "'torch.Tensor'"},
                {"name": "factor", "kind": "POSITIONAL_OR_KEYWORD", "default": "2.0", "annotation": "float"},
                {"name": "out", "kind": "KEYWORD_ONLY", "default": "None", "annotation": None},
            ],
            "return_annotation": "'torch.Tensor'",
        },
    }  # fmt: skip
    # layers.py has no __all__: its public classes are its exports; a flag that is not a bool
    # is unknown (None).
    (layer,) = symbols["layers"]
    assert (layer["name"], layer["kind"], layer["doc"]) == ("Scale", "class", "Scale the input.")
    assert layer["attributes"] == {"has_backward": True, "can_torch_compile": None}
    # Each variant describes the package under the module name it is imported as.
    universal = json.loads(files["torch-universal/symbols.json"])
    assert universal["module"] == ids["torch-universal"] != ids["torch-cuda"]
    assert universal["functions"][0]["module"] == f"{ids['torch-universal']}.ops"


def test_the_published_symbols_name_every_layer_of_the_library(published_library):
    """Our repositories' symbols.json, as `kernels upload` publishes them, list the layers
    kernelize maps (as their layers modules define them), flagged as the classes declare."""
    folder = published_library("norm")
    symbols = json.loads((folder / "build" / "torch-cuda" / "symbols.json").read_text())
    names = {layer["name"]: layer["attributes"] for layer in symbols["layers"]}
    assert names["RMSNorm"] == {"has_backward": True, "can_torch_compile": True}
    assert "rms_norm" in {f["name"] for f in symbols["functions"]}


@pytest.mark.parametrize(
    "init,message",
    [
        ("raise RuntimeError('broken kernel')\n", "RuntimeError: broken kernel"),
        ("__all__ = ['missing']\n", "__all__ names 'missing'"),
        ("__all__ = 'scale'\n", "__all__ must be a list or tuple of strings"),
    ],
    ids=["import-error", "missing-export", "bad-all"],
)
def test_a_package_that_cannot_be_described_is_a_build_error(tmp_path, init, message):
    repo = _demo(tmp_path, **{"__init__.py": init})
    with pytest.raises(build.LibraryBuildError, match=re.escape(message)) as exc:
        build.build_files(repo)
    assert "cannot import the package to write symbols.json" in str(exc.value)
