"""Engine.step takes a finished sequence out of the running list but never frees its blocks: they stay
owned after their last token, so the pool drains as requests finish."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5c_serves_a_mixed"  # the check that catches it


class Engine(reference.Engine):
    def step(self):
        scheduled = self.schedule()
        if not scheduled:
            return
        self.record_memory()
        logits = forward(self.model, self.cache, [seq.token_ids[seq.num_computed:seq.num_computed + n] for seq, n in scheduled],
                         [seq.num_computed for seq, _ in scheduled], [seq.block_table.blocks for seq, _ in scheduled])
        now = self.clock()
        rows, ready = [], []  # the sequences whose tokens are all computed now, and their rows of logits
        for row, (seq, n) in enumerate(scheduled):
            seq.num_computed += n
            if seq.num_computed < len(seq.token_ids):
                continue  # a chunk of a prompt: no token yet
            for fork in seq.forks:  # 5d: the other continuations share the computed prompt, and its logits
                fork.block_table, fork.num_computed, fork.admitted_step = seq.block_table.fork(self.allocator), seq.num_computed, seq.admitted_step
                self.running.append(fork)
                rows.append(row)
                ready.append(fork)
            seq.forks = []
            rows.append(row)
            ready.append(seq)
        if ready:  # ONE sampling pass over every row that gives a token
            for seq, token in zip(ready, sample(logits[torch.tensor(rows, device=logits.device)], ready)):
                self.add_token(seq, token, now)
        for seq in [s for s in self.running if s.finished_step >= 0]:
            self.running.remove(seq)  # the bug: its blocks are never freed
        self.stats.steps += 1
        self.stats.batch_sizes.append(len(scheduled))
        self.stats.scheduled_tokens.append(sum(n for _, n in scheduled))


forward, sample, torch = reference.forward, reference.sample, reference.torch
globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
