"""Lowered programs → the plan's manifest and files, with the per-node accounting."""

from __future__ import annotations

from typing import Any

from bbgrap.backends.lower import Message, NodeProgram, value_name

from bbgrap.cost import plan_flops
from bbgrap.ir import Graph, ShapeMap
from bbgrap.rules.registry import RuleRegistry


def region_json(region: Any) -> list[list[int]]:
    return [[a, b] for a, b in zip(region.starts, region.stops)]


def plan_stats(graph: Graph, programs: list[NodeProgram], messages: list[Message], registry: RuleRegistry | None = None) -> dict[str, Any]:
    sent = [0] * graph.nodes
    received = [0] * graph.nodes
    for m in messages:
        sent[m.src] += m.nbytes
        received[m.dst] += m.nbytes
    flops = plan_flops(graph, registry=registry)
    owned = plan_flops(graph, owned=True, registry=registry)
    producers = graph.producers()
    # a synchronisation point: a layer whose output crosses from one node to another
    sync_points = len({producers[m.tensor].name for m in messages})
    return {
        "bytes_transferred": sum(sent),
        "messages": len(messages),
        "sync_points": sync_points,
        "segments": sum(1 for p in programs for s in p.steps if s.op == "run"),
        "per_node": [
            {"flops": flops[n], "redundant_flops": flops[n] - owned[n], "bytes_sent": sent[n], "bytes_received": received[n],
             "weight_bytes": programs[n].weight_bytes}
            for n in range(graph.nodes)
        ],
    }


def emit(graph: Graph, programs: list[NodeProgram], messages: list[Message],
         registry: RuleRegistry | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's plan part and the segment files, keyed by path in the plan."""
    files: dict[str, bytes] = {}
    programs_json = []
    for prog in programs:
        segments: list[dict[str, Any]] = []
        steps: list[list[Any]] = []
        for step in prog.steps:
            if step.op == "run":
                path = f"node{prog.node}/seg{len(segments):03d}.onnx"
                files[path] = step.segment.model.SerializeToString()
                segments.append({"file": path, "inputs": step.segment.inputs, "outputs": step.segment.outputs})
                steps.append(["run", len(segments) - 1])
            elif step.op == "send":
                steps.append(["send", step.message.id, step.value])
            else:
                steps.append(["wait", step.message.id])
        programs_json.append({"node": prog.node, "segments": segments, "steps": steps, "outputs": prog.outputs})
    tensor = graph.tensors
    manifest = {
        "model": graph.name,
        "nodes": graph.nodes,
        "movement": graph.movement.value,
        "layers": len(graph.layers),
        "opaque": [{"name": la.name, "op_type": la.op_type} for la in graph.layers if la.group == "opaque"],
        "inputs": [{"name": t, "shape": list(tensor[t].shape), "dtype": tensor[t].dtype, "value": value_name(t, ShapeMap.full(tensor[t].shape))} for t in graph.inputs],
        "outputs": [{"name": t, "shape": list(tensor[t].shape), "dtype": tensor[t].dtype} for t in graph.outputs],
        "messages": [
            {"id": m.id, "src": m.src, "dst": m.dst, "tensor": m.tensor, "region": region_json(m.region),
             "shape": list(m.region.shape), "dtype": m.dtype, "value": m.value}
            for m in messages
        ],
        "programs": programs_json,
        "stats": plan_stats(graph, programs, messages, registry),
    }
    return manifest, files
