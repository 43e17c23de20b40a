"""Exercise 1: naive greedy generation.

Every step feeds the WHOLE sequence so far (prompt + everything generated) through the model and keeps
only the last position's logits. Simple and correct, but step t processes len(prompt) + t tokens, so
generating n tokens costs O(n^2) token-passes. Exercise 2 removes that waste.

Check your work with:  pytest exercises/test_ex1_generate.py
"""

import torch

from gpt import EOS_TOKEN_ID, check_request


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """Greedy decoding with a full forward pass per new token.

    prompt_ids: list of token ids. Returns the new token ids (without the prompt): at most
    max_new_tokens of them, ending with eos_token_id if the model produced it.
    """
    check_request(prompt_ids, max_new_tokens, model.config.n_positions)
    # TODO (exercise 1), repeat up to max_new_tokens times:
    #   1. build input_ids [1, T] from the sequence so far (on model.device) and position_ids [1, T]: 0..T-1
    #   2. logits = model(input_ids, position_ids)             -> [1, T, vocab]
    #   3. the next token is the argmax of the LAST position's logits; record it (as a Python int)
    #   4. stop right after recording eos_token_id; otherwise append the token to the sequence
    raise NotImplementedError("Exercise 1: implement generate() in exercises/ex1_generate.py (greedy loop: "
                              "forward the whole sequence, argmax of the last logits, append, stop on EOS or max_new_tokens).")
