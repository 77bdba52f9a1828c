"""The benchmark workloads, their useful FLOPs and their minimal bytes.

The lengths of W1..W4 are not repeated here: they come from the one C++ workloads file through the
CLI (`jfa bench --workload W1 --print-lengths`), so every tool measures the same batches. The
cross-attention workloads (X1, X2) are fixed functions of W1's lengths; the equivalent CLI run is
`jfa bench --lengths <q lengths> --lengths-k <k lengths>` (see `cli_command`).

Counting:
- useful FLOPs = 4 * sum_b pairs_b * heads_q * head_dim, pairs_b = Lq_b * Lk_b; causal counts half
  for equal lengths and the exact number of visible (query, key) pairs otherwise, bottom-right
  aligned: query row i (0-based) sees keys j <= i + (Lk - Lq). With a value head size of its own
  (head_dim_v: the columns of V and O), 2 * sum_b pairs_b * heads_q * (head_dim + head_dim_v).
- minimal bytes = Q, K, V read once and O written once.

Only the standard library is needed. `python3 bench/workloads.py --cli build/cpu/tools/jfa`
prints the FLOP and byte floors of every workload as a markdown table.
"""
import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

HEADS = 16
SHAPES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src", "cuda",
                           "sm90", "shapes.def")


def cuda_head_dims(path=SHAPES_FILE):
    """The head sizes with equal q.k and v sizes that both passes of the CUDA kernels serve, from
    the rows of their one table (src/cuda/sm90/shapes.def), in the order of their first row."""
    rows = {"FORWARD": [], "BACKWARD": []}
    with open(path) as f:
        for line in f:
            m = re.match(r"JFA_SM90_(FORWARD|BACKWARD)\((\d+), (\d+)[,)]", line)
            if m:
                rows[m.group(1)].append((int(m.group(2)), int(m.group(3))))
    both = [d for d, dv in rows["FORWARD"] if d == dv and (d, dv) in rows["BACKWARD"]]
    return tuple(dict.fromkeys(both))


# The head sizes of the CUDA kernels with equal q.k and v sizes, forward and backward.
CUDA_HEAD_DIMS = cuda_head_dims()
DTYPES = ("fp16", "bf16")
ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}

# Ceilings measured on the H200 (bench/NOTES.md, 2026-11-29).
MATMUL_CEILING_TFLOPS = 745.0   # fp16 8192^3 matmul
COPY_CEILING_TBPS = 4.23        # device copy, read + write


@dataclass(frozen=True)
class WorkloadSpec:
    id: str                 # e.g. "W1", "W1-d64", "X1"
    base: str               # the CLI preset the lengths come from: W1..W4
    head_dim: int
    description: str
    heads: int = HEADS
    heads_kv: int = HEADS
    cross: str = ""         # "" (k lengths = q lengths) or a rule name of CROSS_RULES
    causal: tuple = (False, True)
    dtypes: tuple = DTYPES
    head_dim_v: int = 0     # columns of v and the output; 0: head_dim

    @property
    def value_dim(self):
        return self.head_dim_v or self.head_dim


def _reverse(lengths):
    return list(reversed(lengths)), None


def _chunk(lengths):
    # The last quarter of every sequence attends to the whole sequence (chunked prefill): q is
    # short, k is long; causal is bottom-right aligned, so query row i sees i + Lk - Lq + 1 keys.
    return [max(1, L // 4) for L in lengths], "q"


# rule(lengths of base) -> (new lengths, which side they replace: None = k, "q" = q (k = base))
CROSS_RULES = {"reverse": _reverse, "chunk": _chunk}

SPECS = [
    WorkloadSpec("W1", "W1", 128, "B=32, lengths uniform in [1024, 3072]: the reference benchmark batch"),
    WorkloadSpec("W2", "W2", 128, "lengths [128, 4096, 512, 2048]: the worked example"),
    WorkloadSpec("W3", "W3", 128, "B=16, lengths uniform in [1, 8192]: packed LLM prefill"),
    WorkloadSpec("W4", "W4", 128, "B=4096, lengths uniform in [1, 64]: many tiny sequences"),
    WorkloadSpec("W1-d64", "W1", 64, "W1 at head_dim 64"),
    WorkloadSpec("W2-d64", "W2", 64, "W2 at head_dim 64"),
    WorkloadSpec("W3-d64", "W3", 64, "W3 at head_dim 64"),
    WorkloadSpec("W4-d64", "W4", 64, "W4 at head_dim 64"),
    WorkloadSpec("W1-d192", "W1", 192, "W1 at head_dim 192"),
    WorkloadSpec("W2-d192", "W2", 192, "W2 at head_dim 192"),
    WorkloadSpec("W3-d192", "W3", 192, "W3 at head_dim 192"),
    WorkloadSpec("W4-d192", "W4", 192, "W4 at head_dim 192"),
    WorkloadSpec("W1-d32", "W1", 32, "W1 at head_dim 32"),
    WorkloadSpec("W2-d32", "W2", 32, "W2 at head_dim 32"),
    WorkloadSpec("W3-d32", "W3", 32, "W3 at head_dim 32"),
    WorkloadSpec("W4-d32", "W4", 32, "W4 at head_dim 32"),
    WorkloadSpec("W1-d96", "W1", 96, "W1 at head_dim 96"),
    WorkloadSpec("W2-d96", "W2", 96, "W2 at head_dim 96"),
    WorkloadSpec("W3-d96", "W3", 96, "W3 at head_dim 96"),
    WorkloadSpec("W4-d96", "W4", 96, "W4 at head_dim 96"),
    WorkloadSpec("W1-d256", "W1", 256, "W1 at head_dim 256"),
    WorkloadSpec("W2-d256", "W2", 256, "W2 at head_dim 256"),
    WorkloadSpec("W3-d256", "W3", 256, "W3 at head_dim 256"),
    WorkloadSpec("W4-d256", "W4", 256, "W4 at head_dim 256"),
    WorkloadSpec("W1-d192v128", "W1", 192, "W1 at head_dim 192, head_dim_v 128", head_dim_v=128),
    WorkloadSpec("W2-d192v128", "W2", 192, "W2 at head_dim 192, head_dim_v 128", head_dim_v=128),
    WorkloadSpec("W3-d192v128", "W3", 192, "W3 at head_dim 192, head_dim_v 128", head_dim_v=128),
    WorkloadSpec("W4-d192v128", "W4", 192, "W4 at head_dim 192, head_dim_v 128", head_dim_v=128),
    WorkloadSpec("X1", "W1", 128, "cross attention: q lengths = W1, k lengths = W1 reversed",
                 cross="reverse"),
    WorkloadSpec("X2", "W1", 128, "cross attention: q = the last quarter of each W1 sequence "
                 "(chunked prefill), k = the whole W1 sequence", cross="chunk"),
]
SPEC_BY_ID = {s.id: s for s in SPECS}
DEFAULT_IDS = [s.id for s in SPECS]
QUICK_IDS = ["W1", "W2", "W3", "W4"]

# The masks a run covers, by the value of the tools' --masks option (False: no mask).
MASKS = {"both": (False, True), "causal": (True,), "noncausal": (False,)}


def mask_name(causal):
    return "causal" if causal else "non-causal"


@dataclass
class Workload:
    spec: WorkloadSpec
    lengths_q: list
    lengths_k: list
    extra: dict = field(default_factory=dict)

    @property
    def id(self):
        return self.spec.id

    @property
    def batch(self):
        return len(self.lengths_q)

    @property
    def total_q(self):
        return sum(self.lengths_q)

    @property
    def total_k(self):
        return sum(self.lengths_k)

    @property
    def max_q(self):
        return max(self.lengths_q, default=0)

    @property
    def max_k(self):
        return max(self.lengths_k, default=0)

    @property
    def is_cross(self):
        return self.lengths_q != self.lengths_k

    def flops(self, causal):
        return useful_flops(self.lengths_q, self.lengths_k, self.spec.heads, self.spec.head_dim,
                            causal, self.spec.head_dim_v)

    def bytes(self, dtype):
        return minimal_bytes(self.lengths_q, self.lengths_k, self.spec.heads, self.spec.heads_kv,
                             self.spec.head_dim, dtype, self.spec.head_dim_v)

    def summary(self):
        def stats(ls):
            n = len(ls)
            return {"count": n, "total": sum(ls), "min": min(ls, default=0),
                    "max": max(ls, default=0), "mean": (sum(ls) / n) if n else 0.0}
        return {"id": self.id, "base": self.spec.base, "description": self.spec.description,
                "heads": self.spec.heads, "heads_kv": self.spec.heads_kv,
                "head_dim": self.spec.head_dim, "head_dim_v": self.spec.value_dim,
                "lengths_q": stats(self.lengths_q),
                "lengths_k": stats(self.lengths_k),
                "flops_noncausal": self.flops(False), "flops_causal": self.flops(True),
                "bytes_fp16": self.bytes("fp16"), "cli": cli_command(self)}


# ---- counting ----------------------------------------------------------------------------------

def visible_pairs(lq, lk, causal):
    """Visible (query, key) pairs of one sequence (see the module docstring for the convention)."""
    lq, lk = int(lq), int(lk)
    if lq <= 0 or lk <= 0:
        return 0.0
    if not causal:
        return float(lq) * float(lk)
    if lq == lk:
        return float(lq) * float(lk) / 2.0  # the usual convention for equal lengths

    # Row i sees clamp(i + lk - lq + 1, 0, lk) keys; a = i + lk - lq + 1 runs over lk-lq+1 .. lk.
    def prefix(x):  # sum of min(a, lk) for a = 1..x
        if x <= 0:
            return 0
        return x * (x + 1) // 2 if x <= lk else lk * (lk + 1) // 2 + (x - lk) * lk

    return float(prefix(lk) - prefix(lk - lq))


def useful_flops(lengths_q, lengths_k, heads_q, head_dim, causal, head_dim_v=0):
    """2 * pairs * heads_q * (head_dim + head_dim_v): Q K^T and P V (head_dim_v 0: head_dim)."""
    lengths_k = lengths_q if lengths_k is None else lengths_k
    if len(lengths_q) != len(lengths_k):
        raise ValueError("lengths_q and lengths_k differ in count")
    pairs = sum(visible_pairs(a, b, causal) for a, b in zip(lengths_q, lengths_k))
    return 2.0 * pairs * heads_q * (head_dim + (head_dim_v or head_dim))


def minimal_bytes(lengths_q, lengths_k, heads_q, heads_kv, head_dim, dtype, head_dim_v=0):
    """Q, K (head_dim columns) and V (head_dim_v; 0: head_dim) read once and O written once."""
    lengths_k = lengths_q if lengths_k is None else lengths_k
    e = ELEMENT_BYTES[dtype]
    tq, tk = sum(lengths_q), sum(lengths_k)
    dv = head_dim_v or head_dim
    return float(e * (head_dim + dv) * (tq * heads_q + tk * heads_kv))


def floors(workload, dtype, causal):
    """Time floors (ms) from the two ceilings, and the TFLOP/s the memory floor allows."""
    f = workload.flops(causal)
    b = workload.bytes(dtype)
    t_compute = f / (MATMUL_CEILING_TFLOPS * 1e12) * 1e3
    t_memory = b / (COPY_CEILING_TBPS * 1e12) * 1e3
    bound = max(t_compute, t_memory)
    return {"flops": f, "bytes": b, "compute_floor_ms": t_compute, "memory_floor_ms": t_memory,
            "bound": "memory" if t_memory > t_compute else "compute",
            "ceiling_tflops": (f / (bound * 1e-3) / 1e12) if bound > 0 else 0.0}


# ---- lengths from the CLI ----------------------------------------------------------------------

class LengthsError(RuntimeError):
    pass


def find_cli(path=None, search_root="."):
    """The given CLI path, else the newest build/**/tools/jfa under search_root; None if none."""
    if path:
        return path
    import glob
    hits = [h for h in glob.glob(os.path.join(search_root, "build", "**", "tools", "jfa"),
                                 recursive=True) if os.path.isfile(h) and os.access(h, os.X_OK)]
    return max(hits, key=os.path.getmtime) if hits else None


def parse_lengths(text):
    text = text.strip()
    if not text:
        return []
    out = []
    for tok in text.replace("\n", ",").split(","):
        tok = tok.strip()
        if tok:
            v = int(tok)
            if v < 0:
                raise ValueError(f"negative length {v}")
            out.append(v)
    return out


_cache = {}


def cli_lengths(cli, base, timeout=60):
    """Query lengths of a preset (W1..W4) as printed by `jfa bench --workload X --print-lengths`."""
    key = (cli, base)
    if key in _cache:
        return list(_cache[key])
    if not cli:
        raise LengthsError("the jfa CLI was not found (pass --cli <build>/tools/jfa)")
    try:
        r = subprocess.run([cli, "bench", "--workload", base, "--print-lengths"],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        raise LengthsError(f"running {cli}: {e}") from e
    if r.returncode != 0:
        raise LengthsError(f"{cli} bench --workload {base} --print-lengths exited {r.returncode}: "
                           f"{(r.stderr or r.stdout).strip()[:300]}")
    try:
        lengths = parse_lengths(r.stdout)
    except ValueError as e:
        raise LengthsError(f"cannot parse the lengths printed by {cli}: {e}") from e
    if not lengths:
        raise LengthsError(f"{cli} printed no lengths for {base}")
    _cache[key] = list(lengths)
    return lengths


def make_workload(spec, base_lengths):
    """The workload of spec given the lengths of its base preset."""
    lq = list(base_lengths)
    lk = list(base_lengths)
    if spec.cross:
        new, side = CROSS_RULES[spec.cross](list(base_lengths))
        if side == "q":
            lq = new
        else:
            lk = new
    return Workload(spec, lq, lk)


def load(ids, cli):
    """[(id, Workload or None, error message or None)] in the order of ids."""
    out = []
    for wid in ids:
        spec = SPEC_BY_ID.get(wid)
        if spec is None:
            out.append((wid, None, f"unknown workload '{wid}' (known: {', '.join(DEFAULT_IDS)})"))
            continue
        try:
            out.append((wid, make_workload(spec, cli_lengths(cli, spec.base)), None))
        except LengthsError as e:
            out.append((wid, None, str(e)))
    return out


def check_sample(lengths_q, lengths_k=None, few=4, tiny_len=256, tiny_count=64):
    """Indices of the sequences whose rows every method is checked on: all of a small batch; else
    the longest (most keys per query), the shortest, the first and the last; for batches of tiny
    sequences (all q and k lengths <= tiny_len) up to tiny_count evenly spaced ones as well."""
    lengths_k = lengths_q if lengths_k is None else lengths_k
    n = len(lengths_q)
    if n <= few:
        return list(range(n))
    work = [int(a) * max(int(b), 1) for a, b in zip(lengths_q, lengths_k)]
    keep = {max(range(n), key=lambda i: (work[i], i)), min(range(n), key=lambda i: (work[i], i)),
            0, n - 1}
    picks = set(keep)
    if max(max(lengths_q), max(lengths_k)) <= tiny_len:
        step = max(1, n // max(1, tiny_count - len(keep)))
        for i in range(0, n, step):
            if len(picks) >= tiny_count:
                break
            picks.add(i)
    return sorted(picks)


def cli_command(w):
    """The `jfa bench` command that runs the same batch."""
    d = f" --head-dim {w.spec.head_dim}" if w.spec.head_dim != 128 else ""
    if w.spec.value_dim != w.spec.head_dim:
        d += f" --head-dim-v {w.spec.value_dim}"
    if not w.is_cross:
        return f"jfa bench --workload {w.spec.base}{d}"
    q = ",".join(str(x) for x in w.lengths_q)
    k = ",".join(str(x) for x in w.lengths_k)
    return f"jfa bench --lengths {q} --lengths-k {k}{d}"


# ---- the floors table (for NOTES.md) ----------------------------------------------------------

def head_dims(spec):
    """"128", or "192/128" where v has a head size of its own."""
    d, dv = spec.head_dim, spec.value_dim
    return str(d) if d == dv else f"{d}/{dv}"


def floors_markdown(workloads, dtype="fp16"):
    lines = [
        f"| workload | B | q tokens | k tokens | head_dim | useful GFLOP (full / causal) | "
        f"min bytes {dtype} (MB) | compute floor ms (full / causal) | memory floor ms | "
        f"ceiling TFLOP/s (full / causal) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in workloads:
        fn, fc = floors(w, dtype, False), floors(w, dtype, True)
        lines.append(
            f"| {w.id} | {w.batch} | {w.total_q:,} | {w.total_k:,} | {head_dims(w.spec)} | "
            f"{fn['flops'] / 1e9:,.1f} / {fc['flops'] / 1e9:,.1f} | {fn['bytes'] / 1e6:,.1f} | "
            f"{fn['compute_floor_ms']:.3f} / {fc['compute_floor_ms']:.3f} | "
            f"{fn['memory_floor_ms']:.3f} | {fn['ceiling_tflops']:.0f} / {fc['ceiling_tflops']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=None, help="the jfa CLI (default: newest build/**/tools/jfa)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_IDS))
    ap.add_argument("--dtype", default="fp16", choices=sorted(ELEMENT_BYTES))
    args = ap.parse_args(argv)
    cli = find_cli(args.cli)
    ws = []
    for wid, w, err in load([x.strip() for x in args.workloads.split(",") if x.strip()], cli):
        if w is None:
            print(f"{wid}: unavailable: {err}", file=sys.stderr)
        else:
            ws.append(w)
    print(floors_markdown(ws, args.dtype))
    return 0 if ws else 1


if __name__ == "__main__":
    sys.exit(main())
