"""Host overhead per call of a triton-toolchain op against the same op on the nvcc toolchain.

    python benchmarks/triton_overhead.py [--calls 20000] [--out overhead.jsonl]
    python benchmarks/triton_overhead.py --host-only [--label after]   (no GPU needed)

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


def _stub_driver():
    """Compile benchmarks/stub_libcuda.c into a temporary libcuda.so.1 and load it, so that the
    launcher's ctypes.CDLL("libcuda.so.1") returns it (the dynamic loader matches the soname of a
    loaded library). Refused where a real driver is already loaded."""
    import ctypes
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("--host-only needs a C compiler (cc) for benchmarks/stub_libcuda.c")
    src = Path(__file__).resolve().with_name("stub_libcuda.c")
    so = Path(tempfile.mkdtemp(prefix="kiln-stub-cuda-")) / "libcuda.so.1"
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(so), str(src)], check=True
    )
    stub = ctypes.CDLL(str(so))
    if ctypes.CDLL("libcuda.so.1")._handle != stub._handle:
        raise SystemExit(
            "--host-only: another libcuda.so.1 is loaded in this process; run it on a machine "
            "with no GPU driver in use"
        )
    return stub


def host_only(args) -> int:
    import ctypes

    stub = _stub_driver()  # first: before anything else of the process could load a driver

    import torch

    import kiln  # noqa: F401 - the package, as a user imports it
    from kiln import _jit, gemm
    from kiln.codegen.specs import module_spec
    from kiln.runtime import jit
    from kiln.runtime.arch import ArchContext

    sink = ctypes.c_uint64.in_dll(stub, "kiln_stub_sink")
    mod = jit.load(module_spec(gemm.GROUPED, {"dtype": "bf16"}, "triton"), ArchContext.current("8.0;9.0a"))
    cpu = torch.device("cpu")
    _jit._by_value[(gemm.GROUPED, cpu, "triton", ("dtype", torch.bfloat16))] = mod  # as on a CUDA device

    g = torch.Generator().manual_seed(0)
    a = (torch.rand((1, 16), generator=g) - 0.5).to(torch.bfloat16)
    b_n = (torch.rand((1, 16, 16), generator=g) - 0.5).to(torch.bfloat16)  # [groups, k, n]: nmajor
    b_k = b_n.transpose(1, 2).contiguous().transpose(1, 2)  # the same values column-major: kmajor
    offs = torch.tensor([1], dtype=torch.int32)
    out = torch.empty((1, 16), dtype=torch.bfloat16)
    assert gemm._fast_layout(out, a, b_n) == "nmajor" and gemm._fast_layout(out, a, b_k) == "kmajor"
    nmajor = mod.kernel("grouped_mm_nmajor")
    values = {
        "a": a.data_ptr(),
        "b": b_n.data_ptr(),
        "out": out.data_ptr(),
        "offs": offs.data_ptr(),
        "rows": 1,
        "n": 16,
        "k": 16,
        "groups": 1,
        "stride_am": 16,
        "stride_ak": 1,
        "stride_bg": 256,
        "stride_bk": 16,
        "stride_bn": 1,
        "stride_om": 16,
        "stride_on": 1,
    }
    kargs = [values[p] for p in nmajor.params]
    cases = {
        "harness": (lambda: None, 0),
        "launch": (lambda: nmajor((2, 1), *kargs, stream=0, device=0), 1),
        "op_nmajor": (lambda: gemm._grouped_triton_op(out, a, b_n, offs, offs), 1),
        "op_kmajor": (lambda: gemm._grouped_triton_op(out, a, b_k, offs, offs), 1),
    }
    try:
        gemm._grouped_op(out, a, b_k, offs, True, None)
        cases["cuda_op_host"] = (lambda: gemm._grouped_op(out, a, b_k, offs, True, None), 0)
    except Exception as e:  # noqa: BLE001 - reported, the triton cases still run
        print(f"cuda_op_host unavailable (the host module of {gemm.GROUPED}): {e}", file=sys.stderr)

    for name, (fn, launches) in cases.items():
        fn()
        before = sink.value
        t = []
        for _ in range(args.reps):
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            t.append((time.perf_counter() - start) * 1e6 / args.calls)
        want = launches * args.reps * args.calls * a.data_ptr()
        if (sink.value - before) % 2**64 != want % 2**64:
            raise SystemExit(f"{name}: the stub driver did not see {launches} launch(es) of a per call")
        t.sort()
        r = {
            "case": name,
            "median_us": round(statistics.median(t), 3),
            "min_us": round(t[0], 3),  # the least disturbed repetition, on a shared machine
            "p10_us": round(t[len(t) // 10], 3),
            "p90_us": round(t[9 * len(t) // 10], 3),
            "calls": args.calls,
            "reps": args.reps,
            "label": args.label,
            "timer": "perf_counter, host-only (stub libcuda, CPU tensors)",
            "shape": "rows 1, groups 1, n 16, k 16",
            "dtype": "bfloat16",
            "launch_check": "passed" if launches else "none",
        }
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--host-only", action="store_true", help="no GPU: the stub driver, CPU tensors")
    ap.add_argument("--label", default="", help="recorded in each --host-only record (e.g. before, after)")
    args = ap.parse_args(argv)
    if args.host_only:
        return host_only(args)

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
