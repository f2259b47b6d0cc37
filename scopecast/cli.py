"""The `scopecast` command. It mirrors the Python API; commands other than `demo` attach to a
running cluster (`--address`, `RAY_ADDRESS`, or a Ray started on this machine) and fail with
NotConnected rather than start an embedded Ray."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from scopecast.actors.errors import ScopecastError
from scopecast.policies import trust
from scopecast.scopes.status import walk


def _connect(args):
    import scopecast

    return scopecast.connect(address=args.address or "auto", start=False)


def cmd_demo(args) -> int:
    from scopecast.ray_cluster import demo

    return demo.run(messages=args.messages, subscribers=args.subscribers)


def cmd_bench(args) -> int:
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "harness.py").exists():
        raise ScopecastError("the benchmark suite ships with the source tree: run `scopecast bench` "
                             "(or `make bench`) from a clone of the repository")
    sys.path.insert(0, str(root))
    from benchmarks import harness

    return harness.main(args.rest)


def cmd_up(args) -> int:
    from scopecast.ray_cluster import launch

    info = launch.up(address=args.address, port=args.port, mac=args.mac,
                     trusted_keys=args.trusted_key)
    how = "started a local Ray head and deployed" if info["started_ray"] else "deployed"
    print(f"scopecast {how} on Ray at {info['address']} (cluster {info['cluster_id']}, "
          f"state {info['state']})")
    print(f"attach with: scopecast status --address {info['address']}  |  "
          f"scopecast.connect(address={info['address']!r})  |  RAY_ADDRESS={info['address']}")
    return 0


def cmd_down(args) -> int:
    from scopecast.ray_cluster import launch

    info = launch.down(address=args.address, stop_ray=args.ray)
    print(f"removed {len(info['removed_actors'])} scopecast actors"
          + (f"; stopped {info['stopped_ray_processes']} Ray processes" if args.ray else
             " (Ray itself still runs; `scopecast down --ray` stops a head `scopecast up` "
             "started)"))
    return 0


def cmd_status(args) -> int:
    with _connect(args) as cluster:
        status = cluster.status()
        if args.json:
            print(json.dumps(status, indent=2, default=str))
        else:
            print(_status_text(status))
        return 0


def _status_text(status: dict) -> str:
    """The scope tree, one line per scope, member and channel."""
    lines = [f"cluster {status['cluster_id']}  (up {status['uptime_s']}s, state "
             f"{status['manager']['state']}, {status['directory']} members in the directory)",
             f"topics ({len(status['topics'])}):"]
    lines += [f"  {t['name']:<30} id={t['id']:<5} policy={t['policy']:<14} session={t['session']}"
              + (f" root={t['root']}" if t["root"] else "") for t in status["topics"]]
    lines.append("scopes:")
    for scope in walk(status):
        indent = "  " * (1 + (0 if scope["path"] == "/" else scope["path"].count("/") + 1))
        group = scope.get("multicast")
        lines.append(f"{indent}{scope['path']}  [{scope['kind']}, pid {scope['pid']}"
                     + (f", group {group[0]}:{group[1]}" if group else "") + "]")
        for tid, t in scope["topics"].items():
            if t["channels"] or t.get("error"):
                lines.append(f"{indent}  topic {tid} ({t['policy']}): "
                             + (", ".join(t["channels"]) or "-")
                             + (f"  ERROR {t['error']}" if t.get("error") else ""))
        for m in scope["members"]:
            lines.append(f"{indent}  member {m['name']} (id {m['id']}, {m['address']}, "
                         f"{m['role']}) pub={m['publishes']} sub={m['subscriptions']}")
            lines += [f"{indent}    sends {c['label']} -> {':'.join(map(str, c['endpoint'][1:3]))}"
                      for c in m["channels"]]
            lines += [f"{indent}    receives on {g}:{p}" for g, p in m["groups"]]
    return "\n".join(lines)


def cmd_topic(args) -> int:
    with _connect(args) as cluster:
        if args.action == "create":
            info = cluster.create_topic(args.name, policy=args.policy, recovery=args.recovery,
                                        root=args.root, history=args.history)
            print(f"{info.name} id={info.id} policy={info.policy} recovery={info.recovery} "
                  f"history={info.history}"
                  + (f" root={info.root}" if info.root else ""))
        elif args.action == "delete":
            cluster.delete_topic(args.name)
            print(f"deleted {args.name}")
        else:
            for t in cluster.topics():
                print(f"{t.name}\tid={t.id}\tpolicy={t.policy}\trecovery={t.recovery}")
        return 0


def cmd_plugin(args) -> int:
    if args.action == "keygen":  # local only: no cluster needed
        private, public = trust.keygen(args.target)
        print(f"private key {private} (keep it secret), public key {public} (give it to "
              f"`scopecast up --trusted-key`)")
        return 0
    with _connect(args) as cluster:
        if args.action == "submit":
            ref = cluster.submit_plugin(args.target, sign=args.sign)
            print(f"{ref.kind} {ref.name}@{ref.version} sha256:{ref.sha256}")
        elif args.action == "list":
            for p in cluster.plugins():
                print(f"{p['kind']:<9}{p['name']}@{p['version']:<12} sha256:{p['sha256']}  "
                      f"{p['bytes']} bytes")
        elif args.action == "show":
            print(json.dumps(cluster.plugin(args.target), indent=2, default=str))
        else:
            ref = cluster.remove_plugin(args.target)
            print(f"removed {ref.name}@{ref.version}")
        return 0


def cmd_publish(args) -> int:
    with _connect(args) as cluster:
        source = open(args.file, "rb") if args.file else sys.stdin.buffer
        count = 0
        with source, cluster.publisher(args.topic, scope=args.scope) as pub:
            for line in source:
                pub.publish(line.rstrip(b"\n"))
                count += 1
            pub.flush(timeout=args.timeout)
        print(f"published {count} messages to {args.topic}", file=sys.stderr)
        return 0


def cmd_subscribe(args) -> int:
    with _connect(args) as cluster:
        with cluster.subscriber(args.topic, scope=args.scope) as sub:
            got = 0
            while args.count is None or got < args.count:
                msg = sub.receive(timeout=args.timeout)
                if msg is None:
                    break
                got += 1
                text = msg.payload.decode("utf-8", "replace") if msg.content_type == 0 \
                    else json.dumps(msg.value, default=str)
                print(f"{msg.topic}\t{msg.source}\t{msg.seq}\t{text}", flush=True)
        return 0


SCOPE_HELP = "the member's parent scope, e.g. X/Q, created on first use (default: its host's)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scopecast",
        description="Reliable publish-subscribe for Ray clusters: topics over UDP (IP multicast "
                    "where a scope allows it), controlled by scope managers running as Ray actors.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what scopecast does (INFO)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def attach(sp):
        sp.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or the Ray "
                                          "running on this machine)")
        return sp

    u = sub.add_parser("up", help="start a persistent local cluster (a Ray head on loopback plus "
                                  "the scope managers), or deploy onto --address")
    u.add_argument("--address", help="deploy onto this existing Ray cluster instead")
    u.add_argument("--port", type=int, default=6390, help="port of the local Ray head (6390)")
    u.add_argument("--trusted-key", action="append", metavar="FILE",
                   help="accept only plug-ins signed by this Ed25519 public key (repeatable)")
    u.add_argument("--mac", default="gmac", choices=["gmac", "hmac-sha256"],
                   help="packet authenticator of a newly deployed cluster (gmac)")
    u.set_defaults(func=cmd_up)

    dn = attach(sub.add_parser("down", help="remove every scopecast actor from the cluster"))
    dn.add_argument("--ray", action="store_true",
                    help="also stop the local Ray head that `scopecast up` started")
    dn.set_defaults(func=cmd_down)

    d = sub.add_parser("demo", help="the main job: stream a topic to subscriber actors on an "
                                    "embedded local Ray and print a summary")
    d.add_argument("--messages", type=int, default=200_000, help="messages to publish (200,000)")
    d.add_argument("--subscribers", type=int, default=3, help="subscriber actors (3)")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="run the benchmark suite (arguments after `--` go to it; "
                                     "`scopecast bench -- --help` lists them)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options")
    b.set_defaults(func=cmd_bench)

    s = attach(sub.add_parser("status", help="topics and members of the running cluster"))
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    t = attach(sub.add_parser("topic", help="create, list or delete topics"))
    t.add_argument("action", choices=["create", "list", "delete"])
    t.add_argument("name", nargs="?", help="topic name (create, delete)")
    t.add_argument("--policy", default="tree",
                   help="forwarding policy: tree (default), chain, star, lan_multicast, replicated")
    t.add_argument("--root", default="", metavar="SCOPE",
                   help="the scope the topic is rooted at (default: the cluster scope)")
    t.add_argument("--recovery", default="token_ring",
                   help="recovery protocol: token_ring (default), ack_tree, none, or a submitted "
                        "recovery plug-in (name@version)")
    t.add_argument("--history", default="from_join", choices=["from_join", "cached"],
                   help="what a late subscriber gets: from its join point (default), or first "
                        "what is not yet stable")
    t.set_defaults(func=cmd_topic)

    pl = attach(sub.add_parser("plugin", help="submit, list, show or remove plug-in modules; "
                                              "make a signing key"))
    pl.add_argument("action", choices=["submit", "list", "show", "remove", "keygen"])
    pl.add_argument("target", nargs="?",
                    help="submit: a .py file or package directory; show/remove: name@version or "
                         "sha256:<hex>; keygen: where to write the private key (and KEY.pub)")
    pl.add_argument("--sign", metavar="KEY", help="submit: sign with this Ed25519 private key")
    pl.set_defaults(func=cmd_plugin)

    pub = attach(sub.add_parser("publish", help="publish lines from stdin or --file"))
    pub.add_argument("topic")
    pub.add_argument("--file", help="read lines from this file instead of stdin")
    pub.add_argument("--timeout", type=float, default=30.0, help="flush timeout in seconds")
    pub.add_argument("--scope", metavar="PATH", help=SCOPE_HELP)
    pub.set_defaults(func=cmd_publish)

    sb = attach(sub.add_parser("subscribe", help="print messages of a topic as they arrive"))
    sb.add_argument("topic", nargs="+")
    sb.add_argument("--count", type=int, help="stop after this many messages")
    sb.add_argument("--scope", metavar="PATH", help=SCOPE_HELP)
    sb.add_argument("--timeout", type=float, default=None,
                    help="stop after this many idle seconds (default: wait forever)")
    sb.set_defaults(func=cmd_subscribe)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "topic" and args.action != "list" and not args.name:
        print("scopecast topic create/delete needs a topic name", file=sys.stderr)
        return 2
    if args.command == "plugin" and args.action != "list" and not args.target:
        print(f"scopecast plugin {args.action} needs a target", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ScopecastError as exc:
        print(f"scopecast: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
