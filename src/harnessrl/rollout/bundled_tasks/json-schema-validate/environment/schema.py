def validate(instance, schema: dict) -> list[str]:
    raise NotImplementedError
