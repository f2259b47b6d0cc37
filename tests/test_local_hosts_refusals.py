"""What a local multi-host cluster refuses before it makes anything (issue 8, item 1): these run
without root, unlike tests/test_local_hosts.py."""

from __future__ import annotations

import pytest

from scopecast import cli
from scopecast.ray_cluster import local_hosts
from scopecast.ray_cluster.local_hosts import LocalHosts, LocalHostsError


def test_bad_sizes_are_refused_before_anything_is_made():
    with pytest.raises(ValueError, match="lans <= hosts"):
        LocalHosts(hosts=1, lans=2)
    with pytest.raises(ValueError, match="prefix"):
        LocalHosts(prefix="much-too-long")


def test_without_root_up_and_down_say_so_and_make_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(local_hosts.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(local_hosts, "state_dir", lambda: tmp_path)
    made = []
    monkeypatch.setattr(local_hosts, "_ip", lambda *args: made.append(args))
    cluster = LocalHosts(hosts=2, prefix="scnr")
    for action in (cluster.up, cluster.down):
        with pytest.raises(LocalHostsError, match="needs root"):
            action()
    assert made == [] and list(tmp_path.iterdir()) == []
    # the command line reports it as an error, not a traceback
    assert cli.main(["cluster", "local", "--hosts", "2", "--prefix", "scnr"]) != 0
    assert "needs root" in capsys.readouterr().err
