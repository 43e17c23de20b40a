"""The engine rebuilds its paged cache a block larger for the graphs' scratch block without the model's dtype
(PagedKVCache's default, float32): right for a float32 model, but a float16 or bfloat16 model's keys and values then
meet float32 pools (write's index_copy_ refuses the mix)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11d_differential"  # the check that catches it: the control runner runs only that

base = reference_with(EXERCISE)


class Engine(base.Engine):
    def __init__(self, model, max_batch_size, cuda_graphs=None, **options):
        base.paged.Engine.__init__(self, model, max_batch_size, **options)  # exercise 5's alone: the graphs come below
        self.graphs = None
        if cuda_graphs if cuda_graphs is not None else model.device.type == "cuda":
            scratch = self.allocator.num_blocks
            self.cache = None
            self.cache = base.paged.PagedKVCache(model.config, scratch + 1, self.block_size, model.device)  # the bug: no dtype
            max_blocks = -(-model.config.n_positions // self.block_size)
            self.graphs = base.DecodeGraphs(model, self.cache, max_batch_size, max_blocks, scratch, use_graphs=True)


base.Engine = Engine
globals().update(public_names(base))
