import pytest
from temperature import c_to_f, f_to_c


def test_known_points():
    assert c_to_f(0) == 32.0
    assert c_to_f(100) == 212.0
    assert f_to_c(32) == 0.0
    assert f_to_c(98.6) == 37.0
    assert c_to_f(-40) == -40.0


def test_rounding():
    assert c_to_f(36.6) == 97.88
    assert f_to_c(50.5) == 10.28


def test_absolute_zero():
    assert c_to_f(-273.15) == -459.67
    with pytest.raises(ValueError):
        c_to_f(-300)
    with pytest.raises(ValueError):
        f_to_c(-500)
