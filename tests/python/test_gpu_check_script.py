"""scripts/gpu-check.sh on a machine without the carried build: the run stages fail with one
summary line saying so (never a silent pass), and an unknown stage is refused."""
import os
import subprocess
import sys

import pytest
from gpu_check_functions import SCRIPT, functions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(stage, out, **env):
    return subprocess.run(["bash", SCRIPT, stage, str(out)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


@pytest.mark.parametrize("stage", ["suite", "sanitize", "bench-forward", "bench-backward",
                                   "bench-paged", "profile-local",
                                   "profile-paged"])
def test_run_stages_need_the_carried_build(tmp_path, stage):
    r = run(stage, tmp_path / "out", CARRY_DIR=str(tmp_path / "missing"))
    assert r.returncode != 0
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(stage) and "FAILED (nothing carried)" in lines[0]
    assert "run 'scripts/gpu-check.sh build' first" in r.stderr


def test_unknown_stage_is_refused(tmp_path):
    r = run("benchmark", tmp_path)
    assert r.returncode == 2 and "unknown stage 'benchmark'" in r.stderr


def test_benchmark_workload_names_per_head_size():
    """The workloads each benchmark process gets: bench/workloads.py's names at that head size."""
    script = f"source <({functions('workloads_at')}); " \
             "for d in 128 64 192/128; do workloads_at $d; done"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["W1,W2,W3,W4", "W1-d64,W2-d64,W3-d64,W4-d64",
                           "W1-d192v128,W2-d192v128,W3-d192v128,W4-d192v128"]
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import workloads
    names = {spec.id for spec in workloads.SPECS}
    for name in out.replace(",", " ").split():
        assert name in names, name


def test_benchmarks_take_their_head_sizes_from_the_table(tmp_path):
    """bench/workloads.py's CUDA head sizes are the rows of src/cuda/sm90/shapes.def served by both
    passes with equal q.k and v sizes, in the table's order; a size only the forward has, or one
    with a narrower v, is not among them."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import workloads
    assert workloads.CUDA_HEAD_DIMS == workloads.cuda_head_dims()
    table = tmp_path / "shapes.def"
    table.write_text("// a comment: JFA_SM90_FORWARD(1, 1, 2, 128)\n"
                     "JFA_SM90_FORWARD(64, 64, 2, 128)\nJFA_SM90_FORWARD(48, 48, 2, 128)\n"
                     "JFA_SM90_FORWARD(192, 128, 2, 64)\nJFA_SM90_FORWARD(32, 32, 3, 128)\n"
                     "JFA_SM90_BACKWARD(32, 32, 64)\nJFA_SM90_BACKWARD(64, 64, 64)\n"
                     "JFA_SM90_BACKWARD(192, 128, 64)\nJFA_SM90_FORWARD(64, 64, 3, 128)\n")
    assert workloads.cuda_head_dims(str(table)) == (64, 32)


def test_profile_pair_scripts_parse_their_options():
    """The profile stages' scripts parse their default options without torch or a GPU."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import profile_paged_pair

    args = profile_paged_pair.parse_args(["--batch", "8", "--tokens", "256", "--cache", "4096"])
    assert (args.batch, args.tokens, args.cache, args.heads, args.heads_kv) == (8, 256, 4096, 32, 8)
    for bad in (["--tokens", "0"], ["--tokens", "5000"], ["--heads-kv", "5"]):
        with pytest.raises(SystemExit):
            profile_paged_pair.parse_args(bad)


def fake_wheel(folder, name, version):
    """A pure-Python wheel of one module `name` whose VALUE is its version."""
    import zipfile
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", f"VALUE = {version!r}\n")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def test_carried_wheels_are_installed_where_python_lacks_them(tmp_path):
    """install_carried_wheels: the wheels in .peers/wheels go into .peers/site, first on
    PYTHONPATH, once; a wheel of a distribution python3 already has (pytest here) is left out,
    so that the machine's own copy stays in use."""
    wheels = tmp_path / ".peers" / "wheels"
    wheels.mkdir(parents=True)
    fake_wheel(wheels, "jfa_carried_probe", "1.0")
    fake_wheel(wheels, "pytest", "0.0.1")
    script = (f"source <({functions('install_carried_wheels')}); "
              "install_carried_wheels && install_carried_wheels && "
              "python3 -c 'import jfa_carried_probe, pytest; "
              "print(jfa_carried_probe.VALUE, pytest.__version__)'")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ROOT": str(tmp_path), "OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    probe, pytest_version = r.stdout.split()
    assert probe == "1.0" and pytest_version == pytest.__version__
    site = tmp_path / ".peers" / "site"
    assert (site / "jfa_carried_probe.py").exists() and not (site / "pytest.py").exists()
    assert (site / ".installed").exists()


def test_suite_without_pytest_runs_the_gpu_tests_alone(tmp_path):
    """SUITE_PYTEST=none: the carried GPU tests in their shards with the filter, no pytest, and the
    stage's status that of the GPU tests (a failed test fails it)."""
    for lines, rc in ((["[       OK ] PagedGpu.A (5 ms)"], 0),
                      (["[  FAILED  ] PagedGpu.A (5 ms)"], 1)):
        carry = tmp_path / f"carry{rc}"
        (carry / "bin").mkdir(parents=True)
        tests = carry / "bin" / "jfa_gpu_tests"
        tests.write_text("#!/bin/bash\necho \"$GTEST_SHARD_INDEX $*\"\n"
                         + "".join(f"echo '{line}'\n" for line in lines) + f"exit {rc}\n")
        tests.chmod(0o755)
        out = tmp_path / f"out{rc}"
        out.mkdir()
        stubs = (f"runtime_env() {{ CARRY={carry}; }}; left() {{ echo 400; }}; "
                 "gpu_name() { echo GPU; }; summary() { echo \"$*\"; }; "
                 "timeout() { shift; \"$@\"; }; python3() { touch \"$OUT/python-ran\"; }; ")
        code = (f"source <({functions('stage_suite', 'gtest_passed', 'gtest_failed')}); "
                f"{stubs}OUT={out}; SUITE_PYTEST=none SUITE_SHARDS=2 "
                "SUITE_FILTER='PagedGpu.*' stage_suite")
        r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
        assert r.returncode == rc, r.stderr
        assert not (out / "python-ran").exists()
        assert (out / "gpu_tests_shard1.log").read_text().startswith(
            "1 --gtest_filter=PagedGpu.*")
        assert r.stdout.strip() == (f"suite GPU: jfa_gpu_tests {2 - 2 * rc} passed, {2 * rc} "
                                    f"failed (rc {rc}, 2 shards); pytest: not run "
                                    "(SUITE_PYTEST=none)")


def test_the_carried_binaries_are_unpacked_once_with_their_modes(tmp_path):
    """unpack_carry (runtime_env's first step): each lib/*.xz and bin/*.xz of the carry unpacked
    beside itself with its mode, an unpacked file left as it is (a second stage's call)."""
    carry = tmp_path / "carry"
    (carry / "lib").mkdir(parents=True)
    (carry / "bin").mkdir()
    tool = carry / "bin" / "tool"
    tool.write_text("#!/bin/bash\necho ran\n")
    tool.chmod(0o755)
    lib = carry / "lib" / "libx.so.0"
    lib.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    (carry / "lib" / "libx.so").symlink_to("libx.so.0")
    for f in (tool, lib):
        subprocess.run(["xz", "-6", str(f)], check=True)
    assert not tool.exists() and (carry / "bin" / "tool.xz").exists()
    code = (f"source <({functions('unpack_carry')}); CARRY={carry}; unpack_carry; "
            f"{carry}/bin/tool")
    r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    assert (carry / "lib" / "libx.so").read_bytes() == b"\x7fELF" + bytes(range(256)) * 64
    tool.write_text("#!/bin/bash\necho kept\n")
    r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout == "kept\n"  # unpacked once: a later stage's call leaves it


def test_the_build_stage_carries_its_binaries_compressed():
    """stage_build xz-compresses what it carries (links stay links), and runtime_env unpacks the
    carry before anything reads it."""
    text = open(SCRIPT).read()
    build = text[text.index("stage_build() {"):text.index("stage_suite() {")]
    assert 'xz -T0 -6 "$f"' in build and '[ -L "$f" ]' in build
    runtime = text[text.index("runtime_env() {"):text.index("unpack_carry() {")]
    assert runtime.index("unpack_carry") < runtime.index('export LD_LIBRARY_PATH')
