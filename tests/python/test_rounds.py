"""Interleaved rounds of the benchmarks (bench/rounds.py): the order of each round and the record
kept from a method's rounds."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import rounds  # noqa: E402


def rec(status, tflops, tag):
    return {"status": status, "useful_tflops": tflops, "tag": tag}


def test_in_turn_alternates_the_order():
    variants = ["a", "b", "c"]
    assert rounds.in_turn(variants, 0) == variants
    assert rounds.in_turn(variants, 1) == variants[::-1]
    assert rounds.in_turn(variants, 4) == variants


def test_median_round_keeps_the_median_record():
    kept = rounds.median_round([rec("ok", 610.0, "r0"), rec("ok", 580.0, "r1"),
                                rec("ok", 640.0, "r2")])
    assert kept["tag"] == "r0"
    assert kept["rounds"] == [610.0, 580.0, 640.0]
    # Even counts: the lower of the two middle rounds.
    assert rounds.median_round([rec("ok", 5.0, "hi"), rec("ok", 4.0, "lo")])["tag"] == "lo"
    # Padded peers are timed without a check; they still have a median.
    assert rounds.median_round([rec("unchecked", 3.0, "x"), rec("unchecked", 2.0, "y"),
                                rec("unchecked", 1.0, "z")])["tag"] == "y"


def test_a_failure_in_any_round_is_the_result():
    kept = rounds.median_round([rec("ok", 600.0, "r0"), rec("wrong", 650.0, "r1"),
                                rec("ok", 590.0, "r2")])
    assert kept["status"] == "wrong" and kept["tag"] == "r1"
    assert kept["rounds"] == [600.0, None, 590.0]
    only = rounds.median_round([rec("unavailable", None, "u")])
    assert only["status"] == "unavailable" and only["rounds"] == [None]


def test_median_round_does_not_change_its_input():
    records = [rec("ok", 1.0, "a")]
    rounds.median_round(records)
    assert "rounds" not in records[0]
    with pytest.raises(ValueError):
        rounds.median_round([])


def test_measure_rounds_in_turn_and_once_for_a_method_not_timed():
    order, reported = [], []

    def measure(variant):
        order.append(variant)
        return {"status": "unavailable" if variant == "b" else "ok", "variant": variant}

    taken = rounds.measure_rounds(["a", "b", "c"], 3, measure, reported.append)
    assert order == ["a", "b", "c", "c", "a", "a", "c"]
    assert [r["round"] for r in taken["a"]] == [0, 1, 2]
    assert [r["round"] for r in taken["b"]] == [0]
    assert [(r["variant"], r["round"]) for r in reported] == [
        ("a", 0), ("b", 0), ("c", 0), ("c", 1), ("a", 1), ("a", 2), ("c", 2)]
    assert rounds.measure_rounds(["a"], 1, measure)["a"][0]["round"] == 0
