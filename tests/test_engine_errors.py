"""Engine faults of the batching references (exercises 3, 4, 5 and 11, and the server's engine): a request that
cannot run gets one clear ValueError before any work starts, every request that can run is served, none dropped,
and an engine whose step raised refuses every later call with one sentence (EngineFailed), a new one serving.

    pytest tests/test_engine_errors.py
"""

import random

import pytest

import gpt
import solutions.ex2_kv_cache as alone
import solutions.ex3_static_batching as static
import solutions.ex4_continuous_batching as continuous
import solutions.ex5_paged_kv_cache as paged
import solutions.ex11_cuda_graphs as cuda_graphs
from workshop.engine_failure import EngineFailed
from workshop.serving import overlap
from workshop.serving.engine_core import ServingEngine
from workshop.serving.sampling import GREEDY, SamplingParams
from workshop.grading.harness import count_model_work
from workshop.serving.workloads import mixed_workload

GOOD = [464, 3290, 13]  # any prompt


@pytest.fixture(scope="module")
def model():
    return gpt.load_model("tiny", device=gpt.default_device())


def bad_requests(n_positions):
    """(description, prompt, max_new_tokens, words the message must contain)"""
    return [
        ("empty prompt", [], 5, "empty"),
        ("no new tokens", GOOD, 0, "max_new_tokens"),
        ("negative max_new_tokens", GOOD, -3, "max_new_tokens"),
        ("prompt past the context", list(range(n_positions + 1)), 1, "context"),
        ("prompt + new tokens past the context", GOOD, n_positions - 2, "context"),
    ]


def assert_one_clear_sentence(error, *words):
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), f"not one sentence: {message!r}"
    for word in words:
        assert word in message, f"the message should mention {word!r}: {message!r}"


@pytest.mark.parametrize("case", range(5))
def test_static_rejects_a_bad_request_before_any_work(model, case):
    what, prompt, n, word = bad_requests(model.config.n_positions)[case]
    with count_model_work(model) as work, pytest.raises(ValueError) as error:
        static.generate(model, [GOOD, GOOD, prompt], [4, 4, n], batch_size=2)  # the bad one is in the second batch
    assert_one_clear_sentence(error, word, "Request 2")
    assert work.forward_passes == 0, f"{what}: {work.forward_passes} forward passes ran before the error"
    with pytest.raises(ValueError) as error:
        static.generate_batch(model, [prompt], n)
    assert_one_clear_sentence(error, word)


@pytest.mark.parametrize("batch_size", [0, -1])
def test_static_rejects_batch_size_below_one(model, batch_size):
    with count_model_work(model) as work, pytest.raises(ValueError) as error:
        static.generate(model, [GOOD], 3, batch_size=batch_size)
    assert_one_clear_sentence(error, "batch_size")
    assert work.forward_passes == 0


def test_static_rejects_mismatched_lengths_and_no_requests(model):
    with pytest.raises(ValueError) as error:
        static.generate(model, [GOOD, GOOD], [3], batch_size=2)
    assert_one_clear_sentence(error, "max_new_tokens")
    with pytest.raises(ValueError) as error:
        static.generate(model, [], 3, batch_size=2)
    assert_one_clear_sentence(error, "prompt")


@pytest.mark.parametrize("case", range(5))
def test_continuous_rejects_a_bad_request_before_any_work(model, case):
    what, prompt, n, word = bad_requests(model.config.n_positions)[case]
    requests = [continuous.Request(GOOD, 4), continuous.Request(prompt, n, arrival_step=3)]
    with count_model_work(model) as work, pytest.raises(ValueError) as error:
        continuous.generate(model, requests, max_batch_size=2)
    assert_one_clear_sentence(error, word, "Request 1")
    assert work.forward_passes == 0, f"{what}: {work.forward_passes} forward passes ran before the error"


@pytest.mark.parametrize("max_batch_size", [0, -2])
def test_continuous_rejects_max_batch_size_below_one(model, max_batch_size):
    with pytest.raises(ValueError) as error:
        continuous.generate(model, [continuous.Request(GOOD, 3)], max_batch_size=max_batch_size)
    assert_one_clear_sentence(error, "max_batch_size")


def test_continuous_serves_no_requests(model):
    result = continuous.generate(model, [], max_batch_size=4)
    assert result.sequences == [] and result.finish_order == [] and result.stats.steps == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_request_finishes_once(model, seed):
    """Random arrivals (some while the batch is full, some after it ran dry), lengths and batch sizes,
    EOS that ends some requests at their first token: each request finishes once, with its own tokens."""
    rng = random.Random(seed)
    w = mixed_workload(model, 14, prompt_len=(1, 20), output_len=(1, 12), seed=seed)
    eos = alone.generate(model, w.prompts[0], 1)[0]
    arrivals = sorted(rng.choice([0, 0, 1, 4, 9, 30, 60]) for _ in range(len(w)))  # gaps: the engine goes idle
    requests = [continuous.Request(p, n, arrival_step=s) for p, n, s in zip(w.prompts, w.max_new_tokens, arrivals)]
    result = continuous.generate(model, requests, max_batch_size=rng.randint(1, 4), eos_token_id=eos)
    assert sorted(result.finish_order) == list(range(len(w)))
    for seq, request in zip(result.sequences, requests):
        assert seq.request is request and seq.finished_step >= seq.admitted_step >= request.arrival_step
        assert seq.output_ids == alone.generate(model, request.prompt_ids, request.max_new_tokens, eos)


def test_arrival_times_are_waited_for(model):
    """Requests arriving in real time (seconds) are served when they arrive, even after the engine ran dry."""
    w = mixed_workload(model, 4, prompt_len=(2, 6), output_len=(1, 3), seed=0)
    times = [0.0, 0.0, 0.15, 0.3]
    requests = [continuous.Request(p, n, arrival_time=t) for p, n, t in zip(w.prompts, w.max_new_tokens, times)]
    result = continuous.generate(model, requests, max_batch_size=2)
    assert sorted(result.finish_order) == [0, 1, 2, 3]
    for seq, t in zip(result.sequences, times):
        assert seq.arrival_s == t and seq.first_token_s >= t and seq.ttft >= 0
    assert result.stats.elapsed_s >= 0.3


def test_context_filling_prompt_beside_long_answer(model):
    """A request that fills the context but for 2 tokens runs next to one that asks for many."""
    n_positions = model.config.n_positions
    prompts = [[t % 50000 for t in range(n_positions - 2)], GOOD]
    static_out = static.generate_batch(model, prompts, [2, 20], eos_token_id=-1).outputs
    requests = [continuous.Request(prompts[0], 2), continuous.Request(GOOD, 20)]
    continuous_out = continuous.generate(model, requests, max_batch_size=2, eos_token_id=-1).outputs
    expected = [alone.generate(model, prompts[0], 2, -1), alone.generate(model, GOOD, 20, -1)]
    assert static_out == expected and continuous_out == expected


# ----------------------------------------------------------------------------------------------
# Exercise 5: the paged engine

@pytest.mark.parametrize("case", range(5))
def test_paged_rejects_a_bad_request_before_any_work(model, case):
    what, prompt, n, word = bad_requests(model.config.n_positions)[case]
    requests = [paged.Request(GOOD, 4), paged.Request(prompt, n, arrival_step=3)]
    with count_model_work(model) as work, pytest.raises(ValueError) as error:
        paged.generate(model, requests, max_batch_size=2)
    assert_one_clear_sentence(error, word, "Request 1")
    assert work.forward_passes == 0, f"{what}: {work.forward_passes} forward passes ran before the error"


@pytest.mark.parametrize("what, bad, options, word", [
    ("too big for the pool", paged.Request(GOOD, 31), dict(num_blocks=2, block_size=16), "blocks"),
    ("more continuations than seats", paged.Request(GOOD, 3, n=3), {}, "n=3"),
    ("no continuation", paged.Request(GOOD, 3, n=0), {}, "n=0"),
])
def test_paged_rejects_what_can_never_run(model, what, bad, options, word):
    with count_model_work(model) as work, pytest.raises(ValueError) as error:
        paged.generate(model, [paged.Request(GOOD, 4), bad], max_batch_size=2, **options)
    assert_one_clear_sentence(error, word, "Request 1")
    assert work.forward_passes == 0, f"{what}: {work.forward_passes} forward passes ran before the error"


def test_paged_rejects_a_budget_below_the_batch(model):
    with pytest.raises(ValueError) as error:
        paged.generate(model, [paged.Request(GOOD, 3)], max_batch_size=8, max_num_batched_tokens=4)
    assert_one_clear_sentence(error, "max_num_batched_tokens")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paged_serves_every_request_once_through_preemption(model, seed):
    """Random arrivals, lengths, batch sizes, block sizes, token budgets and pools barely larger than the
    largest request, prefix caching on or off: every request finishes once with its own tokens, no block leaks."""
    rng = random.Random(seed)
    w = mixed_workload(model, 14, prompt_len=(1, 40), output_len=(1, 30), seed=seed)
    arrivals = sorted(rng.choice([0, 0, 1, 4, 9, 30]) for _ in range(len(w)))
    block_size = rng.choice([1, 4, 16])
    largest = max(-(-(len(p) + n - 1) // block_size) for p, n in zip(w.prompts, w.max_new_tokens))
    batch = rng.randint(1, 4)
    engine = paged.Engine(model, batch, num_blocks=largest + rng.randint(0, 3), block_size=block_size,
                          max_num_batched_tokens=rng.choice([batch, 16, 512]), enable_prefix_caching=seed % 2 == 1, eos_token_id=-1)
    result = engine.run([paged.Request(p, n, arrival_step=s) for p, n, s in zip(w.prompts, w.max_new_tokens, arrivals)])
    assert sorted(result.finish_order) == list(range(len(w)))
    for seq, prompt, n in zip(result.sequences, w.prompts, w.max_new_tokens):
        assert seq.output_ids == alone.generate(model, prompt, n, -1)
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks and not any(engine.allocator.ref_counts)


@pytest.mark.parametrize("what, values, word", [
    ("negative temperature", dict(temperature=-0.5), "temperature"),
    ("temperature NaN", dict(temperature=float("nan")), "temperature"),
    ("top_p 0", dict(top_p=0.0), "top_p"),
    ("top_p above 1", dict(top_p=1.5), "top_p"),
    ("negative top_k", dict(top_k=-1), "top_k"),
    ("fractional top_k", dict(top_k=2.5), "top_k"),
    ("min_p above 1", dict(min_p=2.0), "min_p"),
    ("repetition_penalty 0", dict(repetition_penalty=0.0), "repetition_penalty"),
])
def test_bad_sampling_parameters_are_refused_when_made(what, values, word):
    """A request's sampling parameters are checked when they are made, so no engine ever starts on them."""
    with pytest.raises(ValueError) as error:
        SamplingParams(**values)
    assert_one_clear_sentence(error, word)


@pytest.mark.parametrize("engine", [continuous, paged], ids=["continuous", "paged"])
def test_greedy_and_sampled_requests_share_a_batch(model, engine):
    """Exercise 6's sampler in the engines: each request, greedy or sampled with its own seed and
    processors, gets the tokens it gets when it runs alone, and a repeated seed repeats them."""
    workload = mixed_workload(model, 6, prompt_len=(4, 24), output_len=(4, 16), seed=11)
    kinds = [GREEDY, SamplingParams(seed=1), SamplingParams(temperature=0.8, top_k=40, seed=2),
             SamplingParams(top_p=0.9, seed=3), SamplingParams(min_p=0.1, repetition_penalty=1.3, seed=4),
             SamplingParams(temperature=0.0, repetition_penalty=1.5)]
    requests = [engine.Request(prompt, n, arrival_step=i % 3, sampling=kind)  # some join a batch already running
                for i, (prompt, n, kind) in enumerate(zip(workload.prompts, workload.max_new_tokens, kinds))]
    together = engine.generate(model, requests, max_batch_size=4, eos_token_id=-1).outputs
    alone = [engine.generate(model, [engine.Request(r.prompt_ids, r.max_new_tokens, sampling=r.sampling)], 1, eos_token_id=-1).outputs[0]
             for r in requests]
    assert together == alone
    again = engine.generate(model, requests, max_batch_size=4, eos_token_id=-1).outputs
    assert again == together


# ----------------------------------------------------------------------------------------------
# An engine whose step raised is dead: it says so at every later call (workshop/engine_failure.py)

def ex11_engine(model):
    return cuda_graphs.Engine(model, 2, cuda_graphs=True)  # its decode steps through the graphs (the CPU stand-in)


def serving_engine(overlap):
    return lambda model: ServingEngine(model, 2, overlap=overlap)


# (the engine, made from a model; its module; the sampler it calls, by module and name)
ENGINES = {
    "ex4": (lambda model: continuous.Engine(model, 2), continuous, (continuous, "sample")),
    "ex5": (lambda model: paged.Engine(model, 2), paged, (paged, "sample_tokens")),
    "ex11": (ex11_engine, paged, (paged, "sample_tokens")),
    "server": (serving_engine(False), paged, (paged, "sample_tokens")),
    "server-overlap": (serving_engine(True), paged, (overlap, "sample_ids")),  # its own step, sampling on the device
}


def served(engine, module, prompt, max_new_tokens):
    """One request through an engine, by add_request and run (the server's engine keeps no result list)."""
    seqs = engine.add_request(module.Request(prompt, max_new_tokens))
    engine.run([])
    return (seqs[0] if isinstance(seqs, list) else seqs).output_ids


def failing_sampler(monkeypatch, module, name, at_call):
    """The engine's sampler raises a TypeError at its at_call-th call (1 = the first), and works otherwise."""
    sample, calls = getattr(module, name), []

    def sampler(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise TypeError("a simulated fault")
        return sample(*args, **kwargs)

    monkeypatch.setattr(module, name, sampler)


@pytest.mark.parametrize("which", ENGINES)
def test_an_engine_whose_step_raised_refuses_every_later_call(model, monkeypatch, which):
    """The sampler raises once, mid-run, after earlier steps changed the engine's state: the error goes up as it is,
    then step(), run() and add_request() each raise EngineFailed, one sentence naming the step and the error, instead
    of computing on half-updated state (on a CPU exercise 5's next step failed in torch.cat; on a GPU, a device assert)."""
    make, module, (sampler_module, name) = ENGINES[which]
    engine = make(model)
    failing_sampler(monkeypatch, sampler_module, name, at_call=2)  # the first step's sampling works, a later one's fails
    with pytest.raises(TypeError, match="a simulated fault"):
        engine.run([module.Request(GOOD, 6), module.Request(GOOD[:2], 6, arrival_step=1)])
    monkeypatch.undo()  # the sampler works again: the engine still refuses, its state is what is wrong
    for what, call in [("step()", engine.step), ("run()", lambda: engine.run([module.Request(GOOD, 2)])),
                       ("add_request()", lambda: engine.add_request(module.Request(GOOD, 2)))]:
        with pytest.raises(EngineFailed) as error:
            call()
        assert_one_clear_sentence(error, "the engine failed at step 1", "TypeError: a simulated fault", "make a new one")
    assert served(make(model), module, GOOD, 3) == alone.generate(model, GOOD, 3), "a new engine serves"


@pytest.mark.parametrize("which", ENGINES)
def test_a_rejected_request_leaves_the_engine_alive(model, which):
    """add_request's ValueError for a request that can never run comes before any change: the engine goes on."""
    make, module, _ = ENGINES[which]
    engine = make(model)
    with pytest.raises(ValueError):
        engine.add_request(module.Request([], 3))
    assert served(engine, module, GOOD, 3) == alone.generate(model, GOOD, 3)
