"""When blocks run out, schedule() preempts the OLDEST running sequence (running[0]) instead of the
newest: the one that has done the most work is thrown away and recomputed (taken back out of this
step's schedule if it was already in it)."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5c_preemption_by_recompute or test_5c_differential_engine"  # the checks that catch it (the differential one at every seed, by a named edge)


class Engine(reference.Engine):
    def schedule(self):
        self.receive_arrivals()
        budget, scheduled, preempted = self.max_num_batched_tokens, [], False
        i = 0
        while i < len(self.running) and budget:
            seq = self.running[i]
            n = min(len(seq.token_ids) - seq.num_computed, budget)
            while seq.block_table.blocks_needed(n, self.allocator) > self.allocator.num_free_blocks:
                victim = self.running.pop(0)  # the bug: the oldest, not the newest
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
                budget += sum(m for s, m in scheduled if s is victim)  # it was scheduled earlier in this step: undo that
                scheduled = [(s, m) for s, m in scheduled if s is not victim]
                i -= 1
            if seq.block_table is None:  # it preempted itself: the next one now stands at index i
                continue
            self.reserve(seq, n)
            scheduled.append((seq, n))
            budget -= n
            i += 1
        seats = sum(1 + len(seq.forks) for seq in self.running)
        while not preempted and self.waiting and budget and seats + 1 + len(self.waiting[0].forks) <= self.max_batch_size:
            seq = self.waiting[0]
            hits = self.prefix_hits(seq)
            table = BlockTable(self.block_size, hits)
            n = min(len(seq.token_ids) - table.num_tokens, budget)
            revived = sum(self.allocator.ref_counts[b] == 0 for b in hits)
            if table.blocks_needed(n, self.allocator) > self.allocator.num_free_blocks - revived:
                break
            self.waiting.popleft()
            for block in hits:
                self.allocator.share(block)
            seq.block_table, seq.num_computed = table, table.num_tokens
            seq.prefix_hit_tokens += table.num_tokens
            self.stats.prefix_hit_tokens += table.num_tokens
            if seq.admitted_step < 0:
                seq.admitted_step = self.step_index
            self.running.append(seq)
            seats += 1 + len(seq.forks)
            self.reserve(seq, n)
            scheduled.append((seq, n))
            budget -= n
        return scheduled


BlockTable = reference.BlockTable
globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
