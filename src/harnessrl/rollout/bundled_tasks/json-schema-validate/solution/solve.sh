#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'schema.py' <<'HARNESSRL_EOF'
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
CHECKS = [
    ("type", lambda v, t: TYPES[t](v)),
    ("enum", lambda v, options: v in options),
    ("minimum", lambda v, m: v >= m),
    ("maximum", lambda v, m: v <= m),
    ("minLength", lambda v, m: len(v) >= m),
]


def _check(value, schema: dict, path: str, errors: list[str]) -> None:
    for keyword, ok in CHECKS:
        if keyword in schema and not ok(value, schema[keyword]):
            errors.append(path)
            return
    if isinstance(value, dict):
        for name in schema.get("required", ()):
            if name not in value:
                errors.append(f"{path}.{name}")
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                _check(value[name], sub, f"{path}.{name}", errors)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", errors)


def validate(instance, schema: dict) -> list[str]:
    errors: list[str] = []
    _check(instance, schema, "$", errors)
    return sorted(errors)
HARNESSRL_EOF
