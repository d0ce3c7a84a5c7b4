"""Host overhead per call of kiln's small ops against torch's eager equivalent on the same tensors.

    python benchmarks/host_overhead.py [--device cuda|cpu] [--calls 2000] [--reps 7] [--out o.jsonl]
    python benchmarks/host_overhead.py --breakdown [rmsnorm|softmax] [--device cuda]   # where a call goes

Each op runs on tensors so small (one row of --hidden values) that the device finishes each
kernel long before the host issues the next: the wall time of N back-to-back calls (on CUDA one
torch.cuda.synchronize() after them), divided by N, is the caller's cost per call, its Python
path included. kiln's and torch's per-call times and their ratio are reported, the minimum of
--reps repetitions (the least disturbed one; the spread is reported too). Each pair passes a
reference check first (kiln's output against torch's, the op's tolerance).

--breakdown times kiln.rmsnorm's (or kiln.softmax's) call path one layer at a time (the public
function, the launcher under the custom-op wrapper, the module lookup, the binding call with its
DLPack capsules, the capsules alone, the stream lookup, the output's allocation), each the same
way, so a regression of the call path is found in the layer that grew, not guessed at. Each layer
is also timed without waiting for the device ('issue'): where that is well below the per-call
time, the GPU, not the host, sets the pace.

On CPU tensors both sides also run their (tiny) host kernels, so the ratio there bounds the
Python path kiln adds, not the GPU launch; tests/harness/test_host_overhead.py uses it as CI's
guard (a ratio, not an absolute time, so it holds on any machine). On CUDA the same run measures
what a serving loop pays per launch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import kiln


@dataclass
class Overhead:
    op: str
    shape: str
    device: str
    kiln_us: float  # per call, the best repetition
    torch_us: float
    ratio: float  # kiln_us / torch_us
    kiln_spread_us: tuple[float, float]  # (best, worst) repetition
    torch_spread_us: tuple[float, float]
    calls: int
    reps: int
    reference_check: str  # "passed"


def _cases(device: torch.device, n: int) -> dict[str, tuple[str, Callable, Callable, float | None]]:
    """op -> (shape, kiln call, torch call, tolerance or None); each call returns its output."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device)

    x, w, r = rand(1, n), rand(n), rand(1, n)
    gate = rand(1, 2 * n)
    logits = rand(1, n)
    xr, rr = x.clone(), r.clone()

    def kiln_fused():
        kiln.fused_add_rmsnorm(xr, rr, w, 1e-6)
        return rr

    def torch_fused():
        rr.add_(xr)
        return F.rms_norm(rr, (n,), w, 1e-6)

    return {
        "rmsnorm": (f"1 x {n}", lambda: kiln.rmsnorm(x, w, 1e-6), lambda: F.rms_norm(x, (n,), w, 1e-6), 1e-4),
        "fused_add_rmsnorm": (f"1 x {n}", kiln_fused, torch_fused, None),
        "silu_and_mul": (f"1 x 2 x {n}", lambda: kiln.silu_and_mul(gate),
                         lambda: F.silu(gate[..., :n]) * gate[..., n:], 1e-5),
        "softmax": (f"1 x {n}", lambda: kiln.softmax(logits), lambda: torch.softmax(logits, -1), 1e-6),
    }


def _per_call_us(fn: Callable, calls: int, reps: int, device: torch.device) -> list[float]:
    cuda = device.type == "cuda"
    fn()  # the module is loaded (and compiled, if it must be) before any timing
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


def measure(device: str = "cpu", calls: int = 2000, reps: int = 7, ops: list[str] | None = None,
            hidden: int = 4096) -> list[Overhead]:
    dev = torch.device(device)
    results = []
    with torch.inference_mode():
        for op, (shape, kiln_call, torch_call, tol) in _cases(dev, hidden).items():
            if ops and op not in ops:
                continue
            if tol is not None:  # fused_add_rmsnorm mutates its inputs: checked by its own tests
                torch.testing.assert_close(kiln_call(), torch_call(), rtol=tol, atol=tol)
            k = _per_call_us(kiln_call, calls, reps, dev)
            t = _per_call_us(torch_call, calls, reps, dev)
            check = "passed" if tol is not None else "own tests"
            results.append(Overhead(op, shape, str(dev), min(k), min(t), min(k) / min(t), (min(k), max(k)),
                                    (min(t), max(t)), calls, reps, check))
    return results


def _rmsnorm_layers(dev: torch.device, hidden: int) -> list[tuple[str, Callable]]:
    from kiln import _jit, _pdl, norm

    x = torch.randn(1, hidden, device=dev)
    w, out = torch.randn(hidden, device=dev), torch.empty(1, hidden, device=dev)
    pdl = _pdl.resolve(None, dev)
    modules = norm._rmsnorm_op.eager.modules  # the generated launcher's lookup
    mod = modules.get("kiln.rmsnorm", dev, x.dtype)
    torch.testing.assert_close(kiln.rmsnorm(x, w, 1e-6), F.rms_norm(x, (hidden,), w, 1e-6),
                               rtol=1e-4, atol=1e-4)

    def binding(out=out, x=x):  # by position, as the launcher calls it
        mod.rmsnorm(_jit.dl(out), _jit.dl(x), _jit.dl(w), 1e-6, 0.0, pdl, _jit.stream_of(dev))

    x0, out0 = x[:0], out[:0]
    return [
        ("torch F.rms_norm", lambda: F.rms_norm(x, (hidden,), w, 1e-6)),
        ("kiln.rmsnorm", lambda: kiln.rmsnorm(x, w, 1e-6)),
        ("kiln.rmsnorm(enable_pdl=False)", lambda: kiln.rmsnorm(x, w, 1e-6, enable_pdl=False)),
        ("norm._rmsnorm (no API wrappers)", lambda: norm._rmsnorm(x, w, 1e-6, None, 0.0, None)),
        ("norm._rmsnorm_op (launcher, out given)", lambda: norm._rmsnorm_op(out, x, w, 1e-6, 0.0, pdl)),
        ("launcher body: module + binding", lambda: norm._rmsnorm_op.eager(out, x, w, 1e-6, 0.0, pdl)),
        ("binding call (capsules, stream)", binding),
        ("binding call, 0 rows: all but the launch", lambda: binding(out0, x0)),
        ("binding call, pdl=False", lambda: mod.rmsnorm(_jit.dl(out), _jit.dl(x), _jit.dl(w), 1e-6, 0.0,
                                                        False, _jit.stream_of(dev))),
        ("binding call by keyword (pybind11 matches 7 names)",
         lambda: mod.rmsnorm(out=_jit.dl(out), input=_jit.dl(x), weight=_jit.dl(w), eps=1e-6,
                             weight_offset=0.0, pdl=pdl, stream=_jit.stream_of(dev))),
        ("module lookup (_jit.Modules.get)", lambda: modules.get("kiln.rmsnorm", dev, x.dtype)),
        ("module lookup by keywords (_jit.module)",
         lambda: _jit.module(norm.LABEL, dev, "kiln.rmsnorm", dtype=x.dtype, names={"dtype": "input.dtype"})),
        ("3 x _jit.dl", lambda: (_jit.dl(out), _jit.dl(x), _jit.dl(w))),
        ("_jit.stream_of", lambda: _jit.stream_of(dev)),
        ("_pdl.resolve", lambda: _pdl.resolve(None, dev)),
        ("torch.empty_like", lambda: torch.empty_like(x)),
        *_bare_launch(dev),
    ]


def _softmax_layers(dev: torch.device, hidden: int) -> list[tuple[str, Callable]]:
    from kiln import _jit, errors, sampling

    x = torch.randn(1, hidden, device=dev)
    out = torch.empty(1, hidden, device=dev)
    mod = sampling._module("kiln.softmax", x, "logits")
    torch.testing.assert_close(kiln.softmax(x), torch.softmax(x, -1), rtol=1e-6, atol=1e-6)

    def binding(out=out, x=x):  # by position, as the launcher calls it
        mod.softmax_rows(_jit.dl(x), _jit.dl(out), None, 1.0, errors.record_address(dev), _jit.stream_of(dev))

    x0, out0 = x[:0], out[:0]

    def sample_rows():  # the general entry (21 arguments) the softmax used before its own
        mod.sample_rows(input=_jit.dl(x), output=mod.outputs["softmax"], order=mod.orders["top_k_first"],
                        logits=True, temperature=None, temperature_val=1.0, top_k=None, top_k_val=0,
                        top_p=None, top_p_val=1.0, out=_jit.dl(out), errors=errors.record_address(dev),
                        stream=_jit.stream_of(dev))

    return [
        ("torch.softmax", lambda: torch.softmax(x, -1)),
        ("kiln.softmax", lambda: kiln.softmax(x)),
        ("sampling._softmax_op (launcher, out given)", lambda: sampling._softmax_op(out, x, None, 1.0)),
        ("launcher body: module + binding", lambda: sampling._softmax_op.eager(out, x, None, 1.0)),
        ("binding softmax_rows (capsules, stream)", binding),
        ("binding softmax_rows, 0 rows: all but the launch", lambda: binding(out0, x0)),
        ("binding sample_rows, the same softmax", sample_rows),
        ("module lookup (_jit.Modules.get)", lambda: sampling._module("kiln.softmax", x, "logits")),
        ("2 x _jit.dl", lambda: (_jit.dl(out), _jit.dl(x))),
        ("errors.record_address", lambda: errors.record_address(dev)),
        ("errors.after_launch", lambda: errors.after_launch(dev)),
        ("_rows_input", lambda: sampling._rows_input("kiln.softmax", x, "logits", probs=False)),
        ("float32 output (empty_like)", lambda: sampling._float_rows_like(x)),
        *_bare_launch(dev),
    ]


def _bare_launch(dev: torch.device) -> list[tuple[str, Callable]]:
    """On CUDA, the floor of any launch from Python: torch's one-kernel spin of zero cycles."""
    if dev.type != "cuda":
        return []
    return [("torch.cuda._sleep(0): one bare launch", lambda: torch.cuda._sleep(0))]


BREAKDOWNS = {"rmsnorm": _rmsnorm_layers, "softmax": _softmax_layers}


def _issue_us(fn: Callable, calls: int, reps: int, device: torch.device) -> float:
    """The best per-call time of issuing `calls` calls without waiting for the device: below the
    synchronised time when the device, not the host, sets the pace (fewer calls than the launch
    queue holds, so the host never waits for a free slot)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return best


def breakdown(device: str = "cuda", calls: int = 2000, reps: int = 7, hidden: int = 4096,
              op: str = "rmsnorm") -> list[tuple[str, float, float]]:
    """(layer, best us per call, best us to issue a call) for kiln.<op>'s call path, outermost first."""
    if op not in BREAKDOWNS:
        raise SystemExit(f"--breakdown {op!r}: expected one of {', '.join(BREAKDOWNS)}")
    dev = torch.device(device)
    with torch.inference_mode():
        layers = BREAKDOWNS[op](dev, hidden)
        return [(name, min(_per_call_us(fn, calls, reps, dev)), _issue_us(fn, min(calls, 256), reps, dev))
                for name, fn in layers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--ops", help="comma-separated subset")
    parser.add_argument("--hidden", type=int, default=4096, help="the row's length (64 on CPU keeps the host "
                        "kernels' own work out of the ratio)")
    parser.add_argument("--out", help="append one JSON line per op")
    parser.add_argument("--breakdown", nargs="?", const="rmsnorm", choices=sorted(BREAKDOWNS),
                        help="time kiln.<op>'s call path layer by layer (rmsnorm when no op is named)")
    args = parser.parse_args(argv)
    if args.breakdown:
        rows = breakdown(args.device, args.calls, args.reps, args.hidden, args.breakdown)
        print(f"kiln.{args.breakdown}'s call path, 1 x {args.hidden} float32, {args.device} (best of "
              f"{args.reps} x {args.calls} calls; 'issue': {min(args.calls, 256)} calls not waited for; "
              f"torch {torch.__version__})")
        print(f"  {'layer':<46}{'per call':>10}{'issue':>10}")
        for name, us, issue in rows:
            print(f"  {name:<46}{us:>7.2f} us{issue:>7.2f} us")
        if args.out:
            with open(args.out, "a") as f:
                record = {"breakdown": args.breakdown, "device": args.device, "hidden": args.hidden,
                          "us": {n: us for n, us, _ in rows}, "issue_us": {n: i for n, _, i in rows},
                          "torch": torch.__version__}
                f.write(json.dumps(record) + "\n")
        return 0
    results = measure(args.device, args.calls, args.reps, args.ops.split(",") if args.ops else None,
                      args.hidden)
    print(f"{'op':<20}{'shape':<12}{'kiln us':>10}{'torch us':>10}{'ratio':>8}  (best of {args.reps} x "
          f"{args.calls} calls, {args.device}, torch {torch.__version__})")
    for r in results:
        print(f"{r.op:<20}{r.shape:<12}{r.kiln_us:>10.2f}{r.torch_us:>10.2f}{r.ratio:>8.2f}")
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps({**asdict(r), "torch": torch.__version__}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
