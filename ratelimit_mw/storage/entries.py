"""An identity's entry in the memory storage: one flat tuple of its counters, and the
steps that find, read and replace a counter's cell in it."""

from __future__ import annotations

from typing import Any, Final

from ..hits import Slot

__all__ = ["EMPTY", "FIRST_CELL", "Entry", "cell_state", "find_cell", "in_entry_order",
           "with_cell"]

EMPTY: Final[tuple[Any, ...]] = (0,)
"""The entry of an identity with nothing kept yet."""

Entry = tuple[Any, ...]
"""One identity, flat: when the last of its state (or its usage history) expires (µs),
then its counters one after the other, each as its slot, when it expires, how many
items its state has, and those items: ``(expires, slot, expires, 2, window, count, …)``.

Numbers and strings in one tuple (a concurrency slot's leases aside): the garbage
collector stops tracking such a tuple in the first collection that looks at it, so a
million identities add no objects to any later collection, only the one dict that
holds them, which ``gc.freeze()`` after start-up takes out of the collector's view too
(see docs/deployment.md). A state kept as a tuple of its own would not do: a collection
looks at the entry before the state inside it, and the entry, still holding a tracked
tuple, would be traversed again by the next generation."""
FIRST_CELL: Final = 1


def find_cell(entry: Entry, slot: Slot) -> int:
    """The index of ``slot``'s cell in ``entry``, or -1."""
    size, i = len(entry), FIRST_CELL
    while i < size:
        if entry[i] is slot or entry[i] == slot:  # see MemoryStorage.decide_now
            return i
        items: int = entry[i + 2]  # an int, not Any: compiled, added without boxing
        i += 3 + items
    return -1


def cell_state(entry: Entry, i: int, now: int) -> Any:
    """The state in the cell at ``i`` (-1: none), or None where it has expired."""
    if i < 0:
        return None
    expires: int = entry[i + 1]  # compared as ints: compiled, ``now`` is not boxed for it
    if expires <= now:
        return None
    items: int = entry[i + 2]
    # A window's or a bucket's two or three items read out: compiled, cheaper than a slice.
    if items == 2:
        return (entry[i + 3], entry[i + 4])
    if items == 3:
        return (entry[i + 3], entry[i + 4], entry[i + 5])
    return entry[i + 3:i + 3 + items]


def with_cell(entry: Entry, i: int, slot: Slot, state: Any, expires: Any) -> Entry:
    """``entry`` with ``slot``'s cell (at index ``i``, -1: none yet) holding ``state``
    (None: nothing) until ``expires`` (an int typed Any, so that compiled code does not
    box it anew for each place it is kept: one object, not one per place, in an entry;
    the entry's own expiry pushed back to it if need be)."""
    whole = entry[0] if entry[0] > expires else expires
    items = () if state is None else state
    size = len(entry)
    # The one-cell entries joined with +, not starred: compiled, a starred tuple is
    # built through a list.
    if i < 0:
        if size == FIRST_CELL:  # most identities have one cell
            return (whole, slot, expires, len(items)) + items  # noqa: RUF005
        return (whole, *entry[1:], slot, expires, len(items), *items)
    end = i + 3 + entry[i + 2]
    if i == FIRST_CELL and end == size:
        return (whole, slot, expires, len(items)) + items  # noqa: RUF005
    return (whole, *entry[1:i], slot, expires, len(items), *items, *entry[end:])


def in_entry_order(spots: list[int]) -> list[int]:
    """The indexes of ``spots`` ordered by the cell each names (none yet: first)."""
    return sorted(range(len(spots)), key=spots.__getitem__)
