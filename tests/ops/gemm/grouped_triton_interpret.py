"""Run ops/gemm/grouped_triton.py's kernels under Triton's CPU interpreter (TRITON_INTERPRET=1)
against the float64 reference, and print one JSON line per case: the kernel's logic (group
lookup, tiling, masks, the clamping of bad offs) checked with no GPU. Run as a script, in a child
process (the interpreter is chosen when triton is imported).

Triton 3.6's interpreter converts a loop bound with int() on a 1-element array, which numpy 2
refuses; `_Int` below is the int() it should call (a shim for the interpreter only)."""

import builtins
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402


class _IntMeta(type):
    def __instancecheck__(cls, o):
        return isinstance(o, builtins.int)

    def __call__(cls, x=0, *base):
        if isinstance(x, np.ndarray) and not base:
            x = x.reshape(-1)[0]
        return builtins.int(x, *base)


class _Int(metaclass=_IntMeta):
    pass


interpreter.int = _Int

sys.path.insert(0, sys.argv[1])  # ops/gemm
import grouped_triton as gt  # noqa: E402

from kiln.trace import gemm as ref  # noqa: E402

CASES = [
    ([17, 0, 250, 3, 0], 56, 72, True),
    ([1, 1], 129, 65, False),
    ([0, 0], 8, 8, True),
    ([64, 65, 63, 1], 24, 0, True),
    ([5, 9], 40, 130, False),
]
BAD = [[20, 16], [12, 100], [-5, 16], [9, 4]]  # clamped into [previous end, rows]

g = torch.Generator().manual_seed(int(sys.argv[2]))
BM, BN, BK = 64, 128, 64


def run(a, b, offs, out):
    rows, n, k, groups = a.shape[0], b.shape[2], a.shape[1], b.shape[0]
    grid = (-(-rows // BM) + groups, -(-n // BN))
    if rows and n:
        gt.grouped_mm_f32_kernel[grid](
            a,
            b,
            out,
            offs,
            rows,
            n,
            k,
            groups,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            b.stride(2),
            out.stride(0),
            out.stride(1),
            BLOCK_M=BM,
            BLOCK_N=BN,
            BLOCK_K=BK,
        )


# Both ways of finding a tile: the vector scan (up to GROUP_SCAN groups) and the scalar walk
# (GROUP_SCAN lowered to 2, so every case with more groups takes it).
for scan in (256, 2):
    gt.GROUP_SCAN = triton.language.constexpr(scan)
    for lens, n, k, column_major in CASES:
        rows = sum(lens)
        a = torch.rand((rows, k), generator=g) * 2 - 1
        b = (
            (torch.rand((len(lens), n, k), generator=g) * 2 - 1).transpose(1, 2)
            if column_major
            else torch.rand((len(lens), k, n), generator=g) * 2 - 1
        )
        offs = torch.tensor(lens).cumsum(0).to(torch.int32)
        out = torch.full((rows, n), float("nan"))
        run(a, b, offs, out)
        want = ref.grouped_mm_reference_float(a, b, offs, torch.float64)
        err = (out.double() - want).abs().max().item() if rows and n else 0.0
        print(
            json.dumps(
                {
                    "scan": scan,
                    "case": [lens, n, k, column_major],
                    "max_abs_err": err,
                    "nan": bool(out.isnan().any()),
                }
            )
        )
    for bad in BAD:
        a = torch.rand((16, 32), generator=g) * 2 - 1
        b = torch.rand((2, 32, 24), generator=g) * 2 - 1
        out = torch.full((16, 24), float("nan"))
        run(a, b, torch.tensor(bad, dtype=torch.int32), out)
        clamped = torch.tensor(bad).clamp(min=0).cummax(0).values.clamp(max=16)
        last = int(clamped[-1])
        want = ref.grouped_mm_reference_float(a, b, clamped, torch.float64)
        err = (out[:last].double() - want[:last]).abs().max().item() if last else 0.0
        print(
            json.dumps(
                {
                    "scan": scan,
                    "case": ["bad", bad],
                    "max_abs_err": err,
                    "nan": bool(out[:last].isnan().any()),
                    "untouched": bool(out[last:].isnan().all()),
                }
            )
        )
