"""beam_search reruns the prompt and every beam's tokens at each step (a fresh forward over all of them)
instead of reordering the KV cache to the new beams' parents: the hypotheses are right, the work quadratic."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6c_beam_search_prefills_once_then_runs_the_cache"  # the check that catches it

module = reference_with(EXERCISE)


@torch.no_grad()
def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=module.EOS_TOKEN_ID):
    module.check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    if num_beams < 1:
        raise ValueError(f"num_beams is {num_beams}: beam search needs at least 1 beam (1 is greedy).")
    beams, scores, finished = [[]], torch.zeros(1), []
    for step in range(max_new_tokens):
        ids = torch.tensor([list(prompt_ids) + b for b in beams], device=model.device)  # the bug: every past again
        positions = torch.arange(ids.shape[1], device=model.device)[None].expand_as(ids)
        logits = module.forward(model, ids, positions, module.KVCache(model.config.n_layer))[:, -1]
        totals = scores[:, None] + torch.nn.functional.log_softmax(logits.float().cpu(), dim=-1)
        top = totals.flatten().topk(2 * num_beams)
        last_step = step + 1 == max_new_tokens
        next_beams, next_scores = [], []
        for rank, (total, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            parent, token = divmod(index, totals.shape[1])
            tokens = beams[parent] + [token]
            if token == eos_token_id or last_step:
                if rank < num_beams:
                    finished.append(module.Hypothesis(tokens, total / len(tokens) ** length_penalty))
            elif len(next_beams) < num_beams:
                next_beams.append(tokens), next_scores.append(total)
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:num_beams]
        if last_step or (len(finished) == num_beams and next_scores[0] / (step + 1) ** length_penalty <= finished[-1].score):
            break
        beams, scores = next_beams, torch.tensor(next_scores)
    return finished


module.beam_search = beam_search
globals().update(public_names(module))
