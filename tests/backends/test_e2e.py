"""End to end through the in-process runtime: every zoo model, 1–4 nodes, every
direction, with the naive cut and with the searched one (the CLI's default pipeline),
naive and optimized data movement — each plan checked against onnxruntime on the
original model."""

from __future__ import annotations

import pytest
from helpers import assert_exact, compile_plan, save

from bbgrap import zoo
from bbgrap.ir import Movement

DIRECTIONS = ("h", "w", "c")
DEFAULT_PIPELINE = ["band-pools", "naive-partition", "insert-crop-concat", "eliminate-transfers", "search", "recompute-halos"]
# The searched plans of the CLI's default pipeline: every model in every direction once, at
# 2, 3 or 4 nodes in turn, so that every direction is searched at 2, 3 and 4 nodes (each
# twice) and every model at 2, 3 and 4 nodes. The full product (54 plans) measured 170 s of
# CPU more than this (the channel searches at 4 nodes take 10-13 s each): a third of the
# whole suite's time.
SEARCHED = [(name, direction, 2 + (i + j + 2) % 3) for i, name in enumerate(zoo.NAMES) for j, direction in enumerate(DIRECTIONS)]


@pytest.fixture(scope="module")
def zoo_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("zoo")
    return {name: save(zoo.build(name, resolution=48, width=0.125, seed=1), str(d), name) for name in zoo.NAMES}


@pytest.mark.parametrize("name", zoo.NAMES)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_zoo_model_with_the_naive_cut_is_exact(zoo_models: dict[str, str], tmp_path, name: str, direction: str, nodes: int) -> None:
    """The even cut, not searched (--no-search); transfers eliminated, halos recomputed."""
    manifest = compile_plan(zoo_models[name], str(tmp_path / "plan"), nodes=nodes, direction=direction, search=False)
    assert manifest.nodes == nodes and manifest.compiled.search is None
    assert list(manifest.compiled.passes) == [p for p in DEFAULT_PIPELINE if p != "search" and (nodes > 1 or p not in ("band-pools", "recompute-halos"))]
    assert_exact(str(tmp_path / "plan"))


@pytest.mark.parametrize(("name", "direction", "nodes"), SEARCHED)
def test_zoo_model_searched_is_exact(zoo_models: dict[str, str], tmp_path, name: str, direction: str, nodes: int) -> None:
    """The CLI's default pipeline: the cut searched (exact strategy), halos recomputed."""
    manifest = compile_plan(zoo_models[name], str(tmp_path / "plan"), nodes=nodes, direction=direction, search=True, recompute=True)
    search = manifest.compiled.search
    assert manifest.nodes == nodes and list(manifest.compiled.passes) == DEFAULT_PIPELINE
    assert search is not None and search.strategy == "exact" and search.layers > 0
    assert search.objective <= search.naive_objective
    assert_exact(str(tmp_path / "plan"))


def test_searched_plans_cover_every_model_direction_and_node_count() -> None:
    assert {(name, direction) for name, direction, _ in SEARCHED} == {(n, d) for n in zoo.NAMES for d in DIRECTIONS}
    assert {(direction, nodes) for _, direction, nodes in SEARCHED} == {(d, k) for d in DIRECTIONS for k in (2, 3, 4)}
    assert {(name, nodes) for name, _, nodes in SEARCHED} == {(n, k) for n in zoo.NAMES for k in (2, 3, 4)}


@pytest.mark.parametrize("name", zoo.NAMES)
def test_device_values_path_is_exact(zoo_models: dict[str, str], tmp_path, name: str) -> None:
    # the IOBinding path CUDA takes, bound to the CPU here: activations as onnxruntime values
    compile_plan(zoo_models[name], str(tmp_path / "plan"), nodes=3, direction="h")
    assert_exact(str(tmp_path / "plan"), iobinding="on")


@pytest.mark.parametrize("name", ["resnet18", "inception"])
def test_naive_plan_is_exact(zoo_models: dict[str, str], tmp_path, name: str) -> None:
    manifest = compile_plan(zoo_models[name], str(tmp_path / "plan"), nodes=3, direction="w", optimize=False)
    assert manifest.movement == Movement.NAIVE
    assert_exact(str(tmp_path / "plan"))


def test_batch_direction_and_batch_two(tmp_path) -> None:
    path = save(zoo.build("resnet18", resolution=32, width=0.125, batch=2), str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2, direction="n")
    assert_exact(str(tmp_path / "plan"))


def test_heterogeneous_speeds_are_exact(zoo_models: dict[str, str], tmp_path) -> None:
    # recompute=False: the owned split alone (recomputed halos would add to every node's operations)
    manifest = compile_plan(zoo_models["mobilenet_v2"], str(tmp_path / "plan"), nodes=3, speeds=(1.0, 3.0, 1.0), recompute=False)
    flops = [n.flops for n in manifest.stats.per_node]
    assert flops[1] > 2 * flops[0] and flops[1] > 2 * flops[2]
    assert_exact(str(tmp_path / "plan"))
    compile_plan(zoo_models["mobilenet_v2"], str(tmp_path / "recomputed"), nodes=3, speeds=(1.0, 3.0, 1.0))
    assert_exact(str(tmp_path / "recomputed"))


def test_value_store_follows_the_iobinding_choice(zoo_models: dict[str, str], tmp_path) -> None:
    from bbgrap.backends.engine import DeviceValues, HostValues, load_runner

    from bbgrap.plan import read_manifest

    plan = str(tmp_path / "plan")
    compile_plan(zoo_models["resnet18"], plan, nodes=2)
    manifest = read_manifest(plan)
    stores = {choice: load_runner(plan, manifest, 0, 1, "cpu", iobinding=choice).values for choice in ("auto", "on", "off")}
    assert isinstance(stores["on"], DeviceValues) and stores["on"].device == "cpu"
    assert isinstance(stores["auto"], HostValues) and isinstance(stores["off"], HostValues)  # no GPU: host arrays


def test_cpu_sessions_share_one_arena_and_gpu_sessions_keep_theirs() -> None:
    from bbgrap.backends.engine import session_options

    assert session_options(1).get_session_config_entry("session.use_env_allocators") == "1"
    with pytest.raises(RuntimeError, match="use_env_allocators"):  # not set at all
        session_options(1, shared_arena=False).get_session_config_entry("session.use_env_allocators")


def test_cuda_sessions_ask_for_full_fp32() -> None:
    import onnxruntime as ort
    from bbgrap.backends.engine import _version, providers_for

    assert _version("1.18.0") == (1, 18, 0) and _version("1.20.1.dev5") == (1, 20, 1) and _version("2.0rc1") == (2,)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA provider (the option is only built for it)")
    (name, options), cpu = providers_for("cuda", 1)
    assert name == "CUDAExecutionProvider" and options["device_id"] == 1 and cpu == "CPUExecutionProvider"
    assert options.get("use_tf32") == ("0" if _version(ort.__version__) >= (1, 18) else None)
