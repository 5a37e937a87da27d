def fee(kind: str, amount: float) -> float:
    """The fee we charge for a payment of `amount` made by `kind`."""
    if kind == "card":
        return round(0.3 + amount * 0.029, 2)
    elif kind == "bank":
        return 0.8 if amount < 1000 else 5.0
    elif kind == "wallet":
        return round(amount * 0.015, 2)
    elif kind == "crypto":
        return round(max(1.0, amount * 0.01), 2)
    else:
        raise ValueError(f"unknown payment kind: {kind}")
