"""What the `scopecast` commands share: attaching to the running cluster, and printing for people
(a table, a record) or for programs (`--json`)."""

from __future__ import annotations

import json


def connect(args):
    import scopecast

    return scopecast.connect(address=args.address or "auto", start=False)


def show_table(rows: list[dict], columns: list[str]) -> None:
    """A listing for people: a header and aligned columns (`--json` gives programs the rows)."""
    cells = [[str(r.get(c, "")) if r.get(c) not in (None, "") else "-" for c in columns]
             for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    for row in [[c.upper() for c in columns], *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def show_record(record: dict) -> None:
    """One object for people: a `key: value` line each (lists joined)."""
    width = max(len(k) for k in record) + 2
    for key, value in record.items():
        shown = (", ".join(map(str, value)) or "-") if isinstance(value, list) else value
        print(f"{key + ':':<{width}}{'-' if shown in (None, '') else shown}")


def show(value, as_json: bool) -> None:
    print(json.dumps(value, indent=2, default=str)) if as_json else show_record(value)
