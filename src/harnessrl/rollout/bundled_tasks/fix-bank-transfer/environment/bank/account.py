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
        if self.frozen:
            raise AccountFrozen(self.owner)
        if amount > self.balance:
            raise InsufficientFunds(self.owner)
        self.balance -= amount
