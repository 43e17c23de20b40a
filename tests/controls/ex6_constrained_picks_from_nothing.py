"""generate never checks that the mask allows some token: under a broken constraint it picks the argmax of
logits that are all -inf (token 0) and goes on, instead of raising."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_6e_generate_refuses_a_mask_that_allows_nothing"  # the check that catches it

module = reference_with(EXERCISE)


@torch.no_grad()
def generate(model, prompt_ids, constraint, max_new_tokens, sampling=module.GREEDY):
    module.check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    eos, state = constraint.vocab.eos_token_id, constraint.start()
    generator = module.make_generator(sampling.seed)
    kv_cache = module.KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    while len(new_tokens) < max_new_tokens:
        allowed = constraint.allowed(state)  # the bug: no check that it allows anything
        if allowed[eos] and allowed.sum() == 1:
            new_tokens.append(eos)
            break
        logits = module.forward(model, input_ids, position_ids, kv_cache)[:, -1].float().cpu()
        logits = logits.masked_fill(~allowed, -float("inf"))
        token = module.sample(logits, [sampling], [generator], [list(prompt_ids) + new_tokens])[0]
        new_tokens.append(token)
        if token == eos:
            break
        state = constraint.advance(state, token)
        input_ids, position_ids = torch.tensor([[token]], device=model.device), position_ids[:, -1:] + 1
    return new_tokens


module.generate = generate
globals().update(public_names(module))
