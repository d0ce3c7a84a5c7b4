"""kiln.cutlass_fused_moe's FlashInfer 0.7.2 arguments against a float32 reference written per token
(tests/moe_helpers.py cutlass_reference), on the host backend always and on CUDA where a device is:
every ActivationType (with per-expert parameters, on the decode-size and the grouped path, odd and
16-byte multiple intermediate sizes), fc1 / fc2 biases, expert parallelism (ranks sum to the
layer; other ranks' ids add nothing), tensor parallelism (slices sum to the layer), the per-tensor
fp8 form (e4m3 input), DeepSeek block scales on the generic path, workspace_buffer (its size
covers every call up to max_num_tokens, bit-equal results, nothing allocated on the GPU), the
kernel's bad offs, bad inputs matched by message, torch.compile and CUDA-graph replay; and each
path's error against a float64 layer, every ActivationType in fp16 and bf16, pinned to that of its
rounding sequence (the activation fused into the decode-size kernel: fc1's output never rounded)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import device_params
from moe_helpers import cutlass_reference

import kiln
from kiln.moe import ActivationType
from kiln.trace.moe import dequantize, expert_act_float, group_dequantized, layer_weights, random_ids

DEVICES = device_params()
BF16 = torch.bfloat16
# bf16 layer tolerance (docs/moe.md): fc1's output, the activation and fc2's output are rounded to
# bf16 (2^-9 relative each), the k-way sum is float32; outputs are ~N(0, 1).
TOL = (2e-2, 2e-2)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def up_first(w13, gated=True):
    """layer_weights' gate-first [E, 2I, H] as cutlass_fused_moe's fc1 (up rows first)."""
    if not gated:
        return w13[:, : w13.shape[1] // 2].contiguous()
    i = w13.shape[1] // 2
    return torch.cat([w13[:, i:], w13[:, :i]], dim=1)


def case(e, k, h, i, t, device, seed, gated=True, dtype=BF16):
    g = gen(seed)
    w13, w2 = layer_weights(e, h, i, dtype, "cpu", g)
    x = torch.randn((t, h), generator=g).to(dtype)
    ids = random_ids(t, e, k, g)
    w = torch.rand((t, k), generator=g)
    w = w / w.sum(-1, keepdim=True)
    return [v.to(device) for v in (x, up_first(w13, gated), w2, w, ids.to(torch.int32))]


def check(out, ref, tol=TOL):
    assert out.isfinite().all()
    torch.testing.assert_close(out.float().cpu(), ref, rtol=tol[0], atol=tol[1])


def per_expert(e, lo, hi, seed):
    return (lo + (hi - lo) * torch.rand(e, generator=gen(seed))).float()


# (ActivationType, kiln kind, FlashInfer keyword arguments -> per-expert tensors, the reference's
# parameters p0..p2): every activation kiln computes, with and without its parameters.
E = 4
ACTS = [
    ("swiglu", ActivationType.Swiglu, {}, (1.0, 0.0, math.inf)),
    (
        "swiglu_bias",
        ActivationType.Swiglu,
        {"swiglu_alpha": (0.5, 2.0), "swiglu_beta": (-0.5, 0.5), "swiglu_limit": (0.5, 2.0)},
        None,
    ),
    ("swiglubias_type", ActivationType.SwigluBias, {"swiglu_alpha": (1.0, 1.702)}, None),
    ("swiglu_step", ActivationType.SwigluStep, {}, (0.0, 0.0, 7.0)),
    ("swiglu_step_limit", ActivationType.SwigluStep, {"swiglu_limit": (0.2, 1.0)}, None),
    ("geglu", ActivationType.Geglu, {}, (0.0, 0.0, 0.0)),
    ("geglu_tanh", ActivationType.GegluTanh, {}, (0.0, 0.0, 0.0)),
    ("situ", ActivationType.Situ, {}, (4.0, 25.0, math.inf)),
    ("situ_params", ActivationType.Situ, {"situ_beta": (0.5, 3.0), "situ_linear_beta": (0.5, 2.0)}, None),
    ("gelu", ActivationType.Gelu, {}, (0.0, 0.0, 0.0)),
    ("relu", ActivationType.Relu, {}, (0.0, 0.0, 0.0)),
    ("silu", ActivationType.Silu, {}, (0.0, 0.0, 0.0)),
    ("relu2", ActivationType.Relu2, {}, (0.0, 0.0, 0.0)),
    ("identity", ActivationType.Identity, {}, (0.0, 0.0, 0.0)),
]
KINDS = {
    ActivationType.Swiglu: "swiglu",
    ActivationType.SwigluBias: "swiglu",
    ActivationType.SwigluStep: "swiglu_step",
    ActivationType.Geglu: "geglu",
    ActivationType.GegluTanh: "geglu_tanh",
    ActivationType.Situ: "situ",
    ActivationType.Gelu: "gelu",
    ActivationType.Relu: "relu",
    ActivationType.Silu: "silu",
    ActivationType.Relu2: "relu2",
    ActivationType.Identity: "identity",
    ActivationType.ClampedRelu2: "clamped_relu2",
}
SLOTS = {
    "swiglu_alpha": 0,
    "swiglu_beta": 1,
    "swiglu_limit": 2,
    "situ_beta": 0,
    "situ_linear_beta": 1,
}
DEFAULTS = {
    ActivationType.Swiglu: [1.0, 0.0, math.inf],
    ActivationType.SwigluBias: [1.0, 0.0, math.inf],
    ActivationType.SwigluStep: [0.0, 0.0, 7.0],
    ActivationType.Situ: [4.0, 25.0, math.inf],
}


def act_args(a, kwargs, device, seed):
    """(cutlass_fused_moe's keyword tensors, the reference's p0..p2)."""
    given, params = {}, list(DEFAULTS.get(a, [0.0, 0.0, 0.0]))
    for n, (lo, hi) in kwargs.items():
        v = per_expert(E, lo, hi, seed + SLOTS[n])
        given[n] = v.to(device)
        params[SLOTS[n]] = v.tolist()
    return given, tuple(params)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [5, 70], ids=["small-batch", "grouped"])
@pytest.mark.parametrize("i", [48, 45])
@pytest.mark.parametrize("name, a, kwargs, _", ACTS, ids=[c[0] for c in ACTS])
def test_every_activation_type_against_the_reference(device, t, i, name, a, kwargs, _):
    x, fc1, fc2, w, ids = case(E, 2, 64, i, t, device, 3, gated=a.is_gated)
    given, params = act_args(a, kwargs, device, 5)
    out = kiln.cutlass_fused_moe(x, ids, w, fc1, fc2, BF16, activation_type=a, **given)[0]
    check(out, cutlass_reference(x, fc1, fc2, w, ids, KINDS[a], params))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [5, 70], ids=["small-batch", "grouped"])
def test_clamped_relu2_and_its_limit(device, t):
    x, fc1, fc2, w, ids = case(E, 2, 64, 48, t, device, 4, gated=False)
    limit = torch.tensor([0.75], device=device)
    out = kiln.cutlass_fused_moe(
        x, ids, w, fc1, fc2, BF16, activation_type=ActivationType.ClampedRelu2, clamped_relu2_limit=limit
    )[0]
    check(out, cutlass_reference(x, fc1, fc2, w, ids, "clamped_relu2", (0.0, 0.0, 0.75)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [5, 70], ids=["small-batch", "grouped"])
@pytest.mark.parametrize("a", [ActivationType.Swiglu, ActivationType.Relu2], ids=["swiglu", "relu2"])
def test_fc1_and_fc2_biases(device, t, a):
    x, fc1, fc2, w, ids = case(E, 2, 64, 48, t, device, 6, gated=a.is_gated)
    g = gen(7)
    b1 = (0.5 * torch.randn(fc1.shape[:2], generator=g)).to(BF16).to(device)
    b2 = (0.5 * torch.randn((E, 64), generator=g)).to(BF16).to(device)
    out = kiln.cutlass_fused_moe(x, ids, w, fc1, fc2, BF16, None, b1, b2, activation_type=a)[0]
    check(out, cutlass_reference(x, fc1, fc2, w, ids, KINDS[a], DEFAULTS.get(a, (0.0, 0.0, 0.0)), b1, b2))
    only2 = kiln.cutlass_fused_moe(x, ids, w, fc1, fc2, BF16, fc2_expert_biases=b2, activation_type=a)[0]
    check(only2, cutlass_reference(x, fc1, fc2, w, ids, KINDS[a], DEFAULTS.get(a, (0.0, 0.0, 0.0)), b2=b2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [5, 70], ids=["small-batch", "grouped"])
def test_expert_parallel_ranks_sum_to_the_layer(device, t):
    """8 global experts on 4 ranks of 2: each rank's output is its experts' share (the reference
    restricted to them), -1 ids add nothing anywhere, and the ranks sum to the whole layer."""
    total, ep = 8, 4
    x, fc1, fc2, w, ids = case(total, 3, 64, 48, t, device, 8)
    ids[0, 0] = -1
    outs = []
    for rank in range(ep):
        lo = rank * (total // ep)
        local = (fc1[lo : lo + 2], fc2[lo : lo + 2])
        out = kiln.cutlass_fused_moe(x, ids, w, *local, BF16, ep_size=ep, ep_rank=rank)[0]
        check(out, cutlass_reference(x, *local, w, ids, first=lo))
        outs.append(out.float())
    check(sum(outs), cutlass_reference(x, fc1, fc2, w, ids), (3e-2, 3e-2))


def test_expert_parallel_ids_past_every_rank_are_an_index_error():
    x, fc1, fc2, w, ids = case(8, 2, 32, 16, 4, "cpu", 9)
    ids[2, 1] = 16
    with pytest.raises(IndexError, match=r"= 16 is not an expert: valid are \[0, 16\)"):
        kiln.cutlass_fused_moe(x, ids, w, fc1[:4], fc2[:4], BF16, ep_size=4, ep_rank=1)
    ids[2, 1] = -2
    with pytest.raises(IndexError, match=r"= -2 is not an expert"):
        kiln.cutlass_fused_moe(x, ids, w, fc1[:4], fc2[:4], BF16, ep_size=4, ep_rank=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tp", [2, 3])
def test_tensor_parallel_slices_sum_to_the_layer(device, tp):
    i = 48
    x, fc1, fc2, w, ids = case(E, 2, 64, i, 9, device, 10)
    shard = i // tp
    outs = []
    for rank in range(tp):
        rows = slice(rank * shard, (rank + 1) * shard)
        up, gate = fc1[:, :i], fc1[:, i:]
        local1 = torch.cat([up[:, rows], gate[:, rows]], dim=1).contiguous()
        local2 = fc2[:, :, rows].contiguous()
        outs.append(
            kiln.cutlass_fused_moe(x, ids, w, local1, local2, BF16, tp_size=tp, tp_rank=rank)[0].float()
        )
    check(sum(outs), cutlass_reference(x, fc1, fc2, w, ids), (3e-2, 3e-2))


def per_tensor_fp8(v):
    s = v.float().abs().amax() / 448.0
    return (v.float() / s).to(torch.float8_e4m3fn), s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [5, 70], ids=["small-batch", "grouped"])
@pytest.mark.parametrize("a", [ActivationType.Swiglu, ActivationType.Situ], ids=["swiglu", "situ"])
def test_per_tensor_fp8(device, t, a):
    """FlashInfer's per-tensor fp8 form: an e4m3 input, e4m3 weights with one scale per expert and
    quant_scales [fc1_dequant = w1_scale * x_scale, fc2_act_quant, fc2_dequant, x_scale]."""
    x, fc1, fc2, w, ids = case(E, 2, 64, 48, t, "cpu", 11, dtype=torch.float16)
    xq, xs = per_tensor_fp8(x)
    q1, s1 = zip(*(per_tensor_fp8(fc1[e]) for e in range(E)), strict=True)
    q2, s2 = zip(*(per_tensor_fp8(fc2[e]) for e in range(E)), strict=True)
    q1, q2, s1, s2 = torch.stack(q1), torch.stack(q2), torch.stack(s1), torch.stack(s2)
    act_quant = torch.tensor(2.0)  # FlashInfer rounds the activation to e4m3 with it; kiln folds it in
    scales = [s1 * xs, act_quant, s2 / act_quant, xs]
    args = [v.to(device) for v in (xq, ids, w, q1, q2)]
    out = kiln.cutlass_fused_moe(*args, torch.float16, [v.to(device) for v in scales], activation_type=a)[0]
    assert out.dtype == torch.float16
    ref = cutlass_reference(
        xq.float() * xs, dequantize(q1, s1), dequantize(q2, s2), w, ids, KINDS[a], DEFAULTS[a]
    )
    check(out, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_block_scales_on_the_generic_path(device):
    """Situ with DeepSeek block scales at a grouped size, I = 136 (fc1's halves split inside a
    128-row block): the generic path runs one fp8 grouped GEMM over every fc1 row (H = 128, the
    input quantised per 1 x 128) and dequantises fc2 (I no multiple of 128)."""
    e, h, i, t = 4, 128, 136, 70
    x, fc1, fc2, w, ids = case(e, 2, h, i, t, "cpu", 12)
    g = gen(13)
    s1 = 0.5 + torch.rand((e, -(-2 * i // 128), 1), generator=g)
    s2 = 0.5 + torch.rand((e, 1, -(-i // 128)), generator=g)
    q1 = (fc1.float() / dequantize(torch.ones(fc1.shape), s1)).to(torch.float8_e4m3fn)
    q2 = (fc2.float() / dequantize(torch.ones(fc2.shape), s2)).to(torch.float8_e4m3fn)
    out = kiln.cutlass_fused_moe(
        *(v.to(device) for v in (x, ids, w, q1, q2)),
        BF16,
        [s1.to(device), s2.to(device)],
        use_deepseek_fp8_block_scale=True,
        activation_type=ActivationType.Situ,
    )[0]
    ref = cutlass_reference(
        group_dequantized(x), dequantize(q1, s1), dequantize(q2, s2), w, ids, "situ", (4.0, 25.0, math.inf)
    )
    check(out, ref)


# --- workspace_buffer --------------------------------------------------------------------------------

WS_CASES = [
    ("swiglu", ActivationType.Swiglu, False),
    ("situ", ActivationType.Situ, False),
    ("relu2", ActivationType.Relu2, False),
    ("swiglu-fp8-blocks", ActivationType.Swiglu, True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, a, fp8", WS_CASES, ids=[c[0] for c in WS_CASES])
def test_workspace_size_covers_every_call_up_to_max_num_tokens(device, name, a, fp8):
    """One buffer of cutlass_fused_moe_workspace_size(80, ...) bytes -- also 3 bytes into a larger one
    (an unaligned start) -- serves T = 1, 5, 64 and 80 (both paths), bit-equal to the unbuffered call."""
    e, k, h, i = 8, 2, 128, 128
    size = kiln.cutlass_fused_moe_workspace_size(
        80,
        h,
        i,
        e,
        k,
        x_dtype=BF16,
        weight_dtype=torch.float8_e4m3fn if fp8 else BF16,
        activation_type=a,
        use_deepseek_fp8_block_scale=fp8,
    )
    buffers = [
        torch.empty(size, dtype=torch.uint8, device=device),
        torch.empty(size + 3, dtype=torch.int8, device=device)[3:],
    ]
    for t in (1, 5, 64, 80):
        x, fc1, fc2, w, ids = case(e, k, h, i, t, device, 20 + t, gated=a.is_gated)
        extra = {}
        if fp8:
            s1 = torch.ones((e, 2, 1), device=device)
            s2 = torch.ones((e, 1, 1), device=device)
            fc1, fc2 = fc1.to(torch.float8_e4m3fn), fc2.to(torch.float8_e4m3fn)
            extra = {"quant_scales": [s1, s2], "use_deepseek_fp8_block_scale": True}
        want = kiln.cutlass_fused_moe(x, ids, w, fc1, fc2, BF16, activation_type=a, **extra)[0]
        for ws in buffers:
            got = kiln.cutlass_fused_moe(
                x, ids, w, fc1, fc2, BF16, activation_type=a, workspace_buffer=ws, **extra
            )[0]
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    x, fc1, fc2, w, ids = case(e, k, h, i, 200, device, 21, gated=a.is_gated)
    if not fp8:
        with pytest.raises(
            RuntimeError, match=rf"workspace_buffer too small: this call needs \d+ bytes .*, got {size}"
        ):
            kiln.cutlass_fused_moe(x, ids, w, fc1, fc2, BF16, activation_type=a, workspace_buffer=buffers[0])


def test_workspace_size_is_monotonic_and_counts_the_paths():
    args = dict(x_dtype=BF16, weight_dtype=BF16)
    sizes = [kiln.cutlass_fused_moe_workspace_size(t, 256, 512, 8, 2, **args) for t in (1, 4, 64, 65, 4096)]
    assert sizes == sorted(sizes) and sizes[0] > 0
    # tp: each rank holds I / tp; ep: E / ep experts
    whole = kiln.cutlass_fused_moe_workspace_size(512, 256, 512, 8, 2, **args)
    assert kiln.cutlass_fused_moe_workspace_size(512, 256, 512, 8, 2, tp_size=2, tp_rank=1, **args) < whole
    with pytest.raises(TypeError, match="weight_dtype must be torch.bfloat16 or float8_e4m3fn"):
        kiln.cutlass_fused_moe_workspace_size(8, 64, 64, 4, 2, x_dtype=BF16, weight_dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="use_packed_weights is not supported by kiln"):
        kiln.cutlass_fused_moe_workspace_size(8, 64, 64, 4, 2, **args, use_packed_weights=True)
    with pytest.raises(ValueError, match=r"tp_rank must be in \[0, 2\)"):
        kiln.cutlass_fused_moe_workspace_size(8, 64, 64, 4, 2, **args, tp_size=2, tp_rank=2)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [5, 300], ids=["small-batch", "grouped"])
def test_workspace_generic_path_allocates_nothing_and_replays_in_a_cuda_graph(t):
    e, k, h, i = 8, 2, 256, 128
    x, fc1, fc2, w, ids = case(e, k, h, i, t, "cuda", 30)
    beta = torch.full((e,), 3.0, device="cuda")
    ws = torch.empty(
        kiln.cutlass_fused_moe_workspace_size(
            t, h, i, e, k, x_dtype=BF16, weight_dtype=BF16, activation_type=ActivationType.Situ
        ),
        dtype=torch.uint8,
        device="cuda",
    )
    out = torch.empty_like(x)

    def run():
        return kiln.cutlass_fused_moe(
            x,
            ids,
            w,
            fc1,
            fc2,
            BF16,
            output=out,
            activation_type=ActivationType.Situ,
            workspace_buffer=ws,
            situ_beta=beta,
        )

    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < 4096  # (situ_beta's float32 copy is a no-op)
    check(out, cutlass_reference(x, fc1, fc2, w, ids, "situ", (3.0, 25.0, math.inf)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    want = out.clone()
    for v in (x, ids, w):  # the tokens in reverse order, each with its routing
        v.copy_(v.flip(0))
    graph.replay()
    torch.testing.assert_close(out, want.flip(0), rtol=0, atol=0)


# --- accuracy against float64 (host backend, and CUDA where a device is) --------------------------
# kiln's error against the unrounded float64 layer is that of its rounding sequence (docs/moe.md),
# modelled in float64. The decode-size path rounds twice before the k-way sum, as the fused SwiGLU:
# the activation of fc1's float32 output (its bias and parameters added in float32, the activation
# fused into the up projection), and fc2's output (its bias fused too). The grouped path also rounds
# fc1's output (a 16-bit GEMM output, as the plain grouped path does) and, with a bias, fc2's output
# once before and once after it. The model of the fused sequence is ~1.1-1.5x as accurate as the
# unfused one for every activation but relu and identity (which commute with rounding), so the 5 %
# margin tells them apart.

F16 = torch.float16
ACCURACY_ACTS = [*ACTS, ("clamped_relu2", ActivationType.ClampedRelu2, {}, None)]
ACCURACY_E, ACCURACY_H, ACCURACY_I = 8, 128, 128
ACCURACY_TOKENS = {"small-batch": 32, "grouped": 96}  # 64 rows on 8 experts; 192 rows


def rounded(v, dtype):
    return v if dtype is None else v.to(dtype).double()


def layer64(x, fc1, fc2, w, ids, kind, params, dtype=None, grouped=False, b1=None, b2=None):
    """The layer in float64, one expert at a time (fc1 up rows first for gated kinds). With dtype,
    rounded to it where kiln rounds: the activation, each expert's fc2 output and the result; on the
    grouped path also fc1's output, and fc2's output before its bias."""
    f = torch.float64
    gated = kind in ("swiglu", "swiglu_step", "geglu", "geglu_tanh", "situ")
    i = fc1.shape[1] // 2 if gated else fc1.shape[1]
    out = torch.zeros((x.shape[0], fc2.shape[1]), dtype=f)
    for e in range(fc1.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x[tok].double() @ fc1[e].double().t()
        if grouped:
            h = rounded(h, dtype)
        if b1 is not None:
            h = h + b1[e].double()
        p = [float(v[e]) if isinstance(v, list | tuple | torch.Tensor) else v for v in params]
        a = expert_act_float(kind, h[:, i:], h[:, :i], *p) if gated else expert_act_float(kind, h, None, *p)
        y = rounded(a, dtype) @ fc2[e].double().t()
        if b2 is not None:
            y = (rounded(y, dtype) if grouped else y) + b2[e].double()
        out.index_add_(0, tok, w[tok, slot].double()[:, None] * rounded(y, dtype))
    return rounded(out, dtype)


def relative_rms(v, exact):
    return float((v.double() - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())


def accuracy_case(name, a, kwargs, path, dtype):
    """Inputs ~N(0, 1), fc1's outputs ~N(0, 9) (SwigluStep's clamp at 7 and the saturating
    activations engage), fc2's ~N(0, 1) per unit activation; parameters per expert as ACTS'."""
    g = gen(11)
    e, h, i, t = ACCURACY_E, ACCURACY_H, ACCURACY_I, ACCURACY_TOKENS[path]
    rows = 2 * i if a.is_gated else i
    x = torch.randn((t, h), generator=g).to(dtype)
    fc1 = (3 * torch.randn((e, rows, h), generator=g) / math.sqrt(h)).to(dtype)
    fc2 = (torch.randn((e, h, i), generator=g) / math.sqrt(i)).to(dtype)
    ids = random_ids(t, e, 2, g)
    w = torch.rand((t, 2), generator=g)
    w = w / w.sum(-1, keepdim=True)
    given, params = {}, list(DEFAULTS.get(a, [0.0, 0.0, 0.0]))
    for n, (lo, hi) in kwargs.items():
        v = (lo + (hi - lo) * torch.rand(e, generator=g)).float()
        given[n], params[SLOTS[n]] = v, v.tolist()
    if a == ActivationType.ClampedRelu2:
        given["clamped_relu2_limit"], params[2] = torch.tensor([5.0]), 5.0
    return x, fc1, fc2, w, ids, given, tuple(params)


def on(device, *tensors):
    return [v.to(device) for v in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("path", list(ACCURACY_TOKENS))
@pytest.mark.parametrize("name, a, kwargs, _", ACCURACY_ACTS, ids=[c[0] for c in ACCURACY_ACTS])
def test_accuracy_against_float64_is_that_of_the_rounding_sequence(device, name, a, kwargs, _, path, dtype):
    x, fc1, fc2, w, ids, given, params = accuracy_case(name, a, kwargs, path, dtype)
    t, n, grouped = x.shape[0], x.shape[0] * 2, path == "grouped"
    small = t <= kiln.moe.SMALL_BATCH_TOKENS and n <= kiln.moe.SMALL_BATCH_ROWS_PER_EXPERT * ACCURACY_E
    assert small != grouped
    given = {k: v.to(device) for k, v in given.items()}
    out = kiln.cutlass_fused_moe(*on(device, x, ids, w, fc1, fc2), dtype, activation_type=a, **given)[0].cpu()
    exact = layer64(x, fc1, fc2, w, ids, KINDS[a], params)
    got = relative_rms(out, exact)
    model = relative_rms(layer64(x, fc1, fc2, w, ids, KINDS[a], params, dtype, grouped), exact)
    floor = relative_rms(rounded(exact, dtype), exact)  # the exact layer rounded once
    assert got <= 1.05 * model, (got, model, floor)
    assert floor < model < 4 * floor, (got, model, floor)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", list(ACCURACY_TOKENS))
@pytest.mark.parametrize(
    "a", [ActivationType.SwigluStep, ActivationType.Relu2, ActivationType.Identity], ids=lambda a: a.name
)
def test_accuracy_against_float64_with_biases(device, path, a):
    """fc1's bias is added in float32 before the activation and fc2's in the epilogue of the
    decode-size path (one rounding of fc2's output), after fc2's rounded output on the grouped path."""
    x, fc1, fc2, w, ids, given, params = accuracy_case(a.name, a, {}, path, F16)
    g = gen(12)
    b1 = torch.randn(fc1.shape[:2], generator=g).to(F16)
    b2 = torch.randn((ACCURACY_E, ACCURACY_H), generator=g).to(F16)
    out = kiln.cutlass_fused_moe(
        *on(device, x, ids, w, fc1, fc2), F16, None, *on(device, b1, b2), activation_type=a
    )
    out = out[0].cpu()
    exact = layer64(x, fc1, fc2, w, ids, KINDS[a], params, b1=b1, b2=b2)
    model = layer64(x, fc1, fc2, w, ids, KINDS[a], params, F16, path == "grouped", b1, b2)
    got, want = relative_rms(out, exact), relative_rms(model, exact)
    assert got <= 1.05 * want, (got, want)


# --- the kernel, bad inputs, compile ------------------------------------------------------------------


def test_expert_act_kernel_bad_offs_and_act():
    h = torch.randn(4, 8).bfloat16()
    out = torch.empty(4, 4, dtype=BF16)
    with pytest.raises(IndexError, match=r"segment 1 ends at row 9, past the 4 rows"):
        kiln.moe._expert_act_op(
            out,
            h,
            torch.tensor([2, 9], dtype=torch.int32),
            "swiglu",
            4,
            0,
            None,
            None,
            None,
            1.0,
            0.0,
            math.inf,
            None,
        )
    mod = kiln.moe._module("test", torch.device("cpu"), BF16, "x")
    dl = kiln._jit.dl
    with pytest.raises(ValueError, match=r"act must be in \[0, 11\)"):
        mod.expert_act(out=dl(out), input=dl(h), offs=dl(torch.tensor([2, 4], dtype=torch.int32)), act=11)
    with pytest.raises(ValueError, match=r"must lie in input's 8 columns"):
        mod.expert_act(
            out=dl(out),
            input=dl(h),
            offs=dl(torch.tensor([2, 4], dtype=torch.int32)),
            act=mod.expert_acts["swiglu"],
            gate_col0=5,
        )
    with pytest.raises(ValueError, match=r"p0 must hold one value per expert \(2\) or one"):
        mod.expert_act(
            out=dl(out),
            input=dl(h),
            offs=dl(torch.tensor([2, 4], dtype=torch.int32)),
            act=mod.expert_acts["silu"],
            p0=dl(torch.ones(3)),
        )
    rows = torch.tensor([1, 1], dtype=torch.int32)  # rows 1..3 belong to no expert: zero
    kiln.moe._expert_act_op(out, h, rows, "relu", 0, 0, None, None, None, 0.0, 0.0, 0.0, None)
    assert (out[1:] == 0).all() and torch.equal(out[0], torch.relu(h[0, :4].float()).bfloat16())


def test_bad_inputs_are_named():
    x, fc1, fc2, w, ids = case(E, 2, 32, 16, 3, "cpu", 40)
    call = kiln.cutlass_fused_moe
    with pytest.raises(ValueError, match="unsupported activation_type"):
        call(x, ids, w, fc1, fc2, BF16, activation_type=ActivationType.InvalidType)
    with pytest.raises(ValueError, match="unsupported activation_type 99"):
        call(x, ids, w, fc1, fc2, BF16, activation_type=99)
    for flag in (
        "use_w4_group_scaling",
        "use_mxfp8_act_scaling",
        "use_packed_weights",
        "use_wfp4afp8_humming",
        "enable_alltoall",
        "min_latency_mode",
    ):
        with pytest.raises(NotImplementedError, match=f"{flag} is not supported by kiln"):
            call(x, ids, w, fc1, fc2, BF16, **{flag: True})
    with pytest.raises(NotImplementedError, match="input_sf is not supported"):
        call(x, ids, w, fc1, fc2, BF16, input_sf=torch.ones(1))
    with pytest.raises(NotImplementedError, match="cluster_size 2"):
        call(x, ids, w, fc1, fc2, BF16, cluster_size=2)
    with pytest.raises(NotImplementedError, match='backend="cake"'):
        call(x, ids, w, fc1, fc2, BF16, backend="cake")
    with pytest.raises(ValueError, match=r"tp_size must be >= 1 and tp_rank in \[0, tp_size\), got 2, 2"):
        call(x, ids, w, fc1, fc2, BF16, tp_size=2, tp_rank=2)
    with pytest.raises(ValueError, match="profile_ids must contain"):
        call(x, ids, w, fc1, fc2, BF16, profile_ids=[1])
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        call(x, ids, w, fc1, fc2, BF16, enable_pdl="yes")
    with pytest.raises(ValueError, match=r"swiglu_alpha must be a float tensor of shape \(4,\)"):
        call(x, ids, w, fc1, fc2, BF16, swiglu_alpha=torch.ones(3))
    with pytest.raises(ValueError, match="situ_beta does not go with ActivationType.Swiglu"):
        call(x, ids, w, fc1, fc2, BF16, situ_beta=torch.ones(E))
    with pytest.raises(ValueError, match="swiglu_limit does not go with ActivationType.Geglu"):
        call(x, ids, w, fc1, fc2, BF16, activation_type=ActivationType.Geglu, swiglu_limit=torch.ones(E))
    with pytest.raises(ValueError, match=r"Relu2 is not gated: fc1_expert_weights must be \[E, I = 16, H\]"):
        call(x, ids, w, fc1, fc2, BF16, activation_type=ActivationType.Relu2)
    with pytest.raises(ValueError, match=r"fc1_expert_biases must be \[E = 4, 32\]"):
        call(x, ids, w, fc1, fc2, BF16, None, torch.ones(E, 16))
    with pytest.raises(ValueError, match=r"fc2_expert_biases must be \[E = 4, H = 32\]"):
        call(x, ids, w, fc1, fc2, BF16, fc2_expert_biases=torch.ones(E, 16))
    with pytest.raises(ValueError, match=r"output must be torch.bfloat16 \[3, 32\]"):
        call(x, ids, w, fc1, fc2, BF16, output=torch.empty(3, 32, dtype=torch.float16))
    with pytest.raises(TypeError, match="input.dtype must be bfloat16, float16, or float8_e4m3fn"):
        call(x.float(), ids, w, fc1, fc2, BF16)
    with pytest.raises(ValueError, match="a float8_e4m3fn input needs the per-tensor quant_scales"):
        call(x.to(torch.float8_e4m3fn), ids, w, fc1, fc2, BF16)
    with pytest.raises(ValueError, match="use_deepseek_fp8_block_scale takes float8_e4m3fn weights"):
        call(x, ids, w, fc1, fc2, BF16, use_deepseek_fp8_block_scale=True)
    with pytest.raises(RuntimeError, match="workspace_buffer must be 1-D"):
        call(x, ids, w, fc1, fc2, BF16, workspace_buffer=torch.empty(2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="workspace_buffer dtype must be int8 or uint8"):
        call(x, ids, w, fc1, fc2, BF16, workspace_buffer=torch.empty(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="backend must be one of cutlass, auto, cuda, triton"):
        call(x, ids, w, fc1, fc2, BF16, backend="cudnn")


@pytest.mark.parametrize("device", DEVICES)
def test_returns_flashinfers_list_and_writes_output(device):
    x, fc1, fc2, w, ids = case(E, 2, 32, 16, 3, device, 41)
    out = torch.full_like(x, float("nan"))
    res = kiln.cutlass_fused_moe(
        x,
        ids,
        w,
        fc1,
        fc2,
        BF16,
        output=out,
        use_fused_finalize=False,
        tune_max_num_tokens=16,
        profile_ids=[-1, -1],
        enable_pdl=True,
        backend="cutlass",
    )
    assert isinstance(res, list) and len(res) == 1 and res[0] is out
    check(out, cutlass_reference(x, fc1, fc2, w, ids))


def test_torch_compile_traces_the_generic_path_with_a_workspace():
    """fullgraph=True traces Situ with per-expert parameters and a workspace_buffer (views of it, no
    address read while tracing); the graph runs kiln's expert_act kernel between the projections
    and gives the eager result."""
    x, fc1, fc2, w, ids = case(E, 2, 64, 32, 4, "cpu", 42)
    beta = torch.full((E,), 3.0)
    size = kiln.cutlass_fused_moe_workspace_size(4, 64, 32, E, 2, x_dtype=BF16, weight_dtype=BF16)
    ws = torch.empty(size, dtype=torch.uint8)
    kw = dict(activation_type=ActivationType.Situ, situ_beta=beta, workspace_buffer=ws)
    want = kiln.cutlass_fused_moe(x, ids, w, fc1, fc2, BF16, **kw)[0]
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda *a: kiln.cutlass_fused_moe(*a, BF16, **kw)[0], fullgraph=True, backend=capture)
    got = f(x, ids, w, fc1, fc2)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (gm,) = graphs
    ops = [
        n.target._opname
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target.namespace == "kiln"
    ]
    assert ops == ["moe_permute", "moe_experts_act", "moe_experts", "moe_unpermute"], ops
