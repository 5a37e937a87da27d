from schema import validate

SCHEMA = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "required": ["city"],
                    "properties": {"city": {"type": "string"}}},
    },
}


def test_valid():
    assert validate({"name": "a", "age": 3, "tags": ["x"], "role": "user"}, SCHEMA) == []
    assert validate(1.5, {"type": "number"}) == []
    assert validate(None, {"type": "null"}) == []


def test_errors():
    doc = {"name": "", "age": 200, "role": "root", "tags": ["ok", 3],
           "address": {"zip": "1"}}
    assert validate(doc, SCHEMA) == sorted(
        ["$.name", "$.age", "$.role", "$.tags[1]", "$.address.city"])


def test_types():
    assert validate({"age": 1}, SCHEMA) == ["$.name"]
    assert validate([], SCHEMA) == ["$"]
    assert validate({"name": "a", "age": True}, SCHEMA) == ["$.age"]
    assert validate({"name": "a", "age": 1.5}, SCHEMA) == ["$.age"]
    assert validate(True, {"type": "number"}) == ["$"]
    assert validate({"name": "a", "age": 1, "tags": "x"}, SCHEMA) == ["$.tags"]
