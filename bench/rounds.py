"""Repeated, interleaved measurements: the order of the variants in each round, and one record per
variant from its rounds. Clock and power make one timing of the same code vary by up to ~10% on an
H200 over a long run, so a comparison is only as good as its interleaving."""


def in_turn(variants, round_index):
    """The variants in the order of one round: reversed in odd rounds, so that no variant always
    goes first. With a fixed order, identical code read 604 vs 562 TFLOP/s on the first workload of
    a run (W1) and within 3% on the later ones."""
    return list(variants) if round_index % 2 == 0 else list(variants)[::-1]


TIMED = ("ok", "unchecked")  # statuses that carry a time


def median_round(records, key="useful_tflops", higher_is_better=True, fields=None):
    """One record from one method's records of the rounds of one cell (workload, dtype, mask): the
    round with the median `key` (the slower middle one for an even count) when every round was
    timed, else the first round that was not (a failed check in any round is the result). The
    record gets "rounds": every round's `key` (None where not timed), or every round's `fields`."""
    if not records:
        raise ValueError("no records")
    values = [r.get(key) if r.get("status") in TIMED else None for r in records]
    failed = [r for r, v in zip(records, values) if v is None]
    if failed:
        chosen = dict(failed[0])
    else:
        order = sorted(range(len(records)), key=lambda i: values[i], reverse=not higher_is_better)
        chosen = dict(records[order[(len(order) - 1) // 2]])
    chosen["rounds"] = values if fields is None else [{f: r.get(f) for f in fields}
                                                      for r in records]
    return chosen


def measure_rounds(variants, count, measure, report=None):
    """{variant: its records, one a round}: `count` rounds of measure(variant), the variants
    in_turn, each record marked with its "round" and passed to report(record) when it is taken.
    A variant whose first round was not timed is not measured again: unavailable, skipped or
    failed, once is the result."""
    taken = {v: [] for v in variants}
    for round_index in range(count):
        for v in in_turn(variants, round_index):
            if round_index > 0 and taken[v][0]["status"] not in TIMED:
                continue
            rec = measure(v)
            rec["round"] = round_index
            taken[v].append(rec)
            if report is not None:
                report(rec)
    return taken
