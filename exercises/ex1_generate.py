"""Exercise 1: naive greedy generation.

Every step feeds the WHOLE sequence so far (prompt + everything generated) through the model and keeps
only the last position's logits. Simple and correct, but step t processes len(prompt) + t tokens, so
generating n tokens costs O(n^2) token-passes. Exercise 2 removes that waste.

Stuck? exercises/hints/ex1.md has hints for each TODO, from the idea to near-code: open one at a time.
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
    # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    # TODO (exercise 1): the greedy loop. The contract:
    #   - every step runs the model (gpt.py: model(input_ids, position_ids) -> logits) on the whole
    #     sequence so far, exactly as if that sequence were a fresh prompt; the next token is the most
    #     likely one after the sequence's last token.
    #   - returns a list of Python ints: the new tokens only, at most max_new_tokens of them.
    #   - eos_token_id, once the MODEL produces it, is returned as the last token, and no forward pass
    #     runs after it: one forward pass per returned token (the checker counts them).
    #   - the prompt may contain eos_token_id (documents joined by GPT-2's end-of-text token, which is
    #     also its pad id): there it is an ordinary token that neither stops generation nor may be left out.
    raise NotImplementedError("Exercise 1: implement generate() in exercises/ex1_generate.py: a greedy loop that runs "
                              "the whole sequence every step, returns only the new tokens and stops right after the "
                              "model's EOS or after max_new_tokens.")
