"""The shared definitions of bench/local_peers.py and its modules: the kinds (Kind, KINDS),
the methods and their labels (jfa's baselines without a modifier among them: BASELINES), the
seeds and FLOP factors of the passes, and what every pass builds a cell from (cell_methods,
method_run, cell_sinks, local_fields, fa3_values). No torch needed to import it."""

from collections import namedtuple

import backward_peers as bp
import peers

# causal, window (left, right) (-1: unbounded), softcap (0: off), sinks (jfa only).
Kind = namedtuple("Kind", "causal left right softcap sinks")
KINDS = {"swa128": Kind(True, 128, 0, 0.0, False), "swa4096": Kind(True, 4096, 0, 0.0, False),
         "swa128nc": Kind(False, 128, 128, 0.0, False),
         "softcap50": Kind(True, -1, 0, 50.0, False),
         "swa_softcap": Kind(True, 4096, 0, 50.0, False), "sinks": Kind(True, -1, 0, 0.0, True),
         "swa_sinks": Kind(True, 128, 0, 0.0, True)}
METHODS = {"jfa": "jfa", "fa3": peers.FA3_LABEL, "jfa_nosinks": "jfa without sinks",
           "jfa_nosoftcap": "jfa without softcap", "fa2": "varlen FA2 (aten)",
           "flex": "FlexAttention"}
# jfa's baselines: jfa on a kind's cell without one of its modifiers (the Kind fields given; the
# rest as the kind has them), timed on every kind that has it, so that jfa ÷ baseline is what the
# modifier costs jfa. FA3 has no sinks: jfa_nosinks is the sinks kinds' peer too.
BASELINES = {"jfa_nosinks": {"sinks": False}, "jfa_nosoftcap": {"softcap": 0.0}}
# FlexAttention on the sinks kinds: its output corrected by the LSE (flex_sink_correction).
FLEX_SINKS_LABEL = "FlexAttention + LSE sink correction"
# The methods that take a kind's sinks where the kind as they run it has them (method_run): FA3
# has none, jfa_nosinks drops them.
SINK_METHODS = ("jfa", "jfa_nosoftcap", "flex")
# FA3's keywords: peers' (scale, mask) and the local-attention arguments.
FA3_LOCAL_KEYWORDS = {"window_size_left": ("window_size_left",),
                      "window_size_right": ("window_size_right",), "softcap": ("softcap",)}
SINKS_SEED = 1
# Useful FLOPs of a pass, in forwards: backward_peers' 2.5 for the backward (five matmuls of the
# forward's size where the forward does two).
FLOP_FACTOR = {"forward": 1.0, "backward": bp.FLOP_FACTOR["backward"]}


def peer_of(kind_name):
    """The method jfa is compared with: FA3, or jfa without sinks where the kind has sinks."""
    return "jfa_nosinks" if KINDS[kind_name].sinks else "fa3"


def baselines_of(kind_name):
    """jfa's baselines of a kind (BASELINES' order): one per modifier the kind has."""
    kind = KINDS[kind_name]
    return [m for m, off in BASELINES.items()
            if any(getattr(kind, field) != value for field, value in off.items())]


def cell_methods(kind_name, available=None):
    """The methods of a kind's cells, in measuring order: jfa, its peer (peer_of), its other
    baselines (baselines_of), varlen FA2 (its records say why where the kind has softcap or
    sinks, which it lacks), FlexAttention; those of `available` (the run's methods: --peers and
    the baselines) alone where given."""
    peer = peer_of(kind_name)
    methods = (["jfa", peer] + [m for m in baselines_of(kind_name) if m != peer]
               + ["fa2", "flex"])
    return [m for m in methods if available is None or m in available]


def method_run(kind, sinks, method):
    """(kind, sinks) as a method runs a cell of a kind with these sinks (None: without): a
    baseline's kind without its modifier (BASELINES), the sinks for SINK_METHODS alone where
    that kind has them. Its reference, fields and record follow from them."""
    run = kind._replace(**BASELINES.get(method, {}))
    return run, (sinks if run.sinks and method in SINK_METHODS else None)


def method_label(name, sinks=None):
    """The label of a method's records: FlexAttention with sinks is the LSE-corrected variant."""
    return FLEX_SINKS_LABEL if name == "flex" and sinks is not None else METHODS[name]


def local_fields(kind, sinks=None):
    """LocalLibrary.fields of a kind: its window and softcap, and sinks (a tensor, or None)."""
    return {"window_left": kind.left, "window_right": kind.right, "softcap": kind.softcap,
            "sinks": None if sinks is None else sinks.data_ptr()}


def cell_sinks(torch, kind, heads, device):
    """The sinks of a kind's cells: float32 [heads] ~ N(0, 1) from SINKS_SEED on device; None
    for a kind without."""
    if not kind.sinks:
        return None
    gen = torch.Generator(device="cpu").manual_seed(SINKS_SEED)
    return torch.randn(heads, generator=gen, dtype=torch.float32).to(device)


def fa3_values(case, kind):
    """FA3's forward arguments by name for a kind's cell: the varlen batch, the scale, the mask,
    the window and the softcap (the backward takes them under the same names)."""
    return {"q": case.q, "k": case.k, "v": case.v, "cu_seqlens_q": case.cu_q,
            "cu_seqlens_k": case.cu_k, "max_seqlen_q": case.max_q, "max_seqlen_k": case.max_k,
            "softmax_scale": case.scale, "is_causal": bool(kind.causal),
            "window_size_left": kind.left, "window_size_right": kind.right,
            "softcap": float(kind.softcap)}
