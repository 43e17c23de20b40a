"""cuda_graphs=None captures graphs on a CPU too, where there are no launches to save and the stand-in is slower."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11d_graphs_only_on_cuda_by_default"

base = reference_with(EXERCISE)


class Engine(base.Engine):
    def __init__(self, model, max_batch_size, cuda_graphs=None, **options):
        super().__init__(model, max_batch_size, cuda_graphs=True if cuda_graphs is None else cuda_graphs, **options)


base.Engine = Engine
globals().update(public_names(base))
