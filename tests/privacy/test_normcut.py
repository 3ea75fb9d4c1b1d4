"""NormCut (PrivTrace App. B.6, Algorithm 2): the paper's example, a literal port as oracle, properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from duckmob.errors import DuckmobError
from duckmob.privacy.normcut import normcut


def algorithm2(v):
    """Algorithm 2 line by line (the oracle)."""
    v = [float(a) for a in v]
    n = sum(a for a in v if a < 0)
    p = sum(a for a in v if a > 0)
    while n != 0 and p != 0:
        s = min((i for i, a in enumerate(v) if a > 0), key=lambda i: (v[i], i))
        temp = v[s] + n
        if temp < 0:
            n = temp
            p = p - v[s]
            v[s] = 0.0
        else:
            n = 0
            v[s] = temp
        if not any(a > 0 for a in v):
            break
    return [max(a, 0.0) for a in v]


def test_paper_example():
    assert normcut(np.array([-5.0, 1.0, 7.0])).tolist() == [0.0, 0.0, 3.0]


def test_rows_and_axis():
    x = np.array([[-5.0, 1.0, 7.0], [1.0, -3.0, 1.0], [2.0, 0.0, 5.0]])
    assert normcut(x).tolist() == [[0, 0, 3], [0, 0, 0], [2, 0, 5]]
    assert normcut(x.T, axis=0).tolist() == normcut(x).T.tolist()
    cube = np.random.default_rng(0).normal(size=(4, 5, 6))
    for axis in range(3):
        ref = np.apply_along_axis(algorithm2, axis, cube)
        np.testing.assert_allclose(normcut(cube, axis=axis), ref, atol=1e-12)


def test_dtypes_and_empty():
    assert normcut(np.array([-1, 2, 3])).dtype == np.float64
    assert normcut(np.array([-1, 2, 3], dtype=np.float32)).dtype == np.float32
    assert normcut(np.zeros((0, 3))).shape == (0, 3)
    assert normcut(np.zeros((3, 0))).shape == (3, 0)


def test_bad_input():
    with pytest.raises(DuckmobError, match="NaN"):
        normcut(np.array([1.0, np.nan]))
    with pytest.raises(DuckmobError, match="scalar"):
        normcut(np.float64(3))


def test_blocks_match_one_pass(monkeypatch):
    import duckmob.privacy.normcut as mod

    x = np.random.default_rng(1).laplace(size=(50, 7))
    whole = normcut(x)
    monkeypatch.setattr(mod, "_BLOCK", 10)
    assert np.array_equal(normcut(x), whole)


values = st.floats(-100, 100, allow_nan=False, width=32).map(lambda a: round(a, 2))


@settings(max_examples=300, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 9)), elements=values))
def test_properties(x):
    out = normcut(x)
    assert (out >= 0).all()
    for row, new in zip(x, out):
        np.testing.assert_allclose(new, algorithm2(row), atol=1e-9)
        pos, neg = row[row > 0].sum(), -row[row < 0].sum()
        if pos >= neg:
            assert new.sum() == pytest.approx(row.sum(), abs=1e-9)  # total preserved when coverable
        else:
            assert (new == 0).all()  # uncoverable rows become zeros
        assert (new <= np.maximum(row, 0) + 1e-12).all()  # only ever removes mass
        assert (new[row <= 0] == 0).all()
        # order of kept values: larger inputs never end below smaller ones
        i, j = np.meshgrid(np.arange(len(row)), np.arange(len(row)))
        assert (new[i][row[i] < row[j]] <= new[j][row[i] < row[j]] + 1e-9).all()
        # entries larger than the one cut partially are untouched
        changed = (new != np.maximum(row, 0))
        if changed.any() and new.sum() > 0:
            assert (new[row > row[changed].max()] == row[row > row[changed].max()]).all()


def test_ties_are_cut_in_index_order():
    assert normcut(np.array([-3.0, 2.0, 2.0, 2.0])).tolist() == [0.0, 0.0, 1.0, 2.0]
    assert normcut(np.array([[2.0, -4.0, 2.0, 2.0, 5.0]])).tolist() == [[0.0, 0.0, 0.0, 2.0, 5.0]]


@settings(max_examples=300, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)), elements=st.integers(-4, 4)))
def test_many_ties_match_algorithm2(x):
    out = normcut(x)
    for row, new in zip(x, out):
        np.testing.assert_allclose(new, algorithm2(row), atol=1e-12)


def test_inplace():
    x = np.array([[-5.0, 1.0, 7.0], [1.0, 2.0, 3.0]])
    out = normcut(x, inplace=True)
    assert out is x and x.tolist() == [[0, 0, 3], [1, 2, 3]]
    y = np.array([[-5.0, 1.0], [1.0, 7.0]])
    assert normcut(y, axis=0, inplace=True) is not y  # not along the last axis: a new array
    assert y.tolist() == [[-5.0, 1.0], [1.0, 7.0]]
