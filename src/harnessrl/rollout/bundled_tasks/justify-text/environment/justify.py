def justify(text: str, width: int) -> list[str]:
    raise NotImplementedError
