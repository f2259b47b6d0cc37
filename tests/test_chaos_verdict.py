"""The chaos soak's checks (benchmarks/chaos.verdict) on made-up reports: each fails on what it is
there to catch (the soak itself runs in test_local_hosts)."""

from __future__ import annotations

import copy

from benchmarks.chaos import FAULTS, verdict

T = "chaos/stable/0"


def _report() -> dict:
    keys = {f"{T}|vm:1": {"first": 1, "last": 100, "gaps": 0, "bad": 0}}
    return {
        "seconds": 60.0, "published": {T: 100}, "originals": ["orig0"], "joined": {"join0": 10.0},
        "subscribers": {"orig0": {"keys": keys, "light": False},
                        "join0": {"keys": {f"{T}|vm:1": {**keys[f"{T}|vm:1"], "first": 40}},
                                  "light": False}},
        "flushes": [{"topic": T, "counter": 90, "seconds": 0.4, "ok": True, "at": 30.0}],
        "hung": [], "errors": {},
        "faults": [{"kind": k, "at": 10.0, "target": "x", "recovered": 2.0} for k in FAULTS],
        "rss": {}}


def test_a_clean_report_passes_every_check():
    assert set(verdict(_report()).values()) == {"ok"}


def test_each_check_fails_on_what_it_catches():
    def failed(change) -> set[str]:
        r = copy.deepcopy(_report())
        change(r)
        return {k for k, v in verdict(r).items() if v != "ok"}

    def key(r, who="orig0"):
        return r["subscribers"][who]["keys"][f"{T}|vm:1"]

    assert failed(lambda r: key(r).update(gaps=1)) == {"gap-free prefix"}
    assert failed(lambda r: key(r).update(first=5)) == {"gap-free prefix"}  # an original, late
    assert failed(lambda r: key(r, "join0").update(last=99)) == {"survivors agree"}
    assert failed(lambda r: r["subscribers"]["join0"].update(keys={})) == {"survivors agree"}
    assert failed(lambda r: r["joined"].update(join0=58.0) or
                  r["subscribers"]["join0"].update(keys={})) == set()  # joined at the end
    assert failed(lambda r: r["flushes"].append({**r["flushes"][0], "counter": 101})) == {
        "nothing flushed lost"}
    assert failed(lambda r: r["flushes"].append({**r["flushes"][0], "ok": False})) == {
        "no flush hung"}
    assert failed(lambda r: r["hung"].append("publish")) == {"no flush hung"}
    assert failed(lambda r: r["faults"].pop()) == {"every fault injected and survived"}
    assert failed(lambda r: r["faults"][0].update(recovered=None)) == {
        "every fault injected and survived"}


def test_a_ten_minute_run_checks_rss_over_its_last_five_minutes():
    r = _report()
    r["seconds"] = 600.0
    r["rss"] = {"mid": {"7": ["Recorder", 1000]}, "end": {"7": ["Recorder", 1040]}}
    assert verdict(r)["RSS over the last 5 minutes"] == "ok"
    r["rss"]["end"]["7"][1] = 1060
    assert verdict(r)["RSS over the last 5 minutes"] != "ok"
