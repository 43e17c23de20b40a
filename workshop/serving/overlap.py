"""Overlap scheduling: the host schedules and launches step n+1 while the device runs step n (vLLM V1's async
scheduling, SGLang's overlap scheduler). Given code, over any engine of exercise 5 or 11, yours included.

Exercise 5's step reads its new tokens on the host (its one .tolist()) before it schedules the next step: on a GPU
the host waits there for the whole forward, then the device waits while the host schedules, packs and launches the
next one. With one step in flight the two overlap:

    step n+1   schedule(n+1)   step n's tokens are counted (lengths, slots, max_new_tokens), their values unknown
               launch(n+1)     the forward and the sampler queued on the device, nothing read back; a decode row's
                               input is its token of step n, taken on the device from step n's sampled tensor
               resolve(n)      step n's one host read: on a GPU it waits for step n only, step n+1 is queued behind
                               it; the tokens are added, and an end-of-text is found here, a step late

An unknown token is a placeholder id, -1 - i: "row i of the step in flight" (SGLang's future token ids). The model
embeds its token ids through wte; while this engine runs its model, a hook there swaps each placeholder for that
row's token, on the device, so exercise 5's packing and DecodeBatch and exercise 11's StaticInputs and graphs carry
placeholders unchanged (a captured graph does the swap itself: it reads the tokens from a buffer allocated once).
Placeholders stand in output_ids only while a step is scheduled and launched: between steps every output is real.

A sequence that ended at step n on an end-of-text was scheduled in step n+1 all the same: that token is dropped,
never reported. One that reaches max_new_tokens is known to end when it is launched: it leaves at once.

On CUDA, the references' decode inputs (exercise 5's DecodeBatch, exercise 11's StaticInputs.fill) are uploaded from
pinned memory without waiting, so the host schedules and lays out step n+1 while step n runs. A mixed step's pack()
(and a student's upload from pageable memory) copies with a blocking copy, which waits for the device's queue first:
there only resolving the step before and scheduling run beside the device.

    Engine = overlapped(ex11.Engine)      # or exercise 5's Engine; overlap=None: on CUDA only, True: anywhere
    result = Engine(model, 8, overlap=True).run(requests)
"""

import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache

import torch

from gpt import placeholder_ids
from workshop.engine_failure import dies_on_error
from workshop.serving.sampling import sample_ids


@dataclass
class InFlight:
    """A step launched and not resolved: row i of `tokens` (on the device, not read yet) is seqs[i]'s next token."""
    tokens: torch.Tensor
    seqs: list
    step_index: int


class Overlap:
    """An engine mixin: put it before exercise 5's or 11's Engine (overlapped() does). overlap: None (default) on CUDA
    only (on a CPU the "device" is the host: nothing runs while it schedules), True anywhere, False never. It uses the
    engine's public methods and fields only; the engine's forward must embed token ids through model.transformer.wte
    (exercise 5's given forward and exercise 11's decode_step do)."""

    def __init__(self, model, max_batch_size, overlap=None, **options):
        self.overlap = model.device.type == "cuda" if overlap is None else overlap
        self.in_flight, self.uncached = None, []
        # the step in flight's tokens, at one address for every step: a captured graph reads them there
        self.last_tokens = torch.zeros(max_batch_size, dtype=torch.long, device=model.device)
        with self.placeholders_swapped(model) if self.overlap else nullcontext():  # exercise 11 captures its graphs here
            super().__init__(model, max_batch_size, **options)

    @dies_on_error  # its own step, not only exercise 5's: a launch or resolve that raised leaves half a step
    def step(self):
        """schedule(n+1), launch(n+1), resolve(n): exercise 5's step with its read moved one step later."""
        if not self.overlap:
            return super().step()
        # A repetition penalty needs each row's seen tokens. The sampler keeps them on the device only while the same
        # rows come back (and rebuilds them from the histories on the host otherwise), so a step after one that
        # sampled a penalised row waits for its tokens first: no overlap for those steps, outputs unchanged.
        if self.in_flight and any(seq.request.sampling.repetition_penalty != 1 for seq in self.in_flight.seqs):
            self.resolve()
        with self.placeholders_shown():
            scheduled = self.schedule()
            launched = self.launch(scheduled) if scheduled else None
        self.resolve()  # the step before: the host waits for it only now, with this one queued behind it
        self.in_flight = launched
        if not (self.waiting or self.running):  # nothing to schedule beside it: its tokens now
            self.resolve()

    @contextmanager
    def placeholders_shown(self):
        """Each sequence of the step in flight has its token there as a placeholder, so that schedule() counts it."""
        shown = [] if self.in_flight is None else [(seq, -1 - row) for row, seq in enumerate(self.in_flight.seqs)
                                                     if seq.finished_step < 0]  # not those that left meanwhile (aborted)
        for seq, placeholder in shown:
            seq.output_ids.append(placeholder)
        try:
            yield
        finally:
            for seq, _ in shown:
                seq.output_ids.pop()

    @contextmanager
    def placeholders_swapped(self, model=None):
        """While the block runs, the model embeds a token id -1 - i as row i of the step in flight's tokens: a gather
        on the device, no host read (and recorded into any graph captured meanwhile)."""
        def swap(wte, args):
            ids = args[0]
            return torch.where(ids < 0, self.last_tokens[(-1 - ids).clamp(min=0)], ids)

        handle = (model or self.model).transformer.wte.register_forward_pre_hook(swap)
        try:
            with placeholder_ids(len(self.last_tokens)):  # the forward's token checks let them through
                yield
        finally:
            handle.remove()

    def launch(self, scheduled):
        """Exercise 5's step up to its sampling, which stays on the device. Returns the InFlight, or None when no
        sequence gets a token (prompt chunks only)."""
        self.record_memory()
        with self.placeholders_swapped():
            logits = self.run_model(scheduled)
        rows, ready = [], []
        for row, (seq, n) in enumerate(scheduled):
            seq.num_computed += n
            if seq.num_computed < len(seq.token_ids):
                continue  # a chunk of a prompt: no token yet
            for fork in seq.forks:  # n > 1: the other continuations start from the computed prompt, and its logits
                fork.block_table, fork.num_computed = seq.block_table.fork(self.allocator), seq.num_computed
                fork.admitted_step = seq.admitted_step
                self.running.append(fork)
                rows.append(row)
                ready.append(fork)
            seq.forks = []
            rows.append(row)
            ready.append(seq)
        self.stats.steps += 1
        self.stats.batch_sizes.append(len(scheduled))
        self.stats.scheduled_tokens.append(sum(n for _, n in scheduled))
        if not ready:
            return None
        tokens = self.sample_on_device(logits, rows, ready)
        self.last_tokens[:len(ready)].copy_(tokens)  # after this step's forward read the last step's: one stream, in order
        for seq in ready:
            if len(seq.output_ids) + 1 == seq.request.max_new_tokens:  # this token is its last, whatever its value
                self.leave(seq)
        return InFlight(tokens, ready, self.step_index)

    def sample_on_device(self, logits, rows, seqs):
        """exercise 5's sample() without its read: each sequence's token from logits row rows[i], a tensor on the device."""
        picked = logits if rows == list(range(len(logits))) else logits[torch.tensor(rows, device=logits.device)]
        return sample_ids(picked, [seq.request.sampling for seq in seqs], [seq.generator for seq in seqs],
                          [seq.token_ids for seq in seqs])

    def resolve(self):
        """The step in flight's tokens, read (the step's one host read) and added; the finished leave."""
        step, self.in_flight = self.in_flight, None
        if step is None:
            return
        now = self.clock()
        for seq, token in zip(step.seqs, step.tokens.tolist()):
            if seq.finished_step >= 0:
                continue  # it ended the step before (an end-of-text, found a step late) or was aborted: dropped
            self.add_token(seq, token, now)
            if seq.finished_step >= 0:
                seq.finished_step = step.step_index  # the step that made the token, not the one that read it
                self.leave(seq)
        block_hashes = sys.modules[super().reserve.__module__].block_hashes  # those the engine's reserve() uses (yours: yours)
        for seq in self.uncached:  # the blocks whose last token was a placeholder when reserved: cached now
            if seq.block_table is not None:  # it still holds them (not finished, aborted or preempted meanwhile)
                full = seq.num_computed // self.block_size
                hashes = block_hashes(seq.token_ids[:full * self.block_size], self.block_size)
                for block, block_hash in zip(seq.block_table.blocks[:full], hashes):
                    self.allocator.cache(block, block_hash)
        self.uncached = []

    def reserve(self, seq, n):
        """exercise 5's reserve(); a block filled by a token still in flight is cached once the token is known (in
        resolve), since its hash names its tokens' values."""
        in_flight = self.enable_prefix_caching and seq.output_ids and seq.output_ids[-1] < 0  # its last token: a placeholder
        if not (in_flight and (seq.num_computed + n) // self.block_size > seq.num_computed // self.block_size):
            return super().reserve(seq, n)  # (when these tokens fill no block, nothing is cached anyway)
        self.enable_prefix_caching = False  # as reserve() without caching
        try:
            super().reserve(seq, n)
        finally:
            self.enable_prefix_caching = True
        self.uncached.append(seq)

    def leave(self, seq):
        """A finished sequence leaves the queues and gives its blocks back. The device may still be running a step
        that reads them, but whatever gets them next writes them in a later step, queued behind it on one stream."""
        for queue in (self.running, self.waiting):  # waiting: preempted while its last token was in flight
            if seq in queue:
                queue.remove(seq)
        if seq.block_table is not None:
            seq.block_table.free(self.allocator)
            seq.block_table = None


@cache
def overlapped(engine_class):
    """engine_class (exercise 5's or 11's Engine, or a subclass) with overlap scheduling: Overlap before it."""
    return type(f"Overlapped{engine_class.__name__}", (Overlap, engine_class), {})
