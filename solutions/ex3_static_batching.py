"""Exercise 3: static batching.

A decode step pushes ONE token through every weight matrix of the model: the work is mostly reading
the weights (and, on CPU, Python overhead), not arithmetic. Push B tokens, one per request, through
the same weights in one forward and B requests advance for little more than the price of one.

Static batching takes B requests, pads their prompts to a common length and runs them together until
the LAST of them is done. Three things make every row come out exactly as if run alone:

  1. Left padding. Pads go BEFORE the prompt, so every row's newest token sits in the last column
     and the next tokens of all rows are appended in one new column. (GPT-2 has no pad token; its
     EOS serves, since the mask hides it anyway.)
  2. An attention mask, False at the pads, so no query ever attends to a pad key: [B, T] at the
     prefill, one more True column per decode step.
  3. Per-row position ids that start at 0 at each row's first real token. GPT-2's positions are
     absolute: a prompt padded by 3 must still see its first token at position 0, not 3.

The waste is the lesson: the pads of the prefill, and the rows that finished early (EOS or their own
max_new_tokens) but keep their slot, computed and thrown away, until the longest row is done.
BatchStats counts both. Exercise 4 gives those slots to waiting requests instead.
"""

from dataclasses import dataclass, field, fields

import torch

from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache, forward  # the reference, never the student's exercise 2

PAD_TOKEN_ID = EOS_TOKEN_ID  # GPT-2 has no pad token: pad with EOS, which the attention mask hides


@dataclass
class BatchStats:
    """What static batching cost, counted in slots: one row of the batch during one forward pass."""
    forward_passes: int = 0  # prefill + decode steps, summed over the batches
    slot_steps: int = 0  # rows x forward passes: every slot the batches paid for
    generated_tokens: int = 0  # slots that produced a token some request keeps
    idle_slot_steps: int = 0  # slots of rows that had already finished, waiting for the longest row
    prompt_tokens: int = 0  # real prompt tokens in the prefills
    padding_tokens: int = 0  # pad tokens pushed through the prefills

    @property
    def occupancy(self):
        """Fraction of the slots that did useful work (1.0 = no row ever sat idle)."""
        return self.generated_tokens / self.slot_steps if self.slot_steps else 0.0

    def __add__(self, other):
        return BatchStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass
class BatchResult:
    outputs: list  # one list of new token ids per request, in the order the requests were given
    stats: "BatchStats" = field(default_factory=BatchStats)


def left_pad(prompts, pad_token_id=PAD_TOKEN_ID, device=None):
    """Stack prompts of different lengths into one left-padded batch.

    Returns input_ids [B, T] (T = the longest prompt; pads first, then the prompt), attention_mask
    [B, T] (bool, False at the pads) and position_ids [B, T] (0, 1, ... from each row's first real
    token). The pads' positions do not matter, since nothing attends to them: any position the model
    has will do (0 here).
    """
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = True
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # counts real tokens only
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """Greedy decoding of several requests as ONE static batch.

    max_new_tokens: one int for every request, or a list with one per request. Each row stops at
    its own EOS or its own max_new_tokens, but keeps its slot until the last row is done.
    Returns a BatchResult: the new tokens of each request (as generate() of exercise 2 would give
    them alone), and what the batch cost.
    """
    limits = _check_requests(model, prompts, max_new_tokens)
    input_ids, attention_mask, position_ids = left_pad(prompts, device=model.device)
    batch_size = len(prompts)
    stats = BatchStats(prompt_tokens=sum(map(len, prompts)), padding_tokens=input_ids.numel() - sum(map(len, prompts)))
    outputs = [[] for _ in prompts]
    finished = [False] * batch_size
    kv_cache = KVCache(model.config.n_layer)
    while True:
        logits = forward(model, input_ids, position_ids, kv_cache, attention_mask)
        next_tokens = logits[:, -1].argmax(dim=-1)  # [B]: one new token per row
        stats.forward_passes += 1
        for row, token in enumerate(next_tokens.tolist()):
            if finished[row]:
                stats.idle_slot_steps += 1  # computed and thrown away: the row already ended
                continue
            outputs[row].append(token)
            finished[row] = token == eos_token_id or len(outputs[row]) == limits[row]
        if all(finished):
            break
        input_ids = next_tokens[:, None]  # decode: every row feeds its newest token...
        # ...at its own next position. A finished row stays put: its output no longer matters, and
        # it must not run past the context while a longer row goes on.
        advance = torch.tensor([[not done] for done in finished], dtype=torch.long, device=model.device)
        position_ids = position_ids[:, -1:] + advance
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch_size, 1)], dim=1)
    stats.slot_steps = batch_size * stats.forward_passes
    stats.generated_tokens = sum(map(len, outputs))
    return BatchResult(outputs, stats)


def generate(model, prompts, max_new_tokens, batch_size, eos_token_id=EOS_TOKEN_ID):
    """Serve many requests with static batching: consecutive groups of `batch_size`, in order, each
    run to completion by generate_batch before the next starts. Returns one BatchResult for all:
    the outputs in request order and the summed cost."""
    limits = _check_requests(model, prompts, max_new_tokens)  # every request, before any work
    if batch_size < 1:
        raise ValueError(f"batch_size is {batch_size}: a batch holds at least 1 request.")
    result = BatchResult([])
    for start in range(0, len(prompts), batch_size):
        part = generate_batch(model, prompts[start:start + batch_size], limits[start:start + batch_size], eos_token_id)
        result.outputs += part.outputs
        result.stats = result.stats + part.stats
    return result


def _check_requests(model, prompts, max_new_tokens):
    """One clear ValueError for a request that cannot run; else max_new_tokens as one int per request."""
    if len(prompts) == 0:
        raise ValueError("No requests: give at least one prompt.")
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(limits)} entries for {len(prompts)} prompts: give one per prompt, or one int for all.")
    for i, (prompt, limit) in enumerate(zip(prompts, limits)):
        try:
            check_request(prompt, limit, model.config.n_positions, model.config.vocab_size)
        except ValueError as e:
            raise type(e)(f"Request {i}: {e}") from None  # the same class: InvalidIndex stays an IndexError too
    return limits
