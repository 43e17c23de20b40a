"""Inputs are checked where they enter, not in a kernel (issue 40): every public entry point that takes token ids,
positions, block ids or lengths refuses one out of range on the host, with one sentence naming the value and the
limit, before any kernel indexes with it. On a GPU an index out of bounds is a device-side assert that kills the
whole process (IndexKernel.cu: index out of bounds); the error here is gpt.InvalidIndex, both a ValueError (as vLLM
refuses a token id outside the vocabulary) and an IndexError (as nn.Embedding refuses one on a CPU).

Each case runs on the reference and, where the check is given code in the stub, on the stub too (it must raise the
same error, not its NotImplementedError), under a dispatch mode that records every index kernel: none may run.

    pytest tests/test_range_checks.py
"""

import functools
import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpt
from workshop.serving.sampling import GREEDY

VOCAB = gpt.GPTConfig.vocab_size
GOOD = [464, 3290, 13]
INDEX_KERNELS = ("embedding", "index_select", "gather", "index.", "index_put", "index_copy", "scatter", "take")


class IndexKernels(TorchDispatchMode):
    """Records every ATen index kernel that runs (embedding, index_select, gather, indexing, index_put, ...)."""

    def __init__(self):
        super().__init__()
        self.ran = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__) + "." + func._overloadname
        if name.startswith(INDEX_KERNELS):
            self.ran.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def model():
    return gpt.load_model("tiny", device="cpu")


def module(package, name):
    return importlib.import_module(f"{package}.{name}")


def ex2_forward(m, model, ids, positions):
    return m.forward(model, torch.tensor(ids), torch.tensor(positions), m.KVCache(model.config.n_layer))


def engine_request(m, model, prompt):
    return m.generate(model, [m.Request(GOOD, 2), m.Request(prompt, 2)], 2)


def paged_cache(m, model, num_blocks=4):
    return m.PagedKVCache(model.config, num_blocks, 4, "cpu")


def head_dim(model):
    return model.config.n_embd // model.config.n_head


@functools.cache
def built(what, model):
    """Objects a case calls into, built from the references once, before recording (building them indexes weights)."""
    if what == "int8 wte":
        return module("solutions", "ex8_quantization").quantize_model(model, include_embedding=True).lm_head
    return module("solutions", "ex9_tensor_parallel").ParallelGPT(model, 0, 1)


def int8_embedding(m, model, ids):
    return m.Int8Embedding(built("int8 wte", model))(torch.tensor(ids))  # the stub's given __init__ keeps the linear


def parallel_forward(m, model, ids, positions):
    return m.ParallelGPT.forward(built("tp model", model), torch.tensor([ids]), torch.tensor([positions]))


def paged_flash(m, model, table, length):
    pool = torch.zeros(4, 4, model.config.n_head, head_dim(model))
    return m.paged_flash_decoding(torch.zeros(model.config.n_head, head_dim(model)), pool, pool, table, length, 1)


def graphs_run(m, model, tokens, positions, tables):
    cache = paged_cache(module("solutions", "ex5_paged_kv_cache"), model, num_blocks=5)
    return m.DecodeGraphs(model, cache, 2, 4, 4, use_graphs=False).run(tokens, positions, tables)


def static_inputs_fill(m, model, position, table):
    m.StaticInputs(2, 4, 4, 4, "cpu").fill([GOOD[0]], [position], [table], 1)


# (exercise module, entry point, the call (module, model), words the message must hold, whether the stub gives the check)
N = VOCAB
CASES = [
    ("ex1_generate", "generate: a token past the vocabulary", lambda m, model: m.generate(model, GOOD + [N], 3), ("prompt token 3", f"{N}", f"{N - 1}"), True),
    ("ex1_generate", "generate: a negative token", lambda m, model: m.generate(model, [-1] + GOOD, 3), ("prompt token 0", "-1"), True),
    ("ex1_generate", "generate: a float token", lambda m, model: m.generate(model, [464.0], 3), ("464.0", "not an integer"), True),
    ("ex1_generate", "generate: a bool token", lambda m, model: m.generate(model, [True], 3), ("True", "not an integer"), True),
    ("ex2_kv_cache", "generate: a token past the vocabulary", lambda m, model: m.generate(model, GOOD + [N + 5], 3), ("prompt token", f"{N + 5}", f"{N - 1}"), True),
    ("ex2_kv_cache", "forward: input_ids past the vocabulary", lambda m, model: ex2_forward(m, model, [[1, N]], [[0, 1]]), ("input_ids", f"{N}"), True),
    ("ex2_kv_cache", "forward: a position past the context", lambda m, model: ex2_forward(m, model, [[1]], [[model.config.n_positions]]), ("position_ids", "positions"), True),
    ("ex2_kv_cache", "forward: float input_ids", lambda m, model: m.forward(model, torch.tensor([[1.0]]), torch.tensor([[0]]), m.KVCache(model.config.n_layer)), ("input_ids", "float"), True),
    ("ex3_static_batching", "generate: a token past the vocabulary", lambda m, model: m.generate(model, [GOOD, GOOD + [N]], 3, batch_size=1), ("Request 1", "prompt token", f"{N}"), True),
    ("ex4_continuous_batching", "add_request: a token past the vocabulary", lambda m, model: engine_request(m, model, GOOD + [N]), ("Request 1", "prompt token", f"{N}"), True),
    ("ex4_continuous_batching", "add_request: a negative token", lambda m, model: engine_request(m, model, [-3]), ("Request 1", "prompt token 0 is -3"), True),
    ("ex5_paged_kv_cache", "add_request: a token past the vocabulary", lambda m, model: engine_request(m, model, GOOD + [N]), ("Request 1", "prompt token", f"{N}"), True),
    ("ex5_paged_kv_cache", "BlockAllocator.free: a block past the pool", lambda m, model: m.BlockAllocator(4, 4).free(4), ("block is 4", "4 blocks"), True),
    ("ex5_paged_kv_cache", "BlockAllocator.free: a negative block", lambda m, model: m.BlockAllocator(4, 4).free(-1), ("block is -1",), True),
    ("ex5_paged_kv_cache", "BlockAllocator.share: a block past the pool", lambda m, model: m.BlockAllocator(4, 4).share(7), ("block is 7",), True),
    ("ex5_paged_kv_cache", "PagedKVCache.copy_block: a block past the pool", lambda m, model: paged_cache(m, model).copy_block(0, 4), ("dst", "4 blocks"), True),
    ("ex5_paged_kv_cache", "forward: a token past the vocabulary", lambda m, model: m.forward(model, paged_cache(m, model), [[1, N]], [0], [[0]]), ("new token 1", f"{N}"), True),
    ("ex5_paged_kv_cache", "forward: a position past the context", lambda m, model: m.forward(model, paged_cache(m, model), [[1]], [model.config.n_positions], [[0]]), ("position", "positions"), True),
    ("ex5_paged_kv_cache", "forward: a block past the pool", lambda m, model: m.forward(model, paged_cache(m, model), [[1]], [0], [[9]]), ("block 0 is 9", "4 blocks"), True),
    ("ex6_decoding", "generate: a token past the vocabulary", lambda m, model: m.generate(model, gpt.load_tokenizer(), GOOD + [N], 3), ("prompt token", f"{N}",), True),
    ("ex6_decoding", "beam_search: a token past the vocabulary", lambda m, model: m.beam_search(model, GOOD + [N], 2, 3), ("prompt token", f"{N}"), False),
    ("ex6_constrained", "generate: a token past the vocabulary", lambda m, model: m.generate(model, GOOD + [N], None, 3), ("prompt token", f"{N}",), True),
    ("ex7_speculative", "speculative_generate: a token past the vocabulary", lambda m, model: m.speculative_generate(model, model, GOOD + [N], 3), ("prompt token", f"{N}",), True),
    ("ex7_speculative", "jacobi_generate: a token past the vocabulary", lambda m, model: m.jacobi_generate(model, GOOD + [N], 3), ("prompt token", f"{N}",), True),
    ("ex7_speculative", "SpeculativeDecoder: a draft of another vocabulary", lambda m, model: m.SpeculativeDecoder(model, gpt.new_model(gpt.GPTConfig(vocab_size=100, n_positions=16, n_embd=8, n_layer=1, n_head=2)), GOOD), ("100", f"{N}", "vocabulary"), True),
    ("ex7_speculative", "DraftModel.propose: a token past the vocabulary", lambda m, model: m.DraftModel(model).propose(GOOD + [N], 2), ("context token 3", f"{N}"), True),
    ("ex7_speculative", "verify: a draft token past the vocabulary", lambda m, model: m.verify(model, m.KVCache(model.config.n_layer), GOOD, [N]), ("draft token 3", f"{N}"), True),
    ("ex8_quantization", "Int8Embedding: an id past the vocabulary", lambda m, model: int8_embedding(m, model, [1, N]), ("input_ids", f"{N}"), True),
    ("ex8_quantization", "Int8Embedding: a negative id", lambda m, model: int8_embedding(m, model, [-1]), ("input_ids", "-1"), True),
    ("ex9_tensor_parallel", "ParallelGPT.forward: a token past the vocabulary", lambda m, model: parallel_forward(m, model, [1, N], [0, 1]), ("input_ids", f"{N}"), True),
    ("ex9_tensor_parallel", "ParallelGPT.forward: a position past the context", lambda m, model: parallel_forward(m, model, [1], [model.config.n_positions]), ("position_ids",), True),
    ("ex9_tensor_parallel", "generate: a token past the vocabulary", lambda m, model: m.generate(built("tp model", model), GOOD + [N], 3), ("prompt token", f"{N}",), False),
    ("ex10_attention", "paged_flash_decoding: a block past the pool", lambda m, model: paged_flash(m, model, [0, 9], 6), ("block_table entry 1 is 9", "4 blocks"), True),
    ("ex10_attention", "paged_flash_decoding: a length past the table", lambda m, model: paged_flash(m, model, [0, 1], 9), ("length=9",), True),
    ("ex11_cuda_graphs", "StaticInputs.fill: a negative position", lambda m, model: static_inputs_fill(m, model, -1, [0]), ("position is -1",), False),
    ("ex11_cuda_graphs", "DecodeGraphs.run: a token past the vocabulary", lambda m, model: graphs_run(m, model, [N], [0], [[0]]), (f"{N}",), False),
    ("ex11_cuda_graphs", "DecodeGraphs.run: a block past the pool", lambda m, model: graphs_run(m, model, [1], [0], [[5]]), ("block 0 is 5", "5 blocks"), False),
]


# not an index but a length, or a pairing: a plain ValueError
PLAIN_VALUE_ERRORS = {"paged_flash_decoding: a length past the table", "SpeculativeDecoder: a draft of another vocabulary"}


def assert_refused_before_any_kernel(call, words, what, model):
    built("int8 wte", model), built("tp model", model)
    with IndexKernels() as kernels, pytest.raises(ValueError if what in PLAIN_VALUE_ERRORS else gpt.InvalidIndex) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), f"not one sentence: {message!r}"
    for word in words:
        assert word in message, f"the message should name {word!r}: {message!r}"
    assert not kernels.ran, f"index kernels ran before the error: {kernels.ran}"
    return error.value


@pytest.mark.parametrize("exercise, what, call, words, given", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_reference_refuses_out_of_range_on_the_host(model, exercise, what, call, words, given):
    error = assert_refused_before_any_kernel(lambda: call(module("solutions", exercise), model), words, what, model)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize("exercise, what, call, words, given", [c for c in CASES if c[4]], ids=[f"{c[0]}: {c[1]}" for c in CASES if c[4]])
def test_stub_gives_the_same_check(model, exercise, what, call, words, given):
    """Where the check is given code, the untouched stub raises it too, before its TODO's NotImplementedError."""
    assert_refused_before_any_kernel(lambda: call(module("exercises", exercise), model), words, what, model)


def test_invalid_index_is_a_value_error_and_an_index_error(model):
    """`except IndexError` (as with nn.Embedding) and `except ValueError` both catch it."""
    for caught in (IndexError, ValueError):
        with pytest.raises(caught):
            gpt.check_token_ids([VOCAB], VOCAB)
    with pytest.raises(IndexError):
        model.transformer.wte(torch.tensor([-1]))  # what nn.Embedding does: the Int8Embedding agrees (above)


def test_model_forward_checks_cpu_inputs(model):
    with IndexKernels() as kernels, pytest.raises(gpt.InvalidIndex, match=f"input_ids holds {VOCAB}"):
        model(torch.tensor([[1, VOCAB]]), torch.tensor([[0, 1]]))
    assert not kernels.ran


def test_good_ids_of_other_integer_types_pass():
    """numpy and 0-d torch integers are integers too; a tuple or an empty list is fine."""
    import numpy as np

    gpt.check_token_ids([1, np.int64(2), torch.tensor(3)], VOCAB)
    gpt.check_token_ids((0, VOCAB - 1), VOCAB)
    gpt.check_token_ids([], VOCAB)


def test_dequantize_gives_float32_whatever_the_scale(model):
    """The contract says float32 [out, in]: a float64 (or float16) scale must not change the result's dtype."""
    ex8 = module("solutions", "ex8_quantization")
    q, scale = ex8.quantize(model.transformer.h[0].mlp.c_fc.weight, "channel")
    for dtype in (torch.float64, torch.float16, torch.float32):
        assert ex8.dequantize(q, scale.to(dtype)).dtype == torch.float32, dtype


def test_placeholder_ids_pass_only_while_an_engine_swaps_them():
    """Overlap scheduling feeds a token not read yet as a placeholder -1 - i (workshop/serving/overlap.py); the token
    checks let -n .. -1 through inside gpt.placeholder_ids(n) only, and still refuse what lies past either end."""
    import torch

    from gpt import InvalidIndex, check_token_ids, placeholder_ids

    for ids in ([5, -1], torch.tensor([5, -1])):
        with pytest.raises(InvalidIndex, match="-1"):
            check_token_ids(ids, 10)
        with placeholder_ids(2):
            check_token_ids(ids, 10)
    with placeholder_ids(2):
        for bad in ([-3], torch.tensor([-3]), [10], torch.tensor([10])):
            with pytest.raises(InvalidIndex):
                check_token_ids(bad, 10)
