"""Static batching built another way: left_pad right-pads the reversed prompts and flips the result
back (the pads' positions are then their column numbers, not 0), and generate_batch keeps one length
per row, feeding finished rows a pad at a frozen position."""

import torch
from torch.nn.utils.rnn import pad_sequence

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"


def left_pad(prompts, pad_token_id=reference.PAD_TOKEN_ID, device=None):
    reversed_rows = [torch.tensor(p[::-1], device=device) for p in prompts]
    input_ids = pad_sequence(reversed_rows, batch_first=True, padding_value=pad_token_id).flip(1)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    columns = torch.arange(input_ids.shape[1], device=device)
    attention_mask = columns >= input_ids.shape[1] - lengths[:, None]
    position_ids = torch.where(attention_mask, columns - (input_ids.shape[1] - lengths[:, None]), columns)
    return input_ids, attention_mask, position_ids


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    limits = reference._check_requests(model, prompts, max_new_tokens)
    input_ids, mask, position_ids = left_pad(prompts, device=model.device)
    n_real = sum(map(len, prompts))
    stats = reference.BatchStats(prompt_tokens=n_real, padding_tokens=input_ids.numel() - n_real)
    lengths = torch.tensor([len(p) for p in prompts], device=model.device)  # tokens each row holds
    running = torch.ones(len(prompts), dtype=torch.bool, device=model.device)
    outputs, cache = [[] for _ in prompts], KVCache(model.config.n_layer)
    while True:
        tokens = forward(model, input_ids, position_ids, cache, mask)[:, -1].argmax(dim=-1)
        stats.forward_passes += 1
        for row, (token, alive) in enumerate(zip(tokens.tolist(), running.tolist())):
            if alive:
                outputs[row].append(token)
                if token == eos_token_id or len(outputs[row]) == limits[row]:
                    running[row] = False
        if not running.any():
            break
        input_ids = torch.where(running, tokens, reference.PAD_TOKEN_ID)[:, None]
        position_ids = torch.where(running, lengths, lengths - 1)[:, None]  # a finished row stays at its last position
        lengths = lengths + running
        mask = torch.cat([mask, running[:, None]], dim=1)  # a finished row's new slots are hidden, as pads are
    stats.slot_steps = len(prompts) * stats.forward_passes
    stats.generated_tokens = sum(map(len, outputs))
    stats.idle_slot_steps = stats.slot_steps - stats.generated_tokens
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad, generate_batch=generate_batch)))
