"""The GPUs' SM clock and power draw while a benchmark runs, sampled by nvidia-smi in the
background. Under sustained tensor work an H200 reaches its power limit and lowers its SM clock
(from 1,980 MHz to 1,300-1,900), so the same kernel reads differently from run to run and a burst
of a few calls reads faster than a benchmark's steady calls; a results file that carries the
clock it ran at says how much of a difference is the GPU's. No torch needed.

    with gpu_clocks.Sampler() as s:
        ...  # the measurements
    doc["gpu_clocks"] = s.summary()  # None where nvidia-smi is missing or printed nothing
"""
import shutil
import statistics
import subprocess

FIELDS = ("index", "clocks.sm", "power.draw", "power.limit", "clocks_throttle_reasons.active")
# Clock-reason bits that mean the power limit held the clock down: the software power cap and the
# hardware power brake.
POWER_REASONS = 0x4 | 0x80
# A sample counts as busy when the GPU draws more than this share of its power limit: idle and
# host-only stretches (loading, references on the CPU) would otherwise pull the medians to the
# idle clock.
BUSY_SHARE = 0.35


def command(interval_ms):
    return ["nvidia-smi", "--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits",
            "-lms", str(int(interval_ms))]


def _number(text):
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse(lines):
    """{gpu index: [(sm MHz, W, limit W, reasons or None)]} from nvidia-smi's lines; lines that are
    not samples (errors, a cut-off last line) are left out."""
    out = {}
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        index, clock, power, limit = (_number(p) for p in parts[:4])
        if index is None or clock is None or power is None:
            continue
        try:
            reasons = int(parts[4], 16)
        except ValueError:
            reasons = None
        out.setdefault(int(index), []).append((clock, power, limit, reasons))
    return out


def _percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(lines, interval_ms=None):
    """Per GPU: how many samples, how many busy, and over the busy ones the SM clock (median, 10th
    percentile, lowest, highest), the power drawn (median, highest) against the limit, and the
    share of them whose clock the power limit held down. None without a sample."""
    per_gpu = parse(lines)
    if not per_gpu:
        return None
    gpus = {}
    for index, samples in sorted(per_gpu.items()):
        limits = [s[2] for s in samples if s[2]]
        limit = max(limits) if limits else None
        busy = [s for s in samples if limit is None or s[1] > BUSY_SHARE * limit]
        g = {"samples": len(samples), "busy_samples": len(busy), "power_limit_w": limit}
        if busy:
            clocks = [s[0] for s in busy]
            powers = [s[1] for s in busy]
            known = [s[3] for s in busy if s[3] is not None]
            g.update(sm_clock_mhz={"median": statistics.median(clocks),
                                   "p10": _percentile(clocks, 0.1), "min": min(clocks),
                                   "max": max(clocks)},
                     power_w={"median": statistics.median(powers), "max": max(powers)},
                     power_capped_share=(round(sum(1 for r in known if r & POWER_REASONS)
                                               / len(known), 3) if known else None))
        gpus[str(index)] = g
    return {"interval_ms": interval_ms, "busy_when_above_limit_share": BUSY_SHARE, "gpus": gpus}


class Sampler:
    """nvidia-smi's samples from entering to leaving the block. Without nvidia-smi (or when it
    cannot start) the block runs all the same and summary() is None."""

    def __init__(self, interval_ms=500, cmd=None):
        self.interval_ms = interval_ms
        self.cmd = cmd or command(interval_ms)
        self.proc = None
        self.lines = []

    def __enter__(self):
        if shutil.which(self.cmd[0]):
            try:
                self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.proc = None
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.lines = (out or "").splitlines()
        self.proc = None

    def summary(self):
        return summarize(self.lines, self.interval_ms)
