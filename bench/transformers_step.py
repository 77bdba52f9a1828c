#!/usr/bin/env python3
"""A training step of a transformers model on a packed batch: attn_implementation="jfa" against
the model's other ways to see the same sequences.

Models (--model): Llama, Qwen2, Gemma 2 (softcap 50, a sliding window of 4096 keys on every other
layer) and GPT-OSS (attention sinks, a sliding window of 128 keys on every other layer), random
weights.
Llama, Qwen2 and Gemma 2: hidden 2048, 16 query heads of 128 on 8 key/value heads, MLP 5632.
GPT-OSS: hidden 2048, 32 query heads of 64 on 8 key/value heads, 2 experts of 2816 that both take
every token (the others' MLP FLOPs; with fewer experts per token than experts, bf16 rounding alone
would route some tokens apart between methods). --tiny: small ones of each (windows of 16 keys),
for a smoke run on the CPU.

Methods (each checked first: its logits on the batch against the reference's, the model run on
each sequence alone with transformers' sdpa, or eager where sdpa does not compute the model's
attention: Gemma 2's softcap, GPT-OSS's sinks):
- jfa: one packed row, position_ids restarting at each sequence (jfa.integrations.transformers).
- flash_attention_2: the same packed row, where flash-attn is installed.
- flash_attention_3: the same packed row through transformers' own
  attn_implementation="flash_attention_3" (FlashAttention-3's varlen forward and backward; the
  sliding window and softcap are passed on to it), where FA3's Python wrapper
  flash_attn_interface imports: --fa3-python DIR (default $FA3_PYTHON, else .peers/python of this
  checkout where it exists) is put first on sys.path for it, and --fa3-lib names the op library
  it loads (loaded here first, with the CUDA runtime of torch's wheels where the loader does not
  find it): by default $FA3_LIB, else .peers/fa3_varlen.so of this checkout where it exists (its
  forward has neither windows nor softcap), but for a model with either $FA3_FULL_LIB, else
  .peers/fa3_full_bf16.so (FA3's bf16 build with both) where it exists first. Where Gemma 2 gets
  a build without them its first step fails, and the record says which library to pass. Skipped,
  with the reason, on the CPU, in fp32, or where the wrapper does not import.
  FlashAttention-2 and -3 take no attention sinks: with GPT-OSS both are skipped and say so.
- sdpa_padded: the sequences as a right-padded batch with its attention mask.
- sdpa_per_sequence: one forward and backward per sequence (gradients accumulate).
- eager_padded, eager_per_sequence: the same with transformers' eager attention; they stand in
  for the sdpa ones where the model cannot use sdpa (Gemma 2, GPT-OSS), and their records say
  which method they replace and what the check compared against.
A method whose first step fails is recorded as an error with the reason, and the run goes on.

A step is forward, a cross-entropy loss over every real token, backward and an SGD update;
timed with CUDA events (or the wall clock on the CPU), warm-up steps first, the median of
--steps. Peak memory: torch.cuda.max_memory_allocated over the timed steps. Tokens per second
count the real tokens only.

usage: python3 bench/transformers_step.py [--lengths 1500,700,3000 | --workload W2 --cli
           build/tools/jfa] [--model llama|qwen2|gemma2|gpt_oss] [--layers 4] [--dtype bf16]
           [--methods jfa,sdpa_padded,...] [--steps 10] [--warmup 3] [--json out.json]
           [--fa3-python DIR] [--fa3-lib fa3_varlen.so|fa3_full_bf16.so]
           [--tiny] (a small model on the CPU, for a smoke run)
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

METHODS = ("jfa", "flash_attention_2", "flash_attention_3", "sdpa_padded", "sdpa_per_sequence")
# In place of the sdpa methods where the model cannot use sdpa (or named by --methods).
EAGER_METHODS = ("eager_padded", "eager_per_sequence")
# The methods that attend over one packed row with position_ids restarting at each sequence.
PACKED = ("jfa", "flash_attention_2", "flash_attention_3")
FLASH = ("flash_attention_2", "flash_attention_3")
MODELS = ("llama", "qwen2", "gemma2", "gpt_oss")
# What a model's attention adds to causal softmax attention: it decides FA3's op library and which
# methods can compute it at all.
LOCAL_FEATURES = {"gemma2": ("sliding window", "softcap"), "gpt_oss": ("sliding window", "sinks")}
# Where FlashAttention-3's Python wrapper and op libraries may lie in a checkout (not tracked).
FA3_PYTHON_IN_CHECKOUT = os.path.join(REPO, ".peers", "python")
FA3_LIB_IN_CHECKOUT = os.path.join(REPO, ".peers", "fa3_varlen.so")
FA3_FULL_LIB_IN_CHECKOUT = os.path.join(REPO, ".peers", "fa3_full_bf16.so")  # windows, softcap


def default_fa3_python():
    """$FA3_PYTHON, else .peers/python of this checkout where it exists, else None."""
    if os.environ.get("FA3_PYTHON"):
        return os.environ["FA3_PYTHON"]
    return FA3_PYTHON_IN_CHECKOUT if os.path.isdir(FA3_PYTHON_IN_CHECKOUT) else None


def needs_windows_or_softcap(model):
    return any(f in LOCAL_FEATURES.get(model, ()) for f in ("sliding window", "softcap"))


def default_fa3_lib(model="llama"):
    """FA3's op library for `model`: where its attention has a sliding window or softcap,
    $FA3_FULL_LIB, else .peers/fa3_full_bf16.so of this checkout where it exists (the varlen
    build's forward has neither); otherwise $FA3_LIB, else .peers/fa3_varlen.so where it exists,
    else None."""
    if needs_windows_or_softcap(model):
        if os.environ.get("FA3_FULL_LIB"):  # as scripts/gpu-check.sh names it
            return os.environ["FA3_FULL_LIB"]
        if os.path.isfile(FA3_FULL_LIB_IN_CHECKOUT):
            return FA3_FULL_LIB_IN_CHECKOUT
    if os.environ.get("FA3_LIB"):
        return os.environ["FA3_LIB"]
    return FA3_LIB_IN_CHECKOUT if os.path.isfile(FA3_LIB_IN_CHECKOUT) else None


def put_first_on_path(directory):
    """directory first on sys.path (once), where FA3's wrapper and its flash_attn_3 package are
    looked for."""
    if directory:
        directory = os.path.abspath(directory)
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)


def fa3_import_reason(fa3_python=None):
    """Why flash_attn_interface (FlashAttention-3's Python wrapper, which transformers'
    flash_attention_3 calls) does not import ("" where it does)."""
    import importlib
    where = ""
    if fa3_python:
        put_first_on_path(fa3_python)
        if not os.path.isdir(fa3_python):
            where = f"; --fa3-python {fa3_python} is not a directory"
    importlib.invalidate_caches()
    try:
        importlib.import_module("flash_attn_interface")
    except Exception as e:
        text = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        return (f"FlashAttention-3's Python wrapper flash_attn_interface does not import ({text})"
                f"{where}; pass --fa3-python DIR (the folder holding flash_attn_interface.py) or "
                "set FA3_PYTHON")
    return ""


def fa3_skip_reason(device, dtype, fa3_python=None, transformers=None):
    """Why method flash_attention_3 is skipped ("" where it runs): it needs a CUDA GPU, fp16 or
    bf16, FlashAttention-3's wrapper, and a transformers that sees FlashAttention-3."""
    if device != "cuda":
        return "flash_attention_3 needs a CUDA GPU (this run is on the CPU)"
    if dtype not in ("fp16", "bf16"):
        return f"FlashAttention-3 takes fp16 and bf16 only (--dtype {dtype})"
    reason = fa3_import_reason(fa3_python)
    if reason:
        return reason
    check = getattr(getattr(transformers, "utils", None), "is_flash_attn_3_available", None)
    if check is not None:
        if hasattr(check, "cache_clear"):
            check.cache_clear()  # it may have looked before --fa3-python was on sys.path
        if not check():
            return ("transformers does not see FlashAttention-3 (transformers.utils."
                    "is_flash_attn_3_available() is False: it looks for the flash_attn_3 package "
                    "next to flash_attn_interface)")
    return ""


def load_fa3_library(lib_path):
    """Loads FA3's op library (FA3_LIB, which its flash_attn_3 package loads too) before the
    wrapper is imported, with the CUDA runtime of torch's wheels where the loader does not find
    it; the error, or ""."""
    if not lib_path:
        return ""
    import call_overhead as co
    os.environ["FA3_LIB"] = os.path.abspath(lib_path)
    ctx = {}
    if co.load_fa3_library(ctx, os.environ["FA3_LIB"]):
        return ""
    return ctx.get("fa3_error", "cannot load FA3's op library")


def sinks_skip_reason(method, model):
    """Why `method` cannot compute `model`'s attention for want of sinks ("" where it can)."""
    if method in FLASH and "sinks" in LOCAL_FEATURES.get(model, ()):
        return (f"FlashAttention-{method[-1]} takes no attention sinks, which {model}'s attention "
                f"has (transformers' {method} would swap in the Hub kernel "
                "kernels-community/vllm-flash-attn3)")
    return ""


def fa3_lib_hint(model, lib_path):
    """What an FA3 failure on a model with windows or softcap may mean: a build without them
    ("" for the other models, and for a "full" build, as FA3's flash_attn_config.py tells them
    apart)."""
    name = os.path.basename(lib_path) if lib_path else "the wrapper's own"
    if not needs_windows_or_softcap(model) or "full" in name:
        return ""
    return (f"; {model} needs FA3 built with sliding windows and softcap, which {name} may "
            "lack (--fa3-lib .peers/fa3_full_bf16.so: bf16 only)")


def model_config(transformers, name, layers, tiny):
    """A Llama-, Qwen2-, Gemma-2- or GPT-OSS-shaped config at bench size, or a tiny one with
    --tiny (the module's docstring gives the shapes)."""
    if tiny:
        size = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)
        window = 16  # shorter than the smoke runs' sequences
    else:
        size = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                    num_attention_heads=16, num_key_value_heads=8, head_dim=128)
        window = {"gemma2": 4096, "gpt_oss": 128}.get(name)  # each model's own
    common = dict(num_hidden_layers=layers, max_position_embeddings=32768, **size)
    if name == "llama":
        return transformers.LlamaConfig(**common)
    if name == "qwen2":
        return transformers.Qwen2Config(**common)
    if name == "gemma2":
        return transformers.Gemma2Config(sliding_window=window, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=None, **common)
    if name == "gpt_oss":
        return transformers.GptOssConfig(**gpt_oss_shape(common, tiny), sliding_window=window,
                                         num_local_experts=2, num_experts_per_tok=2)
    raise ValueError(f"unknown model {name!r}")


def gpt_oss_shape(common, tiny):
    """GPT-OSS's head size of 64 (its 8 K/V heads at bench size) and two experts that both take
    every token, each of half the others' MLP: the same FLOPs, and no routing that bf16 rounding
    could flip between methods."""
    # Its YaRN scaling (32 x 4096 positions) wants this many positions, or transformers warns.
    shape = dict(common, intermediate_size=common["intermediate_size"] // 2,
                 max_position_embeddings=131072)
    if not tiny:
        shape.update(num_attention_heads=32, num_key_value_heads=8, head_dim=64)
    return shape


def dense_attention(transformers, config):
    """The attention of the reference and the padded and per-sequence methods: "sdpa" where it
    computes the model's attention, else "eager": sdpa computes neither a softcap (versions of
    transformers that let Gemma 2 use sdpa drop it) nor sinks (GPT-OSS)."""
    cls = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    modifies_scores = (getattr(config, "attn_logit_softcapping", None)
                       or getattr(config, "model_type", "") == "gpt_oss")
    return "sdpa" if getattr(cls, "_supports_sdpa", False) and not modifies_scores else "eager"


def resolve_methods(methods, attention):
    """[(method, the method it replaces or None)]: with eager attention, each sdpa method becomes
    its eager twin (once)."""
    out, seen = [], set()
    for method in methods:
        replaces = None
        if attention == "eager" and method.startswith("sdpa_"):
            method, replaces = "eager_" + method[len("sdpa_"):], method
        if method not in seen:
            seen.add(method)
            out.append((method, replaces))
    return out


def batch_inputs(torch, lengths, vocab, device, seed):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, vocab, (n,), generator=g).to(device) for n in lengths]
    packed = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    width = max(lengths)
    padded = torch.zeros(len(lengths), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(padded)
    for i, s in enumerate(seqs):
        padded[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return seqs, packed, positions, padded, mask


def step_fn(torch, method, model, inputs):
    """One forward + loss + backward (no update) for `method`; returns the real tokens' logits."""
    seqs, packed, positions, padded, mask = inputs
    ce = torch.nn.functional.cross_entropy
    if method in PACKED:
        logits = model(input_ids=packed, position_ids=positions, use_cache=False).logits[0]
        ce(logits.float(), packed[0]).backward()
        return logits
    if method.endswith("_padded"):
        logits = model(input_ids=padded, attention_mask=mask, use_cache=False).logits
        real = logits[mask.bool()]
        ce(real.float(), padded[mask.bool()]).backward()
        return real
    out = []
    total = sum(len(s) for s in seqs)
    for s in seqs:
        logits = model(input_ids=s[None], use_cache=False).logits[0]
        (ce(logits.float(), s, reduction="sum") / total).backward()
        out.append(logits.detach())
    return torch.cat(out)


def method_attention(method):
    """The attn_implementation a method loads the model with."""
    return method if method in PACKED else method.split("_")[0]


def method_skip_reason(method, args, device, transformers):
    """Why `method` is skipped on this run ("" where it runs); FA3's op library is loaded here."""
    why = sinks_skip_reason(method, args.model)
    if not why and method == "flash_attention_3":
        why = (load_fa3_library(args.fa3_lib) if device == "cuda" else "") or \
            fa3_skip_reason(device, args.dtype, args.fa3_python, transformers)
    return why


def run(args):
    import torch
    import transformers

    import jfa.integrations.transformers  # noqa: F401  registers "jfa"

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if device == "cpu":
        dtype = torch.float32
    lengths = args.lengths
    config = model_config(transformers, args.model, args.layers, args.tiny)
    attention = dense_attention(transformers, config)
    torch.manual_seed(args.seed)
    base = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                         attn_implementation=attention)
    base = base.to(device=device, dtype=dtype)
    state = base.state_dict()
    inputs = batch_inputs(torch, lengths, config.vocab_size, device, args.seed)
    with torch.no_grad():
        reference = torch.cat([base(input_ids=s[None], use_cache=False).logits[0].float()
                               for s in inputs[0]])
    del base
    scale = reference.abs().max().item()
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    records = []
    for method, replaces in resolve_methods(args.methods, attention):
        rec = {"method": method, "model": args.model, "layers": args.layers, "dtype": args.dtype,
               "device": device, "tokens": sum(lengths), "sequences": len(lengths)}
        if attention != "sdpa":  # llama's and qwen2's records keep their fields
            rec["reference"] = f"{attention}_per_sequence"
        if replaces:
            rec["replaces"] = replaces
        records.append(rec)
        if method == "flash_attention_3" and needs_windows_or_softcap(args.model):
            rec["fa3_lib"] = os.path.basename(args.fa3_lib) if args.fa3_lib else None
        why = method_skip_reason(method, args, device, transformers)
        if why:
            rec.update(status="unavailable", reason=why)
            print(f"{method}: skipped: {why}", flush=True)
            continue
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                copy.deepcopy(config), attn_implementation=method_attention(method))
        except (ImportError, ValueError) as e:
            rec.update(status="unavailable", reason=str(e).splitlines()[0])
            continue
        model = model.to(device=device, dtype=dtype)
        model.load_state_dict(state)
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay equal
        hint = fa3_lib_hint(args.model, args.fa3_lib) if method == "flash_attention_3" else ""
        try:
            logits = step_fn(torch, method, model, inputs).detach().float()
        except Exception as e:
            text = f"{type(e).__name__}: {e}".replace("\n", " ")
            rec.update(status="error", reason=f"first step failed: {text[:300]}{hint}")
            print(f"{method}: error: {rec['reason']}", flush=True)
            del model, optimizer
            continue
        err = (logits - reference).abs().max().item() / max(scale, 1e-6)
        rec["max_rel_error"] = err
        if not err <= tol:
            rec.update(status="wrong", reason=f"logits differ by {err:.2e} of the largest{hint}")
            del model, optimizer
            continue
        times = []
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for i in range(args.warmup + args.steps):
            optimizer.zero_grad(set_to_none=True)
            if device == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
            t0 = time.perf_counter()
            step_fn(torch, method, model, inputs)
            optimizer.step()
            if device == "cuda":
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end)
            else:
                ms = (time.perf_counter() - t0) * 1e3
            if i >= args.warmup:
                times.append(ms)
        ms = statistics.median(times)
        rec.update(status="timed", step_ms=ms, tokens_per_s=sum(lengths) / ms * 1e3)
        if device == "cuda":
            rec["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        del model, optimizer
    return records


def table(records):
    lines = ["| method | status | step ms | tokens/s | peak GiB | max rel. error |",
             "|---|---|---|---|---|---|"]
    for r in records:
        def f(key, fmt):
            return fmt.format(r[key]) if key in r else "-"
        lines.append(f"| {r['method']} | {r['status']} | {f('step_ms', '{:.2f}')} | "
                     f"{f('tokens_per_s', '{:.0f}')} | {f('peak_memory_gib', '{:.2f}')} | "
                     f"{f('max_rel_error', '{:.1e}')} |")
    notes = attention_notes(records)
    notes += [f"- {r['method']} ({r['status']}): {r['reason']}" for r in records
              if r.get("reason")]
    if notes:
        lines += [""] + notes
    return "\n".join(lines)


def attention_notes(records):
    """Where eager stood in for sdpa: what the check compared against, which method replaced
    which."""
    refs = sorted({r["reference"] for r in records if "reference" in r})
    notes = [f"- every method checked against {ref}: the model cannot use sdpa" for ref in refs]
    notes += [f"- {r['method']} in place of {r['replaces']}" for r in records
              if r.get("replaces")]
    return notes


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default=None, help="comma-separated sequence lengths")
    ap.add_argument("--workload", default=None, help="W1..W4: lengths from the CLI (--cli)")
    ap.add_argument("--cli", default=None, help="the jfa CLI, for --workload")
    ap.add_argument("--model", default="llama", choices=MODELS)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="comma-separated, of " + ", ".join(METHODS + EAGER_METHODS) + " (the "
                         "sdpa ones turn eager where the model cannot use sdpa)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (smoke run)")
    ap.add_argument("--fa3-python", default=default_fa3_python(),
                    help="a folder put first on sys.path for FlashAttention-3's Python wrapper "
                         "(flash_attn_interface, and the flash_attn_3 package it imports) "
                         "(default: $FA3_PYTHON, else .peers/python of this checkout if it "
                         "exists)")
    ap.add_argument("--fa3-lib", default=None,
                    help="FlashAttention-3's op library, loaded before the wrapper is imported "
                         "and passed to it as FA3_LIB (default: for a model with a sliding "
                         "window or softcap $FA3_FULL_LIB, else .peers/fa3_full_bf16.so of this "
                         "checkout if it exists; otherwise $FA3_LIB, else .peers/fa3_varlen.so "
                         "if it exists; without any the wrapper loads its own)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS + EAGER_METHODS]
    if bad:
        ap.error(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS + EAGER_METHODS)}")
    if args.fa3_lib is None:
        args.fa3_lib = default_fa3_lib(args.model)
    if args.lengths is not None:
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
    elif args.workload is not None:
        import workloads as W
        args.lengths = W.cli_lengths(W.find_cli(args.cli), args.workload)
    else:
        args.lengths = [1500, 700, 3000, 120, 2048]
    if not args.lengths or min(args.lengths) < 1:
        ap.error("--lengths: at least one sequence, every length >= 1")
    if args.steps < 1 or args.warmup < 0 or args.layers < 1:
        ap.error("--steps and --layers must be >= 1, --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if "flash_attention_3" in args.methods:
        put_first_on_path(args.fa3_python)  # before transformers looks for flash_attn_3
    records = run(args)
    print(table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"lengths": args.lengths, "results": records}, f, indent=1)
    return 0 if all(r["status"] in ("timed", "unavailable") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
