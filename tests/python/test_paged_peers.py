"""bench/paged_peers.py without a GPU: the cells (the grid, --quick, --cells, the append mode),
the cache lengths, the shuffled block tables, the KV byte count (an append's written rows too),
the checked sample, jfa's paged workspace as libjfa sizes it and the options; with torch on the
CPU, the float64 paged reference against libjfa's own (jfa.paged_attention(..., reference=True)),
with an append too, jfa's method through its C entry on the CPU backend (with the append: the
rows written, the check failing calls that do not write them), the check catching outputs that
ignore the table or leave rows unwritten, FA3's paged call built from its schema (with k_new and
v_new for the append) and FlashInfer's planned calls (fake ops; the append skipped), a chunk of
256 tokens through every method, a cell's rounds and rates; the visible pairs of the causal mask
and the useful FLOPs, a cell whose sequences are shorter than its query tokens skipped; runs of
whole cells (decode, spec4, append, chunk256); the table and the progress lines on fake records
(TFLOP/s for chunk cells); scripts/gpu-check.sh's bench-paged stage."""

import math
import os
import statistics
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
sys.path.insert(0, str(BENCH))

import paged_peers as pp  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402
from gpu_check_functions import functions  # noqa: E402


def test_help_works_without_torch():
    text = help_without_torch("paged_peers")
    for option in ("--cells", "--quick", "--fa3-lib", "--time-limit-s"):
        assert option in text
    assert "--unverified-jfa" not in text  # jfa's CUDA paged kernels always take part


# ---- cells --------------------------------------------------------------------------------------

def test_the_default_grid_has_every_combination_and_keeps_a_cache_s_cells_together():
    cells = pp.cells_of(pp.parse_cells(None))
    assert len(cells) == len(set(cells)) == 2 * 4 * 4 * 2 * 2
    assert {c.mode for c in cells} == {"decode", "spec4"}
    assert {c.batch for c in cells} == {1, 8, 64, 256}
    assert {c.cache for c in cells} == {"u512", "u4k", "u32k", "tail"}
    assert {(c.heads, c.heads_kv) for c in cells} == {(32, 8), (64, 8)}
    assert {c.head_dim for c in cells} == {128, 64} and {c.page_size for c in cells} == {16}
    assert pp.cell_name(cells[0]) == "decode B1 u512 32:8 d128 p16"
    # The cells of one cache follow each other: each key is one run of the list.
    keys = [pp.cache_key(c) for c in cells]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(keys)) == 4 * 4 * 2
    assert all(keys.count(k) == 4 for k in set(keys))  # 2 GQAs x 2 modes share a cache


def test_quick_and_cells_narrow_each_axis():
    quick = pp.cells_of(pp.parse_cells(None, quick=True))
    assert [pp.cell_name(c) for c in quick[:2]] == ["decode B8 u4k 32:8 d128 p16",
                                                   "spec4 B8 u4k 32:8 d128 p16"]
    assert len(quick) == 8 and {c.cache for c in quick} == {"u4k", "tail"}
    axes = pp.parse_cells("spec4, B1,p1,p64,p1")
    assert axes["mode"] == ["spec4"] and axes["batch"] == [1] and axes["page_size"] == [1, 64]
    assert axes["cache"] == list(pp.DEFAULT_CACHES)
    assert len(pp.cells_of(axes)) == 1 * 1 * 4 * 2 * 2 * 2
    axes = pp.parse_cells("16:4,64:8,d256,tail", quick=True)
    assert axes["gqa"] == [(16, 4), (64, 8)] and axes["head_dim"] == [256]
    assert axes["batch"] == [8, 64] and axes["cache"] == ["tail"]
    # KV heads order the cells (a cache per KV head count), then query heads.
    assert [(c.heads, c.heads_kv) for c in pp.cells_of(axes)][:4] == [(16, 4)] * 2 + [(64, 8)] * 2
    for bad in ("u8", "B0", "3:2", "d", "x", "p-1", "0:0"):
        with pytest.raises(ValueError, match="unknown cell value"):
            pp.parse_cells(bad)
    with pytest.raises(SystemExit):
        pp.parse_args(["--cells", "decode,B7x"])


def test_append_is_a_mode_that_cells_pick_on_the_decode_cell_s_cache():
    full = pp.cells_of(pp.parse_cells(None))
    quick = pp.cells_of(pp.parse_cells(None, quick=True))
    assert not any(c.mode == "append" for c in full + quick)  # by --cells only
    assert pp.token_axis(" append ") == ("mode", "append") and pp.MODES["append"] == 1
    axes = pp.parse_cells("decode,append,B8,u4k", quick=True)
    assert axes["mode"] == ["decode", "append"] and axes["cache"] == ["u4k"]
    cells = pp.cells_of(axes)
    assert [pp.cell_name(c) for c in cells] == ["decode B8 u4k 32:8 d128 p16",
                                               "append B8 u4k 32:8 d128 p16"]
    assert pp.cache_key(cells[0]) == pp.cache_key(cells[1])  # one cache for both
    assert [pp.appended_rows(c) for c in cells] == [0, 8]
    assert len(pp.parse_args(["--cells", "append"]).cell_list) == 4 * 4 * 2 * 2
    with pytest.raises(ValueError, match="modes decode, spec4, append"):
        pp.token_axis("appends")


def test_chunk256_and_u8k_are_picked_by_cells_only():
    full = pp.cells_of(pp.parse_cells(None))
    quick = pp.cells_of(pp.parse_cells(None, quick=True))
    assert not any(c.mode == "chunk256" or c.cache == "u8k" for c in full + quick)
    assert pp.token_axis("chunk256") == ("mode", "chunk256") and pp.MODES["chunk256"] == 256
    assert pp.token_axis(" u8k") == ("cache", "u8k") and pp.cache_lengths("u8k", 3) == [8192] * 3
    assert "chunk256" not in pp.APPENDS
    cells = pp.cells_of(pp.parse_cells("chunk256,B8,u4k,u8k", quick=True))
    assert [pp.cell_name(c) for c in cells] == ["chunk256 B8 u4k 32:8 d128 p16",
                                               "chunk256 B8 u8k 32:8 d128 p16"]
    assert pp.appended_rows(cells[0]) == 0
    assert len(pp.parse_args(["--cells", "chunk256"]).cell_list) == 4 * 4 * 2 * 2
    assert len(pp.parse_args(["--cells", "u8k"]).cell_list) == 2 * 4 * 2 * 2
    with pytest.raises(ValueError, match="modes decode, spec4, append, chunk256; .*u8k"):
        pp.token_axis("chunk")


def test_cache_lengths_are_uniform_or_a_reproducible_heavy_tail():
    assert pp.cache_lengths("u4k", 3) == [4096] * 3 and pp.cache_lengths("u32k", 1) == [32768]
    tail = pp.cache_lengths("tail", 256, seed=0)
    assert tail == pp.cache_lengths("tail", 256, seed=0) != pp.cache_lengths("tail", 256, seed=1)
    assert all(pp.TAIL_MIN <= n <= pp.TAIL_MAX for n in tail)
    assert 1200 < statistics.median(tail) < 3500
    assert max(tail) >= 8 * statistics.median(tail)  # a long tail, capped
    assert pp.cache_lengths("tail", 8, seed=0) != tail[:8]  # each batch draws its own


def test_block_tables_use_every_page_once_in_a_shuffled_order():
    pytest.importorskip("torch", reason="torch is not installed")
    for lengths, page in (([5, 17, 32, 1], 16), ([4096] * 8, 16), ([300, 1, 2, 70], 1),
                          ([1000, 33, 256], 256), ([64, 65], 64)):
        table, num_pages = pp.block_table(lengths, page, seed=3)
        counts = [math.ceil(n / page) for n in lengths]
        assert num_pages == sum(counts) and tuple(table.shape) == (len(lengths), max(counts))
        assert str(table.dtype) == "torch.int32"
        used = [int(table[b, j]) for b, c in enumerate(counts) for j in range(c)]
        assert sorted(used) == list(range(num_pages))  # every page serves one sequence once
        assert all(int(table[b, j]) == 0 for b, c in enumerate(counts)
                   for j in range(c, table.shape[1]))
    table, num_pages = pp.block_table([4096] * 8, 16, seed=3)
    assert table.flatten().tolist() != list(range(num_pages))  # shuffled
    assert pp.block_table([4096] * 8, 16, seed=3)[0].equal(table)
    assert not pp.block_table([4096] * 8, 16, seed=4)[0].equal(table)
    assert pp.block_table([3, 1], 1)[1] == 4


def test_kv_bytes_count_what_a_call_reads_and_the_cache_what_it_holds():
    # 8 sequences of 512 keys, 8 KV heads, 128 + 128 columns of 2 bytes.
    assert pp.kv_bytes([512] * 8, 8, 128) == 4096 * 8 * 256 * 2
    assert pp.kv_bytes([3, 5], 2, 192, 128) == 8 * 2 * 320 * 2
    assert pp.kv_bytes([3, 5], 2, 64, element_bytes=4) == 8 * 2 * 128 * 4
    assert pp.cache_bytes([17, 16], 16, 8, 128) == 3 * 16 * 8 * 2 * 128 * 2  # whole pages
    assert pp.cache_bytes([17, 16], 1, 8, 128) == 33 * 8 * 2 * 128 * 2


def test_an_append_s_kv_bytes_add_the_rows_it_writes_to_the_keys_it_attends():
    # 4 sequences attending 100 keys each (99 in the cache before the call and the new one),
    # 4 rows written; 8 KV heads of 128 + 128 columns of 2 bytes.
    assert pp.kv_bytes([100] * 4, 8, 128, written=4) == (400 + 4) * 8 * 256 * 2
    assert pp.kv_bytes([3, 5], 2, 192, 128, written=2) == 10 * 2 * 320 * 2
    cell = pp.Cell("append", 4, "u512", 32, 8, 128, 16)
    lengths = pp.cache_lengths(cell.cache, cell.batch)
    rec = pp.new_record("jfa", cell, lengths, 1, [], 0.01)
    decode = pp.new_record("jfa", cell._replace(mode="decode"), lengths, 1, [], 0.01)
    assert (rec["appended_rows"], decode["appended_rows"]) == (4, 0)
    assert decode["kv_bytes"] == 4 * 512 * 8 * 256 * 2
    assert rec["kv_bytes"] == (4 * 512 + 4) * 8 * 256 * 2
    assert rec["seqused_k_sum"] == decode["seqused_k_sum"] == 4 * 512  # the keys attended


def test_visible_pairs_count_what_the_bottom_right_causal_mask_lets_through():
    # t=3, n=5: rows see keys [0, 2], [0, 3], [0, 4]; t=4, n=2: rows see none, none, [0], [0, 1].
    assert pp.visible_pairs(3, 5) == 3 + 4 + 5 == 12
    assert pp.visible_pairs(4, 2) == 0 + 0 + 1 + 2 == 3
    assert pp.visible_pairs(4, 4) == 1 + 2 + 3 + 4 and pp.visible_pairs(1, 7) == 7
    assert pp.visible_pairs(256, 512) == 256 * 256 + 256 * 257 // 2
    assert pp.visible_pairs(3, 0) == pp.visible_pairs(0, 5) == 0
    for t in range(0, 9):  # against the mask row by row: row i sees keys j <= i + n - t
        for n in range(0, 9):
            assert pp.visible_pairs(t, n) == sum(1 for i in range(t) for j in range(n)
                                                 if j <= i + n - t), (t, n)


def test_useful_flops_are_two_gemms_over_the_visible_pairs():
    assert pp.useful_flops([5], 3, 8, 64) == 4 * 8 * 64 * 12
    assert pp.useful_flops([5, 2], 4, 8, 64) == 4 * 8 * 64 * ((2 + 3 + 4 + 5) + (1 + 2))
    assert pp.useful_flops([5], 3, 8, 192, 128) == 2 * 8 * (192 + 128) * 12
    chunk = pp.Cell("chunk256", 2, "u8k", 32, 8, 128, 16)
    lengths = pp.cache_lengths(chunk.cache, chunk.batch)
    rec = pp.new_record("jfa", chunk, lengths, 256, [], 0.01)
    pairs = 256 * (8192 - 256) + 256 * 257 // 2
    assert rec["useful_gflop"] == 2 * 4 * 32 * 128 * pairs / 1e9
    assert rec["kv_bytes"] == 2 * 8192 * 8 * 256 * 2  # the keys read, as decode's
    decode = pp.new_record("jfa", chunk._replace(mode="decode"), lengths, 1, [], 0.01)
    assert decode["useful_gflop"] == 2 * 4 * 32 * 128 * 8192 / 1e9
    append = pp.new_record("jfa", chunk._replace(mode="append"), lengths, 1, [], 0.01)
    assert append["useful_gflop"] == decode["useful_gflop"]  # the keys attended, the new one in
    timed = pp.add_rates(dict(rec, status="ok", eager_ms=2.0, graph_ms=1.0))
    assert timed["graph_tflops"] == rec["useful_gflop"] * 1e9 / 1e-3 / 1e12
    assert timed["eager_tflops"] == timed["graph_tflops"] / 2
    assert timed["graph_kv_tbps"] == rec["kv_bytes"] / 1e-3 / 1e12
    untimed = pp.add_rates(dict(rec, status="wrong", eager_ms=2.0, graph_ms=None))
    assert untimed["eager_tflops"] is None and untimed["graph_tflops"] is None


def test_a_cell_shorter_than_its_query_tokens_is_skipped_naming_the_shortest():
    chunk = pp.Cell("chunk256", 3, "tail", 32, 8, 128, 16)
    assert pp.short_cache_reason(chunk, [256, 300, 8192]) == ""  # the chunk fits every sequence
    why = pp.short_cache_reason(chunk, [300, 255, 16])
    assert why == ("chunk256: 256 query tokens a sequence need as many keys; 2 of 3 sequences of "
                   "the tail cache have fewer (the shortest 16)")
    tail = pp.cache_lengths("tail", 256)
    assert min(tail) < 256 and pp.short_cache_reason(chunk._replace(batch=256), tail)
    for mode in ("decode", "spec4", "append"):  # the tail's shortest, 16, serves them all
        assert pp.short_cache_reason(chunk._replace(mode=mode), [pp.TAIL_MIN] * 3) == ""
    assert pp.short_cache_reason(chunk._replace(cache="u512"), pp.cache_lengths("u512", 3)) == ""


def test_the_checked_sample_takes_the_extremes_and_spreads_over_a_large_batch():
    assert pp.check_sample([9] * 8, 4) == list(range(8))
    uniform = pp.check_sample([4096] * 256, 1)
    assert len(uniform) == 8 and {0, 255} <= set(uniform)
    assert len({i // 32 for i in uniform}) >= 6  # spread, not clustered at the ends
    tail = pp.cache_lengths("tail", 64)
    picks = pp.check_sample(tail, 4)
    assert len(picks) == 8 and {tail.index(max(tail)), tail.index(min(tail)), 0, 63} <= set(picks)


def test_jfa_s_workspace_is_the_library_s_answer():
    """jfa_workspace_bytes asks libjfa (jfa_attention_paged_workspace_size), which reads sizes and
    hints only: for the CUDA backend, with no buffer and no GPU, a CUDA build answers its split
    plan's partials (paged_plan.hpp by hand, the most of its plans on up to 132 SMs), a build
    without it 0; the CPU backend needs none."""
    import ctypes

    import jfa
    import libjfa
    from jfa import _library
    lib = libjfa.Library(jfa.library_path())

    def size(batch, tokens, heads, heads_kv, head_dim, max_k, backend="cuda"):
        p = lib.params(q=None, k=None, v=None, out=None, cu_seqlens_q=None, batch=batch,
                       total_q=batch * tokens, heads_q=heads, heads_kv=heads_kv,
                       head_dim=head_dim, dtype="bf16", causal=True, max_seqlen_q=tokens,
                       max_seqlen_k=max_k, backend=backend)
        p.cu_seqlens_k, p.total_k = None, 0  # the keys come from the cache
        kv = _library.PagedKv()
        lib.check(lib.lib.jfa_paged_kv_init_sized(ctypes.byref(kv), ctypes.sizeof(kv)),
                  "jfa_paged_kv_init_sized")
        return pp.jfa_workspace_bytes(lib, p, kv)

    packed = lib.params(q=None, k=None, v=None, out=None, cu_seqlens_q=None, batch=1, total_q=1,
                        heads_q=1, head_dim=64, dtype="bf16")
    cuda_build = lib.workspace_size(packed) > 0  # 0 only without the CUDA backend
    # B1 decode 32:8 d128 (32 rows a CTA): 1 row block, 8 CTAs -> 33 splits, capped at
    # ceil(4096 / 256) = 16; partials (fp32 O and (max, sum)) of 32 rows x 16 splits.
    rows = 1 * 32 * 16
    want = rows * 128 * 4 + rows * 8
    assert size(1, 1, 32, 8, 128, 4096) == (want if cuda_build else 0)
    assert size(1, 1, 32, 8, 128, 4096, backend="cpu") == 0
    if not cuda_build:
        return
    # spec4 64:8 d64 (64 rows a CTA): 32 rows a KV head, 1 row block, 33 splits under the cap 64.
    rows = 4 * 64 * 33
    assert size(1, 4, 64, 8, 64, 32768) == rows * 64 * 4 + rows * 8
    assert size(1, 1, 32, 8, 128, 300) == 32 * 2 * (128 * 4 + 8)
    assert size(1, 1, 32, 8, 128, 0) == 32 * 16 * (128 * 4 + 8)
    # B64: 512 CTAs, one split on 132 SMs (two waves), but 16 on 125 SMs (33 waves of 2 K keys
    # beat three of 32 K): the query answers the most a device needs.
    rows = 64 * 32 * 16
    assert size(64, 1, 32, 8, 128, 32768) == rows * 128 * 4 + rows * 8


# ---- options ------------------------------------------------------------------------------------

def test_options_and_their_quick_defaults(monkeypatch):
    monkeypatch.delenv("FA3_FULL_LIB", raising=False)
    a = pp.parse_args([])
    assert (a.rounds, a.runs, a.warmup, a.host_calls, a.host_batches) == (1, 30, 5, 100, 3)
    assert a.method_names == list(pp.DEFAULT_METHODS) and len(a.cell_list) == 128
    assert a.fa3_lib is None and a.time_limit_s is None
    q = pp.parse_args(["--quick", "--methods", "jfa,fa3", "--rounds", "2"])
    assert (q.rounds, q.runs, q.warmup, q.host_calls) == (2, 10, 3, 30)
    assert q.method_names == ["jfa", "fa3"] and len(q.cell_list) == 8
    monkeypatch.setenv("FA3_FULL_LIB", "/p/fa3_full_bf16.so")
    assert pp.parse_args([]).fa3_lib == "/p/fa3_full_bf16.so"
    for bad in (["--methods", "jfa,cudnn"], ["--methods", ""], ["--runs", "0"], ["--warmup", "-1"],
                ["--unverified-jfa"]):
        with pytest.raises(SystemExit):
            pp.parse_args(bad)
    assert pp.default_stem("2026-12-08", "NVIDIA H100 80GB HBM3") == "2026-12-08-h100-paged"


# ---- the reference and the methods (torch on the CPU) --------------------------------------------

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("tokens", [1, 4])
def test_the_float64_reference_matches_libjfa_s_paged_reference(rng, page_size, tokens):
    """GQA 8:2, partial last pages, a shuffled table, the causal mask with 4 tokens (one
    sequence shorter than its tokens: its first rows see no key and are zeros)."""
    torch = _torch()
    import jfa
    lengths = [2, 1, page_size, page_size + 1, 3 * page_size + 2, 70]
    heads, heads_kv, d = 8, 2, 16
    table, num_pages = pp.block_table(lengths, page_size, seed=int(rng.integers(1 << 30)))
    k = rng.standard_normal((num_pages, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((num_pages, page_size, heads_kv, d)).astype(np.float32)
    q = rng.standard_normal((len(lengths) * tokens, heads, d)).astype(np.float32)
    cu_q = np.arange(0, q.shape[0] + 1, tokens, dtype=np.int32)
    scale = float(np.float32(0.3))  # the C params hold it in float32
    want = jfa.paged_attention(q, k, v, table.numpy(), np.asarray(lengths, dtype=np.int32), cu_q,
                               causal=True, softmax_scale=scale, reference=True)
    got = pp.paged_reference(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                             table, lengths, tokens, scale, True, range(len(lengths)))
    for i in range(len(lengths)):
        assert got[i].dtype == torch.float64
        np.testing.assert_allclose(got[i].numpy(), want[i * tokens:(i + 1) * tokens],
                                   rtol=1e-10, atol=1e-12)
    if tokens == 4:  # sequence 0 has 2 keys: its first 2 rows see none
        assert not got[0][:2].any() and got[0][2:].abs().sum() > 0
    # Non-causal differs where a sequence has more than one token.
    loose = pp.attention_f64(torch.from_numpy(q[-tokens:]),
                             pp.gather_pages(torch.from_numpy(k), table[-1], lengths[-1]),
                             pp.gather_pages(torch.from_numpy(v), table[-1], lengths[-1]),
                             scale, causal=False)
    assert torch.allclose(loose, got[len(lengths) - 1]) == (tokens == 1)


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("tokens", [1, 3])
def test_the_reference_with_an_append_attends_over_the_rows_appended(rng, page_size, tokens):
    """libjfa's own reference with k_new (jfa.paged_attention(..., reference=True)) and the
    pages gathered after the new rows are written into a copy of the cache give the same; a
    reference that left the new rows out would not."""
    torch = _torch()
    import jfa
    before = [0, 1, page_size - 1, page_size, 2 * page_size + 3, 40]
    new = [1, 2, 1, 3, 1, 0]
    lengths = [b + n for b, n in zip(before, new)]  # the pages hold the rows appended too
    heads, heads_kv, d = 8, 2, 16
    table, num_pages = pp.block_table(lengths, page_size, seed=int(rng.integers(1 << 30)))
    k = rng.standard_normal((num_pages, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((num_pages, page_size, heads_kv, d)).astype(np.float32)
    q = rng.standard_normal((len(lengths) * tokens, heads, d)).astype(np.float32)
    k_new = rng.standard_normal((sum(new), heads_kv, d)).astype(np.float32)
    v_new = rng.standard_normal((sum(new), heads_kv, d)).astype(np.float32)
    cu_new = [0] + list(np.cumsum(new))
    cu_q = np.arange(0, q.shape[0] + 1, tokens, dtype=np.int32)
    scale = float(np.float32(0.3))
    want = jfa.paged_attention(q, k, v, table.numpy(), np.asarray(before, dtype=np.int32), cu_q,
                               causal=True, softmax_scale=scale, reference=True, k_new=k_new,
                               v_new=v_new, cu_seqlens_new=np.asarray(cu_new, dtype=np.int32))
    t = torch.from_numpy
    got = pp.paged_reference(t(q), t(k), t(v), table, before, tokens, scale, True,
                             range(len(lengths)), t(k_new), t(v_new), cu_new)
    written_k, written_v = k.copy(), v.copy()
    for b, n in enumerate(new):
        for j in range(n):
            page, row = int(table[b, (before[b] + j) // page_size]), (before[b] + j) % page_size
            written_k[page, row], written_v[page, row] = k_new[cu_new[b] + j], v_new[cu_new[b] + j]
    after = pp.paged_reference(t(q), t(written_k), t(written_v), table, lengths, tokens, scale,
                               True, range(len(lengths)))
    stale = pp.paged_reference(t(q), t(k), t(v), table, lengths, tokens, scale, True,
                               range(len(lengths)))
    for i in range(len(lengths)):
        assert got[i].dtype == torch.float64
        np.testing.assert_allclose(got[i].numpy(), want[i * tokens:(i + 1) * tokens],
                                   rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[i], after[i], rtol=1e-12, atol=1e-12)
        assert torch.allclose(got[i], stale[i]) == (new[i] == 0)


def cpu_inputs(lengths, mode="spec4", heads=8, heads_kv=2, d=64, page=16, seed=0):
    torch = _torch()
    cell = pp.Cell(mode, len(lengths), "tail", heads, heads_kv, d, page)
    cache = pp.PagedCache(lengths, page, heads_kv, d, torch.bfloat16, "cpu", seed)
    return pp.DecodeInputs(cell, cache, seed)


def record_for(x, method="jfa"):
    import peers_gpu as G
    return pp.new_record(method, x.cell, x.cache.lengths, x.tokens, x.sample,
                         G.TOLERANCE[pp.DTYPE])


def test_jfa_runs_through_its_c_entry_and_passes_the_check_on_the_cpu():
    _torch()
    import jfa
    import libjfa
    import peers_gpu as G
    x = cpu_inputs([3, 17, 40, 1, 100, 64, 16, 33, 5])
    assert x.sample == pp.check_sample(x.cache.lengths, 4) and len(x.sample) == 8
    ctx = {"jfa_lib": libjfa.Library(jfa.library_path())}
    rec = record_for(x)
    prep = pp.prepare_and_check(G, pp.jfa_prepare(G, ctx), x, rec)
    assert prep is not None and rec["status"] == "ok" and rec["rel_error"] < 1e-2, rec
    assert rec["max_abs_error"] < 0.1 and "jfa_attention_forward_paged" in rec["provider"]
    assert prep.keep[0] is None and "workspace 0 bytes" in rec["provider"]  # the CPU backend's
    params, kv = prep.keep[1].keep
    assert (params.k, params.v, params.cu_seqlens_k, params.total_k) == (None, None, None, 0)
    assert (params.max_seqlen_q, params.max_seqlen_k, params.causal) == (4, 100, 1)
    assert (params.heads_q, params.heads_kv, params.batch, params.total_q) == (8, 2, 9, 36)
    assert (kv.num_pages, kv.page_size, kv.max_pages_per_seq) == (x.cache.num_pages, 16, 7)
    assert kv.block_table == x.cache.table.data_ptr() and kv.seqused_k == x.cache.used.data_ptr()
    assert rec["kv_bytes"] == pp.kv_bytes(x.cache.lengths, 2, 64)
    with pytest.raises(G.Unavailable, match="not here"):
        pp.jfa_prepare(G, {"jfa_error": "not here"})(x)


def test_an_append_cell_s_inputs_and_the_rows_it_appends():
    torch = _torch()
    x = cpu_inputs([3, 17, 40, 1, 100, 16], mode="append")
    c = x.cache
    assert (x.tokens, x.new_rows, x.total_q) == (1, 1, 6)
    assert x.before == [n - 1 for n in c.lengths] == x.used_before.tolist()
    assert str(x.used_before.dtype) == "torch.int32" and x.cu_new.tolist() == list(range(7))
    assert tuple(x.k_new.shape) == tuple(x.v_new.shape) == (6, 2, 64)
    assert x.k_new.dtype == c.k.dtype and not torch.equal(x.k_new, x.v_new)
    # The slots are each sequence's last key (row length - 1) through its table row.
    pages, rows = pp.append_slots(c.table, x.before, 1, c.page_size)
    for b, n in enumerate(c.lengths):
        assert torch.equal(c.k[pages[b], rows[b]], pp.gather_pages(c.k, c.table[b], n)[-1])
    assert pp.append_slots(c.table, [0, 15], 2, 16)[1].tolist() == [0, 1, 15, 0]
    assert pp.append_slots(c.table, [0, 15], 2, 16)[0].tolist()[2:] == c.table[1, :2].tolist()
    original = (c.k.clone(), c.v.clone())
    x.poison_appended()
    assert int(c.k.isnan().any(-1).any(-1).sum()) == int(c.v.isnan().any(-1).any(-1).sum()) == 6
    assert all(pp.gather_pages(c.k, c.table[b], n)[-1].isnan().all() and
               not pp.gather_pages(c.k, c.table[b], n)[:-1].isnan().any()
               for b, n in enumerate(c.lengths))
    x.release()  # the cache's own values back for the cells after it
    assert torch.equal(c.k, original[0]) and torch.equal(c.v, original[1])
    with pytest.raises(ValueError, match="cache length >= 1"):
        cpu_inputs([3, 0], mode="append")
    plain = cpu_inputs([3, 17], mode="decode")
    assert plain.new_rows == 0 and plain.k_new is None
    plain.poison_appended()  # nothing to poison
    assert not plain.cache.k.isnan().any()


def test_jfa_appends_through_its_c_entry_and_the_check_needs_the_rows_written():
    """jfa's append cell on the CPU backend: the call's jfa_paged_kv carries the append, the
    new rows land in the pages, the output passes the check; calls that attend without writing
    the rows, or leave the new row out, fail it."""
    torch = _torch()
    import jfa
    import libjfa
    import peers_gpu as G
    x = cpu_inputs([3, 17, 40, 1, 100, 64, 16, 33, 5], mode="append")
    c = x.cache
    ctx = {"jfa_lib": libjfa.Library(jfa.library_path())}
    rec = record_for(x)
    prep = pp.prepare_and_check(G, pp.jfa_prepare(G, ctx), x, rec)
    assert prep is not None and rec["status"] == "ok" and rec["rel_error"] < 1e-2, rec
    assert "jfa_attention_forward_paged, append (k_new, v_new" in rec["provider"]
    params, kv = prep.keep[1].keep
    assert (params.max_seqlen_q, params.max_seqlen_k, params.total_q) == (1, 100, 9)
    assert kv.seqused_k == x.used_before.data_ptr() != c.used.data_ptr()
    assert (kv.k_new, kv.v_new) == (x.k_new.data_ptr(), x.v_new.data_ptr())
    assert (kv.cu_seqlens_new, kv.total_new) == (x.cu_new.data_ptr(), 9)
    assert rec["kv_bytes"] == pp.kv_bytes(c.lengths, 2, 64, written=9)
    for b, n in enumerate(c.lengths):  # written where the reference reads them
        assert torch.equal(pp.gather_pages(c.k, c.table[b], n)[-1], x.k_new[b])
        assert torch.equal(pp.gather_pages(c.v, c.table[b], n)[-1], x.v_new[b])

    def attends(lengths):  # a call that writes nothing, attending over `lengths` keys
        def prepare(_):
            return pp.Prepared(lambda: (torch.cat([
                pp.attention_f64(x.q[b:b + 1], pp.gather_pages(c.k, c.table[b], n),
                                 pp.gather_pages(c.v, c.table[b], n), x.scale)
                for b, n in enumerate(lengths)]).to(x.q.dtype),))
        return prepare

    for lengths, reason in ((c.lengths, "non-finite"), (x.before, "relative error")):
        rec = record_for(x)
        assert pp.prepare_and_check(G, attends(lengths), x, rec) is None
        assert rec["status"] == "wrong" and rec["reason"].startswith(reason), rec
    x.release()
    assert not c.k.isnan().any() and not c.v.isnan().any()


def test_the_check_fails_outputs_that_ignore_the_table_or_leave_rows_unwritten():
    torch = _torch()
    import peers_gpu as G
    x = cpu_inputs([40, 17, 64, 3], mode="decode", heads=8, heads_kv=8)
    c = x.cache
    in_storage_order = torch.arange(c.num_pages, dtype=torch.int32)
    counts = pp.pages_per_sequence(c.lengths, c.page_size)
    starts = [sum(counts[:b]) for b in range(len(counts))]

    def computed(table_row):  # every sequence through table_row(b), as a kernel would
        rows = [pp.attention_f64(x.q[b:b + 1], pp.gather_pages(c.k, table_row(b), n),
                                 pp.gather_pages(c.v, table_row(b), n), x.scale)
                for b, n in enumerate(c.lengths)]
        return torch.cat(rows).to(x.q.dtype)

    def method(out, fail=None):
        def prepare(_):
            if fail:
                raise fail
            return pp.Prepared(lambda: (out,))
        return prepare

    right = computed(lambda b: c.table[b])
    wrong = computed(lambda b: in_storage_order[starts[b]:])  # pages in storage order
    holes = right.clone()
    holes[2, 3, 5] = float("nan")
    cases = [(right, None, "ok", ""), (wrong, None, "wrong", "relative error"),
             (holes, None, "wrong", "non-finite"),
             (right, G.Unavailable("no such build"), "unavailable", "no such build"),
             (right, RuntimeError("boom"), "error", "prepare: RuntimeError: boom")]
    for out, fail, status, reason in cases:
        rec = record_for(x)
        pp.prepare_and_check(G, method(out, fail), x, rec)
        assert rec["status"] == status and rec["reason"].startswith(reason), rec

    def failing_call(_):
        def run():
            raise RuntimeError("This flash attention build does not support paged KV")
        return pp.Prepared(run, explain=lambda e: pp.fa3_failure(G, e))

    rec = record_for(x, "fa3")
    assert pp.prepare_and_check(G, failing_call, x, rec) is None
    assert rec["status"] == "unavailable" and "does not support" in rec["reason"]
    assert pp.fa3_failure(G, RuntimeError("CUDA error: illegal memory access"))[0] == "error"


def test_jfa_s_unsupported_answer_is_unavailable_with_the_library_s_reason():
    _torch()
    import peers_gpu as G
    from jfa import JfaBackendUnavailableError, JfaCudaError, JfaUnsupportedError
    e = JfaUnsupportedError(2, "head_dim 96: the CUDA paged forward takes head_dim 64, 128 and "
                            "256 in this build", "jfa_attention_forward_paged")
    assert pp.jfa_failure(G, e) == ("unavailable", G.short(e))
    assert "head_dim 96" in G.short(e)
    e = JfaBackendUnavailableError(3, "backend=cuda: this libjfa was built without CUDA")
    assert pp.jfa_failure(G, e) == ("unavailable", G.short(e))
    assert pp.jfa_failure(G, JfaCudaError(4, "launch failed"))[0] == "error"


def fa3_fwd_schema(co):
    """torch.ops.flash_attn_3.fwd's arguments as FlashAttention-3's hopper/flash_api.cpp
    registers them (the full build's: paged KV, splits, pack-GQA)."""
    return ([(n, co.REQUIRED) for n in ("q", "k", "v")]
            + [(n, None) for n in ("k_new", "v_new", "q_v", "out", "cu_seqlens_q",
                                   "cu_seqlens_k", "cu_seqlens_k_new", "seqused_q", "seqused_k",
                                   "max_seqlen_q", "max_seqlen_k", "page_table", "kv_batch_idx",
                                   "leftpad_k", "rotary_cos", "rotary_sin", "seqlens_rotary",
                                   "q_descale", "k_descale", "v_descale")]
            + [("softmax_scale", co.REQUIRED), ("is_causal", co.REQUIRED),
               ("window_size_left", -1), ("window_size_right", -1), ("attention_chunk", 0),
               ("softcap", 0.0), ("is_rotary_interleaved", False), ("scheduler_metadata", None),
               ("num_splits", 0), ("pack_gqa", None), ("sm_margin", 0)])


def paged_attention_of(torch, q4, k_cache, v_cache, used, table, scale, causal):
    """What a correct paged kernel returns, [B, T, H, D] in q's dtype."""
    B, T = q4.shape[:2]
    refs = pp.paged_reference(q4.flatten(0, 1), k_cache, v_cache, table, used.tolist(), T,
                              scale, causal, range(B))
    return torch.stack([refs[b] for b in range(B)]).to(q4.dtype)


def test_fa3_s_paged_call_is_built_from_its_schema_and_checked():
    torch = _torch()
    import call_overhead as co
    import peers_gpu as G
    x = cpu_inputs([40, 17, 64, 3, 90], heads=8, heads_kv=2)
    calls = []

    def op(*args, **kwargs):
        calls.append((args, kwargs))
        q4, k, v = args[:3]
        out = paged_attention_of(torch, q4, k, v, args[11], args[14], kwargs["softmax_scale"],
                                 kwargs["is_causal"])
        return out, None, None, None

    ctx = {"fa3_op": op, "fa3_arguments": fa3_fwd_schema(co), "fa3_provider": "fwd from x.so"}
    rec = record_for(x, "fa3")
    prep = pp.prepare_and_check(G, pp.fa3_prepare(G, ctx), x, rec)
    assert prep is not None and rec["status"] == "ok", rec
    assert rec["provider"].startswith("fwd from x.so") and "pack_gqa=True" in rec["provider"]
    args, kwargs = calls[0]
    assert len(args) == 15 and tuple(args[0].shape) == (5, 4, 8, 64)
    assert args[1] is x.cache.k and args[2] is x.cache.v
    assert args[11] is x.cache.used and args[14] is x.cache.table
    assert all(a is None for a in args[3:11] + args[12:14])
    assert kwargs == {"softmax_scale": x.scale, "is_causal": True, "num_splits": 0,
                      "pack_gqa": True}
    older = [a for a in fa3_fwd_schema(co) if a[0] != "pack_gqa"]
    with pytest.raises(G.Unavailable, match="pack_gqa"):
        pp.fa3_prepare(G, dict(ctx, fa3_arguments=older))(x)

    seen = []

    def with_kvcache(q, k_cache, v_cache, **kw):  # FA3's wrapper: out alone without the LSE
        seen.append(kw)
        return paged_attention_of(torch, q, k_cache, v_cache, kw["cache_seqlens"],
                                  kw["page_table"], kw["softmax_scale"], kw["causal"])

    wrapper = types.SimpleNamespace(flash_attn_with_kvcache=with_kvcache)
    rec = record_for(x, "fa3")
    assert pp.prepare_and_check(G, pp.fa3_prepare(G, {"fa3_interface": wrapper}), x, rec)
    assert rec["status"] == "ok" and "flash_attn_with_kvcache" in rec["provider"]
    assert seen[0]["num_splits"] == 0 and seen[0]["pack_gqa"] is True
    assert seen[0]["page_table"] is x.cache.table
    with pytest.raises(G.Unavailable, match="load_library"):
        pp.fa3_prepare(G, {"fa3_error": "torch.ops.load_library(x.so): OSError"})(x)
    with pytest.raises(G.Unavailable, match="FlashAttention-3: not available"):
        pp.fa3_prepare(G, {})(x)


def fa3_kvcache_append(torch, q4, k_cache, v_cache, k_new, v_new, used, table, scale, causal):
    """What FA3's paged forward with k_new does: sequence b's new rows k_new[b] written at rows
    used[b] .. of its pages, then attention over used[b] + the new rows' keys."""
    page = k_cache.shape[1]
    for b in range(q4.shape[0]):
        for j in range(k_new.shape[1]):
            pos = int(used[b]) + j
            k_cache[table[b, pos // page], pos % page] = k_new[b, j]
            v_cache[table[b, pos // page], pos % page] = v_new[b, j]
    return paged_attention_of(torch, q4, k_cache, v_cache, used + k_new.shape[1], table, scale,
                              causal)


def test_fa3_s_append_call_passes_k_new_and_v_new_from_its_schema():
    torch = _torch()
    import call_overhead as co
    import peers_gpu as G
    x = cpu_inputs([40, 17, 64, 3, 90], mode="append", heads=8, heads_kv=2)
    calls = []

    def op(*args, **kwargs):
        calls.append((args, kwargs))
        q4, k, v, k_new, v_new = args[:5]
        out = fa3_kvcache_append(torch, q4, k, v, k_new, v_new, args[11], args[14],
                                 kwargs["softmax_scale"], kwargs["is_causal"])
        return out, None, None, None

    ctx = {"fa3_op": op, "fa3_arguments": fa3_fwd_schema(co), "fa3_provider": "fwd from x.so"}
    rec = record_for(x, "fa3")
    prep = pp.prepare_and_check(G, pp.fa3_prepare(G, ctx), x, rec)
    assert prep is not None and rec["status"] == "ok", rec
    assert "(page_table, seqused_k, k_new, v_new, num_splits=0" in rec["provider"]
    args, kwargs = calls[0]
    assert len(args) == 15 and tuple(args[0].shape) == (5, 1, 8, 64)
    assert args[1] is x.cache.k and args[2] is x.cache.v
    # k_new, v_new: the packed new rows seen as FA3's batch form [B, 1, Hkv, D].
    assert tuple(args[3].shape) == tuple(args[4].shape) == (5, 1, 2, 64)
    assert args[3].data_ptr() == x.k_new.data_ptr() and args[4].data_ptr() == x.v_new.data_ptr()
    assert args[11] is x.used_before and args[14] is x.cache.table  # seqused_k: before the call
    assert args[9] is None  # cu_seqlens_k_new: the batch form needs none
    assert all(a is None for a in args[5:11] + args[12:14])
    assert kwargs == {"softmax_scale": x.scale, "is_causal": True, "num_splits": 0,
                      "pack_gqa": True}
    for b, n in enumerate(x.cache.lengths):  # the rows went where the reference reads them
        assert torch.equal(pp.gather_pages(x.cache.k, x.cache.table[b], n)[-1], x.k_new[b])

    def ignores_the_append(*args, **kwargs):  # attends over seqused_k + 1 rows, writes nothing
        return (paged_attention_of(torch, args[0], args[1], args[2], args[11] + 1, args[14],
                                   kwargs["softmax_scale"], True), None, None, None)

    rec = record_for(x, "fa3")
    assert pp.prepare_and_check(G, pp.fa3_prepare(G, dict(ctx, fa3_op=ignores_the_append)), x,
                                rec) is None
    assert rec["status"] == "wrong" and rec["reason"] == "non-finite values in the output"
    no_append = [a for a in fa3_fwd_schema(co) if a[0] not in ("k_new", "v_new")]
    with pytest.raises(G.Unavailable, match="the schema has no k_new, v_new"):
        pp.fa3_prepare(G, dict(ctx, fa3_arguments=no_append))(x)

    seen = []

    def with_kvcache(q, k_cache, v_cache, **kw):  # FA3's wrapper: k= and v= are the new rows
        seen.append(kw)
        return fa3_kvcache_append(torch, q, k_cache, v_cache, kw["k"], kw["v"],
                                  kw["cache_seqlens"], kw["page_table"], kw["softmax_scale"],
                                  kw["causal"])

    wrapper = types.SimpleNamespace(flash_attn_with_kvcache=with_kvcache)
    rec = record_for(x, "fa3")
    assert pp.prepare_and_check(G, pp.fa3_prepare(G, {"fa3_interface": wrapper}), x, rec)
    assert rec["status"] == "ok" and "seqused_k, k, v, num_splits" in rec["provider"]
    assert seen[0]["cache_seqlens"] is x.used_before
    assert seen[0]["k"].data_ptr() == x.k_new.data_ptr() and tuple(seen[0]["v"].shape)[1] == 1
    decode = cpu_inputs([40, 17], mode="decode", heads=8, heads_kv=2)
    assert pp.prepare_and_check(G, pp.fa3_prepare(G, {"fa3_interface": wrapper_plain(torch)}),
                                decode, record_for(decode, "fa3"))
    assert pp.fa3_values(decode)["seqused_k"] is decode.cache.used
    assert "k_new" not in pp.fa3_values(decode)


def wrapper_plain(torch):
    """FA3's wrapper for a call without an append: k= and v= must not be passed."""
    def with_kvcache(q, k_cache, v_cache, **kw):
        assert "k" not in kw and "v" not in kw
        return paged_attention_of(torch, q, k_cache, v_cache, kw["cache_seqlens"],
                                  kw["page_table"], kw["softmax_scale"], kw["causal"])
    return types.SimpleNamespace(flash_attn_with_kvcache=with_kvcache)


def test_flashinfer_gets_the_same_pages_in_its_csr_form():
    torch = _torch()
    x = cpu_inputs([40, 17, 64, 3, 90, 16], page=16)
    c = x.cache
    indptr, indices, last = c.flashinfer_layout()
    counts = pp.pages_per_sequence(c.lengths, 16)
    assert indptr.tolist() == [0] + list(np.cumsum(counts))
    assert last.tolist() == [8, 1, 16, 3, 10, 16]
    for b, n in enumerate(c.lengths):
        pages = indices[indptr[b]:indptr[b + 1]]
        assert pages.tolist() == c.table[b, :counts[b]].tolist()
        assert (n - 1) // 16 + 1 == len(pages) and 1 <= int(last[b]) <= 16
        assert torch.equal(pp.gather_pages(c.k, pages, n), pp.gather_pages(c.k, c.table[b], n))
    assert sorted(indices.tolist()) == list(range(c.num_pages))


class FakeFlashInfer:
    """flashinfer's two wrappers, recording how they are made and planned, computing a correct
    paged attention through the CSR layout they are planned with."""

    def __init__(self, torch):
        self.made, self.torch = [], torch
        fake = self

        class Wrapper:
            def __init__(self, workspace, layout, **kw):
                fake.made.append((type(self).__name__, layout, kw))

            def plan(self, *args, **kw):
                self.args, self.kw = args, kw
                fake.made.append(("plan", args, kw))

            def run(self, q, caches):
                a = self.args[1:] if self.kw.get("causal") else self.args
                indptr, indices, last = a[:3]
                heads = a[3]
                page = a[6]
                k, v = caches
                tokens = q.shape[0] // (len(indptr) - 1)
                outs = []
                for b in range(len(indptr) - 1):
                    pages = indices[indptr[b]:indptr[b + 1]]
                    n = (len(pages) - 1) * page + int(last[b])
                    outs.append(pp.attention_f64(
                        q[b * tokens:(b + 1) * tokens], pp.gather_pages(k, pages, n),
                        pp.gather_pages(v, pages, n), self.kw["sm_scale"],
                        self.kw.get("causal", False)))
                out = fake.torch.cat(outs).to(q.dtype)
                assert out.shape[1] == heads
                return out

        class BatchDecodeWithPagedKVCacheWrapper(Wrapper):
            pass

        class BatchPrefillWithPagedKVCacheWrapper(Wrapper):
            pass

        self.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
        self.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper


def test_flashinfer_decodes_and_verifies_spec_tokens_with_the_causal_prefill():
    torch = _torch()
    import peers_gpu as G
    fi = FakeFlashInfer(torch)
    ctx = {"flashinfer": fi, "flashinfer_version": "9.9"}
    for mode, heads, name, tensor_cores in (("decode", 16, "BatchDecode", True),
                                            ("decode", 8, "BatchDecode", False),
                                            ("spec4", 16, "BatchPrefill", None)):
        fi.made.clear()
        x = cpu_inputs([40, 17, 64, 3, 90], mode=mode, heads=heads, heads_kv=2)
        rec = record_for(x, "flashinfer")
        assert pp.prepare_and_check(G, pp.flashinfer_prepare(G, ctx), x, rec), rec
        assert rec["status"] == "ok" and rec["provider"].startswith(f"flashinfer 9.9 {name}")
        (kind, layout, kw), (_, args, plan_kw) = fi.made
        assert kind.startswith(name) and layout == "NHD"
        assert plan_kw["sm_scale"] == x.scale and plan_kw["q_data_type"] == torch.bfloat16
        if tensor_cores is None:
            assert plan_kw["causal"] is True and args[0] is x.cu_q and args[4:] == (16, 2, 64, 16)
        else:
            assert kw == {"use_tensor_cores": tensor_cores} and args[3:] == (heads, 2, 64, 16)
            assert plan_kw["pos_encoding_mode"] == "NONE"
    with pytest.raises(G.Unavailable, match="import flashinfer: ModuleNotFoundError"):
        pp.flashinfer_prepare(G, {"flashinfer_error": "import flashinfer: ModuleNotFoundError: "
                                                      "No module named 'flashinfer'"})(x)


def test_flashinfer_skips_the_append_saying_why():
    torch = _torch()
    import peers_gpu as G
    fi = FakeFlashInfer(torch)
    x = cpu_inputs([40, 17, 64], mode="append", heads=8, heads_kv=2)
    for ctx in ({"flashinfer": fi, "flashinfer_version": "9.9"},
                {"flashinfer_error": "import failed"}):
        rec = record_for(x, "flashinfer")
        assert pp.prepare_and_check(G, pp.flashinfer_prepare(G, ctx), x, rec) is None
        assert rec["status"] == "skipped" and rec["reason"] == pp.FLASHINFER_NO_APPEND
    assert fi.made == [] and "append_paged_kv_cache" in pp.FLASHINFER_NO_APPEND
    decode = cpu_inputs([40, 17, 64], mode="decode", heads=8, heads_kv=2)
    rec = record_for(decode, "flashinfer")
    assert pp.prepare_and_check(G, pp.flashinfer_prepare(G, {"flashinfer": fi}), decode, rec)


def test_every_method_takes_a_chunk_of_256_tokens_on_the_cpu():
    """chunk256 over sequences of 256 keys and more: jfa through its C entry on the CPU
    backend, FA3's op (q as [B, 256, H, D]) and FlashInfer's causal prefill (fake ops) pass the
    check against the float64 reference; a method that drops the causal mask fails it."""
    torch = _torch()
    import call_overhead as co
    import jfa
    import libjfa
    import peers_gpu as G
    x = cpu_inputs([256, 300, 513], mode="chunk256", heads=8, heads_kv=2)
    assert (x.tokens, x.total_q, x.new_rows, x.cu_q.tolist()) == (256, 768, 0, [0, 256, 512, 768])
    rec = record_for(x)
    prep = pp.prepare_and_check(G, pp.jfa_prepare(G, {"jfa_lib": libjfa.Library(
        jfa.library_path())}), x, rec)
    assert prep is not None and rec["status"] == "ok" and rec["rel_error"] < 1e-2, rec
    params, _ = prep.keep[1].keep
    assert (params.max_seqlen_q, params.max_seqlen_k, params.causal) == (256, 513, 1)
    assert rec["useful_gflop"] == pp.useful_flops([256, 300, 513], 256, 8, 64) / 1e9

    def op(*args, **kwargs):
        assert tuple(args[0].shape) == (3, 256, 8, 64) and kwargs["is_causal"] is True
        return (paged_attention_of(torch, args[0], args[1], args[2], args[11], args[14],
                                   kwargs["softmax_scale"], kwargs["is_causal"]),)

    ctx = {"fa3_op": op, "fa3_arguments": fa3_fwd_schema(co)}
    rec = record_for(x, "fa3")
    assert pp.prepare_and_check(G, pp.fa3_prepare(G, ctx), x, rec) and rec["status"] == "ok", rec
    fi = FakeFlashInfer(torch)
    rec = record_for(x, "flashinfer")
    assert pp.prepare_and_check(G, pp.flashinfer_prepare(G, {"flashinfer": fi}), x, rec), rec
    assert "BatchPrefillWithPagedKVCacheWrapper, causal" in rec["provider"]
    assert fi.made[1][2]["causal"] is True and fi.made[1][1][0] is x.cu_q

    def unmasked(*args, **kwargs):
        return (paged_attention_of(torch, args[0], args[1], args[2], args[11], args[14],
                                   kwargs["softmax_scale"], False),)

    rec = record_for(x, "fa3")
    assert pp.prepare_and_check(G, pp.fa3_prepare(G, dict(ctx, fa3_op=unmasked)), x, rec) is None
    assert rec["status"] == "wrong" and rec["reason"].startswith("relative error"), rec


def test_loading_flashinfer_says_why_it_is_missing(monkeypatch):
    _torch()
    import peers_gpu as G
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    ctx = {}
    pp.load_flashinfer(G, ctx)
    assert "flashinfer" not in ctx and ctx["flashinfer_error"].startswith("import flashinfer: ")
    assert pp.unavailable_reason(ctx, "flashinfer") == ctx["flashinfer_error"]
    assert pp.unavailable_reason({"fa3_interface": object()}, "fa3") is None
    assert pp.unavailable_reason({"fa3_error": "no .so"}, "fa3") == "no .so"
    assert pp.unavailable_reason({"jfa_error": "no GPU"}, "jfa") == "no GPU"


def test_a_cell_s_rounds_keep_the_median_and_count_its_kv_bytes(monkeypatch):
    """measure_cell with measure_method replaced by check-only and made-up times: each method
    measured in alternating order per round, its median round by eager_ms, the KV rates of the
    kept times against the copy rate; a method that fails is measured once."""
    _torch()
    import jfa
    import libjfa
    import peers_gpu as G
    x = cpu_inputs([40, 17, 64, 3, 90], mode="decode", heads=8, heads_kv=2)
    ctx = {"jfa_lib": libjfa.Library(jfa.library_path())}
    eager = {"jfa": iter([0.3, 0.1, 0.2]), "fa3": iter([0.4, 0.4, 0.4])}
    order = []

    def check_only(G_, prepare, x_, rec, opts):
        order.append(rec["method"])
        if pp.prepare_and_check(G_, prepare, x_, rec) is not None:
            t = next(eager[rec["method"]])
            rec.update(eager_ms=t, graph_ms=t / 2, host_us=9.0)
        return rec

    monkeypatch.setattr(pp, "measure_method", check_only)
    impls = {"jfa": pp.jfa_prepare(G, ctx), "fa3": pp.fa3_prepare(G, {}),
             "flashinfer": pp.flashinfer_prepare(G, {"flashinfer_error": "import failed"})}
    reports = []
    mine, fa3, fi = pp.measure_cell(G, impls, x, ["jfa", "fa3", "flashinfer"], {}, 3, 2.0,
                                    reports.append)
    # The peers first (jfa's kernel, should it fault, goes last), then in turn; the peers
    # failed their first round and are not measured again.
    assert order == ["fa3", "flashinfer", "jfa", "jfa", "jfa"]
    assert len(reports) == 5 and [r["round"] for r in reports] == [0, 0, 0, 1, 2]
    assert mine["status"] == "ok" and mine["eager_ms"] == 0.2 and mine["graph_ms"] == 0.1
    assert [r["eager_ms"] for r in mine["rounds"]] == [0.3, 0.1, 0.2]
    kv = pp.kv_bytes(x.cache.lengths, 2, 64)
    assert mine["kv_bytes"] == kv and mine["eager_kv_tbps"] == kv / 0.2e-3 / 1e12
    assert mine["graph_of_copy"] == mine["graph_kv_tbps"] / 2.0
    assert (fa3["status"], fi["status"]) == ("unavailable", "unavailable")
    assert fi["reason"] == "import failed" and fa3["eager_kv_tbps"] is None
    assert pp.cell_summary([mine, fa3, fi])["jfa_over_best_graph"] is None


def test_the_run_stops_at_the_time_limit_or_a_lost_context():
    assert pp.measure_order(["jfa", "fa3", "flashinfer"]) == ["fa3", "flashinfer", "jfa"]
    assert pp.measure_order(["flashinfer", "jfa"]) == ["flashinfer", "jfa"]
    stop = pp.Stop(None, 0.0)
    assert stop.why() == ""
    cell = pp.Cell("decode", 8, "u4k", 32, 8, 128, 16)
    stop.lost(cell, "CUDA error: an illegal memory access was encountered")
    stop.lost(cell, "a later error")  # the first cause stays
    assert stop.why() == ("the CUDA context was lost after decode B8 u4k 32:8 d128 p16: CUDA "
                          "error: an illegal memory access was encountered")
    assert pp.Stop(0.0, 0.0).why() == "--time-limit-s 0 reached"
    assert pp.Stop(1e9, 0.0).why() == ""


def cpu_run(monkeypatch, argv, lost=""):
    """main() on the CPU: the caches there, jfa's library taken as having a CUDA backend (its
    calls run the CPU backend on host buffers), measure_method checking only, with made-up
    times; the GPU's copy rate, memory and context faked. Returns (rc, the JSON)."""
    torch = _torch()
    import json
    import libjfa
    import peers
    monkeypatch.setattr(pp, "DEVICE", "cpu")
    monkeypatch.setattr(peers, "torch_with_cuda", lambda tool: torch)
    monkeypatch.setattr(libjfa.Library, "cuda_available", lambda self: True)
    monkeypatch.setattr(pp, "copy_rate", lambda torch_: {"copy_tbps": 3.0})
    monkeypatch.setattr(pp, "cuda_context_lost", lambda G: lost)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(total_memory=80 << 30))
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setenv("FA3_LIB", "/nonexistent/fa3.so")
    monkeypatch.delenv("FA3_FULL_LIB", raising=False)

    def check_only(G, prepare, x, rec, opts):
        if pp.prepare_and_check(G, prepare, x, rec) is not None:
            rec.update(eager_ms=0.5, graph_ms=0.25, host_us=8.0)
        return rec

    monkeypatch.setattr(pp, "measure_method", check_only)
    import jfa
    try:  # the library the other tests load (JFA_LIBRARY honoured), as --lib: a git worktree
        lib = jfa.library_path()  # has no build/ of its own for the script's search
    except Exception:
        lib = None
    rc = pp.main(argv + (["--lib", lib] if lib else []))
    out = Path(argv[argv.index("--out") + 1]) / "run.json"
    return rc, json.loads(out.read_text())


def test_a_run_on_the_cpu_writes_its_json_and_table(monkeypatch, tmp_path, capsys):
    rc, doc = cpu_run(monkeypatch, ["--quick", "--cells", "B2,B3,u512,16:4,d64", "--rounds", "2",
                                    "--warm-seconds", "0", "--max-cache-gib", "0.0012",
                                    "--out", str(tmp_path), "--name", "run"])
    assert rc == 0 and doc["copy"] == {"copy_tbps": 3.0} and "stopped" not in doc
    assert [r["cell"] for r in doc["results"][::3]] == [
        "decode B2 u512 16:4 d64 p16", "spec4 B2 u512 16:4 d64 p16",
        "decode B3 u512 16:4 d64 p16", "spec4 B3 u512 16:4 d64 p16"]
    by = {(r["cell"], r["method"]): r for r in doc["results"]}
    jfa = by[("spec4 B2 u512 16:4 d64 p16", "jfa")]
    assert jfa["status"] == "ok" and jfa["graph_kv_tbps"] == 2 * 512 * 4 * 128 * 2 / 0.25e-3 / 1e12
    assert len(jfa["rounds"]) == 2 and jfa["graph_of_copy"] == jfa["graph_kv_tbps"] / 3.0
    assert by[("spec4 B2 u512 16:4 d64 p16", "flashinfer")]["status"] == "unavailable"
    assert by[("spec4 B2 u512 16:4 d64 p16", "fa3")]["status"] == "unavailable"
    skipped = by[("decode B3 u512 16:4 d64 p16", "jfa")]  # 1.5 MiB of cache, B2's 1 MiB
    assert skipped["status"] == "skipped" and "--max-cache-gib" in skipped["reason"]
    env = doc["environment"]
    assert "jfa_unverified_paged_kv" not in env and env["flashinfer"].startswith("import")
    assert doc["settings"]["axes"]["gqa"] == ["16:4"] and len(doc["summary"]) == 4
    printed = capsys.readouterr().out
    assert doc["table"] in printed and "flashinfer: unavailable: import flashinfer" in printed
    assert "[spec4 B2 u512 16:4 d64 p16 r1] jfa" in printed


def test_a_run_of_append_cells_on_the_cpu(monkeypatch, tmp_path, capsys):
    """append after decode on one cache (and decode after append): jfa right on both, the
    append's KV bytes with its written rows, FlashInfer skipped, the counting said."""
    rc, doc = cpu_run(monkeypatch, ["--cells", "decode,append,B2,u512,16:4,d64",
                                    "--warm-seconds", "0", "--out", str(tmp_path), "--name",
                                    "run"])
    assert rc == 0 and "stopped" not in doc
    by = {(r["cell"], r["method"]): r for r in doc["results"]}
    assert [r["cell"] for r in doc["results"][::3]] == ["decode B2 u512 16:4 d64 p16",
                                                       "append B2 u512 16:4 d64 p16"]
    jfa = by[("append B2 u512 16:4 d64 p16", "jfa")]
    assert jfa["status"] == "ok" and "append" in jfa["provider"], jfa
    assert jfa["kv_bytes"] == (2 * 512 + 2) * 4 * 128 * 2 and jfa["appended_rows"] == 2
    assert jfa["graph_kv_tbps"] == jfa["kv_bytes"] / 0.25e-3 / 1e12
    assert by[("decode B2 u512 16:4 d64 p16", "jfa")]["kv_bytes"] == 2 * 512 * 4 * 128 * 2
    fi = by[("append B2 u512 16:4 d64 p16", "flashinfer")]
    assert fi["status"] == "skipped" and fi["reason"] == pp.FLASHINFER_NO_APPEND
    assert by[("decode B2 u512 16:4 d64 p16", "flashinfer")]["status"] == "unavailable"
    assert doc["counting"].endswith("; " + pp.APPEND_COUNTING)
    assert pp.APPEND_COUNTING in doc["table"].splitlines()
    assert doc["settings"]["axes"]["mode"] == ["decode", "append"]
    capsys.readouterr()
    rc, doc = cpu_run(monkeypatch, ["--cells", "append,decode,B2,u512,16:4,d64",
                                    "--warm-seconds", "0", "--out", str(tmp_path), "--name",
                                    "run"])
    assert [(r["cell"].split()[0], r["status"]) for r in doc["results"] if r["method"] == "jfa"
            ] == [("append", "ok"), ("decode", "ok")]
    rc, doc = cpu_run(monkeypatch, ["--cells", "decode,B2,u512,16:4,d64", "--warm-seconds", "0",
                                    "--out", str(tmp_path), "--name", "run"])
    assert "append" not in doc["counting"] and pp.APPEND_COUNTING not in doc["table"]


def test_a_run_of_chunk_cells_on_the_cpu(monkeypatch, tmp_path, capsys):
    """chunk256 beside decode: jfa right on a chunk over u512, its useful FLOPs and TFLOP/s in
    the record and the table; on the tail cache (seed 2, B3: a sequence of 182 keys) the chunk
    cell is skipped for every method, naming the shortest, while decode runs there."""
    rc, doc = cpu_run(monkeypatch, ["--cells", "decode,chunk256,B3,u512,tail,16:4,d64",
                                    "--seed", "2", "--warm-seconds", "0", "--out", str(tmp_path),
                                    "--name", "run"])
    assert rc == 0 and "stopped" not in doc
    assert [r["cell"] for r in doc["results"][::3]] == [
        "decode B3 u512 16:4 d64 p16", "chunk256 B3 u512 16:4 d64 p16",
        "decode B3 tail 16:4 d64 p16", "chunk256 B3 tail 16:4 d64 p16"]
    by = {(r["cell"], r["method"]): r for r in doc["results"]}
    jfa = by[("chunk256 B3 u512 16:4 d64 p16", "jfa")]
    assert jfa["status"] == "ok" and jfa["tokens"] == 256, jfa
    pairs = 256 * 256 + 256 * 257 // 2
    assert jfa["useful_gflop"] == 3 * 4 * 16 * 64 * pairs / 1e9
    assert jfa["graph_tflops"] == jfa["useful_gflop"] * 1e9 / 0.25e-3 / 1e12
    assert jfa["kv_bytes"] == 3 * 512 * 4 * 128 * 2
    decode = by[("decode B3 u512 16:4 d64 p16", "jfa")]
    assert decode["useful_gflop"] == 3 * 4 * 16 * 64 * 512 / 1e9
    tail = pp.cache_lengths("tail", 3, seed=2)
    assert min(tail) == 182
    for m in pp.DEFAULT_METHODS:
        rec = by[("chunk256 B3 tail 16:4 d64 p16", m)]
        assert rec["status"] == "skipped" and rec["reason"].endswith("(the shortest 182)"), rec
    assert by[("decode B3 tail 16:4 d64 p16", "jfa")]["status"] == "ok"
    assert pp.FLOP_COUNTING in doc["counting"]
    lines = doc["table"].splitlines()
    assert "TFLOP/s = useful FLOPs / graph time in the TB/s column" in lines[0]
    assert pp.FLOP_COUNTING in lines
    row = next(line for line in lines if line.startswith("chunk256 B3 u512"))
    assert row.split()[6:9] == ["0.5000", "0.2500", f"{jfa['graph_tflops']:.1f}"]
    row = next(line for line in lines if line.startswith("decode B3 u512"))
    assert row.split()[8] == f"{decode['graph_kv_tbps']:.2f}"
    assert "TFLOP/s" in capsys.readouterr().out


def test_jfa_s_variants_run_under_their_switches_beside_jfa_and_are_not_peers(monkeypatch,
                                                                              tmp_path):
    """--methods jfa,jfa_prefill,jfa_decode,jfa_rows,jfa_nosplits,fa3: each variant prepared,
    checked and timed with its switches set (the library reads them at each call) and the
    process's own values back after; jfa ÷ best peer stays jfa's, over the peers only; the table
    has a column per variant."""
    switches = ("JFA_CUDA_PAGED_PREFILL", "JFA_CUDA_PAGED_LOADS", "JFA_CUDA_PAGED_SPLITS")
    monkeypatch.setenv("JFA_CUDA_PAGED_PREFILL", "0")
    monkeypatch.delenv("JFA_CUDA_PAGED_LOADS", raising=False)
    monkeypatch.delenv("JFA_CUDA_PAGED_SPLITS", raising=False)
    seen = {}
    check = pp.prepare_and_check

    def recording(G, prepare, x, rec):
        seen.setdefault(rec["method"], set()).add(tuple(os.environ.get(k) for k in switches))
        return check(G, prepare, x, rec)

    variants = ("jfa_prefill", "jfa_decode", "jfa_rows", "jfa_nosplits")
    monkeypatch.setattr(pp, "prepare_and_check", recording)
    rc, doc = cpu_run(monkeypatch, ["--cells", "chunk256,B2,u512,16:4,d64", "--methods",
                                    ",".join(("jfa", *variants, "fa3")),
                                    "--warm-seconds", "0", "--out", str(tmp_path), "--name",
                                    "run"])
    assert rc == 0
    assert seen == {"jfa": {("0", None, None)}, "fa3": {("0", None, None)},
                    "jfa_prefill": {("1", None, None)}, "jfa_decode": {("0", None, None)},
                    "jfa_rows": {("1", "rows", None)}, "jfa_nosplits": {("1", None, "0")}}
    assert (os.environ["JFA_CUDA_PAGED_PREFILL"], os.environ.get("JFA_CUDA_PAGED_LOADS")) == (
        "0", None)
    by = {r["method"]: r for r in doc["results"]}
    assert all(by[m]["status"] == "ok" for m in ("jfa", *variants))
    assert by["fa3"]["status"] == "unavailable"
    assert pp.best_peer(doc["results"], "graph") is None  # no peer ran: the variants are not peers
    head = doc["table"].splitlines()[1]
    assert all(pp.SHORT[m] in head for m in variants), head
    with pp.environment({"JFA_CUDA_PAGED_LOADS": "rows"}):
        assert os.environ["JFA_CUDA_PAGED_LOADS"] == "rows"
    assert "JFA_CUDA_PAGED_LOADS" not in os.environ


def test_a_run_says_why_it_stopped(monkeypatch, tmp_path):
    rc, doc = cpu_run(monkeypatch, ["--cells", "decode,B2,u512,16:4,d64", "--time-limit-s", "0",
                                    "--warm-seconds", "0", "--out", str(tmp_path), "--name",
                                    "run"])
    assert rc == 0 and doc["results"] == []
    assert doc["stopped"] == ("stopped: --time-limit-s 0 reached; 1 cell not measured (first: "
                              "decode B2 u512 16:4 d64 p16)")
    assert doc["not_measured"] == ["decode B2 u512 16:4 d64 p16"]
    rc, doc = cpu_run(monkeypatch, ["--cells", "decode,spec4,B2,u512,u4k,16:4,d64",
                                    "--warm-seconds", "0", "--out", str(tmp_path), "--name",
                                    "run"], lost="CUDA error: an illegal memory access")
    assert len(doc["results"]) == 3  # the first cell, then nothing more starts
    assert doc["stopped"].startswith("stopped: the CUDA context was lost after decode B2 u512 "
                                     "16:4 d64 p16: CUDA error: an illegal memory access; 3 cells")


# ---- the report ---------------------------------------------------------------------------------

def fake_record(method, cell, status="ok", eager=None, graph=None, host=None, **more):
    rec = {"method": method, "cell": pp.cell_name(cell), "status": status,
           "kv_bytes": pp.kv_bytes(pp.cache_lengths(cell.cache, cell.batch), cell.heads_kv,
                                   cell.head_dim),
           "eager_ms": eager, "graph_ms": graph, "host_us": host, "reason": "", **more}
    return pp.add_rates(rec, 3.0)


def test_the_table_shows_each_method_and_jfa_over_the_best_peer():
    a = pp.Cell("decode", 64, "u4k", 32, 8, 128, 16)
    b = pp.Cell("spec4", 8, "tail", 64, 8, 64, 1)
    records = [fake_record("jfa", a, eager=0.2, graph=0.1, host=12.3),
               fake_record("fa3", a, eager=0.3, graph=0.12, host=30.0),
               fake_record("flashinfer", a, eager=0.25, graph=0.15, host=60.0,
                           host_gpu_bound=True),
               fake_record("jfa", b, "unavailable", reason="backend=cuda: this libjfa was "
                                                          "built without CUDA"),
               fake_record("fa3", b, eager=0.5, graph=None, graph_reason="capture failed"),
               fake_record("flashinfer", b, "wrong", reason="relative error 0.3 > 0.01")]
    kv = records[0]["kv_bytes"]
    assert kv == 64 * 4096 * 8 * 256 * 2
    assert records[0]["graph_kv_tbps"] == kv / 0.1e-3 / 1e12
    s = pp.summarize(records)
    assert s[0]["best_peer_graph"] == "fa3" and s[0]["best_peer_eager"] == "flashinfer"
    assert s[0]["jfa_over_best_graph"] == pytest.approx(0.12 / 0.1)
    assert s[0]["jfa_over_best_eager"] == pytest.approx(0.25 / 0.2)
    assert s[0]["jfa_graph_of_copy"] == records[0]["graph_kv_tbps"] / 3.0
    assert s[1]["jfa_over_best_eager"] is None and s[1]["best_peer_eager"] == "fa3"
    table = pp.format_table(records, {"copy_tbps": 3.0}, "stopped: --time-limit-s 60 reached")
    lines = table.splitlines()
    assert "the device copies 3.00 TB/s, read + written" in lines[0]
    assert lines[1].split() == ["jfa", "FA3", "FlashInfer"]
    row_a = next(line for line in lines if line.startswith(pp.cell_name(a)))
    rate = f"{kv / 0.1e-3 / 1e12:.2f}"
    assert row_a.split()[6:10] == ["0.2000", "0.1000", rate, "12.3"]
    assert row_a.split()[-3:] == ["1.25", "1.20", "FA3"] and "60.0!" in row_a
    row_b = next(line for line in lines if line.startswith(pp.cell_name(b)))
    assert row_b.split()[6:10] == ["n/a"] * 4 and "no graph" in row_b and "wrong" in row_b
    assert row_b.split()[-3:] == ["-", "-", "FA3"]
    assert any("jfa [unavailable] (first: spec4 B8 tail 64:8 d64 p1): backend=cuda" in line
               for line in lines)
    assert any("FA3 [no graph]" in line and "capture failed" in line for line in lines)
    assert lines[-1] == "stopped: --time-limit-s 60 reached"
    assert pp.format_table([], None, "stopped") == "no results\nstopped"
    assert "TFLOP/s" not in table  # no cell of more than 4 query tokens
    line = pp.progress_line(records[0], " r1")
    assert line.startswith("[decode B64 u4k 32:8 d128 p16 r1] jfa") and "host 12.3 µs" in line
    assert f"graph 0.1000 ms ({rate} TB/s)" in line
    assert "relative error 0.3" in pp.progress_line(records[-1])


def test_the_table_says_each_variant_s_speed_over_jfa_s():
    c = pp.Cell("chunk256", 1, "u4k", 32, 8, 128, 16)
    d = pp.Cell("chunk256", 8, "u4k", 32, 8, 128, 16)
    records = [fake_record("jfa", c, eager=0.2, graph=0.18),
               fake_record("jfa_prefill", c, eager=0.1, graph=0.09),
               fake_record("jfa_rows", c, "wrong", reason="relative error 0.5 > 0.01"),
               fake_record("fa3", c, eager=0.08, graph=0.05),
               fake_record("jfa", d, eager=0.7, graph=0.67),
               fake_record("fa3", d, eager=0.3, graph=0.25)]
    lines = pp.format_table(records).splitlines()
    at = lines.index("jfa's variants, speed over jfa's (graph / eager; > 1: the variant is "
                     "faster):")
    assert lines[at + 1] == f"  {pp.cell_name(c)}: jfa prefill 2.00 / 2.00, jfa rows - / -"
    assert not lines[at + 2].startswith(f"  {pp.cell_name(d)}")  # no variant ran there
    assert pp.summarize(records)[0]["jfa_over_best_graph"] == pytest.approx(0.05 / 0.18)
    assert pp.variant_lines(records[4:]) == []


def test_a_chunk_cell_s_row_shows_tflops_and_jfa_over_the_best_peer_stays_a_speed_ratio():
    c = pp.Cell("chunk256", 8, "u8k", 32, 8, 128, 16)
    gflop = pp.useful_flops(pp.cache_lengths(c.cache, c.batch), 256, 32, 128) / 1e9
    records = [fake_record(m, c, eager=e, graph=g, host=20.0, tokens=256, useful_gflop=gflop)
               for m, e, g in (("jfa", 2.0, 1.5), ("fa3", 1.0, 1.0), ("flashinfer", 1.2, 1.2))]
    s = pp.cell_summary(records)
    # The same bytes and FLOPs for every method: the TB/s ratio is the TFLOP/s ratio, 1 / time.
    assert s["best_peer_graph"] == "fa3" and s["jfa_over_best_graph"] == pytest.approx(1 / 1.5)
    assert s["jfa_over_best_graph"] == pytest.approx(records[0]["graph_tflops"]
                                                     / records[1]["graph_tflops"])
    table = pp.format_table(records, {"copy_tbps": 3.0})
    lines = table.splitlines()
    assert ("cells of more than 4 query tokens a sequence: TFLOP/s = useful FLOPs / graph time "
            "in the TB/s column") in lines[0]
    row = next(line for line in lines if line.startswith(pp.cell_name(c)))
    assert row.split()[6:10] == ["2.0000", "1.5000", f"{gflop / 1.5:.1f}", "20.0"]
    assert row.split()[-3:] == ["0.50", "0.67", "FA3"]
    assert pp.FLOP_COUNTING in lines
    line = pp.progress_line(records[0])
    rates = f"({records[0]['graph_kv_tbps']:.2f} TB/s, {gflop / 1.5:.1f} TFLOP/s)"
    assert f"graph 1.5000 ms {rates}" in line


# ---- scripts/gpu-check.sh -----------------------------------------------------------------------

def test_the_gpu_check_stage_passes_the_cells_through(tmp_path):
    """bench-paged, its helpers stubbed: PAGED_CELLS becomes --cells, PAGED_METHODS --methods,
    FA3's full build --fa3-lib; the old PAGED_UNVERIFIED is ignored (jfa's kernels always run)."""
    stubs = ("runtime_env() { JFA_LIBRARY=/c/lib/libjfa.so FA3_FULL_LIB=/p/fa3_full.so; }; "
             "left() { echo 400; }; gpu_name() { echo GPU; }; summary() { echo \"$*\"; }; "
             "timeout() { shift; echo \"$*\"; }; ")
    for old_switch, cells, methods in ((None, None, None),
                                       ("1", "decode,B64,u4k", "jfa,jfa_rows,fa3")):
        out = tmp_path / f"{old_switch}-{cells}"
        out.mkdir()
        code = (f"source <({functions('stage_bench_paged')}); {stubs}"
                f"OUT={out}; stage_bench_paged")
        env = {k: v for k, v in os.environ.items() if k not in ("PAGED_UNVERIFIED", "PAGED_CELLS",
                                                               "PAGED_METHODS", "BENCH_ROUNDS")}
        env.update({k: v for k, v in (("PAGED_UNVERIFIED", old_switch), ("PAGED_CELLS", cells),
                                      ("PAGED_METHODS", methods)) if v is not None})
        r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        args = (out / "paged.log").read_text().split()
        assert args[:2] == ["python3", "bench/paged_peers.py"]
        assert args[args.index("--lib") + 1] == "/c/lib/libjfa.so"
        assert args[args.index("--fa3-lib") + 1] == "/p/fa3_full.so"
        assert args[args.index("--out") + 1] == str(out)
        assert args[args.index("--name") + 1] == "paged"
        assert args[args.index("--rounds") + 1] == "2"
        assert args[args.index("--time-limit-s") + 1] == "370"
        assert not any("unverified" in a for a in args)
        assert (args[args.index("--cells") + 1] if "--cells" in args else None) == cells
        assert (args[args.index("--methods") + 1] if "--methods" in args else None) == methods
        assert r.stdout.strip() == "bench-paged GPU: rc 0 (paged.json, table in paged.log)"
    # The options the stage passes are the script's own.
    got = pp.parse_args(["--lib", "x.so", "--fa3-lib", "f.so", "--out", str(tmp_path), "--name",
                         "paged", "--cells", "decode,B64,u4k", "--methods", "jfa,jfa_rows,fa3",
                         "--rounds", "2", "--time-limit-s", "370"])
    assert len(got.cell_list) == 2 * 2 and got.time_limit_s == 370
    assert got.method_names == ["jfa", "jfa_rows", "fa3"]


def test_the_gpu_check_stage_needs_the_carried_build(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "bench-paged", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "CARRY_DIR": str(tmp_path / "missing")})
    assert r.returncode != 0 and "run 'scripts/gpu-check.sh build' first" in r.stderr
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench-paged")
    assert "FAILED (nothing carried)" in lines[0]
