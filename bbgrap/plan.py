"""The plan directory: a versioned manifest, each node's ONNX segments, and a
sample input with the original model's output on it.

```
plan.json            manifest (format, version, nodes, programs, messages, stats)
sample.npz           inputs (`input:NAME`) and reference outputs (`output:NAME`)
node<N>/seg<K>.onnx  node N's segments, holding only the weights node N uses
```
A plan is written to a temporary directory beside the target and renamed into
place, so a failed compile never leaves a half-written plan.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Mapping

import numpy as np

from bbgrap.ir import BBGrapError

PLAN_FORMAT = "bbgrap-plan"
PLAN_VERSION = 1
MANIFEST = "plan.json"
SAMPLE = "sample.npz"


def write_plan(directory: str, manifest: Mapping[str, Any], files: Mapping[str, bytes],
               inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
    """Write the plan atomically: everything into a temporary sibling, then rename."""
    target = os.path.abspath(directory)
    parent = os.path.dirname(target)
    if os.path.exists(target) and not os.path.isfile(os.path.join(target, MANIFEST)) and os.listdir(target):
        raise BBGrapError(f"'{directory}' exists and is not a bbgrap plan; choose another -o DIR or remove it")
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".bbgrap-plan-", dir=parent)
    try:
        for rel, data in files.items():
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
        arrays = {f"input:{k}": v for k, v in inputs.items()} | {f"output:{k}": v for k, v in outputs.items()}
        np.savez(os.path.join(tmp, SAMPLE), **arrays)
        body = {"format": PLAN_FORMAT, "version": PLAN_VERSION, **manifest}
        with open(os.path.join(tmp, MANIFEST), "w") as fh:
            json.dump(body, fh, indent=1)
        if os.path.exists(target):
            old = tempfile.mkdtemp(prefix=".bbgrap-old-", dir=parent)
            os.rename(target, os.path.join(old, "plan"))
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise BBGrapError(f"'{directory}' is not a bbgrap plan (no {MANIFEST}); run 'bbgrap compile MODEL -o {directory}' first")
    try:
        with open(path) as fh:
            manifest = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise BBGrapError(f"{path} is unreadable ({exc}); compile the plan again") from None
    if manifest.get("format") != PLAN_FORMAT:
        raise BBGrapError(f"{path} is not a bbgrap plan manifest; compile the plan again")
    if manifest.get("version") != PLAN_VERSION:
        raise BBGrapError(
            f"plan '{directory}' has format version {manifest.get('version')}, this bbgrap reads version {PLAN_VERSION}; "
            f"compile it again with this bbgrap"
        )
    return manifest


def read_sample(directory: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    with np.load(os.path.join(directory, SAMPLE)) as data:
        inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
        outputs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs
