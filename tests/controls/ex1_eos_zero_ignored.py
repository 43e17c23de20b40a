"""A naive generate that tests its EOS for truth (`if eos_token_id and token == eos_token_id`): every EOS stops it but
id 0, a legal one ("!" in GPT-2's vocabulary), which is falsy: asked to stop at 0, it runs on to max_new_tokens."""

import torch

from gpt import EOS_TOKEN_ID, check_request

EXERCISE = "ex1_generate"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    ids = torch.tensor([prompt_ids], device=model.device)
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = model(ids, torch.arange(ids.shape[1], device=ids.device)[None])
        next_token = logits[0, -1].argmax()
        new_tokens.append(next_token.item())
        if eos_token_id and new_tokens[-1] == eos_token_id:  # the bug: id 0 is falsy
            break
        ids = torch.cat([ids, next_token.view(1, 1)], dim=1)
    return new_tokens
