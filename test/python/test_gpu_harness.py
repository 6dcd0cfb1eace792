"""The GPU benchmark's harness, dry-run on CPU so that it never rots: every run of a tiny
model is measured, the loss of ours equals JAX's, a second run resumes (measures nothing
again), a time limit stops it cleanly, and the page section renders."""
from __future__ import annotations

import json

import pytest

from tools.benchmarks import gpu


def test_dry_run_measures_resumes_and_renders(tmp_path):
    out = tmp_path / "gpu.json"
    logs = []
    data = gpu.measure(only=["nothing"], steps=2, path=out, log=logs.append, dry_run=True)
    assert data["complete"]
    rows = data["rows"]
    kinds = {(r["policy"], r["who"], r["form"]) for r in rows}
    assert ("nothing_saveable", "ours", "joint") in kinds
    assert ("nothing_saveable", "ours", "split") in kinds
    assert ("nothing_saveable", "jax.checkpoint", "joint") in kinds
    assert ("auto at nothing_saveable", "ours", "split") in kinds
    for r in rows:
        assert len(r["times"]) == 2 and all(t > 0 for t in r["times"])
        assert len(r["memory"]) == (2 if r["who"] == "ours" and r["form"] == "split" else 1)
        assert all(m["temp"] >= 0 and m["args"] > 0 for m in r["memory"])
    ours = {r["form"]: r["loss"] for r in rows if r["who"] == "ours"
            and r["policy"] == "nothing_saveable"}
    theirs = next(r["loss"] for r in rows if r["who"] == "jax.checkpoint")
    assert abs(ours["joint"] - theirs) <= 1e-5 * abs(theirs)
    assert abs(ours["split"] - theirs) <= 1e-5 * abs(theirs)
    assert next(r for r in rows if r["policy"].startswith("auto"))["activations"] <= \
        next(r for r in rows if r["policy"] == "nothing_saveable" and r["who"] == "ours"
             and r["form"] == "split")["activations"]

    before = json.loads(out.read_text())
    logs.clear()
    again = gpu.measure(only=["nothing"], steps=2, path=out, log=logs.append, dry_run=True)
    assert again["rows"] == before["rows"] and not logs       # resumed: nothing measured

    text = gpu.render(again)
    assert "nothing_saveable" in text and "jax.checkpoint" in text and "| ours | split |" in text
    assert "On a GPU" not in text or again["backend"] == "gpu"   # no GPU claim from a CPU
    summary = next(line for line in text.splitlines()
                   if line.startswith("| mlp | `nothing_saveable` |"))   # ours over JAX's
    assert summary.count("x |") == 4 and "Footprint above JAX's + 2%" in text


def test_time_limit_stops_cleanly_and_marks_the_run_incomplete(tmp_path):
    out = tmp_path / "gpu.json"
    data = gpu.measure(only=["nothing"], steps=1, path=out, time_limit=0.0, log=lambda s: None,
                       dry_run=True)
    assert data["complete"] is False and data["rows"] == []
    assert "Incomplete run" in gpu.render(data)


def test_failed_runs_are_kept_and_retried_on_request(tmp_path):
    """A failure is a result (kept on resume); --retry-failed measures it again."""
    out = tmp_path / "gpu.json"
    data = gpu.measure(only=["nothing"], steps=1, path=out, log=lambda s: None, dry_run=True)
    failed = dict(data["rows"][0])
    for k in ("times", "memory", "loss", "activations"):
        failed.pop(k, None)
    failed["error"] = "XlaRuntimeError: an earlier failure"
    data["rows"][0] = failed
    out.write_text(json.dumps(data))
    kept = gpu.measure(only=["nothing"], steps=1, path=out, log=lambda s: None, dry_run=True)
    assert kept["rows"][0]["error"].startswith("XlaRuntimeError")
    retried = gpu.measure(only=["nothing"], steps=1, path=out, log=lambda s: None,
                          dry_run=True, retry_failed=True)
    assert not any("error" in r for r in retried["rows"])
    assert len(retried["rows"]) == len(data["rows"])


def test_barriers_dry_run_measures_both_groupings_and_renders(tmp_path):
    """The barrier-groupings benchmark on a tiny MLP: both groupings and JAX's program per
    form, XLA's memory of each executable, checks per row, a page section."""
    from tools.benchmarks import barriers
    out = tmp_path / "barriers.json"
    data = barriers.measure(path=out, log=lambda _: None, dry_run=True)
    assert data["complete"] and {r["form"] for r in data["rows"]} == {"joint", "split"}
    for r in data["rows"]:
        assert "error" not in r
        halves = 2 if r["form"] == "split" else 1
        assert all(len(r[w]) == halves for w in ("per-use", "per-region", "jax"))
        assert all(m["args"] > 0 for w in ("per-use", "per-region") for m in r[w])
    assert len(barriers.checks(data)) == 1 + 3   # joint: footprint; split: it and each half
    text = barriers.render(data)
    assert "## Where the barriers go" in text and "| mlp | `nothing` | joint |" in text
    assert "Temp bytes alone" in text       # the halves' temp, beside the footprint checks


def test_xla_benchmark_builds_both_groupings_where_barriers_are_kept(monkeypatch):
    """The xla benchmark measures ours as rp.jit builds it (`barrier_variants`): where XLA
    keeps barriers (no tie, as on a GPU), per use and per region, the smaller footprint
    kept and named; where the tie decides (CPU), per use alone. Checked on CPU with a tiny
    MLP, the backend's answer to "tie?" overridden for the first part."""
    import jax.numpy as jnp

    import remat_passes as rp
    from remat_passes.api import variants
    from tools.benchmarks import common, xla_memory
    from tools.benchmarks.models import _identity, make_mlp
    model = make_mlp(batch=8, width=32, depth=2, d_in=16, d_out=8)
    module = rp.export_vjp(model.build(_identity), *model.args)
    policy = rp.policies.nothing_saveable
    _, halves, _ = xla_memory.our_split(module, policy, model.args)
    assert {h["barriers"] for h in halves} == {"per-use"}
    peaks = {g: common.xla_peak(xla_memory.our_halves(
        rp.remat(module, policy, mode="split", barrier_groups=g), model.args))
        for g in ("per-use", "per-region")}
    monkeypatch.setattr(variants, "needs_tie", lambda backend=None: False)
    _, halves, tied = xla_memory.our_split(module, policy, model.args)
    assert not tied and {h["barriers"] for h in halves} <= set(peaks)
    assert common.xla_peak(halves) == min(peaks.values())
    ct = jnp.ones_like(model.build(_identity)(*model.args))
    joint = xla_memory.our_joint(module, policy, model.args, ct)
    assert joint["barriers"] in peaks and joint["estimate"] > 0


def test_xla_benchmark_merges_the_parts_a_parallel_device_round_hands_back(tmp_path, monkeypatch):
    """`xla --merge-from parts.tgz` (device_round.sh --parallel: one results file per model,
    packed as par_KEY/tools/benchmarks/results/xla_gpu.json) merges each into the stored
    results of their backend; a file that is not such results is a clear error."""
    import json
    import tarfile
    from tools.benchmarks import __main__ as bench, common, xla_memory

    def part(model):
        return {"meta": {"backend": "gpu", "commit": "abc", "device": "H200"},
                "rows": [{"model": model, "short": "none"}],
                "sweeps": [{"model": model, "points": []}]}
    for m in ("mlp", "gpt"):
        path = tmp_path / f"par_{m}" / "tools/benchmarks/results/xla_gpu.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(part(m)))
    archive = tmp_path / "xla_gpu_parts.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for m in ("mlp", "gpt"):
            tar.add(tmp_path / f"par_{m}", arcname=f"par_{m}")
    assert [p["rows"][0]["model"] for p in xla_memory.read_parts([archive])] == ["gpt", "mlp"]
    written = {}
    monkeypatch.setattr(common, "read_json", lambda name: dict(part("convnet"), meta=dict(
        part("convnet")["meta"], commit="old")))
    monkeypatch.setattr(common, "write_json", lambda name, data: written.update({name: data}))
    monkeypatch.setattr(xla_memory, "checks", lambda data: [])
    bench.run_xla(["--merge-from", str(archive)])
    merged = written["xla_gpu"]
    assert [r["model"] for r in merged["rows"]] == ["convnet", "gpt", "mlp"]
    assert merged["meta"]["commit"] == "old for convnet; abc for gpt, mlp"
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 1}')
    with pytest.raises(SystemExit):
        bench.run_xla(["--merge-from", str(bad)])


def test_xla_benchmark_merges_the_monotone_sweeps_measured_elsewhere(tmp_path, monkeypatch):
    """`xla --merge-monotone-from` (device_round.sh --parallel with MONOTONE set: per model a
    copy of the stored results that `xla --monotone` added to) takes each part's sweep
    whose monotone twin differs from the stored one, its rule and commit with it, and
    leaves every other figure as stored; budgets that are not the stored ones are an
    error."""
    import copy
    import json
    from tools.benchmarks import __main__ as bench, common, xla_memory

    def point(b, mono=None):
        p = {"budget": b, "activations": b, "halves": [{"temp": 100 + b}]}
        if mono is not None:
            p["monotone"] = {"activations": mono, "halves": [{"temp": 90 + mono}]}
        return p
    stored = {"meta": {"backend": "gpu"}, "rows": [{"model": "mlp"}, {"model": "gpt"}],
              "sweeps": [{"model": "mlp", "monotone_commit": "old",
                          "points": [point(0, 0), point(10, 10)]},
                         {"model": "gpt", "monotone_commit": "old",
                          "points": [point(0, 0), point(10, 10)]}]}
    part = copy.deepcopy(stored)        # measured gpt again with the rule larger
    part["sweeps"][1].update(monotone_commit="new", monotone_rule="larger",
                             points=[point(0, 10), point(10, 10)])
    part["sweeps"][0]["points"][0]["halves"] = [{"temp": 1}]   # (not a monotone figure)
    merged = xla_memory.merge_monotone(stored, part)
    assert merged["sweeps"][0] == stored["sweeps"][0]
    gpt = merged["sweeps"][1]
    assert (gpt["monotone_commit"], gpt["monotone_rule"]) == ("new", "larger")
    assert [p["monotone"]["activations"] for p in gpt["points"]] == [10, 10]
    assert [p["halves"] for p in gpt["points"]] == [p["halves"]
                                                   for p in stored["sweeps"][1]["points"]]
    assert stored["sweeps"][1]["monotone_commit"] == "old"      # (a copy: stored untouched)
    path = tmp_path / "mono_gpt.json"
    path.write_text(json.dumps(part))
    written = {}
    monkeypatch.setattr(common, "read_json", lambda name: copy.deepcopy(stored))
    monkeypatch.setattr(common, "write_json", lambda name, data: written.update({name: data}))
    monkeypatch.setattr(xla_memory, "checks", lambda data: [])
    bench.run_xla(["--merge-monotone-from", str(path)])
    assert written["xla_gpu"]["sweeps"][1]["monotone_rule"] == "larger"
    part["sweeps"][1]["points"][1]["budget"] = 11
    path.write_text(json.dumps(part))
    with pytest.raises(SystemExit):
        bench.run_xla(["--merge-monotone-from", str(path)])


def test_xla_benchmark_merges_every_model_of_a_rounds_monotone_and_peak_archives(tmp_path):
    """device_round.sh's MONOTONE and PEAK runs hand back, per model KEY, a copy of every
    stored result under `mono_KEY/` (`peak_KEY/`) with KEY's sweep measured again: each
    part gives its own model's sweep alone, so a later part's stale copy of another model
    does not undo an earlier part's (2026-11-30: only the last part's model was kept)."""
    import copy
    import io
    import json
    import tarfile
    from tools.benchmarks import xla_memory

    def twin(commit):
        return {"monotone_commit": commit, "points": [
            {"budget": 0, "activations": 0, "monotone": {"activations": 0, "at": commit}}]}
    stored = {"meta": {"backend": "gpu"}, "rows": [{"model": "gpt"}, {"model": "gpt-scan"}],
              "sweeps": [dict(model="gpt", **twin("old")), dict(model="gpt-scan", **twin("old"))],
              "peak_sweeps": [{"model": "gpt", "commit": "old", "points": []},
                              {"model": "gpt-scan", "commit": "old", "points": []}]}
    for run in ("mono", "peak"):
        archive = tmp_path / f"{run}.tgz"
        with tarfile.open(archive, "w:gz") as tar:
            for i, key in enumerate(("gpt", "gpt-scan")):
                part = copy.deepcopy(stored)
                part["sweeps"][i].update(twin("new"))
                part["peak_sweeps"][i]["commit"] = "new"
                text = json.dumps(part).encode()
                info = tarfile.TarInfo(f"{run}_{key}/tools/benchmarks/results/xla_gpu.json")
                info.size = len(text)
                tar.addfile(info, io.BytesIO(text))
        parts = xla_memory.read_parts([archive])
        assert sorted(s["model"] for p in parts for s in p["sweeps"]) == ["gpt", "gpt-scan"]
        data = stored
        for part in parts:
            data = (xla_memory.merge_monotone if run == "mono" else xla_memory.merge_peak)(
                data, part)
        if run == "mono":
            assert [s["monotone_commit"] for s in data["sweeps"]] == ["new", "new"]
        else:
            assert [s["commit"] for s in data["peak_sweeps"]] == ["new", "new"]


def test_xla_benchmark_checks_and_keeps_the_objective_peak_sweeps():
    """`xla --peak`'s sweeps (peak budget -> XLA's joint and split footprints): a footprint
    above a larger budget's (+2%) or the joint one above its budget (+15%) is a missed
    check, and so is a budget objective=peak refused; a later `xla` run of the same model
    (which measures none) leaves them, a part that has its own replaces them."""
    from tools.benchmarks import xla_memory

    def point(b, joint, split):
        return {"budget": b, "activations": 0,
                "joint": {"temp": joint, "args": 0, "out": 0, "estimate": b},
                "halves": [{"temp": split, "args": 0, "out": 0}]}

    def results(commit, points, rows=()):
        return {"meta": {"backend": "cpu"}, "rows": list(rows),
                "sweeps": [{"model": "mlp", "points": []}],
                "peak_sweeps": [{"model": "mlp", "commit": commit, "points": points}]}

    def missed(d):
        return [t for t, ok in xla_memory.checks(d) if not ok]
    data = results("aaa", [point(100, 100, 105), point(200, 180, 110), point(300, 290, 300)])
    assert missed(data) == []
    table = "\n".join(xla_memory._render_peak_sweeps(data))
    assert "| mlp (at aaa) | 100 | 100 | 0 | 100 (1.00) | 105 |\n" \
           "| mlp | 200 | 200 | 0 | 180 (0.90) | 110 |" in table
    data["peak_sweeps"][0]["points"][0] = point(100, 190, 105)   # joint rises, over budget
    assert [t.split(":")[0] for t in missed(data)] == [
        "mlp objective=peak sweep, joint", "mlp objective=peak sweep"]
    data["peak_sweeps"][0]["points"].append({"budget": 50, "error": "error: below"})
    assert "mlp objective=peak at 50 B: error: below" in missed(data)
    stored = dict(data, rows=[{"model": "mlp"}])
    plain = dict(results("bbb", [], rows=[{"model": "mlp"}]))
    del plain["peak_sweeps"]
    assert xla_memory.merge(stored, plain)["peak_sweeps"] == data["peak_sweeps"]
    again = results("bbb", [], rows=[{"model": "mlp"}])
    assert xla_memory.merge(stored, again)["peak_sweeps"] == again["peak_sweeps"]
    # `xla --merge-peak-from` (device_round.sh's PEAK jobs: per model a copy of the stored
    # results with its own sweep): the part's differing sweep is taken, nothing else
    gpt = {"model": "gpt", "commit": "ccc", "points": []}
    part = dict(stored, rows=[], peak_sweeps=stored["peak_sweeps"] + [gpt])
    merged = xla_memory.merge_peak(dict(stored, sweeps=[{"model": "gpt"},
                                                        {"model": "mlp"}]), part)
    assert merged["peak_sweeps"] == [gpt] + stored["peak_sweeps"]
    assert merged["rows"] == stored["rows"]


def test_xla_benchmark_checks_the_compiled_twins_of_the_objective_peak_sweeps():
    """`xla --peak --compiled`: beside each point, auto(b, objective=peak, score=xla)'s (its
    own table); its joint footprint above its budget (at all) or above a larger budget's
    (+2%) is a missed check, a budget it refuses (no compiled trial fits) is not."""
    from tools.benchmarks import xla_memory

    def point(b, joint, compiled):
        return {"budget": b, "activations": 0,
                "joint": {"temp": joint, "args": 0, "out": 0, "estimate": b},
                "halves": [{"temp": joint, "args": 0, "out": 0}],
                "compiled": compiled if isinstance(compiled, dict) else {
                    "budget": b, "activations": 7, "joint": {"temp": compiled, "args": 0,
                                                              "out": 0},
                    "halves": [{"temp": compiled, "args": 0, "out": 0}]}}
    refused = {"budget": 100, "error": "error: below the lowest joint peak"}
    data = {"meta": {"backend": "cpu"}, "rows": [], "sweeps": [],
            "peak_sweeps": [{"model": "mlp", "commit": "aaa", "points": [
                point(100, 110, refused), point(200, 180, 150), point(300, 290, 290)]}]}

    def missed(d):
        return [t for t, ok in xla_memory.checks(d) if not ok]
    assert not [t for t in missed(data) if "score=xla" in t]
    assert "mlp objective=peak score=xla sweep: XLA's joint footprint at most 0.967x the " \
           "peak budget" in [t for t, _ in xla_memory.checks(data)]
    table = "\n".join(xla_memory._render_peak_sweeps(data))
    assert "| mlp (at aaa) | 100 | error: below the lowest joint peak | | |\n" in table
    assert "| mlp | 200 | 7 | 150 (0.75) | 150 |" in table
    data["peak_sweeps"][0]["points"][1] = point(200, 180, 201)     # over its budget
    assert "mlp objective=peak score=xla sweep: XLA's joint footprint at most 1.005x the " \
           "peak budget" in missed(data)
    data["peak_sweeps"][0]["points"][1] = point(200, 180, 196)     # above 300's (+2%)
    data["peak_sweeps"][0]["points"][2] = point(300, 290, 180)
    assert [t for t in missed(data) if "score=xla" in t] == [
        "mlp objective=peak score=xla sweep, joint: XLA footprint at a budget at most "
        "1.089x that of any larger budget"]
    # a sweep where score=xla refused every budget has nothing to check
    data["peak_sweeps"][0]["points"] = [point(100, 110, refused)]
    assert not [t for t, _ in xla_memory.checks(data) if "score=xla" in t]


def test_xla_peak_without_compiled_keeps_the_stored_score_xla_points():
    """`xla --peak` without `--compiled` measures objective=peak's points again and keeps
    the stored score=xla twins where the budgets came out the same, rendered at the commit
    they were measured at; where the budgets moved they go."""
    from tools.benchmarks import xla_memory

    def point(b, joint):
        return {"budget": b, "activations": 0,
                "joint": {"temp": joint, "args": 0, "out": 0, "estimate": b},
                "halves": [{"temp": joint, "args": 0, "out": 0}]}
    old = {"model": "mlp", "commit": "aaa", "points": [
        dict(point(100, 90), compiled=point(100, 80)), dict(point(200, 190),
                                                            compiled=point(200, 150))]}
    new = {"model": "mlp", "commit": "bbb", "points": [point(100, 95), point(200, 185)]}
    kept = xla_memory._with_stored_compiled(new, old)
    assert kept["compiled_commit"] == "aaa"
    assert [p["compiled"]["joint"]["temp"] for p in kept["points"]] == [80, 150]
    table = "\n".join(xla_memory._render_peak_sweeps({"peak_sweeps": [kept]}))
    assert "| mlp (at bbb) | 100 | 100 | 0 | 95 (0.95) | 95 |" in table
    # a sweep measured with objective=peak's check against XLA is marked
    checked = "\n".join(xla_memory._render_peak_sweeps(
        {"peak_sweeps": [dict(kept, checked=True)]}))
    assert "| mlp (at bbb, §) | 100 | 100 |" in checked
    assert "| mlp (at aaa) | 100 | 0 | 80 (0.80) | 80 |" in table
    # measured again later: the twins keep their own commit
    again = xla_memory._with_stored_compiled(
        {"model": "mlp", "commit": "ccc", "points": [point(100, 95), point(200, 185)]}, kept)
    assert again["compiled_commit"] == "aaa"
    moved = {"model": "mlp", "commit": "bbb", "points": [point(100, 95), point(250, 185)]}
    assert "compiled" not in xla_memory._with_stored_compiled(moved, old)["points"][0]


def test_xla_benchmark_merge_keeps_the_monotone_twins_of_a_sweep_measured_the_same():
    """`xla --models K --merge` after `xla --monotone`: the plain run measures no twins; they
    stay where its sweep came out as the stored one, and go (said) where it did not."""
    from tools.benchmarks import xla_memory

    def half(temp):
        return [{"temp": temp, "args": 0, "out": 0}]

    def sweep(model, temps, twin=None):
        points = [{"budget": b, "activations": b, "halves": half(t)}
                  for b, t in zip((0, 10), temps)]
        if twin is not None:
            for p, t in zip(points, twin):
                p["monotone"] = {"halves": half(t), "other_budgets_plan": t != p[
                    "halves"][0]["temp"]}
        out = {"model": model, "points": points}
        return dict(out, monotone_rule="larger", monotone_commit="aaa") if twin else out

    def run(commit, sweeps):
        return {"meta": {"backend": "gpu", "commit": commit, "device": "H200"},
                "rows": [{"model": s["model"], "short": "none"} for s in sweeps],
                "sweeps": sweeps}
    stored = run("aaa", [sweep("mlp", (5, 4), twin=(4, 4)), sweep("gpt", (9, 8), (8, 8))])
    said = []
    merged = xla_memory.merge(stored, run("bbb", [sweep("mlp", (5, 4)), sweep("gpt", (9, 7))]),
                              said.append)
    mlp, gpt = merged["sweeps"]
    assert [p["monotone"]["halves"][0]["temp"] for p in mlp["points"]] == [4, 4]
    assert mlp["monotone_rule"] == "larger" and mlp["monotone_commit"] == "aaa"
    assert not any("monotone" in p for p in gpt["points"]) and "monotone_rule" not in gpt
    assert len(said) == 1 and "gpt" in said[0] and "xla --monotone --models gpt" in said[0]
    # the checks read the kept twin: the twins' sweep passes, the plain one still rises
    texts = [t for t, _ in xla_memory.checks(dict(merged, rows=[]))]
    assert "mlp sweep (monotone=larger): XLA footprint at a budget at most 1.000x that of " \
        "any larger budget" in texts


def test_xla_benchmark_merges_a_run_in_pieces():
    """`python -m tools.benchmarks xla --models ... --merge`: a device run one call per few
    models replaces those models' rows and sweep, keeps the rest in its order, and the
    commit says which models were measured at which."""
    from tools.benchmarks import xla_memory

    def run(commit, models, device="H200"):
        return {"meta": {"backend": "gpu", "commit": commit, "device": device},
                "rows": [{"model": m, "short": s} for m in models for s in ("none", "dots")],
                "sweeps": [{"model": m, "points": [commit]} for m in models]}
    stored = run("aaa", ["mlp", "convnet", "gpt"])
    merged = xla_memory.merge(stored, run("bbb", ["convnet"]))
    assert [r["model"] for r in merged["rows"]] == ["mlp"] * 2 + ["convnet"] * 2 + ["gpt"] * 2
    assert [s["points"] for s in merged["sweeps"]] == [["aaa"], ["bbb"], ["aaa"]]
    assert merged["meta"]["commit"] == "aaa for mlp, gpt; bbb for convnet"
    assert xla_memory.merge(None, run("bbb", ["mlp"]))["meta"]["commit"] == "bbb"
    # a second piece, on another device: each model keeps its own commit and device
    twice = xla_memory.merge(merged, run("ccc", ["gpt"], device="H100"))
    assert twice["meta"]["commit"] == "aaa for mlp; bbb for convnet; ccc for gpt"
    assert twice["meta"]["device"] == "H200 for mlp, convnet; H100 for gpt"
    everything = xla_memory.merge(twice, run("ddd", ["mlp", "convnet", "gpt"]))
    assert everything["meta"]["commit"] == "ddd" and len(everything["rows"]) == 6
    assert "estimates_commit" not in everything["meta"]      # none made again
    # estimates made again (--re-estimate) stay said of the models a later piece keeps
    again = dict(everything, meta=dict(
        everything["meta"], estimates_commit="eee",
        measured={m: dict(v, estimates_commit="eee")
                  for m, v in everything["meta"]["measured"].items()}))
    later = xla_memory.merge(again, run("fff", ["gpt"]))
    assert later["meta"]["estimates_commit"] == "eee for mlp, convnet; fff for gpt"
    # the page says it per model: only mlp and convnet have estimates made again, and only
    # the rows measured before round_read_back (gpt's here) are said to predate it
    for r in later["rows"]:
        r["ours"] = [{"round_read_back": r["model"] != "gpt"}]
    text = xla_memory._provenance_text(later)
    assert "The split rows of gpt were measured before" in text
    assert "made again at eee for mlp, convnet from" in text and "fff" not in text
    for r in later["rows"]:
        r["ours"] = [{}]
    assert " The split rows were measured before" in xla_memory._provenance_text(later)
    # an offload row measured before the host copy came after its barrier says so
    assert "offload rows" not in xla_memory._provenance_text(later)
    later["rows"][0]["policy"] = "offload_dot_with_no_batch_dims(device, pinned_host)"
    assert "The offload rows of mlp were measured before" in xla_memory._provenance_text(later)
    later["rows"][0]["ours"] = [{"host_copy_after_barrier": True}]
    assert "offload rows" not in xla_memory._provenance_text(later)
    # so does a row of a model whose program sink-loop-constants changed, measured before it
    assert "sink-loop-constants" not in xla_memory._provenance_text(later)
    later["rows"][0]["model"] = xla_memory.CHANGED_BY_SINKING[0]
    text = xla_memory._provenance_text(later)
    assert f"The rows of {xla_memory.CHANGED_BY_SINKING[0]} were measured before" in text
    later["rows"][0]["ours"] = [{"loop_constants_inside": True}]
    assert "sink-loop-constants" not in xla_memory._provenance_text(later)


def test_re_estimate_makes_the_stored_estimates_again():
    """`xla --re-estimate BACKEND`: the estimates of stored results made again from the same
    exports, XLA's figures kept. On the stored CPU results (the MLP's rows) it gives exactly
    the stored estimates: the stored page is what the code computes. Results measured with
    another jax (whose exports may differ) are refused."""
    import copy

    import jax
    import pytest

    from tools.benchmarks import common, xla_memory
    stored = common.read_json("xla")
    if stored["meta"]["jax"] != jax.__version__:
        pytest.skip(f"the CPU results were measured with jax {stored['meta']['jax']}")
    mlp = dict(stored, rows=[r for r in stored["rows"] if r["model"] == "mlp"])
    before = copy.deepcopy(mlp["rows"])
    fields = ("estimate", "estimate_program_order")
    for r in mlp["rows"]:         # make them stale: re-estimating must set them again
        for part in r["ours"] + [r["joint_ours"]]:
            for f in fields:
                part[f] = -1
    again = xla_memory.reestimate(copy.deepcopy(mlp), log=lambda *_: None)
    assert len(again["rows"]) == len(before) > 0
    for a, b in zip(again["rows"], before):
        for f in fields:
            assert [h[f] for h in a["ours"] + [a["joint_ours"]]] == \
                [h[f] for h in b["ours"] + [b["joint_ours"]]], (a["short"], f)
        assert a["ours"][0]["temp"] == b["ours"][0]["temp"]          # XLA's figures kept
    other = dict(mlp, meta=dict(mlp["meta"], jax="0.0.1"))
    with pytest.raises(SystemExit, match="measured with jax 0.0.1"):
        xla_memory.reestimate(other, log=lambda *_: None)


def test_budgets_benchmark_merges_a_model_measured_alone():
    """`python -m tools.benchmarks budgets --models decoder --merge`: the model measured
    replaces its entry (or joins, in the page's model order), the others and the
    large-module solves are kept, and the page says which commit measured which."""
    from tools.benchmarks import budgets

    def run(commit, models, scale=()):
        return {"machine": {"commit": commit, "date": "2026-12-04"},
                "models": {m: {"title": m, "by": commit} for m in models},
                "scale": list(scale)}
    stored = run("aaa", ["decoder", "mlp", "gpt"], scale=["solves"])
    merged = budgets.merge(stored, run("bbb", ["decoder"]))
    assert list(merged["models"]) == ["mlp", "gpt", "decoder"]     # PAGE_MODELS' order
    assert [v["by"] for v in merged["models"].values()] == ["aaa", "aaa", "bbb"]
    assert merged["scale"] == ["solves"]
    assert budgets._commits(merged["machine"]) == \
        "aaa (2026-12-04) for mlp, gpt, the large-module solves; bbb (2026-12-04) for decoder"
    again = budgets.merge(merged, run("ccc", ["mlp", "gpt", "decoder"], scale=["new"]))
    assert budgets._commits(again["machine"]) == "ccc" and again["scale"] == ["new"]
    assert stored["models"]["decoder"]["by"] == "aaa"        # (the stored results untouched)
