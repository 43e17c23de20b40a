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


def test_a_sandbox_grades_one_mutant_at_a_time(monkeypatch, tmp_path):
    """Two workers, mutants of uneven cost: no sandbox ever holds two mutants at once (it once did, when mutant i
    went to sandbox i % jobs whether or not that sandbox was still busy), and every mutant is graded on its own source."""
    import importlib.util
    import random
    import threading
    import time

    spec = importlib.util.spec_from_file_location("mutation_score_script", ROOT / "scripts" / "mutation_score.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    class Mutant:
        def __init__(self, i):
            self.i, self.line, self.key, self.before, self.after = i, i, "op", "a", "b"

        def describe(self):
            return f"mutant {self.i}"

    lock, clashes, graded = threading.Lock(), [], []

    class Sandbox:
        def __init__(self):
            self.busy, self.dir = False, None

        def grade(self, exercise, source, timeout_s):
            with lock:
                clashes.append(self.busy)
                self.busy = True
            time.sleep(random.Random(source).uniform(0, 0.02))
            with lock:
                self.busy = False
                graded.append(source)
            return source != "reference", 0.01, ""

        def close(self):
            pass

    monkeypatch.setattr(script.mutation, "Sandbox", Sandbox)
    monkeypatch.setattr(script.mutation, "mutants", lambda exercise: [Mutant(i) for i in range(40)])
    monkeypatch.setattr(script.mutation, "mutated_source", lambda mutant: f"mutant {mutant.i}")
    monkeypatch.setattr(script.mutation, "equivalents", lambda: {})
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "ex1_generate.py").write_text("reference")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    entry = script.run_exercise("ex1_generate", 0, 0, jobs=2)
    assert not any(clashes) and sorted(graded[1:]) == sorted(f"mutant {i}" for i in range(40))
    assert entry["killed"] == entry["sampled"] == 40
