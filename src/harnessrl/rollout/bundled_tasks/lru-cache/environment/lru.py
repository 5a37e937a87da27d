class LRUCache:
    def __init__(self, capacity: int) -> None:
        raise NotImplementedError
