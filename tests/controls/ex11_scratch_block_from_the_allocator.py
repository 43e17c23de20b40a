"""The scratch block is allocated from the engine's own pool: right tokens, but the engine has a block less than
exercise 5's and preempts where it would not."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11d_preemption_parallel_sampling_and_prefix_caching_on_graphs"

base = reference_with(EXERCISE)


class Engine(base.Engine):
    def __init__(self, model, max_batch_size, cuda_graphs=None, **options):
        base.paged.Engine.__init__(self, model, max_batch_size, **options)  # exercise 5's alone: the graphs come below
        self.graphs = None
        if cuda_graphs if cuda_graphs is not None else model.device.type == "cuda":
            scratch = self.allocator.allocate()  # the bug: a block out of the pool the scheduler shares
            max_blocks = -(-model.config.n_positions // self.block_size)
            self.graphs = base.DecodeGraphs(model, self.cache, max_batch_size, max_blocks, scratch, use_graphs=True)


base.Engine = Engine
globals().update(public_names(base))
