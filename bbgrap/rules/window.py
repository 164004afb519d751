"""The windowed region rule shared by Conv and the pools (thesis eq. 3.2–3.6).

An output interval [o0, o1) along a spatial axis reads input
[o0·S − P0, (o1−1)·S − P0 + tK) with tK = (K−1)·D + 1, clipped to the tensor. The
part of that window outside the tensor becomes the local op's padding, so only
partitions touching a border keep that border's padding. The partition that ends
at the output's end keeps the original end padding and `ceil_mode`, so that
ceil-mode windows hanging over the end pool exactly as in the whole op; every
other partition gets exactly the end padding its last window reads, which makes
its window count integral, so `ceil_mode` is kept as it is everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from bbgrap.ir import Graph, Interval, Layer, ShapeMap


@dataclass(frozen=True)
class Window:
    """Kernel geometry of a windowed op along its spatial axes (explicit pads)."""

    in_sizes: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends, ONNX order
    ceil_mode: int

    @staticmethod
    def of(layer: Layer, x_shape: Sequence[int], kernel: Sequence[int]) -> Window:
        k = len(kernel)
        return Window(
            in_sizes=tuple(x_shape[2:]),
            kernel=tuple(int(v) for v in kernel),
            strides=tuple(int(v) for v in layer.attrs.get("strides", [1] * k)),
            dilations=tuple(int(v) for v in layer.attrs.get("dilations", [1] * k)),
            pads=tuple(int(v) for v in layer.attrs.get("pads", [0] * (2 * k))),
            ceil_mode=int(layer.attrs.get("ceil_mode", 0)),
        )

    def out_size(self, axis: int) -> int:
        eff = (self.kernel[axis] - 1) * self.dilations[axis] + 1
        total = self.in_sizes[axis] + self.pads[axis] + self.pads[axis + len(self.kernel)] - eff
        s = self.strides[axis]
        size = (-(-total // s) if self.ceil_mode else total // s) + 1
        if self.ceil_mode and (size - 1) * s >= self.in_sizes[axis] + self.pads[axis]:
            size -= 1
        return size


# where a windowed op without `kernel_shape` has the weights that give its kernel
WEIGHTS = {"Conv": 1, "QLinearConv": 3}


def kernel_of(graph: Graph, layer: Layer) -> tuple[int, ...]:
    """The spatial kernel of a windowed layer: a convolution's from its weights, a pool's `kernel_shape`."""
    if layer.op_type in WEIGHTS:
        return tuple(graph.tensors[layer.inputs[WEIGHTS[layer.op_type]]].shape[2:])
    return tuple(int(v) for v in layer.attrs["kernel_shape"])


def window_attrs(window: Window, out: ShapeMap) -> tuple[list[Interval], dict[str, Any]]:
    """Needed input intervals along the spatial axes, and the local pads."""
    k = len(window.kernel)
    begins, ends, intervals = [], [], []
    for a in range(k):
        o = out.interval(2 + a)
        s, eff = window.strides[a], (window.kernel[a] - 1) * window.dilations[a] + 1
        size, p0, p1 = window.in_sizes[a], window.pads[a], window.pads[a + k]
        start = o.start * s - p0
        stop = (o.stop - 1) * s - p0 + eff
        iv = Interval(max(0, start), max(max(0, start), min(size, stop)))
        begins.append(iv.start - start)
        ends.append(p1 if o.stop == window.out_size(a) else stop - iv.stop)
        intervals.append(iv)
    return intervals, {"pads": begins + ends}
