"""The dtype axis of the differential checks (issue 41): every dtype a scenario draws has a tolerance and a near-tie
margin beside the harness, and the margins stand above the rounding they excuse: a cached and a batched forward of
the same small models as the checks use differ from the full single-row forward by less than half the margin."""

import random

import pytest
import torch

import gpt
import solutions.ex2_kv_cache as kv
from workshop.grading import differential, harness, scenarios
from workshop.grading.differential import Tolerance, explore


@pytest.mark.parametrize("dtype", scenarios.DTYPES, ids=scenarios.dtype_name)
def test_every_dtype_has_a_tolerance_and_a_margin(dtype):
    assert dtype in differential.TOLERANCES and dtype in harness.TIE_EPSILONS
    floor = differential.TOLERANCES[dtype]
    assert differential.tolerance(dtype) == floor
    assert differential.tolerance(dtype, Tolerance(0.0, 0.0)) == floor  # a check's tighter float32 tolerance is widened
    wide = Tolerance(1.0, 1.0)
    assert differential.tolerance(dtype, wide) == wide  # a wider one is kept


def test_each_half_type_is_drawn_at_every_seed():
    for seed in range(5):
        drawn = set()
        explore(scenarios.dtypes(), drawn.add, seed=seed, examples=20)
        assert drawn == set(scenarios.DTYPES), f"seed {seed}: only {drawn} in 20 scenarios"


@pytest.mark.parametrize("dtype", scenarios.DTYPES, ids=scenarios.dtype_name)
def test_the_margins_stand_above_the_rounding(dtype):
    rng, worst = random.Random(0), 0.0
    torch.set_num_threads(1)
    for _ in range(6):
        n_head = rng.randint(1, 4)
        config = gpt.GPTConfig(n_positions=32, n_embd=n_head * rng.choice([2, 4, 6, 8]), n_layer=rng.randint(1, 3), n_head=n_head)
        model = scenarios.small_model(config, dtype=dtype)
        ids = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(rng.randrange(1000)))
        positions = torch.arange(12)[None]
        with torch.no_grad():
            full = model(ids[:1], positions)[0].float()
            batched = model(ids, positions.expand(2, -1))[0].float()  # the same row beside another one
            cache = kv.KVCache(config.n_layer)
            cached = torch.cat([kv.forward(model, ids[:1, a:b], positions[:, a:b], cache)[0].float()
                                for a, b in [(0, 5)] + [(t, t + 1) for t in range(5, 12)]])
        worst = max(worst, (batched - full).abs().max().item(), (cached - full).abs().max().item())
        scale = full.abs().max().item()
        tol = differential.tolerance(dtype)
        assert worst <= tol.atol + tol.rtol * scale, f"{dtype}: a reordered forward differs by {worst:.3g} at logit scale {scale:.3g}"
    assert 2 * worst < harness.tie_epsilon(dtype), f"{dtype}: rounding of {worst:.3g} against a near-tie margin of {harness.tie_epsilon(dtype)}"
