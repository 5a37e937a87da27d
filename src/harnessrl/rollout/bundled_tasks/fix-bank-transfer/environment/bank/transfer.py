from bank.account import Account


def transfer(source: Account, target: Account, amount: int) -> None:
    source.withdraw(amount)
    target.deposit(amount)
