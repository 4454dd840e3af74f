"""The in-kernel cycle counter of the selection bench: it advances inside a kernel, and its
conversion to nanoseconds refuses a counter that did not move."""

import time

import numpy as np
import pytest
from numba import njit

from prefixshield.bench.cycles import cycle_count, ns_per_count
from prefixshield.bench.selector import lru_kernel_select_us


@njit(cache=False)
def _spin(n):
    c0 = cycle_count()
    x = 0.0
    for i in range(n):
        x += np.sqrt(i)
    return cycle_count() - c0, x


def test_counter_advances_with_work_inside_a_kernel():
    _spin(10)
    short, _ = _spin(1_000)
    t0 = time.perf_counter_ns()
    long, _ = _spin(2_000_000)
    wall_ns = time.perf_counter_ns() - t0
    assert 0 < short < long
    ns = ns_per_count(wall_ns, int(long))
    assert 0.0 < ns < 100.0  # a counter of at least 10 MHz


def test_a_counter_that_did_not_move_is_an_error():
    with pytest.raises(RuntimeError, match="did not advance"):
        ns_per_count(1000.0, 0)


def test_in_kernel_lru_selection_times_are_finite_and_positive():
    us = lru_kernel_select_us(64, 100)
    assert us.shape == (100,) and np.isfinite(us).all() and (us > 0).all()
