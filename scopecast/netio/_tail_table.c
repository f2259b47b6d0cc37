/* A sender's tail of each of its own streams: (topic, session) -> where its unstable messages
 * start and where it ends (see recovery_path: records, join points, where-answers).
 *
 * The I/O thread notes every reliable message it takes and releases every one that turns
 * stable; as a dict of lists keyed by tuples, a publisher going round thousands of topics paid
 * for a key tuple, a hash lookup and a list per message, twice, and missed the CPU cache at
 * each. Here a stream is one 40-byte slot, and `note` and `release` walk the sender's cache in
 * one C loop each. Reads give what the dict held: [first unstable seq, its stream seq, last
 * seq, last stream seq] while any message is unstable, else the last seq (an int). `record`
 * packs what a summary names of them (scanning up to thousands of cache entries for the
 * oldest unstable streams took ~0.4 ms in Python, 66 summaries a second). */

#include "_open_table.h"

typedef struct {
    uint64_t stored;    /* topic << 32 | session (a topic is never 0: wire.MIXED) */
    int64_t fs, fss;    /* first unstable seq and stream seq; fs > ls: all stable */
    int64_t ls, lss;    /* last seq and stream seq */
} Tail;

typedef TableObject TailTable;

static size_t
stream_hash(uint64_t stored)
{
    /* sequential topics of one session: sequential slots */
    return (size_t)((stored >> 32) + (stored & 0xFFFFFFFFu) * 0x9E3779B1u);
}

static inline uint64_t
stored_key(uint32_t topic, uint32_t session)
{
    return (uint64_t)topic << 32 | session;
}

/* A topic and session as a stored key; 0 (an exception set) if they are not a stream's. */
static uint64_t
as_stream(PyObject *topic_obj, PyObject *session_obj)
{
    uint32_t topic, session;
    if (ot_u32(topic_obj, &topic) < 0 || ot_u32(session_obj, &session) < 0)
        return 0;
    if (topic == 0) {
        PyErr_SetString(PyExc_ValueError, "topic 0 is no stream's (wire.MIXED)");
        return 0;
    }
    return stored_key(topic, session);
}

/* A (topic, session) tuple as a stored key; 0 (an exception set) if it is not one. */
static uint64_t
as_key(PyObject *k)
{
    if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 2) {
        PyErr_SetString(PyExc_TypeError, "a TailTable's keys are (topic, session) tuples");
        return 0;
    }
    return as_stream(PyTuple_GET_ITEM(k, 0), PyTuple_GET_ITEM(k, 1));
}

static PyObject *
key_of(const Tail *t)
{
    uint64_t key = t->stored;
    return Py_BuildValue("(kk)", (unsigned long)(key >> 32), (unsigned long)(key & 0xFFFFFFFFu));
}

static PyObject *
value_of(const char *slot)
{
    const Tail *t = (const Tail *)slot;
    if (t->fs > t->ls)
        return PyLong_FromLongLong(t->ls);
    return Py_BuildValue("[LLLL]", t->fs, t->fss, t->ls, t->lss);
}

/* A cache entry's (sseq, topic, session, seq, ...) into its fields; -1 (an exception set) if
 * it is not one. */
static int
entry_fields(PyObject *e, uint64_t *stored, int64_t *sseq, int64_t *seq)
{
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 4) {
        PyErr_SetString(PyExc_TypeError, "a cache entry is (sseq, topic, session, seq, ...)");
        return -1;
    }
    if ((*stored = as_stream(PyTuple_GET_ITEM(e, 1), PyTuple_GET_ITEM(e, 2))) == 0)
        return -1;
    *sseq = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 0));
    *seq = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 3));
    if ((*sseq == -1 || *seq == -1) && PyErr_Occurred())
        return -1;
    return 0;
}

/* cache[start:stop] of a list, bounds checked; -1 (an exception set) if they do not fit. */
static int
span(PyObject *cache, Py_ssize_t start, Py_ssize_t stop)
{
    if (!PyList_Check(cache)) {
        PyErr_SetString(PyExc_TypeError, "the cache is a list");
        return -1;
    }
    if (start < 0 || start > stop || stop > PyList_GET_SIZE(cache)) {
        PyErr_SetString(PyExc_IndexError, "cache span out of range");
        return -1;
    }
    return 0;
}

static PyObject *
table_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return ot_object_new(type, args, kwds, sizeof(Tail), stream_hash);
}

static void
table_dealloc(TailTable *t)
{
    ot_object_dealloc(t);
}

/* The tail of Python key `k`, or NULL (no exception) if there is none. */
static char *
lookup(TailTable *t, PyObject *k)
{
    uint64_t stored = as_key(k);
    if (stored == 0) {
        PyErr_Clear();
        return NULL;
    }
    return ot_lookup(&t->tab, stored);
}

static PyObject *
table_getitem(TailTable *t, PyObject *k)
{
    return ot_object_getitem(t, k, lookup, value_of);
}

static PyObject *
table_get(TailTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    return ot_object_get(t, args, nargs, lookup, value_of);
}

static int
table_contains(TailTable *t, PyObject *k)
{
    return lookup(t, k) != NULL;
}

/* t[key] = [fs, fss, ls, lss] (unstable from fs on), or = ls (all stable). */
static int
table_setitem(TailTable *t, PyObject *k, PyObject *v)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "a TailTable's keys are never taken out");
        return -1;
    }
    uint64_t stored = as_key(k);
    if (stored == 0)
        return -1;
    long long f[4] = {0, 0, 0, 0};
    int all_stable = PyLong_Check(v);
    if (all_stable) {
        f[2] = PyLong_AsLongLong(v);
        if (f[2] == -1 && PyErr_Occurred())
            return -1;
    } else {
        PyObject *tuple = PySequence_Tuple(v);
        int ok = tuple != NULL && PyArg_ParseTuple(tuple, "LLLL", &f[0], &f[1], &f[2], &f[3]);
        Py_XDECREF(tuple);
        if (!ok)
            return -1;
    }
    for (int i = 0; i < 4; i++)
        if (f[i] < 0 || f[i] >= SEQ_LIMIT) {
            PyErr_Format(PyExc_ValueError, "a tail's seqs are in [0, 2**62): %R", v);
            return -1;
        }
    if (all_stable)
        f[0] = f[2] + 1;
    int made;
    Tail *s = (Tail *)ot_insert(&t->tab, stored, &made);
    if (s == NULL)
        return -1;
    s->fs = f[0], s->fss = f[1], s->ls = f[2], s->lss = f[3];
    return 0;
}

static PyObject *
table_items(TailTable *t, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i <= t->tab.mask; i++) {
        Tail *s = (Tail *)(t->tab.slots + i * sizeof(Tail));
        if (!s->stored)
            continue;
        PyObject *key = key_of(s), *value = key ? value_of((char *)s) : NULL;
        PyObject *pair = value ? PyTuple_Pack(2, key, value) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(pair);
    }
    return out;
}

/* ---- records (see own_stream.OwnStream.record): named streams packed as RECORD_ENTRY,
 * "<IIQQQQ" (topic, session, fs, fss, ls, lss) */

#define RECORD_ENTRY 40
#define MAX_LIMIT 4096

static void
put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void
pack_entry(unsigned char *p, const Tail *s)
{
    put_le(p, s->stored >> 32, 4);
    put_le(p + 4, s->stored & 0xFFFFFFFFu, 4);
    put_le(p + 8, (uint64_t)s->fs, 8);
    put_le(p + 16, (uint64_t)s->fss, 8);
    put_le(p + 24, (uint64_t)s->ls, 8);
    put_le(p + 32, (uint64_t)s->lss, 8);
}

/* The streams of the oldest unstable messages, cache[head:] up to stream seq `handed` and at
 * most `scan` of them, at most `limit` streams, in the order met (their tails into tails[],
 * their number returned; -1 and an exception if an entry is not one); *horizon: the stream seq
 * up to which every message looked at is of one of them. */
static Py_ssize_t
oldest(TailTable *t, PyObject *cache, Py_ssize_t head, int64_t handed, Py_ssize_t scan,
       Py_ssize_t limit, Tail **tails, int64_t *horizon)
{
    OpenTable seen;  /* the streams met: stored keys only */
    if (ot_init(&seen, sizeof(uint64_t), stream_hash) < 0)
        return -1;
    Py_ssize_t n = 0, stop = PyList_GET_SIZE(cache);
    if (stop - head > scan)
        stop = head + scan;
    *horizon = handed;
    for (Py_ssize_t i = head; i < stop; i++) {
        uint64_t stored;
        int64_t sseq, seq;
        int made;
        if (entry_fields(PyList_GET_ITEM(cache, i), &stored, &sseq, &seq) < 0) {
            n = -1;
            break;
        }
        if (sseq > handed)
            break;
        if (ot_insert(&seen, stored, &made) == NULL) {
            n = -1;
            break;
        }
        if (made) {
            if (n == limit) {
                *horizon = sseq - 1;
                break;
            }
            tails[n++] = (Tail *)ot_lookup(&t->tab, stored);
        }
        if (i == head + scan - 1)  /* (more may follow) */
            *horizon = sseq;
    }
    PyMem_Free(seen.slots);
    return n;
}

/* record(cache, head, handed, scan, limit) -> (named, horizon): what a sender's record names
 * of its unstable streams, packed, and its horizon. Every unstable stream, horizon `handed`,
 * when there are at most `limit` streams; else those of the oldest unstable messages (the
 * cache from `head`, up to stream seq `handed`, at most `scan` looked at, at most `limit`
 * streams) and the stream seq up to which every message looked at is of one of them. */
static PyObject *
table_record(TailTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record(cache, head, handed, scan, limit)");
        return NULL;
    }
    PyObject *cache = args[0];
    Py_ssize_t head = PyLong_AsSsize_t(args[1]);
    long long handed = PyLong_AsLongLong(args[2]);
    Py_ssize_t scan = PyLong_AsSsize_t(args[3]), limit = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (scan < 1 || limit < 1 || limit > MAX_LIMIT) {
        PyErr_Format(PyExc_ValueError, "scan >= 1 and limit in 1..%d", MAX_LIMIT);
        return NULL;
    }
    if (span(cache, head, PyList_Check(cache) ? PyList_GET_SIZE(cache) : 0) < 0)
        return NULL;
    Tail **tails = PyMem_Malloc(limit * sizeof(Tail *));
    if (tails == NULL)
        return PyErr_NoMemory();
    int64_t horizon = handed;
    Py_ssize_t n = 0;
    if (t->tab.len <= limit) {
        for (size_t i = 0; i <= t->tab.mask; i++) {
            Tail *s = (Tail *)(t->tab.slots + i * sizeof(Tail));
            if (s->stored)
                tails[n++] = s;
        }
    } else {
        n = oldest(t, cache, head, handed, scan, limit, tails, &horizon);
    }
    PyObject *named = n < 0 ? NULL : PyBytes_FromStringAndSize(NULL, n * RECORD_ENTRY);
    if (named != NULL) {
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(named);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (tails[i] != NULL && tails[i]->fs <= tails[i]->ls) {  /* (all stable: not named) */
                pack_entry(p, tails[i]);
                p += RECORD_ENTRY;
            }
        }
        _PyBytes_Resize(&named, (char *)p - PyBytes_AS_STRING(named));
    }
    PyMem_Free(tails);
    if (named == NULL)
        return NULL;
    return Py_BuildValue("(NL)", named, (long long)horizon);
}

/* note(cache, start): the cache entries from `start` on were just sent; each one's stream ends
 * there, and starts its unstable part there if it had none. Returns the keys met for the
 * first time. */
static PyObject *
table_note(TailTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "note(cache, start)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    PyObject *cache = args[0];
    if (span(cache, start, PyList_Check(cache) ? PyList_GET_SIZE(cache) : 0) < 0)
        return NULL;
    PyObject *made_keys = PyList_New(0);
    if (made_keys == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < PyList_GET_SIZE(cache); i++) {
        uint64_t stored;
        int64_t sseq, seq;
        int made;
        Tail *s;
        if (entry_fields(PyList_GET_ITEM(cache, i), &stored, &sseq, &seq) < 0
                || (s = (Tail *)ot_insert(&t->tab, stored, &made)) == NULL)
            goto fail;
        if (made) {
            PyObject *key = key_of(s);
            if (key == NULL || PyList_Append(made_keys, key) < 0) {
                Py_XDECREF(key);
                goto fail;
            }
            Py_DECREF(key);
        }
        if (made || s->fs > s->ls)
            s->fs = seq, s->fss = sseq;
        s->ls = seq, s->lss = sseq;
    }
    return made_keys;
fail:
    Py_DECREF(made_keys);
    return NULL;
}

/* release(cache, start, stop): the cache entries in [start, stop) are stable; each stream's
 * unstable part starts after its last one among them (all stable when that was its last).
 * Returns the bytes of their payloads (entry[5]). */
static PyObject *
table_release(TailTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "release(cache, start, stop)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop;
    if ((start == -1 && PyErr_Occurred())
            || ((stop = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()))
        return NULL;
    PyObject *cache = args[0];
    if (span(cache, start, stop) < 0)
        return NULL;
    long long freed = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *e = PyList_GET_ITEM(cache, i);
        uint64_t stored;
        int64_t sseq, seq;
        if (entry_fields(e, &stored, &sseq, &seq) < 0)
            return NULL;
        Py_ssize_t n = PyTuple_GET_SIZE(e) > 5 ? PyObject_Length(PyTuple_GET_ITEM(e, 5)) : 0;
        if (n < 0)
            return NULL;
        freed += n;
        Tail *s = (Tail *)ot_lookup(&t->tab, stored);
        if (s == NULL || s->fs > s->ls)
            continue;
        if (seq >= s->ls)
            s->fs = s->ls + 1;
        else
            s->fs = seq + 1, s->fss = sseq + 1;
    }
    return PyLong_FromLongLong(freed);
}

static PyObject *
table_repr(TailTable *t)
{
    return PyUnicode_FromFormat("TailTable(%zd streams)", t->tab.len);
}

static PyMethodDef table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))table_get, METH_FASTCALL,
     "get((topic, session), default=None): the stream's tail, or default."},
    {"items", (PyCFunction)table_items, METH_NOARGS,
     "items(): ((topic, session), tail) pairs (a snapshot)."},
    {"record", (PyCFunction)(void (*)(void))table_record, METH_FASTCALL,
     "record(cache, head, handed, scan, limit) -> (named, horizon) (see the module source)."},
    {"note", (PyCFunction)(void (*)(void))table_note, METH_FASTCALL,
     "note(cache, start) -> the keys met for the first time (see the module source)."},
    {"release", (PyCFunction)(void (*)(void))table_release, METH_FASTCALL,
     "release(cache, start, stop) -> payload bytes released (see the module source)."},
    {NULL, NULL, 0, NULL},
};

OT_TABLE_TYPE(TailTableType, "scopecast.netio._tail_table.TailTable", sizeof(TailTable),
              "(topic, session) -> a sender's stream tail, compact; keys never taken out", NULL);

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tail_table", "A sender's compact per-stream tails.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__tail_table(void)
{
    return ot_module(&module, &TailTableType, "TailTable");
}
