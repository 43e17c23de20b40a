"""bench/serving.py --only-online: serve.py against the same engine offline, alone, and with --save only
that part of results/serving.json replaced (the other models' records, and every other part, kept), its
targets, rows and docs redrawn, its own command and load average beside it.

    pytest tests/test_serving_online.py
"""

import json
import shutil

from tests.test_scripts import ROOT, run


def test_only_online_replaces_that_part_of_the_record(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(ROOT / "results" / "serving.json", results / "serving.json")
    before = json.loads((results / "serving.json").read_text())
    out = run("bench/serving.py", "--only-online", "--online-requests", "2", "--online-output-len", "2", "4",
              "--prompt-len", "4", "8", "--batch-size", "2", "--repeats", "1", "--no-progress", "--save",
              "--docs", str(tmp_path / "docs"), results_dir=results)
    assert "online / offline output throughput" in out.stdout, out.stdout
    after = json.loads((results / "serving.json").read_text())
    online = {o["model"]: o for o in after["data"]["online"]}
    assert online["tiny"]["requests"] == 2 and online["tiny"]["failed"] == 0
    assert "--only-online" in online["tiny"]["measured"]["command"] and len(online["tiny"]["measured"]["load_average"]) == 2
    kept = [o for o in before["data"].get("online", []) if o["model"] != "tiny"]
    assert [online[o["model"]] for o in kept] == kept, "the other models' records must be kept as they were"
    assert {k: v for k, v in after["data"].items() if k not in ("online", "targets")} == \
           {k: v for k, v in before["data"].items() if k not in ("online", "targets")}
    tiny = next(t for t in after["data"]["targets"]["server_overhead"] if t["model"] == "tiny")
    assert tiny["online_over_offline"] == online["tiny"]["online_over_offline"]
    assert "--only-online" in (tmp_path / "docs" / "benchmarks.md").read_text()
