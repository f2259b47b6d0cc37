"""The `scopecast` commands that make, check and remove a deployment on this machine or a Ray
cluster: `up`, `down`, `reset`, `doctor` and `cluster local` (the parser is `cli.build_parser`)."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_up(args) -> int:
    from scopecast.ray_cluster import launch

    info = launch.up(address=args.address, port=args.port, mac=args.mac, encrypt=args.encrypt,
                     trusted_keys=args.trusted_key, datagram_bytes=args.datagram_bytes,
                     settings=dict(args.setting or ()) or None, levels=args.levels,
                     max_message_bytes=args.max_message_bytes)
    how = "started a local Ray head and deployed" if info["started_ray"] else "deployed"
    print(f"scopecast {how} on Ray at {info['address']} (cluster {info['cluster_id']}, "
          f"state {info['state']})")
    auth = " RAY_AUTH_MODE=token" if info.get("ray_auth") == "token" else ""
    print(f"attach with: scopecast status --address {info['address']}  |  "
          f"scopecast.connect(address={info['address']!r})  |  "
          f"RAY_ADDRESS={info['address']}{auth}")
    if info.get("dashboard"):
        print(f"Ray dashboard (jobs: `scopecast pipeline submit SCRIPT`): {info['dashboard']}")
    return 0


def cmd_reset(args) -> int:
    from scopecast.ray_cluster import launch

    files = launch.state_files()
    if not files:
        print(f"nothing to reset in {launch.state_path().parent}")
        return 0
    listing = ", ".join(str(f) for f in files)
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"scopecast reset would remove {listing}; pass --yes to do it without asking",
                  file=sys.stderr)
            return 2
        answer = input(f"remove {listing} (every topic, plug-in and member a persistent cluster "
                       "recorded)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    for f in launch.reset():
        print(f"removed {f}")
    return 0


def cmd_doctor(args) -> int:
    from scopecast.ray_cluster import doctor

    checks = doctor.run(args.interface)
    if args.json:
        print(json.dumps(doctor.as_dicts(checks), indent=2))
    else:
        print(doctor.table(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


def setting(text: str) -> tuple[str, object]:
    """KEY=VALUE of `up --setting`: the value as JSON where it parses (numbers, true/false),
    else as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def cmd_down(args) -> int:
    from scopecast.ray_cluster import launch

    info = launch.down(address=args.address, stop_ray=args.ray)
    print(f"removed {len(info['removed_actors'])} scopecast actors"
          + (f"; stopped {info['stopped_ray_processes']} Ray processes" if args.ray else
             " (Ray itself still runs; `scopecast down --ray` stops a head `scopecast up` "
             "started)"))
    return 0


def cmd_cluster(args) -> int:
    from scopecast.ray_cluster.local_hosts import LocalHosts

    rest = list(args.rest)
    if rest[:1] == ["exec"]:
        cmd = rest[2:] if rest[1:2] == ["--"] else rest[1:]
        if not cmd:
            print("scopecast cluster local exec -- CMD: name a command", file=sys.stderr)
            return 2
        hosts = LocalHosts.existing(args.prefix)
        return hosts.run(hosts.head, cmd, timeout=None).returncode
    if rest:
        print(f"scopecast cluster local: unknown action {rest[0]!r} (exec -- CMD)", file=sys.stderr)
        return 2
    if args.down:
        LocalHosts.existing(args.prefix).down()
        return 0
    info = LocalHosts(args.hosts, args.lans, args.prefix).up()
    for h in info["hosts"]:
        print(f"  {h['name']:<10} {h['address']:<14} lan{h['lan']}")
    print(f"Ray at {info['address']}; drivers run inside a host (RAY_ADDRESS set), e.g.\n"
          f"  {info['exec'].replace('CMD', 'scopecast up --address ' + info['address'])}\n"
          f"  {info['exec'].replace('CMD', 'python my_pipeline.py')}\n"
          f"remove it all: {info['down']}")
    return 0
