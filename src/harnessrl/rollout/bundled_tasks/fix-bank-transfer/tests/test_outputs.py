import pytest
from bank.account import Account
from bank.errors import AccountFrozen, InsufficientFunds
from bank.transfer import transfer


def test_transfer():
    a, b = Account("a", 100), Account("b", 5)
    transfer(a, b, 30)
    assert (a.balance, b.balance) == (70, 35)


def test_frozen_target_changes_nothing():
    a, b = Account("a", 100), Account("b", 5, frozen=True)
    with pytest.raises(AccountFrozen):
        transfer(a, b, 30)
    assert (a.balance, b.balance) == (100, 5)


def test_insufficient():
    a, b = Account("a", 10), Account("b")
    with pytest.raises(InsufficientFunds):
        transfer(a, b, 11)
    assert (a.balance, b.balance) == (10, 0)


def test_non_positive():
    a = Account("a", 10)
    for bad in (0, -5):
        with pytest.raises(ValueError):
            a.withdraw(bad)
        with pytest.raises(ValueError):
            a.deposit(bad)
    assert a.balance == 10
