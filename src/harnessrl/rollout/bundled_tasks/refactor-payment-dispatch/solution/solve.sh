#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'payments.py' <<'HARNESSRL_EOF'
def _bank(amount: float) -> float:
    return 0.8 if amount < 1000 else 5.0


FEES = {
    "card": lambda amount: round(0.3 + amount * 0.029, 2),
    "bank": _bank,
    "wallet": lambda amount: round(amount * 0.015, 2),
    "crypto": lambda amount: round(max(1.0, amount * 0.01), 2),
}


def fee(kind: str, amount: float) -> float:
    """The fee we charge for a payment of `amount` made by `kind`."""
    try:
        compute = FEES[kind]
    except KeyError:
        raise ValueError(f"unknown payment kind: {kind}") from None
    return compute(amount)
HARNESSRL_EOF
