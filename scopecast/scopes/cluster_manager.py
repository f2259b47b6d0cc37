"""The cluster (root) scope manager: topics, sessions, the member directory, the hierarchy.

The root is a `ScopeManager` like any other for layout (its members are the LAN scopes and any
user scopes at the top), plus what only the root holds, durably in SQLite (`scopes.state`) so that
Ray restarting the actor loses nothing: the cluster key and settings, topics and their session
numbers, and the *member directory* — member ids (cluster-wide, never reused) with the name and
address of each member process, which members consult to recognise datagrams from peers in other
scopes. The directory is an address book, not scope state: the root's views and channels name only
its own members. Child scopes re-report within a heartbeat after a restart.

It also deploys the default hierarchy from configuration: `levels` names the Ray node labels
that group hosts, top first, the last one being the LAN (e.g. ["datacenter", "lan"]: scopes
`<datacenter>/<lan>/host-<node>`); by default a host is in the LAN its node's `scopecast-lan` label
names (`scopecast cluster local` labels its nodes so), else in "lan0". Each alive Ray node gets a
host scope pinned to it; nodes that join later get theirs within a few heartbeats.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from dataclasses import replace
from pathlib import Path

import ray

from scopecast.actors import declare
from scopecast.actors.errors import InvalidConfig, TopicExists, TopicNotFound
from scopecast.agents.builtin import RECOVERY_NAMES
from scopecast.netio import wire
from scopecast.netio.auth import AUTHENTICATORS, new_cluster_key
from scopecast.netio.runtime import DEFAULT_MAX_MESSAGE, RuntimeConfig
from scopecast.netio.topic_names import check_subscription, check_topic_name, name_filter
from scopecast.policies.builtin import BUILTIN_POLICIES
from scopecast.policies.library import PluginLibrary, ref_of
from scopecast.policies.registry import PluginRef
from scopecast.scopes import credentials, plugin_check
from scopecast.scopes.key_rotation import KeyRotation
from scopecast.scopes.paths import check_scope_path, parent_path, scope_actor, scope_actor_name
from scopecast.scopes.placement import PLUGIN_PREFIX, pinned
from scopecast.scopes.scope_admin import (
    ADMIN_VERSION,
    FALLBACK_RECOVERY,
    Choice,
    ScopeAdmin,
    ScopeChoices,
)
from scopecast.scopes.scope_manager import DEFAULT_SETTINGS, STATUS_BUDGET, ScopeManager
from scopecast.scopes.state import ScopeStore
from scopecast.scopes.state_mirror import StateMirror
from scopecast.scopes.topics import HISTORIES, TopicInfo
from scopecast.timing import CLUSTER_TIMING, TIMING, check_cluster

log = logging.getLogger(__name__)

DEFAULT_LAN = "lan0"
LAN_LABEL = "scopecast-lan"  # the Ray node label naming a host's LAN when no `levels` are set
NODE_CHECK_PERIOD = TIMING.node_check_period
MAX_SCHEMA_BYTES = 64 << 10  # a topic's recorded schema, as JSON
MAX_TOPICS_PER_CALL = 1_000_000
RETIRE_WAIT = TIMING.retire_wait


class ClusterScopeManager(ScopeManager):
    """Root scope of a scopecast cluster (an async Ray actor; see `scopecast.actors.declare`)."""

    def __init__(self, interface: str | None = None, mac: str = "gmac",
                 state: str | None = None, settings: dict | None = None,
                 levels: list[str] | None = None, trusted_keys: list[str] | None = None,
                 datagram_bytes: int | None = None, max_message_bytes: int | None = None) -> None:
        super().__init__("", "cluster", None)
        if mac not in AUTHENTICATORS:
            raise InvalidConfig(f"unknown packet authenticator {mac!r}; choose one of "
                                f"{', '.join(AUTHENTICATORS)}")
        self._datagram_bytes = datagram_bytes  # None: each member's from its interface MTU
        self._store = ScopeStore(Path(state) if state else None, mirror=StateMirror())
        cluster = self._store.get("cluster")
        if cluster is None:
            rng = random.SystemRandom()
            prefix = rng.getrandbits(10)
            cluster = {"id": rng.getrandbits(48), "key": new_cluster_key().hex(), "mac": mac,
                       "group_prefix": [239, 192 + (prefix >> 8), prefix & 0xFF],
                       "port": 40000 + rng.randrange(10000), "settings": {}}
            self._store.put("cluster", cluster)
        elif cluster["mac"] != mac:
            log.warning("state %s was created with mac=%s; keeping it (asked for %s)",
                        self._store.path, cluster["mac"], mac)
        if settings:
            _check_settings(settings)
            cluster["settings"] = {**cluster.get("settings", {}), **settings}
            self._store.put("cluster", cluster)
        if max_message_bytes is not None:  # kept: every member applies it (controlled_element)
            cluster["max_message_bytes"] = RuntimeConfig(
                max_message_bytes=max_message_bytes).max_message_bytes  # (InvalidConfig)
            self._store.put("cluster", cluster)
        self._max_message = cluster.get("max_message_bytes", DEFAULT_MAX_MESSAGE)
        if trusted_keys:  # kept: a restarted root trusts the same keys
            cluster["trusted_keys"] = sorted(set(cluster.get("trusted_keys", [])) |
                                             set(trusted_keys))
            self._store.put("cluster", cluster)
        self._cluster_id = cluster["id"]
        self.rotation = KeyRotation(self._store, self._take_keys, self.check)
        self.downlink.take_keys(self.rotation.keys)
        self._mac = cluster["mac"]
        self._interface = interface
        self._levels = list(levels or [])
        self.settings.update({**cluster.get("settings", {}), "group_prefix":
                              cluster["group_prefix"], "port": cluster["port"]})
        fields = set(TopicInfo.__dataclass_fields__)
        self.topics.table.load({str(t["id"]): {k: v for k, v in t.items() if k in fields}
                                for t in self._store.topics()})
        self.topics.follow()
        self._directory = {m["id"]: m for m in self._store.members()}
        self._library = PluginLibrary(self._store, plugin_check.__name__,
                                      cluster.get("trusted_keys"))
        self._admins: dict[str, ScopeAdmin] = {}
        for path, body in self._store.scope_admins().items():
            try:
                self._admins[path] = ScopeAdmin.from_wire(body)
            except InvalidConfig as exc:  # (written by this code: only a hand-edited file)
                log.error("state %s: settings of scope %r ignored: %s", self._store.path,
                          path, exc)
        # recovery plug-ins found faulty: replaced everywhere (scope_admin), for good
        self._failed: dict[str, dict] = dict(self._store.get("failed_recovery") or {})
        self.choices.set(self._admins)
        self.choices.set_failed(self._failed)
        self._hosts_of: dict[str, str] = {}   # Ray node id -> host scope path
        self._last_node_check = 0.0
        self._making = asyncio.Lock()  # user scopes are made and retired one at a time
        log.info("cluster scope manager up: cluster %x, state %s, %d topics, %d members in the "
                 "directory", self._cluster_id, self._store.path, len(self.topics.by_id),
                 len(self._directory))

    # ------------------------------------------------------------------------------ cluster

    async def hello(self) -> dict:
        """Cluster key and transport settings, for a process that connects."""
        self._ensure_ticking()
        return {"cluster_id": self._cluster_id, "key": self.rotation.sealing,
                "keys": self.rotation.keys.to_wire(),
                "credential_key": self.rotation.credential_key,
                "interface": self._interface, "mac": self._mac,
                "datagram_bytes": self._datagram_bytes,
                "max_message_bytes": self._max_message, "wire_version": wire.VERSION}

    async def _root_call(self, method: str, *args):
        return await getattr(self, method)(*args)

    async def rotate_key(self, wait: float = 0.0) -> dict:
        """A new cluster key, without loss (scopes/key_rotation): {"generation", "accepted"}."""
        return (await self.rotation.rotate(wait)).describe()

    def _take_keys(self, keys) -> None:
        if self.downlink.take_keys(keys):
            self._kick()

    async def _on_tick(self) -> None:
        await super()._on_tick()
        self.rotation.resume()  # (a root restarted mid-rotation)
        if time.monotonic() - self._last_node_check > NODE_CHECK_PERIOD:
            self._last_node_check = time.monotonic()
            self._deploy_hosts()

    # ------------------------------------------------------------------------ the hierarchy

    async def host_scope(self, node_id: str) -> str:
        """The path of the host scope of a Ray node (deployed now if it is new), once its scope
        manager is up."""
        if node_id not in self._hosts_of:
            self._deploy_hosts()
        path = self._hosts_of.get(node_id)
        if path is None:
            raise InvalidConfig(f"Ray node {node_id[:12]} is not alive in this cluster")
        await _started(path)
        return path

    async def ensure_scope(self, path: str) -> str:
        """Create the scope `path` and its missing ancestors (user scopes); returns the path."""
        path = check_scope_path(path)
        parts = path.split("/") if path else []
        async with self._making:
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                if not any(h == sub or h.startswith(sub + "/") for h in self._hosts_of.values()):
                    _deploy(sub, "user")  # (the default hierarchy's scopes are deployed as such)
            await _started(path)
        return path

    async def retire_scope(self, path: str, incarnation: int) -> bool:
        """End the scope manager of an empty user scope that asks to retire (see
        `ScopeManager.retire`); a member naming it meanwhile keeps it (the lock orders this
        with `ensure_scope`: the scope is either started again first, or made anew after)."""
        async with self._making:
            handle = await asyncio.to_thread(declare.lookup, scope_actor_name(path))
            if handle is None:
                return False
            try:
                if not await asyncio.wait_for(handle.retire.remote(incarnation), RETIRE_WAIT):
                    return False
            except asyncio.TimeoutError:  # it may have retired: ended all the same (a member
                pass                      # that joined meanwhile has it made again)
            ray.kill(handle, no_restart=True)
            await _ended(handle)
        return True

    def _deploy_hosts(self) -> None:
        for node in ray.nodes():
            if not node.get("Alive") or node["NodeID"] in self._hosts_of:
                continue
            labels = node.get("Labels") or {}
            parts = [check_scope_path(str(labels.get(key) or f"{key}0")) for key in self._levels] \
                or [check_scope_path(str(labels.get(LAN_LABEL) or DEFAULT_LAN))]
            for i in range(1, len(parts) + 1):
                _deploy("/".join(parts[:i]), "lan" if i == len(parts) else "level")
            host = "/".join(parts + [f"host-{node['NodeID'][:8]}"])
            _deploy(host, "host", pinned(node["NodeID"]))
            self._hosts_of[node["NodeID"]] = host
            log.info("host scope %s deployed on node %s", host, node["NodeID"][:12])

    # ------------------------------------------------------------------------ the directory

    async def allocate_member(self, name: str, host: str, port: int, pid: int, node: str,
                              scope: str, member_id: int = 0,
                              publish: list[str] | None = None) -> int:
        """A cluster-wide member id (the old one for a member registering again); `publish`:
        the topics its credential lets it publish to (None: any)."""
        old = self._directory.get(member_id)
        if not (old and old["name"] == name and old["pid"] == pid):
            member_id = self._store.next_id("member")
        entry = {"id": member_id, "name": name, "host": host, "port": port, "pid": pid,
                 "node": node, "scope": scope,
                 "publish": None if publish is None else list(publish)}
        self._directory[member_id] = entry
        self._store.put_member(member_id, entry)
        return member_id

    async def release_member(self, member_id: int) -> None:
        if self._directory.pop(member_id, None) is not None:
            self._store.delete_member(member_id)

    async def lookup_members(self, ids: list[int]) -> list[list]:
        """Name, address and publish permission (None: any topic) of the members `ids` (those
        the directory knows)."""
        out = []
        for i in ids[:1024]:
            m = self._directory.get(i)
            if m is not None:
                out.append([m["id"], m["name"], m["host"], m["port"], m.get("publish")])
        return out

    async def issue_credential(self, name: str, publish: list[str],
                               subscribe: list[str]) -> str:
        """A credential's token (`scopes/credentials`): its holder may publish to `publish` and
        subscribe to `subscribe` (topic names and patterns) only."""
        token = credentials.issue(self.rotation.credential_key, name, list(publish),
                                  list(subscribe))
        log.info("credential %r issued (%s): publish %s, subscribe %s", name,
                 credentials.digest(token), list(publish), list(subscribe))
        return token

    # ------------------------------------------------------------------------------- topics

    async def create_topic(self, name: str, policy: str = "tree", recovery: str = "token_ring",
                           root: str = "", exist_ok: bool = True,
                           options: dict | None = None, history: str = "from_join") -> TopicInfo:
        return (await self.create_topics([name], policy, recovery, root, exist_ok, options,
                                         history))[0]

    async def create_topics(self, names: list[str], policy: str = "tree",
                            recovery: str = "token_ring", root: str = "",
                            exist_ok: bool = True, options: dict | None = None,
                            history: str = "from_join") -> list[TopicInfo]:
        """Create topics of the same settings in one call: one write to the state database and
        one change of the table for all of them. A topic that exists with these settings is
        returned as it is (TopicExists if with others, or if not `exist_ok`), checked for every
        name before anything is created."""
        if isinstance(names, str) or not isinstance(names, list | tuple) \
                or len(names) > MAX_TOPICS_PER_CALL:
            raise InvalidConfig(f"create_topics takes a list of at most {MAX_TOPICS_PER_CALL} "
                                "topic names")
        names = list(dict.fromkeys(check_topic_name(n) for n in names))
        plugin = self._plugin_digest(policy, "policy")
        recovery_plugin = self._plugin_digest(recovery, "recovery")
        if history not in HISTORIES:
            raise InvalidConfig(f"unknown history {history!r}: {' or '.join(HISTORIES)}")
        root = check_scope_path(root)
        for name in names:
            existing = self.topics.by_name.get(name)
            if existing is not None and (not exist_ok or (
                    existing.policy, existing.recovery, existing.history)
                    != (policy, recovery, history)):
                raise TopicExists(f"topic {name!r} exists with policy={existing.policy!r}, "
                                  f"recovery={existing.recovery!r}, history={existing.history!r}")
        new = [n for n in names if n not in self.topics.by_name]
        first = self._store.next_id("topic", len(new)) if new else 0
        made = [TopicInfo(name=name, id=first + i, policy=policy, recovery=recovery,
                          history=history, root=root, session=1, plugin=plugin,
                          recovery_plugin=recovery_plugin, options=dict(options or {}))
                for i, name in enumerate(new)]
        self._save(*made)
        if len(made) == 1:
            log.info("topic %s created (id %d, policy %s, root %r)", made[0].name, made[0].id,
                     policy, root)
        elif made:
            log.info("%d topics created (ids %d-%d, policy %s, root %r)", len(made), first,
                     made[-1].id, policy, root)
        return [self.topics.by_name[n] for n in names]

    async def update_topic(self, name: str, policy: str | None = None,
                           recovery: str | None = None) -> TopicInfo:
        """Change a topic's policy or recovery protocol; this starts a new session (3.2.7):
        publishers move to it once every member knows it, ending the old one."""
        info = await self.topic(name)
        policy = policy or info.policy
        recovery = recovery or info.recovery
        info = replace(info, policy=policy, recovery=recovery,
                       plugin=self._plugin_digest(policy, "policy"),
                       recovery_plugin=self._plugin_digest(recovery, "recovery"),
                       session=info.session + 1)
        self._save(info)
        log.info("topic %s: session %d (policy %s, recovery %s)", name, info.session, policy,
                 recovery)
        return info

    async def set_schema(self, name: str, schema: dict | None) -> TopicInfo:
        """Record what the topic's messages hold (`TopicInfo.schema`, e.g. the Spark schema of the
        DataFrame published to it; None clears it): a JSON object of at most MAX_SCHEMA_BYTES."""
        info = await self.topic(name)
        if schema is not None:
            if not isinstance(schema, dict):
                raise InvalidConfig(f"a topic schema is a dict, not {type(schema).__name__}")
            try:
                size = len(json.dumps(schema))
            except (TypeError, ValueError) as exc:
                raise InvalidConfig(f"topic {name!r}: the schema must be JSON ({exc})") from None
            if size > MAX_SCHEMA_BYTES:
                raise InvalidConfig(f"topic {name!r}: schema of {size} bytes as JSON exceeds "
                                    f"{MAX_SCHEMA_BYTES}; record a smaller description")
        info = replace(info, schema=schema)
        self._save(info)
        return info

    def _save(self, *infos: TopicInfo) -> None:
        """Keep topics (new or changed) and hand them down: one transaction, one table change."""
        bodies = [(info.name, info.id, info.to_dict()) for info in infos]
        self._store.put_topics(bodies)
        for _name, tid, body in bodies:
            self.topics.table.change(str(tid), body)
        self._table_changed({str(tid) for _n, tid, _b in bodies})
        self._kick()

    async def topic(self, name: str) -> TopicInfo:
        info = self.topics.by_name.get(name)
        if info is None:
            raise TopicNotFound(name)
        return info

    async def topics_list(self, names: list[str] | None = None) -> list[TopicInfo]:
        """Every topic, or those `names` name or match (a caller polling a few topics in a
        cluster of thousands gets only those)."""
        topics = self.topics.by_id.values()
        if names is not None:
            wanted = name_filter(names)
            topics = [t for t in topics if wanted(t.name)]
        return sorted(topics, key=lambda t: t.id)

    async def delete_topic(self, name: str) -> None:
        info = await self.topic(name)
        self._store.delete_topic(name)
        self.topics.table.change(str(info.id), None)
        self._table_changed({str(info.id)})
        self._kick()

    # ----------------------------------------------------------------------- administration

    async def configure_scope(self, path: str, policy: str | None = None,
                              recovery: str | None = None,
                              overrides: list | None = None, cachers: int | None = None,
                              partition: int | None = None) -> dict:
        """Set scope `path`'s administration as a whole (`scope_admin`): a default policy and
        recovery protocol for the topics within it, and overrides [(pattern, policy, recovery)]
        in order, and the caching of its recovery domains (`cachers` of each `partition` of
        agents keep peers' messages until stable; token_ring's options); what is left unset is
        inherited, and nothing set clears the scope's settings.
        Every topic the scope's subtree takes part in whose choice changes there starts a new
        session (3.2.7), as `update_topic` does (a topic used nowhere there has nothing to
        switch). Returns every scope's settings."""
        path = check_scope_path(path)
        if overrides is not None and not isinstance(overrides, list | tuple):
            raise InvalidConfig("overrides are a list of (pattern, policy, recovery)")
        rules = []
        for item in overrides or ():
            if not isinstance(item, list | tuple) or len(item) != 3:
                raise InvalidConfig(f"an override is (pattern, policy, recovery), not {item!r:.80}")
            pattern, p, r = item
            check_subscription(pattern)
            if p is None and r is None:
                raise InvalidConfig(f"override {pattern!r} sets neither policy nor recovery")
            rules.append([pattern, self._choice(p, r).to_wire()])
        admin = ScopeAdmin.from_wire({"v": ADMIN_VERSION,
                                      "default": self._choice(policy, recovery).to_wire(),
                                      "overrides": rules,
                                      **({"cachers": cachers} if cachers is not None else {}),
                                      **({"partition": partition} if partition is not None
                                         else {})})
        paths = {p for p in self._admins.keys() | {path}
                 if p == path or p.startswith(path + "/") or path == ""}

        def change() -> None:
            if admin.empty:
                self._admins.pop(path, None)
            else:
                self._admins[path] = admin
            self._store.put_scope_admin(path, None if admin.empty else admin.to_wire())
            self.choices.set(self._admins)
        changed = self._new_sessions(paths, change, await self._used_in(paths))
        log.info("scope %r: administration set to %s; %d topics in a new session", path,
                 admin.describe(), changed)
        return await self.scope_settings()

    async def recovery_failed(self, protocol: str, scope: str, why: str) -> None:
        """A scope found recovery plug-in `protocol` ("sha256:<hex>") faulty: it is replaced by
        the fallback protocol everywhere, for good (status `failed_recovery` says why), and its
        topics start a new session."""
        if protocol in self._failed or not protocol.startswith(PLUGIN_PREFIX):
            return
        record = {"scope": scope or "/", "why": str(why)[:400], "at": time.time()}

        def change() -> None:
            self._failed[protocol] = record
            self._store.put("failed_recovery", self._failed)
            self.choices.set_failed(self._failed)
        changed = self._new_sessions(self._admins.keys() | {""}, change)
        log.error("recovery protocol %s failed in scope %r (%s): replaced by %s; %d topics in a "
                  "new session", protocol[:23], scope or "/", why, FALLBACK_RECOVERY, changed)

    async def _used_in(self, paths: set[str]) -> set[int] | None:
        """The topics the subtrees of `paths` take part in (None: not known, a scope there did
        not answer); a scope not running has none."""
        used: set[int] = set()
        for path in paths:
            if path == "":
                used.update(await self.used_topics())
                continue
            try:
                handle = await asyncio.to_thread(scope_actor, path)
            except ValueError:  # not running: nothing there to switch
                continue
            try:
                used.update(await asyncio.wait_for(handle.used_topics.remote(),
                                                   self.settings["scope_timeout"]))
            except Exception as exc:  # slow or restarting: every changed topic, to be safe
                log.warning("scope %r did not say which topics it uses: %r", path, exc)
                return None
        return used

    def _new_sessions(self, paths: set[str], change, used: set[int] | None = None) -> int:
        """Run `change()` (of the scopes' settings or the failed protocols); every topic (of
        `used`, if given) whose policy or recovery chain it changes at any of `paths` starts a
        new session (3.2.7). Returns how many."""
        before = {p: self._keys_at(p) for p in paths}
        change()
        changed = set()
        for p, keys in before.items():
            now = self._keys_at(p)
            changed.update(tid for tid, k in keys.items() if now.get(tid) != k
                           and (used is None or tid in used))
        self._save(*(replace(self.topics.by_id[tid], session=self.topics.by_id[tid].session + 1)
                     for tid in sorted(changed)))  # (it lays the channels again)
        return len(changed)

    def _choice(self, policy: str | None, recovery: str | None) -> Choice:
        """The names with their plug-ins' digests (ScopeAdmin.from_wire checks the rest)."""
        return Choice(policy, recovery,
                      self._plugin_digest(policy, "policy") if policy else "",
                      self._plugin_digest(recovery, "recovery") if recovery else "")

    def _keys_at(self, path: str) -> dict[int, tuple[str, str]]:
        """Each topic's (policy key, recovery chain) at scope `path`."""
        choices = ScopeChoices(path)
        choices.set(self._admins)
        choices.set_failed(self._failed)
        return {tid: choices.keys(info) for tid, info in self.topics.by_id.items()}

    async def scope_settings(self) -> dict[str, dict]:
        """Every administered scope's settings, by path ("/" for the cluster scope)."""
        return {p or "/": a.describe() for p, a in sorted(self._admins.items())}

    # ----------------------------------------------------------------------------- plug-ins

    def _plugin_digest(self, ref: str, kind: str) -> str:
        """"" for a built-in forwarding policy or recovery protocol (`kind`), else the digest of
        the plug-in of that kind `ref` names."""
        builtins, what = ((BUILTIN_POLICIES, "forwarding policy") if kind == "policy"
                          else (RECOVERY_NAMES, "recovery protocol"))
        if ref in builtins:
            return ""
        if not isinstance(ref, str) or ("@" not in ref and not ref.startswith("sha256:")):
            raise InvalidConfig(f"unknown {what} {ref!r}: built-ins are {', '.join(builtins)}; "
                                "a plug-in is named name@version or sha256:<hex>")
        record = self._library.find(ref)
        if record["kind"] != kind:
            raise InvalidConfig(f"{ref} is a {record['kind']} plug-in, not a {what}")
        return record["sha256"]

    async def submit_plugin(self, files: dict[str, bytes],
                            signature: bytes | None = None) -> PluginRef:
        """Check the plug-in's signature (when this cluster trusts keys), validate it in a
        process of its own and keep it in the library."""
        ref = await self._library.submit(files, signature)
        log.info("plug-in %s stored", ref)
        return ref

    async def plugins(self) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "module"} for r in self._library.records()]

    async def plugin(self, ref: str) -> dict:
        record = self._library.find(ref)
        return {**record, "used_by": self._used_by(record["sha256"])}

    async def plugin_files(self, sha: str) -> tuple[str, str, dict[str, bytes]]:
        """(module name, policy class, files) of the plug-in `sha`, for the scopes that run it."""
        record = self._library.find(f"sha256:{sha}")
        return record["module"], record["manifest"]["classes"][0], self._library.files(sha)

    async def remove_plugin(self, ref: str) -> PluginRef:
        record = self._library.find(ref)
        return self._library.remove(ref, self._used_by(record["sha256"]))

    def _used_by(self, sha: str) -> list[str]:
        """The topics, and the scopes (as "scope <path>"), whose settings name plug-in `sha`."""
        scopes = [f"scope {p or '/'}" for p, a in self._admins.items()
                  if any(sha in (c.plugin, c.recovery_plugin)
                         for c in (a.default, *(c for _, c in a.overrides)))]
        return [t.name for t in self.topics.by_id.values()
                if sha in (t.plugin, t.recovery_plugin)] + scopes

    async def status(self, topics: bool = True, budget: float = STATUS_BUDGET) -> dict:
        tree = await super().status(topics, budget)
        return {"cluster_id": f"{self._cluster_id:012x}",
                "uptime_s": round(time.time() - self._started, 1),
                "manager": {"pid": os.getpid(), "state": str(self._store.path), "mac": self._mac,
                            "keys": self.rotation.keys.describe(),
                            "state_generation": self._store.generation,
                            "state_restored_from_gcs": self._store.restored,
                            "state_mirror_failures": self._store.mirror_failures},
                "settings": {k: v for k, v in self.settings.items() if k in DEFAULT_SETTINGS},
                "topics": [self.topics.table.entries[k] for k in sorted(self.topics.table.entries, key=int)]
                if topics else len(self.topics.table.entries),
                "directory": len(self._directory), "trusted_keys": self._library.trusted,
                "scope_settings": await self.scope_settings(),
                "failed_recovery": {p: dict(r) for p, r in self._failed.items()},
                "plugins": [str(ref_of(r)) for r in self._library.records()], "scopes": tree}


def _deploy(path: str, kind: str, ray_options: dict | None = None) -> None:
    """Create the scope manager of `path` if it is not there (idempotent) and start it."""
    handle = declare.get_or_create(ScopeManager, scope_actor_name(path), path, kind,
                                   scope_actor_name(parent_path(path)), ray_options=ray_options)
    handle.start.remote()


async def _started(path: str) -> None:
    """Wait until the scope manager of `path` runs (a handle a caller gets from `ray.get_actor`
    before then may not know the actor's methods yet)."""
    await scope_actor(path).start.remote()


async def _ended(handle, timeout: float = 30.0) -> None:
    """Wait until a killed actor is dead (its name is free for a new one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await asyncio.wait_for(handle.__ray_ready__.remote(), 1.0)
        except ray.exceptions.RayActorError:
            return
        except asyncio.TimeoutError:
            pass
        await asyncio.sleep(0.1)
    log.warning("a retired scope manager did not end within %.0fs", timeout)


def _check_settings(settings: dict) -> None:
    for key, value in settings.items():
        if key not in DEFAULT_SETTINGS:
            raise InvalidConfig(f"unknown scope setting {key!r}; known: "
                                f"{', '.join(DEFAULT_SETTINGS)}")
        if not isinstance(value, (int, float)) or not 0 < value <= 3600:
            raise InvalidConfig(f"scope setting {key} must be a number in (0, 3600] (seconds; "
                                "slow_lag_mb in MiB)")
    # the timing the scopes will run with, checked with every other knob (scopecast.timing)
    check_cluster({k: v for k, v in {**DEFAULT_SETTINGS, **settings}.items()
                   if k in CLUSTER_TIMING})

