"""band-pools: a global average pool over a map cut along its rows becomes a pool of row bands.
(GlobalAveragePool, or ReduceMean over H and W keeping them, as the dynamo exporter writes it.)

A global pool cannot be cut along a spatial axis: its output has none. So a plan whose map is
cut along H had to bring the whole map to the node computing the pool (or to every node, for a
squeeze-excite block computed on every node), megabytes per block on the early maps. With N
nodes of equal speed and H rows divisible by N, the pool is the mean of N equal row bands'
means:

    GlobalAveragePool(x)[c] = 1/N · Σ_b  1/(H/N · W) · Σ_{h in band b, w} x[c, h, w]
                            = GlobalAveragePool(AveragePool_{kernel (H/N, W), stride (H/N, W)}(x))[c]

The pass rewrites the layer so: an AveragePool of one band per output row (keeping the layer's
name: it does the work, and a profile's measured time of the layer is its time), then a global
pool of the N band means (`<name>/bands`). naive-partition cuts the band pool's N rows one per
node, each reading exactly its own band of the map, which the even cut of the map gives it;
only the N band means (N · C values) move. onnxruntime runs the band AveragePool as fast as the
global pool (docs/benchmarks.md, session 14). Runs before naive-partition, for more than one node
of equal speeds; a layer a custom partition names is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bbgrap.ir import Graph, Layer, Tensor
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.base import is_default_domain
from bbgrap.rules.reduce import reduced_axes

BANDS_SUFFIX = "/bands"  # the name of the global pool of the band means, after the layer's
FLOATS = ("float16", "float32", "float64")  # what AveragePool takes


def pools_globally(layer: Layer, graph: Graph) -> bool:
    """A global average pool: GlobalAveragePool, or a ReduceMean over H and W that keeps them (as the
    dynamo exporter writes one), with one output."""
    if not is_default_domain(layer.domain) or len(layer.outputs) != 1:
        return False
    if layer.op_type == "GlobalAveragePool":
        return True
    return layer.op_type == "ReduceMean" and int(layer.attrs.get("keepdims", 1)) == 1 \
        and reduced_axes(layer, graph) == frozenset({2, 3})


def banded(layer: Layer, graph: Graph, nodes: int) -> tuple[Layer, Layer, Tensor] | None:
    """The band pool, the pool of its bands and the tensor between them that replace `layer`, or
    None where it is not a global average pool over an N x C x H x W map whose H rows split into
    `nodes` equal bands of at least two rows (of floating-point values: AveragePool takes no
    integers, which ReduceMean does). Not a quantized model's fused pool (`Layer.fused`): its
    integer kernel rounds the mean it computes, so the mean of rounded band means is not it."""
    if layer.fused is not None:
        return None
    x = graph.tensors.get(layer.inputs[0]) if layer.inputs else None
    if x is None or x.dtype not in FLOATS or len(x.shape) != 4 or x.shape[2] < 2 * nodes or x.shape[2] % nodes:
        return None
    if not pools_globally(layer, graph):
        return None
    rows, width = x.shape[2] // nodes, x.shape[3]
    out = graph.tensors[layer.outputs[0]]
    bands = Tensor(f"{layer.outputs[0]}{BANDS_SUFFIX}", (x.shape[0], x.shape[1], nodes, 1), out.dtype)
    pool = Layer(layer.name, "AveragePool", layer.domain, {"kernel_shape": [rows, width], "strides": [rows, width]},
                 layer.inputs[:1], (bands.name,), "pools")
    mean = Layer(f"{layer.name}{BANDS_SUFFIX}", "GlobalAveragePool", layer.domain, {}, (bands.name,), layer.outputs, "pools")
    return pool, mean, bands


@dataclass(frozen=True)
class BandPools(Pass):
    name: ClassVar[str] = "band-pools"
    nodes: int
    keep: frozenset[str] = frozenset()  # layers left as they are (a custom partition names them)

    def requires(self, graph: Graph) -> None:
        if graph.partitions:
            raise PassError("run before naive-partition: the graph is already partitioned")

    def call(self, graph: Graph) -> PassResult:
        layers: list[Layer] = []
        tensors = dict(graph.tensors)
        names = {layer.name for layer in graph.layers}
        for layer in graph.layers:
            got = None if layer.name in self.keep or self.nodes < 2 else banded(layer, graph, self.nodes)
            if got is None:
                layers.append(layer)
                continue
            pool, mean, bands = got
            if bands.name in tensors or mean.name in names:
                raise PassError(f"{layer.describe(graph)}: the names '{bands.name}' or '{mean.name}' are taken")
            layers += [pool, mean]
            tensors[bands.name] = bands
        changed = len(layers) != len(graph.layers)
        return PassResult(graph.replace(layers=tuple(layers), tensors=tensors) if changed else graph, changed)

    def ensures(self, graph: Graph) -> None:
        if self.nodes < 2:
            return
        for layer in graph.layers:
            if banded(layer, graph, self.nodes) is not None and layer.name not in self.keep:
                raise PassError(f"{layer.describe(graph)} is still a global pool over a map its rows divide into {self.nodes} bands")
