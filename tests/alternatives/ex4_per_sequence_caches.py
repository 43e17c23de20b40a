"""Continuous batching built another way: each running sequence keeps its own KV cache, only its real
positions, and the caches are padded into one batch only for the length of a decode step; newcomers
join at the front of the batch, each is prefilled on its own, and slots are handed out highest first."""

import torch

import solutions.ex4_continuous_batching as reference
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"


class RunningBatch:
    """The running sequences and, for each, its keys and values per layer ([1, n_head, T_row, head_dim])."""

    def __init__(self, n_layer, device):
        self.seqs, self.caches, self.n_layer, self.device = [], [], n_layer, device

    def __len__(self):
        return len(self.seqs)

    def add(self, seqs, kv_cache, mask):
        caches = []
        for row in range(len(seqs)):
            start = int(mask[row].nonzero()[0])  # the prefill was left-padded: the row's real columns start here
            caches.append(([k[row:row + 1, :, start:].clone() for k in kv_cache.keys],
                           [v[row:row + 1, :, start:].clone() for v in kv_cache.values]))
        self.seqs, self.caches = list(seqs) + self.seqs, caches + self.caches

    def remove(self, done):
        kept = [(seq, cache) for seq, cache in zip(self.seqs, self.caches) if seq not in done]
        self.seqs, self.caches = [seq for seq, _ in kept], [cache for _, cache in kept]

    @torch.no_grad()
    def decode(self, model):
        lengths = [keys[0].shape[2] for keys, _ in self.caches]
        width = max(lengths)
        batch = KVCache(self.n_layer)  # padded together for this one forward
        batch.keys = [torch.cat([reference._pad_left(keys[layer], width) for keys, _ in self.caches]) for layer in range(self.n_layer)]
        batch.values = [torch.cat([reference._pad_left(values[layer], width) for _, values in self.caches]) for layer in range(self.n_layer)]
        mask = torch.arange(width + 1, device=self.device) >= width - torch.tensor(lengths, device=self.device)[:, None]
        input_ids = torch.tensor([[seq.output_ids[-1]] for seq in self.seqs], device=self.device)
        position_ids = torch.tensor([[n] for n in lengths], device=self.device)  # a row's cache holds positions 0..n-1
        logits = forward(model, input_ids, position_ids, batch, mask)
        self.caches = [([k[row:row + 1, :, width - n:].clone() for k in batch.keys],
                        [v[row:row + 1, :, width - n:].clone() for v in batch.values]) for row, n in enumerate(lengths)]
        return logits[:, -1].argmax(dim=-1).tolist()


class Engine(reference.Engine):
    def __init__(self, model, max_batch_size, eos_token_id=reference.EOS_TOKEN_ID):
        super().__init__(model, max_batch_size, eos_token_id)
        self.running = RunningBatch(model.config.n_layer, model.device)

    def schedule(self):
        now = self.clock()
        arrived = [s for s in self.pending if s.request.arrival_step <= self.step_index and s.request.arrival_time <= now]
        for seq in arrived:
            self.pending.remove(seq)
            seq.arrival_s = seq.request.arrival_time if seq.request.arrival_step == 0 else max(seq.request.arrival_time, now)
        self.waiting.extend(sorted(arrived, key=lambda seq: (seq.arrival_s, seq.id)))  # by arrival, then as submitted
        admitted = []
        for _ in range(min(len(self.waiting), len(self.free_slots))):
            seq = self.waiting.popleft()
            seq.slot = max(self.free_slots)  # the highest free slot
            self.free_slots.remove(seq.slot)
            seq.admitted_step = self.step_index
            admitted.append(seq)
        return admitted

    def step(self):
        admitted = self.schedule()
        decoding = list(self.running.seqs)
        if not admitted and not decoding:
            return
        tokens = dict(zip(decoding, self.running.decode(self.model))) if decoding else {}
        for seq in admitted:  # each newcomer's prefill on its own
            first, kv_cache, mask = reference.prefill(self.model, [seq])
            self.running.add([seq], kv_cache, mask)
            tokens[seq] = first[0]
        now = self.clock()
        done = set()
        for seq, token in tokens.items():
            seq.output_ids.append(token)
            if len(seq.output_ids) == 1:
                seq.first_token_s = now
            if token == self.eos_token_id or len(seq.output_ids) == seq.request.max_new_tokens:
                seq.finished_step, seq.finish_s = self.step_index, now
                self.finished.append(seq)
                self.free_slots.append(seq.slot)
                done.add(seq)
        self.running.remove(done)
        self.stats.steps += 1
        self.stats.generated_tokens += len(tokens)
        self.stats.batch_sizes.append(len(tokens))


globals().update(public_names(reference_with(EXERCISE, RunningBatch=RunningBatch, Engine=Engine)))
