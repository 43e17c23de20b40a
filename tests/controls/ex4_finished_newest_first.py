"""A continuous batcher that puts each finished sequence at the FRONT of self.finished: every request
finishes once and gets the right tokens, but finish_order reads newest first, not in the order they finished."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_admitted_and_finished_in_order"  # the check that catches it: the control runner runs only that


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
        now = self.clock()
        for seq, token in zip(decoding + admitted, next_tokens):
            seq.output_ids.append(token)
            if len(seq.output_ids) == 1:
                seq.first_token_s = now
            if token == self.eos_token_id or len(seq.output_ids) == seq.request.max_new_tokens:
                seq.finished_step, seq.finish_s = self.step_index, now
                self.finished.insert(0, seq)  # the bug: newest first
                self.free_slots.append(seq.slot)
        self.running.remove({seq for seq in decoding + admitted if seq.finished_step >= 0})
        self.free_slots.sort()
        self.stats.steps += 1
        self.stats.generated_tokens += len(next_tokens)
        self.stats.batch_sizes.append(len(next_tokens))


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
