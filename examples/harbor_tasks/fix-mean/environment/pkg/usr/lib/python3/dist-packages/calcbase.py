"""Arithmetic helpers."""


def total(values):
    return float(sum(values))
