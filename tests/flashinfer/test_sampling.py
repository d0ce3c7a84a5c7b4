"""Re-creates FlashInfer 0.7's tests/utils/test_sampling.py against kiln (``import kiln as
flashinfer``): softmax with a scalar or per-row temperature, sampling from probabilities and from
logits, top-k / top-p / min-p sampling (their frequencies over millions of draws, and that every
draw lies in the filtered set), joint top-k + top-p from probabilities and from logits (the same
tokens from one generator state), the renormalised and masked distributions, chain speculative
sampling, and the checks of per-row parameter tensors.

FlashInfer's parametrisations, calls and assertions are kept; the reference masks are built from
the test's own sorted probabilities, as FlashInfer's are.

Differences, and what was left out:
- FlashInfer skips its k > vocab_size combinations ("k should be less than vocab_size"); here they
  are not generated (the (vocab_size, k) pairs are parametrised together), so nothing is skipped.
- The CPU run draws 50,000 samples where FlashInfer draws 5,000,000 (the frequency tests), at
  vocab_size 111: the sampling noise then costs the cosine similarity ~1e-3 at most (sum of the
  squared frequency errors ~1 / 50,000 against a sum of squared probabilities >= 1 / 111), far
  inside FlashInfer's bound of 0.99.
"""

from __future__ import annotations

import pytest
import torch

import kiln as flashinfer

CPU_CASES = {"batch_size": (1, 99), "vocab_size": (111,)}
NUM_TRIALS = {"cuda": 5_000_000, "cpu": 50_000}  # the frequency tests' draws


def normal_distribution(std):
    def normal_noise(shape, device):
        return torch.randn(shape, device=device) * std

    normal_noise.__name__ = f"normal_distribution(std={std})"
    return normal_noise


def gumbel_distribution(beta):
    def gumbel_noise(shape, device):
        U = torch.rand(shape, device=device)
        eps = 1e-20
        return torch.log(-torch.log(U + eps) + eps) / beta

    gumbel_noise.__name__ = f"gumbel_distribution(beta={beta})"
    return gumbel_noise


DISTRIBUTIONS = [normal_distribution(1), normal_distribution(5), gumbel_distribution(0.1)]
VOCAB_SIZES = [111, 32000, 128256]
# (vocab_size, k) with k <= vocab_size: the combinations FlashInfer runs (it skips the others).
VOCAB_K = [(v, k) for v in VOCAB_SIZES for k in (10, 100, 500) if k <= v]


def normalized_probs(batch_size, vocab_size, device):
    pre_norm_prob = torch.rand(batch_size, vocab_size, device=device)
    return pre_norm_prob / pre_norm_prob.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.1])
@pytest.mark.parametrize("temperature_arr", [True, False])
@pytest.mark.parametrize("neg_inf_input", [True, False])
def test_softmax(device, batch_size, vocab_size, distribution, temperature, temperature_arr, neg_inf_input):
    torch.manual_seed(42)
    logits = distribution((batch_size, vocab_size), device)
    if neg_inf_input:
        # some logits at random set to -inf
        num_inf = torch.randint(0, logits.numel() - 1, (), device=logits.device).item()
        inf_idx = torch.randperm(logits.numel(), device=logits.device)[:num_inf]
        logits.view(-1).index_fill_(0, inf_idx, float("-inf"))

    if temperature_arr:
        temperature_arr = torch.full((batch_size,), temperature, device=device)
        probs = flashinfer.sampling.softmax(logits, temperature=temperature_arr)
        logits_scaled = logits / temperature_arr.unsqueeze(-1)
    else:
        probs = flashinfer.sampling.softmax(logits, temperature=temperature)
        logits_scaled = logits / temperature

    probs_ref = torch.softmax(logits_scaled, dim=-1)

    assert torch.allclose(probs, probs_ref, atol=1e-5)


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("zero_ratio", [0.0, 0.5, 0.9])
def test_sampling_freq(device, vocab_size, distribution, zero_ratio):
    torch.manual_seed(42)
    num_trials = NUM_TRIALS[device]
    logits = distribution((1, vocab_size), device)
    zero_indices = torch.randperm(vocab_size)[: int(vocab_size * zero_ratio)]
    logits[:, zero_indices] = -float("inf")
    probs = torch.softmax(logits, dim=-1)
    counter = torch.zeros(vocab_size, dtype=torch.int32, device=logits.device)

    samples = flashinfer.sampling.sampling_from_probs(
        probs, indices=torch.zeros(num_trials, dtype=torch.int32, device=logits.device)
    )
    counter.scatter_add_(0, samples.long(), torch.ones_like(samples))
    freq = counter.float() / num_trials

    assert torch.all(counter[zero_indices] == 0)
    similarity = torch.cosine_similarity(freq, probs)
    assert similarity > 0.99, f"similarity: {similarity}"


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling_freq(device, vocab_size, distribution, p):
    torch.manual_seed(42)
    logits = distribution((1, vocab_size), device)
    probs = torch.softmax(logits, dim=-1)
    sorted_prob, indices = torch.sort(probs, descending=False)
    cdf = torch.cumsum(sorted_prob, dim=-1)
    mask = torch.zeros(1, vocab_size, dtype=torch.int32, device=logits.device)
    mask.scatter_add_(1, indices, (cdf > (1 - p)).int())

    renorm_probs = flashinfer.sampling.top_p_renorm_probs(probs, p)
    counter = torch.zeros(vocab_size, dtype=torch.int32, device=logits.device)
    num_trials = NUM_TRIALS[device]
    samples = flashinfer.sampling.top_p_sampling_from_probs(
        probs,
        p,
        indices=torch.zeros(num_trials, dtype=torch.int32, device=logits.device),
    )
    counter.scatter_add_(0, samples.long(), torch.ones_like(samples))
    freq = counter.float() / num_trials
    assert torch.all(mask[torch.arange(1), samples] == 1)
    similarity = torch.cosine_similarity(freq, renorm_probs)
    assert similarity > 0.99, f"similarity: {similarity}"


@pytest.mark.parametrize("vocab_size,k", VOCAB_K)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_top_k_sampling_freq(device, vocab_size, distribution, k):
    torch.manual_seed(42)
    logits = distribution((1, vocab_size), device)
    probs = torch.softmax(logits, dim=-1)
    sorted_prob, _ = torch.sort(probs, descending=True)
    pivot = sorted_prob[:, k - 1]
    mask = (probs >= pivot.unsqueeze(-1)).int()

    renorm_probs = flashinfer.sampling.top_k_renorm_probs(probs, k)
    counter = torch.zeros(vocab_size, dtype=torch.int32, device=logits.device)
    num_trials = NUM_TRIALS[device]
    samples = flashinfer.sampling.top_k_sampling_from_probs(
        probs,
        k,
        indices=torch.zeros(num_trials, dtype=torch.int32, device=logits.device),
    )
    counter.scatter_add_(0, samples.long(), torch.ones_like(samples))
    freq = counter.float() / num_trials
    assert torch.all(mask[torch.arange(1), samples] == 1)
    similarity = torch.cosine_similarity(freq, renorm_probs)
    assert similarity > 0.99, f"similarity: {similarity}"


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_sampling(device, batch_size, vocab_size):
    torch.manual_seed(42)
    normalized_prob = normalized_probs(batch_size, vocab_size, device)

    num_trails = 5000
    for _ in range(num_trails):
        samples = flashinfer.sampling.sampling_from_probs(normalized_prob)
        assert torch.all(samples < vocab_size) and torch.all(samples >= 0)


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_sampling_from_logits(device, batch_size, vocab_size):
    torch.manual_seed(42)
    logits = torch.randn(batch_size, vocab_size, device=device)
    num_trails = 5000
    for _ in range(num_trails):
        samples = flashinfer.sampling.sampling_from_logits(logits)
        assert torch.all(samples < vocab_size) and torch.all(samples >= 0)


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_sampling_from_logits_freq(device, vocab_size, distribution):
    torch.manual_seed(42)
    num_trials = NUM_TRIALS[device]
    logits = distribution((1, vocab_size), device)
    probs = torch.softmax(logits, dim=-1)
    counter = torch.zeros(vocab_size, dtype=torch.int32, device=logits.device)
    samples = flashinfer.sampling.sampling_from_logits(
        logits, indices=torch.zeros(num_trials, dtype=torch.int32, device=logits.device)
    )
    counter.scatter_add_(0, samples.long(), torch.ones_like(samples))
    freq = counter.float() / num_trials
    similarity = torch.cosine_similarity(freq, probs)
    assert similarity > 0.99, f"similarity: {similarity}"


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling(device, batch_size, vocab_size, p):
    torch.manual_seed(42)
    eps = 1e-4
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    sorted_prob, indices = torch.sort(normalized_prob, descending=False)
    cdf = torch.cumsum(sorted_prob, dim=-1)
    mask = torch.zeros(batch_size, vocab_size, dtype=torch.int32, device=device)
    mask.scatter_add_(1, indices, (cdf > (1 - p) - eps).int())

    num_trails = 1000
    for _ in range(num_trails):
        samples = flashinfer.sampling.top_p_sampling_from_probs(normalized_prob, p)
        assert torch.all(samples < vocab_size) and torch.all(samples >= 0)
        assert torch.all(mask[torch.arange(batch_size), samples] == 1)


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size,k", VOCAB_K)
def test_top_k_sampling(device, batch_size, vocab_size, k):
    torch.manual_seed(42)
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    sorted_prob, _ = torch.sort(normalized_prob, descending=True)
    pivot = sorted_prob[:, k - 1]
    mask = (normalized_prob >= pivot.unsqueeze(-1)).int()

    num_trails = 1000
    for _ in range(num_trails):
        samples = flashinfer.sampling.top_k_sampling_from_probs(normalized_prob, k)
        assert torch.all(samples < vocab_size) and torch.all(samples >= 0)
        assert torch.all(mask[torch.arange(batch_size), samples] == 1), normalized_prob[
            torch.arange(batch_size), samples
        ]


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size,k", VOCAB_K)
def test_top_k_sampling_with_variable_k(device, batch_size, vocab_size, k):
    torch.manual_seed(42)
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    sorted_prob, _ = torch.sort(normalized_prob, descending=True)
    k = torch.randint(1, k + 1, (batch_size,), device=device)
    pivot = sorted_prob[torch.arange(batch_size), k - 1]
    mask = (normalized_prob >= pivot.unsqueeze(-1)).int()

    num_trails = 1000
    for _ in range(num_trails):
        samples = flashinfer.sampling.top_k_sampling_from_probs(normalized_prob, k)
        assert torch.all(samples < vocab_size) and torch.all(samples >= 0)
        assert torch.all(mask[torch.arange(batch_size), samples] == 1), normalized_prob[
            torch.arange(batch_size), samples
        ]


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.05, 0.1, 0.2, 0.7, 1])
def test_min_p_sampling(device, batch_size, vocab_size, p):
    torch.manual_seed(42)
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    sorted_prob, indices = torch.sort(normalized_prob, descending=False)
    # min-p scaled by each row's largest probability
    top_probs = sorted_prob[:, -1].unsqueeze(-1)
    scaled_p = p * top_probs
    mask = torch.zeros(batch_size, vocab_size, dtype=torch.int32, device=device)
    mask.scatter_add_(1, indices, (sorted_prob >= scaled_p).int())
    min_p_tensor = torch.full((batch_size,), p, device=device)

    num_trails = 1000
    for _ in range(num_trails):
        samples = flashinfer.sampling.min_p_sampling_from_probs(
            normalized_prob,
            min_p_tensor,
        )

        assert torch.all(mask[torch.arange(batch_size), samples] == 1), samples[
            torch.nonzero(mask[torch.arange(batch_size), samples] == 0)
        ]


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_joint_sampling_from_probs(device, batch_size, vocab_size, p):
    torch.manual_seed(42)
    if p == 0.1:
        k = int(vocab_size * 0.5)
    elif p == 0.5:
        k = int(vocab_size * 0.1)
    else:
        raise ValueError("p not recognized")
    eps = 1e-4
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    # top-p mask
    sorted_prob, indices = torch.sort(normalized_prob, descending=False)
    cdf = torch.cumsum(sorted_prob, dim=-1)
    mask_top_p = torch.zeros(batch_size, vocab_size, dtype=torch.int32, device=device)
    mask_top_p.scatter_add_(1, indices, (cdf > (1 - p) - eps).int())
    # top-k mask
    sorted_prob, _ = torch.sort(normalized_prob, descending=True)
    pivot = sorted_prob[:, k - 1]
    mask_top_k = (normalized_prob >= pivot.unsqueeze(-1)).int()
    # both
    mask = torch.minimum(mask_top_p, mask_top_k)
    top_p_tensor = torch.full((batch_size,), p, device=device)
    top_k_tensor = torch.full((batch_size,), k, device=device)

    num_trails = 1000
    for _ in range(num_trails):
        samples = flashinfer.sampling.top_k_top_p_sampling_from_probs(
            normalized_prob,
            top_k_tensor,
            top_p_tensor,
            filter_apply_order="joint",
        )
        assert torch.all(samples < vocab_size) and torch.all(samples >= 0)
        assert torch.all(mask[torch.arange(batch_size), samples] == 1), normalized_prob[
            torch.arange(batch_size), samples
        ]


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("k", [100])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_sampling_from_probs_logits_alignment(device, batch_size, vocab_size, k, p):
    torch.manual_seed(42)
    logits = torch.randn(batch_size, vocab_size, device=device) * 5
    generator_logits = torch.Generator(device)
    generator_probs = generator_logits.clone_state()
    samples = flashinfer.sampling.top_k_top_p_sampling_from_logits(
        logits, k, p, filter_apply_order="top_k_first", generator=generator_logits
    )
    samples_ref = flashinfer.sampling.top_k_top_p_sampling_from_probs(
        torch.softmax(logits, dim=-1),
        k,
        p,
        filter_apply_order="top_k_first",
        generator=generator_probs,
    )

    num_matches = (samples == samples_ref).sum().item()
    match_rate = num_matches / samples.numel()

    # softmax then top-k renormalisation and top-k masking then softmax need not agree to the bit,
    # which can move a top-p boundary: up to 1% of the rows may differ.
    assert match_rate >= 0.99, (
        f"Sample match rate {match_rate:.2%} is below threshold "
        f"({batch_size - num_matches}/{batch_size} mismatches, expected <=1%)"
    )


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_joint_sampling_from_logits(device, batch_size, vocab_size, p):
    torch.manual_seed(42)
    logits = torch.rand(batch_size, vocab_size, device=device) * 5
    generator_logits = torch.Generator(device)
    generator_probs = generator_logits.clone_state()
    if p == 0.1:
        k = int(vocab_size * 0.5)
    elif p == 0.5:
        k = int(vocab_size * 0.1)
    else:
        raise ValueError("p not recognized")

    samples = flashinfer.sampling.top_k_top_p_sampling_from_logits(
        logits, k, p, filter_apply_order="joint", generator=generator_logits
    )

    samples_ref = flashinfer.sampling.top_k_top_p_sampling_from_probs(
        torch.softmax(logits, dim=-1),
        k,
        p,
        filter_apply_order="joint",
        generator=generator_probs,
    )
    assert torch.all(samples == samples_ref)


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1.0])
def test_top_p_renorm_probs(device, batch_size, vocab_size, p):
    torch.manual_seed(42)
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    sorted_prob, indices = torch.sort(normalized_prob, descending=False)
    cdf = torch.cumsum(sorted_prob, dim=-1)
    mask = torch.zeros(batch_size, vocab_size, dtype=torch.int32, device=device)
    mask.scatter_add_(1, indices, (cdf >= (1 - p)).int())
    renorm_prob_ground_truth = normalized_prob.clone()
    renorm_prob_ground_truth[mask == 0] = 0
    renorm_prob_ground_truth = renorm_prob_ground_truth / renorm_prob_ground_truth.sum(dim=-1, keepdim=True)

    renorm_prob = flashinfer.sampling.top_p_renorm_probs(normalized_prob, p)
    torch.testing.assert_close(
        renorm_prob_ground_truth,
        renorm_prob,
        rtol=1e-3,
        atol=1e-3,
    )


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size,k", VOCAB_K)
def test_top_k_renorm_probs(device, batch_size, vocab_size, k):
    torch.manual_seed(42)
    normalized_prob = normalized_probs(batch_size, vocab_size, device)
    sorted_prob, _ = torch.sort(normalized_prob, descending=True)
    pivot = sorted_prob[:, k - 1]
    mask = (normalized_prob >= pivot.unsqueeze(-1)).int()
    renorm_prob_ground_truth = normalized_prob.clone()
    renorm_prob_ground_truth[mask == 0] = 0
    renorm_prob_ground_truth = renorm_prob_ground_truth / renorm_prob_ground_truth.sum(dim=-1, keepdim=True)

    renorm_prob = flashinfer.sampling.top_k_renorm_probs(normalized_prob, k)
    for i in range(batch_size):
        torch.testing.assert_close(
            renorm_prob_ground_truth[i],
            renorm_prob[i],
            rtol=1e-3,
            atol=1e-3,
        )


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size,k", VOCAB_K)
@pytest.mark.parametrize("neginf_input", [False, True])
def test_top_k_mask_logits(device, batch_size, vocab_size, k, neginf_input):
    torch.manual_seed(42)
    logits = torch.randn(batch_size, vocab_size, device=device) * 5
    if neginf_input:
        num_neginf = torch.randint(1, vocab_size * batch_size, (1,)).item()
        idxs = torch.randperm(batch_size * vocab_size, device=device)[:num_neginf]
        logits[idxs // vocab_size, idxs % vocab_size] = -float("inf")
    probs = torch.softmax(logits, dim=-1)
    masked_logits = flashinfer.sampling.top_k_mask_logits(logits, k)
    renormed_probs = torch.softmax(masked_logits, dim=-1)
    renormed_probs_ref = flashinfer.sampling.top_k_renorm_prob(probs, k)

    torch.testing.assert_close(
        renormed_probs,
        renormed_probs_ref,
        rtol=1e-3,
        atol=1e-3,
    )


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("num_speculate_tokens", [1, 3, 5, 7])
@pytest.mark.parametrize("onehot_target", [False, True])
def test_chain_speculative_sampling(device, batch_size, vocab_size, num_speculate_tokens, onehot_target):
    pre_norm_draft_prob = torch.rand(batch_size, num_speculate_tokens, vocab_size, device=device)
    normalized_draft_prob = pre_norm_draft_prob / pre_norm_draft_prob.sum(dim=-1, keepdim=True)
    draft_token_ids = torch.randint(vocab_size, (batch_size, num_speculate_tokens), device=device)
    if not onehot_target:
        pre_norm_target_prob = torch.rand(batch_size, num_speculate_tokens + 1, vocab_size, device=device)
        target_onehot_prob = pre_norm_target_prob / pre_norm_target_prob.sum(dim=-1, keepdim=True)
    else:
        target_token_ids = torch.randint(vocab_size, (batch_size, num_speculate_tokens + 1), device=device)
        target_token_ids[..., :num_speculate_tokens] = draft_token_ids
        target_onehot_prob = torch.zeros((batch_size, num_speculate_tokens + 1, vocab_size), device=device)
        target_onehot_prob.scatter_(2, target_token_ids.unsqueeze(-1), 1)

    # Validity of the output only, as FlashInfer's test.
    for trials in range(10):  # noqa: B007
        accepted_num = torch.zeros(batch_size, dtype=torch.int32, device=device)
        emitted_num = torch.zeros(batch_size, dtype=torch.int32, device=device)
        (
            output_token_ids,
            accepted_num,
            emitted_num,
        ) = flashinfer.sampling.chain_speculative_sampling(
            normalized_draft_prob,
            draft_token_ids,
            target_onehot_prob,
            accepted_num,
            emitted_num,
        )
        if onehot_target:
            assert torch.all(output_token_ids == target_token_ids)
        else:
            assert torch.all(output_token_ids[output_token_ids >= 0] < vocab_size)
            assert output_token_ids.shape == (batch_size, num_speculate_tokens + 1)
            matches = output_token_ids[..., :-1] != draft_token_ids
            for row in range(batch_size):
                mismatch_idx = torch.nonzero(matches[row], as_tuple=True)[0]
                if len(mismatch_idx) > 0:
                    # the mismatches are contiguous
                    assert torch.all(mismatch_idx[1:] == mismatch_idx[:-1] + 1)
                    # past the first mismatched token, every output token is -1
                    assert torch.all(output_token_ids[row, mismatch_idx[0] + 1 :] == -1)

        assert torch.all(emitted_num + 1 == (output_token_ids != -1).sum(dim=1))


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.05, 0.1, 0.2, 0.7, 1])
def test_check_tensor_param_min_p(device, batch_size, vocab_size, p):
    normalized_prob = normalized_probs(batch_size, vocab_size, device)

    # 1: a float p works and gives samples of shape (batch_size,).
    samples = flashinfer.sampling.min_p_sampling_from_probs(normalized_prob, p)
    assert samples.shape == (batch_size,)

    # 2: a 2D tensor is an error.
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        flashinfer.sampling.min_p_sampling_from_probs(
            normalized_prob,
            torch.tensor([[p] * vocab_size] * batch_size, dtype=torch.int, device=device),
        )

    # 3: a 0D tensor is an error.
    with pytest.raises(
        ValueError,
        match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*got a 0-dimensional tensor",
    ):
        flashinfer.sampling.min_p_sampling_from_probs(
            normalized_prob, torch.tensor(p, dtype=torch.int, device=device)
        )

    # 4: a 1D tensor of another batch size is an error (when batch_size > 1).
    if batch_size > 1:
        with pytest.raises(ValueError, match="Sampling parameter tensor batch size mismatch"):
            flashinfer.sampling.min_p_sampling_from_probs(
                normalized_prob, torch.tensor([p], dtype=torch.int, device=device)
            )

    # 5: a 1D tensor of the batch size works.
    samples = flashinfer.sampling.min_p_sampling_from_probs(
        normalized_prob,
        torch.tensor([p] * batch_size, dtype=torch.int, device=device),
    )
    assert samples.shape == (batch_size,)


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_check_tensor_param_top_p(device, batch_size, vocab_size, p):
    normalized_prob = normalized_probs(batch_size, vocab_size, device)

    # 1: a float p gives the shape of probs.
    samples = flashinfer.sampling.top_p_renorm_probs(normalized_prob, p)
    assert samples.shape == normalized_prob.shape

    # 2: a 2D tensor is an error.
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        flashinfer.sampling.top_p_renorm_probs(
            normalized_prob,
            torch.tensor([[p] * vocab_size] * batch_size, dtype=torch.int, device=device),
        )

    # 3: a 0D tensor is an error.
    with pytest.raises(
        ValueError,
        match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*got a 0-dimensional tensor",
    ):
        flashinfer.sampling.top_p_renorm_probs(
            normalized_prob, torch.tensor(p, dtype=torch.int, device=device)
        )

    # 4: a 1D tensor of another batch size is an error (when batch_size > 1).
    if batch_size > 1:
        with pytest.raises(ValueError, match="Sampling parameter tensor batch size mismatch"):
            flashinfer.sampling.top_p_renorm_probs(
                normalized_prob, torch.tensor([p], dtype=torch.int, device=device)
            )

    # 5: a 1D tensor of the batch size works.
    samples = flashinfer.sampling.top_p_renorm_probs(
        normalized_prob,
        torch.tensor([p] * batch_size, dtype=torch.int, device=device),
    )
    assert samples.shape == normalized_prob.shape


@pytest.mark.parametrize("batch_size", [1, 99, 989])
@pytest.mark.parametrize("vocab_size,k", VOCAB_K)
def test_check_tensor_param_top_k(device, batch_size, vocab_size, k):
    normalized_prob = normalized_probs(batch_size, vocab_size, device)

    # 1: a scalar k gives the shape of probs.
    samples = flashinfer.sampling.top_k_renorm_probs(normalized_prob, k)
    assert samples.shape == normalized_prob.shape

    # 2: a 2D tensor is an error.
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        flashinfer.sampling.top_k_renorm_probs(
            normalized_prob,
            torch.tensor([[k] * vocab_size] * batch_size, dtype=torch.int, device=device),
        )

    # 3: a 0D tensor is an error.
    with pytest.raises(
        ValueError,
        match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*got a 0-dimensional tensor",
    ):
        flashinfer.sampling.top_k_renorm_probs(
            normalized_prob, torch.tensor(k, dtype=torch.int, device=device)
        )

    # 4: a 1D tensor of another shape is an error (when batch_size > 1).
    if batch_size > 1:
        with pytest.raises(ValueError, match="Sampling parameter tensor batch size mismatch"):
            flashinfer.sampling.top_k_renorm_probs(
                normalized_prob, torch.tensor([k], dtype=torch.int, device=device)
            )

    # 5: a 1D tensor of the batch size works.
    samples = flashinfer.sampling.top_k_renorm_probs(
        normalized_prob,
        torch.tensor([k] * batch_size, dtype=torch.int, device=device),
    )
    assert samples.shape == normalized_prob.shape
