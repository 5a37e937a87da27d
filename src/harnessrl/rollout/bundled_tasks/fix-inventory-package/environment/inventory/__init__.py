from inventory.models import Item, OutOfStock
from inventory.store import Store

__all__ = ["Item", "OutOfStock", "Store"]
