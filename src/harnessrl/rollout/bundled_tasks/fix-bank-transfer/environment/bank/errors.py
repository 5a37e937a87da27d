class InsufficientFunds(Exception):
    pass


class AccountFrozen(Exception):
    pass
