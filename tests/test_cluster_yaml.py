"""examples/cluster.yaml is a configuration the Ray cluster launcher accepts (`ray up` validates it
the same way: defaults filled in, then Ray's schema), and it installs scopecast on every node."""

from __future__ import annotations

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from scopecast.scopes.cluster_manager import LAN_LABEL

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "cluster.yaml"


def test_the_cluster_launcher_accepts_the_example_and_every_node_gets_scopecast():
    raw = yaml.safe_load(CONFIG.read_text())
    validate_config(prepare_config(raw))  # raises on anything `ray up` would refuse
    assert raw["file_mounts"] == {"~/scopecast": "."}  # the clone `ray up` runs from
    setup = " && ".join(raw["setup_commands"])
    assert "-c ~/scopecast/constraints.txt -e ~/scopecast" in setup  # the versions that work
    assert "openjdk-17" in setup  # Spark through RayDP
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in raw[key] if " start " in c]
        assert start and all(f"--labels {LAN_LABEL}=" in c for c in start), start
