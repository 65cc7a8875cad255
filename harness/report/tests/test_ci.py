"""The CI glue: every script the workflow calls exists and runs, and ci/gpu-job shards, merges and
reports the way docs/ci.md says. gpu-job runs here against a stand-in `attncheck`
(fake_attncheck.py) and stand-in rocminfo / nvidia-smi, so its own logic is tested on any machine;
test_real_cli.py runs it against the real binary."""

import json
from pathlib import Path
import os
import re
import stat
import subprocess

import pytest

from conftest import REPO, TESTS

WORKFLOW = REPO / ".github" / "workflows" / "attncheck.yml"


def scripts_called(text):
    return sorted(set(re.findall(r"(?<![\w./-])((?:\.ci|ci)/[\w.-]+)", text)))


def test_every_script_the_workflow_calls_exists_and_is_executable():
    text = WORKFLOW.read_text()
    called = scripts_called(text)
    assert "ci/gha-test-shard" in called and "ci/lint" in called  # the scan finds them
    for script in called:
        path = REPO / script
        assert path.is_file(), f"{WORKFLOW.name} calls {script}, which does not exist"
        assert path.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"


def test_scripts_those_scripts_call_exist_too():
    seen, todo = set(), ["ci/gha-test-shard", "ci/gha-report", "ci/gha-plan", "ci/gpu-job",
                         "ci/test", ".ci/run"]
    while todo:
        script = todo.pop()
        if script in seen:
            continue
        seen.add(script)
        path = REPO / script
        assert path.is_file() and path.stat().st_mode & stat.S_IXUSR, script
        if path.suffix not in (".cjs", ".py"):
            body = "\n".join(line for line in path.read_text().splitlines()
                             if not line.lstrip().startswith("#"))
            todo += [s for s in scripts_called(body) if not s.endswith((".log", ".txt", ".json"))]
    assert {"ci/build", "ci/docker-run", "ci/install-deps", "ci/lint"} <= seen


def test_workflow_parses_and_has_the_triggers():
    yaml = pytest.importorskip("yaml", reason="python3-yaml not installed")
    wf = yaml.safe_load(WORKFLOW.read_text())
    triggers = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads a bare `on` as true
    assert {"pull_request", "push", "schedule", "workflow_dispatch"} <= set(triggers)
    assert set(triggers["workflow_dispatch"]["inputs"]) == {"tier", "filter"}
    assert wf["jobs"]["test"]["strategy"]["fail-fast"] is False
    targets = json.loads(wf["env"]["TARGETS"])
    assert {t["arch"]: t["fp8"] for t in targets} == {"gfx942": "e4m3fnuz", "gfx950": "e4m3fn"}
    assert set(wf["env"]["GPU_ARCH_LIST"].split(";")) == {"gfx942", "gfx950"}
    image = wf["env"]["ROCM_IMAGE"]  # pinned: a version tag, never latest
    assert re.fullmatch(r"rocm/dev-ubuntu-24\.04:\d+\.\d+(\.\d+)?(-complete)?", image)


def test_gha_plan_per_trigger():
    env = dict(os.environ, ROCM_IMAGE="img", GPU_ARCH_LIST="gfx942;gfx950", GH_TOKEN="",
               TARGETS='[{"name": "a", "runner": "r", "arch": "gfx942", "fp8": "e4m3fnuz"}]')

    def plan(**kw):
        p = subprocess.run([str(REPO / "ci/gha-plan")], env=dict(env, **kw), capture_output=True,
                           text=True, timeout=60)
        return p.returncode, dict(line.split("=", 1) for line in p.stdout.splitlines()), p.stderr

    rc, out, _ = plan(EVENT="pull_request")
    assert rc == 0 and out["tier"] == "quick" and out["mutants"] == "false"
    assert out["stress"] == "0"
    assert out["shards"] == "[0,1]" and out["expected_jobs"] == "2"
    rc, out, _ = plan(EVENT="schedule", SHARDS_FULL="3")
    assert (out["tier"], out["shards"], out["mutants"]) == ("full", "[0,1,2]", "true")
    assert out["stress"] == "50"
    rc, out, _ = plan(EVENT="workflow_dispatch", INPUT_TIER="smoke", INPUT_FILTER="rope/")
    assert (out["tier"], out["filter"], out["shard_count"]) == ("smoke", "rope/", "1")
    rc, _, err = plan(EVENT="workflow_dispatch", INPUT_TIER="huge")
    assert rc == 2 and "unknown tier 'huge'" in err
    rc, _, err = plan(EVENT="push", GPU_ARCH_LIST="gfx950")
    assert rc != 0 and "not in GPU_ARCH_LIST" in err


# --- ci/gpu-job with stand-ins -----------------------------------------------------------------


@pytest.fixture
def fake_machine(tmp_path):
    """A prebuilt build directory holding the stand-in attncheck, and a bin dir for GPU tools."""
    build = tmp_path / "build"
    (build / "harness" / "cli").mkdir(parents=True)
    (build / "kernels_under_test").mkdir()
    exe = build / "harness" / "cli" / "attncheck"
    exe.write_text(f'#!/bin/sh\nexec /usr/bin/env python3 "{TESTS / "fake_attncheck.py"}" "$@"\n')
    exe.chmod(0o755)
    tools = tmp_path / "bin"
    tools.mkdir()
    env = dict(os.environ, ATTNCHECK_BUILD=str(build), PATH=f"{tools}:{os.environ['PATH']}")
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "CI", "OMP_NUM_THREADS"):
        env.pop(var, None)
    return {"build": build, "tools": tools, "env": env, "out": tmp_path / "out"}


def tool(fake, name, body):
    path = fake["tools"] / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def gpu_job(fake, *args, **env):
    return subprocess.run([str(REPO / "ci/gpu-job"), *args, "--out", str(fake["out"])],
                          env=dict(fake["env"], **env), capture_output=True, text=True,
                          timeout=300)


def shard_runs(out):
    runs = []
    for d in sorted((out / "shards").iterdir()):
        if d.is_dir():
            runs.append((json.loads((d / "run.json").read_text()),
                         json.loads((d / "argv.json").read_text())))
    return runs


def test_gpu_job_runs_one_process_with_a_pool_per_visible_gpu(fake_machine):
    f = fake_machine
    tool(f, "rocminfo", "printf '  Name:    AMD EPYC 9654\\n  Name:    gfx942\\n"
                        "  Name:    gfx942\\n'\n")
    (f["build"] / "kernels_under_test" / "libattncheck_kernels_hip.so").write_bytes(b"")
    (f["build"] / "kernels_under_test" / "libattncheck_kernels_mutant_demo.so").write_bytes(b"")
    summary = f["out"].parent / "step_summary.md"
    p = gpu_job(f, "quick", "--mutants", FAKE_ALL_PASS="1", HIP_VISIBLE_DEVICES="3,5",
                GITHUB_STEP_SUMMARY=str(summary))
    assert p.returncode == 0, p.stdout + p.stderr
    runs = shard_runs(f["out"])
    (run, argv), = runs  # attncheck run's pools (--gpus) share the GPUs, no fixed split
    assert argv[:3] == ["run", "--tier", "quick"] and "--kernels" in argv and "--profile" in argv
    assert argv[argv.index("--gpus") + 1] == "3,5" and "--shard" not in argv
    assert run["kernels_library"].endswith("libattncheck_kernels_hip.so")
    merged = json.loads((f["out"] / "results" / "run.json").read_text())
    assert merged["case_count"] == sum(r["case_count"] for r, _ in runs) > 0
    assert (f["out"] / "report.html").is_file()
    # the quick tier's coverage audit, run beside the tier, joins the merged results
    assert (f["out"] / "results" / "coverage.json").is_file()
    assert not (f["out"] / "coverage.json").exists() and "coverage audit:" not in p.stdout
    md = (f["out"] / "summary.md").read_text()
    assert "✅ **PASSED**" in md and md in summary.read_text()
    assert "**Coverage audit** (tier quick)" in md
    assert "**Mutation score** 1/1" in md  # the stand-in fails every case of a mutant
    assert "kernel mode, tier quick, arch gfx942, backend hip, GPUs 3,5" in p.stdout
    # the report's heatmaps were drawn from the merged tier beside the mutants, then read back
    assert "heatmap(s) drawn into" in p.stdout and not (f["out"] / ".heatmaps").exists()
    # every mutant in one `attncheck mutants` run over both GPUs, killed by its first failure
    margv = json.loads((f["out"] / "mutants" / "argv.json").read_text())
    assert margv[0] == "mutants" and margv[margv.index("--gpus") + 1] == "3,5"
    assert margv[margv.index("--max-failures") + 1] == "1"  # the kill, not every failure
    assert [margv[k + 1].split("=")[0] for k in range(len(margv) - 1) if margv[k] == "--library"] \
        == [str(f["build"] / "kernels_under_test" / "libattncheck_kernels_mutant_demo.so")]


def test_gpu_job_judges_five_libraries_from_one_process(fake_machine):
    f = fake_machine
    tool(f, "rocminfo", "printf '  Name:    gfx942\\n'\n")
    (f["build"] / "kernels_under_test" / "libattncheck_kernels_hip.so").write_bytes(b"")
    for name in ("a", "b", "c", "d", "e"):
        (f["build"] / "kernels_under_test" / f"libattncheck_kernels_mutant_{name}.so").write_bytes(b"")
    p = gpu_job(f, "quick", "--mutants", FAKE_ALL_PASS="1")
    assert p.returncode == 0, p.stdout + p.stderr
    # (no "mutant" in this test's name: the stand-in fails every library whose path has it)
    # every mutant ran to the end and was judged, from one process
    assert sorted(d.name for d in (f["out"] / "mutants").iterdir() if d.is_dir()) == list("abcde")
    assert "**Mutation score** 5/5" in (f["out"] / "summary.md").read_text()
    margv = json.loads((f["out"] / "mutants" / "argv.json").read_text())
    assert margv.count("--library") == 5 and "mutants: 5 libraries in" in p.stdout
    # the per-run shares are gone with the runs
    bad = gpu_job(f, "quick", "--mutants", "--mutant-jobs", "2")
    assert bad.returncode == 2, bad.stdout + bad.stderr


def two_mutants_on_one_gpu(f):
    """One gfx942 GPU, the main library and two mutants: rope_discard_out_of_place (a real one,
    kernels_under_test/rope.mutants) and one that no .mutants file names."""
    tool(f, "rocminfo", "printf '  Name:    gfx942\\n'\n")
    (f["build"] / "kernels_under_test" / "libattncheck_kernels_hip.so").write_bytes(b"")
    for name in ("rope_discard_out_of_place", "unlisted"):
        (f["build"] / "kernels_under_test" / f"libattncheck_kernels_hip_mutant_{name}.so").write_bytes(b"")
    return f


def libraries(f):
    """The mutants run's --library arguments, in order, as (file name, ops or None)."""
    argv = json.loads((f["out"] / "mutants" / "argv.json").read_text())
    specs = [argv[k + 1] for k in range(len(argv) - 1) if argv[k] == "--library"]
    return [(Path(lib).name, ops or None) for lib, _, ops in (s.partition("=") for s in specs)]


def test_gpu_job_starts_the_costliest_mutant_first(fake_machine):
    # The mutant that runs the whole tier costs more than the one of two ops: it goes first, so
    # that it does not start last and end the run late.
    f = two_mutants_on_one_gpu(fake_machine)
    p = gpu_job(f, "quick", "--mutants", "--jobs-per-gpu", "8", "--threads-per-worker", "4",
                FAKE_ALL_PASS="1")
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert [name for name, _ in libraries(f)] == [
        "libattncheck_kernels_hip_mutant_unlisted.so",
        "libattncheck_kernels_hip_mutant_rope_discard_out_of_place.so"]
    # the pool settings reach both processes: the tier's and the mutants'
    (_, tier_argv), = shard_runs(f["out"])
    for argv in (json.loads((f["out"] / "mutants" / "argv.json").read_text()), tier_argv):
        assert argv[argv.index("--jobs-per-gpu") + 1] == "8"
        assert argv[argv.index("--threads-per-worker") + 1] == "4"


def test_gpu_job_runs_a_mutant_on_the_ops_its_source_registers(fake_machine):
    # rope_discard_out_of_place is a real mutant (kernels_under_test/rope.mutants): CMake compiles
    # only rope.hip with its define, and rope.hip registers the rope and indexer_qk_rope entries;
    # a library whose mutant is in no .mutants file runs the whole tier.
    f = two_mutants_on_one_gpu(fake_machine)
    p = gpu_job(f, "quick", "--mutants", FAKE_ALL_PASS="1")
    assert p.returncode in (0, 1), p.stdout + p.stderr
    scopes = dict(libraries(f))
    assert scopes["libattncheck_kernels_hip_mutant_rope_discard_out_of_place.so"] == \
        "indexer_qk_rope,rope", scopes
    assert "mutant rope_discard_out_of_place (kernels_under_test/rope.mutants): indexer_qk_rope rope" in p.stdout
    assert scopes["libattncheck_kernels_hip_mutant_unlisted.so"] is None
    assert "mutant unlisted (unknown" in p.stdout
    # the stand-in ran each on its scope: rope's results hold only its two ops
    ids = [json.loads(line)["id"] for line in
           (f["out"] / "mutants" / "rope_discard_out_of_place" / "results.jsonl").read_text().splitlines()]
    assert ids and {i.split("/")[0] for i in ids} <= {"indexer_qk_rope", "rope"}
    # --mutant-scope tier: every mutant runs the whole tier
    p = gpu_job(f, "quick", "--mutants", "--mutant-scope", "tier", FAKE_ALL_PASS="1")
    assert all(ops is None for _, ops in libraries(f)), libraries(f)
    bad = gpu_job(f, "quick", "--mutants", "--mutant-scope", "some")
    assert bad.returncode == 2 and "--mutant-scope wants ops or tier (got 'some')" in bad.stderr


def test_gpu_job_stress_runs_the_nightly_selection(fake_machine):
    f = fake_machine
    tool(f, "rocminfo", "printf '  Name:    gfx950\\n'\n")
    (f["build"] / "kernels_under_test" / "libattncheck_kernels_hip.so").write_bytes(b"")
    p = gpu_job(f, "smoke", "--stress", "7", FAKE_ALL_PASS="1")
    assert p.returncode == 0, p.stdout + p.stderr
    argv = json.loads((f["out"] / "stress" / "argv.json").read_text())
    assert argv[:3] == ["run", "--tier", "quick"] and argv[argv.index("--stress") + 1] == "7"
    wanted = [ln for ln in (REPO / "ci/stress-cases.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert argv[argv.index("--filter") + 1] == "|".join(wanted)
    bad = gpu_job(f, "smoke", "--stress", "many")
    assert bad.returncode == 2 and "--stress wants a whole number" in bad.stderr
    failing = gpu_job(f, "smoke", "--stress", "3", FAKE_ALL_PASS="1", FAKE_STRESS_FAIL="1")
    assert failing.returncode == 1 and "stress run failed" in failing.stderr


def test_gpu_job_fails_when_cases_fail_and_names_them(fake_machine):
    f = fake_machine
    tool(f, "nvidia-smi", 'case "$1" in -L) echo "GPU 0: NVIDIA H200 (UUID: x)"; '
                          'echo "GPU 1: NVIDIA H200 (UUID: y)";; *) echo "9.0";; esac\n')
    (f["build"] / "kernels_under_test" / "libattncheck_kernels.so").write_bytes(b"")
    p = gpu_job(f, "smoke", "--shard", "1/4", "--filter", "rope|indexer", FAKE_ARCH="sm_90",
                CUDA_VISIBLE_DEVICES="6")
    assert p.returncode == 1, p.stdout + p.stderr
    (run, argv), = shard_runs(f["out"])
    assert run["shard"] == "1/4" and argv[argv.index("--gpus") + 1] == "6"
    assert argv[argv.index("--filter") + 1] == "rope|indexer"
    assert "arch sm_90, backend cuda, GPUs 6" in p.stdout
    assert "FAILED" in (f["out"] / "summary.md").read_text()


def test_gpu_job_without_gpu_runs_the_reference_and_says_so(fake_machine):
    f = fake_machine
    p = gpu_job(f, "smoke", "--no-gpu", FAKE_ALL_PASS="1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "kernels under test are NOT checked" in p.stdout
    (run, argv), = shard_runs(f["out"])
    assert "--kernels" not in argv and "--shard" not in argv and run["mode"] == "reference"
    md = (f["out"] / "summary.md").read_text()
    assert "reference vs goldens only, kernels not checked" in md
    # The report's own headline: no kernel ran, so never PASSED.
    assert "⚠️ **REFERENCE ONLY: kernels not checked**" in md and "PASSED" not in md


def test_gpu_job_expect_arch_refuses_the_wrong_gpu_or_none(fake_machine):
    f = fake_machine
    tool(f, "rocminfo", "printf '  Name:    gfx942\\n'\n")
    p = gpu_job(f, "quick", "--expect-arch", "gfx950")
    assert p.returncode == 2 and "expected a gfx950 GPU, found gfx942" in p.stderr
    p = gpu_job(f, "quick", "--expect-arch", "gfx942", "--no-gpu")
    assert p.returncode == 2 and "expected a gfx942 GPU, found none" in p.stderr
    p = gpu_job(f, "quick", "--expect-arch", "gfx942")  # right GPU, but no kernel library
    assert p.returncode == 2 and "has no libattncheck_kernels_hip.so" in p.stderr


def test_gpu_job_usage_errors(fake_machine):
    p = gpu_job(fake_machine, "medium")
    assert p.returncode == 2 and "usage: ci/gpu-job <smoke|quick|full>" in p.stderr
    p = gpu_job(fake_machine, "quick", "--shard", "3")
    assert p.returncode == 2 and "--shard wants I/N" in p.stderr
    p = gpu_job(fake_machine, "quick", "--threads-per-worker", "0")
    assert p.returncode == 2 and "--threads-per-worker wants a positive whole number" in p.stderr


def test_gpu_job_reports_a_shard_that_wrote_nothing(fake_machine):
    f = fake_machine
    exe = f["build"] / "harness" / "cli" / "attncheck"
    exe.write_text("#!/bin/sh\necho 'segfault, pretend' >&2\nexit 139\n")
    p = gpu_job(f, "smoke", "--no-gpu")
    assert p.returncode == 1
    assert "shard 0 (-) wrote no results (exit 139" in p.stderr
    assert "segfault, pretend" in p.stdout  # the log tail is shown
