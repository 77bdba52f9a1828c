"""bench/kernel_ab.py: its cells and its argument checks (the timing itself needs a GPU)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kernel_ab  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402


@pytest.mark.parametrize("cell, parsed", [("W1", ("W1", False, False)),
                                          ("W3c", ("W3", True, False)),
                                          ("W4d", ("W4", False, True)),
                                          ("W1cd", ("W1", True, True))])
def test_cells(cell, parsed):
    assert kernel_ab.parse_cell(cell) == parsed


@pytest.mark.parametrize("cell", ["W5", "X1", "W1x", "w1"])
def test_bad_cells_are_rejected(cell):
    with pytest.raises(ValueError, match="cell"):
        kernel_ab.parse_cell(cell)


def test_forward_cells_have_no_deterministic_mode():
    assert kernel_ab.parse_cell("W3c", "forward") == ("W3", True, False)
    with pytest.raises(ValueError, match="no d"):
        kernel_ab.parse_cell("W1d", "forward")


@pytest.mark.parametrize("argv, message", [
    (["--cli", "jfa"], "at least one"),
    (["--cli", "jfa", "base"], "NAME=path"),
    (["--cli", "jfa", "base=/no/such/libjfa.so"], "existing file"),
    (["--cli", "jfa", "--cells", "W1,W9", "base=/no/such/libjfa.so"], "cell 'W9'"),
    (["--cli", "jfa", "--pass", "forward", "--cells", "W1cd", "base=/no/such/libjfa.so"],
     "cell 'W1cd'"),
    (["--cli", "jfa", "--pass", "sideways", "base=/no/such/libjfa.so"], "invalid choice"),
    (["--cli", "jfa", "--heads-kv", "3", "base=/no/such/libjfa.so"], "a divisor of the 16"),
    (["--cli", "jfa", "--heads-kv", "0", "base=/no/such/libjfa.so"], "a divisor of the 16"),
    (["--cli", "jfa", "--pass", "forward", "--head-dim", "80", "base=/no/such/libjfa.so"],
     "invalid choice"),
    (["--cli", "jfa", "--head-dim", "48", "base=/no/such/libjfa.so"], "invalid choice"),
])
def test_arguments_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        kernel_ab.main(argv)
    assert message in capsys.readouterr().err


def test_help_needs_no_torch():
    """The parent process only spawns children: --help answers without torch."""
    text = help_without_torch("kernel_ab")
    assert "--pass {backward,forward}" in text


def test_paired_ratios_compare_each_round_with_the_first_builds_same_round():
    # Round 2 is slower for both builds: the medians of each build's own times would hide that
    # the candidate is faster in every round, which the paired ratios show.
    rounds = {"main": [{"W1": 10.0, "W1c": 5.0}, {"W1": 12.0, "W1c": 6.0},
                       {"W1": 10.5, "W1c": 5.0}],
              "cand": [{"W1": 9.5, "W1c": 5.5}, {"W1": 11.4, "W1c": 5.4},
                       {"W1": 10.5, "W1c": 5.5}]}
    got = kernel_ab.paired_ratios(rounds, ["W1", "W1c"])
    assert list(got) == ["cand"]
    median, low, high, faster = got["cand"]["W1"]
    assert median == pytest.approx(0.95) and low == pytest.approx(0.95)
    assert high == pytest.approx(1.0) and faster == 2
    median, low, high, faster = got["cand"]["W1c"]
    assert median == pytest.approx(1.1) and low == pytest.approx(0.9)
    assert high == pytest.approx(1.1) and faster == 1


def test_paired_table_names_the_base_build_and_counts_rounds():
    rounds = {"a": [{"W4": 2.0}, {"W4": 2.0}], "b": [{"W4": 1.0}, {"W4": 3.0}]}
    table = kernel_ab.paired_table(rounds, ["W4"])
    assert table.splitlines()[0] == "| ÷ a, same round | W4 |"
    assert table.splitlines()[2] == "| b | 1.000 (0.500–1.500, 1/2 faster) |"
    assert kernel_ab.paired_table({"a": rounds["a"]}, ["W4"]) == ""


def test_per_call_ms_sums_each_calls_kernels_in_start_order():
    # Two calls of three kernels each, given out of order: (start µs, duration µs).
    spans = [(30, 500.0), (0, 1000.0), (10, 2000.0), (130, 1500.0), (100, 1000.0), (110, 3000.0)]
    assert kernel_ab.per_call_ms(spans, 2) == [3.5, 5.5]


@pytest.mark.parametrize("spans, runs", [([], 2), ([(0, 1.0)] * 5, 2), ([(0, 1.0)], 0)])
def test_per_call_ms_refuses_counts_that_do_not_divide_into_the_calls(spans, runs):
    assert kernel_ab.per_call_ms(spans, runs) is None
