"""The virtual ring (attnlab.distributed.simulate) against plain attention over the whole
sequence, and its layouts and work report against counts made by hand."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.ring_reference import random_inputs, reference_attention

from attnlab import AttnlabError, ShapeError
from attnlab.distributed import padded_length, positions, ring_blocks, shard, simulate, unshard

LAYOUTS = ("contiguous", "zigzag", "striped")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("is_causal", [False, True])
def test_simulate_equals_single_process_float64(layout, world_size, is_causal):
    rng = np.random.default_rng(world_size)
    T = 2 * world_size * 3  # three positions per zigzag chunk
    q, k, v = random_inputs(rng, 2, 4, 2, T, 8, 6)  # GQA: 4 query heads, 2 K/V heads
    key_padding = np.ones((2, T), dtype=bool)
    key_padding[1, -2:] = False  # batch 1: its last two tokens are padding
    key_padding[1, 0] = False  # and a left-padded first token
    sim = simulate(q, k, v, world_size=world_size, layout=layout, is_causal=is_causal,
                   key_padding=key_padding, block_q=2, block_k=2)
    out, lse = reference_attention(q, k, v, is_causal=is_causal, key_padding=key_padding)
    # float64: the ring only reorders the sum over key blocks; 1e-12 is ~5e3 ulps of O(1)
    # values, room for the merges' exp/log roundings, far below any real mistake.
    np.testing.assert_allclose(sim.out, out, rtol=0, atol=1e-12)
    finite = np.isfinite(lse)
    np.testing.assert_array_equal(np.isfinite(sim.lse), finite)
    np.testing.assert_allclose(sim.lse[finite], lse[finite], rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_simulate_float32_within_pytorch_cp_bar(layout):
    rng = np.random.default_rng(1)
    q, k, v = random_inputs(rng, 1, 2, 2, 48, 16, 16, dtype=np.float32)
    sim = simulate(q, k, v, world_size=4, layout=layout, is_causal=True)
    out, lse = reference_attention(q, k, v, is_causal=True)
    # PyTorch context parallel's float32 bar (atol 2e-6, rtol 1e-5 on outputs and lse).
    np.testing.assert_allclose(sim.out, out, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(sim.lse, lse, rtol=1e-5, atol=2e-6)
    assert sim.out.dtype == np.float32


def test_padding_a_length_that_does_not_divide():
    rng = np.random.default_rng(2)
    T = 13
    q, k, v = random_inputs(rng, 1, 2, 1, T, 4, 4)
    with pytest.raises(ShapeError, match=r"zigzag.*2W = 8.*multiple of 8, got 13.*pad it to 16"):
        simulate(q, k, v, world_size=4, layout="zigzag")
    Tp = padded_length(T, world_size=4, layout="zigzag")
    assert Tp == 16
    pad = [(0, 0), (0, 0), (0, Tp - T), (0, 0)]
    qp, kp, vp = (np.pad(x, pad) for x in (q, k, v))
    key_padding = np.arange(Tp)[None, :] < T  # (1, Tp)
    for is_causal in (False, True):
        sim = simulate(qp, kp, vp, world_size=4, layout="zigzag", is_causal=is_causal,
                       key_padding=key_padding)
        out, lse = reference_attention(q, k, v, is_causal=is_causal)
        np.testing.assert_allclose(sim.out[..., :T, :], out, rtol=0, atol=1e-12)
        np.testing.assert_allclose(sim.lse[..., :T], lse, rtol=0, atol=1e-12)


def test_layouts_by_hand():
    assert positions(8, rank=0, world_size=2, layout="contiguous").tolist() == [0, 1, 2, 3]
    assert positions(8, rank=0, world_size=2, layout="zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, rank=1, world_size=2, layout="zigzag").tolist() == [2, 3, 4, 5]
    assert positions(8, rank=1, world_size=4, layout="striped").tolist() == [1, 5]
    x = np.arange(24).reshape(2, 12)  # (B, T): shard along dim -1
    for layout in LAYOUTS:
        for W in (1, 2, 3):
            parts = [shard(x, rank=r, world_size=W, layout=layout, dim=-1) for r in range(W)]
            np.testing.assert_array_equal(unshard(parts, layout=layout, dim=-1), x)


def test_causal_work_by_hand():
    """Score pairs per rank with n = 4 positions per rank, W = 4, counted on paper."""
    n, W = 4, 4
    tri, strict, full = n * (n + 1) // 2, n * (n - 1) // 2, n * n  # 10, 6, 16
    def work(layout):
        return [sum(b.pairs() for s in range(W)
                    for b in ring_blocks(r, (r - s) % W, n, world_size=W, layout=layout,
                                         is_causal=True)) for r in range(W)]
    # contiguous: rank r sees r whole earlier shards and its own triangle
    assert work("contiguous") == [tri, tri + full, tri + 2 * full, tri + 3 * full]
    # zigzag: its own triangle over 2 chunks, then half a tile at each other step
    assert work("zigzag") == [tri + 3 * full // 2] * W
    # striped: ranks at or before r give a triangle, later ones a strict triangle
    assert work("striped") == [(r + 1) * tri + (W - 1 - r) * strict for r in range(W)]
    # and every score the causal mask allows is computed exactly once: T (T + 1) / 2
    T = n * W
    for layout in LAYOUTS:
        assert sum(work(layout)) == T * (T + 1) // 2


def test_report_records_each_step():
    rng = np.random.default_rng(3)
    q, k, v = random_inputs(rng, 1, 4, 2, 16, 8, 8)
    sim = simulate(q, k, v, world_size=4, layout="contiguous", is_causal=True)
    report = sim.report
    assert report.work().shape == (4, 4)
    assert report.steps[3][1].kv_from == 2 and report.steps[3][1].receives_from == 2
    assert report.steps[0][1].pairs == 0 and not report.steps[0][1].merged  # skipped tile
    assert report.steps[2][3].sends_to is None  # nothing moves after the last step
    # contiguous causal: rank 3 does 10 + 3·16 = 58 pairs, rank 0 does 10
    assert report.imbalance() == pytest.approx(58 / 10)
    # each K/V shard: B·Hkv·n·(D + Dv) float64 values; only the 2 K/V heads travel
    assert report.kv_bytes == 1 * 2 * 4 * 16 * 8
    assert report.sent_bytes_per_rank() == 3 * report.kv_bytes
    zig = simulate(q, k, v, world_size=4, layout="zigzag", is_causal=True).report
    assert zig.imbalance() == 1.0


def test_bad_input():
    q = np.zeros((1, 2, 8, 4))
    with pytest.raises(AttnlabError, match="layout: expected one of"):
        simulate(q, q, q, world_size=2, layout="ring")
    with pytest.raises(ShapeError, match="Hkv dividing the query heads H = 2"):
        simulate(q, np.zeros((1, 3, 8, 4)), np.zeros((1, 3, 8, 4)), world_size=2)
    with pytest.raises(ShapeError, match="key_padding: expected bool"):
        simulate(q, q, q, world_size=2, key_padding=np.ones((1, 7), dtype=bool))
    with pytest.raises(AttnlabError, match="world_size: expected an integer >= 1"):
        simulate(q, q, q, world_size=0)
    with pytest.raises(ShapeError, match="parts\\[1\\]"):
        unshard([np.zeros((2, 3)), np.zeros((3, 3))], layout="contiguous")


def test_padded_length_and_unshard_refuse_what_they_cannot_use():
    # padded_length(-5) gave -4 and padded_length(2.5) gave 4.0 (a float length);
    # unshard([tensor, ndarray]) ended in torch.cat's TypeError.
    torch = pytest.importorskip("torch")
    with pytest.raises(AttnlabError, match=r"^T: expected an integer >= 0, got -5$"):
        padded_length(-5, world_size=2, layout="zigzag")
    with pytest.raises(AttnlabError, match=r"^T: expected an integer, got float 2\.5$"):
        padded_length(2.5, world_size=2, layout="zigzag")
    assert padded_length(0, world_size=2, layout="zigzag") == 0
    assert padded_length(np.int64(5), world_size=2, layout="zigzag") == 8
    for parts, kind in (([torch.ones(2, 3), np.ones((2, 3))], "Tensor"),
                        ([np.ones((2, 3)), torch.ones(2, 3)], "ndarray"),
                        ([np.ones((2, 3)), [[1.0] * 3] * 2], "ndarray")):
        with pytest.raises(AttnlabError, match=rf"^parts\[1\]: expected a shard of the kind of "
                                               rf"parts\[0\] \({kind}\), got "):
            unshard(parts, layout="contiguous")
