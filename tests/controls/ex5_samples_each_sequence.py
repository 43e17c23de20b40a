"""Engine.step samples the sequences whose tokens are all computed one at a time, a call of the sampler per
sequence (forks included): every token is right (each has its own generator), but a step makes as many
sampling passes as it gives tokens instead of one vectorised batch."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with
from workshop.serving.sampling import sample as sample_tokens

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5c_one_sampling_call_per_step"  # the check that catches it


class Engine(reference.Engine):
    def step(self):
        scheduled = self.schedule()
        if not scheduled:
            return
        self.record_memory()
        logits = forward(self.model, self.cache, [seq.token_ids[seq.num_computed:seq.num_computed + n] for seq, n in scheduled],  # noqa: F821
                         [seq.num_computed for seq, _ in scheduled], [seq.block_table.blocks for seq, _ in scheduled])
        now = self.clock()
        for row, (seq, n) in enumerate(scheduled):
            seq.num_computed += n
            if seq.num_computed < len(seq.token_ids):
                continue
            ready = [seq]
            for fork in seq.forks:
                fork.block_table, fork.num_computed, fork.admitted_step = seq.block_table.fork(self.allocator), seq.num_computed, seq.admitted_step
                self.running.append(fork)
                ready.append(fork)
            seq.forks = []
            for one in ready:  # the bug: one sampling call per sequence
                token = sample_tokens(logits[row:row + 1], [one.request.sampling], [one.generator], [one.token_ids])[0]
                self.add_token(one, token, now)
        for seq in [s for s in self.running if s.finished_step >= 0]:
            self.running.remove(seq)
            seq.block_table.free(self.allocator)
            seq.block_table = None
        self.stats.steps += 1
        self.stats.batch_sizes.append(len(scheduled))
        self.stats.scheduled_tokens.append(sum(n for _, n in scheduled))


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
