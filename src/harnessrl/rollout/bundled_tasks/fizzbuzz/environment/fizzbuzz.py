def fizzbuzz(n: int) -> list[str]:
    raise NotImplementedError
