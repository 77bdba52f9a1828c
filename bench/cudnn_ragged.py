"""cuDNN's native ragged SDPA (packed tokens addressed by offsets, no padding computed), forward
and backward, through the cudnn-frontend Python package (`import cudnn`, wheel
nvidia-cudnn-frontend) on the cuDNN library that torch ships: a peer of bench/backward_peers.py.

The tensors are jfa's: q, k, v, the output, dO and the gradients packed [tokens, heads, d] by
cu_seqlens. cuDNN sees each as [B, H, S_max, D] with strides (S_max H D, D, H D, 1) and a ragged
offset per sequence (cu_seqlens x H x D elements, int32 [B + 1, 1, 1, 1]), with the padding mask
from the lengths (int32 [B, 1, 1, 1]); the softmax statistics the backward reads are float32
[B, H, S_max_q, 1] (the rows past a sequence's length unused). Causal is bottom-right aligned, as
jfa's (diagonal_alignment BOTTOM_RIGHT, right bound 0). Each graph is built once per shape and
bound to the buffers by address (`execute` takes device pointers).

Only the forward's and the backward's graphs need a GPU; the layout arithmetic (ragged_layout)
is plain Python."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ragged_layout(heads, head_dim, max_len):
    """(dims, strides) of a packed [tokens, heads, head_dim] tensor seen as [B, H, S_max, D]; the
    batch stride is never used (the ragged offsets place each sequence)."""
    return ([None, heads, max_len, head_dim],
            [max_len * heads * head_dim, head_dim, heads * head_dim, 1])


def ragged_offsets(cu_seqlens, heads, head_dim):
    """cuDNN's ragged offsets of a packed tensor: each sequence's first element, int32 [B + 1, 1,
    1, 1] on the offsets' device."""
    import torch
    return (cu_seqlens.to(torch.int64) * heads * head_dim).to(torch.int32).view(-1, 1, 1, 1)


class Unsupported(Exception):
    """The cudnn package does not import here, or cuDNN declines the graph: the peer is
    unavailable for the cell, with the reason."""


def prepared(case, causal):
    """(RaggedSdpa of a benchmark case, its forward run once; the provider's description). case:
    q, k, v, cu_q, cu_k, max_q, max_k and scale as bench/peers_gpu.py's and backward_peers.py's
    cases hold them. Raises Unsupported where the package does not import or cuDNN has no engine
    for the graph, RuntimeError("cuDNN graph: ...") where building or running it fails otherwise."""
    try:
        import cudnn
    except Exception as e:
        raise Unsupported(f"import cudnn (nvidia-cudnn-frontend): {str(e)[:160]}") from None
    try:
        sdpa = RaggedSdpa(case.q, case.k, case.v, case.cu_q, case.cu_k, case.max_q, case.max_k,
                          case.scale, causal)
        sdpa.forward()
    except Exception as e:
        text = " ".join(str(e).split())[:200]
        if "support" in text.lower():
            raise Unsupported(f"cuDNN: {text}") from None
        raise RuntimeError(f"cuDNN graph: {text}") from None
    backend = cudnn.backend_version() if hasattr(cudnn, "backend_version") else "?"
    return sdpa, (f"cudnn-frontend {getattr(cudnn, '__version__', '?')}, cuDNN {backend}, "
                  "ragged SDPA graphs")


class RaggedSdpa:
    """The forward (o, stats) and the backward (dq, dk, dv) of one batch, each a cuDNN graph built
    on the first call. q, k, v: packed [tokens, heads, d] on one CUDA device, fp16 or bf16."""

    def __init__(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        import cudnn
        import torch
        self.cudnn, self.torch = cudnn, torch
        self.q, self.k, self.v = q, k, v
        self.batch = cu_q.numel() - 1
        self.max_q, self.max_k = int(max_q), int(max_k)
        self.scale, self.causal = float(scale), bool(causal)
        self.heads, self.heads_kv = q.shape[1], k.shape[1]
        self.d, self.dv = q.shape[2], v.shape[2]
        self.seq_q = (cu_q[1:] - cu_q[:-1]).to(torch.int32).view(-1, 1, 1, 1).contiguous()
        self.seq_k = (cu_k[1:] - cu_k[:-1]).to(torch.int32).view(-1, 1, 1, 1).contiguous()
        self.offsets = {
            "q": ragged_offsets(cu_q, self.heads, self.d),
            "k": ragged_offsets(cu_k, self.heads_kv, self.d),
            "v": ragged_offsets(cu_k, self.heads_kv, self.dv),
            "o": ragged_offsets(cu_q, self.heads, self.dv),
        }
        self.o = torch.empty(q.shape[0], self.heads, self.dv, dtype=q.dtype, device=q.device)
        self.stats = torch.empty(self.batch, self.heads, self.max_q, 1, dtype=torch.float32,
                                 device=q.device)
        self.dq, self.dk, self.dv_ = (torch.empty_like(q), torch.empty_like(k),
                                      torch.empty_like(v))
        self.handle = cudnn.create_handle()
        self._fwd = self._bwd = None

    def _graph(self):
        cudnn, torch = self.cudnn, self.torch
        io = cudnn.data_type.HALF if self.q.dtype == torch.float16 else cudnn.data_type.BFLOAT16
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        return cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                             compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)

    def _packed(self, g, binds, name, heads, d, max_len, key, output=None):
        """Graph tensor `name` of a packed tensor (or sets up the graph's `output`), its ragged
        offset bound to self.offsets[key] in `binds`."""
        dims, strides = ragged_layout(heads, d, max_len)
        dims[0] = self.batch
        offset = g.tensor_like(self.offsets[key])
        binds[offset] = self.offsets[key]
        if output is None:
            t = g.tensor(name=name, dim=dims, stride=strides)
        else:
            t = output
            t.set_output(True).set_dim(dims).set_stride(strides)
        t.set_ragged_offset(offset)
        return t

    def _masks(self, g, binds):
        """The padding mask's lengths (bound in `binds`) and the causal band's arguments."""
        cudnn = self.cudnn
        seq_q, seq_k = g.tensor_like(self.seq_q), g.tensor_like(self.seq_k)
        binds[seq_q], binds[seq_k] = self.seq_q, self.seq_k
        masks = {"use_padding_mask": True, "seq_len_q": seq_q, "seq_len_kv": seq_k}
        if self.causal:
            masks.update(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
                         diagonal_band_right_bound=0)
        return masks

    def _plan(self, g):
        cudnn = self.cudnn
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return self.torch.empty(max(g.get_workspace_size(), 1), dtype=self.torch.uint8,
                                device=self.q.device)

    def forward(self):
        """o (and the statistics the backward reads) of the batch; returns o."""
        if self._fwd is None:
            g, binds = self._graph(), {}
            q = self._packed(g, binds, "q", self.heads, self.d, self.max_q, "q")
            k = self._packed(g, binds, "k", self.heads_kv, self.d, self.max_k, "k")
            v = self._packed(g, binds, "v", self.heads_kv, self.dv, self.max_k, "v")
            o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True,
                              attn_scale=self.scale, **self._masks(g, binds))
            self._packed(g, binds, "o", self.heads, self.dv, self.max_q, "o", output=o)
            stats.set_output(True).set_data_type(self.cudnn.data_type.FLOAT)
            binds.update({q: self.q, k: self.k, v: self.v, o: self.o, stats: self.stats})
            workspace = self._plan(g)
            self._fwd = (g, {t: buf.data_ptr() for t, buf in binds.items()}, workspace)
        g, pack, workspace = self._fwd
        g.execute(pack, workspace, handle=self.handle)
        return self.o

    def backward(self, dout):
        """dq, dk, dv of the batch for dout (packed as the output), after forward()."""
        if self._bwd is None:
            g, binds = self._graph(), {}
            q = self._packed(g, binds, "q", self.heads, self.d, self.max_q, "q")
            k = self._packed(g, binds, "k", self.heads_kv, self.d, self.max_k, "k")
            v = self._packed(g, binds, "v", self.heads_kv, self.dv, self.max_k, "v")
            o = self._packed(g, binds, "o", self.heads, self.dv, self.max_q, "o")
            do = self._packed(g, binds, "dO", self.heads, self.dv, self.max_q, "o")
            stats = g.tensor(name="stats", dim=list(self.stats.shape),
                             stride=list(self.stats.stride()),
                             data_type=self.cudnn.data_type.FLOAT)
            dq, dk, dv = g.sdpa_backward(name="sdpa_backward", q=q, k=k, v=v, o=o, dO=do,
                                         stats=stats, attn_scale=self.scale,
                                         **self._masks(g, binds))
            self._packed(g, binds, "dQ", self.heads, self.d, self.max_q, "q", output=dq)
            self._packed(g, binds, "dK", self.heads_kv, self.d, self.max_k, "k", output=dk)
            self._packed(g, binds, "dV", self.heads_kv, self.dv, self.max_k, "v", output=dv)
            binds.update({q: self.q, k: self.k, v: self.v, o: self.o, stats: self.stats,
                          dq: self.dq, dk: self.dk, dv: self.dv_})
            workspace = self._plan(g)
            self._bwd = (g, {t: buf.data_ptr() for t, buf in binds.items()}, do, workspace)
        g, pack, do, workspace = self._bwd
        pack = dict(pack)
        pack[do] = dout.data_ptr()
        g.execute(pack, workspace, handle=self.handle)
        return self.dq, self.dk, self.dv_
