"""The device audit (workshop/grading/device_audit.py) finds on a CPU the bugs a GPU would raise on, and
accepts what CUDA accepts; the grading conftest calls "Not implemented yet" only a TODO left undone.

The references pass every checker under the audit: tests/test_checkers.py grades them with --device-audit.
"""

import pytest
import torch

import gpt
import solutions.ex2_kv_cache as kv
from exercises.conftest import _raised_by_a_todo
from workshop.grading.device_audit import DeviceAudit, DeviceMismatch, DeviceSideAssert, on_device


@pytest.fixture(scope="module")
def model():
    return gpt.load_model("tiny", device="cpu")


def test_catches_the_first_gpu_run_bug(model):
    """The lines of exercise 7's checker that failed on the H200: a prefill of tensors made on the default
    device, beside a model on another. The audit raises on a CPU; made where the model lives, they pass."""
    tokens = [464, 3290, 318, 257]
    with DeviceAudit(), torch.no_grad():
        on_device(model)
        with pytest.raises(DeviceMismatch, match="device=model.device"):
            kv.forward(model, torch.tensor([tokens[:-1]]), torch.arange(len(tokens) - 1)[None], kv.KVCache(model.config.n_layer))
        logits = kv.forward(model, torch.tensor([tokens[:-1]], device=model.device),
                            torch.arange(len(tokens) - 1, device=model.device)[None], kv.KVCache(model.config.n_layer))
        assert logits.shape == (1, 3, model.config.vocab_size)


@pytest.mark.parametrize("bug", ["model input", "mask", "cat", "compare", "device index into host"])
def test_catches_host_tensors_meeting_the_model(model, bug):
    with DeviceAudit(), torch.no_grad():
        on_device(model)
        activations = model.transformer.wte(torch.tensor([[1, 2, 3]], device=model.device))
        host = torch.ones(1, 3, model.config.n_embd)
        step = {"model input": lambda: model(torch.tensor([[1, 2]]), torch.arange(2)[None]),
                "mask": lambda: activations.masked_fill(torch.zeros(1, 3, 1, dtype=torch.bool), 0.0),
                "cat": lambda: torch.cat([activations, host]),
                "compare": lambda: activations == host,
                "device index into host": lambda: host[:, activations[0, :, 0].argsort()]}[bug]
        with pytest.raises(DeviceMismatch):
            step()


def test_accepts_what_cuda_accepts(model):
    """0-dim host tensors (CPU scalars), host indices into device tensors, copies both ways, explicit
    devices and .to(device), and host-only work."""
    with DeviceAudit(), torch.no_grad():
        on_device(model)
        weight = model.transformer.wte.weight
        assert (weight[:2] * torch.tensor(2.0)).shape == (2, weight.shape[1])
        assert weight[torch.tensor([0, 5])].shape == (2, weight.shape[1])
        buffer = torch.zeros(3, device=model.device)
        buffer.copy_(torch.tensor([1.0, 2.0, 3.0]))
        buffer[:2] = torch.tensor([4.0, 5.0])
        assert (torch.tensor([1.0, 1.0, 1.0]).to(model.device) + model.transformer.wte.weight[0, :3]).shape == (3,)
        ids = torch.tensor([[1, 2]]).to(model.device)
        assert model(ids, torch.arange(2, device=model.device)[None]).shape == (1, 2, model.config.vocab_size)
        logits = model(ids, torch.arange(2, device=model.device)[None]).cpu()
        assert (logits[0, -1] - torch.zeros(model.config.vocab_size)).shape == (model.config.vocab_size,)
        assert torch.bincount(torch.tensor([0, 1, 1])).tolist() == [1, 2]


def test_pauses_inside_timed_regions(model):
    from workshop.grading.harness import paired_timing

    def stray():
        model(torch.tensor([[1, 2]]), torch.arange(2)[None])

    with DeviceAudit(), torch.no_grad():
        on_device(model)
        with pytest.raises(DeviceMismatch):  # the warm-up is audited
            paired_timing(stray, stray, repeats=1)
        paired_timing(stray, stray, repeats=1, warmup=0)  # the timed rounds are not


def test_only_a_stubs_own_todo_reads_as_not_implemented():
    """A NotImplementedError raised in a stub is a TODO; one raised elsewhere (torch has no kernel for an op
    on this device, as torch.ao's int8 Linear on CUDA) is an error the student must see as it is."""
    from exercises import ex2_kv_cache as stub

    with pytest.raises(NotImplementedError) as todo:
        stub.causal_mask(2, 3, "cpu")
    assert _raised_by_a_todo(todo)

    def no_kernel():
        raise NotImplementedError("Could not run 'quantized::linear_prepack' with arguments from the 'CUDA' backend.")

    with pytest.raises(NotImplementedError) as other:
        no_kernel()
    assert not _raised_by_a_todo(other)


def test_a_todo_in_a_ranks_process_reads_as_not_implemented():
    """Exercise 9 runs the student's code in other processes: a rank that stops at the stub's TODO is reported
    as that TODO (TodoInRank); a rank's NotImplementedError from anywhere else stays an error."""
    from exercises import ex2_kv_cache as stub
    from workshop.distributed import TodoInRank, _describe

    try:
        stub.causal_mask(2, 3, "cpu")
    except NotImplementedError as error:
        assert _describe(error)["todo"]
    try:
        raise NotImplementedError("Could not run 'quantized::linear_prepack' with arguments from the 'CUDA' backend.")
    except NotImplementedError as error:
        assert not _describe(error)["todo"]
    with pytest.raises(TodoInRank) as todo:
        raise TodoInRank("Exercise 9: (part 9a) implement ParallelAttention.__init__")
    assert _raised_by_a_todo(todo)


@pytest.mark.parametrize("op", ["embedding of id vocab", "embedding of id -1", "gather past a table", "index past a pool",
                                "scatter past a row"])
def test_an_index_out_of_range_inside_an_op_is_a_device_side_assert(model, op):
    """On a CPU torch raises IndexError or RuntimeError and the caller may go on; on CUDA the kernel asserts on the
    device and the process's CUDA context is gone (an H200 run lost every later check of its worker so). The audit
    raises DeviceSideAssert, which no check treats as an error a contract names."""
    vocab = model.config.vocab_size
    table, pool = torch.tensor([[0, 1, 2]]), torch.zeros(4, 8)
    step = {"embedding of id vocab": lambda: model.transformer.wte(torch.tensor([[1, vocab]])),
            "embedding of id -1": lambda: model.transformer.wte(torch.tensor([[-1]])),
            "gather past a table": lambda: table.gather(1, torch.tensor([[3]])),
            "index past a pool": lambda: pool[torch.tensor([4])],
            "scatter past a row": lambda: pool.scatter(1, torch.tensor([[8]]), 1.0)}[op]
    with DeviceAudit(), torch.no_grad():
        with pytest.raises(DeviceSideAssert, match="on the host before any kernel"):
            step()
        assert pool[torch.tensor([-1])].shape == (1, 8)  # a negative index wraps, on CUDA too: accepted
