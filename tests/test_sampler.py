"""workshop/serving/sampling.py, the engines' batched sampler: a row's token depends on its logits, parameters
and generator only (not on the batch), the caller's logits are left alone, and the two-level inverse
CDF picks the token a cumulative sum over the whole vocabulary would.

    pytest tests/test_sampler.py
"""

import random

import pytest
import torch

from workshop.serving.sampling import BLOCK, GREEDY, SamplingParams, inverse_cdf, make_generator, sample


@pytest.mark.parametrize("vocab", [5, BLOCK, BLOCK + 1, 1000, 50257])
def test_inverse_cdf_equals_a_whole_cumulative_sum(vocab):
    g = torch.Generator().manual_seed(vocab)
    for trial in range(20):
        logits = torch.randn(8, vocab, generator=g) * 3
        if trial % 2:
            logits[:, torch.randperm(vocab, generator=g)[:vocab // 2]] = -float("inf")
        probs = logits.softmax(dim=1)
        u = torch.rand(8, generator=g, dtype=torch.float64)
        cdf = probs.cumsum(dim=1)
        expected = torch.searchsorted(cdf, (u.view(-1, 1) * cdf[:, -1:]).float(), right=True).view(-1)
        got = inverse_cdf(probs, u)
        assert (probs.gather(1, got.view(-1, 1)) > 0).all(), "a token of probability 0 was drawn"
        assert got.tolist() == expected.tolist(), f"vocab {vocab}, trial {trial}: not the token a whole cumulative sum picks"


def test_the_draws_follow_the_distribution():
    p = torch.tensor([[0.05, 0.1, 0.2, 0.15, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1]])
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.cat([inverse_cdf(p, torch.rand(1, generator=g, dtype=torch.float64)) for _ in range(4000)]),
                            minlength=10).double() / 4000
    assert counts[4] == 0 and (counts - p[0]).abs().max() < 0.03, counts.tolist()


def test_a_row_samples_the_same_whatever_the_batch():
    rng = random.Random(0)
    logits = torch.randn(12, 50257, generator=torch.Generator().manual_seed(1)) * 2
    params = [GREEDY if i % 4 == 0 else SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0, 1.3]), top_k=rng.choice([0, 40]),
                                                       top_p=rng.choice([1.0, 0.9]), min_p=rng.choice([0.0, 0.05]),
                                                       repetition_penalty=rng.choice([1.0, 1.3]), seed=i) for i in range(12)]
    histories = [[rng.randrange(50257) for _ in range(rng.randrange(1, 20))] for _ in range(12)]
    before = logits.clone()
    batch = sample(logits, params, [make_generator(p.seed) for p in params], histories)
    assert torch.equal(logits, before), "sample() changed the caller's logits"
    for i in range(12):
        alone = sample(logits[i:i + 1].clone(), [params[i]], [make_generator(params[i].seed)], [histories[i]])
        assert alone == [batch[i]], f"row {i} ({params[i]}): {batch[i]} in the batch, {alone[0]} alone"
