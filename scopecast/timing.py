"""Every timing knob of scopecast in one place, checked as a whole.

`TIMING` holds the values the code runs with. The knobs marked *cluster* are cluster settings: the
root scope keeps them (`connect(settings={...})` when the cluster is deployed) and passes them down
the hierarchy; the others are fixed here. Modules bind the knobs they use to module-level names
once at import (the hot path then reads a global, not an attribute).

`Timing.check` is where knobs that depend on each other are checked: a period must be shorter than
the timeout that waits for it. `docs/settings.md` shows `table()`; a test keeps the two in line.
All values are seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from scopecast.actors.errors import InvalidConfig


def _knob(default: float, doc: str, cluster: bool = False):
    return field(default=default, metadata={"doc": doc, "cluster": cluster})


@dataclass(frozen=True, slots=True)
class Timing:
    # ------------------------------------------------------------ the scope hierarchy (cluster)
    heartbeat_period: float = _knob(0.5, "a scope reports to its parent (its heartbeat) and runs "
                                    "its periodic work this often", cluster=True)
    scope_timeout: float = _knob(5.0, "a child scope silent this long is removed (and calls to "
                                 "child scopes wait this long)", cluster=True)
    member_timeout: float = _knob(10.0, "a member process silent this long is removed",
                                  cluster=True)
    ready_grace: float = _knob(3.0, "a new publisher does not wait for a member silent this long "
                               "since its view was sent (died without leaving, or stalled)",
                               cluster=True)
    slow_grace: float = _knob(5.0, "a member behind by more than slow_lag_mb this long is demoted "
                              "to client", cluster=True)
    token_period: float = _knob(0.01, "recovery agents' token period while senders are active",
                                cluster=True)
    idle_token_period: float = _knob(1.0, "recovery agents' token period while all is stable",
                                     cluster=True)
    empty_scope_timeout: float = _knob(60.0, "a user's scope without members this long retires",
                                       cluster=True)
    # ------------------------------------------------------------- a member and its scope
    watch_period: float = _knob(1.0, "a member's standing watch call returns at least this often "
                                "(the member's heartbeat)")
    beat_every: float = _knob(1.0, "a control thread waiting on a busy I/O thread still "
                              "heartbeats this often")
    counters_wait: float = _knob(0.5, "a heartbeat waits this long for fresh counters from the "
                                 "I/O thread")
    control_poll: float = _knob(0.05, "the control thread looks for unknown senders this often")
    ready_timeout: float = _knob(10.0, "a publisher waits this long for the hierarchy to be ready")
    call_timeout: float = _knob(60.0, "a control call's answer (plus call_per_name per name)")
    call_per_name: float = _knob(0.01, "what each topic name adds to a control call's time-out")
    idle_member_linger: float = _knob(30.0, "a member without publishers and subscribers stays "
                                      "this long, then leaves its scope")
    # ------------------------------------------------------------------------ the data plane
    publish_linger: float = _knob(0.0005, "the I/O loop waits this long for more publishes after "
                                  "a wake-up")
    park: float = _knob(0.002, "while an application thread leads the loop, the I/O thread looks "
                        "this soon whether it still does")
    park_most: float = _knob(0.008, "... and, each time it still does, twice as late, up to this")
    handover_wait: float = _knob(0.01, "a receiving thread waits this long for the lead")
    hole_delay: float = _knob(0.002, "a hole is NAKed this soon (runs reordered across paths come "
                              "within it)")
    lost_hole_delay: float = _knob(0.0005, "a hole is NAKed this soon where a channel's datagram "
                                   "numbers show a datagram lost (not a reordering)")
    ack_now_gap: float = _knob(0.0005, "acknowledgements asked for at once go at most this often")
    window_probe_after: float = _knob(0.05, "a full window waits this long for its slowest "
                                      "receiver before probing it")
    tail_probe_after: float = _knob(0.02, "a drained feed not acknowledged this long after its "
                                    "last datagram is probed (receivers acknowledge every 10 ms)")
    delay_epoch: float = _knob(5.0, "the least round trip is remembered for one to two epochs")
    repair_retry_min: float = _knob(0.004, "a hole is asked for again after twice the recent "
                                    "repair time, at least this (at most a token period)")
    idle_min: float = _knob(0.05, "a sender whose stream stands still this long (and 4 token "
                            "periods) is idle")
    idle_from: float = _knob(0.1, "a token period this long is the idle one")
    settle_report: float = _knob(0.02, "an idle member holding what is not stable reports this "
                                 "often ...")
    settle_for: float = _knob(1.0, "... for up to this long after its stream moved")
    tail_fallback: float = _knob(2.0, "a stream standing still with no new datagram this long has "
                                 "its tail asked for without evidence of loss")
    tail_fallback_max: float = _knob(5.0, "... or standing still this long whatever comes (a "
                                     "forwarding member this far behind would hold its stream's "
                                     "stability, and a flush)")
    tail_pause_max: float = _knob(15.0, "... at most this long once spells that ended by "
                                  "themselves (a forwarder's backlog) were that long")
    tail_patience: float = _knob(30.0, "tail NAKs to one sender without progress stop after this "
                                 "(a few tries run out on a loaded machine)")
    record_ttl: float = _knob(10.0, "a sender's record not refreshed this long is forgotten")
    end_wait: float = _knob(5.0, "close() waits this long beyond the data for its end marker to "
                            "be stable")
    end_linger: float = _knob(60.0, "... and a closed publisher whose marker is not stable by "
                              "then stays in its topics' recovery domains, for its repair, up "
                              "to this long more")
    light_period: float = _knob(0.01, "a light member (a joiner not caught up yet) reports to its "
                                "agents this often: its promotion waits on its reports")
    # ------------------------------------------------------------------------- the agents
    agent_tick: float = _knob(0.005, "an agent host runs its agents' timers this often")
    agent_idle_wait: float = _knob(0.1, "an agent host without agents waits this long")
    agent_hang: float = _knob(3.0, "a plug-in's agents whose thread made no progress this long "
                              "are hung: their protocol is replaced")
    agent_restarts: float = _knob(60.0, "a plug-in's agent host restarted 3 times within this is "
                                  "faulty: its protocol is replaced")
    token_lost_max: float = _knob(5.0, "a token not back is lost after 4 periods, twice as long "
                                  "after each loss in a row, up to this")
    # ----------------------------------------------------------------- the control plane
    policy_timeout: float = _knob(10.0, "a policy actor's answer")
    policy_startup: float = _knob(120.0, "a policy actor's first start")
    policy_retry: float = _knob(2.0, "a built-in policy actor that did not answer is asked again "
                                "after this")
    status_budget: float = _knob(30.0, "a status of the whole tree (each level below gets less)")
    agent_status_timeout: float = _knob(2.0, "an agent's answer to status")
    agent_ping_timeout: float = _knob(0.5, "an agent host's answer to a scope's ping")
    agent_replace_after: float = _knob(5.0, "an agent stays where it was placed at least this long")
    node_check_period: float = _knob(2.0, "the root looks for new Ray nodes this often")
    retire_wait: float = _knob(30.0, "a retiring scope's answer")
    probe_spacing: float = _knob(0.05, "a LAN multicast probe's datagrams go this far apart")
    probe_listen: float = _knob(1.0, "probe listeners wait this long for one more datagram")
    probe_retry: float = _knob(60.0, "a LAN found unicast-only is probed again after this")
    probe_stale: float = _knob(60.0, "a probe listener never asked what it heard is closed after")
    plugin_validate_timeout: float = _knob(30.0, "validating a submitted plug-in")
    pool_ping_timeout: float = _knob(5.0, "an idle pooled publisher actor's answer")
    publisher_join_timeout: float = _knob(120.0, "a DataFrame run's publisher joining the cluster")

    def check(self) -> Timing:
        """Raise InvalidConfig unless every knob is a positive number and those that depend on
        each other fit together; returns self."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise InvalidConfig(f"timing {f.name} must be a positive number of seconds, "
                                    f"not {value!r}")
        for shorter, longer, how, why in _ORDER:
            a, b = getattr(self, shorter), getattr(self, longer)
            if not {"half": 2 * a <= b, "lt": a < b, "le": a <= b}[how]:
                bound = {"half": "at most half", "lt": "shorter than", "le": "at most"}[how]
                raise InvalidConfig(f"{shorter} ({a:g}s) must be {bound} {longer} ({b:g}s): "
                                    f"{why}")
        return self


# (shorter knob, longer knob, how much shorter, why)
_ORDER = [
    ("heartbeat_period", "scope_timeout", "half", "a child scope may miss a heartbeat"),
    ("heartbeat_period", "member_timeout", "half", "the failure detector ticks with the heartbeat"),
    ("watch_period", "member_timeout", "half", "a member's watch call is its heartbeat"),
    ("beat_every", "member_timeout", "half", "a member busy in its I/O thread still heartbeats"),
    ("watch_period", "ready_grace", "half", "a living member is heard twice within the grace"),
    ("counters_wait", "watch_period", "lt", "a heartbeat waits for counters within its period"),
    ("token_period", "idle_token_period", "le", "the active token is not slower than the idle one"),
    ("heartbeat_period", "empty_scope_timeout", "lt", "an empty scope retires after some ticks"),
    ("park", "handover_wait", "lt", "a thread waiting for the lead gets it within its wait"),
    ("park", "park_most", "le", "the I/O thread's looks only grow rarer"),
    ("park", "hole_delay", "le", "what a member forwards pauses no longer than a hole waits"),
    ("lost_hole_delay", "hole_delay", "le", "evidence of loss only hastens a NAK"),
    ("hole_delay", "tail_fallback", "lt", "a tail is asked for after holes are"),
    ("tail_fallback", "tail_fallback_max", "le", "the bound past which anything goes"),
    ("tail_fallback_max", "tail_pause_max", "le", "learned pauses only lengthen the bound"),
    ("tail_pause_max", "tail_patience", "lt", "tail NAKs run a while before they give up"),
    ("agent_ping_timeout", "agent_replace_after", "lt", "a ping is answered before an agent moves"),
    ("probe_spacing", "probe_listen", "lt", "listeners wait for the next probe datagram"),
    ("probe_listen", "probe_stale", "lt", "a listener lives through a probe"),
    ("policy_timeout", "policy_startup", "le", "an actor's first start takes longest"),
    ("agent_status_timeout", "status_budget", "lt", "agents answer within a status"),
]

TIMING = Timing().check()
CLUSTER_TIMING = tuple(f.name for f in fields(Timing) if f.metadata["cluster"])


def cluster_defaults() -> dict[str, float]:
    """The cluster timing settings with their defaults."""
    return {name: getattr(TIMING, name) for name in CLUSTER_TIMING}


def check_cluster(settings: dict) -> None:
    """Raise InvalidConfig unless the cluster timing `settings` (a subset of CLUSTER_TIMING)
    fit together with every other knob."""
    from dataclasses import replace

    unknown = set(settings) - set(CLUSTER_TIMING)
    if unknown:
        raise InvalidConfig(f"unknown timing settings {sorted(unknown)}")
    replace(TIMING, **settings).check()


def table() -> str:
    """The knobs as the Markdown table docs/settings.md shows."""
    rows = ["| knob | default (s) | cluster setting | what it times |", "|---|---|---|---|"]
    for f in fields(Timing):
        rows.append(f"| `{f.name}` | {f.default:g} | {'yes' if f.metadata['cluster'] else ''} "
                    f"| {f.metadata['doc']} |")
    return "\n".join(rows)
