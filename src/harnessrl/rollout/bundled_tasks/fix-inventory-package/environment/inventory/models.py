from dataclasses import dataclass


class OutOfStock(Exception):
    pass


@dataclass
class Item:
    sku: str
    unit_price: float
    quantity: int = 0
