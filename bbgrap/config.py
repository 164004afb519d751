"""Cluster and search configuration: one TOML file (configs/*.toml), CLI flags on top.

Every invalid value gets one error line naming the key and the file.
"""

from __future__ import annotations

import enum
import math
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from bbgrap.ir import BBGrapError
from bbgrap.search.objective import Weights


class Direction(enum.Enum):
    """The axis a layer is cut along, named as for an NCHW tensor."""

    N = "n"  # batch
    C = "c"  # channels
    H = "h"  # height
    W = "w"  # width (the last axis)

    def axis(self, rank: int) -> int | None:
        """The output axis this direction names in a tensor of `rank` (None: it has no such axis)."""
        if self is Direction.N:
            return 0 if rank >= 1 else None  # a scalar (a rank-0 Gather index) has no batch axis
        if self is Direction.C:
            return 1 if rank >= 2 else None
        if rank < 3:
            return None
        if self is Direction.H:
            return 2
        return rank - 1 if rank >= 4 else None


DIRECTIONS = tuple(d.value for d in Direction)


def parse_direction(text: str, problem: Callable[[str], BBGrapError]) -> Direction:
    """The direction `text` names; else the error `problem` makes of what is wrong with it."""
    try:
        return Direction(text)
    except ValueError:
        raise problem(f"must be one of {', '.join(DIRECTIONS)}, not '{text}'") from None

SEARCHES = ("exact", "pruned-tree", "exhaustive")
# greedy: the per-layer search alone; dp, heft, ga, map-elites: a whole-network planner after it (bbgrap/search/network.py)
PLANNERS = ("greedy", "dp", "heft", "ga", "map-elites")
# More nodes than any model here has rows or channels to share out; compile time and memory grow with the count.
MAX_NODES = 1024
# Node speeds further apart than this leave the slow nodes no work at all (and overflow the cut's sizes).
MAX_SPEED_RATIO = 1e6


@dataclass(frozen=True)
class CustomPartition:
    """A user's own cut of one layer: direction, and optionally the size per node."""

    layer: str
    direction: Direction
    sizes: tuple[int, ...] | None = None


# Objective weights (thesis table 3.3). Work is counted in FLOPs and data in values, so
# data_w says how many FLOPs moving one value is worth: 100 fits a ~1 GB/s link between
# nodes of ~25 GFLOP/s. The thesis tunes these by hand; so can the config file.
DEFAULT_WEIGHTS = Weights(operations_w=1.0, data_w=100.0, over_w=1.0, harmonic_w=0.5)


@dataclass(frozen=True)
class Config:
    nodes: int = 1
    speeds: tuple[float, ...] = ()
    memory_mb: tuple[float, ...] = ()
    threshold: float = 20.0
    direction: Direction = Direction.H
    search: str = "exact"
    planner: str = "dp"
    balance: float = 0.0  # the nodes' FLOPs at most this far apart (max/min); 0: no bound, the fastest predicted plan
    objective: Weights = DEFAULT_WEIGHTS
    custom: tuple[CustomPartition, ...] = ()
    source: str = "<defaults>"

    def node_speeds(self) -> tuple[float, ...]:
        return self.speeds or (1.0,) * self.nodes

    def node_memory(self) -> tuple[float, ...]:
        """Each node's memory limit in MB (empty: none); `memory_mb` of one size is every node's."""
        return self.memory_mb * self.nodes if len(self.memory_mb) == 1 else self.memory_mb

    def with_overrides(self, **flags: Any) -> Config:
        """CLI flags (None: not given) over the file's values, then re-validated."""
        given = {k: v for k, v in flags.items() if v is not None}
        if isinstance(given.get("direction"), str):
            given["direction"] = parse_direction(given["direction"], lambda problem: BBGrapError(f"--direction {problem}"))
        cfg = replace(self, **given)
        if "nodes" in given and "speeds" not in given and len(cfg.speeds) not in (0, cfg.nodes):
            raise BBGrapError(
                f"--nodes {cfg.nodes} disagrees with the {len(cfg.speeds)} speeds in {cfg.source}; "
                f"drop --nodes or edit cluster.speeds"
            )
        validate(cfg, frozenset(given))
        return cfg


_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "cluster": {"nodes": (int,), "speeds": (list,), "memory_mb": (list, int, float)},
    "partition": {"threshold": (int, float), "direction": (str,), "search": (str,), "planner": (str,), "balance": (int, float)},
    "objective": {k: (int, float) for k in ("operations_w", "data_w", "over_w", "harmonic_w")},
}


def _fail(source: str, key: str, problem: str) -> BBGrapError:
    return BBGrapError(f"{source}: '{key}' {problem}")


def load_config(path: str) -> Config:
    """Read and validate a config file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise BBGrapError(f"config file '{path}' does not exist; see configs/ for examples") from None
    except IsADirectoryError:
        raise BBGrapError(f"--config {path} is a directory; give a TOML file (see configs/ for examples)") from None
    except OSError as exc:
        raise BBGrapError(f"config file '{path}' is unreadable ({exc.strerror or type(exc).__name__}); check its permissions") from None
    except UnicodeDecodeError:
        raise BBGrapError(f"{path}: not UTF-8 text; save the config as UTF-8 TOML (see configs/ for examples)") from None
    except tomllib.TOMLDecodeError as exc:
        raise BBGrapError(f"{path}: not valid TOML ({exc}); see configs/ for examples") from None
    for section, value in data.items():
        if section == "custom":
            continue
        if section not in _SCHEMA:
            raise _fail(path, section, f"is not a known section (known: {', '.join(list(_SCHEMA) + ['custom'])})")
        if not isinstance(value, dict):
            raise _fail(path, section, "must be a table, e.g. [" + section + "]")
        for key, v in value.items():
            types = _SCHEMA[section].get(key)
            if types is None:
                raise _fail(path, f"{section}.{key}", f"is not a known key (known: {', '.join(_SCHEMA[section])})")
            if isinstance(v, bool) or not isinstance(v, types):
                raise _fail(path, f"{section}.{key}", f"must be {' or '.join(t.__name__ for t in types)}, not {type(v).__name__}")
    cluster, part, obj = data.get("cluster", {}), data.get("partition", {}), data.get("objective", {})
    if isinstance(cluster.get("memory_mb"), (int, float)):  # one size for every node
        cluster = {**cluster, "memory_mb": [cluster["memory_mb"]]}
    for key in ("speeds", "memory_mb"):
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in cluster.get(key, [])):
            raise _fail(path, f"cluster.{key}", "must be a list of numbers")
    speeds = tuple(float(s) for s in cluster.get("speeds", []))
    entries = data.get("custom", [])
    if not isinstance(entries, list):
        raise _fail(path, "custom", "must be a list of [[custom]] tables, each with 'layer' and 'direction'")
    custom = []
    for k, entry in enumerate(entries):
        where = f"custom[{k}]"
        if not isinstance(entry, dict) or "layer" not in entry or "direction" not in entry:
            raise _fail(path, where, "needs 'layer' and 'direction' (and optionally 'sizes'), as [[custom]] tables")
        extra = set(entry) - {"layer", "direction", "sizes"}
        if extra:
            raise _fail(path, f"{where}.{sorted(extra)[0]}", "is not a known key (known: layer, direction, sizes)")
        if not isinstance(entry["layer"], str) or not isinstance(entry["direction"], str):
            raise _fail(path, where, "'layer' and 'direction' must be strings")
        sizes = entry.get("sizes")
        if sizes is not None and (not isinstance(sizes, list) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes)):
            raise _fail(path, f"{where}.sizes", "must be a list of non-negative integers, one per node")
        direction = parse_direction(entry["direction"], lambda problem: _fail(path, f"custom '{entry['layer']}' direction", problem))
        custom.append(CustomPartition(entry["layer"], direction, tuple(sizes) if sizes is not None else None))
    # without cluster.nodes: as many as the speeds, else as a [[custom]] table's sizes (--nodes may set it)
    nodes = int(cluster.get("nodes", len(speeds) or next((len(c.sizes) for c in custom if c.sizes is not None), 1)))
    cfg = Config(
        nodes=nodes,
        speeds=speeds,
        memory_mb=tuple(float(m) for m in cluster.get("memory_mb", [])),
        threshold=float(part.get("threshold", Config.threshold)),
        direction=parse_direction(part.get("direction", Config.direction.value), lambda problem: _fail(path, "partition.direction", problem)),
        search=str(part.get("search", Config.search)),
        planner=str(part.get("planner", Config.planner)),
        balance=float(part.get("balance", Config.balance)),
        objective=replace(DEFAULT_WEIGHTS, **{k: float(v) for k, v in obj.items()}),
        custom=tuple(custom),
        source=path,
    )
    validate(cfg)
    return cfg


# The flag that sets a Config field on the command line, to name it in errors.
FLAGS = {"nodes": "--nodes", "speeds": "--speeds", "threshold": "--threshold", "direction": "--direction", "search": "--search",
         "planner": "--planner", "memory_mb": "--memory-mb", "balance": "--balance"}


def validate(cfg: Config, from_flags: frozenset[str] = frozenset()) -> None:
    """Every field in range; an error names the flag where the value came from one
    (`from_flags`), else the file's key."""

    def fail(field: str, key: str, problem: str) -> BBGrapError:
        if field in from_flags:
            return BBGrapError(f"{FLAGS[field]} {problem}")
        return _fail(cfg.source, key, problem)

    if cfg.nodes < 1:
        raise fail("nodes", "cluster.nodes", f"must be at least 1, not {cfg.nodes}")
    if cfg.nodes > MAX_NODES:
        raise fail("nodes", "cluster.nodes", f"must be at most {MAX_NODES}, not {cfg.nodes}")
    if cfg.speeds and len(cfg.speeds) != cfg.nodes:
        raise fail("speeds", "cluster.speeds", f"has {len(cfg.speeds)} entries for {cfg.nodes} nodes; give one per node")
    if not all(math.isfinite(s) and s > 0 for s in cfg.speeds):
        raise fail("speeds", "cluster.speeds", "must all be positive finite numbers, e.g. 1,3,1")
    if cfg.speeds and max(cfg.speeds) > MAX_SPEED_RATIO * min(cfg.speeds):
        raise fail("speeds", "cluster.speeds", f"are relative speeds, within a factor of {MAX_SPEED_RATIO:g} of each other, e.g. 1,3,1")
    if len(cfg.memory_mb) not in (0, 1, cfg.nodes):
        raise fail("memory_mb", "cluster.memory_mb", f"has {len(cfg.memory_mb)} entries for {cfg.nodes} nodes; give one per node (or one for all)")
    if not all(math.isfinite(m) and m > 0 for m in cfg.memory_mb):
        raise fail("memory_mb", "cluster.memory_mb", "must all be positive finite numbers of megabytes")
    if not 0 <= cfg.threshold <= 100:
        raise fail("threshold", "partition.threshold", f"must be a percentage in 0..100, not {cfg.threshold:g}")
    if not (cfg.balance == 0 or (math.isfinite(cfg.balance) and cfg.balance >= 1)):
        raise fail("balance", "partition.balance", f"is the most the nodes' FLOPs may differ, max/min: 1 or more (e.g. 1.3), "
                   f"or 0 for no bound, not {cfg.balance:g}")
    if cfg.search not in SEARCHES:
        raise fail("search", "partition.search", f"must be one of {', '.join(SEARCHES)}, not '{cfg.search}'")
    if cfg.planner not in PLANNERS:
        raise fail("planner", "partition.planner", f"must be one of {', '.join(PLANNERS)}, not '{cfg.planner}'")
    for name in ("operations_w", "data_w", "over_w", "harmonic_w"):
        weight = getattr(cfg.objective, name)
        if not (math.isfinite(weight) and weight >= 0):
            raise _fail(cfg.source, f"objective.{name}", f"must be a non-negative finite number, not {weight:g}")
    seen: set[str] = set()
    for c in cfg.custom:
        if c.layer in seen:
            raise _fail(cfg.source, f"custom '{c.layer}'", "is given twice; keep one [[custom]] table per layer")
        seen.add(c.layer)
        if c.sizes is not None and len(c.sizes) != cfg.nodes:
            nodes = f"--nodes {cfg.nodes}" if "nodes" in from_flags else f"{cfg.nodes} nodes"
            raise _fail(cfg.source, f"custom '{c.layer}' sizes", f"has {len(c.sizes)} entries for {nodes}; give one per node")
