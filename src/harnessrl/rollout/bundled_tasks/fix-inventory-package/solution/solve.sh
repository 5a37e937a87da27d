#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
mkdir -p 'inventory'
cat > 'inventory/store.py' <<'HARNESSRL_EOF'
from inventory.models import Item, OutOfStock


class Store:
    def __init__(self) -> None:
        self.items: dict[str, Item] = {}

    def add(self, sku: str, unit_price: float, quantity: int) -> None:
        item = self.items.setdefault(sku, Item(sku, unit_price))
        item.quantity += quantity

    def remove(self, sku: str, quantity: int) -> None:
        item = self.items.get(sku)
        if item is None or item.quantity < quantity:
            raise OutOfStock(sku)
        item.quantity -= quantity

    def total_value(self) -> float:
        return sum(item.unit_price * item.quantity for item in self.items.values())
HARNESSRL_EOF
