import pytest
from inventory import OutOfStock, Store


def make():
    store = Store()
    store.add("apple", 0.5, 10)
    store.add("pear", 2.0, 3)
    return store


def test_total():
    assert make().total_value() == pytest.approx(11.0)


def test_remove():
    store = make()
    store.remove("apple", 4)
    assert store.items["apple"].quantity == 6
    assert store.total_value() == pytest.approx(9.0)


def test_remove_too_many():
    store = make()
    with pytest.raises(OutOfStock):
        store.remove("pear", 4)
    assert store.items["pear"].quantity == 3
    with pytest.raises(OutOfStock):
        store.remove("plum", 1)
