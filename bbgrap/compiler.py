"""`bbgrap compile`: frontend → pass pipeline → backend → plan directory."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

from bbgrap.config import Config
from bbgrap.ir import Graph
from bbgrap.pass_manager import Pass, PassManager
from bbgrap.plan import write_plan


def pipeline(cfg: Config, optimize: bool = True, search: bool = True,
             progress: Callable[[str, int, int], None] | None = None, recompute: bool = True) -> list[Pass]:
    """The default pipeline `naive-partition → insert-crop-concat → eliminate-transfers → search
    → recompute-halos`, or part of it (`--no-search`, `--no-recompute`, `--no-optimize`)."""
    from bbgrap.passes.eliminate_transfers import EliminateTransfers
    from bbgrap.passes.insert_crop_concat import InsertCropConcat
    from bbgrap.passes.naive_partition import NaivePartition

    passes: list[Pass] = [NaivePartition(cfg.nodes, cfg.direction, cfg.node_speeds(), cfg.custom), InsertCropConcat()]
    if optimize:
        passes.append(EliminateTransfers())
        if search and cfg.nodes > 1:
            from bbgrap.passes.search import SearchPartitions

            passes.append(SearchPartitions(cfg, progress=progress))
        if recompute and cfg.nodes > 1:
            from bbgrap.passes.recompute_halos import RecomputeHalos

            passes.append(RecomputeHalos(speeds=cfg.node_speeds(), progress=progress))
    return passes


def dump_ir(directory: str) -> Callable[[str, Graph], None]:
    from bbgrap.ir_text import format_graph

    def dump(pass_name: str, graph: Graph) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"{pass_name}.txt"), "w") as fh:
            fh.write(format_graph(graph))

    return dump


def compile_model(
    model: str,
    cfg: Config,
    out_dir: str,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    optimize: bool = True,
    search: bool = True,
    dump_after: Sequence[str] = (),
    dump_dir: str = "bbgrap-ir",
    progress: Callable[[str, int, int], None] | None = None,
    log: Callable[[str], None] = lambda s: None,
    recompute: bool = True,
) -> dict[str, Any]:
    """Compile `model` for `cfg.nodes` nodes into `out_dir`; returns the manifest."""
    from bbgrap.backends.emit import emit
    from bbgrap.backends.lower import lower
    from bbgrap.frontends.onnx import import_model

    t0 = time.perf_counter()
    front = import_model(model, input_shapes)
    log(f"imported {model}: {len(front.graph.layers)} layers ({time.perf_counter() - t0:.1f}s)")
    manager = PassManager(pipeline(cfg, optimize, search, progress, recompute), dump_after=dump_after, dump=dump_ir(dump_dir))
    graph = manager.run(front.graph)
    programs, messages = lower(graph)
    plan, files = emit(graph, programs, messages)
    manifest = {
        **plan,
        "direction": cfg.direction,
        "threshold": cfg.threshold,
        "speeds": list(cfg.node_speeds()),
        "passes": [p.name for p in manager.passes],
        "search": dict(graph.search_stats) or None,
        "compile_seconds": round(time.perf_counter() - t0, 3),
    }
    write_plan(out_dir, manifest, files, front.sample_inputs, front.reference_outputs)
    return manifest
