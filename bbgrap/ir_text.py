"""Text form of the IR, for `--dump-ir-after` and for reading a plan's partition."""

from __future__ import annotations

from bbgrap.ir import Graph


def format_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name}: {len(graph.layers)} layers, {graph.nodes} nodes, movement={graph.movement.value}"]
    for layer in graph.layers:
        shapes = ", ".join(f"{t}{list(graph.tensors[t].shape)}" for t in layer.outputs if t in graph.tensors)
        fused = ""
        if layer.fused is not None:  # a quantized model's pattern around the op
            ops = [f"{op.op_type}@{k}" for k, op in layer.fused.inputs] + [op.op_type for op in layer.fused.outputs]
            fused = f" fused[{', '.join(ops)}]"
        lines.append(f"{layer.name}: {layer.op_type}{fused} [{layer.group}] ({', '.join(layer.inputs)}) -> {shapes}")
        part = graph.partitions.get(layer.name)
        if part is None:
            continue
        for n in part.active_nodes():
            needs = ", ".join(str(r) if r is not None else "-" for r in part.needs[n])
            extra = f" computes {part.computes[n]}" if part.computes[n] != part.out[n] else ""
            extra += f" emits {part.emitted(n)}" if part.emitted(n) != part.computes[n] else ""
            attrs = f" attrs {dict(part.attrs[n])}" if part.attrs[n] else ""
            inputs = part.local_inputs(n)
            values = f" inputs {({k: v.tolist() for k, v in inputs.items()})}" if inputs else ""
            lines.append(f"  node {n}: out {part.out[n]}{extra} needs {needs}{attrs}{values}")
    for (t, n), g in sorted(graph.gathers.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        parts = " + ".join(f"{p.region}<-{p.src}" for p in g.parts)
        lines.append(f"gather {t} on node {n}: {g.region} = {parts}")
    return "\n".join(lines) + "\n"
