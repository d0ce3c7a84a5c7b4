"""kiln.sampling against its float64 reference (kiln.trace.sampling), on the host backend always and
on CUDA where a device is present.

Distributions are tested statistically: N = 100,000 draws per case (one call, `indices` pointing
every output row at one distribution, each row its own Philox stream), and a chi-square statistic
over the kept tokens against the exact filtered distribution, plus exactly zero draws outside it.
The critical value is the chi-square quantile for a false-failure rate of 1e-6 per case (by the
Wilson-Hilferty approximation, good to a few percent at these degrees of freedom); the seeds are
fixed, so a run is reproducible and a pass is stable. Beyond that: exact equality with the
reference's inverse-CDF draw at kiln's Philox uniforms, boundaries (ties at a threshold, top_k >=
vocab, top_p = 1, a single non-zero), NaN/Inf, speculative sampling's closed form, seeds,
generators, batch-position independence, bad inputs, torch.compile; on CUDA, the host backend's
tokens bit for bit at the real vocabulary.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import device_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.trace import sampling as ref

N = 100_000
Z_1E6 = 4.753  # the standard normal's 1 - 1e-6 quantile


def chi2_critical(df: int, z: float = Z_1E6) -> float:
    """The chi-square quantile (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_distribution(samples: torch.Tensor, expected: torch.Tensor):
    """samples (int) drawn from `expected` (a float64 probability vector): none outside its
    support, and a chi-square statistic below the 1e-6 critical value."""
    samples = samples.cpu().long()
    expected = expected.cpu().double()
    assert samples.min() >= 0, "a draw of -1 (no valid token) from a valid distribution"
    counts = torch.bincount(samples, minlength=expected.numel()).double()
    outside = counts[expected == 0].sum()
    assert outside == 0, (
        f"{int(outside)} draws of tokens with probability 0: {counts[expected == 0].nonzero()}"
    )
    support = expected > 0
    n = counts.sum()
    e = n * expected[support]
    chi2 = float(((counts[support] - e) ** 2 / e).sum())
    df = int(support.sum()) - 1
    if df == 0:
        return
    assert chi2 < chi2_critical(df), (
        f"chi2 = {chi2:.1f} with {df} degrees of freedom (critical {chi2_critical(df):.1f})"
    )


def rand_probs(rows, vocab, seed, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn((rows, vocab), generator=g), -1)


def many(rows_in: int, device, per=N):
    """indices drawing `per` times from each of rows_in input rows."""
    return torch.arange(rows_in, device=device, dtype=torch.int64).repeat_interleave(per)


# --- exact distributions ------------------------------------------------------------------------

CASES = [
    ("sampling_from_probs", {}, {}),
    ("top_k_sampling_from_probs", {"top_k": 5}, {"top_k": 5}),
    ("top_p_sampling_from_probs", {"top_p": 0.7}, {"top_p": 0.7}),
    ("min_p_sampling_from_probs", {"min_p": 0.2}, {"min_p": 0.2}),
    ("top_k_top_p_sampling_from_probs", {"top_k": 8, "top_p": 0.6}, {"top_k": 8, "top_p": 0.6}),
    (
        "top_k_top_p_sampling_from_probs",
        {"top_k": 8, "top_p": 0.6, "filter_apply_order": "joint"},
        {"top_k": 8, "top_p": 0.6, "order": "joint"},
    ),
]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("api,args,filters", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_draws_follow_the_filtered_distribution(device, api, args, filters):
    probs = rand_probs(1, 21, seed=3).to(device)
    s = getattr(kiln, api)(probs, **args, indices=many(1, device), seed=11)
    assert s.shape == (N,) and s.dtype == torch.int64
    assert_distribution(s, ref.filtered_probs(probs.cpu(), **filters)[0])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_logits_draws_follow_softmax_filtered(device, order):
    logits = (2.0 * torch.randn((1, 33), generator=torch.Generator().manual_seed(5))).to(device)
    idx = many(1, device)
    s = kiln.top_k_top_p_sampling_from_logits(logits, 10, 0.8, indices=idx, filter_apply_order=order, seed=2)
    expected = ref.filtered_probs(ref.softmax_float64(logits.cpu()), top_k=10, top_p=0.8, order=order)[0]
    assert_distribution(s, expected)
    assert_distribution(
        kiln.sampling_from_logits(logits, indices=idx, seed=3), ref.softmax_float64(logits.cpu())[0]
    )


def test_top_k_first_and_joint_differ_as_defined():
    """A row where the orders give different sets: top-k 2 of [0.3, 0.25, 0.2, ...] renormalised
    puts 0.3 / 0.55 = 0.545 on the first token, so top_p 0.5 keeps one token with top_k_first; on
    the original distribution 0.3 < 0.5, so joint keeps both."""
    probs = torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]])
    first = ref.filtered_probs(probs, top_k=2, top_p=0.5)[0]
    joint = ref.filtered_probs(probs, top_k=2, top_p=0.5, order="joint")[0]
    assert (first > 0).sum() == 1 and (joint > 0).sum() == 2
    idx = many(1, "cpu", 20_000)
    s1 = kiln.top_k_top_p_sampling_from_probs(probs, 2, 0.5, indices=idx, seed=1)
    s2 = kiln.top_k_top_p_sampling_from_probs(probs, 2, 0.5, indices=idx, filter_apply_order="joint", seed=1)
    assert s1.eq(0).all()
    assert_distribution(s2, joint)


@pytest.mark.parametrize("device", device_params())
def test_per_row_parameters(device):
    """Four distributions, each with its own top_k and top_p, N/4 draws each; one value per output row."""
    probs = rand_probs(4, 16, seed=9).to(device)
    per = N // 4
    idx = many(4, device, per)
    k = torch.tensor([1, 3, 16, 6], device=device).repeat_interleave(per).to(torch.int32)
    p = torch.tensor([1.0, 0.9, 0.5, 0.3], device=device).repeat_interleave(per)
    s = kiln.top_k_top_p_sampling_from_probs(probs, k, p, indices=idx, seed=4)
    for r in range(4):
        expected = ref.filtered_probs(probs[r : r + 1].cpu(), top_k=int(k[r * per]), top_p=float(p[r * per]))[
            0
        ]
        assert_distribution(s[r * per : (r + 1) * per], expected)


# --- boundaries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_ties_at_the_threshold_all_stay(device):
    """top_k = 2 of [0.3, 0.2, 0.2, 0.2, 0.1]: the k-th largest is 0.2, so all three 0.2 stay (the
    documented tie rule); top_p = 0.5 crosses at a 0.2, whose ties stay as well."""
    probs = torch.tensor([[0.3, 0.2, 0.2, 0.2, 0.1]], device=device)
    idx = many(1, device, 40_000)
    s = kiln.top_k_sampling_from_probs(probs, 2, indices=idx, seed=1)
    assert_distribution(s, torch.tensor([0.3, 0.2, 0.2, 0.2, 0.0]) / 0.9)
    s = kiln.top_p_sampling_from_probs(probs, 0.5, indices=idx, seed=2)
    assert_distribution(s, torch.tensor([0.3, 0.2, 0.2, 0.2, 0.0]) / 0.9)
    renorm = kiln.top_k_renorm_probs(probs, 2)
    torch.testing.assert_close(renorm.cpu(), torch.tensor([[0.3, 0.2, 0.2, 0.2, 0.0]]) / 0.9)


@pytest.mark.parametrize("device", device_params())
def test_negative_and_positive_zero_logits_tie(device):
    """-0.0 == +0.0: a threshold falling on zero keeps both (found by the hypothesis property: the
    float keys once ordered -0 below +0, and top-p cut the tie in two)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -0.0, 0.0, -0.0, -1.0]], device=device)
    expected = ref.filtered_probs(ref.softmax_float64(logits.cpu()), top_p=0.9)[0]
    assert (expected > 0).sum() == 6
    idx = many(1, device, 40_000)
    s = kiln.top_k_top_p_sampling_from_logits(logits, 7, 0.9, indices=idx, seed=1)
    assert_distribution(s, expected)
    assert kiln.top_k_mask_logits(logits, 3).isfinite().sum() == 6


@pytest.mark.parametrize("device", device_params())
def test_no_filter_limits_and_single_nonzero(device):
    probs = rand_probs(1, 12, seed=1).to(device)
    idx = many(1, device, 30_000)
    base = kiln.sampling_from_probs(probs, indices=idx, seed=7)
    # top_k >= vocab, top_p = 1 and min_p = 0 filter nothing: the same draws as no filter at all.
    assert torch.equal(kiln.top_k_sampling_from_probs(probs, 12, indices=idx, seed=7), base)
    assert torch.equal(kiln.top_k_sampling_from_probs(probs, 1000, indices=idx, seed=7), base)
    assert torch.equal(kiln.top_p_sampling_from_probs(probs, 1.0, indices=idx, seed=7), base)
    assert torch.equal(kiln.min_p_sampling_from_probs(probs, 0.0, indices=idx, seed=7), base)
    torch.testing.assert_close(
        kiln.top_k_renorm_probs(probs, 12).cpu(), probs.cpu() / probs.cpu().sum(), rtol=1e-6, atol=0
    )
    # top_k = 1 is greedy; a row with one non-zero always draws it.
    top = int(probs.argmax())
    assert kiln.top_k_sampling_from_probs(probs, 1, indices=idx, seed=3).eq(top).all()
    one = torch.zeros((1, 50), device=device)
    one[0, 37] = 0.25
    for fn in (
        kiln.sampling_from_probs,
        lambda p, **kw: kiln.top_p_sampling_from_probs(p, 0.1, **kw),
        lambda p, **kw: kiln.top_k_top_p_sampling_from_probs(p, 40, 0.99, **kw),
    ):
        assert fn(one, indices=idx, seed=5).eq(37).all()
    # Unnormalised rows: only the ratios matter.
    assert torch.equal(kiln.sampling_from_probs(probs * 37.5, indices=idx, seed=7), base)


@pytest.mark.parametrize("device", device_params())
def test_nan_and_infinities(device):
    probs = rand_probs(1, 10, seed=2).to(device)
    probs[0, 3] = float("nan")
    probs[0, 5] = float("inf")
    probs[0, 7] = -0.5
    idx = many(1, device, 50_000)
    s = kiln.sampling_from_probs(probs, indices=idx, seed=1)
    assert_distribution(s, ref.filtered_probs(probs.cpu())[0])  # 3, 5, 7 never drawn
    with pytest.raises(ValueError, match="probs contains NaN"):
        kiln.sampling_from_probs(probs, check_nan=True)
    # Logits: -inf and NaN are never drawn; +inf entries share the mass.
    logits = torch.randn((1, 9), generator=torch.Generator().manual_seed(4)).to(device)
    logits[0, 2] = float("-inf")
    logits[0, 4] = float("nan")
    s = kiln.sampling_from_logits(logits, indices=idx, seed=2)
    assert_distribution(s, ref.softmax_float64(logits.cpu())[0])
    logits[0, 6] = logits[0, 8] = float("inf")
    s = kiln.top_k_top_p_sampling_from_logits(logits, 5, 0.9, indices=idx, seed=3)
    assert_distribution(s, torch.tensor([0, 0, 0, 0, 0, 0, 0.5, 0, 0.5], dtype=torch.float64))
    # A row without a valid entry draws -1, and return_valid says so.
    bad = torch.full((2, 6), float("nan"), device=device)
    bad[1] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    s, valid = kiln.sampling_from_probs(bad, seed=1, return_valid=True)
    assert s.tolist() == [-1, 2] and valid.tolist() == [False, True]
    assert kiln.softmax(torch.full((1, 4), float("-inf"), device=device)).eq(0).all()


# --- against the reference, token for token -----------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_tokens_equal_the_reference_inverse_cdf(device):
    """At kiln's Philox uniforms the reference's float64 inverse CDF gives the same token (kiln's
    fixed-point weights differ from float64 by < 2^-40 of the max, far below any gap the draws hit)."""
    g = torch.Generator().manual_seed(21)
    logits = (2.5 * torch.randn((64, 1000), generator=g)).to(device)
    probs = torch.softmax(logits, -1)
    seed, offset = 1234, 8
    cases = [
        (kiln.sampling_from_probs(probs, seed=seed, offset=offset), probs, {}),
        (kiln.top_k_sampling_from_probs(probs, 40, seed=seed, offset=offset), probs, {"top_k": 40}),
        (kiln.top_p_sampling_from_probs(probs, 0.85, seed=seed, offset=offset), probs, {"top_p": 0.85}),
        (kiln.min_p_sampling_from_probs(probs, 0.05, seed=seed, offset=offset), probs, {"min_p": 0.05}),
        (
            kiln.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=seed, offset=offset),
            probs,
            {"top_k": 50, "top_p": 0.9},
        ),
        (
            kiln.top_k_top_p_sampling_from_logits(logits, 50, 0.9, seed=seed, offset=offset),
            ref.softmax_float64(logits),
            {"top_k": 50, "top_p": 0.9},
        ),
        (kiln.sampling_from_logits(logits, seed=seed, offset=offset), ref.softmax_float64(logits), {}),
    ]
    for got, p, filters in cases:
        expected = ref.sample_reference(p.cpu(), seed=seed, offset=offset, **filters)
        assert torch.equal(got.cpu(), expected), (filters, (got.cpu() != expected).nonzero()[:5])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("top_k", [40, 1000, 1500], ids=lambda k: f"top_k{k}")
def test_gathered_and_row_pass_top_p_agree_with_the_reference(device, top_k):
    """top_k_first top-p runs over the gathered top-k set when it holds at most 1024 entries and
    over the row otherwise: both give the reference's tokens (ties included: rounded logits)."""
    g = torch.Generator().manual_seed(31)
    logits = (2 * torch.randn((16, 3000), generator=g)).round(decimals=1).to(device)
    seed = 99
    for top_p in (0.3, 0.9):
        got = kiln.top_k_top_p_sampling_from_logits(logits, top_k, top_p, seed=seed)
        want = ref.sample_reference(ref.softmax_float64(logits.cpu()), seed=seed, top_k=top_k, top_p=top_p)
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_softmax_renorm_and_mask_match_the_reference(device, dtype):
    g = torch.Generator().manual_seed(8)
    wide = (3 * torch.randn((13, 1100), generator=g)).to(device=device, dtype=dtype)
    logits = wide[:, 50:1050]  # a strided row view
    t = torch.linspace(0.5, 2.0, 13, device=device)
    torch.testing.assert_close(
        kiln.softmax(logits, t).double().cpu(),
        ref.softmax_float64(logits.cpu(), t.cpu()),
        rtol=1e-5,
        atol=1e-9,
    )
    torch.testing.assert_close(
        kiln.softmax(logits).double().cpu(), ref.softmax_float64(logits.cpu()), rtol=1e-5, atol=1e-9
    )
    masked = kiln.top_k_mask_logits(logits, 37)
    assert masked.dtype == dtype and masked.shape == logits.shape
    assert torch.equal(
        masked.double().cpu(), ref.top_k_mask_logits_reference(logits.cpu(), 37)["masked_logits"]
    )
    assert (masked > float("-inf")).sum(-1).ge(37).all()
    probs = torch.softmax(logits.float(), -1)[:, :999]
    for got, filters in (
        (kiln.top_k_renorm_probs(probs, 17), {"top_k": 17}),
        (kiln.top_p_renorm_probs(probs, 0.75), {"top_p": 0.75}),
    ):
        torch.testing.assert_close(
            got.double().cpu(), ref.filtered_probs(probs.cpu(), **filters), rtol=1e-5, atol=1e-9
        )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 6),
    vocab=st.integers(1, 300),
    top_k=st.integers(-2, 320),
    top_p=st.floats(0.05, 1.0),
    scale=st.floats(0.1, 8.0),
    ties=st.booleans(),
    order=st.sampled_from(["top_k_first", "joint"]),
    seed=st.integers(0, 2**62),
    offset=st.integers(0, 2**40),
)
def test_property_tokens_and_renorm_equal_the_reference(
    rows, vocab, top_k, top_p, scale, ties, order, seed, offset
):
    """Any shape, spread, per-row top_k (<= 0 and >= vocab included) and top_p, rounded logits
    (many ties), either order: the host backend's tokens are the reference's inverse CDF at kiln's
    Philox uniforms, and the renormalised probabilities the reference's."""
    g = torch.Generator().manual_seed(seed % 2**31)
    logits = scale * torch.randn((rows, vocab), generator=g)
    if ties:
        logits = logits.round()
    probs = torch.softmax(logits, -1)
    k = torch.full((rows,), top_k, dtype=torch.int32)
    p = torch.full((rows,), top_p, dtype=torch.float32)
    got = kiln.top_k_top_p_sampling_from_probs(
        probs, k, p, filter_apply_order=order, seed=seed, offset=offset
    )
    want = ref.sample_reference(probs, seed=seed, offset=offset, top_k=k, top_p=p, order=order)
    assert torch.equal(got, want)
    got = kiln.top_k_top_p_sampling_from_logits(
        logits, k, p, filter_apply_order=order, seed=seed, offset=offset
    )
    want = ref.sample_reference(
        ref.softmax_float64(logits), seed=seed, offset=offset, top_k=k, top_p=p, order=order
    )
    assert torch.equal(got, want)
    renorm = kiln.top_p_renorm_probs(kiln.top_k_renorm_probs(probs, k), p)
    expected = ref.filtered_probs(ref.filtered_probs(probs, top_k=k), top_p=p)
    torch.testing.assert_close(renorm.double(), expected, rtol=1e-5, atol=1e-9)


# --- speculative sampling -----------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_speculative_acceptance_rule_closed_form(device):
    """One draft token d: out[0] = d with probability a = min(1, q(d) / p(d)), else a draw from
    max(q - p, 0) renormalised; `accepted` counts the passing tests; out[1] is the bonus token
    (from q_1) when accepted, else -1."""
    vocab = 12
    p = rand_probs(1, vocab, seed=1).reshape(1, 1, vocab)
    q = rand_probs(2, vocab, seed=2).reshape(1, 2, vocab)
    d = int((q[0, 0] / p[0, 0]).argmin())  # a token the target likes less: a < 1
    a = min(1.0, float(q[0, 0, d] / p[0, 0, d]))
    rows = N
    draft = p.expand(rows, 1, vocab).contiguous().to(device)
    target = q.expand(rows, 2, vocab).contiguous().to(device)
    ids = torch.full((rows, 1), d, dtype=torch.int32, device=device)
    out, accepted, emitted = kiln.chain_speculative_sampling(draft, ids, target, seed=9)
    out, accepted, emitted = out.cpu(), accepted.cpu(), emitted.cpu()
    residual = (q[0, 0] - p[0, 0]).clamp_min(0).double()
    expected = (1 - a) * residual / residual.sum()
    expected[d] += a
    assert_distribution(out[:, 0], expected)
    assert torch.equal(accepted, emitted) and torch.equal(accepted, (out[:, 0] == d).int())
    assert torch.equal(out[:, 1] >= 0, out[:, 0] == d)
    assert_distribution(out[out[:, 0] == d, 1], q[0, 1].double())
    # The rate of acceptance is a: a binomial count within 6 standard deviations.
    rate = float(accepted.double().mean())
    assert abs(rate - a) < 6 * math.sqrt(a * (1 - a) / rows) + 1e-12


@pytest.mark.parametrize("device", device_params())
def test_speculative_output_follows_the_target(device):
    """With draft tokens drawn from the draft distribution, each emitted position is distributed as
    the target's (the point of speculative sampling): out[0] ~ q_0 exactly."""
    vocab, rows = 10, N
    p = rand_probs(2, vocab, seed=5).reshape(1, 2, vocab)
    q = rand_probs(3, vocab, seed=6).reshape(1, 3, vocab)
    g = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.multinomial(p[0, j], rows, replacement=True, generator=g) for j in range(2)], 1)
    out, accepted, emitted = kiln.chain_speculative_sampling(
        p.expand(rows, 2, vocab).contiguous().to(device),
        ids.to(device),
        q.expand(rows, 3, vocab).contiguous().to(device),
        seed=1,
    )
    assert_distribution(out[:, 0], q[0, 0].double())
    e = emitted.cpu()
    assert (e <= accepted.cpu()).all() and ((out.cpu() >= 0).sum(1) == e + 1).all()


def test_speculative_matches_the_reference_and_adds_to_counts():
    d = rand_probs(15, 30, seed=1).reshape(5, 3, 30)
    t = rand_probs(20, 30, seed=2).reshape(5, 4, 30)
    ids = torch.randint(0, 30, (5, 3), generator=torch.Generator().manual_seed(4))
    acc0 = torch.full((5,), 10, dtype=torch.int32)
    emi0 = torch.full((5,), 20, dtype=torch.int32)
    out, acc, emi = kiln.chain_speculative_sampling(d, ids, t, acc0, emi0, seed=77, offset=4)
    r_out, r_acc, r_emi = ref.speculative_reference(d, ids, t, seed=77, offset=4)
    assert torch.equal(out, r_out)
    assert acc is acc0 and torch.equal(acc, r_acc + 10) and torch.equal(emi, r_emi + 20)


# --- randomness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_seed_offset_and_generator_reproduce(device):
    probs = rand_probs(256, 500, seed=1).to(device)
    a = kiln.top_k_top_p_sampling_from_probs(probs, 100, 0.95, seed=5, offset=0)
    assert torch.equal(a, kiln.top_k_top_p_sampling_from_probs(probs, 100, 0.95, seed=5, offset=0))
    assert not torch.equal(a, kiln.top_k_top_p_sampling_from_probs(probs, 100, 0.95, seed=5, offset=4))
    assert not torch.equal(a, kiln.top_k_top_p_sampling_from_probs(probs, 100, 0.95, seed=6, offset=0))
    gen = torch.Generator(device=device).manual_seed(42)
    first = kiln.sampling_from_probs(probs, generator=gen)
    second = kiln.sampling_from_probs(probs, generator=gen)  # the generator advanced
    assert not torch.equal(first, second)
    gen.manual_seed(42)
    assert torch.equal(first, kiln.sampling_from_probs(probs, generator=gen))
    torch.manual_seed(3)
    if device == "cuda":
        torch.cuda.manual_seed(3)
    x = kiln.sampling_from_probs(probs)
    torch.manual_seed(3)
    if device == "cuda":
        torch.cuda.manual_seed(3)
    assert torch.equal(x, kiln.sampling_from_probs(probs))


@pytest.mark.parametrize("device", device_params())
def test_tensor_seeds_and_offsets(device):
    """A length-1 int64 tensor is the int; a per-row tensor gives row r the stream of its own value."""
    probs = rand_probs(16, 200, seed=3).to(device)
    t = lambda *v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    want = kiln.top_k_top_p_sampling_from_probs(probs, 20, 0.9, seed=5, offset=8)
    assert torch.equal(kiln.top_k_top_p_sampling_from_probs(probs, 20, 0.9, seed=t(5), offset=t(8)), want)
    seeds = torch.arange(16, device=device, dtype=torch.int64) * 1000 + 7
    rows = kiln.top_k_top_p_sampling_from_probs(probs, 20, 0.9, seed=seeds, offset=8)
    for r in (0, 5, 15):
        one = kiln.top_k_top_p_sampling_from_probs(probs, 20, 0.9, seed=int(seeds[r]), offset=8)
        assert rows[r] == one[r]
    d, q = (
        rand_probs(6, 30, 1).reshape(2, 3, 30).to(device),
        rand_probs(8, 30, 2).reshape(2, 4, 30).to(device),
    )
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]], device=device)
    a = kiln.chain_speculative_sampling(d, ids, q, seed=9, offset=4)
    b = kiln.chain_speculative_sampling(d, ids, q, seed=t(9, 9), offset=t(4))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("device", device_params())
def test_a_rows_draw_does_not_depend_on_the_batch(device):
    """The same seed, offset and row give the same token whatever the batch size and the other rows."""
    probs = rand_probs(64, 300, seed=2).to(device)
    full = kiln.top_k_top_p_sampling_from_probs(probs, 30, 0.9, seed=8)
    assert torch.equal(full[:10], kiln.top_k_top_p_sampling_from_probs(probs[:10], 30, 0.9, seed=8))
    other = probs.clone()
    other[20:] = rand_probs(44, 300, seed=3).to(device)
    assert torch.equal(full[:20], kiln.top_k_top_p_sampling_from_probs(other, 30, 0.9, seed=8)[:20])
    # indices: output row r draws from probs[indices[r]] with row r's stream.
    idx = torch.arange(64, device=device).flip(0)
    flipped = kiln.top_k_top_p_sampling_from_probs(probs, 30, 0.9, indices=idx, seed=8)
    assert torch.equal(flipped, kiln.top_k_top_p_sampling_from_probs(probs.flip(0), 30, 0.9, seed=8).long())


# --- bad inputs ---------------------------------------------------------------------------------


def test_bad_inputs_name_the_argument():
    probs = rand_probs(4, 10, seed=1)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, "):
        kiln.top_k_sampling_from_probs(probs, 0)
    with pytest.raises(TypeError, match="top_k must be an integer, got 2.5"):
        kiln.top_k_renorm_probs(probs, 2.5)
    with pytest.raises(ValueError, match=r"top_p must be in \(0.0, 1.0\], got 1.5"):
        kiln.top_p_sampling_from_probs(probs, 1.5)
    with pytest.raises(ValueError, match=r"top_p must be in \(0.0, 1.0\], got 0"):
        kiln.top_p_renorm_probs(probs, 0)
    with pytest.raises(ValueError, match=r"min_p must be in \[0.0, 1.0\], got -0.1"):
        kiln.min_p_sampling_from_probs(probs, -0.1)
    with pytest.raises(ValueError, match=r"temperature must be in \(0.0, inf\], got 0"):
        kiln.softmax(probs, 0)
    with pytest.raises(ValueError, match="filter_apply_order must be one of"):
        kiln.top_k_top_p_sampling_from_probs(probs, 3, 0.5, filter_apply_order="top_p_first")
    with pytest.raises(ValueError, match=r"probs must be 2-D \[batch, vocab\], got shape \[10\]"):
        kiln.sampling_from_probs(probs[0])
    with pytest.raises(TypeError, match="probs must be a floating-point tensor"):
        kiln.sampling_from_probs(torch.ones((2, 3), dtype=torch.int32))
    with pytest.raises(ValueError, match=r"top_k: Sampling parameter tensor batch size mismatch: expected "
                                         r"shape \(4,\) \(one value per row\), got \(3,\)"):
        kiln.top_k_sampling_from_probs(probs, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError,
                       match=r"top_p: Expected a 1D tensor or scalar .*got a 2D tensor of shape \[4, 1\]"):
        kiln.top_p_renorm_probs(probs, torch.full((4, 1), 0.5))
    with pytest.raises(ValueError, match=r"min_p: Expected a 1D tensor of shape \(batch_size,\) or scalar "
                                         r"\(batch_size 4\), got a 0-dimensional tensor"):
        kiln.min_p_sampling_from_probs(probs, torch.tensor(0.5))  # not read back to the host
    with pytest.raises(ValueError, match=r"indices must be a 1-D int32 or int64 tensor"):
        kiln.sampling_from_probs(probs, indices=torch.tensor([0.0, 1.0]))
    with pytest.raises(
        IndexError,
        match=r"indices\[1\] = 4 is not a row of the probabilities/logits: valid are "
        r"\[0, 4\)",
    ):
        kiln.sampling_from_probs(probs, indices=torch.tensor([0, 4, 1]))
    with pytest.raises(
        ValueError, match=r"seed as a tensor must be int64 of shape \[1\] or \[4\], got torch.int32"
    ):
        kiln.sampling_from_probs(probs, seed=torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"offset as a tensor must be int64 of shape \[1\] or \[4\]"):
        kiln.sampling_from_probs(probs, seed=1, offset=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"offset must be an int in \[0, 2\^63\) or an int64 tensor, got -1"):
        kiln.sampling_from_probs(probs, seed=1, offset=-1)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        kiln.sampling_from_probs(probs, generator=3)
    d, t = rand_probs(6, 10, 1).reshape(2, 3, 10), rand_probs(8, 10, 2).reshape(2, 4, 10)
    with pytest.raises(
        IndexError, match=r"draft_token_ids \(flattened\)\[4\] = 10 is not a token of the vocabulary"
    ):
        kiln.chain_speculative_sampling(d, torch.tensor([[1, 2, 3], [0, 10, 1]]), t)
    with pytest.raises(
        ValueError, match=r"target_probs.shape\[1\] must equal draft_probs.shape\[1\] \+ 1 \(4\), got 3"
    ):
        kiln.chain_speculative_sampling(d, torch.tensor([[1, 2, 3], [0, 1, 1]]), t[:, :3])
    with pytest.raises(TypeError, match=r"logits.dtype must be float16"):  # the module follows logits' dtype
        mod = kiln.sampling._module("kiln.test", torch.empty(1, dtype=torch.float16), "logits")
        mod.sample_rows(
            input=torch.zeros((2, 3)),
            output=0,
            order=0,
            logits=True,
            samples=torch.zeros(2, dtype=torch.int32),
        )


# --- framework integration ----------------------------------------------------------------------


def test_torch_compile_fullgraph():
    probs = rand_probs(8, 64, seed=1)
    logits = torch.randn((8, 64))

    def step(probs, logits):
        renorm = kiln.top_p_renorm_probs(kiln.top_k_renorm_probs(probs, 10), 0.8)
        return kiln.sampling_from_probs(renorm, seed=3), kiln.top_k_top_p_sampling_from_logits(
            logits, 5, 0.9, seed=4
        ), kiln.softmax(logits, 0.7)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(probs, logits), step(probs, logits), strict=True):
        assert torch.equal(a, b)


def test_custom_ops_have_fake_implementations():
    m = torch.empty((3, 8), device="meta")
    torch.ops.kiln.sampling_draw(
        torch.empty(3, dtype=torch.int32, device="meta"),
        m,
        False,
        "top_k_first",
        None,
        None,
        0,
        None,
        1.0,
        None,
        0.0,
        1,
        0,
        None,
        None,
    )
    torch.ops.kiln.sampling_transform(
        torch.empty((3, 8), device="meta"), m, "probs", None, 3, None, 1.0
    )
    torch.ops.kiln.softmax(torch.empty((3, 8), device="meta"), m, None, 1.0)


# --- CUDA against the host backend --------------------------------------------------------------

VOCAB = 128256


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_draws_the_host_tokens(dtype):
    """The same algorithm and integer arithmetic on both backends: at the real vocabulary, the CUDA
    kernels draw the host backend's tokens for the same seed, bit for bit."""
    g = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn((64, VOCAB), generator=g)).to(dtype)
    probs = torch.softmax(logits.float(), -1)
    k = torch.randint(1, 200, (64,), generator=g, dtype=torch.int32)
    p = torch.rand(64, generator=g) * 0.9 + 0.05
    calls = [
        lambda x, y, kk, pp: kiln.top_k_top_p_sampling_from_logits(x, 50, 0.9, seed=3, offset=4),
        lambda x, y, kk, pp: kiln.top_k_top_p_sampling_from_logits(
            x, kk, pp, seed=3, filter_apply_order="joint"
        ),
        lambda x, y, kk, pp: kiln.sampling_from_logits(x, seed=5),
        lambda x, y, kk, pp: kiln.top_k_top_p_sampling_from_probs(y, kk, pp, seed=6),
        lambda x, y, kk, pp: kiln.top_k_sampling_from_probs(y, 50, seed=7),
        lambda x, y, kk, pp: kiln.top_p_sampling_from_probs(y, pp, seed=8),
        lambda x, y, kk, pp: kiln.min_p_sampling_from_probs(y, 0.02, seed=9),
        lambda x, y, kk, pp: kiln.sampling_from_probs(y, seed=10),
        # a top-k set past the shared-memory candidates (1024): the row-pass path
        lambda x, y, kk, pp: kiln.top_k_top_p_sampling_from_probs(y, 1500, 0.95, seed=11),
        lambda x, y, kk, pp: kiln.top_k_top_p_sampling_from_logits(x, 1500, 0.95, seed=12),
    ]
    for i, call in enumerate(calls):
        host = call(logits, probs, k, p)
        cuda = call(logits.cuda(), probs.cuda(), k.cuda(), p.cuda())
        assert torch.equal(cuda.cpu(), host), f"call {i}: {(cuda.cpu() != host).sum()} tokens differ"
    for got, want in ((kiln.top_k_mask_logits(logits.cuda(), 50), kiln.top_k_mask_logits(logits, 50)),):
        assert torch.equal(got.cpu(), want)
    for got, want in (
        (kiln.top_k_renorm_probs(probs.cuda(), k.cuda()), kiln.top_k_renorm_probs(probs, k)),
        (kiln.top_p_renorm_probs(probs.cuda(), p.cuda()), kiln.top_p_renorm_probs(probs, p)),
        (kiln.softmax(logits.cuda(), 0.8), kiln.softmax(logits, 0.8)),
    ):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-10)


# softmax's cluster kernel (ops/sampling/softmax.cuh): a cluster of 1 to 8 CTAs per row by the
# batch and the row's bytes, vector or single-element loads by the row's alignment, the row kernel
# past 8 x 192 KB. Each shape below takes a different one of those paths.
SOFTMAX_SHAPES = [
    (1, 128256),  # 8 CTAs of one row
    (3, 151936),  # 8 CTAs, the last chunk shorter
    (64, 32000),  # 8 CTAs, 64 rows
    (300, 4099),  # one CTA per row, an odd vocabulary (single-element loads, a tail)
    (2, 50257),  # GPT-2's vocabulary: rows not 16-byte aligned
    (1, 400_003),  # float32 past 8 x 192 KB: the row kernel
]


@pytest.mark.gpu
@pytest.mark.parametrize("rows, vocab", SOFTMAX_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cuda_softmax_matches_the_reference_at_every_cluster_shape(rows, vocab, dtype):
    g = torch.Generator().manual_seed(rows * 7 + vocab)
    logits = (4 * torch.randn((rows, vocab), generator=g)).to(dtype)
    if rows >= 2:  # the special rows: NaN / -inf weigh 0, +inf entries share the row
        logits[0, :: vocab // 5] = float("nan")
        logits[0, 1 :: vocab // 7] = float("-inf")
        logits[1, [3, vocab - 2]] = float("inf")
    t = torch.linspace(0.5, 2.0, rows)
    t[-1] = 0.0  # the T -> 0 limit: the row's maxima
    x = logits.cuda()
    for temperature, t_rows in ((None, torch.ones(rows)), (t.cuda(), t), (0.7, torch.full((rows,), 0.7))):
        # poison: the caching allocator hands this NaN block to kiln.softmax's output next
        del_me = torch.full((rows, vocab), float("nan"), device="cuda")
        del del_me
        got = kiln.softmax(x, temperature).cpu()
        torch.testing.assert_close(got.double(), _softmax_limits(logits, t_rows), rtol=1e-5, atol=1e-9)


def _softmax_limits(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """float64 softmax(logits / t) per row with kiln's limits: NaN and -inf weigh 0; a row with +inf
    entries, or with t <= 0, splits its probability evenly over its largest entries."""
    x = logits.double()
    x = torch.where(x.isnan(), torch.full_like(x, -torch.inf), x)
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        top = x[r].max()
        if top == -torch.inf:
            continue
        if top == torch.inf or t[r] <= 0:
            hit = (x[r] == top).double()
            out[r] = hit / hit.sum()
        else:
            out[r] = torch.softmax((x[r] - top) / float(t[r]), -1)
    return out


@pytest.mark.gpu
def test_cuda_speculative_matches_the_host():
    d = rand_probs(64 * 4, 32000, seed=1, scale=3).reshape(64, 4, 32000)
    t = rand_probs(64 * 5, 32000, seed=2, scale=3).reshape(64, 5, 32000)
    ids = torch.randint(0, 32000, (64, 4), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    host = kiln.chain_speculative_sampling(d, ids, t, seed=12)
    cuda = kiln.chain_speculative_sampling(d.cuda(), ids.cuda(), t.cuda(), seed=12)
    for a, b in zip(cuda, host, strict=True):
        assert torch.equal(a.cpu(), b)


@pytest.mark.gpu
def test_cuda_index_errors_are_recorded():
    probs = rand_probs(4, 1000, seed=1).cuda()
    s = kiln.sampling_from_probs(probs, indices=torch.tensor([0, 9, 1], device="cuda"), seed=1)
    with pytest.raises(kiln.DeviceIndexError, match=r"indices\[1\] = 9 is not a row"):
        kiln.check_errors()
    assert s[1].item() == -1


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    probs = rand_probs(32, VOCAB, seed=4).cuda()
    want = kiln.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=3)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = kiln.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=3)
    out.fill_(-7)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    # Seeds in a tensor: each replay reads the tensor, so new values give new draws.
    seed = torch.tensor([3], dtype=torch.int64, device="cuda")
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        out2 = kiln.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=seed)
    g2.replay()
    torch.cuda.synchronize()
    assert torch.equal(out2, want)
    seed.fill_(4)
    g2.replay()
    torch.cuda.synchronize()
    assert torch.equal(out2, kiln.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=4))
