"""A different CORRECT design for exercise 6, which its checker must accept: the processors work row by
row (topk for top-k, a per-row loop for top-p, min-p and the penalty); the sampler filters only the rows
that sample, and the exponential race is written as Gumbel-max (argmax of log p + Gumbel noise made from
the same exponential draws); beam search keeps one KV cache per beam and copies a parent's for each
child; the stop checker looks for stop strings only in the text that could contain a new one and holds
back by trying each stop string's prefixes, longest first.

    pytest exercises/test_ex6_decoding.py --impl solutions --replace ex6_decoding=tests.alternatives.ex6_decoding_row_by_row
"""

import heapq

import torch
import torch.nn.functional as F

import solutions.ex6_decoding as reference
from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names

EXERCISE = "ex6_decoding"
FILTERED = reference.FILTERED
Hypothesis, SamplingParams = reference.Hypothesis, reference.SamplingParams


def _rows(values):
    return [float(v) for v in torch.as_tensor(values).flatten().tolist()]


def apply_repetition_penalty(logits, histories, penalties):
    out = logits.clone()
    for i, (history, penalty) in enumerate(zip(histories, _rows(penalties))):
        ids = torch.tensor(sorted(set(history)), dtype=torch.long)
        if len(ids):
            scores = out[i, ids]
            out[i, ids] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return out


def apply_temperature(logits, temperatures):
    out = logits.clone()
    for i, t in enumerate(_rows(temperatures)):
        if t == 0:
            best = int(logits[i].argmax())
            out[i] = FILTERED
            out[i, best] = logits[i, best]
        else:
            out[i] = logits[i] / t
    return out


def apply_top_k(logits, top_ks):
    out = logits.clone()
    for i, k in enumerate(int(k) for k in _rows(top_ks)):
        if 0 < k < logits.shape[1]:
            kth = logits[i].topk(k).values[-1]
            out[i][logits[i] < kth] = FILTERED
    return out


def apply_top_p(logits, top_ps):
    out = logits.clone()
    for i, p in enumerate(_rows(top_ps)):
        ascending = logits[i].sort().values
        mass = ascending.softmax(0).cumsum(0)
        can_go = (mass <= 1 - p).nonzero().flatten()
        last_dropped = int(can_go[-1]) if len(can_go) else -1
        last_dropped = min(last_dropped, logits.shape[1] - 2)  # the most likely token stays
        if last_dropped >= 0:
            out[i][logits[i] < ascending[last_dropped + 1]] = FILTERED
    return out


def apply_min_p(logits, min_ps):
    out = logits.clone()
    for i, m in enumerate(_rows(min_ps)):
        probs = logits[i].softmax(0)
        out[i][probs < m * probs.max()] = FILTERED
    return out


def filter_logits(logits, params, histories=None):
    logits = logits.float()
    if histories is not None:
        logits = apply_repetition_penalty(logits, histories, [p.repetition_penalty for p in params])
    logits = apply_temperature(logits, [p.temperature for p in params])
    logits = apply_top_k(logits, [p.top_k for p in params])
    logits = apply_top_p(logits, [p.top_p for p in params])
    return apply_min_p(logits, [p.min_p for p in params])


def draw_multinomial(probs, generators):
    return [int(torch.multinomial(row, 1, generator=g)) for row, g in zip(probs, generators)]


def draw_exponential_race(probs, generators):
    tokens = []
    for row, g in zip(probs, generators):
        gumbel = -torch.empty(len(row)).exponential_(generator=g).log()
        tokens.append(int((row.log() + gumbel).argmax()))
    return tokens


def sample(logits, params, generators, histories=None, draw=None):
    tokens = []
    for i, p in enumerate(params):
        row = filter_logits(logits[i:i + 1], [p], None if histories is None else [histories[i]])
        if p.greedy:
            tokens.append(int(row.argmax()))
        else:
            tokens.append((draw or draw_multinomial)(row.softmax(dim=1).cpu(), [generators[i]])[0])
    return tokens


@torch.no_grad()
def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    if num_beams < 1:
        raise ValueError(f"num_beams is {num_beams}: use at least 1.")
    cache = KVCache(model.config.n_layer)
    logits = forward(model, torch.tensor([prompt_ids]), torch.arange(len(prompt_ids))[None], cache)[0, -1]
    beams = [(0.0, [], cache, logits)]  # (score, tokens, own cache, next logits)
    finished = []  # a min-heap of (score, order, tokens)
    for step in range(max_new_tokens):
        totals = torch.stack([torch.tensor(s, dtype=torch.float32) + F.log_softmax(lg.float(), -1) for s, _, _, lg in beams])
        top = totals.flatten().topk(2 * num_beams)
        last = step + 1 == max_new_tokens
        children = []
        for rank, (total, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            parent, token = divmod(index, totals.shape[1])
            tokens = beams[parent][1] + [token]
            if token == eos_token_id or last:
                if rank < num_beams:
                    heapq.heappush(finished, (total / len(tokens) ** length_penalty, len(finished), tokens))
                    if len(finished) > num_beams:
                        heapq.heappop(finished)
            elif len(children) < num_beams:
                children.append((total, tokens, parent))
        if last or (len(finished) == num_beams and children[0][0] / (step + 1) ** length_penalty <= finished[0][0]):
            break
        new_beams = []
        for total, tokens, parent in children:
            own = KVCache(model.config.n_layer)  # each child its own cache, sharing the parent's tensors (never written in place)
            own.keys, own.values = list(beams[parent][2].keys), list(beams[parent][2].values)
            lg = forward(model, torch.tensor([[tokens[-1]]]), torch.tensor([[len(prompt_ids) + step]]), own)[0, -1]
            new_beams.append((total, tokens, own, lg))
        beams = new_beams
    return [Hypothesis(tokens, score) for score, _, tokens in sorted(finished, key=lambda f: (-f[0], f[1]))]


class StopChecker(reference.StopChecker):
    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished.")
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        else:
            before = len(self.text)
            self.text = self.tokenizer.decode([t for t in self.token_ids if t not in self.stop_token_ids])
            window = max(0, min(before, len(self.text)) - max(map(len, self.stop), default=0))  # a new stop string ends in the new text
            hits = [self.text.find(s, window) for s in self.stop]
            hits = [h for h in hits if h >= 0]
            if hits:
                self.text, self.finish_reason = self.text[:min(hits)], "stop"
            elif self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        end = len(self.text) if self.finished else self._safe_length()
        piece = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece

    def _safe_length(self):
        text = self.text.removesuffix("\ufffd")
        held = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), held, -1):  # longest prefix of stop that ends the text
                if text.endswith(stop[:n]):
                    held = n
                    break
        return len(text) - held


globals().update({k: v for k, v in public_names(reference).items() if k not in globals()})
