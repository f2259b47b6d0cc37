"""The node's plug-in cache under concurrent writers: every scope manager of a node that runs a
plug-in writes it to the shared cache and ships the directory, so a reader must never find a file
of it half written. Real processes: two writers and a reader over the same cache."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from scopecast.policies.library import materialize
from scopecast.policies.registry import digest

PLUGINS = 150          # distinct plug-ins: each one's first write races the other writer's
BODY = 96 << 10        # bytes of each plug-in's module (a write takes a while)
ROUNDS = 3             # each writer goes over every plug-in this many times
MIN_READS = 10_000     # reads of a file that was there, every one checked whole

SETUP = textwrap.dedent('''
    import json, random, sys, time
    from pathlib import Path
    from scopecast.policies.library import materialize
    from scopecast.policies.registry import digest
    PLUGINS, BODY, ROUNDS = {plugins}, {body}, {rounds}
    cache = Path(sys.argv[1])

    def plugin(i):
        body = (f"# plug-in {{i}}\\n".encode() + bytes([65 + i % 26]) * BODY)
        files = {{f"p{{i}}.py": body}}
        return files, digest(files)
''').format(plugins=PLUGINS, body=BODY, rounds=ROUNDS)

WRITER = SETUP + textwrap.dedent('''
    order = list(range(PLUGINS)) * ROUNDS
    random.Random(sys.argv[2]).shuffle(order)
    for i in order:
        files, sha = plugin(i)
        materialize(files, sha, f"p{i}", cache=cache)
    print(json.dumps({"wrote": len(order)}))
''')

READER = SETUP + textwrap.dedent('''
    expected = [plugin(i) for i in range(PLUGINS)]
    reads = partial = 0
    rng = random.Random(7)
    deadline = time.monotonic() + 120
    done, enough = Path(sys.argv[2]), int(sys.argv[3])
    while time.monotonic() < deadline:
        if reads >= enough and done.exists():
            break  # the writers are done and enough was read
        i = rng.randrange(PLUGINS)
        files, sha = expected[i]
        try:
            found = (cache / sha / f"p{i}" / "__init__.py").read_bytes()
        except OSError:
            continue  # not there yet
        reads += 1
        partial += found != files[f"p{i}.py"]
    print(json.dumps({"reads": reads, "partial": partial}))
''')


def test_concurrent_writers_never_show_a_reader_a_partial_file(tmp_path):
    cache, done = tmp_path / "cache", tmp_path / "writers-done"
    cache.mkdir()

    def start(code: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code, str(cache), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    reader = start(READER, str(done), str(MIN_READS))
    writers = [start(WRITER, str(seed)) for seed in (1, 2)]
    for w in writers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
        assert json.loads(out)["wrote"] == PLUGINS * ROUNDS
    done.touch()
    out, err = reader.communicate(timeout=300)
    assert reader.returncode == 0, err
    result = json.loads(out)
    assert result["reads"] >= MIN_READS
    assert result["partial"] == 0, result


def test_a_broken_cache_entry_is_replaced_and_what_is_shipped_matches_the_digest(tmp_path):
    files = {"mod.py": b"VALUE = 1\n" * 1000}
    sha = digest(files)
    broken = tmp_path / sha / "mod"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_bytes(b"VALUE = ")  # cut short by a crash mid-write
    package = materialize(files, sha, "mod", cache=tmp_path)
    assert package == broken
    assert (package / "__init__.py").read_bytes() == files["mod.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [sha]  # nothing left aside
