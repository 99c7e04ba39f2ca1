"""``attnlab.torch.debug_checks()``: value checks off the default path, on when asked.

By default attnlab.torch reads only metadata, so the default path must work where
there are no values at all (tensors on the "meta" device, i.e. shape inference)
and must compile into one graph (``fullgraph=True``: any read-back of a value to
the host would be a graph break). Under ``debug_checks()`` the same calls read
the values and refuse what they cannot compute; the switch is restored on exit,
exceptions included, as ``torch.autograd.detect_anomaly`` does.
"""

from __future__ import annotations

import pytest
import torch

import attnlab.torch as at
from attnlab.errors import AttnlabError


def meta(*shape):
    return torch.empty(*shape, device="meta")


def test_off_by_default_and_restored_on_exit():
    assert not at.debug_checks_enabled()
    with at.debug_checks():
        assert at.debug_checks_enabled()
        with at.debug_checks(False):
            assert not at.debug_checks_enabled()
        assert at.debug_checks_enabled()
    assert not at.debug_checks_enabled()


def test_restored_after_an_exception():
    with pytest.raises(AttnlabError, match="q: expected finite values"), at.debug_checks():
        q = torch.tensor([[float("nan"), 0.0]])
        at.scaled_dot_product_attention(q, q, q)
    assert not at.debug_checks_enabled()


def test_the_switch_must_be_a_bool():
    with pytest.raises(AttnlabError, match="^enabled: expected True or False, got 1$"):
        with at.debug_checks(1):  # type: ignore[arg-type]
            pass
    assert not at.debug_checks_enabled()


# ---------------------------------------------------------------- no values read by default


SHAPE_INFERENCE = {
    "sdpa": lambda: at.scaled_dot_product_attention(meta(2, 4, 3, 8), meta(2, 4, 5, 8),
                                                    meta(2, 4, 5, 6)),
    "sdpa-causal-mask-bias": lambda: at.scaled_dot_product_attention(
        meta(2, 4, 3, 8), meta(2, 4, 5, 8), meta(2, 4, 5, 6),
        torch.ones(3, 5, dtype=torch.bool, device="meta"), bias=meta(3, 5), is_causal=True),
    "sdpa-weights": lambda: at.scaled_dot_product_attention(
        meta(2, 4, 3, 8), meta(2, 4, 5, 8), meta(2, 4, 5, 6), return_weights=True)[1],
    "mha": lambda: at.MultiHeadAttention(4, 16, device="meta")(meta(2, 3, 16), meta(2, 5, 16),
                                                              meta(2, 5, 16), is_causal=True)[0],
    "layer": lambda: at.SelfAttentionLayer(16, 4, device="meta")(meta(2, 3, 16)),
    "softmax": lambda: at.softmax(meta(2, 3)),
    "rope": lambda: at.apply_rope(meta(2, 3, 8), torch.arange(3, device="meta")),
    "cache": lambda: at.KVCache(1, 2, 8, device="meta").attend(meta(1, 4, 3, 8),
                                                               meta(1, 2, 3, 8),
                                                               meta(1, 2, 3, 8)),
}
EXPECTED = {"sdpa": (2, 4, 3, 6), "sdpa-causal-mask-bias": (2, 4, 3, 6),
            "sdpa-weights": (2, 4, 3, 5), "mha": (2, 3, 16), "layer": (2, 3, 16),
            "softmax": (2, 3), "rope": (2, 3, 8), "cache": (1, 4, 3, 8)}


@pytest.mark.parametrize("name", list(SHAPE_INFERENCE))
def test_default_path_reads_no_values(name):
    """Meta tensors hold no values: the default path gives the shape, debug mode refuses."""
    out = SHAPE_INFERENCE[name]()
    assert out.device.type == "meta" and tuple(out.shape) == EXPECTED[name]
    with at.debug_checks(), pytest.raises(AttnlabError, match="got one on the meta device"):
        SHAPE_INFERENCE[name]()


def compiles_in_one_graph(fn, *args):
    """fn compiled with fullgraph=True (a graph break raises) equals fn run eagerly.

    The "eager" backend traces the Python into one graph without generating code:
    what is checked is the tracing, which a host read-back (``.item()``, ``bool(t)``)
    would break."""
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)


def test_sdpa_compiles_without_graph_breaks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g) for n in (3, 5, 5))
    mask = torch.rand(3, 5, generator=g) < 0.5
    bias = torch.randn(4, 3, 5, generator=g)
    compiles_in_one_graph(lambda q, k, v: at.scaled_dot_product_attention(q, k, v), q, k, v)
    compiles_in_one_graph(
        lambda q, k, v: at.scaled_dot_product_attention(q, k, v, mask, bias=bias, is_causal=True),
        q, k, v)
    compiles_in_one_graph(
        lambda q, k, v: at.scaled_dot_product_attention(q, k, v, mask, return_weights=True)[1],
        q, k, v)


def test_modules_compile_without_graph_breaks():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, generator=g)
    mha = at.MultiHeadAttention(4, 16, num_kv_heads=2, rope=True, generator=g).eval()
    compiles_in_one_graph(lambda x: mha(x, x, x, is_causal=True), x)
    layer = at.SelfAttentionLayer(16, 4, norm="pre", generator=g).eval()
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    compiles_in_one_graph(lambda x: layer(x, key_padding=padding), x)


def test_debug_checks_name_alibi_slopes():
    # A NaN or overflowing slope used to be reported as "bias" (the ALiBi bias built
    # from it), or, for slopes finite in float32 whose bias is not, pass into NaN.
    q = torch.randn(1, 2, 4, 8)
    with at.debug_checks():
        with pytest.raises(AttnlabError, match=r"^alibi_slopes: expected finite values, got 1 "
                                               r"non-finite \(first: NaN at index \(0,\)\)$"):
            at.scaled_dot_product_attention(q, q, q, alibi_slopes=torch.tensor([float("nan"), 1.]))
        with pytest.raises(AttnlabError, match=r"alibi_slopes: expected \|slope\|·\(T \+ S\) "
                                               r"below 8\.51e\+37"):
            at.scaled_dot_product_attention(q, q, q, alibi_slopes=torch.tensor([-3e37, 1.]))
