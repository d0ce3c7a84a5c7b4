"""Grouped GEMM in Triton (//ops/gemm:grouped, toolchain triton): torch._grouped_mm's MoE form,
2-D a [rows, k] x 3-D b [groups, k, n], group g = rows [offs[g-1], offs[g]) of a (offs[-1] = 0),
out[rows of g] = a[rows of g] @ b[g], float32 accumulation. The way vLLM's and SGLang's fused-MoE
Triton kernels tile it: one program per (BLOCK_M rows of one group, BLOCK_N columns).

Grid: (cdiv(rows, BLOCK_M) + groups, cdiv(n, BLOCK_N)). The row tiles of all groups together
number at most cdiv(rows, BLOCK_M) + groups (each group wastes at most one partial tile), so the
grid is known on the host without reading offs (no sync); a program finds its group from offs
(_find_tile: one vector load and two scans for up to 256 groups, else a scalar walk) and exits
when it has none.

Layouts: any strides (elements, int64) for a, b and out: b column-major per group (the transpose
view of [groups, n, k], as MoE weights are held) or row-major. Memory safety for any offs: each
end is clamped to [previous end, rows] before use, so no program reads or writes a row outside
[0, rows) (the Python API checks offs itself under KILN_VALIDATE_INDICES=1; docs/gemm.md).

Entry points: grouped_mm_kernel (out in a's dtype) and grouped_mm_f32_kernel (float32 out), two
instances of one body. Compiled by kiln's triton toolchain (runtime/triton_build.py), never by
Triton's JIT: this file is read in place, and its signatures and tile constants are in BUILD.py.
"""

import triton
import triton.language as tl

# Up to this many groups, a program finds its tile with one vector load of offs and two scans;
# beyond it, with a scalar walk over the groups (the same result).
GROUP_SCAN = tl.constexpr(256)


@triton.jit
def _running_max(x, y):
    return tl.maximum(x, y)


@triton.jit
def _find_tile(offs, rows, groups, pid_m, BLOCK_M: tl.constexpr):
    """(group, first row, end row) of row tile `pid_m`, group -1 for a spare tile. Group g's rows
    are [end(g-1), end(g)) with end(g) = min(max(offs[0..g], 0), rows): offs clamped into
    [previous end, rows], so a bad offs can never move a tile outside [0, rows)."""
    if groups <= GROUP_SCAN:
        idx = tl.arange(0, GROUP_SCAN)
        raw = tl.load(offs + idx, mask=idx < groups, other=0)
        raw_prev = tl.load(offs + idx - 1, mask=(idx > 0) & (idx < groups), other=0)
        ends = tl.minimum(tl.associative_scan(tl.maximum(raw, 0), 0, _running_max), rows)
        prevs = tl.minimum(tl.associative_scan(tl.maximum(raw_prev, 0), 0, _running_max), rows)
        counts = tl.where(idx < groups, tl.cdiv(ends - prevs, BLOCK_M), 0)  # no tiles past groups
        tiles_end = tl.cumsum(counts, 0)
        tiles_start = tiles_end - counts
        hit = (pid_m >= tiles_start) & (pid_m < tiles_end)
        group = tl.max(tl.where(hit, idx, -1), 0)
        row0 = tl.sum(tl.where(hit, prevs + (pid_m - tiles_start) * BLOCK_M, 0), 0)
        row_end = tl.sum(tl.where(hit, ends, 0), 0)
    else:
        group = -1
        row0 = 0
        row_end = 0
        tiles = 0
        prev = 0
        for g in range(0, groups):
            end = tl.minimum(tl.maximum(tl.load(offs + g), prev), rows)
            count = tl.cdiv(end - prev, BLOCK_M)
            hit = (pid_m >= tiles) & (pid_m < tiles + count)
            group = tl.where(hit, g, group)
            row0 = tl.where(hit, prev + (pid_m - tiles) * BLOCK_M, row0)
            row_end = tl.where(hit, end, row_end)
            tiles += count
            prev = end
    return group, row0, row_end


@triton.jit
def _grouped_mm_body(
    a,
    b,
    out,
    offs,
    rows,
    n,
    k,
    groups,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_om,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    group, row0, row_end = _find_tile(offs, rows, groups, pid_m, BLOCK_M)
    if group < 0:  # a spare tile: no group has it
        return
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < row_end
    mask_n = rn < n
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    a_ptrs = a + rm64[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b + group.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn64[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(k, BLOCK_K)):
        k_left = k - kk * BLOCK_K
        av = tl.load(a_ptrs, mask=mask_m[:, None] & (rk[None, :] < k_left), other=0.0)
        bv = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(av, bv, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    o_ptrs = out + rm64[:, None] * stride_om + rn64[None, :] * stride_on
    tl.store(o_ptrs, acc.to(out.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def grouped_mm_kernel(
    a,
    b,
    out,
    offs,
    rows,
    n,
    k,
    groups,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_om,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    _grouped_mm_body(
        a,
        b,
        out,
        offs,
        rows,
        n,
        k,
        groups,
        stride_am,
        stride_ak,
        stride_bg,
        stride_bk,
        stride_bn,
        stride_om,
        stride_on,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )


@triton.jit
def grouped_mm_f32_kernel(
    a,
    b,
    out,
    offs,
    rows,
    n,
    k,
    groups,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_om,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    _grouped_mm_body(
        a,
        b,
        out,
        offs,
        rows,
        n,
        k,
        groups,
        stride_am,
        stride_ak,
        stride_bg,
        stride_bk,
        stride_bn,
        stride_om,
        stride_on,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
