"""Where the data path's compiled parts come from: the C extensions, or their pure-Python twins.

The per-topic tables (`_seq_table`, `_tail_table`) and the GSO/GRO batch code
(`_datagram_batch`) are C extensions built at install time. Where one was not built (no compiler
or no Python headers: the build skips what it cannot compile) the tables come from
`_seq_table_py` / `_tail_table_py` (same contract, slower), and the batches are not used: each
datagram is then sealed and read one by one (`BatchScanner`/`BatchSealer` are None, which the
runtime already handles, as it does where the kernel has no GSO/GRO).

SCOPECAST_PURE_PYTHON=1 in a process's environment forces the pure-Python parts there (tests
run a cluster that way; a user can rule out the extensions when chasing a fault). `doctor` and
every member's status say which implementation a process runs."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

FORCE_PURE = "SCOPECAST_PURE_PYTHON"
DATAGRAM_WIRE_VERSION = 9  # the datagrams _datagram_batch reads and writes: `wire.VERSION`
DATAGRAM_ABI = 4  # what its calls take and give (2: fragments in seal and scan; 3: encrypt;
#                   4: seal_lone)


def _forced() -> bool:
    return os.environ.get(FORCE_PURE, "").strip().lower() not in ("", "0", "false", "no")


FORCED = _forced()
missing: list[str] = []  # the extensions this process runs without, and why

if FORCED:
    missing.append(f"all ({FORCE_PURE} is set)")
    from scopecast.netio._seq_table_py import NameTable, SeqTable, mixed_extent, mixed_parts, take_mixed
    from scopecast.netio._tail_table_py import TailTable
    BatchScanner = BatchSealer = None
else:
    try:
        from scopecast.netio._seq_table import NameTable, SeqTable, mixed_extent, mixed_parts, take_mixed
    except ImportError as e:
        missing.append(f"_seq_table ({e})")
        from scopecast.netio._seq_table_py import NameTable, SeqTable, mixed_extent, mixed_parts, take_mixed
    try:
        from scopecast.netio._tail_table import TailTable
    except ImportError as e:
        missing.append(f"_tail_table ({e})")
        from scopecast.netio._tail_table_py import TailTable
    try:
        from scopecast.netio import _datagram_batch
        from scopecast.netio._datagram_batch import WIRE_VERSION, BatchScanner, BatchSealer
        built = (WIRE_VERSION, getattr(_datagram_batch, "ABI", 1))
        if built != (DATAGRAM_WIRE_VERSION, DATAGRAM_ABI):  # a build left from another version
            raise ImportError(f"built for wire version {built[0]} (calls {built[1]}), not "
                              f"{DATAGRAM_WIRE_VERSION} ({DATAGRAM_ABI}): reinstall")
    except ImportError as e:
        missing.append(f"_datagram_batch ({e})")
        BatchScanner = BatchSealer = None

IMPLEMENTATION = "python" if FORCED or len(missing) == 3 else "mixed" if missing else "C"
if missing and not FORCED:  # (a build without a compiler: say so once, where logs go)
    log.info("scopecast runs without compiled parts: %s; the data path is slower",
             "; ".join(missing))

__all__ = ["BatchScanner", "BatchSealer", "IMPLEMENTATION", "NameTable", "SeqTable",
           "TailTable", "missing", "mixed_extent", "mixed_parts", "take_mixed"]
