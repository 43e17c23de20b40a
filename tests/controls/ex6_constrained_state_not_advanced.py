"""A generate that masks every step with the FIRST state's mask: it never advances the constraint's state,
so the output is made of allowed first tokens, not a match."""

import torch

import solutions.ex6_constrained as reference
from gpt import check_request
from tests.control_support import public_names

EXERCISE = "ex6_constrained"
PART = "6e_generate_greedy"  # the checker's part that catches it

globals().update({name: value for name, value in public_names(reference).items() if name != "generate"})


@torch.no_grad()
def generate(model, prompt_ids, constraint, max_new_tokens, sampling=reference.GREEDY):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    eos, state = constraint.vocab.eos_token_id, constraint.start()
    generator = reference.make_generator(sampling.seed)
    kv_cache = reference.KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    while len(new_tokens) < max_new_tokens:
        allowed = constraint.allowed(state)  # the bug: state never changes
        logits = reference.forward(model, input_ids, position_ids, kv_cache)[:, -1].float().cpu()
        token = reference.sample(logits.masked_fill(~allowed, -float("inf")), [sampling], [generator], [list(prompt_ids) + new_tokens])[0]
        new_tokens.append(token)
        if token == eos:
            break
        input_ids, position_ids = torch.tensor([[token]], device=model.device), position_ids[:, -1:] + 1
    return new_tokens
