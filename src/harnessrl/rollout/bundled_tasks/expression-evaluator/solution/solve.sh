#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'calc.py' <<'HARNESSRL_EOF'
import re

TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(.))")


def tokenize(expression: str) -> list[str]:
    tokens = []
    for number, other in TOKEN.findall(expression):
        if number:
            tokens.append(number)
        elif other.strip():
            if other not in "+-*/()":
                raise ValueError(f"unexpected {other!r}")
            tokens.append(other)
    return tokens


class Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return token

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> float:
        value = self.factor()
        while self.peek() in ("*", "/"):
            value = value * self.factor() if self.take() == "*" else value / self.factor()
        return value

    def factor(self) -> float:
        token = self.take()
        if token == "-":
            return -self.factor()
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise ValueError("expected )")
            return value
        try:
            return float(token)
        except ValueError:
            raise ValueError(f"unexpected {token!r}") from None


def evaluate(expression: str) -> float:
    parser = Parser(tokenize(expression))
    value = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"unexpected {parser.peek()!r}")
    return value
HARNESSRL_EOF
