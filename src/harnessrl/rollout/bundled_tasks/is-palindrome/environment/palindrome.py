def is_palindrome(text: str) -> bool:
    raise NotImplementedError
