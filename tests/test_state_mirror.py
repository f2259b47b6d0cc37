"""The root's state mirror (issue 45 item 2), as pure logic: the image round trip through a key-value
store, chunked; which of file and image a store opens with; a mirror that fails. The real one, in
Ray's GCS with the root's node killed, is tests/test_root_node_loss.py."""

from __future__ import annotations

import pytest

from scopecast.scopes import state_mirror
from scopecast.scopes.state import ScopeStore
from scopecast.scopes.state_mirror import HEAD, LOG, Image, StateMirror


class DictKV:
    """The four calls of ray_private's GCS store, on a dict."""

    def __init__(self) -> None:
        self.d: dict[bytes, bytes] = {}
        self.fail = False

    def kv_get(self, key):
        return self.d.get(key)

    def kv_put(self, key, value):
        if self.fail:
            raise ConnectionError("GCS unreachable")
        self.d[key] = value

    def kv_delete(self, key):
        self.d.pop(key, None)

    def kv_keys(self, prefix):
        return [k for k in self.d if k.startswith(prefix)]


@pytest.fixture
def kv(monkeypatch) -> DictKV:
    monkeypatch.setattr(state_mirror, "CHUNK", 1000)  # several chunks for a small database
    return DictKV()


def test_an_image_goes_in_chunks_and_comes_back_whole_and_old_chunks_go(kv):
    mirror = StateMirror(kv)
    data = __import__("os").urandom(20_000)  # does not compress: 21 chunks
    mirror.image(Image(1, data))
    first = set(kv.d)
    assert len(first) > 3
    mirror.image(Image(2, data[::-1]))
    assert not (first - {HEAD}) & set(kv.d)  # generation 1's chunks deleted
    assert StateMirror(kv).load().image == Image(2, data[::-1])


def test_chunks_a_root_left_half_written_are_cleared_and_a_broken_image_is_not_taken(kv):
    mirror = StateMirror(kv)
    mirror.image(Image(3, b"x" * 5000))
    kv.d[HEAD + b"/4/0"] = b"half"  # a save that died before its head
    assert StateMirror(kv).load().image.generation == 3
    assert HEAD + b"/4/0" not in kv.d
    chunk = next(k for k in kv.d if k.startswith(HEAD + b"/3/"))
    kv.d[chunk] = b"garbage"
    assert StateMirror(kv).load() is None


def test_a_store_on_another_node_opens_with_the_mirrors_image_and_the_writes_since(kv, tmp_path):
    a = ScopeStore(tmp_path / "node-a" / "state.db", mirror=StateMirror(kv))
    a.put("cluster", {"key": "k1"})
    a.put_topics([("t/one", 1, {"name": "t/one", "session": 4})])
    first = a.next_id("member")
    a.put_plugin("ab" * 32, "p", "1", {"name": "p"}, b"\0files")
    assert a.generation == 4
    logged = [k for k in kv.d if k.startswith(LOG)]
    assert len(logged) == 4  # a write is a small record, not an image of the database
    b = ScopeStore(tmp_path / "node-b" / "state.db", mirror=StateMirror(kv))
    assert b.restored == 4 and b.generation == 4
    assert b.plugin_files("ab" * 32) == b"\0files"
    assert not [k for k in kv.d if k.startswith(LOG)]  # folded into an image at once
    assert b.get("cluster") == {"key": "k1"}
    assert b.topics() == [{"name": "t/one", "session": 4}]
    assert b.next_id("member") == first + 1  # a member id is never handed out twice
    assert b.generation == 5


def test_a_file_newer_than_the_image_is_kept_and_an_older_one_replaced(kv, tmp_path):
    path = tmp_path / "state.db"
    a = ScopeStore(path, mirror=StateMirror(kv))
    a.put("x", 1)
    a.close()
    kv.d.clear()
    StateMirror(kv).image(Image(0, b"not even a database"))  # an older image: the file stays
    again = ScopeStore(path, mirror=StateMirror(kv))
    assert again.restored is None and again.get("x") == 1
    again.close()
    elsewhere = ScopeStore(tmp_path / "b.db", mirror=StateMirror(kv))  # runs on and on elsewhere
    for i in range(5):
        elsewhere.put("x", 10 + i)
    (tmp_path / "state.db-wal").write_bytes(b"an old log")  # must not be replayed onto the image
    back = ScopeStore(path, mirror=StateMirror(kv))
    assert back.restored == elsewhere.generation and back.get("x") == 14


def test_a_failing_mirror_is_counted_and_the_write_stands(kv, tmp_path):
    store = ScopeStore(tmp_path / "state.db", mirror=StateMirror(kv))
    kv.fail = True
    store.put("x", 1)
    store.put("x", 2)
    assert store.mirror_failures == 2 and store.get("x") == 2
    kv.fail = False
    store.put("x", 3)  # after a failure, an image: the log has no gap to stop a restore at
    assert StateMirror(kv).load().image.generation == store.generation


def test_without_a_mirror_nothing_changes(tmp_path):
    store = ScopeStore(tmp_path / "state.db")
    store.put("x", 1)
    assert store.generation == 0 and store.restored is None


def test_the_log_is_folded_into_an_image_as_it_grows_and_large_writes_go_as_images(
        kv, tmp_path, monkeypatch):
    monkeypatch.setattr(state_mirror, "LOG_MOST", 10)
    store = ScopeStore(tmp_path / "state.db", mirror=StateMirror(kv))
    for i in range(25):
        store.put("x", i)
    assert len([k for k in kv.d if k.startswith(LOG)]) < 10
    monkeypatch.setattr(state_mirror, "RECORD_MOST", 100)
    store.put_topics([(f"t/{i}", i, {"name": f"t/{i}"}) for i in range(50)])
    assert not [k for k in kv.d if k.startswith(LOG)]
    again = ScopeStore(tmp_path / "b.db", mirror=StateMirror(kv))
    assert again.get("x") == 24 and len(again.topics()) == 50


def test_a_root_restarted_on_its_own_node_puts_no_image_and_its_log_goes_on(kv, tmp_path):
    path = tmp_path / "state.db"
    a = ScopeStore(path, mirror=StateMirror(kv))
    a.put("x", 1)
    a.close()
    mirror = StateMirror(kv)
    again = ScopeStore(path, mirror=mirror)  # the mirror is as the file is
    assert again.restored is None and mirror.images == 0
    again.put("x", 2)
    assert mirror.records == 1 and mirror.images == 0
    elsewhere = ScopeStore(tmp_path / "b.db", mirror=StateMirror(kv))
    assert elsewhere.restored == again.generation and elsewhere.get("x") == 2
