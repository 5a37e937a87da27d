import calcbase


def mean(values):
    return calcbase.total(values) / 2
