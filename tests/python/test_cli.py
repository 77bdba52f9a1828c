"""The jfa CLI as a user runs it (CPU backend): progress on stderr, honest checks, arguments the
library cannot take rejected before anything is allocated. Skipped where the CLI was not built
next to the library."""

import json
import subprocess
from pathlib import Path

import pytest

import jfa


def _cli():
    path = Path(jfa.library_path()).resolve().parent.parent / "tools" / "jfa"
    if not path.is_file():
        pytest.skip(f"no CLI at {path} (it is built next to libjfa in a CMake build tree)")
    return str(path)


def _bench(*args, timeout=120):
    return subprocess.run([_cli(), "bench", "--backend", "cpu", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_progress_on_stderr_and_quiet_under_json():
    args = ["--lengths", "1500", "--heads", "4", "--repeats", "3", "--warmup", "0", "--no-padded"]
    r = _bench(*args, "--progress", "1")
    assert r.returncode == 0, r.stderr
    assert "jfa: jagged layout: 3 runs" in r.stderr
    assert "jfa: jagged layout" not in r.stdout
    quiet = _bench(*args, "--json")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert json.loads(quiet.stdout.splitlines()[0])["layout"] == "jagged"
    asked = _bench(*args, "--json", "--progress", "1")
    assert "jfa: jagged layout: 3 runs" in asked.stderr


def test_check_with_no_query_tokens_is_not_a_pass():
    r = _bench("--lengths", "0,0", "--check", "--no-padded")
    assert r.returncode == 0, r.stderr
    assert "nothing to check" in r.stdout and "PASS" not in r.stdout
    j = _bench("--lengths", "0,0", "--check", "--no-padded", "--json")
    assert json.loads(j.stdout.splitlines()[0])["check_rows"] == 0


def test_head_dim_beyond_the_library_is_a_usage_error():
    r = _bench("--lengths", "4", "--head-dim", "600")
    assert r.returncode == 2 and "--head-dim: 600 is outside [1, 512]" in r.stderr, r.stderr
    assert "problem" not in r.stdout  # rejected before the batch was built


def test_help_cites_nothing_outside_the_repository():
    for command in ("bench", "check", "demo"):
        r = subprocess.run([_cli(), command, "--help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0
        assert ".md" not in r.stdout and "seed's" not in r.stdout, r.stdout


def test_check_covers_the_backward():
    r = subprocess.run([_cli(), "check", "--backend", "cpu", "--cases", "12"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    checked = [line for line in r.stdout.splitlines() if " bwd " in line and "ok" in line]
    assert any("bwd -" not in line for line in checked), r.stdout
    summary = next(line for line in r.stdout.splitlines() if line.startswith("backward:"))
    assert int(summary.split()[1]) >= 8, summary
    quiet = subprocess.run([_cli(), "check", "--backend", "cpu", "--cases", "3", "--no-backward"],
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "bwd" not in quiet.stdout and "backward:" not in quiet.stdout


def test_cuda_backend_without_a_gpu_is_a_usage_error():
    if jfa.cuda_available():
        pytest.skip(f"the loaded libjfa ({jfa.library_path()}) has a usable CUDA backend: "
                    "--backend cuda runs")
    r = subprocess.run([_cli(), "bench", "--backend", "cuda", "--lengths", "4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "backend cuda" in r.stderr and "see 'jfa bench --help'" in r.stderr, r.stderr
    assert "problem" not in r.stdout  # rejected before the batch was built


def test_empty_batch_has_nothing_to_time():
    r = _bench("--lengths", "0,0")
    assert r.returncode == 0, r.stderr
    assert "nothing to time" in r.stdout and "speedup" not in r.stdout, r.stdout
    j = _bench("--lengths", "0,0", "--json")
    lines = [json.loads(line) for line in j.stdout.splitlines()]
    assert j.returncode == 0 and [line["layout"] for line in lines] == ["jagged", "padded"]
    assert all(line["median_ms"] is None and line["repeats"] == 0 for line in lines), j.stdout
    assert "speedup_vs_padded" not in lines[0]


def test_head_dim_v():
    """--head-dim-v gives v and the output a head size of their own (checked against the
    reference, counted in the FLOPs); it defaults to --head-dim; out of range is a usage error."""
    args = ["--lengths", "40,7", "--heads", "2", "--head-dim", "48", "--repeats", "1",
            "--warmup", "0", "--no-padded"]
    r = _bench(*args, "--head-dim-v", "20", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "head_dim 48/20" in r.stdout and "check: PASS" in r.stdout, r.stdout
    split = json.loads(_bench(*args, "--head-dim-v", "20", "--json").stdout.splitlines()[0])
    same = json.loads(_bench(*args, "--json").stdout.splitlines()[0])
    assert (split["head_dim"], split["head_dim_v"]) == (48, 20)
    assert (same["head_dim"], same["head_dim_v"]) == (48, 48)
    assert split["useful_gflop"] == pytest.approx(same["useful_gflop"] * (48 + 20) / 96)
    bad = _bench("--lengths", "4", "--head-dim-v", "0")
    assert bad.returncode == 2 and "--head-dim-v: 0 is outside [1, 512]" in bad.stderr, bad.stderr
    assert "problem" not in bad.stdout


def test_check_draws_head_dim_v_on_the_cpu():
    r = subprocess.run([_cli(), "check", "--backend", "cpu"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    split = [line for line in r.stdout.splitlines() if line.startswith("case")
             and "/" in line.split("d=")[1].split()[0]]
    assert split and all("ok" in line for line in split), r.stdout


def test_window_softcap_and_sinks():
    """--window, --softcap and --sinks reach the call (checked against the reference, reported in
    the header and the JSON); bad values are usage errors before anything runs."""
    args = ["--lengths", "40,7,0", "--lengths-k", "9,30,2", "--heads", "2", "--head-dim", "32",
            "--repeats", "1", "--warmup", "0", "--no-padded"]
    local = ["--window", "4,0", "--softcap", "2.5", "--sinks"]
    r = _bench(*args, *local, "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "window 4,0, softcap 2.5, sinks normal(0, 2)" in r.stdout and "check: PASS" in r.stdout
    line = json.loads(_bench(*args, *local, "--json").stdout.splitlines()[0])
    assert (line["window_left"], line["window_right"], line["softcap"], line["sinks"]) == (
        4, 0, 2.5, True)
    plain = json.loads(_bench(*args, "--json").stdout.splitlines()[0])
    assert (plain["window_left"], plain["window_right"], plain["softcap"], plain["sinks"]) == (
        -1, -1, 0, False)
    for bad, message in ((["--window", "3"], "--window: expected LEFT,RIGHT"),
                         (["--window", "-2,1"], "--window: entry 0: -2 is outside [-1, "),
                         (["--softcap", "-1"], "--softcap: -1 is outside [0, "),
                         (["--softcap", "nan"], "--softcap: expected a number")):
        r = _bench("--lengths", "4", *bad)
        assert r.returncode == 2 and message in r.stderr, (bad, r.stderr)
        assert "problem" not in r.stdout


def test_check_draws_windows_softcap_and_sinks_on_the_cpu():
    r = subprocess.run([_cli(), "check", "--backend", "cpu", "--cases", "80"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cases = [line for line in r.stdout.splitlines() if line.startswith("case")]
    for feature in (" window=", " softcap=", " sinks"):
        drawn = [line for line in cases if feature in line]
        assert drawn and all(" ok " in line for line in drawn), (feature, r.stdout)
    # Some with the backward checked too (dsinks compared with the reference's).
    assert any(" sinks" in line and "bwd -" not in line for line in cases), r.stdout


_PAGED_SHAPE = ["--lengths", "1,1,3,0,12", "--lengths-k", "70,17,9,5,40", "--heads", "4",
                "--heads-kv", "2", "--head-dim", "32", "--causal", "--repeats", "1", "--warmup",
                "0"]


def test_paged_kv_cache_checks_and_reports_its_layout():
    """--page-size runs the paged forward over a cache holding the batch's keys: checked against the
    paged float64 reference, reported in the header, the table and the JSON, no padded run."""
    r = _bench(*_PAGED_SHAPE, "--page-size", "16", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    # Pages: ceil(70/16) + ceil(17/16) + 1 + 1 + ceil(40/16) = 5 + 2 + 1 + 1 + 3.
    assert "paged    KV cache of 12 pages x 16 rows" in r.stdout, r.stdout
    assert "(block table 5 x 5)" in r.stdout, r.stdout
    assert "padded   not run" in r.stdout and "speedup" not in r.stdout, r.stdout
    assert any(line.split()[2:3] == ["paged"] for line in r.stdout.splitlines()
               if line.startswith("jfa (cpu)")), r.stdout
    assert "check: PASS" in r.stdout, r.stdout
    lines = [json.loads(line) for line in
             _bench(*_PAGED_SHAPE, "--page-size", "16", "--check", "--json").stdout.splitlines()]
    assert len(lines) == 1, lines  # the padded baseline does not apply
    line = lines[0]
    assert (line["layout"], line["page_size"], line["num_pages"]) == ("paged", 16, 12), line
    assert line["check_passed"] and line["check_rows"] > 0, line
    assert (line["total_k"], line["max_seqlen_q"], line["max_seqlen_k"]) == (141, 12, 70)


def test_packed_runs_are_unchanged_by_the_paged_option():
    lines = [json.loads(line) for line in _bench(*_PAGED_SHAPE, "--json").stdout.splitlines()]
    assert [line["layout"] for line in lines] == ["jagged", "padded"], lines
    assert all("page_size" not in line and "num_pages" not in line for line in lines), lines


@pytest.mark.parametrize("page_size", ["1", "7", "128"])
@pytest.mark.parametrize("extra", [[], ["--window", "5,0", "--softcap", "3", "--sinks"]])
def test_paged_output_equals_the_packed_output(page_size, extra):
    """The CPU backend's output over the cache is the packed call's: on the same seed the two runs'
    errors against the reference, on the same sampled rows, agree to every printed digit (float32,
    where any difference of the outputs would show)."""
    args = [*_PAGED_SHAPE, "--dtype", "fp32", "--seed", "7", "--check", "--json", *extra]
    packed = json.loads(_bench(*args, "--no-padded").stdout.splitlines()[0])
    paged = json.loads(_bench(*args, "--page-size", page_size).stdout.splitlines()[0])
    assert packed["check_passed"] and paged["check_passed"], (packed, paged)
    assert paged["check_rows"] == packed["check_rows"] > 0
    assert paged["check_rel_error"] == packed["check_rel_error"], (packed, paged)
    assert paged["check_rel_error"] < 1e-5
    assert paged["useful_gflop"] == packed["useful_gflop"]


def test_page_size_zero_is_a_usage_error():
    r = _bench("--lengths", "4", "--page-size", "0")
    assert r.returncode == 2 and "--page-size: 0 is outside [1, " in r.stderr, r.stderr
    assert "problem" not in r.stdout  # rejected before the batch was built
