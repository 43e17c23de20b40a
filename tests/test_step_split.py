"""Where an engine's step goes (workshop/serving/step_split.py), the host reads it makes (workshop/host_reads.py),
and exercise 5's persistent decode batch: the same sequences step after step cost the same few operations
whatever the batch, and one host read per step, the new token ids.

    pytest tests/test_step_split.py
"""

import pytest
import torch

import gpt
import solutions.ex4_continuous_batching as ex4
import solutions.ex5_paged_kv_cache as ex5
import solutions.ex11_cuda_graphs as ex11
from workshop.host_reads import HostReads
from workshop.replay import aten_ops
from workshop.serving.runs import NO_EOS
from workshop.serving.sampling import SamplingParams
from workshop.serving.step_split import PARTS, StepSplit
from workshop.serving.workloads import mixed_workload


@pytest.fixture(scope="module")
def model():
    return gpt.load_model("tiny", device="cpu")


def requests(module, workload, sampling=None):
    request = getattr(module, "Request", None) or module.paged.Request
    if sampling is None:
        return [request(p, n) for p, n in zip(workload.prompts, workload.max_new_tokens)]
    return [request(p, n, sampling=sampling(i)) for i, (p, n) in enumerate(zip(workload.prompts, workload.max_new_tokens))]


def test_host_reads_are_counted():
    x = torch.arange(6.0)
    with HostReads() as reads:
        x.tolist(), int(x[0]), bool(x.any()), x[x > 2], x.nonzero(), float(x.sum())
        torch.tensor([1, 2]), x.view(2, 3) * 2, x.clone()  # no read: new tensors, views, arithmetic
    assert reads.count == 6, reads.reads
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # .tolist is itself again afterwards


@pytest.mark.parametrize("module, options", [(ex4, {}), (ex5, {}), (ex11, {"cuda_graphs": True})], ids=["ex4", "ex5", "ex11"])
def test_the_split_adds_up_and_changes_nothing(model, module, options):
    workload = mixed_workload(model, 6, prompt_len=(4, 20), output_len=(2, 12), seed=3)
    plain = module.Engine(model, 3, eos_token_id=NO_EOS, **options).run(requests(module, workload))
    for counting in (False, True):
        engine = module.Engine(model, 3, eos_token_id=NO_EOS, **options)
        with StepSplit(engine, module, reads=counting) as split:
            watched = engine.run(requests(module, workload))
        assert watched.outputs == plain.outputs, "watching an engine changed its outputs"
        record = split.record()
        assert record["steps"] == watched.stats.steps > 0
        if counting:
            assert set(record["host_reads_per_step"]) == {*PARTS, "total"}
        else:
            parts = record["ms_per_step"]
            assert all(parts[p] >= 0 for p in PARTS) and abs(sum(parts.values()) - record["step_ms"]) < 1e-6
            assert parts["forward"] > 0 and parts["sampling"] > 0
        assert "step" not in vars(engine) and "schedule" not in vars(engine), "the engine was not given back as it was"


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "temperature 1"])
def test_the_paged_engine_reads_the_host_once_a_step(model, sampled):
    """Every step of exercise 5's reference reads one thing on the host: the new token ids (prefill, mixed and
    decode steps alike; greedy and sampled)."""
    workload = mixed_workload(model, 8, prompt_len=(4, 40), output_len=(2, 30), seed=4)
    sampling = (lambda i: SamplingParams(temperature=1.0, seed=i)) if sampled else None
    engine = ex5.Engine(model, 4, eos_token_id=NO_EOS, max_num_batched_tokens=32)  # chunked prompts: mixed steps too
    with StepSplit(engine, ex5, reads=True) as split:
        engine.run(requests(ex5, workload, sampling))
    reads = split.record()["host_reads_per_step"]
    assert reads["total"] == 1 and reads["sampling"] == 1, reads


def test_a_steady_decode_step_writes_what_changed_only(model):
    """DecodeBatch.update for the same rows one token further costs the same operations at batch 2 and 12 (nothing
    laid out row by row), and a row whose sequence changed gets that row's values, as pack() would lay them out."""
    def steady_ops(batch):
        decode, tables = ex5.DecodeBatch(4, "cpu"), [[3 * i, 3 * i + 1] for i in range(batch)]
        decode.update([1] * batch, [5] * batch, tables)  # the first step lays out every row
        _, ops = aten_ops(decode.update, [2] * batch, [6] * batch, tables)
        return len(ops)
    assert steady_ops(2) == steady_ops(12), f"a steady step costs {steady_ops(2)} operations at batch 2, {steady_ops(12)} at batch 12"
    decode, tables, positions = ex5.DecodeBatch(4, "cpu"), [[0, 1], [2, 3], [4, 5]], [5, 6, 7]
    decode.update([1, 2, 3], positions, tables)
    tables, positions = [[0, 1], [9, 10], [4, 5]], [6, 3, 7]  # row 1: another sequence; row 2: the same, stalled
    ids, position_ids, batch = decode.update([4, 5, 6], positions, tables)
    want_ids, want_positions, want = ex5.pack([[4], [5], [6]], positions, tables, 4, "cpu")
    assert torch.equal(ids, want_ids) and torch.equal(position_ids, want_positions) and torch.equal(batch.slots, want.slots)
    assert torch.equal(batch.block_tables, want.block_tables) and torch.equal(batch.mask, want.mask)
    assert torch.equal(batch.last, want.last) and torch.equal(batch.query_index, want.query_index)
