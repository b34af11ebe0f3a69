"""Compiling shipped Triton binaries again from the launches they were made for
(``kernels.library.triton_launches``, ``library/binaries.py build`` and ``verify``), without a
GPU: a recorded launch compiles again to the key and code it was captured with; under another
installation's key (another Python) it compiles to the same code under another key, kept as
that Python's set; a changed binary or a launch of other inputs is reported, a change to a
binary's debug information (the paths it was compiled at) is not. Triton compiles for sm_90
here, in a child process without ``TRITON_INTERPRET`` (interpreted kernels cannot be
compiled)."""

import json
import textwrap

import pytest

from kernels.library import triton_launches
from tests.support.children import run_python
from tests.support.paths import REPO_ROOT, subprocess_env

#: What both children start with: the capture tool loaded as the scripts run it, and
#: ``repository(folder, name, kernel source)``, a one-kernel repository written there.
_PRELUDE = textwrap.dedent(
    """
    import importlib.util, json, os, struct, sys
    from dataclasses import replace
    from pathlib import Path

    import torch
    import triton

    from kernels.library import triton_launches as launches

    tmp = Path(sys.argv[1])
    spec = importlib.util.spec_from_file_location("binaries_tool", "library/binaries.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules["binaries_tool"] = tool
    spec.loader.exec_module(tool)


    def repository(folder, name, kernel):
        source = folder / "torch-ext" / name
        source.mkdir(parents=True)
        (folder / "build.toml").write_text(
            f'[general]\\nname = "{name}"\\nversion = 1\\nlicense = "Apache-2.0"\\n'
            'backends = ["cuda"]\\n\\n[torch-noarch]\\n'
        )
        header = "import triton\\nimport triton.language as tl\\n\\n\\n@triton.jit\\n"
        (source / "__init__.py").write_text(header + kernel)
        sys.path.insert(0, str(folder / "torch-ext"))
        return tool.build.read_repository(folder)
    """
)

_CHILD = _PRELUDE + textwrap.dedent(
    """
    folder = tmp / "scalek"
    repo = repository(folder, "scalek", (
        "def _scale_kernel(X, Y, N, stride, BLOCK: tl.constexpr):\\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\\n"
        "    tl.store(Y + offs * stride, tl.load(X + offs, mask=offs < N) * 2.0, mask=offs < N)\\n"
    ))
    import scalek

    def report(verified):
        return verified.lines, verified.ok

    # Two launches as a capture run records them (on a GPU; here Triton stands in for it):
    # an aligned bf16 one, and one whose output starts 2 bytes in, N = 1 and stride 16.
    cache = tmp / "cache"
    cache.mkdir()
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    x = torch.empty(64, dtype=torch.bfloat16)
    compiled = []
    with launches.standing_in_for("cuda:90"), launches.recording(cache):
        compiled.append(scalek._scale_kernel.warmup(x, x, 1000, 3, BLOCK=128, grid=(1,), num_warps=4))
        compiled.append(scalek._scale_kernel.warmup(x, x[1:], 1, 16, BLOCK=64, grid=(1,), num_warps=2))
        compiled.append(scalek._scale_kernel.warmup(x, x, 1000, 3, BLOCK=128, grid=(1,), num_warps=4))
    results = {"captured": sorted(launches.cache_key(c.hash) for c in compiled[:2])}
    results["records"] = [l.to_json() for l in launches.read_records(cache)]
    tool.capture(repo, cache)
    results["launches file"] = json.loads((folder / tool.LAUNCHES).read_text())
    results["same"] = report(tool.verify(repo, scalek))

    # Another Python's set: the same launches under its key (build's child does this).
    other = tool.Installation(triton.__version__, "python9", tmp, "another Triton build", "cpython-399-x86_64-linux-gnu")
    made, problems, _ = tool.replay_all(repo, scalek, tmp / "other", other.key)
    manifest = tool.capture(repo, [tmp / "other"], modules=False, platform=other.platform)
    groups = [g for g in manifest.groups if g.kernel]
    results["other python"] = {
        "made": sorted(made), "problems": problems,
        "platforms": sorted((g.platform, g.key) for g in groups),
    }
    ours = {g.key: g for g in groups}
    def cubin_of(group):
        (file,) = [f for f in group.files if f.name.endswith(".cubin")]
        return folder / "binaries" / tool.shared.stored(file)

    code = {k: tool._code(cubin_of(ours[k]).read_bytes()) for k in ours}
    results["same code"] = len({json.dumps({n: v.hex() for n, v in c.items()}) for c in code.values()})
    results["stored cubins"] = len(list((folder / "binaries" / "files").glob("*.cubin")))
    results["after other python"] = report(tool.verify(repo, scalek))

    def shipped_cubin(key):
        group = next(g for g in groups if g.key == key)
        return cubin_of(group)

    cubin = shipped_cubin(results["captured"][0])
    shipped = cubin.read_bytes()
    data = bytearray(shipped)
    sections = tool._code(shipped)
    start = shipped.index(sections[".text._scale_kernel"])
    data[start + 8] ^= 0xFF  # one byte of the kernel's code
    cubin.write_bytes(bytes(data))
    results["changed code"] = report(tool.verify(repo, scalek))
    cubin.write_bytes(shipped)

    # The paths in the debug information are the machine's: a change there is not a difference.
    # (The manifest's digest would refuse such a file at seeding; verify compares code.)
    shoff, = struct.unpack_from("<Q", shipped, 0x28)
    size, count, names = struct.unpack_from("<HHH", shipped, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", shipped, shoff + i * size) for i in range(count)]
    base = headers[names][4]
    for name_at, _, _, _, offset, length, *_ in headers:
        name = shipped[base + name_at: shipped.index(b"\\0", base + name_at)]
        if name == b".debug_line" and length:
            data = bytearray(shipped)
            data[offset + length - 1] ^= 0xFF
            cubin.write_bytes(bytes(data))
    results["changed debug"] = report(tool.verify(repo, scalek))
    cubin.write_bytes(shipped)

    records = json.loads((folder / tool.LAUNCHES).read_text())
    for entry in records["launches"]:
        entry["options"]["BLOCK"] = {"int": 32}
    (folder / tool.LAUNCHES).write_text(json.dumps(records))
    results["other inputs"] = report(tool.verify(repo, scalek))
    print("RESULTS " + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend")
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)
    tmp = tmp_path_factory.mktemp("launches")
    done = run_python("-c", _CHILD, str(tmp), env=env, cwd=REPO_ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


def test_each_launch_that_compiles_is_recorded_once_with_what_triton_specializes_on(outcome):
    aligned, offset = outcome["records"]
    assert aligned["arguments"][:4] == [
        {"tensor": "bfloat16", "offset": 0},
        {"tensor": "bfloat16", "offset": 0},
        {"int": 1000},
        {"int": 3},
    ]
    assert offset["arguments"][1] == {"tensor": "bfloat16", "offset": 2}
    assert aligned["options"] == {"BLOCK": {"int": 128}, "num_warps": {"int": 4}}
    assert aligned["target"] == "cuda:90" and aligned["module"] == ""
    assert outcome["launches file"]["launches"] == sorted(
        outcome["records"], key=lambda r: json.dumps(r, sort_keys=True)
    )


def test_a_recorded_launch_compiles_again_to_the_captured_key_and_code(outcome):
    lines, ok = outcome["same"]
    assert ok and "2 kernel(s) compiled again to the same binary, 0 differ" in lines[0], lines


def test_another_pythons_set_is_the_same_code_under_its_own_keys(outcome):
    other = outcome["other python"]
    assert other["problems"] == [] and len(other["made"]) == 2
    assert not set(other["made"]) & set(outcome["captured"])
    platforms = other["platforms"]
    assert [p for p, _ in platforms].count("cpython-399-x86_64-linux-gnu") == 2
    assert (
        sorted(k for p, k in platforms if p != "cpython-399-x86_64-linux-gnu")
        == outcome["captured"]
    )
    assert outcome["same code"] == 2  # two launches; each the same code under both keys
    assert outcome["stored cubins"] == 2  # and the same bytes, stored once
    lines, ok = outcome["after other python"]
    assert ok and "2 of other Tritons or Pythons" in lines[0], lines


def test_a_change_to_a_kernels_code_is_reported(outcome):
    lines, ok = outcome["changed code"]
    assert not ok and "1 differ" in lines[0] and "_scale_kernel.cubin's code differs" in lines[1], (
        lines
    )


def test_a_change_to_debug_information_only_is_not_a_difference(outcome):
    lines, ok = outcome["changed debug"]
    assert ok and "0 differ" in lines[0], lines


def test_launches_of_other_inputs_are_reported(outcome):
    lines, ok = outcome["other inputs"]
    assert not ok
    assert sum("no launch record compiles to it" in line for line in lines) == 2, lines
    assert sum("compiles to a kernel not shipped" in line for line in lines) == 2, lines


@pytest.mark.parametrize(
    "value",
    [(1, (2, 3.5)), None, 1.5, 7, "s", True],
    ids=["tuple", "none", "float", "int", "str", "bool"],
)
def test_recorded_arguments_come_back_as_the_same_values(value):
    back = triton_launches.decode(json.loads(json.dumps(triton_launches.encode(value))))
    assert back == value and repr(back) == repr(value)


def test_a_tensor_comes_back_with_its_dtype_and_alignment():
    torch = pytest.importorskip("torch")
    base = torch.empty(32, dtype=torch.float16)
    for start in range(8):
        view = base[start:]
        back = triton_launches.decode(json.loads(json.dumps(triton_launches.encode(view))))
        assert back.dtype == torch.float16
        assert back.data_ptr() % 16 == view.data_ptr() % 16


def test_an_argument_that_cannot_be_recorded_is_refused():
    with pytest.raises(
        triton_launches.LaunchError, match="cannot record an argument of type object"
    ):
        triton_launches.encode(object())


@pytest.mark.parametrize(
    "record",
    [
        {
            "kernel": "k",
            "module": "",
            "arguments": [{"tensor": "bfloat16", "offset": 16}],
            "options": {},
            "target": "cuda:90",
        },
        {
            "kernel": "k",
            "module": "",
            "arguments": [{"eval": "os.system('x')"}],
            "options": {},
            "target": "cuda:90",
        },
        {"kernel": "k", "module": "", "arguments": [], "options": {}, "target": "tpu:1"},
        {"kernel": "k", "module": "", "arguments": [], "options": {}},
    ],
    ids=["offset-out-of-range", "unknown-kind", "unknown-backend", "no-target"],
)
def test_a_malformed_launch_record_is_refused(record):
    with pytest.raises(triton_launches.LaunchError):
        triton_launches.Launch.from_json(record)


# ---- build: the whole step, with this machine's Triton ---------------------------------------

_BUILD_CHILD = _PRELUDE + textwrap.dedent(
    """
    from triton.runtime.cache import triton_key

    version = triton.__version__  # the installation's Triton
    folder = tmp / "library" / "halvek"
    repo = repository(folder, "halvek", (
        "def _halve_kernel(X, N, BLOCK: tl.constexpr):\\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\\n"
        "    tl.store(X + offs, tl.load(X + offs, mask=offs < N) * 0.5, mask=offs < N)\\n"
    ))
    x = torch.empty(16)
    record = launches.Launch("_halve_kernel", "", (launches.encode(x), {"int": 100}), {"BLOCK": {"int": 64}}, "cuda:80")
    (folder / tool.LAUNCHES).write_text(json.dumps({"format": 1, "launches": [record.to_json()]}))

    # This interpreter's Triton, where build would install it (no download here).
    work = tmp / "work"
    tag = sys.implementation.cache_tag
    installed = work / f"triton-{version}" / tag
    installed.mkdir(parents=True)
    (installed / "triton").symlink_to(Path(triton.__file__).parent)
    inst = tool.installation(version, sys.executable, work)
    lines = tool.build_sets([repo], [inst], work)
    manifest, _ = tool.shared.read_manifest(str(folder / "binaries"))
    import halvek
    verified = tool.verify(repo, halvek)
    print("RESULTS " + json.dumps({
        "installation": [inst.triton, inst.platform, inst.key == triton_key()],
        "lines": lines,
        "groups": [[g.kernel, g.target, g.platform] for g in manifest.groups],
        "verified": [verified.lines, verified.ok],
    }))
    """
)


def test_build_compiles_the_launch_records_into_a_set_for_the_installation(tmp_path):
    """``library/binaries.py build`` with this machine's Triton as the installation: its key
    and platform are read from it, the launch is compiled in a child for its target, and the
    set it makes verifies (Triton 3.9 builds no C modules: it has no per-signature launcher)."""
    pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend")
    import triton

    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)
    done = run_python("-c", _BUILD_CHILD, str(tmp_path), env=env, cwd=REPO_ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))
    platform = results["installation"][1]
    assert results["installation"] == [triton.__version__, platform, True]
    assert results["groups"][0] == ["_halve_kernel", "cuda:80", platform]
    assert results["lines"][0].startswith(
        f"halvek: Triton {triton.__version__} {platform}: 1 kernels"
    )
    lines, ok = results["verified"]
    assert ok and "1 kernel(s) compiled again to the same binary" in lines[0], lines


def _tool():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "binaries_tool", REPO_ROOT / "library" / "binaries.py"
    )
    tool = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("binaries_tool", tool)
    spec.loader.exec_module(tool)
    return tool


def test_an_interpreter_that_is_not_there_is_named_with_the_fix(tmp_path):
    tool = _tool()
    with pytest.raises(
        tool.build.LibraryBuildError, match="cannot run the interpreter 'python2.9'.*BINARY_PYTHONS"
    ):
        tool.installation("3.6.0", "python2.9", tmp_path)


def test_an_installation_that_is_not_the_asked_triton_is_refused(tmp_path):
    """A folder holding another Triton than asked (a stale install) is named, not used."""
    import sys

    tool = _tool()
    tag = sys.implementation.cache_tag
    fake = tmp_path / "triton-3.6.0" / tag / "triton"
    (fake / "runtime").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '3.5.0'\n")
    (fake / "runtime" / "__init__.py").write_text("")
    (fake / "runtime" / "cache.py").write_text("def triton_key():\n    return '3.5.0-abc'\n")
    with pytest.raises(tool.build.LibraryBuildError, match="holds Triton 3.5.0, not 3.6.0"):
        tool.installation("3.6.0", sys.executable, tmp_path)


def test_build_makes_the_c_modules_triton_3_6_needs_linked_to_the_driver(tmp_path):
    """Triton 3.6 builds a C launcher per kernel signature and its driver utils on a user's
    first launch; build makes them for the installation's Python, linked to ``libcuda.so.1``
    (a stub here: the user's driver is loaded). Needs Triton 3.6.0 for this interpreter in the
    folder ``KERNELS_TEST_TRITON36`` names (``library/binaries.py build`` installs it under
    ``~/.cache/kernels/binaries-build/triton-3.6.0/<tag>``): it is not installed here."""
    import os

    folder = os.environ.get("KERNELS_TEST_TRITON36")
    if not folder:
        pytest.skip("set KERNELS_TEST_TRITON36 to a folder with Triton 3.6.0 for this Python")
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)
    child = (
        _BUILD_CHILD.replace(
            "installed.mkdir(parents=True)\n",
            "installed.parent.mkdir(parents=True)\n",
        )
        .replace(
            '(installed / "triton").symlink_to(Path(triton.__file__).parent)',
            f"installed.symlink_to({folder!r})",
        )
        .replace("version = triton.__version__", 'version = "3.6.0"')
    )
    child = child.replace(
        "    verified = tool.verify(repo, halvek)\n", "    verified = tool.Verified([], 0, 0)\n"
    )
    done = run_python("-c", child, str(tmp_path), env=env, cwd=REPO_ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    results = json.loads(
        next(l for l in done.stdout.splitlines() if l.startswith("RESULTS ")).removeprefix(
            "RESULTS "
        )
    )
    assert results["lines"][0].endswith("1 kernels, 2 C modules"), results["lines"]
    platform = results["installation"][1]
    binaries = tmp_path / "library" / "halvek" / "binaries"
    manifest = json.loads((binaries / "manifest.json").read_text())
    launchers = [
        binaries / "files" / f"{entry['sha256']}.so"
        for group in manifest["groups"]
        if group.get("module") == "__triton_launcher"
        for name, entry in group["files"].items()
        if name == f"__triton_launcher.{platform}.so" and group["platform"] == platform
    ]
    assert len(launchers) == 1 and launchers[0].is_file()
    needed = subprocess_readelf_needed(launchers[0])
    assert "libcuda.so.1" in needed, needed


def subprocess_readelf_needed(path) -> list[str]:
    import re
    import subprocess

    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout)
