"""The engine keeps module 11's rule: decode-only steps on the full graph, every other step eager (exercise 5's
forward) and recorded as "eager": right tokens, but the steps with a prompt chunk never use the piecewise graphs."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex12_piecewise_graphs"
PART = "12b"

base = reference_with(EXERCISE)


class Engine(base.Engine):
    def run_model(self, scheduled):
        if self.graphs is not None and all(n == 1 for _, n in scheduled):
            self.modes.append("full")
            return base.ex11.Engine.run_model(self, scheduled)
        self.modes.append("eager")
        return base.paged.Engine.run_model(self, scheduled)


base.Engine = Engine
globals().update(public_names(base))
