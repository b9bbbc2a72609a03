"""Packing algorithms (SEMANTICS 7.3 to 7.5): the worked checks, and differential tests
against naive implementations written straight from the text."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.transforms.packing import first_fit_decreasing, karmarkar_karp, split_bins

# --- naive references, one object per set and per state, linear scans everywhere ---


class NaiveSet:
    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []  # (index, value)

    @property
    def total(self) -> int:
        return sum(value for _, value in self.items)

    def key(self) -> tuple[int, int, list[tuple[int, int]]]:
        return (self.total, len(self.items), self.items)


class NaiveState:
    def __init__(self, items: list[tuple[int, int]], k: int) -> None:
        self.sets = [NaiveSet() for _ in range(k)]
        for i, item in enumerate(items):
            self.sets[i].items.append(item)
        self.resort()

    def resort(self) -> None:
        self.sets.sort(key=NaiveSet.key, reverse=True)

    def spread(self) -> int:
        return self.sets[0].total - self.sets[-1].total

    def __lt__(self, other: NaiveState) -> bool:
        if self.spread() != other.spread():
            return self.spread() > other.spread()
        return self.sets[0].key() > other.sets[0].key()


def naive_karmarkar_karp(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    if not values:
        return [[] for _ in range(k)]
    items = sorted((value, index) for index, value in enumerate(values))
    heap: list[NaiveState] = []
    step = k if equal_size else 1
    for start in range(0, len(items), step):
        chunk = [(index, value) for value, index in items[start : start + step]]
        heapq.heappush(heap, NaiveState(chunk, k))
    while len(heap) > 1:
        a = heapq.heappop(heap)
        b = heapq.heappop(heap)
        for i in range(k):
            a.sets[i].items.extend(b.sets[k - 1 - i].items)
        a.resort()
        heapq.heappush(heap, a)
    return [sorted(index for index, _ in s.items) for s in heap[0].sets]


def naive_first_fit_decreasing(lengths: Sequence[int], cap: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    for i in order:
        for b in bins:
            if sum(lengths[j] for j in b) + lengths[i] <= cap:
                b.append(i)
                break
        else:
            bins.append([i])
    return bins


def naive_split_bins(bins: list[list[int]], lengths: Sequence[int], target: int) -> list[list[int]]:
    bins = [list(b) for b in bins]
    while len(bins) < target:
        candidates = [(sum(lengths[i] for i in b), pos) for pos, b in enumerate(bins) if len(b) > 1]
        if not candidates:
            break
        _, pos = max(candidates)
        halves: list[list[int]] = [[], []]
        for i in sorted(bins[pos], key=lambda i: (-lengths[i], bins[pos].index(i))):
            sums = [sum(lengths[j] for j in h) for h in halves]
            halves[0 if sums[0] <= sums[1] else 1].append(i)
        if not halves[1]:
            halves[1].append(halves[0].pop())
        bins[pos] = halves[0]
        bins.append(halves[1])
    return bins


# --- the worked checks of SEMANTICS 7.3 to 7.5 ---


def test_karmarkar_karp_equal_size_two_ways() -> None:
    assert karmarkar_karp([1, 2, 3, 4], 2, equal_size=True) == [[0, 3], [1, 2]]


def test_karmarkar_karp_equal_size_four_ways() -> None:
    values = [3, 1, 4, 1, 5, 9, 2, 6]
    assert karmarkar_karp(values, 4, equal_size=True) == [[1, 5], [3, 7], [4, 6], [0, 2]]


def test_first_fit_decreasing_check() -> None:
    bins = first_fit_decreasing([5, 1, 4, 2, 3, 3, 2, 4], 6)
    assert bins == [[0, 1], [2, 3], [7, 6], [4, 5]]


def test_split_bins_check() -> None:
    assert split_bins([[0, 1, 2, 3]], [4, 4, 4, 4], 4) == [[0], [1], [3], [2]]


# --- edges ---


def test_karmarkar_karp_accepts_numpy_and_returns_python_ints() -> None:
    parts = karmarkar_karp(np.array([3, 1, 4, 1, 5, 9, 2, 6]), 4, equal_size=True)
    assert parts == [[1, 5], [3, 7], [4, 6], [0, 2]]
    assert all(type(i) is int for part in parts for i in part)


def test_karmarkar_karp_one_partition_takes_everything_in_order() -> None:
    assert karmarkar_karp([5, 3, 9], 1, equal_size=False) == [[0, 1, 2]]
    assert karmarkar_karp([5, 3, 9], 1, equal_size=True) == [[0, 1, 2]]


def test_karmarkar_karp_fewer_items_than_parts_leaves_empty_parts() -> None:
    assert karmarkar_karp([4, 7], 3, equal_size=False) == [[1], [0], []]
    assert karmarkar_karp([], 2, equal_size=True) == [[], []]


def test_karmarkar_karp_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="5 % 2"):
        karmarkar_karp([1, 2, 3, 4, 5], 2, equal_size=True)
    with pytest.raises(ValueError, match="non-negative"):
        karmarkar_karp([1, -2], 2, equal_size=False)
    with pytest.raises(ValueError, match="at least 1"):
        karmarkar_karp([1, 2], 0, equal_size=False)


def test_first_fit_decreasing_gives_oversized_rows_their_own_bin() -> None:
    assert first_fit_decreasing([9, 2, 12, 3], 10) == [[2], [0], [3, 1]]
    assert first_fit_decreasing([0, 0, 11], 10) == [[2], [0, 1]]
    assert first_fit_decreasing([], 10) == []


def test_split_bins_stops_when_every_bin_is_a_single_row() -> None:
    assert split_bins([[0, 1], [2]], [3, 3, 3], 5) == [[0], [2], [1]]


def test_split_bins_takes_the_later_bin_on_equal_sums() -> None:
    assert split_bins([[0, 1], [2, 3]], [2, 2, 1, 3], 3) == [[0, 1], [3], [2]]


def test_split_bins_never_makes_an_empty_bin_from_zero_length_rows() -> None:
    assert split_bins([[0, 1, 2]], [0, 0, 0], 3) == [[0], [2], [1]]


def test_split_bins_leaves_its_input_alone() -> None:
    bins = [[0, 1, 2]]
    split_bins(bins, [1, 1, 1], 3)
    assert bins == [[0, 1, 2]]


# --- differential and property tests on random input ---

small_values = st.lists(st.integers(0, 12), max_size=40)
wide_values = st.lists(st.integers(0, 10_000), max_size=40)


@st.composite
def equal_size_inputs(draw: st.DrawFn) -> tuple[list[int], int]:
    k = draw(st.integers(1, 6))
    per_part = draw(st.integers(0, 8))
    values = draw(
        st.lists(st.integers(0, draw(st.sampled_from([3, 50, 10_000]))), min_size=k * per_part).map(
            lambda v: v[: k * per_part]
        )
    )
    return values, k


@settings(max_examples=300, deadline=None)
@given(equal_size_inputs())
def test_karmarkar_karp_equal_size_matches_naive(case: tuple[list[int], int]) -> None:
    values, k = case
    parts = karmarkar_karp(values, k, equal_size=True)
    assert parts == naive_karmarkar_karp(values, k, equal_size=True)
    assert sorted(i for part in parts for i in part) == list(range(len(values)))
    assert all(len(part) == len(values) // k for part in parts)
    assert all(part == sorted(part) for part in parts)


@settings(max_examples=300, deadline=None)
@given(st.one_of(small_values, wide_values), st.integers(1, 6))
def test_karmarkar_karp_free_size_matches_naive(values: list[int], k: int) -> None:
    parts = karmarkar_karp(values, k, equal_size=False)
    assert parts == naive_karmarkar_karp(values, k, equal_size=False)
    assert len(parts) == k
    assert sorted(i for part in parts for i in part) == list(range(len(values)))


@settings(max_examples=300, deadline=None)
@given(st.one_of(small_values, wide_values), st.integers(1, 12_000))
def test_first_fit_decreasing_matches_naive(values: list[int], cap: int) -> None:
    bins = first_fit_decreasing(values, cap)
    assert bins == naive_first_fit_decreasing(values, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(values)))
    assert all(len(b) == 1 or sum(values[i] for i in b) <= cap for b in bins)


@st.composite
def bins_to_split(draw: st.DrawFn) -> tuple[list[list[int]], list[int], int]:
    values = draw(st.lists(st.integers(0, 30), min_size=1, max_size=30))
    cuts = sorted(draw(st.sets(st.integers(1, len(values) - 1), max_size=6))) if values[1:] else []
    order = draw(st.permutations(range(len(values))))
    bounds = [0, *cuts, len(values)]
    bins = [list(order[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    target = draw(st.integers(0, len(values) + 3))
    return bins, values, target


@settings(max_examples=300, deadline=None)
@given(bins_to_split())
def test_split_bins_matches_naive(case: tuple[list[list[int]], list[int], int]) -> None:
    bins, values, target = case
    result = split_bins(bins, values, target)
    assert result == naive_split_bins(bins, values, target)
    assert sorted(i for b in result for i in b) == sorted(i for b in bins for i in b)
    assert len(result) == max(len(bins), min(target, len(values)))
    assert all(result[len(bins) :])
    heaviest = max(sum(values[i] for i in b) for b in bins)
    assert all(sum(values[i] for i in b) <= heaviest for b in result)
