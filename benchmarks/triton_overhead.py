"""Host overhead per call of a triton-toolchain op against the same op on the nvcc toolchain.

    python benchmarks/triton_overhead.py [--calls 20000] [--out overhead.jsonl]

kiln.grouped_mm on a problem so small that the GPU finishes each kernel long before the host
issues the next (1 row, 1 group, n = k = 16, bf16): the wall time of N back-to-back calls (no
synchronisation until the end), divided by N, is the host's cost per call. Measured for

  cuda_api       kiln.grouped_mm(backend="cuda")   the nvcc module (pybind11 launcher, DLPack)
  triton_api     kiln.grouped_mm(backend="triton") the same API on the triton module
  triton_launch  the triton module's launcher alone (runtime/triton_module.py: ctypes into
                 cuLaunchKernel, argument buffers prebuilt)
  triton_jit     the same kernel through Triton's own JIT launcher (kernel[grid](...)), for
                 reference: what a vLLM/SGLang-style call costs

The issue's bar: triton_api <= cuda_api + 2 us. Each result passed a reference check first
(check_reference: the output of each backend, written into a NaN-filled out, against the float64
reference, compared on the host). The median of --reps repetitions is reported, with p10/p90;
the timer is time.perf_counter around the calls plus one final torch.cuda.synchronize() (the
host cost, not the device's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def _per_call_us(fn, calls: int, reps: int) -> list[float]:
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e6 / calls)
    return out


def check_reference(a, b, offs, out, backends=("cuda", "triton"), run=None) -> None:
    """Each backend's output against the float64 reference, compared on the CPU (the reference
    is computed on a's device; both sides are copied to the host). `out` is filled with NaN
    before each backend's call, so a backend that writes nothing fails instead of passing on
    the previous backend's result. AssertionError naming the backend on a mismatch."""
    import torch

    import kiln
    from kiln.trace import gemm as ref

    run = kiln.grouped_mm if run is None else run
    want = ref.grouped_mm_reference_float(a, b, offs, torch.float64).cpu()
    for backend in backends:
        out.fill_(float("nan"))
        got = run(a, b, offs, out=out, backend=backend).double().cpu()
        torch.testing.assert_close(
            got, want, rtol=1.6e-2, atol=1e-2, msg=lambda m, backend=backend: f"backend={backend}: {m}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    import kiln
    from kiln import _jit

    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(0)
    a = (torch.rand((1, 16), generator=g) - 0.5).to(torch.bfloat16).to(dev)
    b = (torch.rand((1, 16, 16), generator=g) - 0.5).to(torch.bfloat16).to(dev)
    offs = torch.tensor([1], dtype=torch.int32, device=dev)
    out = torch.empty((1, 16), dtype=torch.bfloat16, device=dev)
    check_reference(a, b, offs, out)

    mod = _jit.triton_module("//ops/gemm:grouped", dev, "overhead", dtype=torch.bfloat16)
    kernel = mod.kernel("grouped_mm_kernel")
    kargs = (
        a.data_ptr(),
        b.data_ptr(),
        out.data_ptr(),
        offs.data_ptr(),
        1,
        16,
        16,
        1,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        out.stride(0),
        out.stride(1),
    )
    grid = (2, 1)
    stream = _jit.stream_of(dev)
    cases = {
        "cuda_api": lambda: kiln.grouped_mm(a, b, offs, out=out, backend="cuda"),
        "triton_api": lambda: kiln.grouped_mm(a, b, offs, out=out, backend="triton"),
        "triton_launch": lambda: kernel(grid, *kargs, stream=stream, device=dev.index),  # as the op calls it
    }
    try:  # Triton's own launcher on the same source (it compiles the kernel once, here)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops" / "gemm"))
        import grouped_triton

        def jit_call():
            grouped_triton.grouped_mm_kernel[grid](
                a,
                b,
                out,
                offs,
                1,
                16,
                16,
                1,
                a.stride(0),
                a.stride(1),
                b.stride(0),
                b.stride(1),
                b.stride(2),
                out.stride(0),
                out.stride(1),
                BLOCK_M=64,
                BLOCK_N=128,
                BLOCK_K=64,
            )

        jit_call()
        cases["triton_jit"] = jit_call
    except Exception as e:  # noqa: BLE001 - reported, the other cases still run
        print(f"triton_jit unavailable: {e}", file=sys.stderr)

    results = {}
    for name, fn in cases.items():
        t = sorted(_per_call_us(fn, args.calls, args.reps))
        results[name] = statistics.median(t)
        r = {
            "case": name,
            "median_us": round(statistics.median(t), 3),
            "p10_us": round(t[len(t) // 10], 3),
            "p90_us": round(t[9 * len(t) // 10], 3),
            "calls": args.calls,
            "reps": args.reps,
            "gpu": torch.cuda.get_device_name(dev),
            "timer": "perf_counter + final synchronize",
            "shape": "rows 1, groups 1, n 16, k 16",
            "dtype": "bfloat16",
            "reference_check": "passed",
        }
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    verdict = results["triton_api"] <= results["cuda_api"] + 2.0
    print(
        json.dumps(
            {
                "case": "verdict",
                "triton_api_minus_cuda_api_us": round(results["triton_api"] - results["cuda_api"], 3),
                "within_2us": verdict,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
