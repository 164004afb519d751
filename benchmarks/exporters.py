"""Models from the PyTorch ONNX exporters (issue 14): each model exported with the TorchScript
exporter (dynamo=False, opset 17) and the dynamo exporter (its default opset), or both at --opset,
compiled for 2 and
4 nodes (16 with --nodes), run in this process and checked against the plan's reference.

Needs torch (pip install -e ".[export]"). Uses torchvision's architectures at 224 x 224 where
torchvision imports (with its compiled operators left out where they do not load:
`import_torchvision`), else small hand-written equivalents at 64 x 64. Per (model, exporter,
nodes): compile seconds, max relative error (exact: <= 1e-4), per-node FLOPs max/min, the share
of the model's FLOPs in layers computed whole on one node, of the largest such layer, and their number. A
failed export or compile is a row, not a skip.

The error is the largest over the model's outputs and its features: the input of its last layer with
weights (the classifier's, a segmentation head's last convolution), made an output of the file compiled
(`with_features`) and compared with its own scale. Untrained torchvision models' activations fade
through the network (googlenet's features are about 1e-11 after `init_weights`), so their logits are
the classifier's bias whatever the backbone computes, and a check of the logits alone could not fail.

  python benchmarks/exporters.py                               # the default models, nodes 2 and 4
  python benchmarks/exporters.py --models all --nodes 2 4 16   # every torchvision model
  python benchmarks/exporters.py --models resnet18 --nodes 2 4 16 --json
  python benchmarks/exporters.py --models all --keep-exports exported   # ... and keep each export as exported/MODEL-EXPORTER.onnx
  python benchmarks/exporters.py --files exported/*.onnx --nodes 2 4 16   # files exported before (no torch)
  python benchmarks/exporters.py --files exported/*.onnx --nodes 3 --direction c --planner heft
  python benchmarks/exporters.py --files exported/*.onnx --nodes 2 4 --balance 1.3   # every node's work within 1.3x
  python benchmarks/exporters.py --exporters torchscript --opset 11   # an older opset, as older exports have
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

from bbgrap.backends.runtime import compare, embedded_runners, run_embedded
from table import Table  # benchmarks/table.py, beside this script

from bbgrap.compiler import compile_model
from bbgrap.config import PLANNERS, Config, Direction
from bbgrap.plan import read_manifest, read_sample
from bbgrap.plan_schema import Plan

TOLERANCE = 1e-4  # max error relative to the output's largest magnitude (issue #2), as the tests
EXPORTERS = ("torchscript", "dynamo")
TORCHVISION_DEFAULT = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x0_5", "convnext_tiny",
                       "vit_b_16", "swin_t")
TORCHVISION_ALL = (  # every torchvision classification and segmentation architecture, one size each
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet", "inception_v3",
    "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_400mf",
    "regnet_y_400mf", "resnet18", "resnet50", "resnext50_32x4d", "shufflenet_v2_x0_5", "squeezenet1_0", "swin_t",
    "swin_v2_t", "vgg11", "vit_b_16", "wide_resnet50_2",
    "fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")
SEGMENTATION = ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")
HANDWRITTEN = ("resnet_block", "mobilenet_v3_block", "convnext_block", "tiny_vit", "shufflenet_block")


def handwritten(name: str) -> tuple[Any, int]:
    """Small plain-torch equivalents of the torchvision architectures (when torchvision is missing)."""
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.down(x))

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.fc1 = nn.Conv2d(c, c // 4, 1)
            self.fc2 = nn.Conv2d(c // 4, c, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.mean((2, 3), keepdim=True)
            return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))

    class InvertedResidual(nn.Module):
        def __init__(self, c: int, expand: int) -> None:
            super().__init__()
            e = c * expand
            self.body = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish(),
                                      nn.Conv2d(e, e, 3, 1, 1, groups=e, bias=False), nn.BatchNorm2d(e), nn.Hardswish(),
                                      SqueezeExcite(e), nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.body(x)

    class ConvNeXtBlock(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm = nn.LayerNorm(c, eps=1e-6)
            self.fc1 = nn.Linear(c, 4 * c)
            self.fc2 = nn.Linear(4 * c, c)
            self.gamma = nn.Parameter(torch.full((c,), 0.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.dw(x).permute(0, 2, 3, 1)  # channels last
            y = self.fc2(nn.functional.gelu(self.fc1(self.norm(y)))) * self.gamma
            return x + y.permute(0, 3, 1, 2)

    class ChannelShuffle(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            h = c // 2
            self.branch = nn.Sequential(nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(),
                                        nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h),
                                        nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = x.chunk(2, dim=1)
            y = torch.cat((a, self.branch(b)), dim=1)
            n, c, h, w = y.shape
            return y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)

    class TinyViT(nn.Module):
        def __init__(self, dim: int = 64, patch: int = 8, image: int = 64, depth: int = 2, heads: int = 4, classes: int = 10) -> None:
            super().__init__()
            self.embed = nn.Conv2d(3, dim, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
            layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.embed(x).flatten(2).transpose(1, 2)
            t = torch.cat((self.cls.expand(x.shape[0], -1, -1), t), dim=1) + self.pos
            return self.head(self.norm(self.encoder(t))[:, 0])

    stem = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
    if name == "resnet_block":
        return nn.Sequential(*stem, Basic(32, 32, 1), Basic(32, 64, 2), Basic(64, 64, 1)), 64
    if name == "mobilenet_v3_block":
        return nn.Sequential(*stem, InvertedResidual(32, 3), InvertedResidual(32, 4)), 64
    if name == "convnext_block":
        return nn.Sequential(nn.Conv2d(3, 48, 4, 4), ConvNeXtBlock(48), ConvNeXtBlock(48)), 64
    if name == "tiny_vit":
        return TinyViT(), 64
    if name == "shufflenet_block":
        return nn.Sequential(*stem, ChannelShuffle(32), ChannelShuffle(32)), 64
    raise SystemExit(f"unknown model {name!r}")


def import_torchvision() -> Any | None:
    """torchvision, or None where it does not import.

    PyPI has no CPU build of torchvision: beside a CPU torch its compiled operators (nms,
    roi_align, ...) do not load, and the import fails while registering their meta kernels
    ("operator torchvision::nms does not exist"). The classification and segmentation models
    use none of those operators, so where the plain import fails the registration module is
    stood in for by an empty one and the import tried again."""
    try:
        import torchvision

        return torchvision
    except Exception:
        pass
    import types

    for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[key]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    try:
        import torchvision

        return torchvision
    except Exception:
        return None


def segmentation_out(model: Any) -> Any:
    """A torchvision segmentation model with its "out" map as its one output (it returns a dict)."""
    from torch import nn

    class Out(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any) -> Any:
            return self.model(x)["out"]

    return Out()


def build(name: str, torchvision: Any | None, resolution: int | None) -> tuple[Any, int]:
    """The model in eval mode with seeded weights, and its input resolution (224, inception_v3
    299, the hand-written ones 64, unless `resolution` says otherwise). A weight matrix that
    starts all zero (vit_b_16's classifier) is drawn at random instead: with it the output is 0
    for every input, and a plan's error against it 0 whatever the plan computes."""
    import torch

    torch.manual_seed(0)
    if name in TORCHVISION_ALL:
        if torchvision is None:
            raise SystemExit(f"{name} needs torchvision, which does not import here")
        size = resolution or (299 if name == "inception_v3" else 224)
        if name in SEGMENTATION:
            model = segmentation_out(getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None))
        elif name == "vit_b_16":
            model = torchvision.models.vit_b_16(weights=None, image_size=size)
        elif name in ("googlenet", "inception_v3"):
            model = getattr(torchvision.models, name)(weights=None, aux_logits=False, init_weights=True)
        else:
            model = getattr(torchvision.models, name)(weights=None)
    else:
        model, size = handwritten(name)
        size = resolution or size
    with torch.no_grad():  # vit_b_16's head starts at zero: every output 0, a check against it could not fail
        for param in model.parameters():
            if param.dim() >= 2 and not param.any():
                param.normal_(0.0, 0.02)
    return model.eval(), size


def export(model: Any, resolution: int, exporter: str, path: str, opset: int | None = None) -> None:
    """Export `model` on a random image with `exporter` at `opset` (None: 17 for the TorchScript
    exporter, the dynamo exporter's own default)."""
    import torch

    x = torch.randn(1, 3, resolution, resolution)
    with warnings.catch_warnings():  # grad on: no fused fast path (TransformerEncoderLayer) the TorchScript exporter lacks
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=opset or 17, input_names=["input"], output_names=["output"])
        else:  # weights inside the one file, as the TorchScript exporter writes them
            torch.onnx.export(model, (x,), path, dynamo=True, external_data=False, verbose=False, opset_version=opset,
                              input_names=["input"], output_names=["output"])


def with_features(path: str, work: str) -> tuple[str, str]:
    """A copy of the ONNX file at `path` in `work` whose outputs also hold its features: the
    activation input of its last Gemm, MatMul or Conv whose weight is a constant (module docstring),
    and that value's name; `path` and "" where it has none, or one whose shape onnx does not infer
    (the row then says its outputs alone were checked), or where that value is an output already."""
    import onnx

    model = onnx.load(path)
    constants = {t.name for t in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    weighted = [n for n in model.graph.node if n.op_type in ("Gemm", "MatMul", "Conv") and len(n.input) > 1 and n.input[1] in constants]
    outputs = {o.name for o in model.graph.output}
    if not weighted or weighted[-1].input[0] in outputs or weighted[-1].input[0] in constants:
        return path, ""
    feature = weighted[-1].input[0]
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    if feature not in inferred:
        return path, ""
    model.graph.output.append(inferred[feature])
    copy = os.path.join(work, "features-" + os.path.basename(path))
    onnx.save(model, copy)
    return copy, feature


def check(plan_dir: str) -> float:
    """Run every node in this process; the max relative error against the plan's reference
    (`compare`'s: infinite where an output is not finite and the reference is)."""
    manifest = read_manifest(plan_dir)
    sample, reference = read_sample(plan_dir)
    runners = embedded_runners(plan_dir, manifest, 1, "cpu", False, "off", "auto")
    _, rel = compare(run_embedded(runners, sample), reference)
    return rel if rel is not None else math.nan


def figures(plan: Plan) -> dict[str, Any]:
    """Per-node FLOPs max/min; the FLOPs share of the layers computed whole on one node, of the
    largest of them, and their count."""
    flops = [n.flops for n in plan.stats.per_node]
    rows = plan.compiled.layer_table
    total = sum(r.flops for r in rows)
    whole = [r for r in rows if r.whole is not None]
    return {"flops_max_min": (max(flops) / min(flops)) if flops and min(flops) > 0 else math.inf,
            "whole_flops_share": (sum(r.flops for r in whole) / total) if total > 0 else 0.0,
            "largest_whole_share": (max((r.flops for r in whole), default=0.0) / total) if total > 0 else 0.0,
            "whole_layers": len(whole), "layers": len(rows),
            "whole_ops": sorted({r.op_type for r in whole})}


def survey(path: str, base: dict[str, Any], args: argparse.Namespace, work: str, emit: Callable[..., None]) -> list[dict[str, Any]]:
    """One ONNX file compiled for each of `args.nodes` and run in this process: a row per node count
    (a failed compile or run is a row saying so)."""
    rows: list[dict[str, Any]] = []
    path, features = with_features(path, work)
    for nodes in args.nodes:
        plan_dir = os.path.join(work, f"plan-{base['model']}-{base['exporter']}-{nodes}")
        cfg = Config(nodes=nodes, threshold=args.threshold, direction=Direction(args.direction), search=args.search, planner=args.planner,
                     balance=args.balance)
        row: dict[str, Any] = base | {"nodes": nodes, "features": features}
        try:
            t0 = time.perf_counter()
            plan = compile_model(path, cfg, plan_dir)
            row["compile_s"] = time.perf_counter() - t0
        except Exception as e:
            row["error"] = f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"
            rows.append(row)
            emit(base["model"], base["exporter"], nodes, "-", "-", "-", "-", "-", "-", "-", "  " + row["error"])
            continue
        row |= figures(plan)
        try:
            row["max_rel_error"] = check(plan_dir)
            row["ok"] = bool(row["max_rel_error"] <= TOLERANCE)
        except Exception as e:
            row["error"] = f"run failed: {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"
            row["max_rel_error"], row["ok"] = None, False
        rows.append(row)
        whole_ops = ",".join(row["whole_ops"][:4]) + (",..." if len(row["whole_ops"]) > 4 else "")
        note = row.get("error") or ("" if features else "  outputs alone checked (no features)") + (f"  whole: {whole_ops}" if whole_ops else "")
        rel = row["max_rel_error"]
        emit(base["model"], base["exporter"], nodes, f"{row['compile_s']:.2f}", "-" if rel is None else f"{rel:.1e}",
             "yes" if row["ok"] else "NO", f"{row['flops_max_min']:.3f}", f"{100 * row['whole_flops_share']:.1f} %",
             f"{100 * row['largest_whole_share']:.1f} %", f"{row['whole_layers']}/{row['layers']}", note)
        shutil.rmtree(plan_dir, ignore_errors=True)  # a 16-node plan of a large model is hundreds of MB
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=None,
                   help="model names, or 'all' for every torchvision classification and segmentation model "
                        f"(default: {' '.join(TORCHVISION_DEFAULT)}; the hand-written ones without torchvision)")
    p.add_argument("--resolution", type=int, default=None, help="input height and width (default 224, inception_v3 299)")
    p.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=EXPORTERS)
    p.add_argument("--opset", type=int, default=None,
                   help="the ONNX opset both exporters write (default: 17 for the TorchScript exporter, the dynamo "
                        "exporter's own; the TorchScript exporter writes opset 11 and up for these models, 14 and up "
                        "for vit_b_16's attention)")
    p.add_argument("--nodes", nargs="+", type=int, default=[2, 4])
    p.add_argument("--threshold", type=float, default=20.0)
    p.add_argument("--direction", default="h")
    p.add_argument("--search", default="exact")
    p.add_argument("--planner", default=Config.planner, choices=PLANNERS, help=f"as compile's --planner (default {Config.planner})")
    p.add_argument("--balance", type=float, default=0.0, metavar="R", help="as compile's --balance (default 0: no bound)")
    p.add_argument("--files", nargs="+", default=None, metavar="ONNX",
                   help="compile these ONNX files (exported before, named MODEL-EXPORTER.onnx or any name) "
                        "instead of exporting models: needs no torch")
    p.add_argument("--keep-exports", metavar="DIR",
                   help="export into DIR, a new or empty directory, and keep the files there as MODEL-EXPORTER.onnx, "
                        "which --files reads back (default: a temporary directory, deleted at the end)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.keep_exports and os.path.exists(args.keep_exports) and (not os.path.isdir(args.keep_exports) or os.listdir(args.keep_exports)):
        p.error(f"--keep-exports {args.keep_exports}: not a new or empty directory; name another one")
    table = Table([("model", "<28"), ("exporter", "<13"), ("nodes", ">6"), ("compile s", ">10"), ("max rel err", ">12"),
                   ("exact", ">6"), ("flops max/min", ">14"), ("whole flops", ">12"), ("largest", ">8"), ("whole layers", ">13"), ("  note", "<")])
    emit: Callable[..., None] = (lambda *v: None) if args.json else table.row
    rows: list[dict[str, Any]] = []
    if args.files:
        with tempfile.TemporaryDirectory(prefix="bbgrap-exporters-") as work:
            for path in args.files:
                stem = os.path.splitext(os.path.basename(path))[0]
                name, _, exporter = stem.rpartition("-") if stem.rsplit("-", 1)[-1] in EXPORTERS else (stem, "", "file")
                rows += survey(path, {"model": name, "exporter": exporter}, args, work, emit)
        if args.json:
            print(json.dumps({"threshold": args.threshold, "rows": rows}, indent=1))
        return 0
    try:
        import torch
    except ImportError:
        print("benchmarks/exporters.py needs torch: pip install -e '.[export]' (torch==2.13.0, onnxscript)", file=sys.stderr)
        return 2
    torchvision = import_torchvision()
    models = (list(TORCHVISION_ALL) if args.models == ["all"] else args.models
              or (list(TORCHVISION_DEFAULT) if torchvision is not None else list(HANDWRITTEN)))
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    if args.keep_exports:
        os.makedirs(args.keep_exports, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bbgrap-exporters-") as work:
        for name in models:
            model, resolution = build(name, torchvision, args.resolution)
            for exporter in args.exporters:
                path = os.path.join(args.keep_exports or work, f"{name}-{exporter}.onnx")
                base = {"model": name, "exporter": exporter, "resolution": resolution, "opset": args.opset}
                try:
                    t0 = time.perf_counter()
                    export(model, resolution, exporter, path, args.opset)
                    base["export_s"] = time.perf_counter() - t0
                except Exception as e:  # an exporter that fails for this model: one row says so
                    note = f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"
                    rows.append(base | {"nodes": None, "error": note})
                    emit(name, exporter, "-", "-", "-", "-", "-", "-", "-", "-", "  " + note)
                    continue
                rows += survey(path, base, args, work, emit)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threshold": args.threshold, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
