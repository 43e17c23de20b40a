"""Beam search widens the prompt's cache to num_beams rows once, then never reorders it: after a step, new beam
i continues the keys and values of OLD beam i, not those of its parent, so it is scored on another beam's past."""

import torch
import torch.nn.functional as F

from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache, forward
from solutions.ex6_decoding import Hypothesis
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "6c and equals_transformers"  # the checker's part that catches it


@torch.no_grad()
def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    kv_cache = KVCache(model.config.n_layer)
    logits = forward(model, torch.tensor([prompt_ids]), torch.arange(len(prompt_ids))[None], kv_cache)[:, -1]
    beams, scores, finished = [[]], torch.zeros(1), []
    for step in range(max_new_tokens):
        totals = scores[:, None] + F.log_softmax(logits.float(), dim=-1)
        top = totals.flatten().topk(2 * num_beams)
        last_step = step + 1 == max_new_tokens
        parents, next_beams, next_scores = [], [], []
        for rank, (total, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            parent, token = divmod(index, totals.shape[1])
            tokens = beams[parent] + [token]
            if token == eos_token_id or last_step:
                if rank < num_beams:
                    finished.append(Hypothesis(tokens, total / len(tokens) ** length_penalty))
            elif len(next_beams) < num_beams:
                parents.append(parent), next_beams.append(tokens), next_scores.append(total)
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:num_beams]
        if last_step or (len(finished) == num_beams and next_scores[0] / (step + 1) ** length_penalty <= finished[-1].score):
            break
        beams, scores = next_beams, torch.tensor(next_scores)
        if step == 0:  # the one prompt row, widened to the beams once
            rows = torch.zeros(len(beams), dtype=torch.long)
            kv_cache.keys = [k[rows] for k in kv_cache.keys]
            kv_cache.values = [v[rows] for v in kv_cache.values]
        # the bug: from then on the rows stay where they are, whoever each new beam's parent is
        new_tokens = torch.tensor([[t[-1]] for t in beams])
        logits = forward(model, new_tokens, torch.full_like(new_tokens, len(prompt_ids) + step), kv_cache)[:, -1]
    return finished


globals().update(public_names(reference_with(EXERCISE, beam_search=beam_search)))
