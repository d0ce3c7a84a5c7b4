"""The fuzz driver: hypothesis draws inputs for every public API and runs them on the CPU backend in
this process. tests/fuzz/test_fuzz.py runs it in a child process, so a crash (a segfault, an abort,
an AddressSanitizer report) fails the test instead of the test run; before each case the driver
writes the case to KILN_TEST_FUZZ_LOG, so the parent can name the input that crashed.

Every case must end in one of two ways:
  - a result: then every byte of the guarded buffers outside the outputs is untouched, the inputs
    are unchanged, and where the inputs were valid the outputs match the reference;
  - a clear error before anything is written: ValueError, TypeError or IndexError (the host
    backend's index checks) - any other exception fails the case.

Random shapes (zero-sized too), dtypes (unsupported ones too), strides (slices of larger buffers),
page tables with out-of-range and negative ids, decreasing indptr, last_page_len 0 and past
page_size, NaN/Inf inputs, aliasing and expanded outputs, bad scalars.

    KILN_TEST_FUZZ_EXAMPLES=N python tests/fuzz/fuzz_driver.py [api ...]
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kiln
from kiln.trace.attention import attention, merge_float
from kiln.trace.norm import rms_norm_float64

EXPECTED = (ValueError, TypeError, IndexError)
LOG = os.environ.get("KILN_TEST_FUZZ_LOG", "")
# KILN_TEST_FUZZ_NARROW=1 keeps to bf16 and head_dim 64 (few modules: the AddressSanitizer run).
NARROW = os.environ.get("KILN_TEST_FUZZ_NARROW") == "1"
FLOATS = [torch.bfloat16] if NARROW else [torch.float16, torch.bfloat16]
NORM_DTYPES = [torch.bfloat16] if NARROW else [torch.float32, torch.float16, torch.bfloat16]
HEAD_DIMS = [64]
counts: dict[str, int] = {}


class CaseFailed(AssertionError):
    pass


def log_case(api: str, case: dict) -> None:
    counts[api] = counts.get(api, 0) + 1
    if LOG:
        with open(LOG, "w") as f:
            f.write(json.dumps({"api": api, "n": counts[api], "case": case}, default=str))


# --- guarded buffers: a view inside a larger allocation whose other bytes must stay as they were


_SENTINEL = {
    torch.float32: 7.25,
    torch.float16: 7.25,
    torch.bfloat16: 7.25,
    torch.int32: 0x5A5A5A5A,
    torch.float64: 7.25,
    torch.uint8: 0xA5,
}


@dataclass
class Guarded:
    base: torch.Tensor
    view: torch.Tensor
    before: torch.Tensor
    mask: torch.Tensor  # True outside the view's elements

    def check(self, name: str, written: bool) -> None:
        now = self.base.view(torch.uint8) if self.base.dtype != torch.uint8 else self.base
        was = self.before.view(torch.uint8) if self.before.dtype != torch.uint8 else self.before
        item = self.base.element_size()
        outside = self.mask.repeat_interleave(item) if item > 1 else self.mask
        if not torch.equal(now[outside], was[outside]):
            raise CaseFailed(f"{name}: bytes outside the tensor were written")
        if not written and not torch.equal(now, was):
            raise CaseFailed(f"{name}: an input (or an output of a refused call) was written")


def guarded(data: torch.Tensor, draw) -> Guarded:
    """`data` copied into a view inside a sentinel buffer: an offset and a row padding drawn at
    random (mostly whole 16-byte vectors, as the kernels need; sometimes not, which they refuse)."""
    shape = list(data.shape)
    item = data.element_size()
    vec = max(1, 16 // item)
    front = draw(st.sampled_from([0, vec, 2 * vec, 1]))
    pad = draw(st.sampled_from([0, 0, vec, 3]))
    n = len(shape)
    strides = [1] * n
    if n >= 2:
        strides[-2] = shape[-1] + pad
    for i in range(n - 3, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    span = sum((n - 1) * st_ for n, st_ in zip(shape, strides, strict=True)) + 1 if data.numel() else 0
    total = front + span + draw(st.integers(0, 9)) + 1
    base = torch.full((total,), _SENTINEL[data.dtype], dtype=data.dtype)
    view = base.as_strided(shape, strides, front)
    view.copy_(data)
    mask = torch.ones(total, dtype=torch.bool)
    if data.numel():
        mask.as_strided(shape, strides, front).fill_(False)
    return Guarded(base, view, base.clone(), mask)


def floats(draw, shape, dtype, specials: bool = True) -> torch.Tensor:
    seed = draw(st.integers(0, 2**31 - 1))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * draw(
        st.sampled_from([0.1, 1.0, 8.0])
    )
    if specials and x.numel() and draw(st.integers(0, 9)) == 0:
        flat = x.view(-1)
        flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    return x.to(dtype)


def run(api: str, case: dict, call, outputs: dict[str, Guarded], inputs: dict[str, Guarded]):
    """Call; check the error type or the guards. Returns True when the call returned."""
    log_case(api, case)
    try:
        result = call()
    except EXPECTED as e:
        for name, g in {**outputs, **inputs}.items():
            # A refused call wrote nothing (the host backend checks every index first).
            g.check(name, written=False)
        if not str(e):
            raise CaseFailed(f"{api}: {type(e).__name__} without a message") from e
        return None
    except Exception as e:
        raise CaseFailed(f"{api}: unexpected {type(e).__name__}: {e}") from e
    for name, g in outputs.items():
        g.check(name, written=True)
    for name, g in inputs.items():
        g.check(name, written=False)
    return result if result is not None else True


def close(out: torch.Tensor, ref: torch.Tensor, dtype, what: str) -> None:
    tol = {torch.float32: 2e-4, torch.float16: 6e-3, torch.bfloat16: 4e-2}[dtype]
    finite = ref.isfinite()
    if not torch.allclose(out.double()[finite], ref.double()[finite], rtol=tol, atol=tol):
        raise CaseFailed(f"{what}: result differs from the reference")


PROFILE = dict(
    deadline=None,
    database=None,
    derandomize=True,
    print_blob=False,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def examples() -> int:
    return int(os.environ.get("KILN_TEST_FUZZ_EXAMPLES", "50"))


# --- norm ----------------------------------------------------------------------------------------


@st.composite
def norm_case(draw):
    dtype = draw(st.sampled_from(NORM_DTYPES))
    rows, hidden = draw(st.integers(0, 9)), draw(st.integers(1, 300))
    w_dtype = dtype if draw(st.integers(0, 7)) else draw(st.sampled_from(NORM_DTYPES + [torch.float64]))
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.0, -1.0, math.nan]))
    return (
        dtype,
        rows,
        hidden,
        w_dtype,
        eps,
        draw(st.sampled_from(["new", "out", "inplace", "expanded"])),
        draw(st.booleans()),
        draw(st.data()),
    )


def fuzz_rmsnorm():
    @settings(max_examples=examples(), **PROFILE)
    @given(norm_case())
    def case(args):
        dtype, rows, hidden, w_dtype, eps, out_kind, gemma, data = args
        x = guarded(floats(data.draw, (rows, hidden), dtype), data.draw)
        w = guarded(floats(data.draw, (hidden,), w_dtype, specials=False), data.draw)
        api = kiln.gemma_rmsnorm if gemma else kiln.rmsnorm
        outputs, out = {}, None
        if out_kind == "out":
            g = guarded(torch.zeros(rows, hidden, dtype=dtype), data.draw)
            outputs, out = {"out": g}, g.view
        elif out_kind == "expanded" and rows > 1:
            out = torch.zeros(1, hidden, dtype=dtype).expand(rows, hidden)
        elif out_kind == "inplace":
            outputs, out = {"input": x}, x.view
        x_before = x.view.clone()
        info = {
            "dtype": str(dtype),
            "rows": rows,
            "hidden": hidden,
            "w": str(w_dtype),
            "eps": eps,
            "out": out_kind,
            "gemma": gemma,
        }
        result = run(
            "rmsnorm",
            info,
            lambda: api(x.view, w.view, eps=eps, out=out),
            outputs,
            {} if out_kind == "inplace" else {"input": x, "weight": w},
        )
        if isinstance(result, torch.Tensor) and w_dtype == dtype and eps >= 0:
            ref = rms_norm_float64(x_before, w.view, eps, 1.0 if gemma else 0.0)
            close(result, ref, dtype, "rmsnorm")

    case()


def fuzz_fused_add_rmsnorm():
    @settings(max_examples=examples(), **PROFILE)
    @given(norm_case())
    def case(args):
        dtype, rows, hidden, w_dtype, eps, kind, gemma, data = args
        x = guarded(floats(data.draw, (rows, hidden), dtype), data.draw)
        r = guarded(floats(data.draw, (rows, hidden), dtype), data.draw)
        w = guarded(floats(data.draw, (hidden,), w_dtype, specials=False), data.draw)
        residual = r.view
        if kind == "expanded" and rows > 1:
            residual = r.view[:1].expand(rows, hidden)
        elif kind == "inplace":
            residual = x.view
        api = kiln.gemma_fused_add_rmsnorm if gemma else kiln.fused_add_rmsnorm
        x0, r0 = x.view.clone(), r.view.clone()
        info = {
            "dtype": str(dtype),
            "rows": rows,
            "hidden": hidden,
            "w": str(w_dtype),
            "eps": eps,
            "residual": kind,
            "gemma": gemma,
        }
        done = run(
            "fused_add_rmsnorm",
            info,
            lambda: api(x.view, residual, w.view, eps=eps),
            {"input": x, "residual": r},
            {"weight": w},
        )
        if done is not None and w_dtype == dtype and eps >= 0 and kind in ("new", "out"):
            summed = (x0.float() + r0.float()).to(dtype)
            close(r.view, summed.double(), dtype, "fused_add_rmsnorm residual")
            close(
                x.view,
                rms_norm_float64(summed, w.view, eps, 1.0 if gemma else 0.0),
                dtype,
                "fused_add_rmsnorm",
            )

    case()


# --- paged attention -----------------------------------------------------------------------------


@st.composite
def page_table(draw, batch: int, page_size: int):
    """(kv_lens, indptr, indices, last_page_len, pool, corrupt) with optional corruptions."""
    kv_lens = [draw(st.integers(0, 40)) for _ in range(batch)]
    pages = [-(-n // page_size) for n in kv_lens]
    pool = sum(pages) + draw(st.integers(0, 3))
    perm = torch.randperm(max(pool, 1), generator=torch.Generator().manual_seed(draw(st.integers(0, 999))))
    indices = perm[: sum(pages)].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(pages, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor(
        [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages, strict=True)], dtype=torch.int32
    )
    corrupt = draw(
        st.sampled_from(
            ["none"] * 4
            + ["page_high", "page_negative", "indptr_down", "last_zero", "last_high", "float_indptr"]
        )
    )
    if corrupt in ("page_high", "page_negative") and indices.numel():
        indices[draw(st.integers(0, indices.numel() - 1))] = pool + 5 if corrupt == "page_high" else -3
    elif corrupt == "indptr_down" and batch > 1:
        indptr[1] = indptr[2] + 1
    elif corrupt == "last_zero" and batch:
        last[0] = 0
    elif corrupt == "last_high" and batch:
        last[0] = page_size + 3
    return kv_lens, indptr, indices, last, pool, corrupt


@st.composite
def decode_case(draw):
    batch, page_size = draw(st.integers(0, 4)), draw(st.integers(1, 17))
    table = draw(page_table(batch, page_size))
    hk, group = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 3]))
    return dict(
        batch=batch,
        page_size=page_size,
        table=table,
        hk=hk,
        hq=hk * group,
        head_dim=draw(st.sampled_from(HEAD_DIMS + [48])),
        dtype=draw(st.sampled_from(FLOATS)),
        layout=draw(st.sampled_from(["NHD", "HND"])),
        soft_cap=draw(st.sampled_from([None, 0.0, 30.0, -5.0])),
        window=draw(st.sampled_from([-1, 0, 5, -5])),
        data=draw(st.data()),
    )


def _cache(c, data):
    pool, d = c["table"][4], c["head_dim"]
    inner = (c["page_size"], c["hk"], d) if c["layout"] == "NHD" else (c["hk"], c["page_size"], d)
    both = guarded(floats(data.draw, (max(pool, 1), 2, *inner), c["dtype"], specials=False), data.draw)
    return both


def _keys(both, indptr, indices, kv_lens, b, layout):
    k, v = both.view[:, 0], both.view[:, 1]
    pages = indices[int(indptr[b]) : int(indptr[b + 1])].long()
    k, v = k[pages], v[pages]
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    h, d = k.shape[-2], k.shape[-1]
    return k.reshape(-1, h, d)[: kv_lens[b]], v.reshape(-1, h, d)[: kv_lens[b]]


def fuzz_decode():
    @settings(max_examples=examples(), **PROFILE)
    @given(decode_case())
    def case(c):
        data = c.pop("data")
        kv_lens, indptr, indices, last, pool, corrupt = c["table"]
        both = _cache(c, data)
        if corrupt == "float_indptr":
            indptr = indptr.float()
        q = guarded(floats(data.draw, (c["batch"], c["hq"], c["head_dim"]), c["dtype"]), data.draw)
        out = guarded(torch.zeros(c["batch"], c["hq"], c["head_dim"], dtype=c["dtype"]), data.draw)
        lse = guarded(torch.zeros(c["batch"], c["hq"]), data.draw)
        info = {k: v for k, v in c.items() if k != "table"} | {"kv_lens": kv_lens, "corrupt": corrupt}

        def call():
            w = kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), c["layout"])
            w.plan(
                indptr,
                indices,
                last,
                c["hq"],
                c["hk"],
                c["head_dim"],
                c["page_size"],
                logits_soft_cap=c["soft_cap"],
                window_left=c["window"],
                q_data_type=c["dtype"],
            )
            return w.run(
                q.view, (both.view[:, 0], both.view[:, 1]), out=out.view, lse=lse.view, return_lse=True
            )

        done = run("batch_decode", info, call, {"out": out, "lse": lse}, {"q": q, "cache": both})
        if (
            done is not None
            and corrupt == "none"
            and c["soft_cap"] in (None, 0.0)
            and q.view.isfinite().all()
        ):
            for b in range(c["batch"]):
                k, v = _keys(both, indptr, indices, kv_lens, b, c["layout"])
                ref, _ = attention(q.view[b : b + 1], k, v, window_left=c["window"])
                close(out.view[b], ref[0], c["dtype"], "batch_decode")

    case()


@st.composite
def prefill_case(draw):
    c = draw(decode_case())
    c["qo_lens"] = [draw(st.integers(0, n + 1)) for n in c["table"][0]]
    c["causal"] = draw(st.booleans())
    c["ragged"] = draw(st.booleans())
    return c


def fuzz_prefill():
    @settings(max_examples=examples(), **PROFILE)
    @given(prefill_case())
    def case(c):
        data = c.pop("data")
        kv_lens, indptr, indices, last, pool, corrupt = c["table"]
        qo = c["qo_lens"]
        qo_indptr = torch.tensor(
            [0, *torch.tensor(qo, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32
        )
        total = int(qo_indptr[-1])
        q = guarded(floats(data.draw, (total, c["hq"], c["head_dim"]), c["dtype"]), data.draw)
        out = guarded(torch.zeros(total, c["hq"], c["head_dim"], dtype=c["dtype"]), data.draw)
        info = {k: v for k, v in c.items() if k != "table"} | {"kv_lens": kv_lens, "corrupt": corrupt}
        if c["ragged"]:
            kv_indptr = torch.tensor(
                [0, *torch.tensor(kv_lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32
            )
            if corrupt == "indptr_down" and len(kv_lens) > 1:
                kv_indptr[1] = kv_indptr[2] + 1
            k = guarded(
                floats(data.draw, (sum(kv_lens), c["hk"], c["head_dim"]), c["dtype"], False), data.draw
            )
            v = guarded(
                floats(data.draw, (sum(kv_lens), c["hk"], c["head_dim"]), c["dtype"], False), data.draw
            )

            def call():
                w = kiln.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
                w.plan(
                    qo_indptr,
                    kv_indptr,
                    c["hq"],
                    c["hk"],
                    c["head_dim"],
                    causal=c["causal"],
                    window_left=c["window"],
                    logits_soft_cap=c["soft_cap"],
                    q_data_type=c["dtype"],
                )
                return w.run(q.view, k.view, v.view, out=out.view)

            run("batch_prefill_ragged", info, call, {"out": out}, {"q": q, "k": k, "v": v})
            return
        both = _cache(c, data)

        def call():
            w = kiln.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), c["layout"])
            w.plan(
                qo_indptr,
                indptr,
                indices,
                last,
                c["hq"],
                c["hk"],
                c["head_dim"],
                c["page_size"],
                causal=c["causal"],
                window_left=c["window"],
                logits_soft_cap=c["soft_cap"],
                q_data_type=c["dtype"],
            )
            return w.run(q.view, (both.view[:, 0], both.view[:, 1]), out=out.view)

        done = run("batch_prefill", info, call, {"out": out}, {"q": q, "cache": both})
        if (
            done is not None
            and corrupt == "none"
            and c["soft_cap"] in (None, 0.0)
            and q.view.isfinite().all()
        ):
            for b in range(len(kv_lens)):
                k, v = _keys(both, indptr, indices, kv_lens, b, c["layout"])
                lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
                if hi > lo and qo[b] <= kv_lens[b]:
                    ref, _ = attention(q.view[lo:hi], k, v, causal=c["causal"], window_left=c["window"])
                    close(out.view[lo:hi], ref, c["dtype"], "batch_prefill")

    case()


def fuzz_single():
    @settings(max_examples=examples(), **PROFILE)
    @given(
        st.integers(0, 30),
        st.integers(0, 30),
        st.sampled_from([(2, 2), (4, 2), (3, 2)]),
        st.sampled_from(HEAD_DIMS + [32]),
        st.sampled_from(FLOATS + [torch.float32]),
        st.sampled_from(["NHD", "HND", "HDN"]),
        st.booleans(),
        st.data(),
    )
    def case(qo, kv, heads, d, dtype, layout, causal, data):
        hq, hk = heads
        shape = (kv, hk, d) if layout != "HND" else (hk, kv, d)
        k = guarded(floats(data.draw, shape, dtype), data.draw)
        v = guarded(floats(data.draw, shape, dtype), data.draw)
        q1 = guarded(floats(data.draw, (hq, d), dtype), data.draw)
        q2 = guarded(floats(data.draw, (qo, hq, d), dtype), data.draw)
        info = {"qo": qo, "kv": kv, "heads": heads, "d": d, "dtype": str(dtype), "layout": layout}
        run(
            "single_decode",
            info,
            lambda: kiln.single_decode_with_kv_cache(q1.view, k.view, v.view, kv_layout=layout),
            {},
            {"q": q1, "k": k, "v": v},
        )
        run(
            "single_prefill",
            info,
            lambda: kiln.single_prefill_with_kv_cache(
                q2.view, k.view, v.view, causal=causal, kv_layout=layout
            ),
            {},
            {"q": q2, "k": k, "v": v},
        )

    case()


def fuzz_merge():
    @settings(max_examples=examples(), **PROFILE)
    @given(
        st.integers(0, 6),
        st.integers(1, 4),
        st.integers(1, 3),
        st.sampled_from(HEAD_DIMS + [40]),
        st.sampled_from(FLOATS + [torch.float32]),
        st.sampled_from(["apart", "alias", "mask", "bad_mask"]),
        st.data(),
    )
    def case(seq, states, heads, d, dtype, kind, data):
        v = guarded(floats(data.draw, (seq, states, heads, d), dtype), data.draw)
        s = guarded(floats(data.draw, (seq, states, heads), torch.float32) * 4, data.draw)
        info = {"seq": seq, "states": states, "heads": heads, "d": d, "dtype": str(dtype), "kind": kind}
        result = run("merge_states", info, lambda: kiln.merge_states(v.view, s.view), {}, {"v": v, "s": s})
        if isinstance(result, tuple) and bool(s.view.isfinite().all()) and bool(v.view.isfinite().all()):
            ref_v, _ = merge_float(v.view, s.view)
            close(result[0], ref_v, dtype, "merge_states")
        a = guarded(floats(data.draw, (seq, heads, d), dtype), data.draw)
        sa = guarded(floats(data.draw, (seq, heads), torch.float32), data.draw)
        b = guarded(floats(data.draw, (seq, heads, d), dtype), data.draw)
        sb = guarded(floats(data.draw, (seq, heads), torch.float32), data.draw)
        mask = None
        if kind == "mask":
            mask = torch.rand(seq, generator=torch.Generator().manual_seed(seq)) < 0.5
        elif kind == "bad_mask":
            mask = torch.ones(seq + 1, dtype=torch.bool)
        other, other_s = (a, sa) if kind == "alias" else (b, sb)
        run(
            "merge_state_in_place",
            info,
            lambda: kiln.merge_state_in_place(a.view, sa.view, other.view, other_s.view, mask),
            {"v": a, "s": sa},
            {} if kind == "alias" else {"v_other": b, "s_other": sb},
        )

    case()


@st.composite
def append_case(draw):
    c = draw(decode_case())
    nnz = draw(st.integers(0, 6))
    batch = c["batch"]
    c["bi"] = [
        draw(st.integers(-2, batch + 1))
        if draw(st.integers(0, 5)) == 0
        else (draw(st.integers(0, batch - 1)) if batch else 0)
        for _ in range(nnz)
    ]
    c["pos"] = [draw(st.integers(-2, 45)) for _ in range(nnz)]
    return c


def fuzz_append():
    @settings(max_examples=examples(), **PROFILE)
    @given(append_case())
    def case(c):
        data = c.pop("data")
        kv_lens, indptr, indices, last, pool, corrupt = c["table"]
        both = _cache(c, data)
        nnz = len(c["bi"])
        key = guarded(floats(data.draw, (nnz, c["hk"], c["head_dim"]), c["dtype"]), data.draw)
        value = guarded(floats(data.draw, (nnz, c["hk"], c["head_dim"]), c["dtype"]), data.draw)
        bi, pos = torch.tensor(c["bi"], dtype=torch.int32), torch.tensor(c["pos"], dtype=torch.int32)
        if corrupt == "float_indptr":
            indptr = indptr.float()
        info = {k: v for k, v in c.items() if k != "table"} | {"kv_lens": kv_lens, "corrupt": corrupt}
        run(
            "append_paged_kv_cache",
            info,
            lambda: kiln.append_paged_kv_cache(
                key.view, value.view, bi, pos, both.view, indices, indptr, last, kv_layout=c["layout"]
            ),
            {"cache": both},
            {"key": key, "value": value},
        )

    case()


def fuzz_positions():
    @settings(max_examples=examples(), **PROFILE)
    @given(
        st.lists(st.integers(-2, 6), max_size=5),
        st.lists(st.integers(-1, 12), max_size=6),
        st.integers(-1, 20),
        st.booleans(),
    )
    def case(steps, seqs, nnz, int64):
        indptr = torch.tensor([0, *torch.tensor(steps, dtype=torch.int64).cumsum(0).tolist()])
        seq = torch.tensor(seqs, dtype=torch.int64)
        if not int64:
            indptr, seq = indptr.int(), seq.int()
        consistent = (
            len(seqs) == len(steps)
            and all(x >= 0 for x in steps)
            and 0 <= int(indptr[-1]) <= nnz  # tokens past indptr[-1] are padding (CUDA-graph sizes)
            and all(s_ >= n for s_, n in zip(seqs, steps, strict=True))
        )
        info = {"indptr": indptr.tolist(), "seq": seqs, "nnz": nnz}
        result = run(
            "get_batch_indices_positions",
            info,
            lambda: kiln.get_batch_indices_positions(indptr, seq, nnz),
            {},
            {},
        )
        if consistent != isinstance(result, tuple):
            raise CaseFailed(f"get_batch_indices_positions: {'refused' if consistent else 'accepted'} {info}")
        if consistent:
            from kiln.trace.attention import batch_indices_positions_reference

            ref = batch_indices_positions_reference(indptr, seq, nnz)
            if not (
                torch.equal(result[0], ref["batch_indices"]) and torch.equal(result[1], ref["positions"])
            ):
                raise CaseFailed("get_batch_indices_positions: differs from the reference")

    case()


FUZZERS = {
    "rmsnorm": fuzz_rmsnorm,
    "fused_add_rmsnorm": fuzz_fused_add_rmsnorm,
    "decode": fuzz_decode,
    "prefill": fuzz_prefill,
    "single": fuzz_single,
    "merge": fuzz_merge,
    "append": fuzz_append,
    "positions": fuzz_positions,
}


def main(argv: list[str]) -> int:
    torch.manual_seed(0)
    chosen = argv or list(FUZZERS)
    try:
        for name in chosen:
            FUZZERS[name]()
    except Exception:
        traceback.print_exc()
        print("FUZZ COUNTS " + json.dumps(counts), flush=True)
        return 1
    print("FUZZ COUNTS " + json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
