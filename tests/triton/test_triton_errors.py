"""Bad inputs to attnlab.triton: an AttnlabError naming the argument, before any kernel runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import AttnlabError, ShapeError
from attnlab.triton import flash_attention, flash_attention_backward

ROOT = Path(__file__).resolve().parents[2]


def qkv(B=1, H=2, Hkv=2, T=8, S=8, D=16, dtype=torch.float32):
    return (torch.randn(B, H, T, D, dtype=dtype), torch.randn(B, Hkv, S, D, dtype=dtype),
            torch.randn(B, Hkv, S, D, dtype=dtype))


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (lambda q, k, v: (q[0], k, v), ShapeError, "q: expected (B, H, T, D)"),
        (lambda q, k, v: (q, k[0], v), ShapeError, "k: expected (B, Hkv, S, D)"),
        (lambda q, k, v: (q, torch.randn(1, 3, 8, 16), v), ShapeError, "Hkv dividing H = 2"),
        (lambda q, k, v: (q, torch.randn(2, 2, 8, 16), v), ShapeError, "with B = 1"),
        (lambda q, k, v: (q, k, torch.randn(1, 2, 8, 32)), ShapeError, "the kernels need Dv = D"),
        (lambda q, k, v: (q, k, v[:, :, :5]), ShapeError, "v: expected (B, Hkv, S, D)"),
        (lambda q, k, v: (torch.randn(1, 2, 8, 48), torch.randn(1, 2, 8, 48),
                          torch.randn(1, 2, 8, 48)), ShapeError, "D in (16, 32, 64, 128)"),
        (lambda q, k, v: (q.double(), k, v), AttnlabError, "got torch.float64"),
        (lambda q, k, v: (q.numpy(), k, v), AttnlabError, "q: expected a torch.Tensor"),
        (lambda q, k, v: (q, k.bool(), v), AttnlabError, "k: expected a numeric tensor"),
    ],
)
def test_bad_tensors(change, error, words):
    with pytest.raises(error, match=None) as info:
        flash_attention(*change(*qkv()))
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"is_causal": "yes"}, "is_causal: expected True or False"),
        ({"return_lse": 1}, "return_lse: expected True or False"),
        ({"scale": float("nan")}, "scale: expected a finite number"),
        ({"scale": torch.tensor(0.5)}, "scale: expected a real number or None"),
        ({"key_padding": torch.ones(1, 8)}, "key_padding: expected bool (1, 8)"),
        ({"key_padding": torch.ones(1, 7, dtype=torch.bool)}, "key_padding: expected bool (1, 8)"),
        ({"key_padding": np.ones((1, 8), dtype=bool)}, "key_padding: expected bool (1, 8)"),
    ],
)
def test_bad_options(options, words):
    with pytest.raises(AttnlabError) as info:
        flash_attention(*qkv(), **options)
    assert words in str(info.value)


def test_backward_checks_the_forward_results_it_is_given():
    q, k, v = qkv()
    out, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ShapeError, match=r"lse: expected \(B, H, T\) = \(1, 2, 8\)"):
        flash_attention_backward(q, k, v, out, lse[..., :4], out)
    with pytest.raises(ShapeError, match=r"dout: expected \(B, H, T, D\)"):
        flash_attention_backward(q, k, v, out, lse, out[0])


def test_bfloat16_is_refused_in_the_interpreter_with_its_reason():
    with pytest.raises(AttnlabError, match="bfloat16 cannot run in Triton's interpreter"):
        flash_attention(*qkv(dtype=torch.bfloat16))


def test_the_reason_still_holds_the_interpreter_dot_is_wrong_on_bfloat16():
    """The refusal above rests on this: Triton's interpreter holds bfloat16 as uint16 and
    multiplies the raw integers in tl.dot, without an error. If a Triton release fixes it,
    this test fails, and the refusal can go."""
    import triton
    import triton.language as tl

    @triton.jit
    def matmul16(A, B, C, N: tl.constexpr):
        rows = tl.arange(0, N)
        idx = rows[:, None] * N + rows[None, :]
        tl.store(C + idx, tl.dot(tl.load(A + idx), tl.load(B + idx)))

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen).bfloat16()
    b = torch.randn(16, 16, generator=gen).bfloat16()
    c = torch.empty(16, 16)
    matmul16[(1,)](a, b, c, N=16)
    exact = a.float() @ b.float()  # |exact| <= ~20; the interpreter's answer is ~1e10 off
    assert (c - exact).abs().max().item() > 1e3 * exact.abs().max().item()


def test_cpu_tensors_without_the_interpreter_get_a_clear_error():
    """Outside the interpreter the kernels need CUDA tensors; CPU ones are refused by name
    (in a fresh process: this one's kernels are built for the interpreter)."""
    script = textwrap.dedent("""
        import torch
        from attnlab import AttnlabError
        from attnlab.triton import flash_attention, interpreting
        assert not interpreting()
        q = torch.randn(1, 2, 8, 16)
        try:
            flash_attention(q, q, q)
        except AttnlabError as error:
            print(error)
    """)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=300, check=True)
    assert result.stdout.startswith("q: expected a CUDA tensor"), result.stdout + result.stderr
    assert "TRITON_INTERPRET=1" in result.stdout
