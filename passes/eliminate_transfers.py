"""eliminate-transfers: send only what the next layer reads (thesis §3.4, fig. 3.6b–e).

Each node gathers just the hull of what its consumers of a tensor read: nothing at
all when it holds exactly that (layer fusion), a crop when it holds more, and only
the missing halo rows/columns or channels, received point-to-point, when it holds
less. A tensor with several consumers on a node is gathered once, for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bbgrap.ir import Graph, Movement
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult


@dataclass(frozen=True)
class EliminateTransfers(Pass):
    name: ClassVar[str] = "eliminate-transfers"

    def requires(self, graph: Graph) -> None:
        if not graph.gathers:
            raise PassError("run insert-crop-concat first")

    def call(self, graph: Graph) -> PassResult:
        gathers = derive_gathers(graph, Movement.OPTIMIZED)
        return PassResult(graph.replace(gathers=gathers, movement=Movement.OPTIMIZED), gathers != graph.gathers)
