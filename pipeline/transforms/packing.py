"""Partitioning and bin packing on per-row lengths (SEMANTICS 7.3 to 7.5).

Everything here works on small integer arrays (one length per row or per micro-batch)
and returns positions into them; token lists never reach this module.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np


class _Part:
    """One set of a Karmarkar-Karp state: its sum and item positions in insertion order."""

    __slots__ = ("total", "positions")

    def __init__(self, total: float = 0, positions: list[int] | None = None) -> None:
        self.total = total  # an int, or a float for float values
        self.positions: list[int] = positions if positions is not None else []

    def __lt__(self, other: _Part) -> bool:
        # "sorts first": a state lists its parts by descending order, so ascending here
        return self.order() > other.order()

    def order(self) -> tuple[float, int, list[int]]:
        # Positions alone order item lists exactly as (position, value) pairs would: the
        # lists compared are disjoint, so the first pair that differs differs in position.
        return self.total, len(self.positions), self.positions


class _LargerFirst:
    """An item list that sorts before smaller item lists in a min-heap.

    Equality stays identity: item lists of two live states are disjoint and non-empty,
    so two of them are never equal and comparison always settles on `<`.
    """

    __slots__ = ("items",)

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __lt__(self, other: _LargerFirst) -> bool:
        return other.items < self.items


# A state is its non-empty parts, kept sorted descending by (sum, item count, item list);
# its other parts, up to k, are empty (sum 0, no items) and sort after them. Holding only
# the non-empty ones keeps a merge in proportion to the items moved, not to k: packing a
# step into hundreds of micro-batches (balance_by_flops) merges thousands of states.
_State = list[_Part]


def _state(values: list[float], positions: list[int]) -> _State:
    """Item i in set i (the items come ascending by value, then position), then sorted."""
    parts = [_Part(value, [position]) for value, position in zip(values, positions, strict=True)]
    parts.sort(key=_Part.order, reverse=True)
    return parts


def _heap_entry(state: _State, k: int) -> tuple[float, float, int, _LargerFirst, _State]:
    """Min-heap key: larger spread first, then the larger first set."""
    first = state[0]
    spread = first.total - (state[-1].total if len(state) == k else 0)
    return (-spread, -first.total, -len(first.positions), _LargerFirst(first.positions), state)


def _merge_states(into: _State, other: _State, k: int, floats: list[float] | None) -> _State:
    """Set i of `into` takes set k-1-i of `other`, then the sets are re-sorted. Float
    values (`floats`) are added to a set's sum one item at a time, in the order the items
    join it, as miles' `Set.merge` adds them: float sums depend on that order."""
    taken_by = len(other)
    # into's sets from `cut` on take one of other's; the ones before keep their order
    cut = max(0, k - taken_by)
    moved = into[cut:]
    for i, part in enumerate(moved, start=cut):
        taken = other[k - 1 - i]
        if floats is None:
            part.total += taken.total
        else:
            for position in taken.positions:
                part.total += floats[position]
        part.positions.extend(taken.positions)
    # into's empty sets i >= len(into) take other's set k-1-i as it is (summed from 0 in
    # the same order, so its sum is the one a merge into an empty set would give)
    moved += [other[j] for j in range(min(k - 1 - len(into), taken_by - 1), -1, -1)]
    merged = into[:cut]
    for part in moved:
        bisect.insort(merged, part)
    return merged


def _initial_states(array: np.ndarray, k: int, equal_size: bool) -> list[_State]:
    """Items ascending by (value, position): chunks of k items, or one item per state."""
    order = np.argsort(array, kind="stable")
    ordered_values = array[order].tolist()
    ordered_positions = order.tolist()
    group = k if equal_size else 1
    return [
        _state(ordered_values[i : i + group], ordered_positions[i : i + group])
        for i in range(0, len(ordered_values), group)
    ]


def _non_negative(
    values: Sequence[int] | Sequence[float] | np.ndarray, floats: bool = False
) -> np.ndarray:
    """The values as int64, or as float64 when `floats` and they are floats."""
    array = np.asarray(values).reshape(-1)
    if not (floats and array.dtype.kind == "f"):
        array = array.astype(np.int64)
    if len(array) and array.min() < 0:
        raise ValueError(f"lengths must be non-negative, got {int(array.min())}")
    return array


def karmarkar_karp(
    values: Sequence[int] | Sequence[float] | np.ndarray, k: int, equal_size: bool
) -> list[list[int]]:
    """Largest differencing partition of `values` into `k` sets of positions.

    With `equal_size` every set gets len(values) / k items. The partitions come back in
    the final state's set order (largest sum first), each sorted ascending. Float values
    (FLOPs) are summed as miles sums them (`_merge_states`).
    """
    array = _non_negative(values, floats=True)
    floats = array.tolist() if array.dtype.kind == "f" else None
    n = len(array)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if equal_size and n % k:
        raise ValueError(f"equal-size partitions need len(values) % k == 0, got {n} % {k}")
    if n == 0:
        return [[] for _ in range(k)]
    if k == 1:
        return [list(range(n))]
    # With non-negative values every state's first set is non-empty and the states'
    # item sets are disjoint, so no two heap entries tie and the pop order is exact.
    heap = [_heap_entry(state, k) for state in _initial_states(array, k, equal_size)]
    heapq.heapify(heap)
    while len(heap) > 1:
        into = heapq.heappop(heap)[-1]
        other = heapq.heappop(heap)[-1]
        heapq.heappush(heap, _heap_entry(_merge_states(into, other, k, floats), k))
    final = heap[0][-1]
    return [sorted(part.positions) for part in final] + [[] for _ in range(k - len(final))]


def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, cap: int) -> list[list[int]]:
    """Bins of positions: rows by length descending (ties by position), each into the
    first bin, in creation order, that stays within `cap`; an oversized row gets its own."""
    values = _non_negative(lengths)
    return _first_fit(values.tolist(), np.argsort(-values, kind="stable").tolist(), cap)


def first_fit(lengths: Sequence[int] | np.ndarray, cap: int) -> list[list[int]]:
    """Bins of positions: rows in order, each into the first bin, in creation order, that
    stays within `cap`; an oversized row gets its own (slime's `first_fit_pack`)."""
    values = _non_negative(lengths)
    return _first_fit(values.tolist(), list(range(len(values))), cap)


def _first_fit(sizes: list[int], order: list[int], cap: int) -> list[list[int]]:
    """Rows visited in `order`, each into the leftmost bin with room.

    A max-tree over the bins' free space finds the first fitting bin in O(log n), which
    keeps steps with thousands of micro-batches fast. Bins not yet opened sit at full
    capacity to the right of the open ones, so the leftmost fit is either an open bin or
    the next one to open.
    """
    n = len(sizes)
    if n == 0:
        return []
    leaves = 1
    while leaves < n:
        leaves *= 2
    free = [int(cap)] * (2 * leaves)
    bins: list[list[int]] = []
    for row in order:
        length = sizes[row]
        if free[1] >= length:
            node = 1
            while node < leaves:
                node *= 2
                if free[node] < length:
                    node += 1
        else:
            node = leaves + len(bins)
        slot = node - leaves
        if slot == len(bins):
            bins.append([row])
        else:
            bins[slot].append(row)
        free[node] -= length
        while node > 1:
            node //= 2
            widest = max(free[2 * node], free[2 * node + 1])
            if free[node] == widest:
                break
            free[node] = widest
    return bins


def _halves(rows: list[int], lengths: Sequence[int]) -> tuple[list[int], list[int], int, int]:
    """Greedy two-way split: longest rows first, each to the lighter half (first on ties)."""
    halves: tuple[list[int], list[int]] = ([], [])
    sums = [0, 0]
    for row in sorted(rows, key=lengths.__getitem__, reverse=True):
        side = 0 if sums[0] <= sums[1] else 1
        halves[side].append(row)
        sums[side] += lengths[row]
    if not halves[1]:
        # Only a bin of zero-length rows lands whole in the first half; miles would then
        # append empty micro-batches. Ours: its last row becomes the second half.
        halves[1].append(halves[0].pop())
    return halves[0], halves[1], sums[0], sums[1]


def _heaviest_splittable(bins: list[list[int]], sums: list[int]) -> int | None:
    """The multi-row bin with the largest token sum, the later one on ties."""
    chosen = None
    for position, rows in enumerate(bins):
        if len(rows) > 1 and (chosen is None or sums[position] >= sums[chosen]):
            chosen = position
    return chosen


def split_bins(
    bins: Sequence[Sequence[int]], lengths: Sequence[int] | np.ndarray, target: int
) -> list[list[int]]:
    """Grow `bins` towards `target` bins by halving the heaviest multi-row bin.

    The first half replaces the bin and the second is appended. Stops early when every
    bin holds a single row, so the result can have fewer than `target` bins. A split
    never leaves a half empty, even for zero-length rows.
    """
    sizes = lengths.tolist() if isinstance(lengths, np.ndarray) else list(lengths)
    result = [list(rows) for rows in bins]
    sums = [sum(sizes[row] for row in rows) for rows in result]
    while len(result) < target:
        chosen = _heaviest_splittable(result, sums)
        if chosen is None:
            break
        first, second, first_sum, second_sum = _halves(result[chosen], sizes)
        result[chosen], sums[chosen] = first, first_sum
        result.append(second)
        sums.append(second_sum)
    return result
