"""Grading: what the checkers in exercises/ share.

    harness          which implementation is graded (--impl, --replace), cost counters, paired timings,
                     teaching failure messages
    batch_checks     "as if run alone": the comparison behind the batching checkers (exercises 3-5)
    parallel_checks  running and checking several torch.distributed processes (exercise 9)
    differential     the reference as the oracle: the same generated calls on both sides (Twins), compared after every
                     call through an observer, with the generic properties (errors, inputs, storage, types, repeats)
    scenarios        hypothesis strategies biased to a contract's edges (lengths, token ids, model sizes, ties)
    hints            the hints files one hint at a time (scripts/hint.py)
    wording          the small words of failure messages: "1 token", "2 tokens", "the 5th"
    device_audit     device bugs caught on a CPU: a tensor made on the default device meeting the model's
                     (`pytest exercises/ --device-audit`)
    mutation         small bugs planted in the references (cosmic-ray's mutants), graded by their checker
                     (scripts/mutation_score.py)
"""
