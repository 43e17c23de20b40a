"""scripts/mutation_score.py's parts: the mutants are cosmic-ray's, made only in the code a student writes
(the TODO functions), and a mutant graded in the sandbox never touches the working tree."""

from pathlib import Path

from workshop.grading import mutation

ROOT = Path(__file__).resolve().parents[1]


def test_mutants_are_made_only_in_the_todo_functions():
    functions = mutation.todo_functions("ex3_static_batching")
    assert set(functions) == {"left_pad", "generate_batch"}
    found = mutation.mutants("ex3_static_batching")
    assert found and {m.function for m in found} == set(functions)
    for m in found[::25]:
        source = mutation.mutated_source(m)
        assert source != (ROOT / "solutions" / "ex3_static_batching.py").read_text()
        assert m.before != m.after


def test_methods_of_a_class_count_as_todo_functions():
    assert "RunningBatch.remove" in mutation.todo_functions("ex4_continuous_batching")


def test_a_seeded_sample_is_repeatable_and_its_interval_shrinks_with_its_size():
    found = mutation.mutants("ex1_generate")
    assert mutation.sample(found, 5, seed=0) == mutation.sample(found, 5, seed=0)
    assert len(mutation.sample(found, 0, seed=0)) == len(found)
    low30, high30 = mutation.wilson_interval(27, 30)
    low300, high300 = mutation.wilson_interval(270, 300)
    assert low30 < low300 < 0.9 < high300 < high30


def test_the_sandbox_is_a_copy():
    box = mutation.Sandbox()
    try:
        assert (box.dir / "solutions" / "ex1_generate.py").read_text() == (ROOT / "solutions" / "ex1_generate.py").read_text()
        assert not (box.dir / ".git").exists()
    finally:
        box.close()
    assert not box.dir.exists()
