"""A continuous batcher whose finished sequences leave the running batch one step late: their right
tokens are all returned, but each one is decoded once more for nothing (and a step runs after the
last request has finished)."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_outputs_equal_each_request_alone"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def step(self):
        admitted = self.schedule()
        decoding = list(self.running.seqs)
        if not admitted and not decoding:
            return
        next_tokens = self.running.decode(self.model) if decoding else []
        if admitted:
            first_tokens, kv_cache, mask = reference.prefill(self.model, admitted)
            self.running.add(admitted, kv_cache, mask)
            next_tokens += first_tokens
        leaving = {seq for seq in decoding if seq.finished_step >= 0}  # finished at the step before
        now, produced = self.clock(), 0
        for seq, token in zip(decoding + admitted, next_tokens):
            if seq in leaving:
                continue  # the bug: decoded again, its token thrown away
            seq.output_ids.append(token)
            produced += 1
            if len(seq.output_ids) == 1:
                seq.first_token_s = now
            if token == self.eos_token_id or len(seq.output_ids) == seq.request.max_new_tokens:
                seq.finished_step, seq.finish_s = self.step_index, now
                self.finished.append(seq)
                self.free_slots.append(seq.slot)
        self.running.remove(leaving)  # the bug: only those that finished at the step before leave
        self.free_slots.sort()
        self.stats.steps += 1
        self.stats.generated_tokens += produced
        self.stats.batch_sizes.append(produced)


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
