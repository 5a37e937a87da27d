from intervals import merge


def test_merge():
    assert merge([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]
    assert merge([(5, 7), (1, 3), (3, 5)]) == [(1, 7)]
    assert merge([(1, 10), (2, 3), (4, 5)]) == [(1, 10)]


def test_edges():
    assert merge([]) == []
    assert merge([(4, 4)]) == [(4, 4)]
    data = [(3, 4), (1, 2)]
    assert merge(data) == [(1, 2), (3, 4)]
    assert data == [(3, 4), (1, 2)]
