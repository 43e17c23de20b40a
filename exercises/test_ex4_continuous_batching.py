"""Checker for exercise 4, continuous batching: pytest exercises/test_ex4_continuous_batching.py"""

import random

import pytest
import torch

import solutions.ex3_static_batching as static
import solutions.ex4_continuous_batching as reference
from workshop.batch_checks import compare_with_alone, expected_alone
from workshop.harness import implementation, paired_timing
from workshop.workloads import mixed_workload, sample_prompts

NO_EOS = -1  # a token id that never comes: every request runs to its max_new_tokens
HINT = ("Hint: every step, arrived requests join the waiting queue, waiting ones take the free slots (their prefill "
        "gives their first token), every other running request decodes one token, and the finished leave at once.")


@pytest.fixture(scope="module")
def student():
    return implementation("ex4_continuous_batching")


@pytest.fixture(scope="module")
def workload(model, seed):
    """Twelve requests, prompts of 1 to 48 tokens, outputs of 1 to 40 tokens."""
    return mixed_workload(model, 12, prompt_len=(1, 48), output_len=(1, 40), seed=seed + 4)


@pytest.fixture(scope="module")
def mixed(model, seed):
    """24 requests for the cost and speed comparisons with static batching: output lengths of 1 to 40
    tokens, in batches of 4 (with so many requests per slot, continuous batching always wins)."""
    return mixed_workload(model, 24, prompt_len=(4, 24), output_len=(1, 40), seed=seed + 5)


@pytest.fixture(scope="module")
def timed(model):
    """The same kind of workload with a fixed seed for the wall-clock comparisons, so that every run
    times the same schedule (this one takes static batching 210 steps, continuous batching 137)."""
    return mixed_workload(model, 24, prompt_len=(4, 24), output_len=(1, 40), seed=0)


def make_requests(module, workload, arrival_steps=None, arrival_times=None):
    n = len(workload)
    return [module.Request(p, m, arrival_step=s, arrival_time=t) for p, m, s, t in
            zip(workload.prompts, workload.max_new_tokens, arrival_steps or [0] * n, arrival_times or [0.0] * n)]


def run(student, model, requests, max_batch_size, eos_token_id=NO_EOS):
    """The student's engine, and the batch size of every forward it made (seen from the model's side)."""
    forward_batch_sizes = []
    hook = model.transformer.wte.register_forward_hook(lambda module, args, out: forward_batch_sizes.append(args[0].shape[0]))
    try:
        result = student.generate(model, requests, max_batch_size, eos_token_id=eos_token_id)
    finally:
        hook.remove()
    return result, forward_batch_sizes


def check_outputs(result, requests, model, tokenizer, eos_token_id, what):
    sequences = getattr(result, "sequences", None)
    assert isinstance(sequences, list) and len(sequences) == len(requests), (
        f"{what}: expected result.sequences to hold {len(requests)} sequences, one per request in the order submitted; got "
        f"{len(sequences) if isinstance(sequences, list) else type(sequences).__name__}. The engine never drops a request.")
    for i, (seq, request) in enumerate(zip(sequences, requests)):
        assert seq.id == i and seq.request is request, (f"{what}: result.sequences[{i}] belongs to request {seq.id}: return "
                                                         f"the sequences in the order the requests were submitted.")
        assert seq.finished_step >= 0 and seq.admitted_step >= 0, (
            f"{what}: request {i} was {'admitted at step ' + str(seq.admitted_step) + ' but' if seq.admitted_step >= 0 else 'never admitted and'} "
            f"never finished: the engine must serve every request it accepts, never drop one silently.")
        problem = compare_with_alone(seq.output_ids, model, request.prompt_ids, request.max_new_tokens, tokenizer, eos_token_id)
        assert problem is None, (f"{what}: request {i} (prompt of {len(request.prompt_ids)} tokens, max_new_tokens="
                                 f"{request.max_new_tokens}, admitted at step {seq.admitted_step}) differs from the same request "
                                 f"generated alone.\n{problem}\n{HINT}")


def check_schedule(result, requests, max_batch_size, what):
    """The bookkeeping of every sequence tells a consistent story: one token per step while running,
    never more than max_batch_size running, nobody waiting while a slot is free, all finished once."""
    seqs = result.sequences
    ids = sorted(result.finish_order)
    assert ids == list(range(len(requests))), (
        f"{what}: finish_order should name every request exactly once, got {sorted(result.finish_order)} for {len(requests)} "
        f"requests ({'a request was lost' if len(set(ids)) < len(requests) else 'a request finished twice'}).")
    for seq, request in zip(seqs, requests):
        assert seq.admitted_step >= request.arrival_step, (
            f"{what}: request {seq.id} arrives at step {request.arrival_step} but was admitted at step {seq.admitted_step}.")
        steps = seq.finished_step - seq.admitted_step + 1
        assert len(seq.output_ids) == steps, (
            f"{what}: request {seq.id} ran from step {seq.admitted_step} to step {seq.finished_step} ({steps} steps) but got "
            f"{len(seq.output_ids)} tokens: each step gives every running request exactly one token (the prefill the first).")
    last = max(seq.finished_step for seq in seqs)
    for step in range(last + 1):
        running = [seq for seq in seqs if seq.admitted_step <= step <= seq.finished_step]
        assert len(running) <= max_batch_size, (
            f"{what}: at step {step}, {len(running)} requests run ({[s.id for s in running]}) with max_batch_size={max_batch_size}.")
        slots = sorted(seq.slot for seq in running)
        assert len(set(slots)) == len(slots) and all(0 <= s < max_batch_size for s in slots), (
            f"{what}: at step {step} the running requests sit in slots {slots}: each needs its own slot in 0..{max_batch_size - 1}.")
        waiting = [seq.id for seq, r in zip(seqs, requests) if r.arrival_step <= step < seq.admitted_step]
        assert not waiting or len(running) == max_batch_size, (
            f"{what}: at step {step}, requests {waiting} wait although only {len(running)} of {max_batch_size} slots are taken: "
            f"a slot freed at one step goes to a waiting request at the next.")


def test_running_batch_add_and_remove(student, model, seed):
    """Rows of different lengths join the batch cache right-aligned, and leave it without a trace."""
    prompts = [sample_prompts(model, 1, n, n, seed + n)[0] for n in (5, 12, 3)]
    seqs = [student.Sequence(id=i, request=student.Request(p, 10)) for i, p in enumerate(prompts)]
    alone = []
    for seq in seqs:
        first, kv_cache, mask = student.prefill(model, [seq])
        seq.output_ids.append(first[0])
        alone.append((kv_cache, mask))
    snapshot = [([k.clone() for k in c.keys], [v.clone() for v in c.values]) for c, _ in alone]  # as they were before add()
    batch = student.RunningBatch(model.config.n_layer, model.device)
    for seq, (kv_cache, mask) in zip(seqs, alone):
        batch.add([seq], kv_cache, mask)
    expected_mask = torch.tensor([[False] * (12 - len(p)) + [True] * len(p) for p in prompts])
    assert batch.seqs == seqs, "after add(), batch.seqs should list the sequences in the order they joined."
    assert torch.equal(batch.mask.cpu(), expected_mask), (
        f"after adding prompts of 5, 12 and 3 tokens the mask should be right-aligned (padding first):\nexpected\n"
        f"{expected_mask.int()}\ngot\n{batch.mask.int()}")
    for row, (keys, values) in enumerate(snapshot):
        n = len(prompts[row])
        for layer in range(model.config.n_layer):
            assert tuple(batch.kv_cache.keys[layer].shape[::2]) == (3, 12), (
                f"layer {layer}'s keys should be [3 rows, n_head, 12 positions, head_dim], got {tuple(batch.kv_cache.keys[layer].shape)}.")
            assert torch.equal(batch.kv_cache.keys[layer][row, :, 12 - n:], keys[layer][0]) and torch.equal(
                batch.kv_cache.values[layer][row, :, 12 - n:], values[layer][0]), (
                f"row {row} of layer {layer}'s cache should hold that request's own keys and values in its last {n} columns.")
    batch.remove({seqs[1]})  # the longest leaves: 9 columns are padding in both rows that stay
    assert batch.seqs == [seqs[0], seqs[2]], f"remove() should keep the other rows in order, got ids {[s.id for s in batch.seqs]}."
    assert tuple(batch.mask.shape) == (2, 5), (
        f"after the 12-token row leaves, the rows of 5 and 3 tokens need only 5 columns: mask should be [2, 5], got "
        f"{tuple(batch.mask.shape)}. Drop the leading columns that are padding in every remaining row.")
    assert torch.equal(batch.kv_cache.keys[0][0], snapshot[0][0][0][0]) and torch.equal(batch.kv_cache.values[-1][1, :, 2:], snapshot[2][1][-1][0]), \
        "after remove(), the remaining rows should still hold their own keys and values."
    next_tokens = batch.decode(model)
    expected = [expected_alone(model, prompts[i], 2, NO_EOS)[1] for i in (0, 2)]
    assert next_tokens == expected, f"decoding the batch after add() and remove() gives {next_tokens}, alone each gives {expected}."


def test_outputs_equal_each_request_alone(student, model, tokenizer, workload):
    """Twelve requests at once, at most four running: every output as if that request ran alone."""
    requests = make_requests(student, workload)
    result, _ = run(student, model, requests, 4)
    check_outputs(result, requests, model, tokenizer, NO_EOS, "generate(max_batch_size=4)")


def test_staggered_joins_and_leaves(student, model, tokenizer, workload, seed):
    """Requests arrive at scripted steps, some while the batch is full: they wait, then take freed slots."""
    rng = random.Random(seed)
    arrivals = sorted(rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 20, 30]) for _ in range(len(workload)))
    requests = make_requests(student, workload, arrival_steps=arrivals)
    result, _ = run(student, model, requests, 3)
    what = f"generate(max_batch_size=3) with arrival steps {arrivals}"
    check_outputs(result, requests, model, tokenizer, NO_EOS, what)
    check_schedule(result, requests, 3, what)


@pytest.mark.parametrize("max_batch_size", [1, 2, 5])
def test_batch_never_exceeds_max_batch_size(student, model, tokenizer, workload, max_batch_size):
    requests = make_requests(student, workload, arrival_steps=[i // 2 for i in range(len(workload))])
    result, forward_batch_sizes = run(student, model, requests, max_batch_size)
    what = f"generate(max_batch_size={max_batch_size})"
    assert max(forward_batch_sizes) <= max_batch_size, (
        f"{what}: a forward pass ran a batch of {max(forward_batch_sizes)} rows (batch sizes of every forward: "
        f"{forward_batch_sizes[:60]}...). Admit a waiting request only into a free slot.")
    sizes = list(result.stats.batch_sizes)
    assert len(sizes) == result.stats.steps and max(sizes) <= max_batch_size, (
        f"{what}: stats.batch_sizes (one entry per step, at most {max_batch_size}) reads {sizes} for {result.stats.steps} steps.")
    check_schedule(result, requests, max_batch_size, what)
    check_outputs(result, requests, model, tokenizer, NO_EOS, what)


def test_every_request_finishes_exactly_once(student, model, tokenizer, workload, seed):
    """Requests that end at their prefill (EOS first, or max_new_tokens=1) or early, arriving while
    others run: none is lost, none finishes twice."""
    rng = random.Random(seed)
    prompts = list(workload.prompts)
    eos = expected_alone(model, prompts[0], 1, NO_EOS)[0]  # request 0's very first token ends it
    limits = [rng.choice([1, 2, 30]) for _ in prompts]
    arrivals = [rng.randint(0, 6) for _ in prompts]
    requests = [student.Request(p, n, arrival_step=s) for p, n, s in zip(prompts, limits, arrivals)]
    result, _ = run(student, model, requests, 3, eos_token_id=eos)
    what = f"generate(max_batch_size=3, eos_token_id={eos}) with max_new_tokens {limits}"
    check_outputs(result, requests, model, tokenizer, eos, what)
    check_schedule(result, requests, 3, what)


def test_metrics(student, model, workload):
    """Per-request timestamps and the engine totals agree with each other and with the arrival times."""
    arrival_times = [0.0, 0.0, 0.02, 0.04, 0.06, 0.3] + [0.3 + 0.01 * i for i in range(len(workload) - 6)]
    requests = make_requests(student, workload, arrival_times=arrival_times)
    result, _ = run(student, model, requests, 4)
    stats = result.stats
    for seq, request in zip(result.sequences, requests):
        assert abs(seq.arrival_s - request.arrival_time) < 1e-9, (
            f"request {seq.id} arrives {request.arrival_time:.2f} s after the start: its arrival_s should say so, got {seq.arrival_s:.3f}.")
        assert seq.arrival_s <= seq.first_token_s <= seq.finish_s <= stats.elapsed_s + 1e-9, (
            f"request {seq.id}: expected arrival ({seq.arrival_s:.3f} s) <= first token ({seq.first_token_s:.3f} s) <= finish "
            f"({seq.finish_s:.3f} s) <= the run's elapsed_s ({stats.elapsed_s:.3f} s). No token before its request arrives.")
        n = len(seq.output_ids)
        assert abs(seq.ttft - (seq.first_token_s - seq.arrival_s)) < 1e-9 and abs(seq.latency - (seq.finish_s - seq.arrival_s)) < 1e-9
        assert n == 1 or abs(seq.tpot - (seq.finish_s - seq.first_token_s) / (n - 1)) < 1e-9
    generated = sum(len(seq.output_ids) for seq in result.sequences)
    assert stats.generated_tokens == generated == sum(stats.batch_sizes), (
        f"stats.generated_tokens ({stats.generated_tokens}) and sum(stats.batch_sizes) ({sum(stats.batch_sizes)}) should both "
        f"equal the tokens the requests got ({generated}).")
    assert abs(stats.throughput - generated / stats.elapsed_s) < 1e-6 * stats.throughput
    assert abs(stats.occupancy - generated / (stats.steps * 4)) < 1e-9


def test_occupancy_beats_static_batching(student, model, mixed):
    """The cost counter: on mixed lengths, continuous batching keeps more slots busy, in fewer steps."""
    requests = make_requests(student, mixed)
    result, _ = run(student, model, requests, 4)
    baseline = static.generate(model, mixed.prompts, mixed.max_new_tokens, 4, eos_token_id=NO_EOS).stats
    report = (f"static batching: {baseline.forward_passes} steps, occupancy {baseline.occupancy:.2f}; yours: "
              f"{result.stats.steps} steps, occupancy {result.stats.occupancy:.2f}")
    assert result.stats.occupancy > baseline.occupancy and result.stats.steps < baseline.forward_passes, (
        f"with batches of 4 on the same {len(mixed)} mixed-length requests, continuous batching should keep more slots busy "
        f"and need fewer steps than static batching: {report}.")


@pytest.mark.timing
def test_throughput_beats_static_batching(student, model, tokenizer, device, timed):
    """The same mixed workload, static batching (exercise 3's reference) against your engine."""
    requests = make_requests(student, timed)
    check_outputs(run(student, model, requests, 4)[0], requests, model, tokenizer, NO_EOS, "generate")  # correctness first
    timing = paired_timing(lambda: static.generate(model, timed.prompts, timed.max_new_tokens, 4, eos_token_id=NO_EOS),
                           lambda: student.generate(model, requests, 4, eos_token_id=NO_EOS), repeats=3, device=device)
    limit = 1.1 if device == "cpu" else 1.2
    assert timing.ratio > limit, (f"on {len(timed)} mixed-length requests with batches of 4, continuous batching should finish at least {limit}x "
                                  f"faster than static batching, measured {timing.ratio:.2f}x:\n{timing.report('static', 'yours')}")


@pytest.mark.timing
def test_speed_against_reference(student, model, tokenizer, device, timed):
    requests = make_requests(student, timed)
    check_outputs(run(student, model, requests, 4)[0], requests, model, tokenizer, NO_EOS, "generate")  # correctness first
    ref_requests = make_requests(reference, timed)
    timing = paired_timing(lambda: student.generate(model, requests, 4, eos_token_id=NO_EOS),
                           lambda: reference.generate(model, ref_requests, 4, eos_token_id=NO_EOS), repeats=3, device=device)
    limit = 2.0 if device == "cpu" else 1.5
    assert timing.ratio < limit, (f"your engine takes {timing.ratio:.2f}x the reference's time (limit {limit}x):\n"
                                  f"{timing.report('yours', 'reference')}")
