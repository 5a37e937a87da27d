#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
mkdir -p 'bank'
cat > 'bank/account.py' <<'HARNESSRL_EOF'
from bank.errors import AccountFrozen, InsufficientFunds


class Account:
    def __init__(self, owner: str, balance: int = 0, frozen: bool = False) -> None:
        self.owner = owner
        self.balance = balance
        self.frozen = frozen

    def deposit(self, amount: int) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        if self.frozen:
            raise AccountFrozen(self.owner)
        self.balance += amount

    def withdraw(self, amount: int) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        if self.frozen:
            raise AccountFrozen(self.owner)
        if amount > self.balance:
            raise InsufficientFunds(self.owner)
        self.balance -= amount
HARNESSRL_EOF
mkdir -p 'bank'
cat > 'bank/transfer.py' <<'HARNESSRL_EOF'
from bank.account import Account
from bank.errors import AccountFrozen


def transfer(source: Account, target: Account, amount: int) -> None:
    if target.frozen:
        raise AccountFrozen(target.owner)
    source.withdraw(amount)
    target.deposit(amount)
HARNESSRL_EOF
