"""The CPU backend's threads: JFA_NUM_THREADS is a validated cap, and a thread that cannot be
started never takes the process down. Each case runs in a fresh interpreter (the variable is read
once per process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import jfa


def _run(code, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "JFA_NUM_THREADS"}
    full_env.update(env)
    full_env["JFA_DISABLE_TORCH"] = "1"
    full_env["JFA_LIBRARY"] = jfa.library_path()
    full_env["PYTHONPATH"] = os.pathsep.join([str(Path(jfa.__file__).parents[1]),
                                              full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=120)


COUNT = "import jfa; print(jfa._library.lib().jfa_cpu_thread_count())"


def test_thread_cap_is_validated_and_caps():
    unset = _run(COUNT)
    assert unset.returncode == 0, unset.stderr
    hardware = int(unset.stdout)
    assert hardware >= 1 and unset.stderr == ""
    one = _run(COUNT, JFA_NUM_THREADS="1")
    assert int(one.stdout) == 1 and one.stderr == ""
    huge = _run(COUNT, JFA_NUM_THREADS="99999999999")
    assert int(huge.stdout) == hardware and huge.stderr == "", "a cap, never more than the hardware"
    assert int(_run(COUNT, JFA_NUM_THREADS="").stdout) == hardware
    for bad in ("3.7", "abc", "-1", "0", "2x", " 2", "99999999999999999999999"):
        r = _run(COUNT, JFA_NUM_THREADS=bad)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout) == hardware, bad
        assert f'JFA_NUM_THREADS="{bad}" is not a whole number >= 1' in r.stderr, (bad, r.stderr)


def test_thread_start_failure_does_not_abort():
    """Address space limited to just above what the process holds: a second thread's stack cannot
    be mapped. The call completes on the threads it has (or reports out of memory); it never ends
    the process."""
    code = """
import resource, numpy as np, jfa
lib = jfa._library.lib()
if lib.jfa_cpu_thread_count() < 2:
    print("one thread"); raise SystemExit(0)
rng = np.random.default_rng(7)
lengths = [700, 324]
cu = jfa.lengths_to_offsets(lengths)
q = rng.standard_normal((1024, 4, 64)).astype(np.float32)
k = rng.standard_normal((1024, 4, 64)).astype(np.float32)
v = rng.standard_normal((1024, 4, 64)).astype(np.float32)
# The expectation in numpy: no jfa thread may run before the limit (glibc would keep its stack
# and hand it to the next thread without mapping memory).
expected = np.empty_like(q, dtype=np.float64)
for a, b in zip(cu[:-1], cu[1:]):
    s = np.einsum("qhd,khd->hqk", q[a:b].astype(np.float64), k[a:b].astype(np.float64)) / 8.0
    p = np.exp(s - s.max(-1, keepdims=True))
    expected[a:b] = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v[a:b])
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (6 << 20), resource.RLIM_INFINITY))
try:
    out = jfa.jagged_attention(q, k, v, cu)
except jfa.JfaOutOfMemoryError:
    print("out of memory")
else:
    print("ok" if np.allclose(out, expected, atol=1e-4, rtol=1e-4) else "wrong")
"""
    r = _run(code)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}"
    if r.stdout.strip() == "one thread":
        pytest.skip("one hardware thread: no second thread to fail")
    assert r.stdout.strip() in ("ok", "out of memory"), r.stdout + r.stderr


_PROBLEM = """
import os, numpy as np, jfa
threads_at_start = len(os.listdir("/proc/self/task"))  # before any call of the library
rng = np.random.default_rng(3)
cu = jfa.lengths_to_offsets([300, 129, 64])
q, k, v = (rng.standard_normal((493, 4, 32)).astype(np.float32) for _ in range(3))
ref = jfa.attention_reference(q, k, v, cu)
def ok():
    return np.allclose(jfa.jagged_attention(q, k, v, cu), ref, atol=1e-4, rtol=1e-4)
"""


def test_threads_are_kept_across_calls():
    """The worker threads are started once: more calls start no more threads."""
    code = _PROBLEM + """
before = threads_at_start
assert ok()
after_first = len(os.listdir("/proc/self/task"))
assert all(ok() for _ in range(30))
print(before, after_first, len(os.listdir("/proc/self/task")),
      jfa._library.lib().jfa_cpu_thread_count())
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr[-800:]
    before, first, later, cap = map(int, r.stdout.split())
    if cap >= 2:
        assert first > before, "the worker threads end with the call instead of being kept"
    assert later == first, f"threads grew from {first} to {later} over 30 calls"


def test_forked_child_gets_its_own_workers():
    """After fork() the parent's worker threads do not exist in the child: the child's calls must
    still complete (on threads of its own) with the right result."""
    code = _PROBLEM + """
assert ok()  # the parent's pool exists now
pid = os.fork()
if pid == 0:
    os._exit(0 if ok() and ok() else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), ok())
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split() == ["0", "True"], r.stdout + r.stderr
