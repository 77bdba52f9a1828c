"""The GPU side of bench/peers.py: inputs, the float64 reference, the methods and their timing.

Every method is prepared on a Case (one workload in one dtype: packed Q, K, V built once; V and the
output with head_dim_v columns where the workload has a value head size of its own) for one mask,
returns a Prepared (a zero-argument `run` that is timed, and how to read the rows of a sequence
back from its output for the check), and is checked against the reference before it is timed. A
method whose import or preparation fails raises Unavailable / Skipped / any exception; the driver
records the reason and goes on. measure() prepares, checks and times a method on a side stream of
its own (a CUDA graph cannot be captured on the legacy default stream): the kernel time, and with
opts also the eager call and the CUDA-graph replay (bench/call_overhead.py's timing).
"""
import contextlib
import math
import os
import platform
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import call_overhead as co  # noqa: E402
import workloads as W  # noqa: E402
from peers import FA3_CLASS_LABEL, FA3_LABEL, fa3_head_dim_reason, padded_skip_reason  # noqa: E402

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}
DATA_SEED = 0


class Unavailable(Exception):
    """The peer cannot run here (not installed, fails to import, no such backend)."""


class Skipped(Exception):
    """The peer could run, but this case is left out on purpose (the reason says why)."""


def short(e, limit=300):
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dist_version(name):
    """The installed version of a distribution, or '?' (e.g. unpacked without metadata)."""
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "?"


# ---- environment ------------------------------------------------------------------------------

def environment():
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_runtime": torch.version.cuda, "platform": platform.platform()}
    try:
        env["cudnn"] = torch.backends.cudnn.version()
    except Exception as e:  # pragma: no cover - informational only
        env["cudnn"] = short(e)
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as e:
        env["triton"] = f"unavailable: {short(e)}"
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["gpu"] = props.name
        env["gpu_sms"] = props.multi_processor_count
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_capability"] = f"{props.major}.{props.minor}"
    except Exception as e:
        env["gpu"] = f"unknown: {short(e)}"
    return env


# ---- inputs and reference ----------------------------------------------------------------------

class Case:
    """One workload in one dtype on the GPU: packed q, k [total, heads, head_dim], v [total_k,
    heads_kv, head_dim_v] and offsets (Dv: head_dim_v, the columns of v and the output)."""

    def __init__(self, workload, dtype_name, device="cuda", seed=DATA_SEED):
        self.w = workload
        self.dtype_name = dtype_name
        self.dtype = TORCH_DTYPES[dtype_name]
        self.device = torch.device(device)
        s = workload.spec
        self.H, self.Hkv, self.D = s.heads, s.heads_kv, s.head_dim
        self.Dv = s.value_dim
        self.lq, self.lk = list(workload.lengths_q), list(workload.lengths_k)
        self.B = len(self.lq)
        self.cu_q_host = [0]
        for L in self.lq:
            self.cu_q_host.append(self.cu_q_host[-1] + L)
        self.cu_k_host = [0]
        for L in self.lk:
            self.cu_k_host.append(self.cu_k_host[-1] + L)
        self.total_q, self.total_k = self.cu_q_host[-1], self.cu_k_host[-1]
        self.max_q, self.max_k = max(self.lq), max(self.lk)
        self.cross = self.lq != self.lk
        self.cu_q = torch.tensor(self.cu_q_host, dtype=torch.int32, device=self.device)
        self.cu_k = (torch.tensor(self.cu_k_host, dtype=torch.int32, device=self.device)
                     if self.cross else self.cu_q)
        self.scale = 1.0 / math.sqrt(self.D)
        torch.manual_seed(seed)
        torch.cuda.manual_seed(seed)
        self.q = torch.randn(self.total_q, self.H, self.D, device=self.device, dtype=self.dtype)
        self.k = torch.randn(self.total_k, self.Hkv, self.D, device=self.device, dtype=self.dtype)
        self.v = torch.randn(self.total_k, self.Hkv, self.Dv, device=self.device, dtype=self.dtype)
        self.sample = W.check_sample(self.lq, self.lk)
        self._padded = None
        self._rows = {}
        self._refs = {}

    def q_rows(self, t, i):
        return t[self.cu_q_host[i]:self.cu_q_host[i + 1]]

    # Padded [B, H, Lmax, D] copies, zeros past each sequence's end (built once, shared).
    def padded(self):
        if self._padded is None:
            self._padded = (self.pad(self.q, "q"), self.pad(self.k, "k"), self.pad(self.v, "k"))
        return self._padded

    def _padded_rows(self, side):
        """(sequence, position) of every packed row of side "q" or "k" (built once)."""
        if side not in self._rows:
            lengths, cu = (self.lq, self.cu_q) if side == "q" else (self.lk, self.cu_k)
            total = sum(lengths)
            lens = torch.tensor(lengths, dtype=torch.int64, device=self.device)
            seq = torch.repeat_interleave(torch.arange(len(lengths), device=self.device), lens,
                                          output_size=total)
            pos = torch.arange(total, device=self.device) - cu.to(torch.int64)[seq]
            self._rows[side] = (seq, pos)
        return self._rows[side]

    def pad(self, x, side="q"):
        """Packed [total, heads, D] rows of side "q" or "k" as [B, heads, Lmax, D], zeros past
        each sequence's end."""
        lengths = self.lq if side == "q" else self.lk
        seq, pos = self._padded_rows(side)
        out = torch.zeros(len(lengths), max(lengths), x.shape[1], x.shape[2], device=self.device,
                          dtype=x.dtype)
        out[seq, pos] = x
        return out.transpose(1, 2).contiguous()

    def unpad(self, x, side="q"):
        """The real rows of a padded [B, heads, Lmax, D] tensor of side "q" or "k", packed as
        [total, heads, D] (pad's inverse)."""
        seq, pos = self._padded_rows(side)
        return x.transpose(1, 2)[seq, pos]

    def reference(self, causal):
        """{sequence index: float64 [Lq, H, Dv]} on the checked sample."""
        if causal not in self._refs:
            self._refs[causal] = {i: reference_rows(self, i, causal) for i in self.sample}
        return self._refs[causal]

    def release(self):
        self._padded = None
        self._rows = {}
        self._refs = {}
        self.q = self.k = self.v = None


def reference_rows(case, i, causal):
    """softmax(scale q k^T [+ bottom-right causal]) v of sequence i in float64; zeros for a row
    with no visible key (jfa's convention)."""
    a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
    c, d = case.cu_k_host[i], case.cu_k_host[i + 1]
    lq, lk = b - a, d - c
    H, Dv = case.H, case.Dv
    if lq == 0 or lk == 0:
        return torch.zeros(lq, H, Dv, device=case.device, dtype=torch.float64)
    with torch.no_grad():
        qs = case.q[a:b].double().transpose(0, 1)
        ks = case.k[c:d].double().transpose(0, 1)
        vs = case.v[c:d].double().transpose(0, 1)
        rep = H // case.Hkv
        if rep > 1:
            ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        hidden = None
        if causal:
            ii = torch.arange(lq, device=case.device)[:, None]
            jj = torch.arange(lk, device=case.device)[None, :]
            hidden = jj > ii + (lk - lq)
        out = torch.empty(H, lq, Dv, device=case.device, dtype=torch.float64)
        chunk = max(1, min(H, (1 << 28) // max(1, lq * lk)))  # <= 2 GiB of scores at a time
        for h0 in range(0, H, chunk):
            h1 = min(H, h0 + chunk)
            s = torch.matmul(qs[h0:h1], ks[h0:h1].transpose(1, 2)).mul_(case.scale)
            if hidden is not None:
                s.masked_fill_(hidden, float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num_(0.0)
            del s
            out[h0:h1] = torch.matmul(p, vs[h0:h1])
            del p
        return out.transpose(0, 1).contiguous()


def rel_error(case, causal, rows_fn, out):
    ref = case.reference(causal)
    num = torch.zeros((), dtype=torch.float64, device=case.device)
    den = torch.zeros((), dtype=torch.float64, device=case.device)
    for i, r in ref.items():
        o = rows_fn(out, i).double()
        num += (o - r).pow(2).sum()
        den += r.pow(2).sum()
    num, den = num.item(), den.item()
    if not math.isfinite(num):
        return float("nan")
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else float("inf"))


# ---- timing ----------------------------------------------------------------------------------

def warm_gpu(seconds):
    """Busy the GPU with bf16 matmuls for a while so that clocks are up before the first timing."""
    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    del a, b
    torch.cuda.empty_cache()


class Timing:
    def __init__(self, min_runs=10, max_runs=30, warmup=3, warmup_ms=25.0, target_ms=150.0,
                 spin_cycles=200_000):
        self.min_runs, self.max_runs = min_runs, max_runs
        self.warmup, self.warmup_ms, self.target_ms = warmup, warmup_ms, target_ms
        self.spin_cycles = spin_cycles


def time_ms(fn, t):
    """Median and min of per-call CUDA-event times (ms) and the number of runs. A short spin
    kernel queued before each timed call keeps host launch overhead out of the interval."""
    spin = getattr(torch.cuda, "_sleep", None) if t.spin_cycles else None
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    est = max(s.elapsed_time(e), 1e-3)
    for _ in range(max(t.warmup, min(100, int(t.warmup_ms / est)))):
        fn()
    runs = max(t.min_runs, min(t.max_runs, int(t.target_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    torch.cuda.synchronize()
    for i in range(runs):
        if spin is not None:
            spin(t.spin_cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = [a.elapsed_time(b) for a, b in zip(starts, ends)]
    return statistics.median(times), min(times), runs


# ---- methods ---------------------------------------------------------------------------------

class Prepared:
    """run(): the timed call, returns the output. rows(out, i): [Lq_i, H, Dv] of sequence i, or
    None when the output cannot be checked (note says why). dense(out): a tensor holding every
    real output row (for the finiteness check), or None. label: the method's label for this
    preparation where it depends on what runs (method fa3), else "". no_graph: why the call is
    not captured in a CUDA graph ("" to capture it)."""

    def __init__(self, run, rows=None, note="", dense=None, context=None, provider="", label="",
                 no_graph=""):
        self.run = run
        self.rows = rows
        self.note = note
        self.dense = dense
        self.context = context or contextlib.nullcontext
        self.provider = provider
        self.label = label
        self.no_graph = no_graph


class Method:
    name = ""
    label = ""

    def __init__(self, ctx):
        self.ctx = ctx  # shared settings: jfa library, flex options, ...

    def current_label(self):
        """The label of this method's records (method fa3: what it runs as, known once FA3 is
        loaded)."""
        return self.label

    def prepare(self, case, causal):  # pragma: no cover - interface
        raise NotImplementedError


def _packed_rows(case):
    return lambda out, i: case.q_rows(out, i)


class Jfa(Method):
    name, label = "jfa", "jfa"

    def prepare(self, case, causal):
        lib = self.ctx.get("jfa_lib")
        if lib is None:
            raise Unavailable(self.ctx.get("jfa_error") or "libjfa.so not loaded")
        out = torch.empty(case.total_q, case.H, case.Dv, device=case.device, dtype=case.dtype)
        p = lib.params(q=case.q.data_ptr(), k=case.k.data_ptr(), v=case.v.data_ptr(),
                       out=out.data_ptr(), cu_seqlens_q=case.cu_q.data_ptr(),
                       cu_seqlens_k=case.cu_k.data_ptr(), batch=case.B, total_q=case.total_q,
                       total_k=case.total_k, heads_q=case.H, heads_kv=case.Hkv, head_dim=case.D,
                       dtype=case.dtype_name, causal=causal, softmax_scale=case.scale,
                       max_seqlen_q=case.max_q, max_seqlen_k=case.max_k, backend="cuda",
                       stream=torch.cuda.current_stream().cuda_stream)
        if case.Dv != case.D:
            p.head_dim_v = case.Dv
        # A kept workspace, as the torch op takes one from the caching allocator.
        workspace = torch.empty(lib.workspace_size(p), dtype=torch.uint8, device=case.device)
        p.workspace, p.workspace_bytes = workspace.data_ptr(), workspace.numel()
        fwd = lib.forward_fn(p)
        fwd.workspace = workspace
        out.fill_(float("nan"))  # rows the kernel never writes fail the check

        def run():
            fwd()
            return out

        return Prepared(run, _packed_rows(case), dense=lambda o: o,
                        provider=f"libjfa {lib.version()} ({os.path.basename(lib.path)})")


class TritonJfa(Method):
    name, label = "triton_jfa", "plain Triton JFA"

    def prepare(self, case, causal):
        try:
            import triton_jfa
        except Exception as e:
            raise Unavailable(f"cannot import bench/triton_jfa.py: {short(e)}")
        if case.Dv != case.D:
            raise Unavailable("takes one head size for q, k and v (head_dim_v differs here)")
        out = torch.empty_like(case.q)
        out.fill_(float("nan"))
        cfg = triton_jfa.config_for(case.D, causal)

        def run():
            return triton_jfa.attention(case.q, case.k, case.v, case.cu_q, case.cu_k, case.max_q,
                                        causal=causal, softmax_scale=case.scale, out=out)

        return Prepared(run, _packed_rows(case), dense=lambda o: o,
                        note="BLOCK_M,BLOCK_N,warps,stages=%s" % (cfg,))


class Fa2Varlen(Method):
    name, label = "fa2_varlen", "varlen FA2"

    def prepare(self, case, causal):
        op = getattr(torch.ops.aten, "_flash_attention_forward", None)
        if op is None:
            raise Unavailable("torch.ops.aten._flash_attention_forward is missing")
        if case.Dv != case.D:
            raise Unavailable("FlashAttention-2 takes one head size for q, k and v (head_dim_v "
                              "differs here)")
        q, k, v, cu_q, cu_k, mq, mk = case.q, case.k, case.v, case.cu_q, case.cu_k, case.max_q, case.max_k

        def run_scale():
            return op(q, k, v, cu_q, cu_k, mq, mk, 0.0, causal, False, scale=case.scale)[0]

        def run_default():  # the default scale is 1/sqrt(head_dim), the one used here
            return op(q, k, v, cu_q, cu_k, mq, mk, 0.0, causal, False)[0]

        run = run_scale
        try:
            run_scale()
        except Exception as e:  # an older signature without scale=: retry with the default
            try:
                run_default()
            except Exception:
                raise e
            run = run_default
        return Prepared(run, _packed_rows(case), dense=lambda o: o,
                        provider="torch.ops.aten._flash_attention_forward")


def sdpa_pinned(backend_name):
    """A context factory that pins F.scaled_dot_product_attention to SDPBackend.<backend_name>;
    Unavailable where this torch lacks sdpa_kernel or that backend."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:
        raise Unavailable(f"torch.nn.attention.sdpa_kernel: {short(e)}")
    backend = getattr(SDPBackend, backend_name, None)
    if backend is None:
        raise Unavailable(f"SDPBackend.{backend_name} does not exist in this torch")
    return lambda: sdpa_kernel(backend)


class _Padded(Method):
    backend_name = ""

    def prepare(self, case, causal):
        context = sdpa_pinned(self.backend_name)
        skip = padded_skip_reason(case.cross, causal)
        if skip:
            raise Skipped(skip)
        pq, pk, pv = case.padded()

        def run():
            return F.scaled_dot_product_attention(pq, pk, pv, is_causal=causal, scale=case.scale)

        note = "kernel time only (padding and unpadding not timed)"
        if case.cross:
            return Prepared(run, None, note="timed, not checked: padding keys are not masked "
                            "(q/k lengths differ); " + note, context=context)
        if not causal:
            return Prepared(run, None, note="timed, not checked: padding keys are not masked; "
                            + note, context=context)

        def rows(out, i):  # causal, padded at the end: the real rows see real keys only
            return out[i, :, :case.lq[i], :].transpose(0, 1)

        return Prepared(run, rows, note=note, context=context)


class Fa2Padded(_Padded):
    name, label, backend_name = "fa2_padded", "padded FA2", "FLASH_ATTENTION"

    def prepare(self, case, causal):
        if case.Dv != case.D:
            raise Unavailable("FlashAttention-2 takes one head size for q, k and v (head_dim_v "
                              "differs here)")
        return super().prepare(case, causal)


class CudnnPadded(_Padded):
    name, label, backend_name = "cudnn_padded", "padded cuDNN", "CUDNN_ATTENTION"


class CudnnRagged(Method):
    """cuDNN's native ragged SDPA forward on the packed tensors (bench/cudnn_ragged.py, through the
    cudnn-frontend package); the graph is built in prepare, not timed."""
    name, label = "cudnn_ragged", "cuDNN ragged"

    def prepare(self, case, causal):
        import cudnn_ragged
        try:
            sdpa, provider = cudnn_ragged.prepared(case, causal)
        except cudnn_ragged.Unsupported as e:
            raise Unavailable(str(e)) from None
        return Prepared(sdpa.forward, _packed_rows(case), dense=lambda o: o, provider=provider)


class NestedSdpa(Method):
    name, label = "nested_sdpa", "nested SDPA"

    def prepare(self, case, causal):
        nt = getattr(getattr(torch, "nested", None), "nested_tensor_from_jagged", None)
        if nt is None:
            raise Unavailable("torch.nested.nested_tensor_from_jagged is missing")
        off_q = case.cu_q.to(torch.int64)
        off_k = case.cu_k.to(torch.int64) if case.cross else off_q

        def make(x, off, lengths):
            try:
                return nt(x, off, min_seqlen=min(lengths), max_seqlen=max(lengths))
            except TypeError:
                return nt(x, off)

        qn = make(case.q, off_q, case.lq).transpose(1, 2)   # [B, H, j, D]
        kn = make(case.k, off_k, case.lk).transpose(1, 2)
        vn = make(case.v, off_k, case.lk).transpose(1, 2)

        def run():
            return F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal, scale=case.scale)

        def dense(out):
            o = out.transpose(1, 2)  # [B, j, H, D]
            vals = None
            try:
                vals = o.values()
            except Exception:
                vals = None
            if vals is None or tuple(vals.shape) != (case.total_q, case.H, case.Dv):
                vals = torch.cat(list(o.unbind()), 0)
            return vals

        return Prepared(run, lambda out, i: case.q_rows(dense(out), i), dense=dense,
                        note="torch.nested jagged layout + F.scaled_dot_product_attention")


_FLEX = {}


def _raise_dynamo_limits():
    try:
        import torch._dynamo as dynamo
        for name, value in (("cache_size_limit", 4096), ("recompile_limit", 4096),
                            ("accumulated_cache_size_limit", 1 << 16),
                            ("accumulated_recompile_limit", 1 << 16)):
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, value)
    except Exception:
        pass


def flex_functions(ctx):
    """(torch.compile(flex_attention), torch.compile(create_block_mask), create_block_mask),
    made once per process (ctx["flex_dynamic"]: the compile's dynamic=); Unavailable where this
    torch has no FlexAttention."""
    if "fns" not in _FLEX:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception as e:
            _FLEX["fns"] = e
        else:
            _raise_dynamo_limits()
            dynamic = ctx.get("flex_dynamic", None)
            _FLEX["fns"] = (torch.compile(flex_attention, dynamic=dynamic),
                            torch.compile(create_block_mask), create_block_mask)
    if isinstance(_FLEX["fns"], Exception):
        raise Unavailable(f"torch.nn.attention.flex_attention: {short(_FLEX['fns'])}")
    return _FLEX["fns"]


def flex_layout(x):
    """Packed [total, heads, D] as FlexAttention's [1, heads, total, D] (a copy)."""
    return x.transpose(0, 1).unsqueeze(0).contiguous()


def flex_packed(x):
    """FlexAttention's [1, heads, total, D] as packed [total, heads, D] (a view)."""
    return x[0].transpose(0, 1)


def flex_kwargs(case, block_mask):
    """flex_attention's keyword arguments for a case: its block mask and scale, and
    enable_gqa=True where K/V have fewer heads."""
    kwargs = {"block_mask": block_mask, "scale": case.scale}
    if case.H != case.Hkv:
        kwargs["enable_gqa"] = True
    return kwargs


def flex_block_mask(case, causal, cbm_compiled, cbm_eager):
    """(block mask, how it was built, seconds): the document mask over the packed sequence, with
    the bottom-right causal mask of each sequence where causal."""
    dev = case.device
    lq = torch.tensor(case.lq, dtype=torch.int64, device=dev)
    lk = torch.tensor(case.lk, dtype=torch.int64, device=dev)
    ids = torch.arange(case.B, dtype=torch.int32, device=dev)
    doc_q = torch.repeat_interleave(ids, lq, output_size=case.total_q)
    doc_k = torch.repeat_interleave(ids, lk, output_size=case.total_k) if case.cross else doc_q
    # Bottom-right causal in packed coordinates: key kv of sequence b is visible to query q
    # iff kv - k_end[b] <= q - q_end[b], i.e. kv <= q + (k_end[b] - q_end[b]).
    shift = (case.cu_k[1:].to(torch.int32) - case.cu_q[1:].to(torch.int32)).contiguous()

    if not causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return doc_q[q_idx] == doc_k[kv_idx]
    elif not case.cross:
        def mask_mod(b, h, q_idx, kv_idx):
            return (doc_q[q_idx] == doc_k[kv_idx]) & (q_idx >= kv_idx)
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            d = doc_q[q_idx]
            return (d == doc_k[kv_idx]) & (kv_idx <= q_idx + shift[d])

    t0 = time.perf_counter()
    try:
        bm = cbm_compiled(mask_mod, None, None, case.total_q, case.total_k, device=str(dev))
        how = "torch.compile(create_block_mask)"
    except Exception as e:
        if case.total_q * case.total_k > (1 << 31):
            raise Skipped("compiled create_block_mask failed (%s) and the eager one would "
                          "materialize a %d x %d mask" % (short(e, 150), case.total_q,
                                                          case.total_k))
        bm = cbm_eager(mask_mod, None, None, case.total_q, case.total_k, device=str(dev))
        how = "eager create_block_mask (compiled one failed: %s)" % short(e, 120)
    torch.cuda.synchronize()
    return bm, how, time.perf_counter() - t0


class Flex(Method):
    name, label = "flex", "FlexAttention"

    def prepare(self, case, causal):
        flex, cbm_compiled, cbm_eager = flex_functions(self.ctx)
        bm, how, mask_s = flex_block_mask(case, causal, cbm_compiled, cbm_eager)
        q4, k4, v4 = flex_layout(case.q), flex_layout(case.k), flex_layout(case.v)
        kwargs = flex_kwargs(case, bm)

        def run():
            return flex(q4, k4, v4, **kwargs)

        def rows(out, i):
            a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
            return out[0, :, a:b, :].transpose(0, 1)

        return Prepared(run, rows, dense=lambda o: o,
                        note="document mask over the packed sequence, %s %.1f s, "
                             "torch.compile(flex_attention)" % (how, mask_s))


def load_fa3(ctx, lib_path):
    """FlashAttention-3 for method fa3, into ctx: with lib_path, its op library (call_overhead's
    load_fa3: fa3_op, fa3_arguments and fa3_provider, else fa3_error) and the op's schema under
    ctx["schemas"]; without, FA3's own Python wrapper flash_attn_interface when it imports
    (fa3_interface, else fa3_interface_error)."""
    ctx["fa3_lib"] = lib_path
    if lib_path:
        co.load_fa3(ctx, lib_path)
        if ctx.get("fa3_op") is not None:
            try:
                ctx.setdefault("schemas", {})["flash_attn_3.fwd"] = str(
                    ctx["fa3_op"].default._schema)
            except Exception:
                pass
        return
    try:
        import flash_attn_interface
    except Exception as e:
        ctx["fa3_interface_error"] = short(e, 200)
    else:
        ctx["fa3_interface"] = flash_attn_interface


def fa3_available(ctx):
    """Whether method fa3 runs FlashAttention-3 itself (load_fa3 found its op or its wrapper)."""
    return ctx.get("fa3_op") is not None or ctx.get("fa3_interface") is not None


def _fa3_check_head_dims(case):
    reason = fa3_head_dim_reason(case.D, case.Dv)
    if reason:
        raise Unavailable(reason)


class Fa3(Method):
    """FlashAttention-3's varlen forward: the op of --fa3-lib's library (torch.ops.flash_attn_3.fwd,
    the call built from its schema), else flash_attn_interface.flash_attn_varlen_func; without
    either (and no --fa3-lib), an FA3-class fallback labelled as such: flash-attn-4's SM90 forward
    or flashinfer's fa3 backend."""
    name, label = "fa3", FA3_CLASS_LABEL

    def current_label(self):
        """FlashAttention-3's label where its library was asked for or its wrapper imports (so
        that a cell it has no kernel for is in its row), else FA3-class."""
        real = self.ctx.get("fa3_lib") or self.ctx.get("fa3_interface") is not None
        return FA3_LABEL if real else FA3_CLASS_LABEL

    def prepare(self, case, causal):
        ctx = self.ctx
        if ctx.get("fa3_lib"):  # asked for FlashAttention-3's library: that or nothing
            op = ctx.get("fa3_op")
            if op is None:
                raise Unavailable(ctx.get("fa3_error") or "torch.ops.flash_attn_3.fwd is missing")
            _fa3_check_head_dims(case)
            values = {"q": case.q, "k": case.k, "v": case.v, "cu_seqlens_q": case.cu_q,
                      "cu_seqlens_k": case.cu_k, "max_seqlen_q": case.max_q,
                      "max_seqlen_k": case.max_k, "softmax_scale": case.scale,
                      "is_causal": bool(causal)}
            try:
                args, kwargs = co.fa3_call(ctx["fa3_arguments"], values)
            except ValueError as e:
                raise Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")

            def run():
                return op(*args, **kwargs)[0]

            return Prepared(run, _packed_rows(case), dense=lambda o: o, label=FA3_LABEL,
                            provider=ctx.get("fa3_provider", "torch.ops.flash_attn_3.fwd"))
        errors = []
        fa3 = ctx.get("fa3_interface")
        if fa3 is None and "fa3_interface_error" not in ctx:
            try:
                import flash_attn_interface as fa3
            except Exception as e:
                ctx["fa3_interface_error"] = short(e, 200)
        if fa3 is not None:
            _fa3_check_head_dims(case)
            fn = fa3.flash_attn_varlen_func

            def run():
                o = fn(case.q, case.k, case.v, case.cu_q, case.cu_k, case.max_q, case.max_k,
                       softmax_scale=case.scale, causal=causal)
                return o[0] if isinstance(o, (tuple, list)) else o

            return Prepared(run, _packed_rows(case), dense=lambda o: o, label=FA3_LABEL,
                            provider="flash_attn_interface.flash_attn_varlen_func (FA3)")
        errors.append(f"flash_attn_interface: {ctx['fa3_interface_error'][:120]}")
        try:  # flash-attn-4 (CuTe DSL); on Hopper it runs its SM90 forward
            from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
        except Exception as e:
            errors.append(f"flash_attn.cute: {short(e, 120)}")
        else:
            def run():
                o = fa4_varlen(case.q, case.k, case.v, cu_seqlens_q=case.cu_q,
                               cu_seqlens_k=case.cu_k, max_seqlen_q=case.max_q,
                               max_seqlen_k=case.max_k, softmax_scale=case.scale, causal=causal)
                return o[0] if isinstance(o, (tuple, list)) else o

            versions = (_dist_version("flash-attn-4"), _dist_version("nvidia-cutlass-dsl"))
            return Prepared(run, _packed_rows(case), dense=lambda o: o, label=FA3_CLASS_LABEL,
                            provider="flash_attn.cute.flash_attn_varlen_func (flash-attn-4 %s, "
                                     "nvidia-cutlass-dsl %s)" % versions)
        try:
            import flashinfer
        except Exception as e:
            errors.append(f"flashinfer: {short(e, 120)}")
            raise Unavailable("FlashAttention-3 and FA3-class peers: " + "; ".join(errors))
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=case.device)
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa3")
        wrapper.plan(case.cu_q, case.cu_k, case.H, case.Hkv, case.D, causal=causal,
                     sm_scale=case.scale, q_data_type=case.dtype, kv_data_type=case.dtype,
                     **({"head_dim_vo": case.Dv} if case.Dv != case.D else {}))

        def run():
            return wrapper.run(case.q, case.k, case.v)

        run.keep = (ws, wrapper)
        return Prepared(run, _packed_rows(case), dense=lambda o: o, label=FA3_CLASS_LABEL,
                        provider="flashinfer BatchPrefillWithRaggedKVCacheWrapper backend=fa3 "
                                 "(%s)" % "; ".join(errors))


METHODS = [Jfa, TritonJfa, Fa3, CudnnRagged, Fa2Varlen, Flex, CudnnPadded, NestedSdpa, Fa2Padded]
METHOD_NAMES = [m.name for m in METHODS]
LABELS = {m.name: m.label for m in METHODS}


# ---- one measurement -------------------------------------------------------------------------

_SIDE = []


def side_stream():
    """The one stream every measurement runs on (made on first use): a CUDA graph is captured on
    the stream a call launches on, and jfa's C entry launches on the stream it was prepared on."""
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream())
    return _SIDE[0]


def measure(method, case, causal, timing, opts=None):
    """A result record for method on case (one mask): checked first, then timed (median_ms); with
    opts ({"runs", "warmup"}) also eager_ms and graph_ms (the replay checked too). Runs on
    side_stream()."""
    w = case.w
    flops = w.flops(causal)
    nbytes = w.bytes(case.dtype_name)
    rec = {"method": method.name, "label": method.current_label(), "workload": w.id,
           "dtype": case.dtype_name, "causal": bool(causal), "head_dim": case.D,
           "head_dim_v": case.Dv, "heads": case.H, "heads_kv": case.Hkv,
           "status": None, "reason": "", "note": "", "provider": "", "median_ms": None,
           "min_ms": None, "runs": 0, "useful_tflops": None, "eff_tbps": None, "rel_error": None,
           "tolerance": TOLERANCE[case.dtype_name], "checked_sequences": len(case.sample),
           "setup_s": None, "useful_gflop": flops / 1e9, "min_bytes": nbytes}
    if opts is not None:
        rec.update(eager_ms=None, graph_ms=None, graph_reason="")
    stream = side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with warnings.catch_warnings(), torch.cuda.stream(stream):
            warnings.simplefilter("ignore")  # SDPA's and torch.compile's chatter; reasons recorded
            return _measure(method, case, causal, timing, rec, flops, nbytes, opts)
    finally:
        co.synchronize_quietly()
        torch.cuda.current_stream().wait_stream(stream)


def check_output(case, causal, prep, out, tolerance):
    """(status, relative error, why wrong or "") of an output against the reference: "unchecked"
    where the method's output cannot be checked."""
    if prep.rows is None:
        return "unchecked", None, ""
    err = rel_error(case, causal, prep.rows, out)
    if prep.dense is not None and not bool(torch.isfinite(prep.dense(out)).all().item()):
        return "wrong", err, "non-finite values in the output"
    if not (err <= tolerance):
        return "wrong", err, f"relative error {err:.3g} > {tolerance:g}"
    return "ok", err, ""


def _measure(method, case, causal, timing, rec, flops, nbytes, opts=None):
    t0 = time.perf_counter()
    prep = None
    try:
        prep = method.prepare(case, causal)
    except Unavailable as e:
        rec.update(status="unavailable", reason=str(e))
        return rec
    except Skipped as e:
        rec.update(status="skipped", reason=str(e))
        return rec
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        rec.update(status="error", reason="out of memory while preparing: " + short(e, 150))
        return rec
    except Exception as e:
        rec.update(status="error", reason="prepare: " + short(e))
        return rec
    rec["note"], rec["provider"] = prep.note, prep.provider
    if prep.label:
        rec["label"] = prep.label
    try:
        with prep.context():
            out = prep.run()
            torch.cuda.synchronize()
            rec["setup_s"] = round(time.perf_counter() - t0, 3)
            status, rec["rel_error"], wrong = check_output(case, causal, prep, out,
                                                           rec["tolerance"])
            # A plain tensor output is filled with NaN before the replay that is checked, so the
            # check sees only what the replay wrote.
            plain = isinstance(out, torch.Tensor) and not getattr(out, "is_nested", False)
            del out
            median, fastest, runs = time_ms(prep.run, timing)
            rec.update(status=status, median_ms=median, min_ms=fastest, runs=runs,
                       useful_tflops=flops / (median * 1e-3) / 1e12,
                       eff_tbps=nbytes / (median * 1e-3) / 1e12)
            if wrong:
                rec["reason"] = wrong
            if opts is not None and status in ("ok", "unchecked"):
                rec.update(co.eager_time(prep.run, opts["runs"], opts["warmup"]))
                if prep.no_graph:
                    rec["graph_reason"] = prep.no_graph
                else:
                    _time_graph(case, causal, prep, rec, opts, plain)
    except torch.cuda.OutOfMemoryError as e:
        rec.update(status="error", reason="out of memory: " + short(e, 150))
    except Exception as e:
        rec.update(status="error", reason=short(e))
    finally:
        prep = None
        co.synchronize_quietly()
        torch.cuda.empty_cache()
    return rec


def _time_graph(case, causal, prep, rec, opts, plain):
    """graph_ms of the call captured in a CUDA graph on the current stream (call_overhead's
    time_replays), its replay checked as the first call was; else graph_reason."""
    if plain:
        def run():
            return (prep.run(),)

        def unwrap(out):
            return out[0]
    else:
        run, unwrap = prep.run, (lambda out: out)

    def check_replay(out):
        if rec["status"] != "ok":
            return ""  # an unchecked method's replay goes unchecked too
        status, rec["graph_rel_error"], why = check_output(case, causal, prep, unwrap(out),
                                                           rec["tolerance"])
        return "" if status == "ok" else f"the replay's output is wrong: {why}"

    co.time_replays(sys.modules[__name__], run, rec, opts, check_replay, nan_outputs=plain,
                    stream=torch.cuda.current_stream())
