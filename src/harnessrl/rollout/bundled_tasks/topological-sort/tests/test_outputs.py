import pytest
from toposort import CycleError, build_order


def test_order():
    deps = {"app": ["web", "db"], "web": ["http", "json"], "db": ["json"], "http": []}
    assert build_order(deps) == ["http", "json", "db", "web", "app"]


def test_independent_sorted():
    assert build_order({"c": [], "b": [], "a": []}) == ["a", "b", "c"]
    assert build_order({}) == []


def test_cycle():
    with pytest.raises(CycleError) as info:
        build_order({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})
    assert issubclass(CycleError, ValueError)
    assert all(name in str(info.value) for name in "abc")


def test_self_cycle():
    with pytest.raises(CycleError):
        build_order({"x": ["x"]})
