"""How scopecast's Ray actors are declared, named and found.

Every scopecast actor lives in the `scopecast` namespace, asks for no CPU (`num_cpus=0`: a 2-core
machine running Spark executors must never starve the control plane), is restarted by Ray on failure
(`max_restarts=-1`) and is detached, so a cluster started by `scopecast up` outlives the driver."""

from __future__ import annotations

import ray

NAMESPACE = "scopecast"
CLUSTER_SCOPE_MANAGER = "scopecast:cluster-scope"

_CONTROL_OPTIONS = dict(num_cpus=0, max_restarts=-1, max_task_retries=-1, lifetime="detached",
                        namespace=NAMESPACE)


def get_or_create(cls: type, name: str, *args, ray_options: dict | None = None, **kwargs):
    """The named actor of class `cls`, created as `cls(*args, **kwargs)` if it does not exist yet
    (idempotent); `ray_options` add to or override the control-plane defaults."""
    opts = {**_CONTROL_OPTIONS, **(ray_options or {})}
    remote_cls = ray.remote(cls)
    return remote_cls.options(name=name, get_if_exists=True, **opts).remote(*args, **kwargs)


def find(name: str):
    """The named scopecast actor (ValueError if there is none)."""
    return ray.get_actor(name, namespace=NAMESPACE)


def lookup(name: str):
    """The named scopecast actor, or None."""
    try:
        return find(name)
    except ValueError:
        return None

