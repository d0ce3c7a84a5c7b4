"""Out-of-range page ids under compute-sanitizer's memcheck: decode (also split over the GPU, so
the in-launch merge of its partial slots runs), prefill (both kernels) and append (decode and
append also over an fp8 cache) each get a page table with a page id past the cache. The kernels
must make no out-of-bounds
access at all (the sanitizer reports zero errors) and the call must end in a clear Python error
naming the argument, the value and the valid range (kiln.check_errors)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

CASE = r"""
import sys, torch, kiln
dev = torch.device("cuda")
which = sys.argv[1]
pages, page, hk, hq, d = 8, 16, 2, 4, 128
k = torch.randn(pages, page, hk, d, device=dev, dtype=torch.bfloat16)
v = torch.randn_like(k)
indptr = torch.tensor([0, 2], dtype=torch.int32, device=dev)
bad = torch.tensor([3, 1 << 20], dtype=torch.int32, device=dev)  # the second page id is past the cache
last = torch.tensor([16], dtype=torch.int32, device=dev)
ws = torch.empty(16 << 20, dtype=torch.uint8, device=dev)
fp8 = which.endswith("_fp8")
if fp8:
    which = which.removesuffix("_fp8")
    k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
scales = dict(k_scale=0.5, v_scale=0.25) if fp8 else {}
if which == "decode_split":  # 300 pages, one request: split-KV, the bad id in one chunk
    k = torch.randn(320, page, hk, d, device=dev, dtype=torch.bfloat16)
    ids = torch.arange(300, dtype=torch.int32, device=dev)
    ids[150] = 1 << 20
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(torch.tensor([0, 300], dtype=torch.int32), ids, last, hq, hk, d, page, q_data_type=torch.bfloat16)
    assert w.plan_info["partial_slots"] > 1, w.plan_info
    out = w.run(torch.randn(1, hq, d, device=dev, dtype=torch.bfloat16), (k, torch.randn_like(k)))
    assert out.isnan().all(), "a poisoned chunk must make the merged rows NaN"
elif which == "decode":
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, bad, last, hq, hk, d, page, q_data_type=torch.bfloat16, kv_data_type=k.dtype)
    out = w.run(torch.randn(1, hq, d, device=dev, dtype=torch.bfloat16), (k, v), **scales)
elif which in ("prefill_fa2", "prefill_fa3"):
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, backend=which.split("_")[1])
    w.plan(torch.tensor([0, 20], dtype=torch.int32), indptr, bad, last, hq, hk, d, page, causal=True,
           q_data_type=torch.bfloat16)
    out = w.run(torch.randn(20, hq, d, device=dev, dtype=torch.bfloat16), (k, v))
elif which == "prefill_fa3_page1":  # the sm90a kernel's gather producer (pages under 16 tokens)
    k1, v1 = k.view(pages * page, 1, hk, d), v.view(pages * page, 1, hk, d)
    ids = torch.arange(20, dtype=torch.int32, device=dev)
    ids[1] = 1 << 20
    w = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, backend="fa3")
    one_request = torch.tensor([0, 20], dtype=torch.int32)
    last1 = torch.ones(1, dtype=torch.int32, device=dev)
    w.plan(one_request, one_request.to(dev), ids, last1, hq, hk, d, 1, causal=True,
           q_data_type=torch.bfloat16)
    out = w.run(torch.randn(20, hq, d, device=dev, dtype=torch.bfloat16), (k1, v1))
elif which == "append":
    key = torch.randn(1, hk, d, device=dev, dtype=torch.bfloat16)
    kiln.append_paged_kv_cache(key, key.clone(), torch.zeros(1, dtype=torch.int32, device=dev),
                               torch.tensor([20], dtype=torch.int32, device=dev), (k, v), bad, indptr, last,
                               **scales)
    out = None
torch.cuda.synchronize()
if out is not None:
    assert out.isnan().any(), "the work of the bad page was not skipped"
try:
    kiln.check_errors()
except kiln.DeviceIndexError as e:
    print("PYTHON ERROR:", e)
    sys.exit(0)
print("NO ERROR REPORTED")
sys.exit(3)
"""


@pytest.mark.gpu
@pytest.mark.parametrize(
    "which",
    ["decode", "decode_split", "prefill_fa2", "prefill_fa3", "prefill_fa3_page1", "append", "decode_fp8",
     "append_fp8"],
)
def test_a_bad_page_id_makes_no_out_of_bounds_access_and_a_clear_error(which, tmp_path):
    import torch

    if which.startswith("prefill_fa3") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the fa3 kernel runs on compute capability 9.0 only")
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not on PATH")
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, KILN_PREFILL_FA3_STRICT="1")
    command = [sanitizer, "--tool", "memcheck", "--error-exitcode", "9", sys.executable, "-c", CASE, which]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    summary = re.search(r"ERROR SUMMARY: (\d+) error", out)
    assert summary and summary[1] == "0", out[-4000:]
    assert proc.returncode == 0, out[-4000:]
    entry = 150 if which == "decode_split" else 1
    message = f"kv_indices[{entry}] = 1048576 is not a page of the cache"
    assert "PYTHON ERROR:" in out and message in out, out[-4000:]
    pages = {"prefill_fa3_page1": 128, "decode_split": 320}.get(which, 8)
    assert f"[0, {pages})" in out
