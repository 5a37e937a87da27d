def build_order(deps: dict[str, list[str]]) -> list[str]:
    raise NotImplementedError
