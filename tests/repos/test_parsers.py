"""Every parser of files and arguments `kernels` reads gives the package's own error for any input.

Lock files, ``metadata.json``, ``kernel-variants.json``, ``[tool.kernels]`` in pyproject.toml,
version specifiers and build variant names come from projects, downloads and shared caches.
Whatever they hold, reading them either succeeds or raises a `KernelsError` subclass (the
most specific one for the file), never ``TypeError``, ``RecursionError``,
``UnicodeDecodeError`` and the like, and never reads an unbounded amount.

The property tests feed each parser arbitrary bytes and text, arbitrary JSON (or TOML)
values, and mutations of a valid document; the regression tests pin each case that once
escaped as a raw exception.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from kernels import (
    BuildVariant,
    BuildVariantNotFoundError,
    KernelLockError,
    KernelMetadataError,
    KernelsError,
    KernelVersionSpecError,
    Metadata,
    get_local_kernel,
)
from kernels.cli import main
from kernels.repos import bounded_json
from kernels.repos.layout import read_preference
from kernels.repos.lock import (
    MAX_LOCK_SIZE,
    KernelLock,
    lock_source,
    parse_lock,
    read_lockfile,
    write_lockfile,
)
from kernels.repos.project import read_dependencies
from kernels.repos.variants import (
    PREFERENCE_FILE,
    MachineBuild,
    VariantRejected,
    decide_variants,
    parse_preference_file,
    read_preference_file,
)
from kernels.repos.versions import check_version_argument

H100 = MachineBuild(
    torch=Version("2.8"),
    cxx_abi="cxx11",
    backend="cuda",
    backend_version=Version("12.8"),
    cpu="x86_64",
    os="linux",
)

# Bounded time: the whole file runs in seconds, and examples never hit a deadline on a
# loaded machine.
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
VARIANT_HASH = "sha256-" + "ab" * 32
VALID_ENTRY = {
    "repo_id": "kernels-community/activation",
    "repo_type": "kernel",
    "sha": COMMIT,
    "version": ">=0.1,<0.2",
    "ref": "v0.1.3",
    "trust": {"trusted": True, "reason": "organisation kernels-community trusted by default"},
    "variants": {"torch-universal": {"hash": VARIANT_HASH, "hash_type": "git_lfs_concat"}},
    "files": {"torch-universal": {"activation/__init__.py": "git-sha1:" + "1" * 40}},
}
VALID_METADATA = {
    "id": "_activation_cuda_34605e1",
    "name": "activation",
    "version": 1,
    "license": "apache-2.0",
    "python-depends": ["einops"],
    "backend": {"type": "cuda"},
}
VALID_PYPROJECT = """\
[project]
name = "demo"

[tool.kernels.dependencies]
"kernels-community/activation" = ">=0.1,<0.2"
"kernels-community/moe" = 1
"my-org/fused-mlp" = { version = ">=1.0,<2", trust-remote-code = true }
"someone/experiment" = { revision = "main" }
"old-org/mirrored" = { version = ">=0.1", repo-type = "model" }
"""

# --- strategies ------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
# Strings that look like what the parsers expect, so mutations reach the deeper checks.
plausible_strings = st.sampled_from(
    [
        "kernels-community/activation",
        "kernels-community/activation\n",
        "\u212aernels-community/activation",
        "../../etc",
        "torch-universal",
        "torch28-cxx11-cu128-x86_64-linux",
        "torch\u0662\u0668-cu128-x86_64-linux",
        "sha256-" + "0" * 64,
        "git-sha1:" + "0" * 40,
        COMMIT,
        COMMIT + "\n",
        COMMIT.upper(),
        ">=0.1",
        "",
        "\x00",
        "\ud800",
        "a" * 5000,
    ]
)
odd_values = json_values | plausible_strings | st.integers(min_value=10**4000, max_value=10**4200)


def _paths(value, prefix=()):
    """Every path (sequence of keys and indices) into a JSON value, the root included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


def _get(value, path):
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw, document):
    """`document` after a few of: drop a key, change a value (type), insert unicode into a
    string, wrap a value in deeper nesting, duplicate list entries."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        parent = _get(doc, path[:-1]) if path else None
        op = draw(st.sampled_from(["drop", "replace", "unicode", "deepen", "duplicate", "rename"]))
        if not path:
            if op == "deepen":
                doc = [doc] * draw(st.integers(1, 3)) if draw(st.booleans()) else {"x": doc}
            elif op == "replace":
                doc = draw(odd_values)
            continue
        key = path[-1]
        if op == "drop":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(odd_values)
        elif op == "unicode" and isinstance(parent[key], str):
            text = parent[key]
            at = draw(st.integers(0, len(text)))
            parent[key] = text[:at] + draw(st.text(min_size=1, max_size=3)) + text[at:]
        elif op == "deepen":
            value = parent[key]
            for _ in range(draw(st.integers(1, 80))):
                value = [value]
            parent[key] = value
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8) | plausible_strings)] = parent.pop(key)
    return doc


#: What `_outcome` returns when the parser refused its input.
REFUSED = object()


def _outcome(expected: type[KernelsError], parse, *args, **kwargs):
    """Run a parser: its result, or REFUSED when it raised `expected`; anything else (another
    exception) fails the test."""
    try:
        return parse(*args, **kwargs)
    except expected as exc:
        assert str(exc), "errors say what is wrong"
        return REFUSED


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("parsers")


# --- lock files ------------------------------------------------------------------------------


def test_the_valid_documents_parse():
    """The base of the mutations is valid, so the mutations test the checks, not a typo."""
    (lock,) = parse_lock(json.dumps([VALID_ENTRY]), where="kernels.lock")
    assert lock.to_json() == VALID_ENTRY
    assert Metadata.from_dict(VALID_METADATA).name == "activation"


@FAST
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_lock_from_any_bytes(data):
    _outcome(KernelLockError, parse_lock, data, where="kernels.lock")


@FAST
@given(json_values)
def test_lock_from_any_json(value):
    _outcome(KernelLockError, parse_lock, json.dumps(value), where="kernels.lock")
    _outcome(KernelLockError, KernelLock.from_json, value, where="kernels.lock")
    if not isinstance(value, str):  # not a document at all: refused, not misread
        _outcome(KernelLockError, parse_lock, value, where="kernels.lock")


@FAST
@given(mutated([VALID_ENTRY, {**VALID_ENTRY, "repo_id": "kernels-community/other"}]))
def test_lock_from_a_mutated_lock(document):
    locks = _outcome(KernelLockError, parse_lock, json.dumps(document), where="kernels.lock")
    for lock in () if locks is REFUSED else locks:
        # What parses is well formed all the way down: nothing later meets a wrong type.
        assert isinstance(lock.repo_id, str) and isinstance(lock.sha, str) and len(lock.sha) == 40
        assert lock.trust is None or isinstance(lock.trust["trusted"], bool)
        assert all("/" not in name and name.isascii() for name in lock.variants)
        for paths in lock.files.values():
            assert all(".." not in p.split("/") and not p.startswith("/") for p in paths)
        assert KernelLock.from_json(lock.to_json(), where="again") == lock


@FILES
@given(st.binary(max_size=200) | mutated([VALID_ENTRY]).map(lambda d: json.dumps(d).encode()))
def test_lock_file_from_any_bytes(workdir, data):
    path = workdir / "kernels.lock"
    path.write_bytes(data)
    _outcome(KernelLockError, read_lockfile, path)


# --- Hugging Face's lock format (kernels 0.17) -----------------------------------------------

VALID_HF_ENTRY = {
    "dependency": {"repo-id": "kernels-community/activation", "version": 1},
    "lock": {"commit": COMMIT},
}
VALID_HF_REVISION = {
    "dependency": {"repo-id": "kernels-community/other", "revision": "main"},
    "lock": {"commit": COMMIT},
}


def test_the_valid_hf_documents_parse():
    first, second = parse_lock(json.dumps([VALID_HF_ENTRY, VALID_HF_REVISION]), where="x")
    assert (first.sha, first.version, first.ref, first.hashed) == (COMMIT, 1, "v1", False)
    assert (second.version, second.ref, second.repo_type) == (None, "main", "kernel")
    assert [first.to_json(), second.to_json()] == [VALID_HF_ENTRY, VALID_HF_REVISION]


@FAST
@given(mutated([VALID_HF_ENTRY, VALID_HF_REVISION]))
def test_hf_lock_from_a_mutated_lock(document):
    locks = _outcome(KernelLockError, parse_lock, json.dumps(document), where="kernels.lock")
    for lock in () if locks is REFUSED else locks:
        assert isinstance(lock.repo_id, str) and lock.sha == lock.sha.lower()
        assert len(lock.sha) == 40 and int(lock.sha, 16) >= 0
        assert (lock.variants, lock.files, lock.trust) == ({}, {}, None)
        if lock.version is not None:
            assert type(lock.version) is int and lock.ref == f"v{lock.version}"
        else:
            assert isinstance(lock.ref, str) and lock.ref
        assert KernelLock.from_json(lock.to_json(), where="again") == lock


@FAST
@given(json_values, json_values)
def test_hf_lock_from_any_dependency_and_lock(dependency, lock):
    for entry in ({"dependency": dependency, "lock": lock}, {"dependency": dependency}):
        _outcome(KernelLockError, parse_lock, json.dumps([entry]), where="kernels.lock")


@FAST
@given(st.lists(st.booleans(), min_size=1, max_size=6))
def test_a_lock_file_holds_one_format(theirs):
    entries = [
        {**VALID_HF_ENTRY, "dependency": {"repo-id": f"org/k{i}", "version": 1}}
        if hf
        else {**VALID_ENTRY, "repo_id": f"org/k{i}"}
        for i, hf in enumerate(theirs)
    ]
    if len(set(theirs)) == 1:
        locks = parse_lock(json.dumps(entries), where="kernels.lock")
        assert [lock.hashed for lock in locks] == [not hf for hf in theirs]
    else:
        with pytest.raises(KernelLockError, match="mixes Hugging Face's lock format"):
            parse_lock(json.dumps(entries), where="kernels.lock")


def test_write_lockfile_in_either_format(tmp_path):
    ours = parse_lock(json.dumps([VALID_ENTRY]), where="x")
    path = tmp_path / "kernels.lock"
    write_lockfile(path, ours, format="hf")
    assert json.loads(path.read_text()) == [
        # A specifier has no place in their format: the ref it resolved to stands for it.
        {"dependency": {"repo-id": VALID_ENTRY["repo_id"], "revision": "v0.1.3"},
         "lock": {"commit": COMMIT}}
    ]  # fmt: skip
    theirs = read_lockfile(path)
    with pytest.raises(KernelLockError, match="no file hashes were recorded"):
        write_lockfile(tmp_path / "other.lock", theirs)
    with pytest.raises(KernelLockError, match="Unknown lock format"):
        write_lockfile(tmp_path / "other.lock", ours, format="toml")
    assert not (tmp_path / "other.lock").exists()
    model = dataclasses.replace(ours[0], repo_type="model")
    with pytest.raises(KernelLockError, match="model repository"):
        write_lockfile(tmp_path / "other.lock", [model], format="hf")


def test_pyproject_int_versions_mean_branches(tmp_path):
    (tmp_path / "pyproject.toml").write_text(VALID_PYPROJECT)
    by_repo = {dep.repo_id: dep for dep in read_dependencies(tmp_path)}
    assert by_repo["kernels-community/moe"].version == 1  # their [tool.kernels] form
    assert by_repo["kernels-community/moe"].requirement == "1"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**VALID_HF_ENTRY, "variants": {}}, "unknown key(s) 'variants'"),
        ({"dependency": {**VALID_HF_ENTRY["dependency"], "x": 1}, "lock": {"commit": COMMIT}},
         "'dependency' has unknown key(s) 'x'"),
        ({"dependency": VALID_HF_ENTRY["dependency"], "lock": {"commit": COMMIT, "hash": "h"}},
         "'lock' has unknown key(s) 'hash'"),
        ({"dependency": VALID_HF_ENTRY["dependency"]}, "needs 'dependency' and 'lock' objects"),
        ({"dependency": [], "lock": {"commit": COMMIT}}, "needs 'dependency' and 'lock'"),
        ({"dependency": {"repo-id": "a/b", "version": 1, "revision": "main"},
          "lock": {"commit": COMMIT}}, "must give one of 'version'"),
        ({"dependency": {"repo-id": "a/b"}, "lock": {"commit": COMMIT}}, "must give one of"),
        ({"dependency": {"repo_id": "a/b", "version": 1}, "lock": {"commit": COMMIT}},
         "unknown key(s) 'repo_id'"),
        ({"dependency": {"repo-id": "../b", "version": 1}, "lock": {"commit": COMMIT}},
         "is not a Hub repository id"),
        ({"dependency": {"repo-id": "a/b", "version": True}, "lock": {"commit": COMMIT}},
         "is an int N"),
        ({"dependency": {"repo-id": "a/b", "version": "1"}, "lock": {"commit": COMMIT}},
         "is an int N"),
        ({"dependency": {"repo-id": "a/b", "version": -1}, "lock": {"commit": COMMIT}},
         "names no branch"),
        ({"dependency": {"repo-id": "a/b", "revision": ""}, "lock": {"commit": COMMIT}},
         "'revision' must be a branch, tag or commit"),
        ({"dependency": {"repo-id": "a/b", "revision": None}, "lock": {"commit": COMMIT}},
         "'revision' is null"),
        ({"dependency": {"repo-id": "a/b", "version": 1}, "lock": {"commit": "0" * 64}},
         "not a commit hash"),
        ({"dependency": {"repo-id": "a/b", "version": 1}, "lock": {"commit": COMMIT[:12]}},
         "not a commit hash"),
    ],
)  # fmt: skip
def test_cli_reports_a_malformed_hf_lock_in_one_line(tmp_path, capsys, monkeypatch, entry, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a lock that passed would not reach the Hub
    (tmp_path / "kernels.lock").write_text(json.dumps([entry]))
    assert main(["download", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and "kernels lock PROJECT_DIR" in err


def test_hf_commits_are_read_in_any_case_as_their_parser_reads_them():
    entry = {**VALID_HF_ENTRY, "lock": {"commit": COMMIT.upper()}}
    (lock,) = parse_lock(json.dumps([entry]), where="x")
    assert lock.sha == COMMIT and lock.to_json() == VALID_HF_ENTRY


# --- metadata.json ---------------------------------------------------------------------------


@FAST
@given(json_values | mutated(VALID_METADATA))
def test_metadata_from_any_json(value):
    meta = _outcome(KernelMetadataError, Metadata.from_dict, value, where="metadata.json")
    if meta is not REFUSED:
        assert meta.version is None or type(meta.version) is int
        assert all(isinstance(d, str) for d in meta.python_depends)


@FILES
@given(
    st.binary(max_size=200)
    | json_values.map(lambda v: json.dumps(v).encode())
    | mutated(VALID_METADATA).map(lambda d: json.dumps(d).encode())
)
def test_metadata_file_from_any_bytes(workdir, data):
    (workdir / "metadata.json").write_bytes(data)
    _outcome(KernelMetadataError, Metadata.load_from_variant, workdir)


# --- kernel-variants.json --------------------------------------------------------------------


@FAST
@given(
    st.binary(max_size=100)
    | st.text(max_size=100)
    | json_values.map(json.dumps)
    | json_values
    | mutated({"prefer": "noarch"}).map(json.dumps)
)
def test_preference_from_any_input(data):
    prefer = _outcome(BuildVariantNotFoundError, parse_preference_file, data, where="org/k")
    assert prefer in (REFUSED, "compiled", "noarch")


@FILES
@given(
    st.binary(max_size=100) | mutated({"prefer": "noarch"}).map(lambda d: json.dumps(d).encode())
)
def test_preference_file_from_any_bytes(workdir, data):
    (workdir / PREFERENCE_FILE).write_bytes(data)
    _outcome(BuildVariantNotFoundError, read_preference_file, workdir / PREFERENCE_FILE, where="k")


# --- build variant names ---------------------------------------------------------------------

variant_names = st.text(max_size=60) | st.builds(
    "-".join,
    st.lists(
        st.sampled_from(
            ["torch", "torch28", "torch2" + "1" * 5000, "stable", "abi29", "tvm", "ffi01",
             "cxx11", "cu128", "cu", "rocm63", "xpu20251", "cpu", "x86_64", "linux", "\u0662"]
        ),
        max_size=7,
    ),
)  # fmt: skip


@FAST
@given(variant_names | json_values)
def test_variant_names_from_anything(name):
    variant = _outcome(KernelMetadataError, BuildVariant.parse, name)
    assert variant is REFUSED or variant.variant_str == name
    if isinstance(name, str):
        # Listing a folder of that name reports it (accepted or rejected), never raises.
        decide_variants([name], machine=H100)


# --- pyproject.toml --------------------------------------------------------------------------


def _toml(value) -> str:
    """A TOML value for a JSON-like Python value (JSON strings are TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return '"null"'  # TOML has no null


@st.composite
def pyprojects(draw):
    kind = draw(st.sampled_from(["entries", "bytes", "edit"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "edit":
        text = VALID_PYPROJECT
        at = draw(st.integers(0, len(text)))
        end = draw(st.integers(at, min(len(text), at + 10)))
        return (text[:at] + draw(st.text(max_size=5)) + text[end:]).encode("utf-8", "surrogatepass")
    entries = draw(
        st.dictionaries(
            st.text(max_size=12) | plausible_strings,
            odd_values
            | mutated({"version": ">=1", "trust-remote-code": True, "repo-type": "model"}),
            max_size=3,
        )
    )
    lines = [f"{json.dumps(k)} = {_toml(v)}" for k, v in entries.items()]
    header = draw(
        st.sampled_from(
            [
                "[tool.kernels.dependencies]",
                "[tool.kernels]\ndependencies = 1",
                "[tool]\nkernels = []",
            ]
        )
    )
    return "\n".join([header, *lines, ""]).encode("utf-8", "surrogatepass")


@FILES
@given(pyprojects())
def test_pyproject_from_any_input(workdir, data):
    (workdir / "pyproject.toml").write_bytes(data)
    deps = _outcome(KernelLockError, read_dependencies, workdir)
    for dep in () if deps is REFUSED else deps:
        assert dep.revision is None or isinstance(dep.revision, str)
        assert dep.version is None or isinstance(dep.version, (str, int))


# --- version specifiers ----------------------------------------------------------------------


@FAST
@given(
    json_values
    | st.text(alphabet="<>=!~*.,0123456789abcrpostdev+ v", max_size=40)
    | st.text(min_size=990, max_size=1100)
    | st.integers(min_value=-(10**4200), max_value=10**4200)
)
def test_version_specifiers_from_anything(version):
    _outcome(KernelVersionSpecError, check_version_argument, version, repo_id="org/k")


# --- the shared bounded JSON reader ----------------------------------------------------------


@FAST
@given(json_values, st.integers(0, 100))
def test_depth_scan_matches_the_nesting(value, extra):
    nested = value
    for _ in range(extra):
        nested = [nested]
    text = json.dumps(nested)

    def depth(v):  # recursion is fine here: the values are at most ~110 deep
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        return 0

    assert bounded_json.json_depth(text) == depth(nested)
    parsed = _outcome(
        KernelLockError,
        bounded_json.parse_json,
        text,
        where="x",
        error=KernelLockError,
        limit=MAX_LOCK_SIZE,
    )
    assert (parsed is REFUSED) == (depth(nested) > bounded_json.MAX_DEPTH)


# --- regressions: each of these once escaped as a raw exception ------------------------------


def _lock_dir(tmp_path, entry) -> str:
    (tmp_path / "kernels.lock").write_text(json.dumps([entry]))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trust": "yes"}, "'trust' must be an object"),
        ({"trust": {"trusted": "yes"}}, "'trust' must be an object"),
        ({"repo_id": 42}, "repo_id 42 is not a Hub repository id"),
        ({"repo_id": "\u212aernels-community/activation"}, "is not a Hub repository id"),
        ({"sha": COMMIT + "\n"}, "not a commit hash"),
        ({"variants": []}, "'variants' must be an object"),
        ({"variants": {"../../x": {"hash": VARIANT_HASH}}}, "is not a build variant name"),
        ({"variants": {"torch-universal": "sha256-0"}}, "must be an object with a 'hash'"),
        ({"files": {"torch-universal": {"../setup.py": "git-sha1:" + "0" * 40}}}, "relative path"),
        ({"files": {"torch-cuda": {}}}, "not one of the entry's variants"),
        ({"version": [1]}, "version must be a PEP 440 specifier"),
        ({"ref": {"v": 1}}, "'ref' must be the tag or branch"),
    ],
)
def test_cli_reports_a_malformed_lock_in_one_line(tmp_path, capsys, monkeypatch, change, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a lock that passed would not reach the Hub
    assert main(["download", _lock_dir(tmp_path, {**VALID_ENTRY, **change})]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and "kernels lock PROJECT_DIR" in err


def test_deeply_nested_lock_is_refused_without_recursing(tmp_path):
    path = tmp_path / "kernels.lock"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(KernelLockError, match="100000 levels deep; at most 64"):
        read_lockfile(path)
    # Also when the caller's stack is nearly used up: the scan does not recurse.
    limit = sys.getrecursionlimit()

    def near_the_limit(n):
        if n:
            return near_the_limit(n - 1)
        with pytest.raises(KernelLockError):
            read_lockfile(path)

    near_the_limit(limit - 100)


def _padded(path, open_, close, size):
    """Write a valid JSON (or TOML) document of exactly `size` bytes."""
    path.write_bytes(open_ + b" " * (size - len(open_) - len(close)) + close)


def test_lock_size_is_bounded(tmp_path):
    path = tmp_path / "kernels.lock"
    _padded(path, b"[", b"]", MAX_LOCK_SIZE + 1)
    with pytest.raises(KernelLockError) as caught:
        read_lockfile(path)
    assert f"{path} is {MAX_LOCK_SIZE + 1} bytes" in str(caught.value)
    assert "at most 4 MiB" in str(caught.value)
    _padded(path, b"[", b"]", MAX_LOCK_SIZE)
    assert read_lockfile(path) == []


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_files_of_no_stated_size_are_read_only_up_to_the_bound():
    """/dev/zero reports size 0 and never ends: only the bound stops the read."""
    with pytest.raises(KernelLockError, match="more than that; .* at most 4 MiB"):
        read_lockfile(Path("/dev/zero"))
    with pytest.raises(KernelMetadataError, match="at most 1 MiB"):
        Metadata.read_from_file("/dev/zero")
    with pytest.raises(BuildVariantNotFoundError, match="at most 1 MiB"):
        read_preference_file("/dev/zero", where="org/kernel")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"repo_id": "a/b", "repo_id": "c/d"}]', "gives the key 'repo_id' twice"),
        ("[NaN]", "contains NaN"),
        ("\ufeff[]", "byte-order mark"),
        ("[" + "1" * 5000 + "]", "not valid JSON"),
        (
            json.dumps([VALID_ENTRY, {**VALID_ENTRY, "repo_id": "Kernels-Community/Activation"}]),
            "twice",
        ),
    ],
)
def test_ambiguous_lock_documents_are_refused(text, message):
    with pytest.raises(KernelLockError, match=message):
        parse_lock(text, where="kernels.lock")


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"[\xff]", "not UTF-8"), (b"[" * 10_000, "levels deep"), (b'[{"trust": 1}]', "lacks")],
)
def test_a_distributions_malformed_lock_is_a_lock_error(tmp_path, monkeypatch, content, message):
    """A lock shipped in a wheel's metadata is read like a lock file."""
    name = f"parsers_app_{zlib.crc32(content)}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    dist_info = tmp_path / f"{name}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist_info / "top_level.txt").write_text(f"{name}\n")
    (dist_info / "kernels.lock").write_bytes(content)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KernelLockError, match=message) as caught:
        lock_source(None, caller=name)
    assert f"kernels.lock of distribution {name}" in str(caught.value)


def test_a_lock_that_would_not_read_back_is_not_written(tmp_path):
    """The values of a new lock come from the Hub's listing: a path it should never give is
    refused before anything is written."""
    (good,) = parse_lock(json.dumps([VALID_ENTRY]), where="kernels.lock")
    bad = dataclasses.replace(
        good, files={"torch-universal": {"../evil.py": "git-sha1:" + "0" * 40}}
    )
    path = tmp_path / "kernels.lock"
    with pytest.raises(KernelLockError, match="relative path"):
        write_lockfile(path, [bad])
    assert not path.exists()
    write_lockfile(path, [good])
    assert read_lockfile(path) == [good]


def test_lock_that_is_not_utf8_is_a_lock_error(tmp_path):
    path = tmp_path / "kernels.lock"
    path.write_bytes(b'[{"repo_id": "\xff"}]')
    with pytest.raises(KernelLockError, match="not UTF-8"):
        read_lockfile(path)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe{}", b"[" * 50_000, b'{"backend": {"type": 7}}', b'{"a": 1, "a": 2}'],
)
def test_malformed_metadata_is_a_metadata_error(tmp_path, content):
    (tmp_path / "metadata.json").write_bytes(content)
    with pytest.raises(KernelMetadataError) as caught:
        Metadata.load_from_variant(tmp_path)
    assert str(tmp_path / "metadata.json") in str(caught.value)


def test_metadata_size_is_bounded(tmp_path):
    _padded(tmp_path / "metadata.json", b"{", b"}", 1024 * 1024 + 1)
    with pytest.raises(KernelMetadataError, match="at most 1 MiB"):
        Metadata.load_from_variant(tmp_path)


def test_malformed_metadata_gives_the_same_answer_on_every_load(kernel_repo):
    """Loading a kernel whose metadata.json is malformed either fails with the package's error
    every time, leaving nothing imported, or succeeds every time with the same module; it
    never fails once and then returns a module registered by the failed attempt."""
    path = kernel_repo("badmeta", package=None)
    (path / "build" / "torch-universal" / "metadata.json").write_bytes(b"\xff" + b"[" * 10_000)
    before = set(sys.modules)
    first = _outcome(KernelsError, get_local_kernel, path)
    if first is REFUSED:
        assert set(sys.modules) == before
    assert _outcome(KernelsError, get_local_kernel, path) is first


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000, "levels deep"),
        (b'{"prefer": "\xff"}', "not UTF-8"),
        (b'{"prefer": 1}', "got 1"),
    ],
)
def test_malformed_preference_file_is_a_variant_error(tmp_path, content, message):
    (tmp_path / PREFERENCE_FILE).write_bytes(content)
    with pytest.raises(BuildVariantNotFoundError, match=message):
        read_preference(tmp_path, where="org/kernel")


@pytest.mark.parametrize(
    "name",
    [None, 42, ["torch-universal"], "torch2" + "1" * 5000 + "-cu128-x86_64-linux",
     "torch\u0662\u0668-cu128-x86_64-linux", "torch28-cu\u0661\u0662\u0668-x86_64-linux",
     "torch-stable-abi29-cu128-x86_64-linux\n"],
)  # fmt: skip
def test_variant_names_of_any_type_are_a_metadata_error(name):
    with pytest.raises(KernelMetadataError, match="is not a build variant name"):
        BuildVariant.parse(name)
    if isinstance(name, str):
        # A folder of that name is reported as rejected, or not taken for a variant at all.
        assert all(isinstance(d, VariantRejected) for d in decide_variants([name], machine=H100))


@pytest.mark.parametrize(
    ("pyproject", "message"),
    [
        (b"tool = 1\n", r"\[tool\] in .* must be a table, not an integer"),
        (b"[tool]\nkernels = []\n", r"\[tool.kernels\] .* must be a table, not an array"),
        (b"[tool.kernels.dependencies]\n'a/b' = '\xff'\n", "not UTF-8"),
        (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "too deeply"),
        (b"x = " + b"1" * 5000 + b"\n", "not valid TOML"),
        (b"[tool.kernels.dependencies]\n'not an id' = '>=1'\n", "is not a Hub repository id"),
        (b"[tool.kernels.dependencies]\n'a/b' = { revision = 3 }\n", "revision must be a branch"),
        (
            b"[tool.kernels.dependencies]\n'a/b' = { trust-remote-code = 'yes' }\n",
            "trust-remote-code must",
        ),
        (
            b"[tool.kernels.dependencies]\n'a/b' = { trust-remote-code = {x = 1} }\n",
            "trust-remote-code must",
        ),
        (
            b"[tool.kernels.dependencies]\n'a/b' = { repo-type = 'model', repo_type = 'kernel' }\n",
            "gives both",
        ),
        (b"[tool.kernels.dependencies]\n'a/b' = 1979-05-27\n", "got a date or time"),
        (b"[tool.kernels.dependencies]\n'a/b' = -" + b"9" * 4000 + b"\n", "names no branch"),
    ],
)
def test_malformed_pyproject_is_a_lock_error(tmp_path, pyproject, message):
    (tmp_path / "pyproject.toml").write_bytes(pyproject)
    with pytest.raises(KernelLockError, match=message):
        read_dependencies(tmp_path)


def test_pyproject_size_is_bounded(tmp_path):
    _padded(tmp_path / "pyproject.toml", b"#", b"\n", 4 * 1024 * 1024 + 1)
    with pytest.raises(KernelLockError, match="at most 4 MiB"):
        read_dependencies(tmp_path)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (-(10**5000), "an integer too long to show"),
        (10**5000, "must be from 0 to"),
        (">=1," * 300, "at most 1000"),
        (1.5, "got 1.5"),
    ],
    ids=["huge-negative-int", "huge-int", "long-string", "float"],
)
def test_version_arguments_of_any_size_are_a_version_error(version, message):
    with pytest.raises(KernelVersionSpecError, match=message):
        check_version_argument(version, repo_id="org/kernel")


def test_hf_lock_of_one_repository_twice_is_refused():
    # Their format allows it (two versions reached through kernel-depends); a load by id
    # could not tell which entry it means.
    second = {**VALID_HF_ENTRY, "dependency": {**VALID_HF_ENTRY["dependency"], "version": 2}}
    with pytest.raises(KernelLockError, match="twice"):
        parse_lock(json.dumps([VALID_HF_ENTRY, second]), where="kernels.lock")
