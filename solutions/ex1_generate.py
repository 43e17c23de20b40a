"""Exercise 1: naive greedy generation.

Every step feeds the WHOLE sequence so far (prompt + everything generated) through the model and keeps
only the last position's logits. Simple and correct, but step t processes len(prompt) + t tokens, so
generating n tokens costs O(n^2) token-passes. Exercise 2 removes that waste.
"""

import torch

from gpt import EOS_TOKEN_ID, check_request


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """Greedy decoding with a full forward pass per new token.

    prompt_ids: list of token ids. Returns the new token ids (without the prompt): at most
    max_new_tokens of them, ending with eos_token_id if the model produced it.
    """
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    ids = torch.tensor([prompt_ids], device=model.device)  # [1, T]
    new_tokens = []
    for _ in range(max_new_tokens):
        position_ids = torch.arange(ids.shape[1], device=ids.device)[None]  # 0, 1, ..., T-1
        logits = model(ids, position_ids)  # [1, T, vocab]: every position recomputed
        next_token = logits[0, -1].argmax()  # greedy: the most likely next token
        new_tokens.append(next_token.item())
        if new_tokens[-1] == eos_token_id:  # only the model's token stops; an EOS inside the prompt is text
            break  # ...and at once: a forward pass after the EOS would be wasted
        ids = torch.cat([ids, next_token.view(1, 1)], dim=1)
    return new_tokens
