"""Objective of the partition search (thesis §3.5, eq. 3.7–3.12) for one layer.

A layer is cut along one axis into one contiguous interval per node.  Each node's
cost for its interval is given by a `LayerCost` (any function of node, start and
stop); `objective` folds the per-node costs of one complete partition into the
thesis' scalar value, and `lower_bound` gives a sound bound on that value when only
some of the nodes' costs are known (used by the exact search).
"""

from __future__ import annotations

import math
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
    return len(works) / math.fsum(1.0 / w for w in works)


def objective(costs: Sequence[NodeCost], w: Weights) -> float:
    """Eq. 3.8–3.11 for one layer: weighted max work + data + over + |max - harmonic|.

    Sums are exact-rounded (`math.fsum`), so the value depends only on the multiset
    of node costs: partitions that tie mathematically tie in floating point too.
    """
    works = [c.work for c in costs]
    top = max(works)
    return (
        w.operations_w * top
        + w.data_w * math.fsum(c.data for c in costs)
        + w.over_w * math.fsum(c.over for c in costs)
        + w.harmonic_w * abs(top - harmonic_mean(works))
    )


@dataclass(frozen=True)
class PartialCost:
    """Known part of a partition of `nodes` nodes: `known` nodes' costs folded.

    `top` is the max known work, `inv_sum` the sum of 1/work over the known nodes
    (inf once a known work is 0) and `flat` the weighted sum of known data and over.
    The same record also serves as a lower-bound label: then each field is only a
    lower bound (e.g. minima taken over different sets of intervals).
    """

    nodes: int
    known: int = 0
    top: float = 0.0
    inv_sum: float = 0.0
    flat: float = 0.0

    def add(self, cost: NodeCost, w: Weights) -> PartialCost:
        """This partial cost with one more node's cost known."""
        inv = math.inf if cost.work == 0 else 1.0 / cost.work
        return PartialCost(
            self.nodes,
            self.known + 1,
            max(self.top, cost.work),
            self.inv_sum + inv,
            self.flat + w.data_w * cost.data + w.over_w * cost.over,
        )


def lower_bound(
    p: PartialCost, w: Weights, top_at_least: float = 0.0, inv_at_least: float = 0.0, flat_at_least: float = 0.0
) -> float:
    """Sound lower bound on `objective` of any completion of `p` (weights and costs >= 0).

    The r = nodes - known unknown nodes have, by assumption, max work >=
    `top_at_least`, sum of 1/work >= `inv_at_least` and weighted data+over sum >=
    `flat_at_least` (all 0 when nothing is known about them).

    Proof.  Let M be the completion's max work, so M >= m := max(p.top,
    top_at_least), and A its total sum of 1/work.  Every unknown work is <= M, so
    A >= p.inv_sum + max(inv_at_least, r/M), and the harmonic mean N/A is at most
    N/(p.inv_sum + r/M) and at most N/(p.inv_sum + inv_at_least).  With
    c = ow + hw, objective - flat >= c*M - hw*N*M/(p.inv_sum*M + r) =: psi1(M), a
    convex function of M (second derivative 2*hw*N*r*A/(A*M + r)^3 >= 0) whose
    minimum over M >= m is at max(m, M*), M* solving psi1'(M*) = 0; and
    objective - flat >= c*M - hw*N/(p.inv_sum + inv_at_least), increasing in M, so
    >= its value at m.  Also the harmonic term is >= 0, so objective - flat >= ow*m.
    The bound is the largest of the three plus the known flat sums.  With r == 0 and
    exact fields it equals the objective; with nothing unknown-specific it is the
    minimum of the objective over all completions, hence monotone as nodes become known.
    """
    a, h, n = w.operations_w, w.harmonic_w, p.nodes
    m = max(p.top, top_at_least)
    r = n - p.known
    c = a + h
    inv = p.inv_sum
    best = a * m
    if h > 0:
        if r == 0:
            best = max(best, c * m - h * n / inv if inv > 0 else best)
        else:
            def psi1(x: float) -> float:
                return c * x - h * n * x / (inv * x + r) if not math.isinf(inv) else c * x

            x = m
            if 0 < inv < math.inf:
                x = max(m, (math.sqrt(h * n * r / c) - r) / inv)
            best = max(best, psi1(x))
            if inv + inv_at_least > 0:
                best = max(best, c * m - h * n / (inv + inv_at_least))
    return best + p.flat + flat_at_least
