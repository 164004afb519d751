"""Segment boundaries in onnxruntime's blocked layout (NCHWc), on the CPU.

onnxruntime's CPU provider runs convolutions and pools on channel-blocked tensors
(memory order [N, C/b, H, W, b], b = 8 or 16 by the CPU's vector width) and converts
at the edges of a session: each activation leaving a segment is reordered to NCHW
and reordered back by the segment that reads it, and an Add of a residual that
comes from outside the session no longer fuses into the convolution before it. At
about 20 segments per rank (resnet50 on 2 nodes) that cost 1.3 ms of 43.

Here a 4-D float32 value that crosses a segment boundary (or ranks), whose channels are a
multiple of b, can stay blocked, in an array of the same NCHW shape:

1. `with_blocked_edges`: a blocked graph input is reordered to NCHW where the segment
   begins and a blocked graph output is reordered from NCHW where it ends, with
   onnxruntime's own ReorderOutput/ReorderInput ops;
2. onnxruntime optimises that graph (its NCHWc transformer runs) and we read it back;
3. `fold_reorders` cancels ReorderInput(ReorderOutput(x)) pairs, moves ReorderOutput
   behind the layout-blind ops lowering puts at boundaries (Relu, Add, and Concat, Split
   or Slice along channel blocks, or along rows or columns on a 5-D view), and fuses an
   Add or Relu into the blocked convolution before it, as onnxruntime does inside a session;
4. the folded graph runs with onnxruntime's graph optimisations off: it has them.

Every blockable edge is tried first (`NodeLayout`); each segment then votes, per edge,
whether the blocked layout saved that edge's reorder, and a value stays blocked only where
every segment that makes or reads it, on every node, votes yes (the others are rebuilt with
the edges agreed). Votes and the block are agreed by all ranks before their sessions are
built (`agreed_block`, `merged_votes`), so the rank that sends a halo and the rank that
receives it always agree on its layout; where the blocks differ (different CPUs) or a rank
runs on a GPU, all of them keep NCHW.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import onnx
from bbgrap.backends.threads import probe_options
from onnx import TensorProto, helper, numpy_helper

from bbgrap.rules.base import NCHWC_DOMAIN, is_default_domain

DOMAIN = NCHWC_DOMAIN
LAYOUT_BLIND = ("Relu", "Add", "Concat", "Slice", "Split")  # ops that can run on blocked data (rules in _Folder)


@functools.cache
def block_size() -> int:
    """onnxruntime's NCHWc block on this CPU (8 or 16), or 0 where this build has no NCHWc kernels."""
    import onnxruntime as ort

    graph = helper.make_graph([helper.make_node("ReorderInput", ["x"], ["y"], domain=DOMAIN)], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)], ir_version=9)
    try:
        session = ort.InferenceSession(model.SerializeToString(), probe_options(), providers=["CPUExecutionProvider"])
        padded = session.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})[0].shape[1]
    except Exception:
        return 0
    return int(padded)  # ReorderInput pads 4 channels up to one block


def agreed_block(blocks: Iterable[int]) -> int:
    """The block every rank can use: theirs where all have the same one, else 0 (NCHW)."""
    unique = set(blocks)
    return unique.pop() if len(unique) == 1 else 0


def to_blocked(array: np.ndarray, block: int) -> np.ndarray:
    """An NCHW array's values in NCHWc memory order, in an array of the same shape."""
    n, c, h, w = array.shape
    return np.ascontiguousarray(array.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(n, c, h, w)


def from_blocked(array: np.ndarray, block: int) -> np.ndarray:
    """The inverse of `to_blocked`."""
    n, c, h, w = array.shape
    return np.ascontiguousarray(array.reshape(n, c // block, h, w, block).transpose(0, 1, 4, 2, 3)).reshape(n, c, h, w)


def is_blockable(shape: list[int], elem_type: int, block: int) -> bool:
    return block > 0 and len(shape) == 4 and elem_type == TensorProto.FLOAT and shape[1] > 0 and shape[1] % block == 0


def boundary_values(model: onnx.ModelProto, keep: set[str], block: int) -> set[str]:
    """The segment's inputs and outputs that cross boundaries blocked: all blockable ones
    except `keep` (the model's inputs and outputs, which users see as NCHW)."""
    chosen = set()
    for vi in [*model.graph.input, *model.graph.output]:
        tensor = vi.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        if vi.name not in keep and is_blockable(shape, tensor.elem_type, block):
            chosen.add(vi.name)
    return chosen


def with_blocked_edges(model: onnx.ModelProto, blocked: set[str]) -> onnx.ModelProto:
    """`model` with its inputs and outputs in `blocked` carrying NCHWc data (names kept)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inner = {name: f"{name}/nchw" for name in blocked}  # the NCHW tensor inside the segment
    head = [helper.make_node("ReorderOutput", [vi.name], [inner[vi.name]], domain=DOMAIN,
                             channels=vi.type.tensor_type.shape.dim[1].dim_value)
            for vi in graph.input if vi.name in blocked]
    inputs = {vi.name for vi in graph.input}  # an output that is also an input passes through as it came
    outputs = [o.name for o in graph.output if o.name in blocked and o.name not in inputs]
    tail = [helper.make_node("ReorderInput", [inner[name]], [name], domain=DOMAIN) for name in outputs]
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = inner.get(name, name)
        for i, name in enumerate(node.output):
            node.output[i] = inner.get(name, name) if name in outputs else name
    nodes = [*head, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(op.domain == DOMAIN for op in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out


def shapes_of(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every tensor's static shape, by onnx's shape inference (unknown ones left out)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    return shapes


def optimized(model: onnx.ModelProto, options: Any) -> onnx.ModelProto:
    """`model` as onnxruntime optimises it for this CPU (read back from its optimized_model_filepath)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="bbgrap-nchwc-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        options.optimized_model_filepath = path
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(path)


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class _Folder:
    """One segment's optimised graph, rewritten one local pattern at a time until none applies."""

    def __init__(self, model: onnx.ModelProto, shapes: dict[str, list[int]], block: int) -> None:
        self.model = model
        self.graph = model.graph
        self.nodes = list(model.graph.node)
        self.shapes = dict(shapes)
        self.block = block
        self.outputs = {o.name for o in model.graph.output}
        self.constants = {i.name: i for i in model.graph.initializer}
        self.fresh_names = 0
        self.opset = next((op.version for op in model.opset_import if is_default_domain(op.domain)), 17)

    def run(self) -> onnx.ModelProto:
        rules: list[Callable[[onnx.NodeProto], bool]] = [self.cancel_pair, self.fuse_into_conv, self.move_reorder_later]
        while True:
            self.wanted: dict[str, bool] = {}
            self.producer = {name: n for n in self.nodes for name in n.output}
            self.consumers: dict[str, list[onnx.NodeProto]] = {}
            for n in self.nodes:
                for name in n.input:
                    self.consumers.setdefault(name, []).append(n)
            if not any(rule(n) for n in list(self.nodes) for rule in rules) and not self.drop_dead():
                break
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        return self.model

    # -- helpers ---------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        self.fresh_names += 1
        return f"{base}/nchwc{self.fresh_names}"

    def constant(self, values: list[int]) -> str:
        name = self.fresh("shape")
        self.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def reorder_output(self, name: str) -> onnx.NodeProto | None:
        """The ReorderOutput that makes `name` from a blocked tensor without padding, if one does."""
        node = self.producer.get(name)
        if (node is None or node.domain != DOMAIN or node.op_type != "ReorderOutput"
                or _attr(node, "channels_last", 0) != 0 or _attr(node, "channels", 0) % self.block):
            return None
        return node

    def rename(self, old: str, new: str) -> None:
        for n in self.nodes:
            for i, name in enumerate(n.input):
                if name == old:
                    n.input[i] = new
            for i, name in enumerate(n.output):
                if name == old:
                    n.output[i] = new
        if old in self.shapes:
            self.shapes[new] = self.shapes[old]

    def replace(self, node: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
        i = next(k for k, n in enumerate(self.nodes) if n is node)
        self.nodes[i:i + 1] = new

    # -- rules -----------------------------------------------------------------------------

    def cancel_pair(self, node: onnx.NodeProto) -> bool:
        """ReorderInput(ReorderOutput(x)) -> x."""
        if node.domain != DOMAIN or node.op_type != "ReorderInput" or _attr(node, "channels_last", 0) != 0:
            return False
        source = self.reorder_output(node.input[0])
        if source is None:
            return False
        blocked, result = source.input[0], node.output[0]
        if result not in self.outputs:
            self.replace(node, [])
            self.rename(result, blocked)
        elif blocked in self.producer and blocked not in self.outputs:
            self.replace(node, [])  # the graph output keeps its name: its producer writes it directly
            self.rename(blocked, result)
        else:
            self.replace(node, [helper.make_node("Identity", [blocked], [result])])
        return True

    def fuse_into_conv(self, node: onnx.NodeProto) -> bool:
        """Relu(Conv(x)) -> Conv(x, activation=Relu); Add(Conv(x), r) -> Conv(x, Sum=r), blocked."""
        if node.domain != "" or node.op_type not in ("Relu", "Add"):
            return False
        for i, name in enumerate(node.input):
            conv = self.producer.get(name)
            if (conv is None or conv.domain != DOMAIN or conv.op_type != "Conv" or _attr(conv, "activation") is not None
                    or len(self.consumers.get(name, [])) != 1 or name in self.outputs):
                continue
            if node.op_type == "Add":
                other = node.input[1 - i]
                if len(conv.input) > 3 or self.shapes.get(name) is None or self.shapes.get(name) != self.shapes.get(other):
                    continue
                conv.input.extend([""] * (3 - len(conv.input)) + [other])
            else:
                conv.attribute.append(helper.make_attribute("activation", "Relu"))
            conv.output[0] = node.output[0]
            self.nodes = [n for n in self.nodes if n is not conv]
            self.replace(node, [conv])  # where the Add was: after the producer of its other input
            return True
        return False

    def move_reorder_later(self, node: onnx.NodeProto) -> bool:
        """op(ReorderOutput(x), ...) -> ReorderOutput(op(x, ...)) for ops that do not need NCHW:
        Relu, Add of equal shapes, and Concat, Slice or Split along rows, columns or whole
        channel blocks (on a 5-D view [N, C/b, H, W, b] of the blocked data)."""
        if node.domain != "" or node.op_type not in LAYOUT_BLIND:
            return False
        data = list(node.input) if node.op_type in ("Relu", "Add", "Concat") else [node.input[0]]
        found = [self.reorder_output(name) for name in data]
        sources = [s for s in found if s is not None]
        if len(sources) != len(found):
            return False
        known_in = [self.shapes.get(name) for name in data]
        known_out = [self.shapes.get(name) for name in node.output]
        shapes_in = [s for s in known_in if s is not None and len(s) == 4 and s[1] % self.block == 0]
        shapes_out = [s for s in known_out if s is not None and len(s) == 4 and s[1] % self.block == 0]
        if len(shapes_in) != len(known_in) or len(shapes_out) != len(known_out):
            return False
        blocked_in = [s.input[0] for s in sources]
        blocked_out = [self.fresh(name) for name in node.output]
        if node.op_type in ("Relu", "Add"):
            if len({tuple(s) for s in [*shapes_in, *shapes_out]}) != 1:
                return False  # no broadcasting across the blocked layout
            new = [helper.make_node(node.op_type, blocked_in, blocked_out)]
        else:
            along = self.axes_of(node, shapes_in[0])
            if along is None:
                return False
            axes, starts, ends = along
            if all(a == 1 for a in axes):
                # whole channel blocks: the same bytes as in NCHW, so the op runs on the blocked arrays as is
                moved = onnx.NodeProto()
                moved.CopyFrom(node)
                moved.input[:len(data)] = blocked_in
                moved.output[:] = blocked_out
                new = [moved]
            else:
                if node.op_type != "Slice" and not any(self.wanted_blocked(name) for name in node.output):
                    return False  # a Concat or Split on 5-D views that a NCHW reader would undo
                views = [self.fresh(name) for name in blocked_in]
                parts = [self.fresh(name) for name in blocked_out]
                new = [helper.make_node("Reshape", [name, self.constant(self.five_d(shape))], [view])
                       for name, shape, view in zip(blocked_in, shapes_in, views)]
                new.append(self.on_view(node, axes, starts, ends, views, shapes_out, parts))
                new += [helper.make_node("Reshape", [part, self.constant(shape)], [out])
                        for part, shape, out in zip(parts, shapes_out, blocked_out)]
        new += [helper.make_node("ReorderOutput", [out], [result], domain=DOMAIN, channels=shape[1])
                for out, result, shape in zip(blocked_out, node.output, shapes_out)]
        self.shapes.update(zip(blocked_in, shapes_in))
        self.shapes.update(zip(blocked_out, shapes_out))
        self.replace(node, new)
        return True

    def wanted_blocked(self, name: str) -> bool:
        """Some reader of `name` takes it blocked: a ReorderInput, or a layout-blind op whose
        results are wanted blocked in turn. Moving the reorders of a row or column Concat
        (or Split) past it pays only then: where all its readers want NCHW, the same data is
        reordered after it instead of before, plus the 5-D views (densenet's concats feed
        BatchNormalization, which runs in NCHW). Relu and Add always pay (onnxruntime fuses
        them into the convolution before), a Slice reorders less after it, and ops along
        channels need no views."""
        if name not in self.wanted:
            self.wanted[name] = any(
                (r.domain == DOMAIN and r.op_type == "ReorderInput")
                or (r.domain == "" and r.op_type in LAYOUT_BLIND and any(self.wanted_blocked(o) for o in r.output))
                for r in self.consumers.get(name, []))
        return self.wanted[name]

    def axes_of(self, node: onnx.NodeProto, shape: list[int]) -> tuple[list[int], list[int], list[int]] | None:
        """The axes a Concat, Split or Slice works along (non-negative), with a Slice's starts and
        ends (channel bounds clipped to `shape`); None where they do not carry over to blocked
        data: other axes than channels, rows and columns, a Slice's default axes, explicit
        steps or computed bounds, or a channel bound off a block."""
        if node.op_type in ("Concat", "Split"):
            axis = _attr(node, "axis", 0)
            axes, starts, ends = [axis + 4 if axis < 0 else axis], [], []
        elif len(node.input) != 4 or any(name not in self.constants for name in node.input[1:]):
            return None
        else:
            starts, ends, axes = ([int(v) for v in numpy_helper.to_array(self.constants[name]).ravel()] for name in node.input[1:])
            axes = [a + 4 if a < 0 else a for a in axes]
            for k, a in enumerate(axes):
                if a == 1:
                    starts[k], ends[k] = (min(max(v + shape[1] if v < 0 else v, 0), shape[1]) for v in (starts[k], ends[k]))
                    if starts[k] % self.block or ends[k] % self.block:
                        return None
        return (axes, starts, ends) if all(a in (1, 2, 3) for a in axes) else None

    def five_d(self, shape: list[int]) -> list[int]:
        n, c, h, w = shape
        return [n, c // self.block, h, w, self.block]

    def on_view(self, node: onnx.NodeProto, axes: list[int], starts: list[int], ends: list[int], views: list[str],
                shapes_out: list[list[int]], parts: list[str]) -> onnx.NodeProto:
        """`node` (Concat, Split or Slice along `axes`, from axes_of) redone on 5-D views of
        blocked data, where a channel index counts blocks."""
        blocks = [self.block if a == 1 else 1 for a in axes]
        if node.op_type == "Concat":
            return helper.make_node("Concat", views, parts, axis=axes[0])
        if node.op_type == "Split":
            sizes = [s[axes[0]] // blocks[0] for s in shapes_out]
            if self.opset < 13:
                return helper.make_node("Split", views, parts, axis=axes[0], split=sizes)
            return helper.make_node("Split", [views[0], self.constant(sizes)], parts, axis=axes[0])
        return helper.make_node("Slice", [views[0], self.constant([v // b for v, b in zip(starts, blocks)]),
                                          self.constant([v // b for v, b in zip(ends, blocks)]), self.constant(axes)], parts)

    def drop_dead(self) -> bool:
        """Remove nodes none of whose outputs are used (ReorderOutputs left behind)."""
        used = {name for n in self.nodes for name in n.input} | self.outputs
        alive = [n for n in self.nodes if any(name in used for name in n.output)]
        changed = len(alive) != len(self.nodes)
        self.nodes = alive
        return changed


def fold_reorders(model: onnx.ModelProto, shapes: dict[str, list[int]], block: int) -> onnx.ModelProto:
    """`model` (optimised by onnxruntime) without the reorders its blocked edges made needless."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return _Folder(out, shapes, block).run()


def blocked_model(model: onnx.ModelProto, blocked: set[str], block: int, make_options: Callable[[], Any]) -> onnx.ModelProto:
    """The segment `model` with the inputs and outputs in `blocked` in NCHWc, optimised by
    onnxruntime for this CPU and folded: to run with onnxruntime's graph optimisations off."""
    shapes = shapes_of(model)
    shapes.update({f"{name}/nchw": shapes[name] for name in blocked if name in shapes})
    return fold_reorders(optimized(with_blocked_edges(model, blocked), make_options()), shapes, block)


def edge_votes(folded: onnx.ModelProto, blocked: set[str]) -> dict[str, bool]:
    """For each blocked edge of a folded segment, whether the layout saved its reorder: an
    input that no ReorderOutput reads any more, an output that no ReorderInput makes."""
    read = {n.input[0] for n in folded.graph.node if n.domain == DOMAIN and n.op_type == "ReorderOutput"}
    made = {n.output[0] for n in folded.graph.node if n.domain == DOMAIN and n.op_type == "ReorderInput"}
    votes = {vi.name: vi.name not in read for vi in folded.graph.input if vi.name in blocked}
    votes.update({vo.name: vo.name not in made for vo in folded.graph.output if vo.name in blocked})
    return votes


def merged_votes(votes: Iterable[dict[str, bool]]) -> dict[str, bool]:
    """A value stays blocked only where every segment that makes or reads it, on any node, gains."""
    merged: dict[str, bool] = {}
    for part in votes:
        for name, ok in part.items():
            merged[name] = merged.get(name, True) and ok
    return merged


def _stem(k: int, agreed: bool) -> str:
    """The name of segment k's files in a NodeLayout's directory: with all its blocked edges, or
    with those all nodes agreed on where that is fewer."""
    return f"seg{k}-agreed" if agreed else f"seg{k}"


class NodeLayout:
    """One node's segments with blocked edges. Every blockable edge is tried first; a value
    then stays blocked only where all segments that make or read it, on every node, lose a
    reorder by it (`agree`, with the votes of all nodes), because a value that onnxruntime
    makes and reads in NCHW anyway would only gain two reorders (densenet's concatenations).
    Votes depend on the segments only, so the ranks that send and receive a halo agree.

    The segments are taken one at a time (`loads[k]()`), and each folded segment is kept in a
    directory of its own with its weights as external data, not in memory: holding every
    segment's model and its folded copy until the sessions are built had taken a rank's peak
    memory to about twice that of the same plan in NCHW."""

    def __init__(self, loads: Sequence[Callable[[], onnx.ModelProto]], keep: set[str], block: int,
                 make_options: Callable[[], Any]) -> None:
        self.block, self.make_options, self.loads = block, make_options, loads
        self.workdir = tempfile.TemporaryDirectory(prefix="bbgrap-layout-")
        self.edges: list[set[str]] = []
        self.folded: list[str | None] = []  # the file of each segment with all its edges blocked
        votes = []
        for k, load in enumerate(loads):
            model = load()
            edges = boundary_values(model, keep, block)
            self.edges.append(edges)
            folded = blocked_model(model, edges, block, make_options) if edges else None
            if folded is not None:
                votes.append(edge_votes(folded, edges))
            self.folded.append(self.store(folded, _stem(k, agreed=False)) if folded is not None else None)
        self.votes = merged_votes(votes)
        self.agreed: set[str] = set()
        self.released: set[int] = set()

    def store(self, model: onnx.ModelProto, name: str) -> str:
        """`model` saved in the work directory, its weights beside it; the file's path."""
        path = os.path.join(self.workdir.name, f"{name}.onnx")
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f"{name}.bin",
                        size_threshold=1024)
        return path

    def agree(self, votes: Iterable[dict[str, bool]]) -> None:
        self.agreed = {name for name, ok in merged_votes(votes).items() if ok}

    def path(self, k: int) -> str | None:
        """The file of segment k as it runs, or None where none of its edges stays blocked (the
        plain segment runs); valid until `release(k)` or `close`."""
        assert k not in self.released, f"segment {k}'s layout was released once its session was built"
        edges = self.edges[k] & self.agreed
        if not edges:
            return None
        path = self.folded[k]
        if edges != self.edges[k]:
            path = self.store(blocked_model(self.loads[k](), edges, self.block, self.make_options), _stem(k, agreed=True))
        return path

    def model(self, k: int) -> onnx.ModelProto | None:
        """Segment k as it runs, weights included, or None (as `path`)."""
        path = self.path(k)
        return onnx.load(path) if path is not None else None

    def release(self, k: int) -> None:
        """Remove segment k's files, once its session is built (it keeps what it read): where the
        temporary directory is a tmpfs, they are memory too."""
        for stem in (_stem(k, agreed=False), _stem(k, agreed=True)):
            for suffix in (".onnx", ".bin"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.workdir.name, stem + suffix))
        self.released.add(k)

    def close(self) -> None:
        """Remove the folded segments' files (sessions already built from them keep what they read)."""
        self.workdir.cleanup()
