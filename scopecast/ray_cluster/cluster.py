"""`connect()` and the `Cluster` facade: attach to (or start) Ray, deploy the scope managers,
and hand out publishers and subscribers."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import ray

from scopecast.actors import declare, ray_private
from scopecast.actors.errors import InvalidConfig, NotConnected
from scopecast.netio import wire
from scopecast.netio.auth import ENCRYPTING
from scopecast.netio.pubsub import (
    Publisher,
    Subscriber,
    close_publishers,
    on_loop,
    running_loop,
)
from scopecast.netio.runtime import RuntimeConfig
from scopecast.netio.topic_names import check_subscription, name_filter
from scopecast.netio.transport import TransportConfig
from scopecast.policies import trust
from scopecast.policies.registry import PluginRef, collect, digest
from scopecast.ray_cluster import metrics, publisher_pool
from scopecast.scopes.cluster_manager import ClusterScopeManager
from scopecast.scopes.controlled_element import CALL_TIMEOUT, ControlledElement, call, cluster_config
from scopecast.scopes.paths import scope_actor
from scopecast.scopes.topics import TopicInfo

log = logging.getLogger(__name__)

# The Ray node a driver attaches to, when one machine holds several Ray nodes in network namespaces
# of their own: Ray prefers the head's raylet, and a driver inside another host would bind its
# members to an address its namespace does not have. `scopecast cluster local` puts the map of its
# hosts (network namespace inode=node address, comma-separated) in the environment of every
# process it starts, and the processes those start inherit it, whichever host they end up in.
NODE_IPS_ENV = "SCOPECAST_NODE_IPS"


def namespace_node_ip(environ=os.environ) -> str | None:
    """This process's Ray node address from NODE_IPS_ENV, by its network namespace; None when
    the variable is unset or does not name this namespace."""
    hosts = environ.get(NODE_IPS_ENV)
    if not hosts:
        return None
    try:
        mine = os.readlink("/proc/self/ns/net").partition("[")[2].rstrip("]")
    except OSError:
        return None
    for entry in hosts.split(","):
        inode, _, address = entry.partition("=")
        if inode == mine and address:
            return address
    return None

EMBEDDED_OBJECT_STORE = 1 << 30
WORKER_REGISTER_TIMEOUT = 300
RAY_CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # where `ray start` records its address


def embedded_ray_options() -> dict:
    """How an embedded local Ray is started: more logical CPUs than cores (our actors and Spark's
    executors must never starve each other), a capped object store, everything on loopback, and
    worker processes waited for: a burst of actors on a small machine can take more than Ray's
    60 s to register, and Ray then starts them again, adding load to a machine already short of
    it."""
    cores = os.cpu_count() or 2
    # address="local": a new Ray even when `ray start` left an address behind (Ray would attach)
    return dict(address="local", num_cpus=max(8, 4 * cores),
                object_store_memory=EMBEDDED_OBJECT_STORE,
                include_dashboard=False, _node_ip_address="127.0.0.1",
                namespace=declare.NAMESPACE, logging_level=logging.WARNING,
                _system_config={"worker_register_timeout_seconds": WORKER_REGISTER_TIMEOUT})


def connect(address: str | None = None, *, config: RuntimeConfig | None = None,
            start: bool = True, mac: str = "gmac", encrypt: bool = False,
            interface: str | None = None,
            name: str | None = None, settings: dict | None = None,
            levels: list[str] | None = None, trusted_keys: list[str] | None = None,
            datagram_bytes: int | None = None, max_message_bytes: int | None = None,
            credential: str | None = None) -> Cluster:
    """Attach to the running Ray (or `address`, or `RAY_ADDRESS`), else start an embedded one.

    Deploys the cluster scope manager if it is not there yet (`mac` chooses the packet authenticator of a
    cluster deployed now, "gmac" or "hmac-sha256"; `encrypt` makes it encrypt every datagram's
    payload and control body with AES-256-GCM under the cluster key, and attaching with it to a
    cluster that does not raises InvalidConfig; `interface` the address its members use for multicast,
    default loopback for an embedded Ray and each node's own address otherwise). `settings` sets the
    cluster settings of a cluster deployed now: failure detection, the recovery token's periods, how
    long an empty user scope lives, and when a slow consumer is demoted (docs/settings.md lists them
    with their defaults; a value that does not fit the others raises InvalidConfig), and `levels` the
    Ray node labels that group its hosts, top first, the last one the LAN (default: one LAN). `name`
    names this process's member in its scopes (default host:pid). `trusted_keys` (Ed25519 public
    keys, PEM text or file paths) make a cluster deployed now accept only plug-ins signed by one of
    them. `datagram_bytes` sets the datagram size of a cluster deployed now for every member that
    does not set its own (default: each member's interface MTU, 64 KB on loopback; up to 65000 lets
    the kernel fragment datagrams inside a LAN, several messages per datagram even of 1 KB, where IP
    fragments pass and frames are seldom lost). `max_message_bytes` sets the largest message of a
    cluster deployed now (default 16 MiB): every member applies it, and a process whose `config`
    asks for another gets InvalidConfig. `credential` (a token from `Cluster.issue_credential`,
    or `scopecast credential issue`) limits this process's members to the topics it lets them
    publish and subscribe to: others raise PermissionDenied (default: the SCOPECAST_CREDENTIAL
    environment variable, if set). With `start=False`, raise
    `NotConnected` instead of starting an embedded Ray or deploying."""
    if datagram_bytes is not None:
        TransportConfig(datagram_bytes=datagram_bytes)  # InvalidConfig when out of range
    if max_message_bytes is not None:
        RuntimeConfig(max_message_bytes=max_message_bytes)  # InvalidConfig when out of range
    if encrypt:
        if mac not in ("gmac", ENCRYPTING):
            raise InvalidConfig(f"encrypt=True is AES-256-GCM, which authenticates too: it does "
                                f"not combine with mac={mac!r}")
        mac = ENCRYPTING
    owns_ray = attach_ray(address, start)
    ray_private.preload_log_thread_imports()  # (a driver that called ray.init itself, too)
    ray_private.route_console_notices()
    # an embedded Ray ends with this process, and so does its cluster: its root keeps its state
    # (topics, members, keys) in a directory of its own, not in $SCOPECAST_HOME, which belongs to
    # persistent clusters (`scopecast up`); a fresh embedded cluster starts empty
    home = Path(tempfile.mkdtemp(prefix="scopecast-embedded-")) if owns_ray else None
    if start:
        manager = declare.get_or_create(
            ClusterScopeManager, declare.CLUSTER_SCOPE_MANAGER,
            interface=interface or ("127.0.0.1" if owns_ray else None), mac=mac,
            state=str(home / "state.db") if home else None, settings=settings, levels=levels,
            trusted_keys=[_pem(k) for k in trusted_keys or ()], datagram_bytes=datagram_bytes,
            max_message_bytes=max_message_bytes)
    else:
        manager = declare.lookup(declare.CLUSTER_SCOPE_MANAGER)
        if manager is None:
            raise NotConnected("Ray is running but scopecast is not deployed on it: run "
                               "`scopecast up --address ADDR`")
    hello = call(manager.hello)
    wire.check_version(hello.get("wire_version"), "the cluster")  # IncompatibleVersion
    cluster_config(config, hello)  # a limit other than the cluster's: InvalidConfig now
    if encrypt and hello.get("mac") != ENCRYPTING:
        raise InvalidConfig(f"this cluster does not encrypt (it was deployed with "
                            f"mac={hello.get('mac')}): deploy it afresh with encrypt=True "
                            "(`scopecast up --encrypt`)")
    return Cluster(manager, hello, owns_ray, config, name, embedded_home=home,
                   credential=credential or os.environ.get("SCOPECAST_CREDENTIAL") or None)


def _pem(key: str) -> str:
    """PEM text of a public key given as text or as a file path."""
    return key if key.lstrip().startswith("-----") else Path(key).read_text()


def attach_ray(address: str | None = None, start: bool = True) -> bool:
    """Make this process a Ray driver (unless it is one, or a Ray worker, already): attach to
    `address`, `RAY_ADDRESS` or the Ray started on this machine, else start an embedded Ray when
    `start`. Returns True if it started Ray."""
    if ray.is_initialized():
        return False
    target = address if address not in (None, "auto") else (
        os.environ.get("RAY_ADDRESS") or address)
    if target in (None, "auto"):
        local = local_ray_address()
        if local is not None and reachable(local):
            target = local
        elif target is None and not start:
            raise NotConnected("no Ray cluster to attach to: run `scopecast up` first, or pass "
                               "--address / set RAY_ADDRESS")
        # "auto" with no address recorded: Ray's own search for a running head decides
    if target:
        check_reachable(target)
        ray_private.use_token_if_present()
        try:
            ray.init(address=target, namespace=declare.NAMESPACE, logging_level=logging.WARNING,
                     _node_ip_address=namespace_node_ip())
        except ConnectionError as exc:
            raise NotConnected(f"no Ray cluster at {target}: {exc}. Start one with "
                               "`scopecast up`") from None
        return False
    with ray_private.quiet_token_notice():  # (Ray's WARNING that it turned token auth on)
        ray.init(**embedded_ray_options())
    log.info("started an embedded local Ray")
    return True


def local_ray_address() -> str | None:
    """The address of the Ray most recently started on this machine (`ray start` records it),
    if any."""
    try:
        return Path(RAY_CURRENT_CLUSTER).read_text().strip() or None
    except OSError:
        return None


def reachable(address: str) -> bool:
    try:
        check_reachable(address, timeout=1.0)
    except NotConnected:
        return False
    return True


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast: InvalidConfig for an address that is not a Ray cluster's HOST:PORT (a Ray
    Client address included), NotConnected when nobody listens there (ray.init would keep
    retrying for a minute)."""
    if address.startswith("ray://"):
        raise InvalidConfig(
            f"Ray Client addresses ({address}) are not supported: members exchange UDP "
            "datagrams with each other, so a process that publishes or subscribes runs on a node "
            "of the cluster. Attach from a node with the cluster's HOST:PORT (e.g. "
            "127.0.0.1:6379), or run the code as a job (`scopecast pipeline submit`)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidConfig(f"a Ray address is HOST:PORT (the cluster's GCS address, e.g. "
                            f"127.0.0.1:6379), not {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise NotConnected(f"no Ray cluster at {address} ({exc.strerror or exc}). Start one with "
                           "`scopecast up`, or check --address / RAY_ADDRESS") from None


class Cluster:
    """A connection to a scopecast cluster. Publishers and subscribers created through it make
    this process a member; `shutdown()` leaves a cluster it attached to running."""

    def __init__(self, manager, hello: dict, owns_ray: bool,
                 config: RuntimeConfig | None = None, name: str | None = None,
                 embedded_home: Path | None = None, credential: str | None = None) -> None:
        self._manager = manager
        self._hello = hello
        self._owns_ray = owns_ray
        self._config = config
        self._name = name
        self._credential = credential
        self._elements: dict[str, ControlledElement] = {}  # scope path -> this process's member
        self._embedded_home = embedded_home  # an embedded cluster's state directory
        self._lock = threading.Lock()
        self._handles: list = []
        self._metrics = None  # this process's MetricsExporter, from its first member on

    @property
    def max_message_bytes(self) -> int:
        """The largest message this cluster's members publish and take."""
        return cluster_config(self._config, self._hello).max_message_bytes

    @property
    def address(self) -> str:
        """The Ray GCS address other processes pass to `connect(address=...)`."""
        return ray.get_runtime_context().gcs_address

    def _member(self, scope: str | None) -> ControlledElement:
        """This process's member in `scope` (default: its host's scope), made on first use; the
        scope and its missing ancestors are created under their parents."""
        with self._lock:
            if scope is None:
                path = call(self._manager.host_scope, ray.get_runtime_context().get_node_id())
            else:
                path = call(self._manager.ensure_scope, scope)
            element = self._elements.get(path)
            if element is None:
                handle = scope_actor(path)
                element = self._elements[path] = ControlledElement(
                    self._manager, handle, path, self._hello, self._config, name=self._name,
                    on_unused=self._leave, credential=self._credential)
                if self._metrics is None:  # (False: not in this process)
                    self._metrics = metrics.start(self._metric_sources) or False
            element.touch()
            return element

    def _metric_sources(self) -> list[tuple]:
        """This process's members for the metrics exporter: (scope, runtime, its publishers)."""
        with self._lock:
            elements = list(self._elements.items())
            pubs = [h for h in self._handles if isinstance(h, Publisher)]
        return [(path, e.runtime, [p for p in pubs if p.scope == path]) for path, e in elements]

    def _leave(self, element: ControlledElement) -> None:
        """This process's member in a scope had no publisher or subscriber there for a while
        (`controlled_element.IDLE_MEMBER_LINGER`): it leaves the scope (a later use joins again)."""
        with self._lock:  # (_member hands elements out under it, touching them; and a new
            if self._elements.get(element.scope) is not element or not element.lingered_out():
                return   # member of the same name waits until this one has left)
            del self._elements[element.scope]
            self._handles = [h for h in self._handles if not h.closed]
            log.info("leaving scope %r (member %d unused for %.0fs)", element.scope,
                     element.member_id, time.monotonic() - (element.unused_since or 0.0))
            element.close()

    # ------------------------------------------------------------------------------ topics

    def create_topic(self, name: str, policy: str = "tree", recovery: str = "token_ring",
                     root: str = "", exist_ok: bool = True,
                     options: dict | None = None, history: str = "from_join") -> TopicInfo:
        """Create a topic (idempotent for the same settings). `policy` lays its channels in every
        scope (tree, chain, star, lan_multicast, replicated); `root` is the scope path it is
        rooted at (default the cluster scope: members outside it cannot use it); `options` go to
        the policy (e.g. {"fanout": 3} for tree, {"replicas": 3} for replicated). `history` is
        what a subscriber that joins while a publisher streams gets: "from_join" (default)
        starts it at its join point, "cached" first replays what is not yet stable (held in
        the senders' and peers' repair caches)."""
        return call(self._manager.create_topic, name, policy, recovery, root, exist_ok, options,
                    history)

    def create_topics(self, names: list[str], policy: str = "tree", recovery: str = "token_ring",
                      root: str = "", exist_ok: bool = True, options: dict | None = None,
                      history: str = "from_join") -> list[TopicInfo]:
        """Create many topics of the same settings in one call (one write, one change handed
        down the hierarchy), in the order of `names`; see `create_topic`. Every name is checked
        before anything is created."""
        return call(self._manager.create_topics, list(names), policy, recovery, root, exist_ok,
                    options, history, timeout=max(60.0, len(names) / 2000))

    def topic(self, name: str) -> TopicInfo:
        return call(self._manager.topic, name)

    def update_topic(self, name: str, policy: str | None = None,
                     recovery: str | None = None) -> TopicInfo:
        """Switch a topic's forwarding policy or recovery protocol; starts a new session: publishers
        end the old one and continue in the new one (seq from 1) once every member knows it."""
        return call(self._manager.update_topic, name, policy, recovery)

    def set_topic_schema(self, name: str, schema: dict | None) -> TopicInfo:
        """Record what the topic's messages hold as `TopicInfo.schema` (a JSON object of at most
        64 KiB, e.g. what `publish_dataframe` records; None clears it)."""
        return call(self._manager.set_schema, name, schema)

    # ---------------------------------------------------------------------- administration

    def issue_credential(self, name: str, publish: list[str] = (),
                         subscribe: list[str] = ()) -> str:
        """A credential for `connect(credential=...)`: its holder's members may publish only to
        the topics named or matched by `publish`, and subscribe only to those of `subscribe`
        (as NATS subject permissions). Signed with a key derived from the cluster key: any scope
        manager of this cluster checks it, no other cluster takes it."""
        return call(self._manager.issue_credential, name, list(publish), list(subscribe))

    def rotate_key(self, wait: float = 0.0) -> dict:
        """Replace the cluster key without loss: a new key, under the next generation, reaches
        every scope, member process and recovery agent with what their scopes send them, in
        three steps, each once the whole hierarchy acknowledged the last: announced (accepted
        everywhere, the old key still seals), sealing (the new key seals, the old one is still
        accepted), retired (the old key refused). Credentials issued before stay valid. Waits
        up to `wait` seconds for the end; returns {"generation", "accepted", "step"}
        (`status()` shows the same under manager.keys). InvalidConfig while the last rotation
        is under way."""
        return call(self._manager.rotate_key, float(wait), timeout=CALL_TIMEOUT + wait)

    def configure_scope(self, path: str, policy: str | None = None,
                        recovery: str | None = None,
                        overrides: list[tuple[str, str | None, str | None]] | None = None,
                        cachers: int | None = None, partition: int | None = None
                        ) -> dict[str, dict]:
        """Administer scope `path` (e.g. "X/Q"; "" is the cluster scope): the forwarding policy
        and recovery protocol of the topics within it, as a default and as overrides
        `(pattern, policy, recovery)` tried in order (None: not set by this rule). This replaces
        the scope's settings as a whole; what is left unset is inherited, and nothing set clears
        them.

        Precedence, for each of the two choices: the nearest scope on the way up from where the
        topic is laid that sets it (its first matching override, then its default), else the
        topic's own. A scope's recovery protocol applies to reliable topics (a topic created
        with recovery="none" stays unreliable). Topics whose choices change start a new
        session; the settings persist with the cluster.

        `cachers` and `partition` set cooperative caching in the scope's recovery domains
        (QSM; the token_ring protocol's): the agents form partitions of `partition` (default 5)
        and only the first `cachers` of each (default all) keep peers' messages until stable
        to repair the others. Inherited like the rest. Returns every scope's settings."""
        return call(self._manager.configure_scope, path, policy, recovery,
                    [list(o) for o in overrides] if overrides is not None else None,
                    cachers, partition)

    def scope_settings(self) -> dict[str, dict]:
        """Every administered scope's settings, by path ("/" for the cluster scope)."""
        return call(self._manager.scope_settings)

    # ---------------------------------------------------------------------------- plug-ins

    def submit_plugin(self, path: str, sign: str | None = None) -> PluginRef:
        """Submit a plug-in (a `.py` file or a package directory with a `__scopecast_plugin__`
        manifest), signed with the Ed25519 private key file `sign` if given: the cluster checks
        the signature (if it trusts keys), validates the plug-in in a process of its own and keeps
        it by digest; topics then name it as `policy="name@version"` or `"sha256:<hex>"`."""
        files = collect(path)
        signature = trust.sign(digest(files), sign) if sign else None
        return call(self._manager.submit_plugin, files, signature, timeout=180.0)

    def plugins(self) -> list[dict]:
        """The plug-ins in the cluster's library (manifest, digest, size, submission time)."""
        return call(self._manager.plugins)

    def plugin(self, ref: str) -> dict:
        """One plug-in's record, with the topics that use it."""
        return call(self._manager.plugin, ref)

    def remove_plugin(self, ref: str) -> PluginRef:
        """Remove a plug-in from the library (refused while a topic uses it)."""
        return call(self._manager.remove_plugin, ref)

    def topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        """Every topic of the cluster, or those `names` name or match (patterns such as
        "flights/*")."""
        if isinstance(names, str):
            names = [names]
        if names is not None:
            names = list(names)
            name_filter(names)  # InvalidConfig here, not inside a Ray error
        return call(self._manager.topics_list, names)

    def delete_topic(self, name: str) -> None:
        call(self._manager.delete_topic, name)

    # -------------------------------------------------------------------------- membership

    def publisher(self, topic: str, scope: str | None = None) -> Publisher:
        """Publish to `topic` as a member of `scope` (a path such as "X/Q"; default this host's
        scope)."""
        return self.publishers([topic], scope)[0]

    def publishers(self, topics: list[str], scope: str | None = None) -> list[Publisher]:
        """One publisher per topic of `topics`, all of this process's member in `scope`: set up
        together (the scopes lay channels once for all of them, not once per topic)."""
        if isinstance(topics, str) or not topics:
            raise TypeError("publishers() takes a non-empty list of topic names")
        element = self._member(scope)
        names = list(topics)
        pubs = [Publisher(element, name, grant)
                for name, grant in zip(names, element.advertise(names), strict=True)]
        with self._lock:
            self._handles.extend(pubs)
        return pubs

    def close_publishers(self, pubs: list[Publisher], timeout: float = 10.0) -> None:
        """Close several publishers at once: one flush and one wait for their end markers, where
        closing them one by one waits for each (see `Publisher.close`)."""
        close_publishers(pubs, timeout)

    async def publisher_async(self, topic: str, scope: str | None = None) -> Publisher:
        """`publisher` for asyncio code: joining (calls to the scopes) runs on a worker thread,
        not the event loop."""
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.publisher, topic, scope))

    async def subscriber_async(self, topics: str | list[str], on_message=None,
                               role: str = "member", scope: str | None = None) -> Subscriber:
        """`subscriber` for asyncio code: joining runs on a worker thread, not the event loop;
        a coroutine `on_message` runs on this loop, one message at a time. Then
        `await sub.receive_async()` or `async for msg in sub`."""
        loop = asyncio.get_running_loop()
        if asyncio.iscoroutinefunction(on_message):
            on_message = on_loop(on_message, loop)
        return await loop.run_in_executor(
            None, functools.partial(self.subscriber, topics, on_message, role, scope))

    def subscriber(self, topics: str | list[str], on_message=None,
                   role: str = "member", scope: str | None = None) -> Subscriber:
        """Subscribe to topics by name or by pattern (`"flights/*"`: every topic of that form,
        existing or created later). `role="client"` makes a transient subscriber (thesis 3.2.2):
        nobody waits for it, so a slow client never holds publishers back, and it may miss
        messages it is too slow for. `scope` names the member's parent scope path ("X/Q"),
        created on first use; default this host's scope."""
        names = [check_subscription(n) for n in ([topics] if isinstance(topics, str)
                                                 else list(topics))]
        if asyncio.iscoroutinefunction(on_message):  # (before joining: refused, nothing to undo)
            on_message = on_loop(on_message, running_loop("a coroutine on_message runs on the "
                                                          "event loop that subscribes"))
        element = self._member(scope)
        sub = Subscriber(element, names, element.subscribe(names, role), on_message, role,
                         rows=self._row_stream)
        with self._lock:
            self._handles.append(sub)
        return sub

    def _row_stream(self, sub: Subscriber, timeout: float):
        from scopecast.ray_cluster.dataframe_rows import RowStream

        return RowStream(self, sub, timeout)

    def status(self, topics: bool = True) -> dict:
        """The cluster's scope state, plus this member's data-plane counters if it is one.
        `topics=False` leaves out what is per topic (the topic list becomes its length, scopes
        omit their layouts): at thousands of topics the whole document is too big to poll."""
        status = call(self._manager.status, topics)
        if self._elements:
            status["this_process"] = self.counters()
        return status

    def counters(self) -> dict:
        """Data-plane counters of this process's members, by scope path."""
        return {path: e.runtime.call_wait(e.runtime.snapshot)
                for path, e in list(self._elements.items())}

    def repair_times(self) -> list[float]:
        """The latest gap-to-repair times (ms, up to 4,096 per member) of this process's members:
        `counters()` gives each member's percentiles, and percentiles over many members need
        their times together."""
        return [ms for e in list(self._elements.values())
                for ms in e.runtime.call_wait(lambda rt=e.runtime: list(rt.recovery.repair_ms))]

    def shutdown(self) -> None:
        """Close this process's publishers and subscribers and leave; stop Ray only if we started it."""
        if self._metrics:
            self._metrics.stop()
        pubs = [h for h in self._handles if isinstance(h, Publisher)]
        try:
            close_publishers(pubs)
        except Exception as exc:
            log.warning("closing %d publisher(s) failed: %s", len(pubs), exc)
        for handle in reversed(self._handles):
            try:
                handle.close()
            except Exception as exc:
                log.warning("closing %r failed: %s", handle, exc)
        self._handles.clear()
        with self._lock:  # (an element may be leaving by itself: IDLE_MEMBER_LINGER)
            elements = list(self._elements.values())
            self._elements.clear()
        for element in elements:
            element.close()
        if ray.is_initialized():
            publisher_pool.release_all()  # publish_dataframe's warm publishers
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            if self._embedded_home is not None:  # (the cluster ended with its Ray)
                shutil.rmtree(self._embedded_home, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
