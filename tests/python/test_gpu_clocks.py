"""bench/gpu_clocks.py without a GPU: nvidia-smi's lines parsed per GPU (unsupported fields and
stray lines left out), the busy samples' clock, power and power-capped share, and the sampler
around a stand-in for nvidia-smi (and without one)."""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gpu_clocks  # noqa: E402

LINES = [
    "0, 1980, 80.5, 700.00, 0x0000000000000001",  # idle: not busy
    "0, 1830, 689.0, 700.00, 0x0000000000000004",  # power cap
    "0, 1290, 698.0, 700.00, 0x0000000000000004",
    "0, 1980, 400.0, 700.00, 0x0000000000000000",
    "0, 1560, 695.0, 700.00, [N/A]",  # reasons unknown: not in the share
    "1, 1980, 75.0, 700.00, 0x0000000000000000",  # a second GPU, idle throughout
    "No devices were found",
    "0, 19",  # a line cut off at the end
]


def test_lines_are_parsed_per_gpu_and_stray_lines_left_out():
    per_gpu = gpu_clocks.parse(LINES)
    assert sorted(per_gpu) == [0, 1]
    assert len(per_gpu[0]) == 5 and len(per_gpu[1]) == 1
    assert per_gpu[0][1] == (1830.0, 689.0, 700.0, 4)
    assert per_gpu[0][4][3] is None


def test_summary_over_busy_samples():
    s = gpu_clocks.summarize(LINES, 500)
    assert s["interval_ms"] == 500
    g = s["gpus"]["0"]
    assert (g["samples"], g["busy_samples"], g["power_limit_w"]) == (5, 4, 700.0)
    assert g["sm_clock_mhz"] == {"median": pytest.approx((1560 + 1830) / 2), "p10": 1290.0,
                                 "min": 1290.0, "max": 1980.0}
    assert g["power_w"] == {"median": pytest.approx((689 + 695) / 2), "max": 698.0}
    assert g["power_capped_share"] == pytest.approx(2 / 3, abs=1e-3)  # of 3 with known reasons
    idle = s["gpus"]["1"]
    assert idle["busy_samples"] == 0 and "sm_clock_mhz" not in idle
    assert gpu_clocks.summarize(["garbage"]) is None


def test_the_query_names_a_field_per_column():
    cmd = gpu_clocks.command(250)
    assert cmd[0] == "nvidia-smi" and cmd[-2:] == ["-lms", "250"]
    query = next(a for a in cmd if a.startswith("--query-gpu="))
    assert query.split("=", 1)[1].split(",") == list(gpu_clocks.FIELDS)


def test_sampler_collects_what_the_command_printed_until_the_block_ends(tmp_path):
    printed = tmp_path / "printed"
    script = ("import pathlib, sys, time\n"
              + "".join(f"print({line!r}, flush=True)\n" for line in LINES[:4])
              + f"pathlib.Path({str(printed)!r}).touch()\ntime.sleep(60)\n")
    with gpu_clocks.Sampler(500, cmd=[sys.executable, "-c", script]) as s:
        deadline = time.monotonic() + 30
        while not printed.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert printed.exists(), "the stand-in for nvidia-smi did not start"
    assert s.proc is None  # stopped with the block, not after its 60 s
    assert s.summary()["gpus"]["0"]["samples"] == 4


def test_without_nvidia_smi_the_block_runs_and_there_is_no_summary():
    with gpu_clocks.Sampler(cmd=["no-such-program-for-clocks"]) as s:
        ran = True
    assert ran and s.summary() is None
