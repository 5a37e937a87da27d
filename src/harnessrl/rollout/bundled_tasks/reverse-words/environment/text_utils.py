def reverse_words(text: str) -> str:
    raise NotImplementedError
