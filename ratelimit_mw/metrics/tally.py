"""A counter of plain numbers, read by Prometheus at scrape: the per-request count.

prometheus_client's ``Counter.inc`` checks its arguments and takes a lock on every
call; a ``Cell`` is a number and one addition. Counts are exact as long as they are
made on one thread (the event loop's, where the middleware runs). Multiprocess mode
needs prometheus_client's own counters (they write to the shared files) and uses them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, Metric

__all__ = ["Cell", "Tally"]


class Cell:
    """One labelled count."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Tally:
    """A counter family (``name`` without ``_total``) whose counts are ``Cell``s."""

    __slots__ = ("_cells", "doc", "labels", "name")

    def __init__(self, name: str, doc: str, labels: tuple[str, ...],
                 registry: CollectorRegistry) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self._cells: dict[tuple[str, ...], Cell] = {}
        registry.register(self)

    def labels_cell(self, *values: str) -> Cell:
        """The count of these label values (made at 0 the first time)."""
        cell = self._cells.get(values)
        if cell is None:
            cell = self._cells[values] = Cell()
        return cell

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.doc, labels=self.labels)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, cell in list(self._cells.items()):
            family.add_metric(values, cell.value)
        yield family
