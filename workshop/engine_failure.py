"""An engine whose step raised is dead, as vLLM's engine core dies rather than going on (its EngineDeadError).

A step changes a lot of state (queues, computed counts, block tables, the KV pool, statistics) before it samples. An
error halfway (a bug in the sampler, say) leaves some of it updated and the rest not: the next step would compute on
tokens and counts that disagree, and fail obscurely (on a GPU, a device-side assert that kills the process) or, worse,
return wrong tokens. So the engines of exercises 4, 5 and 11 (and the server's) mark themselves failed instead, and
refuse every later call with one sentence that names the step and the error:

    @dies_on_error       on step(): an error inside marks the engine failed, then goes on up unchanged
    @refused_when_dead   on the other public calls (add_request, run): a failed engine raises EngineFailed

A clean rejection (add_request's ValueError for a request that can never run) happens before anything changes: it is
not a failure. A NotImplementedError (a TODO not written yet) is not one either: it is reported as the TODO it is.
"""

import functools


class EngineFailed(RuntimeError):
    """The engine's step raised earlier, leaving its state half-updated: make a new engine."""


def check_alive(engine):
    """Raise EngineFailed if a step of `engine` raised before."""
    failure = getattr(engine, "failure", None)  # set by dies_on_error; an engine that never failed has none
    if failure is not None:
        raise EngineFailed(failure)


def dies_on_error(step):
    """Decorate an engine's step(): an error inside it marks the engine failed (engine.failure, the sentence every later
    call raises) and propagates unchanged. Nested steps (a subclass's step calling super().step()) keep the first."""
    @functools.wraps(step)
    def guarded(engine, *args, **kwargs):
        check_alive(engine)
        try:
            return step(engine, *args, **kwargs)
        except NotImplementedError:
            raise  # a TODO not written yet: nothing the engine did, reported as a TODO every time
        except BaseException as error:  # Ctrl-C halfway leaves the state as half-updated as a bug does
            if getattr(engine, "failure", None) is None:
                # the message only, not the error: its traceback would keep the step's tensors alive
                text = " ".join(str(error).split()).rstrip(".")
                what = f"{type(error).__name__}: {text}" if text else type(error).__name__
                engine.failure = f"the engine failed at step {engine.step_index}: {what}; make a new one."
            raise
    return guarded


def refused_when_dead(call):
    """Decorate an engine's other public calls (add_request, run): a failed engine raises EngineFailed before any work."""
    @functools.wraps(call)
    def guarded(engine, *args, **kwargs):
        check_alive(engine)
        return call(engine, *args, **kwargs)
    return guarded
