"""Overlap scheduling (workshop/serving/overlap.py): with one step in flight, every request's outputs are those of
exercise 5's reference engine for the same requests, seeds and options, over exercise 5's engine, exercise 11's (its
decode steps through workshop.graphs' CPU stand-in) and the server's ServingEngine (abort, ignore_eos, min_tokens);
one host read a step, made after the next step is launched; off by default on a CPU.

    pytest tests/test_overlap.py
"""

import sys
import time

import pytest
import torch
from hypothesis import strategies as st

import gpt
import solutions.ex5_paged_kv_cache as ex5
import solutions.ex11_cuda_graphs as ex11
from workshop.grading.differential import explore
from workshop.host_reads import HostReads
from workshop.serving.engine_core import ServingEngine
from workshop.serving.overlap import overlapped
from workshop.serving.runs import NO_EOS
from workshop.serving.sampling import GREEDY, SamplingParams
from workshop.serving.step_split import StepSplit

FREQUENT = (13, 198)  # tokens the tiny model often makes: as the end-of-text token, they end sequences early
SAMPLINGS = (GREEDY, SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=40, top_p=0.9),
             SamplingParams(temperature=1.3, min_p=0.05), SamplingParams(temperature=0.0, repetition_penalty=1.3),
             SamplingParams(temperature=1.0, repetition_penalty=1.2))


@pytest.fixture(scope="module")
def model():
    """tiny in float64: with overlap a late end-of-text holds its row a step longer, so a step's batch may be laid
    out otherwise than the reference's, and float32 rounding could flip a near tie (exercise 5's checker tolerates
    those); in float64 none is near enough, so any difference is the overlap's."""
    torch.set_num_threads(1)
    return gpt.load_model("tiny", device="cpu").double()


@st.composite
def scenarios(draw, block_sizes=(2, 4, 16)):
    """Requests (shared prefixes, n > 1, staggered arrivals, every sampler option, seeded) and an engine: few blocks
    (preemption), a small token budget (chunked prefill), prefix caching, an end-of-text token the model makes."""
    bs = draw(st.sampled_from(block_sizes))
    shared = draw(st.lists(st.integers(0, 50256), min_size=0, max_size=2 * bs))
    requests = []
    for i in range(draw(st.integers(1, 6))):
        own = draw(st.lists(st.integers(0, 50256), min_size=0 if shared else 1, max_size=20))
        sampling = draw(st.sampled_from(SAMPLINGS))
        requests.append(ex5.Request(shared[:draw(st.integers(0, len(shared)))] + own or [0], draw(st.integers(1, 14)),
                                    arrival_step=draw(st.integers(0, 4)), n=draw(st.sampled_from([1, 1, 2, 3])),
                                    sampling=SamplingParams(**{**vars(sampling), "seed": 100 + i})))
    max_batch_size = draw(st.integers(max(r.n for r in requests), 4))
    needed = max(-(-(len(r.prompt_ids) + r.max_new_tokens - 1) // bs) for r in requests)
    options = {"block_size": bs, "num_blocks": needed + draw(st.sampled_from([0, 1, 3, 100])),
               "max_num_batched_tokens": draw(st.sampled_from([max_batch_size, 8, 512])),
               "enable_prefix_caching": draw(st.booleans()), "eos_token_id": draw(st.sampled_from([NO_EOS, *FREQUENT]))}
    return requests, max_batch_size, options


def fresh(requests):
    """The same requests again (an engine's sequences refer to their requests)."""
    return [ex5.Request(list(r.prompt_ids), r.max_new_tokens, r.arrival_step, n=r.n, sampling=r.sampling) for r in requests]


def check_against_reference(model, engine_class, examples, seed, block_sizes=(2, 4, 16), **engine_options):
    def check(scenario):
        requests, max_batch_size, options = scenario
        expected = ex5.Engine(model, max_batch_size, **options).run(fresh(requests))
        engine = overlapped(engine_class)(model, max_batch_size, overlap=True, **engine_options, **options)
        got = engine.run(fresh(requests))
        assert got.outputs == expected.outputs, f"outputs differ from exercise 5's reference for {scenario}"
        assert got.stats.generated_tokens == sum(map(len, got.outputs)), "a dropped token was counted"
        assert all(seq.finished_step >= 0 for seq in got.sequences) and engine.in_flight is None
        assert engine.allocator.num_free_blocks == engine.allocator.num_blocks, "a finished sequence kept a block"
        block_hashes = sys.modules[engine_class.reserve.__module__].block_hashes  # the engine's own
        known = {h for seq in got.sequences for h in block_hashes(seq.token_ids, options["block_size"])}
        assert set(engine.allocator.block_of_hash) <= known, "a block was cached under a hash of tokens no sequence has"
        if getattr(engine, "graphs", None) is not None and any(n == 1 for n in got.stats.batch_sizes):
            assert sum(graph.replays for graph in engine.graphs.graphs.values()) > 0, "no decode step was replayed"
    explore(scenarios(block_sizes), check, seed=seed, examples=examples)


def test_exercise_5_engine_with_overlap_matches_the_reference(model):
    check_against_reference(model, ex5.Engine, examples=40, seed=1)


def test_exercise_11_engine_with_overlap_matches_the_reference(model):
    """Its decode steps replay graphs captured with the placeholder swap inside (workshop.graphs' CPU stand-in)."""
    check_against_reference(model, ex11.Engine, examples=6, seed=2, block_sizes=(16,), cuda_graphs=True)


def test_overlap_runs_over_another_design_of_the_exercises(model):
    """The mixin uses the engines' public methods and fields only: tests/alternatives' exercise 5 (another pool layout
    and allocator, SHA-256 block hashes) and exercise 11 (one buffer, its own softmax) run under it unchanged."""
    from tests.alternatives import ex5_other_design, ex11_one_buffer_and_explicit_softmax
    check_against_reference(model, ex5_other_design.Engine, examples=8, seed=3)
    check_against_reference(model, ex11_one_buffer_and_explicit_softmax.Engine, examples=2, seed=4, block_sizes=(16,), cuda_graphs=True)


def test_a_late_end_of_text_is_dropped_and_preempted_sequences_wait_for_their_token(model):
    """Hand-made: sequences end on the end-of-text token (found a step late, the extra token dropped), in a pool so
    small that sequences are preempted with a token in flight, with prefix caching and n > 1."""
    prompts = [[464, 3290, 318, 257, 1263, 11, 13, 198] * 2, [464, 3290, 318] * 3, [40, 1101, 257], [262, 11, 318, 257, 13]]
    samplings = (GREEDY, SamplingParams(seed=3), GREEDY, SamplingParams(seed=4))
    for eos, num_blocks, max_new_tokens in ((198, 14, 12), (13, 24, 24)):
        requests = [ex5.Request(p, max_new_tokens, n=1 + (i == 1), sampling=s) for i, (p, s) in enumerate(zip(prompts, samplings))]
        options = {"block_size": 2, "num_blocks": num_blocks, "eos_token_id": eos, "enable_prefix_caching": True}
        expected = ex5.Engine(model, 4, **options).run(fresh(requests))
        engine, preempted_in_flight = overlapped(ex5.Engine)(model, 4, overlap=True, **options), []
        preempt = engine.preempt
        engine.preempt = lambda seq: (preempted_in_flight.append(seq.output_ids[-1:] < [0]), preempt(seq))[1]
        got = engine.run(fresh(requests))
        assert got.outputs == expected.outputs
        assert any(out[-1] == eos for out in got.outputs) and any(preempted_in_flight), "the scenario no longer tests what it says"


def test_one_host_read_a_step_made_after_the_next_launch(model):
    """Each step reads the host once (its tokens), and step n's read comes after step n+1 is launched: between two
    launches there is exactly one read, the one of the step before."""
    requests = [ex5.Request(list(range(100 + i, 110 + 2 * i)), 6 + i, sampling=SamplingParams(seed=i) if i % 2 else GREEDY)
                for i in range(5)]
    engine = overlapped(ex5.Engine)(model, 3, overlap=True, eos_token_id=NO_EOS, max_num_batched_tokens=16)
    events, run_model = [], engine.run_model
    engine.run_model = lambda scheduled: (events.append(("launch", len(reads.reads))), run_model(scheduled))[1]
    with HostReads() as reads:
        result = engine.run(requests)
    launches = [count for what, count in events]
    assert reads.reads == ["tolist"] * result.stats.steps, reads.reads
    assert launches[:2] == [0, 0] and launches[1:] == list(range(len(launches) - 1)), (
        f"host reads done before each launch: {launches}; step n's read belongs after step n+1's launch")


def test_off_by_default_on_a_cpu(model):
    """On a CPU the host is the device: nothing would run while it schedules, so overlap is off unless asked for."""
    for engine in (overlapped(ex5.Engine)(model, 2), overlapped(ex11.Engine)(model, 2), ServingEngine(model, 2)):
        assert engine.overlap is False
    engine, in_flight = overlapped(ex5.Engine)(model, 2, eos_token_id=NO_EOS), []
    run_model = engine.run_model
    engine.run_model = lambda scheduled: (in_flight.append(engine.in_flight), run_model(scheduled))[1]
    requests = [ex5.Request([1, 2, 3], 5), ex5.Request([4, 5], 3)]
    assert engine.run(requests).outputs == ex5.Engine(model, 2, eos_token_id=NO_EOS).run(fresh(requests)).outputs
    assert in_flight and not any(in_flight)


def serve(engine, requests, abort_at=None):
    """Drive a ServingEngine as EngineCore does: step while busy, abort sequence `abort_at[1]` after step abort_at[0].
    Returns each sequence's tokens as the core would have sent them (read after each step)."""
    engine.start = time.perf_counter()
    seqs = [seq for request in requests for seq in engine.add_request(request)]
    sent = [[] for _ in seqs]
    steps = 0
    while engine.busy:
        engine.step()
        engine.step_index += 1
        steps += 1
        for got, seq in zip(sent, seqs):
            got.extend(seq.output_ids[len(got):])
            assert all(token >= 0 for token in got), "a placeholder was reported"
        if abort_at and steps == abort_at[0] and seqs[abort_at[1]].finished_step < 0:
            engine.abort(seqs[abort_at[1]])
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    return sent


def test_the_server_engine_with_overlap(model):
    """ignore_eos and min_tokens as without overlap; an aborted sequence reports no token after its abort (the one in
    flight is dropped) and what it reported is what it would have made; the others are unchanged."""
    def requests():
        made = [ex5.Request([464, 3290, 318, 257] * 3, 12, sampling=SamplingParams(seed=1)), ex5.Request([40, 1101], 10),
                ex5.Request([13, 198, 464], 9, n=2, sampling=SamplingParams(temperature=0.8, seed=5))]
        made[1].ignore_eos, made[2].min_tokens = True, 4
        return made

    for eos in FREQUENT:
        alone = serve(ServingEngine(model, 4, eos_token_id=eos, overlap=False), requests())
        assert serve(ServingEngine(model, 4, eos_token_id=eos, overlap=True), requests()) == alone
        for abort_at in ((1, 0), (3, 1), (4, 3)):
            engine = ServingEngine(model, 4, eos_token_id=eos, overlap=True)
            sent = serve(engine, requests(), abort_at)
            aborted = abort_at[1]
            assert sent[aborted] == alone[aborted][:len(sent[aborted])] and engine.num_aborted <= 1
            assert [s for i, s in enumerate(sent) if i != aborted] == [s for i, s in enumerate(alone) if i != aborted]


def test_step_split_watches_the_overlap_engine(model):
    requests = [ex5.Request(list(range(50, 60 + i)), 5 + i, sampling=SamplingParams(seed=i)) for i in range(4)]
    plain = ex5.Engine(model, 2, eos_token_id=NO_EOS).run(fresh(requests))
    for counting in (False, True):
        engine = overlapped(ex5.Engine)(model, 2, overlap=True, eos_token_id=NO_EOS)
        with StepSplit(engine, ex5, reads=counting) as split:
            assert engine.run(fresh(requests)).outputs == plain.outputs
        record = split.record()
        assert record["steps"] == engine.stats.steps
        if counting:
            assert record["host_reads_per_step"]["total"] == 1
        else:
            assert record["ms_per_step"]["sampling"] > 0 and record["ms_per_step"]["forward"] > 0


def test_the_benchmark_part_and_its_report(model):
    """bench/serving.py's part (workshop.serving.bench.overlap_on_vs_off) on a tiny workload, and its section of the page."""
    from workshop.serving import bench, report
    from workshop.serving.workloads import mixed_workload

    workload = mixed_workload(model, 4, prompt_len=(4, 12), output_len=(2, 8), seed=0)
    record = bench.overlap_on_vs_off(model, ex5, workload, 2, repeats=2, progress=False)
    assert record["engine"] == "paged" and record["outputs_identical"] and len(record["ratio_per_round"]) == 2
    assert record["on_over_off"] > 0 and record["on_tokens_per_s"] > 0 and record["off_tokens_per_s"] > 0
    section = "\n".join(report._overlap({"overlap": record}))
    assert "### Overlap scheduling" in section and f"{record['on_over_off']:.2f}" in section
