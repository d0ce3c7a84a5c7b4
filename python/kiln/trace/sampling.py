"""Trace templates of kiln.sampling's APIs, and the one reference implementation of the sampler.

The reference, written from the definitions in float64:
  - softmax(l / T); top-k keeps p >= the k-th largest p (ties at the threshold stay); top-p keeps
    the smallest prefix of the descending probabilities whose sum reaches top_p (the crossing token
    included, and every token tied with it); min-p keeps p >= min_p * max p; "top_k_first" applies
    top-k, renormalises, then top-p; "joint" keeps what passes both on the original distribution.
  - filtered_probs(...): the kept tokens' probabilities renormalised, zero elsewhere (the
    distribution a sampler must draw from; the renorm APIs' output).
  - draw(probs, u): the inverse CDF in vocabulary order at u, the first index whose running
    probability exceeds u * total (-1 for a row without mass).
  - philox_uniforms(seed, offset, rows): the uniforms kiln's kernels draw (Philox4x32-10 keyed by
    the seed, counter (offset, row, draw)), so draw(filtered, philox_uniforms(...)) is the token
    kiln gives for that seed, except where u falls within rounding of a CDF boundary.

Axes: `batch_size` (var: rows sampled) x `vocab` (const). The sampling templates' inputs put one
dominant token in every row (its logit 30 above the others'), so every correct sampler draws it
whatever its random stream (the others together hold ~1e-8 of the mass): the benchmark harness can
check torch's samplers and FlashInfer against the reference. The distributions themselves are
tested statistically in tests/ops/sampling.
"""

from __future__ import annotations

import torch

from .examples import DECODE_BATCHES, LLM_MODELS
from .template import Example, Scalar, Tensor, TraceTemplate, const, var

# The vocabularies of the models (their config.json files, as in examples.py).
VOCAB = {"llama-3.1-8b": 128256, "llama-3.1-70b": 128256, "qwen3-32b": 151936}
# Llama-3.1-70B shares the 8B's vocabulary: no shape of its own.
MODELS = tuple(m for m in LLM_MODELS if m.name != "llama-3.1-70b")
# Requests that finish their prefill in one step and sample their first token.
PREFILL_BATCHES = (1, 8, 32)
DOMINANT = 30.0  # the dominant token's logit lead in the benchmark inputs

AXES = {
    "batch_size": var("rows sampled in one call: the decode batch"),
    "vocab": const(doc="the vocabulary size"),
}
SPEC_AXES = {
    "batch_size": var("requests verified in one call"),
    "num_speculate_tokens": const(4, "draft tokens per request"),
    "vocab": const(doc="the vocabulary size"),
}
ROWS = Tensor(("batch_size", "vocab"))
PROBS = Tensor(("batch_size", "vocab"), "float32")
SAMPLES = Tensor(("batch_size",), "int32", "the drawn token of each row")
SMALL = ({"batch_size": 1}, {"batch_size": 3})
EXAMPLES = tuple(
    Example(
        name=f"{m.name}-{phase}",
        model=m.name,
        phase=phase,
        consts={"vocab": VOCAB[m.name]},
        workloads=tuple({"batch_size": b} for b in batches),
        source=m.source,
    )
    for m in MODELS
    for phase, batches in (("decode", DECODE_BATCHES), ("prefill", PREFILL_BATCHES))
)
EXACT_F32 = {"float32": (0.0, 0.0)}
EXACT_ALL = {"float32": (0.0, 0.0), "bfloat16": (0.0, 0.0), "float16": (0.0, 0.0)}
# softmax/renormalised probabilities: float32 arithmetic (exp within a few ulp, and a float32 sum
# over up to 1.5e5 entries, whose rounding grows like sqrt(n) * 2^-24 ~ 2e-5 for a plain sum, as
# torch's peers do) against float64: 1e-4 relative, and an absolute floor for the smallest entries.
PROBS_TOL = {"float32": (1e-4, 1e-9)}
SOFTMAX_TOL = {"float32": (1e-4, 1e-9), "bfloat16": (1e-4, 1e-9), "float16": (1e-4, 1e-9)}

SAMPLING_OPTIONS = {
    "indices": "rows sharing one distribution (the workload has one row per sample)",
    "deterministic": "FlashInfer's switch; kiln's kernels are always deterministic",
    "generator": "the random stream: no part of the workload",
    "check_nan": "a host-side NaN scan before the launch (a diagnostic)",
    "seed": "the random stream: no part of the workload",
    "offset": "the random stream: no part of the workload",
}
RETURN_VALID = {"return_valid": "also returns samples >= 0 (rows that had a valid distribution)"}
ORDER = {"filter_apply_order": "top_k_first (the workload) or joint"}


# --- the reference ------------------------------------------------------------------------------


def softmax_float64(logits, temperature=None):
    x = logits.double()
    if temperature is not None:
        t = torch.as_tensor(temperature, dtype=torch.float64, device=x.device)
        x = x / (t.reshape(-1, 1) if t.dim() else t)
    x = torch.where(x.isnan(), torch.full_like(x, -torch.inf), x)
    return torch.softmax(x, dim=-1).nan_to_num(0.0)


def _per_row(value, rows, dtype, device):
    t = torch.as_tensor(value, dtype=dtype, device=device)
    return t.expand(rows) if t.dim() == 0 else t


def top_k_mask(probs, top_k):
    """Tokens with p >= the k-th largest p of their row (k <= 0 or k >= vocab: every token)."""
    rows, vocab = probs.shape
    k = _per_row(top_k, rows, torch.int64, probs.device)
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    desc = probs.sort(dim=-1, descending=True).values
    kth = desc.gather(1, (k - 1).reshape(-1, 1))
    return probs >= kth


def top_p_mask(probs, top_p, domain=None):
    """The smallest prefix of the descending probabilities (of `domain`, renormalised) whose sum
    reaches top_p, the crossing token and every token tied with it included (top_p >= 1: all)."""
    rows, _ = probs.shape
    p = probs if domain is None else torch.where(domain, probs, torch.zeros_like(probs))
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    tp = _per_row(top_p, rows, torch.float64, probs.device).reshape(-1, 1)
    desc = p.sort(dim=-1, descending=True).values
    before = desc.cumsum(-1) - desc  # the mass strictly above each position
    crossing = (before < tp).sum(-1, keepdim=True).clamp(min=1)  # positions kept
    threshold = desc.gather(1, crossing - 1)
    keep = (p >= threshold) & (p > 0)
    keep = keep | (tp >= 1)
    return keep if domain is None else keep & domain


def min_p_mask(probs, min_p):
    rows, _ = probs.shape
    mp = _per_row(min_p, rows, torch.float64, probs.device).reshape(-1, 1)
    return probs >= mp * probs.amax(-1, keepdim=True)


def renormalized(probs, keep):
    p = torch.where(keep, probs, torch.zeros_like(probs))
    s = p.sum(-1, keepdim=True)
    return torch.where(s > 0, p / s.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(p))


def filtered_probs(probs, top_k=None, top_p=None, min_p=None, order="top_k_first"):
    """The distribution kiln's samplers draw from, in float64: probs (any scale, NaN and negative
    entries as 0) filtered and renormalised."""
    p = probs.double()
    p = torch.where(p.isfinite() & (p > 0), p, torch.zeros_like(p))
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k is not None:
        keep &= top_k_mask(p, top_k)
    if top_p is not None:
        keep &= top_p_mask(p, top_p, domain=keep if order == "top_k_first" else None)
    if min_p is not None:
        keep &= min_p_mask(p, min_p)
    return renormalized(p, keep)


_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_M32 = 0xFFFFFFFF


def _mulhilo(a: int, b):
    """(hi, lo) 32-bit words of the constant a times the int64 tensor b (< 2^32), without int64
    overflow: b split into 16-bit halves."""
    b_lo, b_hi = b & 0xFFFF, b >> 16
    t_lo = a * b_lo  # < 2^48
    t_hi = a * b_hi  # < 2^48
    mid = t_lo + ((t_hi & 0xFFFF) << 16)  # < 2^49
    return (t_hi >> 16) + (mid >> 32), mid & _M32


def philox_uniforms(seed: int, offset: int, rows: int, draw: int = 0, device="cpu"):
    """The two 64-bit words of Philox4x32-10 for each output row, as kiln's kernels compute them:
    key (seed lo, seed hi), counter (offset lo, offset hi, row, draw). Returns (a, b), each the
    top 53 bits of its word as a float64 in [0, 1)."""
    row = torch.arange(rows, dtype=torch.int64, device=device)
    c = [
        torch.full_like(row, offset & _M32),
        torch.full_like(row, (offset >> 32) & _M32),
        row & _M32,
        torch.full_like(row, draw & _M32),
    ]
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c[0])
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32

    def unit(hi, lo):  # (hi << 32 | lo) >> 11, as a fraction of 2^53
        return ((hi << 21) | (lo >> 11)).double() / 2.0**53

    return unit(c[0], c[1]), unit(c[2], c[3])


def draw(probs, u):
    """The inverse CDF in vocabulary order: the first index whose running probability exceeds
    u * total; -1 for a row whose total is 0."""
    p = probs.double()
    cdf = p.cumsum(-1)
    total = cdf[:, -1:]
    target = u.reshape(-1, 1).to(p.device) * total
    idx = (cdf <= target).sum(-1).clamp(max=p.shape[-1] - 1)
    return torch.where(total.squeeze(-1) > 0, idx, torch.full_like(idx, -1))


def _uniforms(rows, device, seed=None, offset=None):
    if seed is None:  # a reference draw of its own (the benchmark inputs make every draw agree)
        return torch.rand(rows, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    return philox_uniforms(int(seed), int(offset or 0), rows, device=device)[0]


def _rows_of(x, indices):
    return x if indices is None else x[indices.long()]


def sample_reference(probs, indices=None, seed=None, offset=None, **filters):
    p = filtered_probs(_rows_of(probs, indices), **filters)
    return draw(p, _uniforms(p.shape[0], p.device, seed, offset)).to(
        torch.int32 if indices is None else indices.dtype
    )


def speculative_reference(draft_probs, draft_token_ids, target_probs, seed=None, offset=None):
    """Chain speculative sampling from its definition: draft token j is accepted when
    u_j * p_j(d_j) < q_j(d_j) (probability min(1, q / p)); the first rejected position draws from
    max(q - p, 0) renormalised (q where that has no mass), and when all n are accepted the bonus
    token is drawn from q_n. Returns (output_token_ids, accepted (the positions whose test passes,
    counted independently), emitted (draft tokens emitted))."""
    batch, n, _ = draft_probs.shape
    q, p = target_probs.double(), draft_probs.double()
    ids = draft_token_ids.long()
    out = torch.full((batch, n + 1), -1, dtype=torch.int32)
    accepted = torch.zeros(batch, dtype=torch.int32)
    emitted = torch.zeros(batch, dtype=torch.int32)
    for b in range(batch):
        e = n
        for j in range(n):
            if seed is None:
                u = float(
                    torch.rand((), dtype=torch.float64, generator=torch.Generator().manual_seed(b * 131 + j))
                )
            else:
                u = float(philox_uniforms(int(seed), int(offset or 0), batch, draw=j)[0][b])
            d = int(ids[b, j])
            ok = u * float(p[b, j, d]) < float(q[b, j, d])
            accepted[b] += int(ok)
            if not ok and e == n:
                e = j
        out[b, :e] = ids[b, :e].int()
        emitted[b] = e
        if seed is None:
            u2 = torch.rand((1,), dtype=torch.float64, generator=torch.Generator().manual_seed(b))
        else:
            u2 = philox_uniforms(int(seed), int(offset or 0), batch, draw=e)[1][b : b + 1]
        row = (q[b, e] - p[b, e]).clamp_min(0) if e < n else q[b, e]
        if e < n and float(row.sum()) <= 0:
            row = q[b, e]
        out[b, e] = int(draw(row.reshape(1, -1), u2)[0])
    return out, accepted, emitted


# --- template references (outputs by name) -----------------------------------------------------


def softmax_reference(logits, temperature):
    return {"probs": softmax_float64(logits, temperature)}


def sampling_from_probs_reference(probs):
    return {"samples": sample_reference(probs)}


def sampling_from_logits_reference(logits):
    return {"samples": sample_reference(softmax_float64(logits))}


def top_k_sampling_from_probs_reference(probs, top_k):
    return {"samples": sample_reference(probs, top_k=top_k)}


def top_p_sampling_from_probs_reference(probs, top_p):
    return {"samples": sample_reference(probs, top_p=top_p)}


def min_p_sampling_from_probs_reference(probs, min_p):
    return {"samples": sample_reference(probs, min_p=min_p)}


def top_k_top_p_sampling_from_probs_reference(probs, top_k, top_p):
    return {"samples": sample_reference(probs, top_k=top_k, top_p=top_p)}


def top_k_top_p_sampling_from_logits_reference(logits, top_k, top_p):
    return {"samples": sample_reference(softmax_float64(logits), top_k=top_k, top_p=top_p)}


def top_k_renorm_probs_reference(probs, top_k):
    return {"renorm_probs": filtered_probs(probs, top_k=top_k)}


def top_p_renorm_probs_reference(probs, top_p):
    return {"renorm_probs": filtered_probs(probs, top_p=top_p)}


def top_k_mask_logits_reference(logits, top_k):
    keep = top_k_mask(softmax_float64(logits), top_k)
    return {
        "masked_logits": torch.where(
            keep, logits.double(), torch.full_like(logits, -torch.inf, dtype=torch.float64)
        )
    }


def chain_speculative_sampling_reference(draft_probs, draft_token_ids, target_probs):
    out, acc, emi = speculative_reference(draft_probs, draft_token_ids, target_probs)
    return {"output_token_ids": out, "output_accepted_token_num": acc, "output_emitted_draft_token_num": emi}


# --- benchmark inputs ---------------------------------------------------------------------------


def dominant_logits(axes, dtype, device, gen, rows_axis="batch_size"):
    """Standard-normal logits with one token per row DOMINANT above the others."""
    rows, vocab = axes[rows_axis], axes["vocab"]
    logits = torch.randn((rows, vocab), generator=gen, dtype=torch.float32)
    top = torch.randint(0, vocab, (rows,), generator=gen)
    logits[torch.arange(rows), top] += DOMINANT
    return logits, top


def logits_inputs(template, axes, dtype, device, gen):
    logits, _ = dominant_logits(axes, dtype, device, gen)
    return {"logits": logits.to(device=device, dtype=getattr(torch, dtype))}


def probs_inputs(template, axes, dtype, device, gen):
    logits, _ = dominant_logits(axes, dtype, device, gen)
    return {"probs": torch.softmax(logits, -1).to(device)}


def random_probs_inputs(template, axes, dtype, device, gen):
    """Renormalisation: probabilities of random logits (no dominant token: a spread-out row)."""
    logits = 3.0 * torch.randn((axes["batch_size"], axes["vocab"]), generator=gen)
    return {"probs": torch.softmax(logits, -1).to(device)}


def speculative_inputs(template, axes, dtype, device, gen):
    b, n, v = axes["batch_size"], axes["num_speculate_tokens"], axes["vocab"]
    flat = {"batch_size": b * (n + 1), "vocab": v}
    logits, top = dominant_logits(flat, dtype, device, gen)
    target = torch.softmax(logits, -1).reshape(b, n + 1, v)
    draft = torch.softmax(logits + 0.1 * torch.randn(logits.shape, generator=gen), -1).reshape(b, n + 1, v)[
        :, :n
    ]
    ids = top.reshape(b, n + 1)[:, :n].to(torch.int32)
    return {
        "draft_probs": draft.contiguous().to(device),
        "draft_token_ids": ids.to(device),
        "target_probs": target.to(device),
    }


def _template(name, description, inputs, outputs, reference, tolerance, make_inputs, options):
    return TraceTemplate(
        name=name,
        target="//ops:sampling",
        description=description,
        axes=SPEC_AXES if name == "chain_speculative_sampling" else AXES,
        inputs=inputs,
        outputs=outputs,
        reference=reference,
        tolerance=tolerance,
        examples=SPEC_EXAMPLES if name == "chain_speculative_sampling" else EXAMPLES,
        small=SMALL,
        make_inputs=make_inputs,
        options=options,
    )


SPEC_EXAMPLES = tuple(
    Example(
        name=f"{m.name}-{phase}",
        model=m.name,
        phase=phase,
        consts={"vocab": VOCAB[m.name]},
        workloads=tuple({"batch_size": b} for b in batches),
        source=m.source,
    )
    for m in LLM_MODELS[:1]
    for phase, batches in (("decode", (1, 16, 64, 256)), ("prefill", (1, 8)))
)

TOP_K = Scalar("int64", 50, "tokens kept by top-k (a scalar here; a per-row tensor works too)")
TOP_P = Scalar("float32", 0.9, "the top-p mass (a scalar here; a per-row tensor works too)")
MIN_P = Scalar("float32", 0.1, "min-p's fraction of the largest probability")
LOGITS = {"logits": ROWS}
PROBS_IN = {"probs": PROBS}
SAMPLE_OUT = {"samples": SAMPLES}

SOFTMAX = _template(
    "softmax",
    "probs = softmax(logits / temperature) per row",
    {"logits": ROWS, "temperature": Scalar("float32", None, "a scalar or one value per row; None: 1")},
    {"probs": PROBS},
    softmax_reference,
    SOFTMAX_TOL,
    None,
    {"enable_pdl": "FlashInfer's launch switch; no effect in kiln"},
)
SAMPLING_FROM_PROBS = _template(
    "sampling_from_probs",
    "a token drawn from each row of probs",
    PROBS_IN,
    SAMPLE_OUT,
    sampling_from_probs_reference,
    EXACT_F32,
    probs_inputs,
    {**SAMPLING_OPTIONS, **RETURN_VALID},
)
SAMPLING_FROM_LOGITS = _template(
    "sampling_from_logits",
    "a token drawn from softmax(logits) per row",
    LOGITS,
    SAMPLE_OUT,
    sampling_from_logits_reference,
    EXACT_ALL,
    logits_inputs,
    SAMPLING_OPTIONS,
)
TOP_K_SAMPLING_FROM_PROBS = _template(
    "top_k_sampling_from_probs",
    "a token drawn from the top-k tokens, renormalised",
    {"probs": PROBS, "top_k": TOP_K},
    SAMPLE_OUT,
    top_k_sampling_from_probs_reference,
    EXACT_F32,
    probs_inputs,
    {**SAMPLING_OPTIONS, **RETURN_VALID},
)
TOP_P_SAMPLING_FROM_PROBS = _template(
    "top_p_sampling_from_probs",
    "a token drawn from the top-p nucleus, renormalised",
    {"probs": PROBS, "top_p": TOP_P},
    SAMPLE_OUT,
    top_p_sampling_from_probs_reference,
    EXACT_F32,
    probs_inputs,
    {**SAMPLING_OPTIONS, **RETURN_VALID},
)
MIN_P_SAMPLING_FROM_PROBS = _template(
    "min_p_sampling_from_probs",
    "a token drawn from the tokens with p >= min_p * max p, renormalised",
    {"probs": PROBS, "min_p": MIN_P},
    SAMPLE_OUT,
    min_p_sampling_from_probs_reference,
    EXACT_F32,
    probs_inputs,
    {**SAMPLING_OPTIONS, **RETURN_VALID},
)
TOP_K_TOP_P_SAMPLING_FROM_PROBS = _template(
    "top_k_top_p_sampling_from_probs",
    "top-k, renormalise, top-p, then a draw",
    {"probs": PROBS, "top_k": TOP_K, "top_p": TOP_P},
    SAMPLE_OUT,
    top_k_top_p_sampling_from_probs_reference,
    EXACT_F32,
    probs_inputs,
    {**SAMPLING_OPTIONS, **RETURN_VALID, **ORDER},
)
TOP_K_TOP_P_SAMPLING_FROM_LOGITS = _template(
    "top_k_top_p_sampling_from_logits",
    "softmax, top-k, renormalise, top-p, then a draw",
    {"logits": ROWS, "top_k": TOP_K, "top_p": TOP_P},
    SAMPLE_OUT,
    top_k_top_p_sampling_from_logits_reference,
    EXACT_ALL,
    logits_inputs,
    {**SAMPLING_OPTIONS, **ORDER},
)
TOP_K_RENORM_PROBS = _template(
    "top_k_renorm_probs",
    "probs of the top-k tokens renormalised, 0 elsewhere",
    {"probs": PROBS, "top_k": TOP_K},
    {"renorm_probs": PROBS},
    top_k_renorm_probs_reference,
    PROBS_TOL,
    random_probs_inputs,
    {"is_deterministic": "FlashInfer's switch; kiln is always deterministic"},
)
TOP_P_RENORM_PROBS = _template(
    "top_p_renorm_probs",
    "probs of the top-p nucleus renormalised, 0 elsewhere",
    {"probs": PROBS, "top_p": TOP_P},
    {"renorm_probs": PROBS},
    top_p_renorm_probs_reference,
    PROBS_TOL,
    random_probs_inputs,
    {"is_deterministic": "FlashInfer's switch; kiln is always deterministic"},
)
TOP_K_MASK_LOGITS = _template(
    "top_k_mask_logits",
    "logits of the top-k tokens, -inf elsewhere",
    {"logits": ROWS, "top_k": TOP_K},
    {"masked_logits": ROWS},
    top_k_mask_logits_reference,
    EXACT_ALL,
    None,
    {},
)
CHAIN_SPECULATIVE_SAMPLING = _template(
    "chain_speculative_sampling",
    "verify a chain of draft tokens against the target model's probabilities",
    {
        "draft_probs": Tensor(("batch_size", "num_speculate_tokens", "vocab"), "float32"),
        "draft_token_ids": Tensor(("batch_size", "num_speculate_tokens"), "int32"),
        "target_probs": Tensor(("batch_size", "num_speculate_tokens + 1", "vocab"), "float32"),
    },
    {
        "output_token_ids": Tensor(("batch_size", "num_speculate_tokens + 1"), "int32"),
        "output_accepted_token_num": Tensor(("batch_size",), "int32"),
        "output_emitted_draft_token_num": Tensor(("batch_size",), "int32"),
    },
    chain_speculative_sampling_reference,
    EXACT_F32,
    speculative_inputs,
    {
        "maybe_output_accepted_token_num": "counts added to in place (an output buffer)",
        "maybe_output_emitted_draft_token_num": "counts added to in place (an output buffer)",
        "deterministic": SAMPLING_OPTIONS["deterministic"],
        "generator": SAMPLING_OPTIONS["generator"],
        "seed": SAMPLING_OPTIONS["seed"],
        "offset": SAMPLING_OPTIONS["offset"],
    },
)
