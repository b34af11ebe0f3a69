"""The harness that runs Hugging Face's suite against ours: its list, its merge and its finder.
(The suite itself runs with ``make test-hf-suite``.)"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

import kernels
from tests.hf_suite import expectations, finder, gaps, plugin, update


def _group(category="not-yet", reason="why", tests=("tests/test_a.py::test_x",)):
    return {"category": category, "reason": reason, "tests": list(tests)}


def test_the_committed_list_parses():
    groups = expectations.load()
    assert all(g.tests for g in groups)


@pytest.mark.parametrize(
    "data, message",
    [
        ([_group(category="flaky")], "category 'flaky'"),
        ([_group(reason=" ")], "needs a reason"),
        ([_group(), _group(reason="other")], "listed twice"),
        ([{"category": "gpu", "tests": []}], "exactly category, reason and tests"),
        ({"tests": []}, "a list of groups"),
    ],
)
def test_a_malformed_list_is_refused_naming_the_fault(data, message):
    import yaml

    with pytest.raises(expectations.ListError, match=message):
        expectations.parse(yaml.safe_dump(data))


def test_dump_parses_back_sorted_by_category():
    groups = [
        expectations.Group("not-yet", "later", ["tests/b.py::t", "tests/a.py::t"]),
        expectations.Group("network", expectations.NETWORK_REASON, ["tests/c.py::t"]),
    ]
    back = expectations.parse(expectations.dump(groups))
    assert [(g.category, g.tests) for g in back] == [
        ("network", ["tests/c.py::t"]),
        ("not-yet", ["tests/a.py::t", "tests/b.py::t"]),
    ]
    assert back[0].action == "skip" and back[1].action == "xfail"


def test_update_keeps_reasons_sorts_new_failures_and_drops_passes():
    old = [expectations.Group("private", "mocks their Hub wrapper", ["t::kept", "t::fixed"])]
    ours = {
        "t::kept": {"outcome": "failed", "cause": "anything"},
        "t::fixed": {"outcome": "passed"},
        "t::net": {"outcome": "error", "cause": "offline"},
        "t::new1": {"outcome": "failed", "cause": "AdapterGap: no adapter for x"},
        "t::new2": {"outcome": "collect-error", "cause": "AdapterGap: no adapter for x"},
        "t::skip": {"outcome": "skipped"},
    }
    theirs = {"t::net": {"outcome": "failed"}, "t::new1": {"outcome": "passed"}}
    groups, counts = update.merge(old, ours, theirs)
    got = {(g.category, g.reason): sorted(g.tests) for g in groups}
    assert got == {
        ("private", "mocks their Hub wrapper"): ["t::kept"],
        ("network", expectations.NETWORK_REASON): ["t::net"],
        ("not-yet", "not yet at the 0.19 level: AdapterGap: no adapter for x"): [
            "t::new1",
            "t::new2",
        ],
    }
    assert counts == {"kept": 1, "added": 3, "dropped": 1}


def test_without_their_run_no_failure_is_called_network():
    groups, _ = update.merge([], {"t::a": {"outcome": "failed", "cause": "c"}}, None)
    assert [g.category for g in groups] == ["not-yet"]


def test_causes_group_across_paths_and_addresses():
    def report(message):
        return SimpleNamespace(longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message=message)))

    one = plugin.cause_of(report("OSError: /tmp/a1/x.so at 0xdeadbeef\nmore"))
    two = plugin.cause_of(report("OSError: /var/b2/y.so at 0x1234"))
    assert one == two == "OSError: <path> at <addr>"
    assert plugin.cause_of(report("tests.hf_suite.gaps.AdapterGap: no adapter for a.b")) == (
        "AdapterGap: no adapter for a.b"
    )


@pytest.fixture
def adapters():
    finder.install()
    yield
    sys.meta_path.remove(finder._FINDER)
    for name in [n for n in sys.modules if finder.is_served(n)]:
        del sys.modules[name]
    for attr in ("_internals", "_rust"):
        kernels.__dict__.pop(attr, None)


def test_the_finder_serves_adapters_onto_our_public_api(adapters):
    from kernels._rust import Metadata

    meta = Metadata.from_bytes(b'{"name": "norm", "id": "_norm_abc", "version": 1}')
    assert isinstance(meta, kernels.Metadata)
    assert (meta.name, meta.id, meta.version) == ("norm", "_norm_abc", 1)
    with pytest.raises(ValueError, match="not valid JSON"):
        Metadata.from_bytes(b"{")


def test_a_private_name_without_adapter_fails_where_used_naming_itself(adapters):
    from kernels._internals.nowhere.deeper import helper  # imports: a Gap

    assert isinstance(helper, gaps.Gap)
    with pytest.raises(gaps.AdapterGap, match=r"kernels\._internals\.nowhere\.deeper\.helper"):
        helper(1)
    with pytest.raises(gaps.AdapterGap, match=r"helper\.attr"):
        helper.attr()


def test_the_finder_leaves_our_own_modules_alone():
    assert not finder.is_served("kernels.repos.lock")
    assert not finder.is_served("kernels._internalsx")
    assert finder.is_served("kernels._rust") and finder.is_served("kernels._internals.cli")
