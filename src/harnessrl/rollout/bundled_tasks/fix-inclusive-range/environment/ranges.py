def inclusive_range(start: int, stop: int, step: int = 1) -> list[int]:
    """Numbers from start to stop, both included, moving by step."""
    return list(range(start, stop, step))
