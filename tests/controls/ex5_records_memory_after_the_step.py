"""Engine.step records the memory (record_memory) at the END of the step, after the finished sequences gave their
blocks back, instead of after scheduling: every count is consistent, but blocks_in_use and tokens_stored read
the pool between steps, not the tables the step's forward ran on."""

import torch

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "5c_differential"  # the check that catches it


class Engine(reference.Engine):
    def step(self):
        scheduled = self.schedule()
        if not scheduled:
            return
        logits = self.run_model(scheduled)
        now = self.clock()
        rows, ready = [], []
        for row, (seq, n) in enumerate(scheduled):
            seq.num_computed += n
            if seq.num_computed < len(seq.token_ids):
                continue
            for fork in seq.forks:
                fork.block_table, fork.num_computed, fork.admitted_step = seq.block_table.fork(self.allocator), seq.num_computed, seq.admitted_step
                self.running.append(fork)
                rows.append(row)
                ready.append(fork)
            seq.forks = []
            rows.append(row)
            ready.append(seq)
        if ready:
            for seq, token in zip(ready, reference.sample(logits[torch.tensor(rows, device=logits.device)], ready)):
                self.add_token(seq, token, now)
        for seq in [s for s in self.running if s.finished_step >= 0]:
            self.running.remove(seq)
            seq.block_table.free(self.allocator)
            seq.block_table = None
        self.record_memory()  # the bug: after the finished let go, not before the forward
        self.stats.steps += 1
        self.stats.batch_sizes.append(len(scheduled))
        self.stats.scheduled_tokens.append(sum(n for _, n in scheduled))


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
