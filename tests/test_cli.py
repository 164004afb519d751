"""The `bbgrap` and `bbgrap-run` commands as a user runs them: outputs, and bad input
getting one clear line, exit status 2 and nothing written."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from helpers import BIN, bbgrap, one_error_line
from helpers import bbgrap_run as run


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("cli")
    path = str(d / "resnet18.onnx")
    proc = bbgrap("zoo", "resnet18", "-o", path, "--resolution", "32", "--width", "0.125")
    assert proc.returncode == 0, proc.stderr
    return path


def test_quickstart_flow(tmp_path, small_model: str) -> None:
    proc = bbgrap("compile", small_model, "--nodes", "2", "--threshold", "20", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "bbgrap-run" in proc.stdout
    assert (tmp_path / "bbgrap-plan" / "plan.json").exists()
    res = run("--json", "--repeat", "2", cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["nodes"] == 2 and result["ok"] and result["max_rel_error"] <= 1e-4
    info = json.loads(bbgrap("inspect", "--json", cwd=str(tmp_path)).stdout)
    for key in ("nodes", "layers", "bytes_transferred", "per_node", "search", "sync_points"):
        assert key in info
    assert len(info["per_node"]) == 2
    assert set(info["per_node"][0]) >= {"flops", "bytes_sent", "bytes_received", "weight_bytes"}
    assert info["bytes_transferred"] == sum(n["bytes_sent"] for n in info["per_node"])


def test_planner_flow(tmp_path, small_model: str) -> None:
    """compile --planner says what it predicted and kept; inspect shows it; the plan runs exactly."""
    proc = bbgrap("compile", small_model, "--nodes", "2", "--planner", "ga", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "planner ga: predicted" in proc.stderr and "kept" in proc.stderr
    info = json.loads(bbgrap("inspect", "--json", cwd=str(tmp_path)).stdout)
    planner = info["planner"]
    assert planner["planner"] == "ga" and planner["kept"] in ("ga", "greedy")
    assert planner["planner_ms"] > 0 and planner["greedy_ms"] > 0 and planner["stats"]["layers"] > 0
    assert "planner: ga" in bbgrap("inspect", cwd=str(tmp_path)).stdout
    res = run("--json", "--repeat", "2", "--check", cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ok"]


def test_input_and_output_files(tmp_path, small_model: str) -> None:
    import numpy as np
    assert bbgrap("compile", small_model, "--nodes", "2", "-o", str(tmp_path / "p")).returncode == 0
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input=x)
    res = run(str(tmp_path / "p"), "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"), "--json", "--repeat", "1")
    assert res.returncode == 0, res.stderr
    import onnxruntime as ort
    want = ort.InferenceSession(small_model, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = np.load(tmp_path / "out.npz")["output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_help_is_complete() -> None:
    out = bbgrap("compile", "--help").stdout
    for flag in ("--nodes", "--threshold", "--direction", "--config", "--input-shape", "--no-search", "--no-optimize", "-o"):
        assert flag in out
    out = run("--help").stdout
    for flag in ("--input", "--output", "--repeat", "--warmup", "--provider", "--json", "--threads"):
        assert flag in out


@pytest.mark.parametrize(("args", "words"), [
    (["compile", "missing.onnx", "--nodes", "2"], ["does not exist"]),
    (["compile", "{model}", "--nodes", "0"], ["--nodes", "at least 1"]),
    (["compile", "{model}", "--nodes", "2", "--direction", "z"], ["--direction", "'z'"]),
    (["compile", "{model}", "--nodes", "2", "--config", "{badkey}"], ["cluster.cores", "not a known key"]),
    (["compile", "{model}", "--nodes", "2", "--config", "{badtype}"], ["partition.threshold", "must be"]),
    (["compile", "{garbage}", "--nodes", "2"], ["not a readable ONNX model"]),
    (["compile", "{truncated}", "--nodes", "2"], ["ONNX"]),
    (["compile", "{model}", "--nodes", "2", "--input-shape", "nope"], ["--input-shape"]),
    (["zoo", "alexnet", "-o", "x.onnx"], ["alexnet"]),
    # issue 12, defect 5: node counts that cannot give every node work, refused before compiling
    (["compile", "{model}", "--nodes", "100000000"], ["--nodes", "at most", "1024"]),
    (["compile", "{model}", "--nodes", "1024"], ["--nodes 1024", "use at most 1000"]),  # the classifier has 1000 outputs
    # defect 6: output problems found first
    (["compile", "{model}", "--nodes", "2", "-o", "{afile}"], ["is a file, not a directory"]),
    (["compile", "{model}", "--nodes", "2", "-o", "{dangling}"], ["symbolic link", "does not exist"]),
    (["compile", "{model}", "--nodes", "2", "--dump-ir-after", "search", "--dump-dir", "{afile}"], ["--dump-dir", "is a file"]),
    # defect 10: config and flag values that ended in tracebacks
    (["compile", "{model}", "--speeds", "nan,1"], ["--speeds", "positive numbers"]),
    (["compile", "{model}", "--speeds", "inf,1"], ["--speeds", "positive numbers"]),
    (["compile", "{model}", "--config", "{customint}"], ["'custom'", "[[custom]] tables"]),
    (["compile", "{model}", "--config", "{latin1}"], ["not UTF-8"]),
    (["compile", "{model}", "--config", "{dir}"], ["--config", "is a directory"]),
    (["compile", "{model}", "--config", "{nanweight}"], ["objective.data_w", "finite"]),
    (["zoo", "resnet18", "-o", "{missing}/r.onnx"], ["does not exist", "create it first"]),
    # defect 11: a flag is named as the flag, not blamed on '<defaults>'
    (["compile", "{model}", "--nodes", "2", "--threshold", "150"], ["--threshold", "0..100"]),
    (["compile", "{model}", "--nodes", "2", "--threshold", "nan"], ["--threshold"]),
    # defect 12: values accepted silently
    (["compile", "{model}", "--config", "{negmem}"], ["cluster.memory_mb", "positive"]),
    (["compile", "{model}", "--config", "{dupcustom}"], ["is given twice"]),
    (["compile", "{model}", "--nodes", "2", "--planner", "annealing"], ["--planner", "'annealing'", "dp"]),
    # 2026-11-24's audit: an output over the command's own input
    (["calibrate", "--model", "{afile}", "-o", "{afile}"], ["-o", "is the --model file", "write it elsewhere"]),
    (["calibrate", "--refine", "{afile}", "--profile", "{badkey}", "-o", "{afile}"], ["-o", "is a --refine file"]),
    (["calibrate", "--threads", "100000", "-o", "x.toml"], ["--threads 100000", "per core of this host"]),
    # ... and user mistakes that were internal errors (exit 3)
    (["compile", "{model}", "--nodes", "2", "--profile", "{model}"], ["--profile", "not UTF-8"]),
    (["compile", "{model}", "--nodes", "2", "--speeds", "1,1e308"], ["--speeds", "within a factor"]),
    (["compile", "{model}", "--nodes", "2", "--profile", "{tinyspeed}"], ["conv_ops_per_s", "from 1e-18 to 1e+18"]),
    (["zoo", "resnet18", "-o", "r.onnx", "--seed", "-1"], ["--seed -1"]),
    (["compile", "{model}", "--nodes", "2", "--dump-ir-after", "search", "--dump-dir", "p5", "-o", "p5"], ["--dump-dir p5", "plan's directory"]),
    # argparse's own errors: one line too, not the usage above it
    (["compile", "{model}", "--nodes", "abc"], ["bbgrap compile: error:", "--nodes", "invalid int", "--help"]),
    (["frobnicate"], ["bbgrap: error:", "invalid choice", "--help"]),
    (["zoo"], ["bbgrap zoo: error:", "required"]),
    # an option spelled in part is refused, not read as the one it begins (--force is not --force-nodes)
    (["compile", "{model}", "--nodes", "2", "--force"], ["unrecognized arguments: --force", "--help"]),
    (["compile", "{model}", "--input-shape", "x:1x3x16x16", "--input-shape", "x:1x3x8x8"], ["--input-shape", "'x' twice"]),
    (["compile", "{model}", "--config", "{customfc}", "--quiet"], ["custom partition of 'fc'", "along 'h'", "cannot be cut there"]),
    (["compile", "{model}", "--nodes", "2", "--dump-ir-after", "search", "--dump-dir", "p5/ir", "-o", "p5"], ["--dump-dir p5/ir"]),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, small_model: str, args: list[str], words: list[str]) -> None:
    (tmp_path / "badkey.toml").write_text("[cluster]\ncores = 4\n")
    (tmp_path / "badtype.toml").write_text("[partition]\nthreshold = 'twenty'\n")
    (tmp_path / "garbage.onnx").write_bytes(b"this is not a model at all")
    data = open(small_model, "rb").read()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 3])
    (tmp_path / "customint.toml").write_text("custom = 3\n")
    (tmp_path / "latin1.toml").write_bytes("# n\xf8des\n[cluster]\nnodes = 2\n".encode("latin-1"))
    (tmp_path / "nanweight.toml").write_text("[objective]\ndata_w = nan\n")
    (tmp_path / "negmem.toml").write_text("[cluster]\nnodes = 2\nmemory_mb = [-1, 100]\n")
    (tmp_path / "dupcustom.toml").write_text("[cluster]\nnodes = 2\n" + "[[custom]]\nlayer = 'conv1'\ndirection = 'c'\n" * 2)
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "customfc.toml").write_text("[cluster]\nnodes = 2\n[[custom]]\nlayer = 'fc'\ndirection = 'h'\n")
    (tmp_path / "tinyspeed.toml").write_text("[[node]]\nconv_ops_per_s = 1e-300\n[[node]]\n")
    (tmp_path / "dir").mkdir()
    os.symlink(str(tmp_path / "nowhere"), str(tmp_path / "dangling"))
    subs = {"{model}": small_model, "{badkey}": str(tmp_path / "badkey.toml"), "{badtype}": str(tmp_path / "badtype.toml"),
            "{garbage}": str(tmp_path / "garbage.onnx"), "{truncated}": str(tmp_path / "truncated.onnx")}
    subs |= {f"{{{k}}}": str(tmp_path / v) for k, v in (("customint", "customint.toml"), ("latin1", "latin1.toml"),
                                                       ("nanweight", "nanweight.toml"), ("negmem", "negmem.toml"),
                                                       ("dupcustom", "dupcustom.toml"), ("afile", "afile"), ("dir", "dir"), ("tinyspeed", "tinyspeed.toml"), ("customfc", "customfc.toml"),
                                                       ("dangling", "dangling"))}
    work = tmp_path / "work"
    work.mkdir()
    proc = bbgrap(*[a.replace("{missing}", str(tmp_path / "missing")) if a.startswith("{missing}") else subs.get(a, a) for a in args],
                  cwd=str(work))
    one_error_line(proc, *words)
    assert "<defaults>" not in proc.stderr
    assert os.listdir(work) == [], "a failed command left files behind"
    assert (tmp_path / "afile").read_text() == "mine" and not (tmp_path / "missing").exists()


def test_inspect_svg_into_the_plan_is_refused(tmp_path, small_model: str) -> None:
    plan = tmp_path / "plan"
    assert bbgrap("compile", small_model, "--nodes", "2", "-o", str(plan), "--quiet").returncode == 0
    manifest = (plan / "plan.json").read_text()
    one_error_line(bbgrap("inspect", str(plan), "--svg", str(plan / "plan.json")), "--svg", "is inside the plan directory")
    assert (plan / "plan.json").read_text() == manifest


def test_plan_from_another_version(tmp_path, small_model: str) -> None:
    plan = tmp_path / "plan"
    assert bbgrap("compile", small_model, "--nodes", "2", "-o", str(plan)).returncode == 0
    manifest = json.loads((plan / "plan.json").read_text())
    manifest["version"] = 99
    (plan / "plan.json").write_text(json.dumps(manifest))
    one_error_line(run(str(plan)), "version 99", "compile it again")
    one_error_line(bbgrap("inspect", str(plan)), "version 99")


@pytest.mark.parametrize("layout", ["auto", "nchw"])
def test_run_with_a_damaged_segment_names_it(tmp_path, small_model: str, layout: str) -> None:
    plan = tmp_path / "plan"
    assert bbgrap("compile", small_model, "--nodes", "2", "--planner", "greedy", "-o", str(plan), "--quiet").returncode == 0
    damaged = plan / "node1" / "seg000.onnx"
    damaged.write_bytes(b"not a segment")
    one_error_line(run(str(plan), "--layout", layout), str(damaged), "compile the plan again")


def test_run_without_plan(tmp_path) -> None:
    one_error_line(run(cwd=str(tmp_path)), "not a bbgrap plan", "bbgrap compile")


def test_run_refuses_an_option_spelled_in_part(tmp_path) -> None:
    one_error_line(run("--rep", "3", cwd=str(tmp_path)), "bbgrap-run: error:", "unrecognized arguments: --rep")


def test_inspect_into_a_closed_pipe_is_quiet(tmp_path, small_model: str) -> None:
    assert bbgrap("compile", small_model, "--nodes", "2", "-o", str(tmp_path / "plan"), "--quiet").returncode == 0
    # the reader is gone before bbgrap writes a byte
    cmd = f"(sleep 1; '{os.path.join(BIN, 'bbgrap')}' inspect '{tmp_path / 'plan'}') | true"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_no_recompute_flag_drops_the_pass(tmp_path, small_model: str) -> None:
    for flags, expected in (((), True), (("--no-recompute",), False)):
        plan = str(tmp_path / f"plan{len(flags)}")
        assert bbgrap("compile", small_model, "--nodes", "2", "-o", plan, "--quiet", *flags).returncode == 0
        info = json.loads(bbgrap("inspect", plan, "--json").stdout)
        assert ("recompute-halos" in info["passes"]) is expected
        assert run(plan, "--json", "--repeat", "1").returncode == 0


def test_recompiling_into_a_plan_with_the_users_files_keeps_them(tmp_path, small_model: str) -> None:
    # issue 12, defect 2: `bbgrap compile P/m.onnx -o P` deleted the model itself
    plan = tmp_path / "P"
    assert bbgrap("compile", small_model, "--nodes", "3", "-o", str(plan), "--quiet").returncode == 0
    (plan / "m.onnx").write_bytes(open(small_model, "rb").read())
    (plan / "notes.txt").write_text("mine")
    proc = bbgrap("compile", str(plan / "m.onnx"), "--nodes", "2", "-o", str(plan), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (plan / "notes.txt").read_text() == "mine" and (plan / "m.onnx").stat().st_size > 0
    assert not (plan / "node2").exists()
    assert run(str(plan), "--repeat", "1").returncode == 0


def test_compiling_into_a_directory_with_other_files_is_refused(tmp_path, small_model: str) -> None:
    # defect 2: `-o .` where the user keeps the model
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.onnx").write_bytes(open(small_model, "rb").read())
    one_error_line(bbgrap("compile", "m.onnx", "--nodes", "2", "-o", ".", cwd=str(work)), "-o .", "never deletes")
    assert os.listdir(work) == ["m.onnx"]


def test_a_symlinked_output_directory_is_followed(tmp_path, small_model: str) -> None:
    # defect 7: the link was replaced by a real directory and its target kept the stale plan
    (tmp_path / "shared").mkdir()
    os.symlink(str(tmp_path / "shared"), str(tmp_path / "plan"))
    assert bbgrap("compile", small_model, "--nodes", "2", "-o", str(tmp_path / "plan"), "--quiet").returncode == 0
    assert bbgrap("compile", small_model, "--nodes", "3", "-o", str(tmp_path / "plan"), "--quiet").returncode == 0
    assert os.path.islink(tmp_path / "plan")
    assert json.loads((tmp_path / "shared" / "plan.json").read_text())["nodes"] == 3


def test_concurrent_compiles_to_one_directory(tmp_path, small_model: str) -> None:
    # defect 8: renames raced (Directory not empty, FileNotFoundError, leftover .bbgrap-old-*)
    plan = str(tmp_path / "P")
    procs = [subprocess.Popen([os.path.join(BIN, "bbgrap"), "compile", small_model, "--nodes", str(n), "-o", plan, "--quiet"],
                              stderr=subprocess.PIPE, text=True) for n in (2, 3, 2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".bbgrap")]
    assert not [e for e in os.listdir(plan) if e.startswith(".bbgrap")]
    res = run(plan, "--json", "--repeat", "1")
    assert res.returncode == 0 and json.loads(res.stdout)["ok"], res.stderr


def test_version() -> None:
    # defect 16
    from bbgrap.cli import package_version

    proc = bbgrap("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"bbgrap {package_version()}" and package_version() != "unknown"


def test_an_internal_error_is_one_line_exit_3(tmp_path, small_model: str, monkeypatch, capsys) -> None:
    # a bug in a pass (here: one injected) reaches the user as one line asking for a report, not a traceback
    from bbgrap import cli
    from bbgrap.pass_manager import PassError

    def broken(*args: object, **kwargs: object) -> None:
        raise PassError("pass 'search' failed on layer conv1 [1, 64, 16, 16]: boom\nmore detail")

    monkeypatch.setattr("bbgrap.compiler.compile_model", broken)
    assert cli.main(["compile", small_model, "--nodes", "2", "-o", str(tmp_path / "p")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (PassError: pass 'search' failed" in err and "report" in err
    monkeypatch.setenv("BBGRAP_DEBUG", "1")
    with pytest.raises(PassError):
        cli.main(["compile", small_model, "--nodes", "2", "-o", str(tmp_path / "p")])


def test_progress_on_a_terminal_only_and_quiet(tmp_path, small_model: str) -> None:
    # issue 17 part 4: progress for import, the passes, lowering, writing and loading sessions, on a
    # terminal only (a pseudo-terminal made by `script`), never in a pipe, and nothing with --quiet
    plan = str(tmp_path / "plan")
    compile_cmd = f"'{os.path.join(BIN, 'bbgrap')}' compile '{small_model}' --nodes 2 -o '{plan}'"
    tty = subprocess.run(["script", "-qec", compile_cmd, "/dev/null"], capture_output=True, text=True, timeout=300)
    assert tty.returncode == 0, tty.stdout
    def bar(label: str) -> str:  # a progress bar's line, as Progress draws it
        return rf"{label}[^\n]*\s\[[#.]{{30}}\] \d+/\d+"

    for label in ("import", "search", "lower", "write"):
        assert re.search(bar(label), tty.stdout), (label, tty.stdout)
    piped = bbgrap("compile", small_model, "--nodes", "2", "-o", plan)
    assert piped.returncode == 0 and "\r" not in piped.stderr and "[###" not in piped.stderr
    run_cmd = f"'{os.path.join(BIN, 'bbgrap-run')}' '{plan}' --repeat 1"
    tty = subprocess.run(["script", "-qec", run_cmd, "/dev/null"], capture_output=True, text=True, timeout=300)
    assert tty.returncode == 0 and re.search(bar("load sessions"), tty.stdout), tty.stdout
    quiet = run(plan, "--repeat", "1", "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    tty = subprocess.run(["script", "-qec", run_cmd + " --quiet", "/dev/null"], capture_output=True, text=True, timeout=300)
    assert tty.returncode == 0 and tty.stdout.strip() == "", tty.stdout
