"""Re-creates FlashInfer 0.7's tests/moe/cutlass/test_trtllm_cutlass_fused_moe.py (the file's version
that tests 0.7.2's cutlass_fused_moe: its activation types with ClampedRelu2, workspace_buffer and
cutlass_fused_moe_workspace_size) against kiln, through ``import kiln as flashinfer``. Where
FlashInfer's tests call ``flashinfer.fused_moe.X`` these call ``kiln.moe.X`` (kiln's top-level
``kiln.fused_moe`` is vLLM's layer function; docs/moe.md). The parametrisations, assertions and
tolerances are FlashInfer's; the references are kiln's own (float32, kiln.trace.moe's activations),
rounded to the activation dtype where FlashInfer's fp16 reference rounds what any 16-bit layer must
(the activation, fc2's operand, and each expert's fc2 output): at SwigluStep's scale (activations up
to 49, outputs ~100) that rounding alone is ~0.01 off near zero, FlashInfer's atol.

Not claimed by kiln (each such case skips, naming it): nvfp4, mxfp8 x mxfp4, mxfp8 x mxfp8, bf16 x
mxfp4 (W4A16), fp8 x mxfp4 (humming) and w4a8 (int4) weights -- the formats of FlashInfer's Blackwell
kernels and sm90 mixed-input GEMMs -- and the test of FlashInfer's internal JIT module.

Where kiln does more than FlashInfer, the case checks what kiln does:
- test_moe_fp8_block_scaling expects NotImplementedError off sm90 (FlashInfer's kernel); kiln runs
  DeepSeek fp8 block scaling on every device, so its closeness check runs everywhere.
- The ClampedRelu2 cases run only on sm10x in FlashInfer (an epilogue fusion); kiln computes
  ClampedRelu2 on every device.
- FlashInfer refuses an input that is not 16-byte aligned ("16B-aligned"); kiln's kernels take any
  alignment, so that case checks the result against the reference instead.
- FlashInfer's per-architecture skips (its CUTLASS MoE arch list) are not kiln's.

Left out: test_workspace_device_tracks_input_not_current_device (needs two CUDA devices; the GPU
machine has one). On the CPU the cases keep FlashInfer's sizes (one token, H = I = 128 for most),
the workspace cases run 96 tokens instead of 256 / 512 (still kiln's grouped path), and each
not-claimed grid keeps one case.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import not_claimed  # tests/flashinfer/conftest.py (imported last when collecting here)
from torch.nn import functional as F

import kiln as flashinfer
import kiln.moe as fused_moe
from kiln.moe import DEFAULT_SITU_BETA, DEFAULT_SITU_LINEAR_BETA, ActivationType
from kiln.trace.moe import dequantize, expert_act_float, group_dequantized

FLOAT8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
FP8_DTYPE = torch.float8_e4m3fn


# --- kiln's helpers, in the roles of FlashInfer's -------------------------------------------------


def make_situ_scales(num_experts, device):
    """Per-expert Situ scales away from the defaults (4.0 and 25.0), so ignoring them fails."""
    return {
        "situ_beta": torch.full((num_experts,), 5.0, dtype=torch.float32, device=device),
        "situ_linear_beta": torch.full((num_experts,), 18.0, dtype=torch.float32, device=device),
    }


def dynamic_per_tensor_fp8_quant(x):
    """x as e4m3 with one scale (absmax / 448): (x_q, scale [1])."""
    scale = x.abs().max().float() / FLOAT8_E4M3_MAX
    q = (x.float() * (1.0 / scale)).clamp(-FLOAT8_E4M3_MAX, FLOAT8_E4M3_MAX).to(FP8_DTYPE)
    return q, scale.view(1)


def gen_tensor(shape, dtype, device, stype=None, scale=1.0):
    x = torch.randn(*shape, dtype=dtype).to(device) * scale
    return x.to(stype) if stype else x


def cast_to_representable(x):
    """x rounded onto its own per-tensor e4m3 grid (so quantising it again is exact)."""
    q, s = dynamic_per_tensor_fp8_quant(x)
    return q.to(x.dtype) * s.to(x.dtype)


def compute_routing(router_logits, top_k):
    """softmax (float32) top-k, renormalised: (routing_weights [T, k], selected_experts [T, k])."""
    weights = F.softmax(router_logits, dim=1, dtype=torch.float)
    weights, selected = torch.topk(weights, top_k, dim=-1)
    return (weights / weights.sum(dim=-1, keepdim=True)).float(), selected


_KINDS = {
    ActivationType.Swiglu: "swiglu",
    ActivationType.SwigluStep: "swiglu_step",
    ActivationType.Situ: "situ",
    ActivationType.GegluTanh: "geglu_tanh",
}


def compute_with_experts(
    num_experts,
    x,
    w31_weight,
    w2_weight,
    selected_experts,
    routing_weights,
    activation_type=ActivationType.Swiglu,
    situ_beta=DEFAULT_SITU_BETA,
    situ_linear_beta=DEFAULT_SITU_LINEAR_BETA,
    limit=None,
):
    """The layer in float32, one expert at a time: fc1 rows [0, I) up, [I, 2I) gate (FlashInfer's
    w31); situ_beta / situ_linear_beta / limit a float or one value per expert. Rounded to x's
    dtype where the layer has 16-bit tensors, as FlashInfer's reference (every op of it in x's
    dtype) rounds them too: the activation (fc2's operand) and each expert's fc2 output; the
    k-way sum is float32, rounded once."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    kind = _KINDS[activation_type]

    def per_expert(v, e):
        return float(v[e]) if hasattr(v, "__getitem__") else float(v)

    for e in range(num_experts):
        tok, slot = torch.nonzero(selected_experts == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        up_w, gate_w = torch.chunk(w31_weight[e].float(), 2, dim=0)
        rows = x[tok].float()
        gate, up = rows @ gate_w.t(), rows @ up_w.t()
        if kind == "situ":
            inter = expert_act_float(
                kind, gate, up, per_expert(situ_beta, e), per_expert(situ_linear_beta, e)
            )
        elif kind == "swiglu_step":
            inter = expert_act_float(kind, gate, up, p2=7.0 if limit is None else per_expert(limit, e))
        else:
            inter = expert_act_float(kind, gate, up)
        down = inter.to(x.dtype).float() @ w2_weight[e].float().t()
        out.index_add_(0, tok, routing_weights[tok, slot].float()[:, None] * down.to(x.dtype).float())
    return out.to(x.dtype)


BATCH_SIZES = [1]
HIDDEN_SIZES = [128]
NUM_EXPERTS = [2]
TOP_K_VALUES = [2]
INTERMEDIATE_SIZES = [128]
EP_NUM_EXPERTS = [8]
EP_TOP_K = [2]
TP_SIZES = [2, 4]


def ceil_div(a: int, b: int) -> int:
    return -(a // -b)


# --- 16-bit weights: activations, finalize, parallelism -------------------------------------------


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize(
    "activation_type, situ_per_expert",
    [
        (ActivationType.Swiglu, False),
        (ActivationType.SwigluStep, False),
        (ActivationType.Situ, False),
        (ActivationType.Situ, True),
    ],
    ids=["swiglu", "swiglustep", "situ_default", "situ_per_expert"],
)
def test_moe(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, activation_type, situ_per_expert
):
    torch.manual_seed(42)
    # SwigluStep's clamp at 7.0 engages only with larger activations.
    x_scale = 3.5 if activation_type == ActivationType.SwigluStep else 1.0 / 5
    x = torch.randn(batch_size, hidden_size, dtype=torch.float16).to(device) * x_scale
    router_logits = torch.randn(batch_size, num_experts, dtype=torch.float32).to(device)
    w31_weight = (
        torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=torch.float16).to(device) / 5
    )
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=torch.float16).to(device) / 5
    routing_weights, selected_experts = compute_routing(router_logits, top_k)
    situ_kwargs = make_situ_scales(num_experts, device) if situ_per_expert else {}
    ref_situ_kwargs = {k: v.tolist() for k, v in situ_kwargs.items()}
    ref_output = compute_with_experts(
        num_experts,
        x,
        w31_weight,
        w2_weight,
        selected_experts,
        routing_weights,
        activation_type=activation_type,
        **ref_situ_kwargs,
    )
    flash_output = torch.empty_like(ref_output)
    flash_output = fused_moe.cutlass_fused_moe(
        x,
        selected_experts.to(torch.int),
        routing_weights,
        w31_weight,
        w2_weight,
        flash_output.dtype,
        output=flash_output,
        quant_scales=None,
        activation_type=activation_type,
        **situ_kwargs,
    )
    torch.testing.assert_close(ref_output, flash_output[0], rtol=1e-2, atol=1e-2)


def _clamped_relu2(x, limit):
    return (limit * torch.tanh(torch.relu(x) / limit)).square()


def test_moe_bf16_clamped_relu2_epilogue_repeated(device):
    """ClampedRelu2 (plain fc1) with identity weights: the activation itself, twice, bit-equal."""
    m, k, top_k = 32, 512, 1
    dtype = torch.bfloat16
    clamp_scale = 16.0
    probe_values = torch.tensor([-64.0, -16.0, -1.0, 0.0, 1.0, 8.0, 16.0, 64.0], dtype=dtype, device=device)
    x = probe_values.repeat(ceil_div(m * k, probe_values.numel()))[: m * k].view(m, k)
    identity = torch.eye(k, dtype=dtype, device=device).unsqueeze(0).contiguous()
    selected_experts = torch.zeros((m, top_k), dtype=torch.int32, device=device)
    routing_weights = torch.ones((m, top_k), dtype=torch.float32, device=device)
    limit = torch.tensor([clamp_scale], dtype=torch.float32, device=device)
    expected = _clamped_relu2(x.float(), clamp_scale).to(dtype)
    outputs = []
    with flashinfer.autotune(True):
        for _ in range(2):
            output = torch.empty_like(x)
            fused_moe.cutlass_fused_moe(
                x,
                selected_experts,
                routing_weights,
                identity,
                identity,
                dtype,
                clamped_relu2_limit=limit,
                quant_scales=None,
                activation_type=ActivationType.ClampedRelu2,
                use_fused_finalize=False,
                output=output,
            )
            outputs.append(output.clone())
    torch.testing.assert_close(outputs[0], expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)


def test_moe_bf16_clamped_relu2_epilogue_multi_expert(device):
    """ClampedRelu2 across four experts (fc1 = a scale per expert times the identity)."""
    e, m, k, top_k = 4, 32, 512, 1
    dtype = torch.bfloat16
    clamp_scale = 16.0
    probe_values = torch.tensor([-64.0, -16.0, -1.0, 0.0, 1.0, 8.0, 16.0, 64.0], dtype=dtype, device=device)
    x = probe_values.repeat(ceil_div(m * k, probe_values.numel()))[: m * k].view(m, k)
    expert_scales = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=dtype, device=device)
    identity = torch.eye(k, dtype=dtype, device=device)
    w1 = (expert_scales[:, None, None] * identity[None, :, :]).contiguous()
    w2 = identity[None, :, :].expand(e, -1, -1).contiguous()
    selected_experts = (torch.arange(m, dtype=torch.int32, device=device) % e).view(m, top_k)
    routing_weights = torch.ones((m, top_k), dtype=torch.float32, device=device)
    limit = torch.tensor([clamp_scale], dtype=torch.float32, device=device)
    row_scales = expert_scales[selected_experts[:, 0].long()].float().unsqueeze(1)
    expected = _clamped_relu2(x.float() * row_scales, clamp_scale).to(dtype)
    actual = torch.empty_like(x)
    fused_moe.cutlass_fused_moe(
        x,
        selected_experts.to(torch.int),
        routing_weights,
        w1,
        w2,
        dtype,
        clamped_relu2_limit=limit,
        quant_scales=None,
        activation_type=ActivationType.ClampedRelu2,
        use_fused_finalize=False,
        output=actual,
    )
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)


def test_moe_clamped_relu2_requires_scalar_limit(device):
    m, hidden, inter, e, top_k = 1, 128, 128, 2, 1
    x = torch.randn(m, hidden, dtype=torch.bfloat16, device=device)
    w1 = torch.randn(e, inter, hidden, dtype=x.dtype, device=x.device)
    w2 = torch.randn(e, hidden, inter, dtype=x.dtype, device=x.device)
    selected_experts = torch.zeros((m, top_k), dtype=torch.int32, device=x.device)
    routing_weights = torch.ones((m, top_k), dtype=torch.float32, device=x.device)
    kwargs = dict(
        input=x,
        token_selected_experts=selected_experts,
        token_final_scales=routing_weights,
        fc1_expert_weights=w1,
        fc2_expert_weights=w2,
        output_dtype=x.dtype,
        quant_scales=None,
        activation_type=ActivationType.ClampedRelu2,
    )
    limit = torch.tensor([16.0], dtype=torch.float32, device=x.device)
    with pytest.raises(ValueError, match="requires a one-element"):
        fused_moe.cutlass_fused_moe(**kwargs)
    with pytest.raises(ValueError, match=r"shape \(1,\)"):
        fused_moe.cutlass_fused_moe(
            **kwargs, clamped_relu2_limit=torch.full((e,), 16.0, dtype=torch.float32, device=x.device)
        )
    with pytest.raises(ValueError, match="does not accept SwiGLU"):
        fused_moe.cutlass_fused_moe(
            **kwargs,
            clamped_relu2_limit=limit,
            swiglu_alpha=torch.ones(e, dtype=torch.float32, device=x.device),
        )
    with pytest.raises(ValueError, match="does not accept SwiGLU"):
        fused_moe.cutlass_fused_moe(
            **kwargs,
            clamped_relu2_limit=limit,
            swiglu_limit=torch.ones(e, dtype=torch.float32, device=x.device),
        )
    with pytest.raises(ValueError, match="supported only with"):
        fused_moe.cutlass_fused_moe(
            **{**kwargs, "activation_type": ActivationType.Relu2}, clamped_relu2_limit=limit
        )


def test_moe_raw_op_rejects_clamped_relu2_on_deepseek_blockscale(device):
    not_claimed("FlashInfer's internal JIT module (get_cutlass_fused_moe_module(arch).cutlass_fused_moe)")


def compute_with_experts_gelu_tanh(num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights):
    return compute_with_experts(
        num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights, ActivationType.GegluTanh
    )


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
def test_moe_gelu_tanh(device, batch_size, hidden_size, num_experts, top_k, intermediate_size):
    torch.manual_seed(42)
    dtype = torch.bfloat16
    x = torch.randn(batch_size, hidden_size, dtype=dtype).to(device) / 5
    router_logits = torch.randn(batch_size, num_experts, dtype=torch.float32).to(device)
    w31_weight = torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype).to(device) / 5
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=dtype).to(device) / 5
    routing_weights, selected_experts = compute_routing(router_logits, top_k)
    ref_output = compute_with_experts_gelu_tanh(
        num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights
    )
    flash_output = torch.empty_like(ref_output)
    flash_output = fused_moe.cutlass_fused_moe(
        x,
        selected_experts.to(torch.int),
        routing_weights,
        w31_weight,
        w2_weight,
        flash_output.dtype,
        output=flash_output,
        quant_scales=None,
        activation_type=ActivationType.GegluTanh,
    )
    torch.testing.assert_close(ref_output, flash_output[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
def test_moe_unfused_finalize(device, batch_size, hidden_size, num_experts, top_k, intermediate_size):
    """use_fused_finalize=False: the same result, bit for bit from run to run."""
    torch.manual_seed(42)
    x = torch.randn(batch_size, hidden_size, dtype=torch.float16).to(device) / 5
    router_logits = torch.randn(batch_size, num_experts, dtype=torch.float32).to(device)
    w31_weight = (
        torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=torch.float16).to(device) / 5
    )
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=torch.float16).to(device) / 5
    routing_weights, selected_experts = compute_routing(router_logits, top_k)
    ref_output = compute_with_experts(
        num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights
    )

    def run_unfused():
        out = torch.empty_like(ref_output)
        return fused_moe.cutlass_fused_moe(
            x,
            selected_experts.to(torch.int),
            routing_weights,
            w31_weight,
            w2_weight,
            out.dtype,
            output=out,
            quant_scales=None,
            use_fused_finalize=False,
        )[0]

    out1 = run_unfused()
    out2 = run_unfused()
    torch.testing.assert_close(ref_output, out1, rtol=1e-2, atol=1e-2)
    assert torch.equal(out1, out2), "non-fused finalize path must produce deterministic results"


# --- fp8 per tensor ---------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize("otype, wtype", [(torch.float16, torch.float8_e4m3fn)])
@pytest.mark.parametrize(
    "activation_type",
    [ActivationType.Swiglu, ActivationType.SwigluStep, ActivationType.Situ],
    ids=["swiglu", "swiglustep", "situ"],
)
def test_moe_fp8(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, otype, wtype, activation_type
):
    torch.manual_seed(42)
    input_shape = (batch_size, hidden_size)
    w31_shape = (num_experts, 2 * intermediate_size, hidden_size)
    w2_shape = (num_experts, hidden_size, intermediate_size)
    x = cast_to_representable(gen_tensor(input_shape, otype, device))
    router_logits = gen_tensor((batch_size, num_experts), otype, device)
    w31_weight = gen_tensor(w31_shape, otype, device, wtype)
    w2_weight = gen_tensor(w2_shape, otype, device, wtype)
    w31_scales = torch.empty(num_experts, 2, dtype=otype, device=device)
    w2_scales = torch.empty(num_experts, 1, dtype=otype, device=device)
    w31_dequantized = gen_tensor(w31_shape, otype, device)
    w2_dequantized = gen_tensor(w2_shape, otype, device)
    for expert_id in range(num_experts):
        w31 = cast_to_representable(gen_tensor(w31_shape[1:], otype, device, scale=0.1))
        w2 = cast_to_representable(gen_tensor(w2_shape[1:], otype, device, scale=0.09))
        w31_quant, s31 = dynamic_per_tensor_fp8_quant(w31)
        w2_quant, s2 = dynamic_per_tensor_fp8_quant(w2)
        w31_weight.data[expert_id].copy_(w31_quant)
        w2_weight.data[expert_id].copy_(w2_quant)
        w31_scales.data[expert_id].copy_(s31)
        w2_scales.data[expert_id].copy_(s2)
        w31_dequantized.data[expert_id].copy_(torch.mul(w31_quant.to(dtype=otype), s31))
        w2_dequantized.data[expert_id].copy_(torch.mul(w2_quant.to(dtype=otype), s2))
    situ_kwargs = make_situ_scales(num_experts, device) if activation_type == ActivationType.Situ else {}
    ref_situ_kwargs = {k: v.tolist() for k, v in situ_kwargs.items()}
    routing_weights, selected_experts = compute_routing(router_logits, top_k)
    ref_output = compute_with_experts(
        num_experts,
        x,
        w31_dequantized,
        w2_dequantized,
        selected_experts,
        routing_weights,
        activation_type=activation_type,
        **ref_situ_kwargs,
    )
    flash_output = torch.empty_like(ref_output)
    # fp8: the hidden states go in quantised.
    _, w1_scales = torch.chunk(w31_scales, 2, dim=-1)
    x_quant, hidden_states_scale = dynamic_per_tensor_fp8_quant(x)
    hidden_states_scale = hidden_states_scale[0].clone()
    quant_scales = [
        torch.squeeze(w1_scales * hidden_states_scale).float(),
        torch.tensor(1.0, device=device),
        torch.squeeze(1.0 * w2_scales).float(),
        hidden_states_scale,
    ]
    _ = fused_moe.cutlass_fused_moe(
        x_quant,
        selected_experts.to(torch.int),
        routing_weights,
        w31_weight,
        w2_weight,
        otype,
        quant_scales=quant_scales,
        output=flash_output,
        activation_type=activation_type,
        **situ_kwargs,
    )
    torch.testing.assert_close(ref_output, flash_output, rtol=1e-1, atol=1e-1)


# --- expert and tensor parallelism ------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", EP_NUM_EXPERTS)
@pytest.mark.parametrize("top_k", EP_TOP_K)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
def test_moe_expert_parallel(device, batch_size, hidden_size, num_experts, top_k, intermediate_size):
    """ep_size ranks, each holding num_experts / ep_size experts; their outputs summed."""
    ep_size = num_experts // 2
    torch.manual_seed(42)
    x = torch.randn(batch_size, hidden_size, dtype=torch.float16).to(device)
    w31_weight = (
        torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=torch.float16).to(device) / 10
    )
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=torch.float16).to(device) / 10
    selected_experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(batch_size)]).to(
        device
    )
    routing_weights = F.softmax(torch.randn((batch_size, top_k)).to(device), dim=1)
    ref_output = compute_with_experts(
        num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights
    )
    outputs = []
    flash_output = torch.zeros_like(ref_output)
    for ep_rank in range(ep_size):
        out_hidden_states_local = torch.zeros_like(x)
        experts_per_rank = num_experts // ep_size
        expert_start = ep_rank * experts_per_rank
        expert_end = expert_start + experts_per_rank
        w31_weight_local = w31_weight[expert_start:expert_end, :]
        w2_weight_local = w2_weight[expert_start:expert_end, :]
        _ = fused_moe.cutlass_fused_moe(
            x.contiguous(),
            selected_experts.to(torch.int),
            routing_weights,
            w31_weight_local.contiguous(),
            w2_weight_local.contiguous(),
            x.dtype,
            ep_size=ep_size,
            ep_rank=ep_rank,
            quant_scales=None,
            output=out_hidden_states_local,
        )
        outputs.append(out_hidden_states_local)
    for ep_rank in range(ep_size):
        flash_output += outputs[ep_rank]
    torch.testing.assert_close(ref_output, flash_output, rtol=1e-1, atol=1e-1)


def _tp_slice(w31, w2, tp_size, tp_rank, intermediate_size):
    """The rank's slice of the intermediate dimension: fc1's up and gate rows each, fc2's columns."""
    shard = intermediate_size // tp_size
    lo, hi = tp_rank * shard, (tp_rank + 1) * shard
    w3_weight, w1_weight = torch.chunk(w31, 2, dim=1)
    return torch.cat([w3_weight[:, lo:hi, :], w1_weight[:, lo:hi, :]], dim=1), w2[:, :, lo:hi]


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("tp_size", TP_SIZES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
def test_moe_tensor_parallel(device, batch_size, hidden_size, num_experts, tp_size, intermediate_size):
    torch.manual_seed(42)
    top_k = 2
    x = torch.randn(batch_size, hidden_size, dtype=torch.float16).to(device)
    w31_weight = (
        torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=torch.float16).to(device) / 10
    )
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=torch.float16).to(device) / 10
    selected_experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(batch_size)]).to(
        device
    )
    routing_weights = F.softmax(torch.randn((batch_size, top_k)).to(device), dim=1)
    ref_output = compute_with_experts(
        num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights
    )
    outputs = []
    for tp_rank in range(tp_size):
        out_hidden_states_local = torch.zeros_like(x)
        w31_weight_local, w2_weight_local = _tp_slice(
            w31_weight, w2_weight, tp_size, tp_rank, intermediate_size
        )
        _ = fused_moe.cutlass_fused_moe(
            x.contiguous(),
            selected_experts.to(torch.int),
            routing_weights,
            w31_weight_local.contiguous(),
            w2_weight_local.contiguous(),
            x.dtype,
            tp_size=tp_size,
            tp_rank=tp_rank,
            quant_scales=None,
            output=out_hidden_states_local,
        )
        outputs.append(out_hidden_states_local)
    flash_output = sum(outputs)
    torch.testing.assert_close(ref_output, flash_output, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", EP_NUM_EXPERTS)
@pytest.mark.parametrize("top_k", EP_TOP_K)
@pytest.mark.parametrize("tp_size", TP_SIZES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
def test_moe_tensor_expert_parallel(
    device, batch_size, hidden_size, num_experts, top_k, tp_size, intermediate_size
):
    torch.manual_seed(42)
    x = torch.randn(batch_size, hidden_size, dtype=torch.float16).to(device)
    w31_weight = (
        torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=torch.float16).to(device) / 10
    )
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=torch.float16).to(device) / 10
    selected_experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(batch_size)]).to(
        device
    )
    routing_weights = F.softmax(torch.randn((batch_size, top_k)).to(device), dim=1)
    ref_output = compute_with_experts(
        num_experts, x, w31_weight, w2_weight, selected_experts, routing_weights
    )
    ep_size = num_experts // 2
    outputs = []
    for ep_rank in range(ep_size):
        experts_per_rank = num_experts // ep_size
        expert_start = ep_rank * experts_per_rank
        expert_end = expert_start + experts_per_rank
        w31_weight_ep = w31_weight[expert_start:expert_end, :]
        w2_weight_ep = w2_weight[expert_start:expert_end, :]
        for tp_rank in range(tp_size):
            w31_weight_local, w2_weight_local = _tp_slice(
                w31_weight_ep, w2_weight_ep, tp_size, tp_rank, intermediate_size
            )
            out_hidden_states_local = fused_moe.cutlass_fused_moe(
                x.contiguous(),
                selected_experts.to(torch.int),
                routing_weights,
                w31_weight_local.contiguous(),
                w2_weight_local.contiguous(),
                x.dtype,
                tp_size=tp_size,
                tp_rank=tp_rank,
                ep_size=ep_size,
                ep_rank=ep_rank,
                quant_scales=None,
            )
            outputs.append(out_hidden_states_local[0])
    flash_output = sum(outputs)
    torch.testing.assert_close(ref_output, flash_output, rtol=1e-2, atol=1e-2)


# --- DeepSeek fp8 block scale -----------------------------------------------------------------------


def per_block_cast_to_fp8(x):
    """A 2-D weight as e4m3 with one scale per 128 x 128 block (absmax / 448, at least 1e-4 / 448)."""
    m, n = x.shape
    padded = torch.zeros((ceil_div(m, 128) * 128, ceil_div(n, 128) * 128), dtype=x.dtype, device=x.device)
    padded[:m, :n] = x
    blocks = padded.view(-1, 128, padded.size(1) // 128, 128)
    amax = blocks.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (blocks * (448.0 / amax)).to(torch.float8_e4m3fn).view_as(padded)[:m, :n].contiguous()
    return q, (amax / 448.0).view(blocks.size(0), blocks.size(2))


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
def test_moe_fp8_block_scaling(device, batch_size, hidden_size, num_experts, top_k, intermediate_size):
    """bf16 activations, fp8 e4m3 weights with 128 x 128 block scales (DeepSeek-V3); the reference
    takes the activations through their 1 x 128 quantisation, as the kernel does."""
    torch.manual_seed(42)
    otype = torch.bfloat16
    x = torch.randn(batch_size, hidden_size, dtype=otype).to(device)
    w31_weight = torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=otype).to(device) / 10
    w2_weight = torch.randn(num_experts, hidden_size, intermediate_size, dtype=otype).to(device) / 10
    selected_experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(batch_size)]).to(
        device
    )
    routing_weights = F.softmax(torch.randn((batch_size, top_k)).to(device), dim=1)
    w31_quant = torch.empty_like(w31_weight).to(torch.float8_e4m3fn)
    w2_quant = torch.empty_like(w2_weight).to(torch.float8_e4m3fn)
    w31_scales = torch.zeros(
        num_experts, ceil_div(2 * intermediate_size, 128), ceil_div(hidden_size, 128), dtype=torch.float32
    ).to(device)
    w2_scales = torch.zeros(
        num_experts, ceil_div(hidden_size, 128), ceil_div(intermediate_size, 128), dtype=torch.float32
    ).to(device)
    for expert_id in range(num_experts):
        w31, w31_s = per_block_cast_to_fp8(w31_weight[expert_id, :])
        w2, w2_s = per_block_cast_to_fp8(w2_weight[expert_id, :])
        w31_quant.data[expert_id].copy_(w31)
        w31_scales.data[expert_id].copy_(w31_s)
        w2_quant.data[expert_id].copy_(w2)
        w2_scales.data[expert_id].copy_(w2_s)
    x_dequant = group_dequantized(x).to(otype)
    w31_dequant = dequantize(w31_quant, w31_scales).to(otype)
    w2_dequant = dequantize(w2_quant, w2_scales).to(otype)
    ref_output = compute_with_experts(
        num_experts, x_dequant, w31_dequant, w2_dequant, selected_experts, routing_weights
    )
    flash_output = torch.zeros_like(x)
    _ = fused_moe.cutlass_fused_moe(
        x.contiguous(),
        selected_experts.to(torch.int),
        routing_weights,
        w31_quant.contiguous(),
        w2_quant.contiguous(),
        otype,
        use_deepseek_fp8_block_scale=True,
        quant_scales=[w31_scales.contiguous(), w2_scales.contiguous()],
        output=flash_output,
    )
    torch.testing.assert_close(flash_output, ref_output, rtol=1e-1, atol=1e-1)


# --- the quantisation formats kiln does not claim ---------------------------------------------------

ONE_OF = dict(otype=(torch.float16,), quantized_input=(False,), use_4over6=(False,), use_autotune=(False,))


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize(
    "otype, wtype", [(torch.float16, torch.float8_e4m3fn), (torch.bfloat16, torch.float8_e4m3fn)]
)
@pytest.mark.parametrize("quantized_input", [False, True])
@pytest.mark.parametrize(
    "activation_type",
    [ActivationType.Swiglu, ActivationType.SwigluStep, ActivationType.Relu2],
    ids=["swiglu", "swiglustep", "relu2"],
)
@pytest.mark.parametrize("use_4over6", [False, True])
@pytest.mark.parametrize("use_autotune", [False, True])
@pytest.mark.cpu_cases(activation_type=(ActivationType.Swiglu,), **ONE_OF)
def test_moe_nvfp4(
    device,
    batch_size,
    hidden_size,
    num_experts,
    top_k,
    intermediate_size,
    otype,
    wtype,
    quantized_input,
    activation_type,
    use_4over6,
    use_autotune,
):
    not_claimed("nvfp4 weights and activations (sm100 / sm110 / sm120 kernels)")


ALPHA_BETA_LIMIT = [(None, None, None), (0.5, 0.0, 7.0), (1.702, 1.0, 7.0)]


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize("otype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("alpha", "beta", "limit"), ALPHA_BETA_LIMIT)
@pytest.mark.parametrize("use_autotune", [False, True])
@pytest.mark.cpu_cases(alpha=(None,), **ONE_OF)
def test_moe_mxfp8_mxfp4(
    device,
    batch_size,
    hidden_size,
    num_experts,
    top_k,
    intermediate_size,
    otype,
    alpha,
    beta,
    limit,
    use_autotune,
):
    not_claimed("mxfp8 activations with mxfp4 weights (sm100 / sm110 / sm120 kernels)")


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize("otype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("alpha", "beta", "limit"), ALPHA_BETA_LIMIT)
@pytest.mark.parametrize("use_autotune", [False, True])
@pytest.mark.cpu_cases(alpha=(None,), **ONE_OF)
def test_moe_mxfp8_mxfp8(
    device,
    batch_size,
    hidden_size,
    num_experts,
    top_k,
    intermediate_size,
    otype,
    alpha,
    beta,
    limit,
    use_autotune,
):
    not_claimed("mxfp8 activations with mxfp8 weights (sm100 kernels)")


@pytest.mark.parametrize("otype", [torch.float16, torch.bfloat16])
@pytest.mark.cpu_cases(**ONE_OF)
def test_moe_mxfp8_mxfp8_clamped_relu2_epilogue_identity(device, otype):
    not_claimed("mxfp8 activations with mxfp8 weights (sm100 kernels)")


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize(("alpha", "beta", "limit"), ALPHA_BETA_LIMIT)
@pytest.mark.cpu_cases(alpha=(None,))
def test_moe_bf16_mxfp4(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, alpha, beta, limit
):
    not_claimed("bf16 activations with mxfp4 weights (W4A16, FlashInfer's sm90 mixed-input GEMM)")


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NUM_EXPERTS)
@pytest.mark.parametrize("top_k", TOP_K_VALUES)
@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("use_autotune", [False, True])
@pytest.mark.cpu_cases(dtype=(torch.bfloat16,), use_autotune=(False,))
def test_moe_w4a8(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, dtype, use_autotune
):
    not_claimed("w4a8: int4 weights with fp8 activations (FlashInfer's sm90 mixed-input GEMM)")


def test_moe_nvfp4_unswizzled_input_sf(device):
    not_claimed("nvfp4 weights and activations (sm100 / sm110 / sm120 kernels)")


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize(
    "hidden_size, intermediate_size", [(288, 128), (288, 192), (160, 192), (320, 160), (256, 192)]
)
@pytest.mark.parametrize("num_experts", [2])
@pytest.mark.parametrize("top_k", [2])
@pytest.mark.parametrize("otype, wtype", [(torch.bfloat16, torch.float8_e4m3fn)])
@pytest.mark.parametrize("quantized_input", [False])
@pytest.mark.parametrize("activation_type", [ActivationType.Swiglu], ids=["swiglu"])
@pytest.mark.parametrize("use_4over6", [False, True])
@pytest.mark.cpu_cases(batch_size=(1,), hidden_size=(288,), intermediate_size=(128,), use_4over6=(False,))
def test_moe_nvfp4_unaligned_hidden_size(
    device,
    batch_size,
    hidden_size,
    num_experts,
    top_k,
    intermediate_size,
    otype,
    wtype,
    quantized_input,
    activation_type,
    use_4over6,
):
    not_claimed("nvfp4 weights and activations (sm100 / sm110 / sm120 kernels)")


NDIM_PADDING_BATCH_SIZES = [1, 4, 8]
NDIM_PADDING_HIDDEN_SIZES = [2048]
NDIM_PADDING_NUM_EXPERTS = [128]
NDIM_PADDING_TOP_K = [8]
NDIM_PADDING_INTERMEDIATE_SIZES = [768, 1024]


@pytest.mark.parametrize("batch_size", NDIM_PADDING_BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", NDIM_PADDING_HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NDIM_PADDING_NUM_EXPERTS)
@pytest.mark.parametrize("top_k", NDIM_PADDING_TOP_K)
@pytest.mark.parametrize("intermediate_size", NDIM_PADDING_INTERMEDIATE_SIZES)
@pytest.mark.parametrize("quantized_input", [False, True])
@pytest.mark.cpu_cases(batch_size=(1,), intermediate_size=(768,), quantized_input=(False,))
def test_moe_nvfp4_ndim_padding_safety(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, quantized_input
):
    not_claimed("nvfp4 weights and activations (sm100 / sm110 / sm120 kernels)")


@pytest.mark.parametrize("batch_size", NDIM_PADDING_BATCH_SIZES)
@pytest.mark.parametrize("hidden_size", NDIM_PADDING_HIDDEN_SIZES)
@pytest.mark.parametrize("num_experts", NDIM_PADDING_NUM_EXPERTS)
@pytest.mark.parametrize("top_k", NDIM_PADDING_TOP_K)
@pytest.mark.parametrize("intermediate_size", NDIM_PADDING_INTERMEDIATE_SIZES)
@pytest.mark.cpu_cases(batch_size=(1,), intermediate_size=(768,))
def test_moe_mxfp8_mxfp4_ndim_padding_safety(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size
):
    not_claimed("mxfp8 activations with mxfp4 weights (sm100 / sm110 / sm120 kernels)")


W4A16_CORRECTNESS_CONFIGS = [
    (1, 128, 2, 2, 128),
    (4, 128, 4, 2, 128),
    (4, 768, 8, 2, 512),
    (4, 2048, 8, 4, 1024),
    (4, 4096, 8, 4, 2048),
]
W4A16_COVERAGE_CONFIGS = [
    (1, 4096, 256, 6, 2048),
    (4, 2048, 256, 6, 1024),
    (4, 4096, 8, 2, 2048),
    (4, 4096, 256, 1, 2048),
    (4, 4096, 256, 8, 2048),
]
W4A16_ACTIVATION_CONFIGS = [
    (4, 4096, 8, 4, 2048, None, None, None),
    (4, 4096, 8, 4, 2048, 0.5, 0.0, 7.0),
    (4, 4096, 8, 4, 2048, 1.702, 1.0, 7.0),
]
W4A16 = "bf16 activations with mxfp4 weights (W4A16, FlashInfer's sm90 mixed-input GEMM)"


@pytest.mark.parametrize(
    "batch_size,hidden_size,num_experts,top_k,intermediate_size",
    W4A16_CORRECTNESS_CONFIGS,
    ids=[f"m{c[0]}_h{c[1]}_e{c[2]}_k{c[3]}" for c in W4A16_CORRECTNESS_CONFIGS],
)
@pytest.mark.cpu_cases(batch_size=(1,))
def test_moe_bf16_mxfp4_hopper_correctness(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size
):
    not_claimed(W4A16)


@pytest.mark.parametrize(
    "batch_size,hidden_size,num_experts,top_k,intermediate_size",
    W4A16_COVERAGE_CONFIGS,
    ids=[f"m{c[0]}_h{c[1]}_e{c[2]}_k{c[3]}_n{c[4]}" for c in W4A16_COVERAGE_CONFIGS],
)
@pytest.mark.cpu_cases(batch_size=(1,))
def test_moe_bf16_mxfp4_hopper_coverage(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size
):
    not_claimed(W4A16)


@pytest.mark.parametrize(
    "batch_size,hidden_size,num_experts,top_k,intermediate_size,alpha,beta,limit",
    W4A16_ACTIVATION_CONFIGS,
    ids=["swiglu_default", "alpha_0.5", "alpha_1.702"],
)
@pytest.mark.cpu_cases(alpha=(None,))
def test_moe_bf16_mxfp4_hopper_activations(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, alpha, beta, limit
):
    not_claimed(W4A16)


HUMMING_CASES = ["small", "ep_rank1", "wide_offset", "small_k384", "small_k768", "e256_config", "e32_config"]
HUMMING = "fp8 activations with mxfp4 weights (humming, FlashInfer's sm90 mixed-input GEMM)"


@pytest.mark.parametrize("case_name", HUMMING_CASES)
@pytest.mark.parametrize("use_autotune", [False, True])
@pytest.mark.cpu_cases(case_name=("small",), use_autotune=(False,))
def test_moe_fp8_mxfp4_humming_prescale_hopper_correctness(device, case_name, use_autotune):
    not_claimed(HUMMING)


@pytest.mark.parametrize("tiny_stage", ["input", "post_activation"])
@pytest.mark.cpu_cases(tiny_stage=("input",))
def test_moe_fp8_mxfp4_humming_tiny_amax_stays_finite(device, tiny_stage):
    not_claimed(HUMMING)


W4A8_CORRECTNESS_CONFIGS = [(1, 512, 2, 2, 512), (4, 512, 2, 2, 512)]
W4A8 = "w4a8: int4 weights with fp8 activations (FlashInfer's sm90 mixed-input GEMM)"


@pytest.mark.parametrize(
    "batch_size,hidden_size,num_experts,top_k,intermediate_size",
    W4A8_CORRECTNESS_CONFIGS,
    ids=[f"m{c[0]}_h{c[1]}_e{c[2]}_k{c[3]}" for c in W4A8_CORRECTNESS_CONFIGS],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.cpu_cases(batch_size=(1,), dtype=(torch.bfloat16,))
def test_moe_w4a8_hopper_correctness(
    device, batch_size, hidden_size, num_experts, top_k, intermediate_size, dtype
):
    not_claimed(W4A8)


def test_moe_w4a8_hopper_autotune(device):
    not_claimed(W4A8)


def test_workspace_exact_size_accepted_with_packed_weights(device):
    not_claimed(W4A8)


# --- workspace_buffer and cutlass_fused_moe_workspace_size -------------------------------------------

_WS_CFG = dict(hidden_size=256, intermediate_size=512, num_experts=8, top_k=2, dtype=torch.bfloat16)


def _ws_tokens(device, tokens):
    """FlashInfer's token counts on CUDA; 96 on the CPU (past the decode-size path too)."""
    return tokens if device == "cuda" else 96


def _make_ws_inputs(num_tokens, device, cfg=_WS_CFG):
    E, K, H, inter = cfg["num_experts"], cfg["top_k"], cfg["hidden_size"], cfg["intermediate_size"]
    dtype = cfg["dtype"]
    x = torch.randn(num_tokens, H, dtype=dtype, device=device)
    topk_ids = torch.stack([torch.randperm(E, device=device)[:K] for _ in range(num_tokens)]).to(torch.int32)
    topk_w = torch.softmax(torch.randn(num_tokens, K, device=device), dim=1)
    w1 = torch.randn(E, 2 * inter, H, dtype=dtype, device=device) * 0.01
    w2 = torch.randn(E, H, inter, dtype=dtype, device=device) * 0.01
    return x, topk_ids, topk_w, w1, w2


def _call_ws(x, topk_ids, topk_w, w1, w2, workspace_buffer=None, **kwargs):
    return fused_moe.cutlass_fused_moe(
        x,
        topk_ids,
        topk_w,
        w1,
        w2,
        output_dtype=x.dtype,
        quant_scales=[],
        use_fused_finalize=False,
        tune_max_num_tokens=max(x.shape[0], 256),
        workspace_buffer=workspace_buffer,
        **kwargs,
    )


def _ws_size(num_tokens, cfg=_WS_CFG, *, ep_size=1, ep_rank=0, device=None):
    return fused_moe.cutlass_fused_moe_workspace_size(
        num_tokens,
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["num_experts"] * ep_size,
        cfg["top_k"],
        x_dtype=cfg["dtype"],
        weight_dtype=cfg["dtype"],
        ep_size=ep_size,
        ep_rank=ep_rank,
        use_fused_finalize=False,
        device=device,
    )


def test_workspace_size_positive_and_monotonic(device):
    sizes = [_ws_size(n) for n in [256, 1024, 4096, 8192]]
    assert all(s > 0 for s in sizes)
    assert all(sizes[i] <= sizes[i + 1] for i in range(len(sizes) - 1))


def test_workspace_buffered_matches_unbuffered(device):
    n = _ws_tokens(device, 256)
    inputs = _make_ws_inputs(n, device)
    out_unbuf = _call_ws(*inputs)[0]
    ws = torch.empty(_ws_size(n), dtype=torch.uint8, device=device)
    out_buf = _call_ws(*inputs, workspace_buffer=ws)[0]
    torch.testing.assert_close(out_unbuf, out_buf, rtol=0, atol=0)


def test_workspace_exact_size_accepted(device):
    n = _ws_tokens(device, 256)
    inputs = _make_ws_inputs(n, device)
    ws = torch.empty(_ws_size(n), dtype=torch.uint8, device=device)
    _call_ws(*inputs, workspace_buffer=ws)  # must not raise


def test_workspace_exact_size_accepted_with_ep(device):
    n = _ws_tokens(device, 256)
    inputs = _make_ws_inputs(n, device)
    ws = torch.empty(_ws_size(n, ep_size=2, ep_rank=0), dtype=torch.uint8, device=device)
    _call_ws(*inputs, workspace_buffer=ws, ep_size=2, ep_rank=0)


def test_workspace_undersized_rejected(device):
    inputs = _make_ws_inputs(_ws_tokens(device, 256), device)
    ws = torch.empty(1, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match="workspace_buffer too small"):
        _call_ws(*inputs, workspace_buffer=ws)


def test_workspace_wrong_dtype_rejected(device):
    n = _ws_tokens(device, 256)
    inputs = _make_ws_inputs(n, device)
    ws = torch.empty(_ws_size(n), dtype=torch.float32, device=device)
    with pytest.raises(RuntimeError, match="dtype must be int8 or uint8"):
        _call_ws(*inputs, workspace_buffer=ws)


@pytest.mark.cuda_only  # a workspace on the CPU for inputs on CUDA
def test_workspace_cpu_tensor_rejected(device):
    inputs = _make_ws_inputs(256, device)
    ws = torch.empty(_ws_size(256), dtype=torch.uint8, device="cpu")
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        _call_ws(*inputs, workspace_buffer=ws)


def test_workspace_wrong_ndim_rejected(device):
    n = _ws_tokens(device, 256)
    inputs = _make_ws_inputs(n, device)
    size = _ws_size(n)
    ws = torch.empty(size // 2, 2, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match="1-D"):
        _call_ws(*inputs, workspace_buffer=ws)


def test_workspace_noncontiguous_rejected(device):
    n = _ws_tokens(device, 64)
    inputs = _make_ws_inputs(n, device)
    size = _ws_size(n)
    ws = torch.empty(size * 2, dtype=torch.uint8, device=device)[::2]  # 1-D, stride 2
    assert not ws.is_contiguous()
    with pytest.raises(RuntimeError, match="contiguous"):
        _call_ws(*inputs, workspace_buffer=ws)


def test_workspace_size_rejects_nonpositive_dims(device):
    base = dict(
        hidden_size=256,
        intermediate_size=512,
        num_experts_total=8,
        top_k=2,
        x_dtype=torch.bfloat16,
        weight_dtype=torch.bfloat16,
    )
    size = fused_moe.cutlass_fused_moe_workspace_size
    with pytest.raises(ValueError, match="max_num_tokens"):
        size(0, **base)
    with pytest.raises(ValueError, match="max_num_tokens"):
        size(-1, **base)
    with pytest.raises(ValueError, match="hidden_size"):
        size(64, **{**base, "hidden_size": -1})
    with pytest.raises(ValueError, match="intermediate_size"):
        size(64, **{**base, "intermediate_size": -1})
    with pytest.raises(ValueError, match="num_experts_total"):
        size(64, **{**base, "num_experts_total": 0})
    with pytest.raises(ValueError, match="top_k"):
        size(64, **{**base, "top_k": 0})
    with pytest.raises(ValueError, match="divisible"):
        size(64, **{**base, "num_experts_total": 7}, ep_size=2)


@pytest.mark.cuda_only  # the CUDA caching allocator's statistics
def test_workspace_no_alloc_during_buffered_call(device):
    inputs = _make_ws_inputs(512, device)
    ws = torch.empty(_ws_size(512), dtype=torch.uint8, device=device)
    _call_ws(*inputs)  # warm the modules and tactics
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    _call_ws(*inputs, workspace_buffer=ws)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    max_expected = 512 * _WS_CFG["hidden_size"] * 2 * 4  # the output (~H * tokens * 2 bytes), 4x slack
    assert peak - before <= max_expected, (
        f"workspace_peak={peak - before} exceeds output-only budget {max_expected}"
    )


@pytest.mark.cuda_only  # CUDA graphs
def test_workspace_cuda_graph_capture_replay(device):
    num_tokens = 128
    inputs = _make_ws_inputs(num_tokens, device)
    ws = torch.empty(_ws_size(num_tokens), dtype=torch.uint8, device=device)
    for _ in range(3):
        _call_ws(*inputs, workspace_buffer=ws)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _call_ws(*inputs, workspace_buffer=ws)
    graph.replay()
    torch.cuda.synchronize()
    out_eager = _call_ws(*inputs, workspace_buffer=ws)
    out_t = out[0] if isinstance(out, (list, tuple)) else out
    out_e = out_eager[0] if isinstance(out_eager, (list, tuple)) else out_eager
    torch.testing.assert_close(out_t, out_e, rtol=0, atol=0)


def _small_moe_inputs(m, hidden, inter, e, top_k, device, dtype=torch.bfloat16):
    w31 = torch.randn(e, 2 * inter, hidden, dtype=dtype, device=device) / 10
    w2 = torch.randn(e, hidden, inter, dtype=dtype, device=device) / 10
    logits = torch.randn(m, e, dtype=torch.float32, device=device)
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k)
    return w31, w2, weights.float().contiguous(), ids.to(torch.int)


def test_vectorized_kernel_rejects_misaligned_input(device):
    """FlashInfer refuses an input whose base is not 16-byte aligned; kiln computes it (its copies
    take narrower vectors there), within the bf16 layer tolerance of docs/moe.md."""
    torch.manual_seed(42)
    m, hidden, inter, e, top_k = 4, 128, 128, 8, 2
    w31, w2, weights, ids = _small_moe_inputs(m, hidden, inter, e, top_k, device)
    buf = torch.randn(m * hidden + 8, dtype=torch.bfloat16, device=device)
    x = buf[1 : 1 + m * hidden].view(m, hidden)  # contiguous, 2- but not 16-byte aligned
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    out = fused_moe.cutlass_fused_moe(
        x, ids, weights, w31, w2, torch.bfloat16, quant_scales=None, output=torch.empty_like(x)
    )[0]
    ref = compute_with_experts(e, x, w31, w2, ids, weights)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    assert math.isfinite(float(out.float().abs().sum()))
