"""The kernels compile for a Hopper GPU (sm_90), without one: Triton's compiler and the
ptxas its wheel ships turn them into a cubin on the CPU.

The interpreter runs the kernels' Python with NumPy semantics; it cannot see what only
the GPU compiler checks (types carried through loops, constexpr branches, layouts of
dots and transposes, shared memory). This compiles the four kernels at one tile
configuration of the autotuner's (bfloat16, D = 64, causal, with key padding: every
code path, masked and unmasked tiles) in a fresh process without TRITON_INTERPRET, into
an empty cache (a cold compile each time). It checks compilation only: nothing runs.
(float32 compiles too, measured once by hand, but takes ~1 minute per kernel here.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnlab.triton import kernels

    def compile_one(fn, pointers, scalars, constexprs, num_warps, num_stages):
        signature = {**pointers, **{name: kind for name, kind in scalars.items()},
                     **{name: "constexpr" for name in constexprs}}
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": num_warps, "num_stages": num_stages})
        print("compiled", fn.__name__, "shared", kernel.metadata.shared, flush=True)

    lengths = {"T": "i32", "S": "i32", "H": "i32", "GROUP": "i32"}
    for dtype, precision in (("bf16", "tf32"),):
        p = "*" + dtype
        options = {"HEAD_DIM": 64, "IS_CAUSAL": True, "HAS_PADDING": True,
                   "PRECISION": precision}
        compile_one(kernels.flash_forward_kernel,
                    {"Q": p, "K": p, "V": p, "OUT": p, "LSE2": "*fp32", "PAD": "*u8"},
                    {"qk_scale": "fp32", **lengths},
                    {**options, "BLOCK_M": 128, "BLOCK_N": 64}, 4, 3)
        compile_one(kernels.flash_delta_kernel, {"OUT": p, "DOUT": p, "DELTA": "*fp32"},
                    {"T": "i32"}, {"HEAD_DIM": 64, "BLOCK_M": 128}, 4, 1)
        grads = {"Q": p, "K": p, "V": p, "DOUT": p, "LSE2": "*fp32", "DELTA": "*fp32"}
        compile_one(kernels.flash_dq_kernel, {**grads, "DQ": p, "PAD": "*u8"},
                    {"qk_scale": "fp32", "scale": "fp32", **lengths},
                    {**options, "BLOCK_M": 128, "BLOCK_N": 32}, 4, 4)
        compile_one(kernels.flash_dkdv_kernel, {**grads, "DK": p, "DV": p, "PAD": "*u8"},
                    {"qk_scale": "fp32", "scale": "fp32", **lengths},
                    {**options, "BLOCK_M": 32, "BLOCK_N": 128}, 4, 4)
''')


def test_the_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    triton = pytest.importorskip("triton")
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.is_file():
        pytest.skip(f"this triton wheel ships no ptxas ({ptxas}): it cannot compile for CUDA")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # cold, and nothing left in the home folder
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, stated to silence its warning
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    compiled = [line.split()[1] for line in result.stdout.splitlines()
                if line.startswith("compiled")]
    assert compiled == ["flash_forward_kernel", "flash_delta_kernel", "flash_dq_kernel",
                        "flash_dkdv_kernel"], result.stdout
    # Hopper gives a block up to 227 KiB of shared memory; these tiles need far less.
    for line in result.stdout.splitlines():
        assert int(line.split()[-1]) <= 227 * 1024, line
