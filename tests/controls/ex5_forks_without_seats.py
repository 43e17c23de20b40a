"""Admission counts one seat per running sequence, not the seats of the forks a running prompt will start
when it is computed (n > 1 with chunked prefill): the forks join later and the batch grows past
max_batch_size (the reference's own bug once: n=2 and max_batch_size=2 ran batches of 3)."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_scheduler_counts_every_seat_and_block or test_5d_differential_engine_sharing"  # the checks that catch it (the differential one at every seed, by a named edge)


class Engine(reference.Engine):
    def schedule(self):
        self.receive_arrivals()
        budget, scheduled, preempted = self.max_num_batched_tokens, [], False
        i = 0
        while i < len(self.running) and budget:
            seq = self.running[i]
            n = min(len(seq.token_ids) - seq.num_computed, budget)
            while seq.block_table.blocks_needed(n, self.allocator) > self.allocator.num_free_blocks:
                victim = self.running.pop()  # the newest: it has done the least work
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.block_table is None:  # it preempted itself
                break
            self.reserve(seq, n)
            scheduled.append((seq, n))
            budget -= n
            i += 1
        seats = len(self.running)  # the bug: the forks still to come of a running prompt hold no seat
        while not preempted and self.waiting and budget and seats + 1 + len(self.waiting[0].forks) <= self.max_batch_size:
            seq = self.waiting[0]
            hits = self.prefix_hits(seq)
            table = BlockTable(self.block_size, hits)
            n = min(len(seq.token_ids) - table.num_tokens, budget)
            revived = sum(self.allocator.ref_counts[b] == 0 for b in hits)  # free cached blocks it would take
            if table.blocks_needed(n, self.allocator) > self.allocator.num_free_blocks - revived:
                break  # first come first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            for block in hits:
                self.allocator.share(block)
            seq.block_table, seq.num_computed = table, table.num_tokens
            seq.prefix_hit_tokens += table.num_tokens
            self.stats.prefix_hit_tokens += table.num_tokens
            if seq.admitted_step < 0:
                seq.admitted_step = self.step_index
            self.running.append(seq)
            seats += 1  # (and its own forks, once admitted, are not counted for the next admission)
            self.reserve(seq, n)
            scheduled.append((seq, n))
            budget -= n
        return scheduled


BlockTable = reference.BlockTable
globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
