def c_to_f(celsius: float) -> float:
    raise NotImplementedError


def f_to_c(fahrenheit: float) -> float:
    raise NotImplementedError
