"""Cost of one convolution cut along one spatial axis (the thesis' table 4.1 setup).

A k x k convolution, stride 1, padding k // 2, whose input is already held split
evenly along the cut axis across the nodes (node j holds input rows/columns
[floor(j*E/N), floor((j+1)*E/N))).  A node computing output [a, b) needs input
[a - k//2, b + k//2) clipped to the tensor; what it does not hold it must receive.
Standalone on purpose: it does not use bbgrap's IR or region rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from bbgrap.search.objective import NodeCost


@dataclass(frozen=True)
class ConvCost:
    """LayerCost of a same-size k x k convolution cut along an axis of `extent` values."""

    extent: int  # output (= input) size along the cut axis
    other: int  # size of the other spatial axis
    speeds: tuple[float, ...]  # one per node
    in_channels: int = 3
    out_channels: int = 3
    kernel: int = 3

    def held(self, node: int) -> tuple[int, int]:
        """Input range along the cut axis that `node` already holds."""
        n = len(self.speeds)
        return node * self.extent // n, (node + 1) * self.extent // n

    def node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        if start == stop:
            return NodeCost(0.0, 0.0, 0.0)
        halo = self.kernel // 2
        need_lo, need_hi = max(0, start - halo), min(self.extent, stop + halo)
        held_lo, held_hi = self.held(node)
        local = max(0, min(need_hi, held_hi) - max(need_lo, held_lo))
        plane = self.other * self.in_channels
        macs = (stop - start) * self.other * self.out_channels * self.kernel * self.kernel * self.in_channels
        return NodeCost(work=macs / self.speeds[node], data=float((need_hi - need_lo - local) * plane), over=0.0)
