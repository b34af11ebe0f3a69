"""transformers 5.x's own kernel mapping, served as today's Hub serves it: every repository it
names is a `kernel` repository, and every entry resolves there (version branches, named
revisions) and offers a build this machine runs. Runs in the transformers 5.x environment."""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict

import pytest
from packaging.version import Version

transformers = pytest.importorskip("transformers")
if Version(transformers.__version__).major < 5:
    pytest.skip(
        f"transformers {transformers.__version__}: the default mapping is transformers 5.x's",
        allow_module_level=True,
    )

import kernels  # noqa: E402
from kernels.repos.hubclient import COMMIT_PATTERN, repo_cache_folder  # noqa: E402
from kernels.repos.versions import resolve_revision  # noqa: E402

pytestmark = pytest.mark.hub


def _hub_kernels():
    from transformers.integrations import hub_kernels
    from transformers.utils.import_utils import is_kernels_available

    assert is_kernels_available(), (
        f"transformers {transformers.__version__} treats our kernels {kernels.__version__} as "
        "absent (outside its KERNELS_MIN_VERSION/KERNELS_MAX_VERSION window)"
    )
    return hub_kernels


def _repositories(mapping):
    for value in mapping.values():
        if isinstance(value, dict):
            yield from _repositories(value)
        else:
            yield value


def _entries():
    """(repo_id, revision, version, layer or function name) of every default Hub kernel."""
    hub_kernels = _hub_kernels()
    found = {
        (r.repo_id, r.revision, r.version, r.layer_name)
        for r in _repositories(hub_kernels.get_kernel_mapping_transformers())
    }
    for entry in hub_kernels._HUB_KERNEL_MAPPING.values():
        revision, version = entry.get("revision"), entry.get("version")
        found.add((entry["repo_id"], revision, version if revision or version else 1, None))
    return sorted(found, key=str)


def _package_source(names: set[str]) -> tuple[str, str]:
    """An __init__.py and a layers.py that define every named layer class and function."""
    classes = sorted(n for n in names if n[:1].isupper())
    functions = sorted(n for n in names if not n[:1].isupper())
    layers = "import torch\n\n" + "".join(
        f"\nclass {name}(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
        for name in classes
    )
    init = "from . import layers\n" + "".join(
        f"\n\ndef {name}(*args, **kwargs):\n    return args[0] if args else None\n"
        for name in functions
    )
    return textwrap.dedent(init), layers


def test_every_default_hub_kernel_resolves_to_a_kernel_repository(hub):
    entries = _entries()
    assert entries, "transformers 5.x lists no Hub kernels"
    by_repo = defaultdict(list)
    for entry in entries:
        by_repo[entry[0]].append(entry)
    pinned_commits = []
    for repo_id, repo_entries in by_repo.items():
        names = {name for *_, name in repo_entries if name}
        init, layers = _package_source(names)
        repo = hub.repo(repo_id)
        # On a branch of its own: other tests of the session may publish the same repository.
        published = bool(repo.git("branch", "--list", "main"))
        repo.git("checkout", "-q", "--orphan", "transformers-defaults")
        repo.git("rm", "-rq", "--cached", "--ignore-unmatch", ".")
        package = re.sub(r"\W", "_", repo_id.split("/")[1])
        repo.write(f"build/torch-universal/{package}/__init__.py", init)
        repo.write(f"build/torch-universal/{package}/layers.py", layers)
        repo.commit("kernel")
        for _, revision, version, _ in repo_entries:
            if isinstance(version, int):
                repo.branch(f"v{version}")
            elif revision is not None and not COMMIT_PATTERN.match(revision):
                repo.branch(revision)
        if published:
            repo.git("checkout", "-q", "-f", "main")

    for repo_id, revision, version, _name in entries:
        if revision is not None and COMMIT_PATTERN.match(revision):
            pinned_commits.append(repo_id)  # a commit of theirs cannot be recreated here
            continue
        resolved = resolve_revision(repo_id, revision=revision, version=version)
        assert resolved.repo_type == "kernel"
        assert kernels.has_kernel(repo_id, revision=revision, version=version), repo_id

    # A trusted organisation's kernel downloads into the kernel type's cache.
    repo_id, revision, version, _ = next(
        e for e in entries if e[0].startswith("kernels-community/")
    )
    module = kernels.get_kernel(repo_id, revision=revision, version=version)
    assert str(repo_cache_folder(repo_id, "kernel")) in module.__file__
    assert len(pinned_commits) < len(entries)
