"""The `scopecast` commands that administer a running cluster: `scope` (each scope's forwarding
policy and recovery protocol), `plugin` (the plug-in library), `credential` (what a member may
publish and subscribe to) and `key` (rotating the cluster key)."""

from __future__ import annotations

import argparse
import json

from scopecast.cli_common import connect, show, show_table
from scopecast.policies import trust


def _override(text: str) -> tuple[str, str | None, str | None]:
    """PATTERN=POLICY,RECOVERY (either may be empty: not set by this rule)."""
    pattern, sep, choices = text.partition("=")
    policy, comma, recovery = choices.partition(",")
    if not sep or not comma or not (policy or recovery):
        raise argparse.ArgumentTypeError(
            f"{text!r}: an override is PATTERN=POLICY,RECOVERY, e.g. 'prices/*=chain,' or "
            "'news=,ack_tree'")
    return pattern, policy or None, recovery or None


def cmd_scope(args) -> int:
    with connect(args) as cluster:
        if args.action == "configure":
            if args.path is None:
                raise SystemExit("scopecast scope configure: give the scope's PATH ('/' for the "
                                 "cluster scope)")
            settings = cluster.configure_scope(args.path, policy=args.policy,
                                               recovery=args.recovery,
                                               overrides=args.override or None,
                                               cachers=args.cachers, partition=args.partition)
        else:
            settings = cluster.scope_settings()
        if args.json:
            print(json.dumps(settings, indent=2))
            return 0
        rows = [{"scope": path, "pattern": rule.get("pattern", "(default)"),
                 "policy": rule.get("policy"), "recovery": rule.get("recovery")}
                for path, admin in settings.items()
                for rule in [*admin["overrides"], admin["default"]]
                if rule.get("policy") or rule.get("recovery")]
        rows += [{"scope": path, "pattern": "(caching)",
                  "recovery": f"cachers {admin.get('cachers', '-')} of each partition of "
                              f"{admin.get('partition', '-')}"}
                 for path, admin in settings.items() if "cachers" in admin or "partition" in admin]
        if rows:
            show_table(rows, ["scope", "pattern", "policy", "recovery"])
        else:
            print("no scope is configured: every topic uses its own policy and recovery")
        return 0


def cmd_plugin(args) -> int:
    if args.action == "keygen":  # local only: no cluster needed
        private, public = trust.keygen(args.target)
        print(f"private key {private} (keep it secret), public key {public} (give it to "
              f"`scopecast up --trusted-key`)")
        return 0
    with connect(args) as cluster:
        if args.action == "submit":
            ref = cluster.submit_plugin(args.target, sign=args.sign)
            show({"kind": ref.kind, "ref": f"{ref.name}@{ref.version}",
                   "sha256": ref.sha256}, args.json)
        elif args.action == "list":
            plugins = cluster.plugins()
            if args.json:
                print(json.dumps(plugins, indent=2, default=str))
            else:
                show_table([{**p, "ref": f"{p['name']}@{p['version']}"} for p in plugins],
                            ["kind", "ref", "sha256", "bytes"])
        elif args.action == "show":
            show(cluster.plugin(args.target), args.json)
        else:
            ref = cluster.remove_plugin(args.target)
            print(f"removed {ref.name}@{ref.version}")
        return 0


def cmd_credential(args) -> int:
    with connect(args) as cluster:
        token = cluster.issue_credential(args.name, args.publish or [], args.subscribe or [])
    show({"name": args.name, "publish": args.publish or [], "subscribe": args.subscribe or [],
          "credential": token}, args.json)
    return 0


def cmd_key(args) -> int:
    with connect(args) as cluster:
        keys = cluster.rotate_key(wait=args.wait)
    show(keys, args.json)
    return 0 if keys["accepted"] == 1 or not args.wait else 1


def add_parsers(sub, attach) -> None:
    """The `scope`, `plugin` and `credential` commands' parsers (`attach` adds --address)."""
    sc = attach(sub.add_parser(
        "scope", help="administer scopes: the forwarding policy and recovery protocol of the "
                      "topics within a scope",
        description="`configure PATH` sets a scope's settings as a whole (what is left out is "
                    "inherited; nothing given clears them); `settings` lists every configured "
                    "scope. For each topic, the nearest scope on the way up that sets a choice "
                    "wins (its first matching override, then its default), else the topic's "
                    "own. Topics whose choices change start a new session."))
    sc.add_argument("action", choices=["configure", "settings"])
    sc.add_argument("path", nargs="?", help="configure: the scope, e.g. X/Q ('/' for the "
                                            "cluster scope)")
    sc.add_argument("--policy", help="the scope's default forwarding policy (tree, chain, star, "
                                     "lan_multicast, replicated or a plug-in name@version)")
    sc.add_argument("--recovery", help="the scope's default recovery protocol for reliable "
                                       "topics (token_ring, ack_tree or a plug-in)")
    sc.add_argument("--override", action="append", type=_override, metavar="PATTERN=POL,REC",
                    help="an override for topics matching PATTERN, tried in the order given "
                         "(e.g. 'prices/*=chain,' or 'news=,ack_tree'); repeatable")
    sc.add_argument("--cachers", type=int, help="cooperative caching: how many agents of each "
                                                "partition keep peers' messages until stable "
                                                "(token_ring; default all)")
    sc.add_argument("--partition", type=int, help="how many agents a token_ring partition has "
                                                  "(default 5)")
    sc.add_argument("--json", action="store_true", help="machine-readable output")
    sc.set_defaults(func=cmd_scope)

    pl = attach(sub.add_parser("plugin", help="submit, list, show or remove plug-in modules; "
                                              "make a signing key"))
    pl.add_argument("action", choices=["submit", "list", "show", "remove", "keygen"])
    pl.add_argument("target", nargs="?",
                    help="submit: a .py file or package directory; show/remove: name@version or "
                         "sha256:<hex>; keygen: where to write the private key (and KEY.pub)")
    pl.add_argument("--sign", metavar="KEY", help="submit: sign with this Ed25519 private key")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plugin)

    cr = attach(sub.add_parser(
        "credential", help="issue a credential limiting what a process may publish and "
                           "subscribe to",
        description="Prints a token for `scopecast.connect(credential=TOKEN)` (or the "
                    "SCOPECAST_CREDENTIAL environment variable): members of a process that "
                    "connects with it may publish only to topics named or matched by --publish "
                    "and subscribe only to those of --subscribe; anything else raises "
                    "PermissionDenied, and what such a member publishes elsewhere is dropped by "
                    "its receivers (counted as `forbidden`)."))
    cr.add_argument("action", choices=["issue"])
    cr.add_argument("name", help="who holds it (shown in status and logs)")
    cr.add_argument("--publish", action="append", metavar="TOPIC",
                    help="a topic name or pattern it may publish to; repeatable (none: nothing)")
    cr.add_argument("--subscribe", action="append", metavar="TOPIC",
                    help="a topic name or pattern it may subscribe to; repeatable (none: "
                         "nothing)")
    cr.add_argument("--json", action="store_true", help="machine-readable output")
    cr.set_defaults(func=cmd_credential)

    ky = attach(sub.add_parser(
        "key", help="rotate the cluster key without loss",
        description="`rotate` makes a new cluster key and hands it down to every scope, member "
                    "and recovery agent in three steps, each once every member acknowledged the "
                    "last: announced (the new key accepted everywhere), sealing (used "
                    "everywhere, the old one still accepted), retired (the old key refused). "
                    "Credentials stay valid. Prints the key generation, step and how many keys "
                    "are accepted; with --wait, exits 1 if the rotation did not end within that "
                    "time."))
    ky.add_argument("action", choices=["rotate"])
    ky.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="wait this long for the old key's retirement (default: do not wait)")
    ky.add_argument("--json", action="store_true", help="machine-readable output")
    ky.set_defaults(func=cmd_key)
