"""Objective of the partition search (thesis §3.5, eq. 3.7–3.12) for one layer.

A layer is cut along one axis into one contiguous interval per node.  Each node's
cost for its interval is given by a `LayerCost` (any function of node, start and
stop); `objective` folds the per-node costs of one complete partition into the
thesis' scalar value, and `lower_bound` gives a sound bound on that value when only
some of the nodes' costs are known (used by the exact search).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class Weights:
    """User weights of the four terms (thesis table 3.3)."""

    operations_w: float = 1.0
    data_w: float = 1.0
    over_w: float = 1.0
    harmonic_w: float = 1.0

    def check(self) -> None:
        """The searches' bounds need non-negative weights."""
        for name in ("operations_w", "data_w", "over_w", "harmonic_w"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"weight {name} must be >= 0, got {value!r}")


@dataclass(frozen=True)
class NodeCost:
    """Cost of one node computing one interval."""

    work: float  # operations for the interval divided by the node's speed (eq. 3.7)
    data: float  # values the node must receive for the interval (its eq. 3.9 term)
    over: float  # overlapped (computed-but-cropped) values (its eq. 3.10 term)


class LayerCost(Protocol):
    """Cost model of one layer cut along one axis."""

    extent: int  # output size along the cut axis

    def node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        """Cost of `node` computing [start, stop); start == stop means idle."""
        ...


def harmonic_mean(works: Sequence[float]) -> float:
    """Harmonic mean of the works; 0 when any work is 0 (eq. 3.11)."""
    if any(w == 0 for w in works):
        return 0.0
    return len(works) / sum(1.0 / w for w in works)


def objective(costs: Sequence[NodeCost], w: Weights) -> float:
    """Eq. 3.8–3.11 for one layer: weighted max work + data + over + |max - harmonic|."""
    works = [c.work for c in costs]
    top = max(works)
    return (
        w.operations_w * top
        + w.data_w * sum(c.data for c in costs)
        + w.over_w * sum(c.over for c in costs)
        + w.harmonic_w * abs(top - harmonic_mean(works))
    )


@dataclass(frozen=True)
class PartialCost:
    """What is known of a partition whose costs are known for `known` of `nodes` nodes.

    `top` is the max known work, `inv_sum` the sum of 1/work over known nodes (inf
    when one known work is 0) and `flat` the weighted sum of known data and over.
    """

    nodes: int
    known: int = 0
    top: float = 0.0
    inv_sum: float = 0.0
    flat: float = 0.0

    def add(self, cost: NodeCost, w: Weights) -> PartialCost:
        """This partial cost with one more node's cost known."""
        inv = float("inf") if cost.work == 0 else 1.0 / cost.work
        return PartialCost(
            self.nodes,
            self.known + 1,
            max(self.top, cost.work),
            self.inv_sum + inv,
            self.flat + w.data_w * cost.data + w.over_w * cost.over,
        )


def lower_bound(p: PartialCost, w: Weights, top_at_least: float = 0.0, flat_at_least: float = 0.0) -> float:
    """Sound lower bound on `objective` of any completion of `p`.

    `top_at_least` / `flat_at_least` are known lower bounds on the max work and on the
    weighted data+over sum of the unknown nodes (0 when nothing is known).

    Why it is sound (weights >= 0, costs >= 0): let M >= m := max(p.top,
    top_at_least) be the completion's max work, r the number of unknown nodes and
    A = p.inv_sum.  Every unknown work is <= M, so the sum of 1/work is >= A + r/M and
    the harmonic mean is <= N/(A + r/M) (or 0); hence objective - flat >=
    ow*M + hw*phi(M) with phi(M) = M - N*M/(A*M + r).  Since every known work is
    <= m, A*M >= known, so (A*M + r)^2 >= N^2 >= N*r, i.e. phi'(M) >= 0 and the
    minimum over M >= m is at M = m.  With r == 0 the bound is the objective itself.
    """
    m = max(p.top, top_at_least)
    r = p.nodes - p.known
    harmonic_gap = 0.0
    if m > 0:
        denominator = p.inv_sum + r / m
        harmonic_gap = max(0.0, m - p.nodes / denominator) if denominator > 0 else 0.0
    return w.operations_w * m + w.harmonic_w * harmonic_gap + p.flat + flat_at_least
