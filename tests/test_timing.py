"""The timing knobs: one object, checked as a whole, documented in one table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scopecast.actors.errors import InvalidConfig
from scopecast.scopes.cluster_manager import _check_settings
from scopecast.timing import CLUSTER_TIMING, TIMING, check_cluster, table

DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def test_the_defaults_fit_together():
    assert TIMING.check() is TIMING


@pytest.mark.parametrize("change, named", [
    ({"heartbeat_period": 3.0}, "heartbeat_period"),     # more than half the scope timeout
    ({"watch_period": 6.0}, "watch_period"),             # a member's heartbeat vs its timeout
    ({"park": 0.02}, "handover_wait"),                   # a thread would wait past its wait
    ({"tail_fallback": 6.0}, "tail_fallback_max"),
    ({"hole_delay": 0.0}, "hole_delay"),                 # not positive
    ({"policy_timeout": float("nan")}, "policy_timeout"),
])
def test_knobs_that_do_not_fit_are_a_typed_error_naming_them(change, named):
    with pytest.raises(InvalidConfig, match=named):
        replace(TIMING, **change).check()


def test_a_clusters_settings_are_checked_with_every_other_knob():
    check_cluster({"member_timeout": 20.0, "token_period": 0.005})
    with pytest.raises(InvalidConfig, match="member_timeout"):
        check_cluster({"member_timeout": 1.5})  # the members' watch calls come every second
    with pytest.raises(InvalidConfig, match="unknown"):
        check_cluster({"watch_period": 2.0})  # not a cluster setting
    with pytest.raises(InvalidConfig):
        _check_settings({"member_timeout": 1.5})
    assert {"heartbeat_period", "member_timeout", "token_period"} <= set(CLUSTER_TIMING)


def test_the_settings_page_shows_every_knob():
    text = DOC.read_text()
    shown = text.split("<!-- timing table -->\n", 1)[1].split("\n<!-- end timing table -->", 1)[0]
    assert shown == table(), "docs/settings.md is out of date: paste scopecast.timing.table()"


def test_every_layer_may_read_the_knobs():
    """timing.py sits below every subpackage: it imports only the typed errors."""
    import ast

    import scopecast.timing as timing

    tree = ast.parse(Path(timing.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m for m in imported if m.startswith("scopecast")} == {"scopecast.actors.errors"}
