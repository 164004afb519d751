"""insert-crop-concat: the naive data movement of thesis fig. 3.6a.

After each layer, every node that reads its output gathers the whole output
(concatenating its own piece with every other node's) and crops what each of its
consumers reads. Always correct and the baseline `eliminate-transfers` improves on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bbgrap.ir import Graph, Movement
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult


@dataclass(frozen=True)
class InsertCropConcat(Pass):
    name: ClassVar[str] = "insert-crop-concat"

    def requires(self, graph: Graph) -> None:
        if not graph.partitions:
            raise PassError("run naive-partition first")

    def call(self, graph: Graph) -> PassResult:
        return PassResult(graph.replace(gathers=derive_gathers(graph, Movement.NAIVE), movement=Movement.NAIVE), True)
