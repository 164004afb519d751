"""`bbgrap inspect --svg`: a picture of the plan for every zoo model, rendered (cairosvg, on
libcairo) to check it is a valid image of the expected size showing every node's colour."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from helpers import compile_plan, save

from bbgrap import zoo
from bbgrap.picture import node_colour, size
from bbgrap.plan import read_manifest

BIN = os.path.dirname(sys.executable)


def rendered(svg_path: str) -> object:
    import cairosvg
    from PIL import Image

    return Image.open(io.BytesIO(cairosvg.svg2png(url=svg_path))).convert("RGB")


@pytest.mark.parametrize("name", zoo.NAMES)
def test_every_zoo_model_has_a_picture_and_a_layer_table(tmp_path, name: str) -> None:
    model = save(zoo.build(name, resolution=32, width=0.125), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(model, plan, nodes=4, direction="h")
    svg = str(tmp_path / "plan.svg")
    proc = subprocess.run([os.path.join(BIN, "bbgrap"), "inspect", plan, "--svg", svg], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    rows = read_manifest(plan).compiled.layer_table
    image = rendered(svg)
    assert image.size == size(len(rows))
    colours = {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in map(node_colour, range(4))}
    assert colours <= {rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}, "a node's band is missing"
    layers = subprocess.run([os.path.join(BIN, "bbgrap"), "inspect", plan, "--layers"], capture_output=True, text=True, timeout=60)
    assert layers.returncode == 0 and len(layers.stdout.strip().splitlines()) == len(rows) + 1


def test_svg_into_a_missing_directory_is_one_line(tmp_path) -> None:
    model = save(zoo.build("resnet18", resolution=32, width=0.125), str(tmp_path))
    compile_plan(model, str(tmp_path / "plan"), nodes=2)
    proc = subprocess.run([os.path.join(BIN, "bbgrap"), "inspect", str(tmp_path / "plan"), "--svg", str(tmp_path / "no" / "p.svg")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "does not exist" in proc.stderr
    assert not (tmp_path / "no").exists()
