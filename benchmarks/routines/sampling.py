"""Routines of kiln.sampling, each against torch (what a serving stack writes without a kernel) and
FlashInfer (when importable; CUDA only).

top_k_top_p_sampling_from_logits has two torch peers, side by side (its target: the faster one):
  torch       vLLM's native sampler: sort the row, mask below the k-th and past the top-p
              prefix, softmax, and an exponential-race draw (probs / Exp(1), argmax);
  torch_topk  topk(k) first, softmax of the k, the top-p prefix among them, multinomial.
The trace templates' inputs give every row one dominant token, so every correct sampler draws it
whatever its random stream, and the harness checks each backend against the reference.
Bytes per call: the input read once and the output written (the template's tensors).
"""

from __future__ import annotations

import torch

import kiln

from ..routine import Backend, Routine
from .norm import _flashinfer, cuda_only, flashinfer_version, kiln_version, torch_version


def flashinfer_available(device: torch.device, dtype: str) -> str | None:
    return cuda_only(device) or _flashinfer()[1]


def _fi(name):
    return getattr(_flashinfer()[0].sampling, name)


# --- torch implementations ----------------------------------------------------------------------


def multinomial(probs):
    return torch.multinomial(probs, 1).squeeze(-1).to(torch.int32)


def exponential_race(probs):
    """vLLM's random_sample: argmax(probs / Exp(1)), a draw from probs without a CDF."""
    q = torch.empty_like(probs).exponential_()
    return probs.div(q).argmax(-1).to(torch.int32)


def sort_top_k_top_p(logits, k, p):
    """vLLM's apply_top_k_top_p (the native sampler): masked logits in the original order."""
    logits_sort, idx = logits.sort(dim=-1, descending=False)
    kth = logits_sort.gather(
        1,
        (logits_sort.size(1) - torch.as_tensor(k, device=logits.device))
        .reshape(-1, 1)
        .expand(logits.shape[0], 1)
        .long(),
    )
    logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    cum = probs_sort.cumsum(dim=-1)
    mask = cum <= 1 - p
    mask[:, -1] = False
    logits_sort = logits_sort.masked_fill(mask, float("-inf"))
    return logits_sort.scatter(dim=-1, index=idx, src=logits_sort)


def topk_first_top_p(values_desc, p):
    """Probabilities of the top-k values (descending), with the top-p prefix kept."""
    probs = values_desc.softmax(-1)
    cum = probs.cumsum(-1)
    return probs.masked_fill(cum - probs >= p, 0.0)


def torch_top_k_top_p_logits(inp, ctx):
    x, k, p = inp["logits"].float(), inp["top_k"], inp["top_p"]
    return lambda: exponential_race(sort_top_k_top_p(x, k, p).softmax(-1))


def torch_topk_top_k_top_p_logits(inp, ctx):
    x, k, p = inp["logits"], inp["top_k"], inp["top_p"]

    def run():
        vals, idx = x.float().topk(k, dim=-1)
        return idx.gather(1, torch.multinomial(topk_first_top_p(vals, p), 1)).squeeze(-1).to(torch.int32)

    return run


def torch_top_k_top_p_probs(inp, ctx):
    probs, k, p = inp["probs"], inp["top_k"], inp["top_p"]

    def run():
        vals, idx = probs.topk(k, dim=-1)
        vals = vals / vals.sum(-1, keepdim=True)
        cum = vals.cumsum(-1)
        vals = vals.masked_fill(cum - vals >= p, 0.0)
        return idx.gather(1, torch.multinomial(vals, 1)).squeeze(-1).to(torch.int32)

    return run


def torch_top_k_probs(inp, ctx):
    probs, k = inp["probs"], inp["top_k"]

    def run():
        vals, idx = probs.topk(k, dim=-1)
        return idx.gather(1, torch.multinomial(vals, 1)).squeeze(-1).to(torch.int32)

    return run


def torch_top_p_probs(inp, ctx):
    probs, p = inp["probs"], inp["top_p"]

    def run():
        vals, idx = probs.sort(dim=-1, descending=True)
        cum = vals.cumsum(-1)
        vals = vals.masked_fill(cum - vals >= p, 0.0)
        return idx.gather(1, torch.multinomial(vals, 1)).squeeze(-1).to(torch.int32)

    return run


def torch_min_p_probs(inp, ctx):
    probs, m = inp["probs"], inp["min_p"]
    return lambda: multinomial(probs.masked_fill(probs < m * probs.amax(-1, keepdim=True), 0.0))


def torch_sampling_from_probs(inp, ctx):
    probs = inp["probs"]
    return lambda: multinomial(probs)


def torch_sampling_from_logits(inp, ctx):
    x = inp["logits"]
    return lambda: multinomial(x.float().softmax(-1))


def torch_softmax(inp, ctx):
    x, t = inp["logits"], inp["temperature"]
    return lambda: (x.float() / (1.0 if t is None else t)).softmax(-1)


def torch_top_k_renorm(inp, ctx):
    probs, k = inp["probs"], inp["top_k"]

    def run():
        kth = probs.topk(k, dim=-1).values[:, -1:]
        kept = probs.masked_fill(probs < kth, 0.0)
        return kept / kept.sum(-1, keepdim=True)

    return run


def torch_top_p_renorm(inp, ctx):
    probs, p = inp["probs"], inp["top_p"]

    def run():
        vals, idx = probs.sort(dim=-1, descending=True)
        cum = vals.cumsum(-1)
        vals = vals.masked_fill(cum - vals >= p, 0.0)
        kept = torch.zeros_like(probs).scatter(-1, idx, vals)
        return kept / kept.sum(-1, keepdim=True)

    return run


def torch_top_k_mask(inp, ctx):
    x, k = inp["logits"], inp["top_k"]

    def run():
        kth = x.topk(k, dim=-1).values[:, -1:]
        return x.masked_fill(x < kth, float("-inf"))

    return run


def torch_speculative(inp, ctx):
    draft, ids, target = inp["draft_probs"], inp["draft_token_ids"].long(), inp["target_probs"]

    def run():
        b, n, _ = draft.shape
        rows = torch.arange(b, device=draft.device)
        p = draft.gather(2, ids.unsqueeze(-1)).squeeze(-1)
        q = target[:, :n].gather(2, ids.unsqueeze(-1)).squeeze(-1)
        ok = torch.rand((b, n), device=draft.device) * p < q
        accepted = ok.sum(1).to(torch.int32)
        emitted = torch.where(ok.all(1), n, (~ok).int().argmax(1)).to(torch.int32)
        at = emitted.long()
        q_e = target[rows, at]
        p_e = torch.cat([draft, torch.zeros_like(draft[:, :1])], 1)[rows, at]
        resid = (q_e - p_e).clamp_min(0)
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, q_e)
        token = torch.multinomial(resid, 1).squeeze(-1)
        out = torch.full((b, n + 1), -1, dtype=torch.int32, device=draft.device)
        cols = torch.arange(n + 1, device=draft.device)
        out = torch.where(cols < at.unsqueeze(1), torch.cat([ids, ids[:, :1]], 1).int(), out)
        out[rows, at] = token.int()
        return out, accepted, emitted

    return run


# --- kiln and FlashInfer ------------------------------------------------------------------------


def kiln_call(api, *names):
    def setup(inp, ctx):
        args = [inp[n] for n in names]
        return lambda: api(*args)

    return setup


def flashinfer_call(name, *names):
    def setup(inp, ctx):
        fn = _fi(name)
        args = [inp[n] for n in names]
        return lambda: fn(*args)

    return setup


def _routine(api, torch_setup, names, extra=()):
    name = api.__kiln_trace__.name
    return Routine(
        api=api,
        backends=(
            Backend("kiln", kiln_call(api, *names), version=kiln_version),
            Backend("torch", torch_setup, version=torch_version),
            *extra,
            Backend(
                "flashinfer",
                flashinfer_call(name, *names),
                available=flashinfer_available,
                version=flashinfer_version,
            ),
        ),
    )


SOFTMAX = _routine(kiln.softmax, torch_softmax, ("logits", "temperature"))
SAMPLING_FROM_PROBS = _routine(kiln.sampling_from_probs, torch_sampling_from_probs, ("probs",))
SAMPLING_FROM_LOGITS = _routine(kiln.sampling_from_logits, torch_sampling_from_logits, ("logits",))
TOP_K_SAMPLING_FROM_PROBS = _routine(kiln.top_k_sampling_from_probs, torch_top_k_probs, ("probs", "top_k"))
TOP_P_SAMPLING_FROM_PROBS = _routine(kiln.top_p_sampling_from_probs, torch_top_p_probs, ("probs", "top_p"))
MIN_P_SAMPLING_FROM_PROBS = _routine(kiln.min_p_sampling_from_probs, torch_min_p_probs, ("probs", "min_p"))
TOP_K_TOP_P_SAMPLING_FROM_PROBS = _routine(
    kiln.top_k_top_p_sampling_from_probs, torch_top_k_top_p_probs, ("probs", "top_k", "top_p")
)
TOP_K_TOP_P_SAMPLING_FROM_LOGITS = _routine(
    kiln.top_k_top_p_sampling_from_logits,
    torch_top_k_top_p_logits,
    ("logits", "top_k", "top_p"),
    extra=(Backend("torch_topk", torch_topk_top_k_top_p_logits, version=torch_version),),
)
TOP_K_RENORM_PROBS = _routine(kiln.top_k_renorm_probs, torch_top_k_renorm, ("probs", "top_k"))
TOP_P_RENORM_PROBS = _routine(kiln.top_p_renorm_probs, torch_top_p_renorm, ("probs", "top_p"))
TOP_K_MASK_LOGITS = _routine(kiln.top_k_mask_logits, torch_top_k_mask, ("logits", "top_k"))
CHAIN_SPECULATIVE_SAMPLING = _routine(
    kiln.chain_speculative_sampling, torch_speculative, ("draft_probs", "draft_token_ids", "target_probs")
)

ROUTINES = (
    SOFTMAX,
    SAMPLING_FROM_PROBS,
    SAMPLING_FROM_LOGITS,
    TOP_K_SAMPLING_FROM_PROBS,
    TOP_P_SAMPLING_FROM_PROBS,
    MIN_P_SAMPLING_FROM_PROBS,
    TOP_K_TOP_P_SAMPLING_FROM_PROBS,
    TOP_K_TOP_P_SAMPLING_FROM_LOGITS,
    TOP_K_RENORM_PROBS,
    TOP_P_RENORM_PROBS,
    TOP_K_MASK_LOGITS,
    CHAIN_SPECULATIVE_SAMPLING,
)
