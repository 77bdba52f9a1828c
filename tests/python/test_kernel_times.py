"""bench/kernel_times.py: the per-kernel summary of profiled calls (the GPU part runs on a GPU
machine only)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kernel_times  # noqa: E402


def test_kernel_medians_per_name_without_the_spin_kernel():
    durations = [("fwd_kernel", 10.0), ("build_work_list", 2.0), ("fwd_kernel", 30.0),
                 ("at::cuda::(anonymous namespace)::spin_kernel(long)", 100.0),
                 ("fwd_kernel", 20.0), ("build_work_list", 4.0)]
    assert kernel_times.kernel_medians(durations) == {"fwd_kernel": (3, 20.0),
                                                      "build_work_list": (2, 3.0)}


def test_short_name_drops_template_arguments_and_parameters():
    assert kernel_times.short_name("void jfa::sm90::fwd_kernel<Cfg<64>>(CUtensorMap)") == (
        "void jfa::sm90::fwd_kernel")
    assert kernel_times.short_name("k" * 60, limit=10) == "kkkkkkk..."


def test_help_runs_without_a_gpu(capsys):
    try:
        kernel_times.main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    assert "Kernel durations" in capsys.readouterr().out
