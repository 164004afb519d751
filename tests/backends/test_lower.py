"""Lowering's segment layout: copy-only segments fold into the segment before them."""

from __future__ import annotations

from onnx import helper

from bbgrap import zoo
from bbgrap.backends.lower import COPY_OPS, Message, Segment, Step, _merge_copy_segments, lower
from bbgrap.compiler import compile_model, pipeline
from bbgrap.config import Config
from bbgrap.frontends.onnx import import_model
from bbgrap.ir import ShapeMap
from bbgrap.pass_manager import PassManager
from helpers import assert_exact, save


def run(*ops: str) -> Step:
    return Step("run", segment=Segment(nodes=[helper.make_node(op, ["x"], [f"y{k}"]) for k, op in enumerate(ops)]))


def message(k: int) -> Message:
    return Message(k, 0, 1, "t", ShapeMap.full((1, 1)), "float32")


def layout(steps: list[Step]) -> list[str]:
    return [",".join(n.op_type for n in s.segment.nodes) if s.op == "run" else s.op for s in steps]


def test_copy_segment_folds_back_over_sends_but_not_over_a_wait() -> None:
    steps = [run("Conv"), Step("send", message=message(0)), run("Slice", "Concat"), Step("wait", message=message(1)),
             run("Concat"), run("Conv"), Step("send", message=message(2)), run("Relu")]
    assert layout(_merge_copy_segments(steps)) == ["Conv,Slice,Concat", "send", "wait", "Concat", "Conv", "send", "Relu"]


def test_plans_keep_no_copy_segment_after_sends_and_stay_exact(tmp_path) -> None:
    # at this size resnet50's node 0 crops a tensor right after sending its neighbour's part
    # (as full-size mobilenet_v2's channel-cut tail does): without the fold, a segment of its own
    model = save(zoo.build("resnet50", resolution=64, width=0.25, seed=3), str(tmp_path))
    compile_model(model, Config(nodes=2), str(tmp_path / "plan"))
    assert_exact(str(tmp_path / "plan"))
    programs, _ = lower(PassManager(pipeline(Config(nodes=2))).run(import_model(model).graph))
    for prog in programs:
        before = ""  # the last step that is not a send
        for step in prog.steps:
            if step.op == "run" and all(n.op_type in COPY_OPS for n in step.segment.nodes):
                assert before != "run", f"node {prog.node}: a copy-only segment follows a segment with only sends between"
            if step.op != "send":
                before = step.op
