/* A receiver's numbers of one source session by topic: topic id (u32) -> signed 64-bit int;
 * and its intake of mixed runs.
 *
 * A receiver keeps, per source session, each topic's next seq and last stream seq (see
 * key_table.py). As Python dicts of ints, every message of a run across thousands of topics cost
 * several cache misses (hash index, entry, key object, value object, a new value object) besides
 * the interpreter's work; here a topic is one 16-byte slot found by its id (ids are handed out
 * in sequence, so topics made together sit side by side, and a publisher going round them walks
 * the slots in order). Keys are never taken out; iteration follows insertion order. Values are
 * 64-bit: a larger one is an OverflowError (the wire bounds seqs below that, see wire.SEQ_LIMIT).
 *
 * A mixed run (see wire.py) of thousands of topics cost in Python 3 ints unpacked per message,
 * checks over them, a name looked up in a dict of ints and a payload sliced: twice what a run
 * of one topic costs. `take_mixed` reads the entries where they lie in the datagram, checks
 * and moves the whole run, and names the messages from a NameTable, in one C loop;
 * `mixed_extent` is the wire's check of the entries. A sender packs a mixed run's entries
 * with `mixed_parts` straight from its cache entries (as `struct`, big-endian u64s went
 * through Python's generic slow path and made a list of 3n ints first). */

#include "_open_table.h"
#include <arpa/inet.h>

typedef struct {
    uint64_t stored;    /* topic id + 1 */
    int64_t value;
} Slot;

typedef struct {
    PyObject_HEAD
    OpenTable tab;      /* (a TableObject) */
    uint32_t *order;    /* keys in insertion order */
    Py_ssize_t order_cap;
} SeqTable;

static PyTypeObject SeqTableType;

static size_t
topic_hash(uint64_t stored)
{
    return (size_t)stored;
}

/* The slot of topic `key`, or NULL. */
static inline Slot *
find(const SeqTable *t, uint32_t key)
{
    return (Slot *)ot_lookup(&t->tab, (uint64_t)key + 1);
}

/* The slot of `key`, made (value 0) if there is none; NULL on memory error. */
static Slot *
insert(SeqTable *t, uint32_t key)
{
    if (t->tab.len == t->order_cap) {  /* (room for a new key first: nothing to undo) */
        Py_ssize_t cap = t->order_cap ? t->order_cap * 2 : 8;
        uint32_t *order = PyMem_Realloc(t->order, cap * sizeof(uint32_t));
        if (order == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        t->order = order;
        t->order_cap = cap;
    }
    int made;
    Slot *s = (Slot *)ot_insert(&t->tab, (uint64_t)key + 1, &made);
    if (s != NULL && made)
        t->order[t->tab.len - 1] = key;
    return s;
}

/* A Python int as a topic id; -1 (no exception) if it is not one. */
static int
as_key(PyObject *o, uint32_t *key)
{
    if (ot_u32(o, key) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static PyObject *
table_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return ot_object_new(type, args, kwds, sizeof(Slot), topic_hash);
}

static void
table_dealloc(SeqTable *t)
{
    PyMem_Free(t->order);
    ot_object_dealloc((TableObject *)t);
}

/* The slot holding Python object `k` as a key; NULL (no exception) if there is none. */
static char *
lookup(TableObject *t, PyObject *k)
{
    uint32_t key;
    if (as_key(k, &key) < 0)
        return NULL;
    return (char *)find((SeqTable *)t, key);
}

static PyObject *
value_of(const char *slot)
{
    return PyLong_FromLongLong(((const Slot *)slot)->value);
}

static PyObject *
table_getitem(TableObject *t, PyObject *k)
{
    return ot_object_getitem(t, k, lookup, value_of);
}

static int
table_setitem(SeqTable *t, PyObject *k, PyObject *v)
{
    uint32_t key;
    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "a SeqTable's keys are never taken out");
        return -1;
    }
    if (as_key(k, &key) < 0) {
        PyErr_Format(PyExc_OverflowError, "topic id out of range: %R", k);
        return -1;
    }
    long long value = PyLong_AsLongLong(v);  /* OverflowError beyond 64 bits */
    if (value == -1 && PyErr_Occurred())
        return -1;
    Slot *s = insert(t, key);
    if (s == NULL)
        return -1;
    s->value = value;
    return 0;
}

static int
table_contains(TableObject *t, PyObject *k)
{
    return lookup(t, k) != NULL;
}

static PyObject *
table_get(TableObject *t, PyObject *const *args, Py_ssize_t nargs)
{
    return ot_object_get(t, args, nargs, lookup, value_of);
}

static PyObject *
keys_list(SeqTable *t, Py_ssize_t start)
{
    PyObject *out = PyList_New(t->tab.len - start);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < t->tab.len; i++) {
        PyObject *k = PyLong_FromUnsignedLong(t->order[i]);
        if (k == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i - start, k);
    }
    return out;
}

static PyObject *
table_iter(SeqTable *t)
{
    PyObject *keys = keys_list(t, 0);
    if (keys == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *
table_keys_after(SeqTable *t, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0)
        n = 0;
    return keys_list(t, n < t->tab.len ? n : t->tab.len);
}

static PyObject *
table_items(SeqTable *t, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(t->tab.len);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < t->tab.len; i++) {
        uint32_t key = t->order[i];
        PyObject *item = Py_BuildValue("(kL)", (unsigned long)key, find(t, key)->value);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* ---- the names of the topics a receiver delivers alike: topic id -> str, made once */

typedef struct {
    uint64_t stored;    /* topic id + 1 */
    PyObject *name;
} NameSlot;

typedef TableObject NameTable;

static PyTypeObject NameTableType;

static PyObject *
names_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *names;
    if (!PyArg_ParseTuple(args, "O!:NameTable", &PyDict_Type, &names))
        return NULL;
    NameTable *t = (NameTable *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    if (ot_init(&t->tab, sizeof(NameSlot), topic_hash) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(names, &pos, &k, &v)) {
        uint32_t key;
        int made;
        if (ot_u32(k, &key) < 0 || !PyUnicode_Check(v)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "a topic's name is a str, not %R", v);
            Py_DECREF(t);
            return NULL;
        }
        NameSlot *s = (NameSlot *)ot_insert(&t->tab, (uint64_t)key + 1, &made);
        if (s == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        Py_XSETREF(s->name, Py_NewRef(v));
    }
    return (PyObject *)t;
}

static void
names_dealloc(NameTable *t)
{
    for (size_t i = 0; t->tab.slots != NULL && i <= t->tab.mask; i++)
        Py_XDECREF(((NameSlot *)(t->tab.slots + i * t->tab.size))->name);
    ot_object_dealloc(t);
}

static PyObject *
name_of(const char *slot)
{
    return Py_NewRef(((const NameSlot *)slot)->name);
}

static PyObject *
names_get(NameTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    return ot_object_get(t, args, nargs, lookup, name_of);  /* (keyed as a SeqTable is) */
}

static PyMethodDef names_methods[] = {
    {"get", (PyCFunction)(void (*)(void))names_get, METH_FASTCALL,
     "get(topic, default=None): the topic's name, or default."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods names_as_mapping = {.mp_length = (lenfunc)ot_object_len};

static PyTypeObject NameTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scopecast.netio._seq_table.NameTable",
    .tp_doc = PyDoc_STR("NameTable({topic id: name}): topic id (u32) -> str, fixed when made"),
    .tp_basicsize = sizeof(NameTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = names_new,
    .tp_dealloc = (destructor)names_dealloc,
    .tp_as_mapping = &names_as_mapping,
    .tp_methods = names_methods,
};

/* ---- a mixed run's entries (wire.MIXED_ENTRY: topic u32, seq u64, length u32, big-endian),
 * read where they lie in the datagram */

#define ENTRY 16

static inline uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t
be64(const unsigned char *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static inline void
put_be32(unsigned char *p, uint32_t v)
{
    v = htonl(v);
    memcpy(p, &v, 4);
}

/* mixed_extent(view, offset, n) -> int: the payload bytes of the n entries at `offset` (what
 * wire.iter_runs checks of a mixed run), or -1 if they run past the end, -2 if one names topic
 * 0, -3 if a seq is not below SEQ_LIMIT. */
static PyObject *
mixed_extent(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "mixed_extent(view, offset, n)");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]), n = PyLong_AsSsize_t(args[2]);
    if ((off == -1 || n == -1) && PyErr_Occurred())
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    long long total = -1;
    if (off >= 0 && n >= 0 && off <= buf.len && n <= (buf.len - off) / ENTRY) {
        const unsigned char *e = (const unsigned char *)buf.buf + off;
        total = 0;
        for (Py_ssize_t i = 0; i < n; i++, e += ENTRY) {
            if (be32(e) == 0) {
                total = -2;
                break;
            }
            if (be64(e + 4) >= SEQ_LIMIT) {
                total = -3;
                break;
            }
            total += be32(e + 12);
        }
    }
    PyBuffer_Release(&buf);
    return PyLong_FromLongLong(total);
}

/* mixed_parts(head, messages) -> [head, entries, payload, ...]: the byte strings of a mixed
 * run (wire.mixed_run_parts) of `messages`, each a cache entry (sseq, topic, session, seq,
 * ctype, payload): its entries packed in one pass, with no Python int made. */
static PyObject *
mixed_parts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "mixed_parts(bytes, list)");
        return NULL;
    }
    PyObject *messages = args[1];
    Py_ssize_t n = PyList_GET_SIZE(messages);
    PyObject *out = PyList_New(n + 2);
    PyObject *entries = PyBytes_FromStringAndSize(NULL, n * ENTRY);
    if (out == NULL || entries == NULL)
        goto fail;
    unsigned char *e = (unsigned char *)PyBytes_AS_STRING(entries);
    for (Py_ssize_t i = 0; i < n; i++, e += ENTRY) {
        PyObject *m = PyList_GET_ITEM(messages, i);
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) < 6) {
            PyErr_SetString(PyExc_TypeError, "a mixed run's messages are cache entries");
            goto fail;
        }
        uint32_t topic;
        if (ot_u32(PyTuple_GET_ITEM(m, 1), &topic) < 0)
            goto fail;
        unsigned long long seq = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(m, 3));
        if (seq == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        PyObject *payload = PyTuple_GET_ITEM(m, 5);
        Py_ssize_t len = PyBytes_Check(payload) ? PyBytes_GET_SIZE(payload)
                                                : PyObject_Length(payload);
        if (len < 0)
            goto fail;
        if ((size_t)len > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "a payload of %zd bytes", len);
            goto fail;
        }
        put_be32(e, topic);
        put_be32(e + 4, (uint32_t)(seq >> 32));
        put_be32(e + 8, (uint32_t)seq);
        put_be32(e + 12, (uint32_t)len);
        PyList_SET_ITEM(out, i + 2, Py_NewRef(payload));
    }
    PyList_SET_ITEM(out, 0, Py_NewRef(args[0]));
    PyList_SET_ITEM(out, 1, entries);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(entries);
    return NULL;
}

/* Put back the next seqs of the first n entries at `e` (each moved one on). */
static void
put_back(SeqTable *next, const unsigned char *e, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        find(next, be32(e + i * ENTRY))->value--;
}

/* take_mixed(next, last, names, data, offset, n, first_sseq) -> (names, seqs, payloads,
 * payload bytes) or None: a mixed run of n messages whose payloads start at `offset` in `data`
 * (its entries just before, as wire.iter_runs gives it), taken if every message is the next of
 * its topic in `next` (of a topic not in `next` yet, its first: seq 1) and every topic has a
 * name in `names`: each topic's next seq moves past its message and its last stream seq (in
 * `last`, made if new) becomes the message's; the rest says what to deliver. Else nothing
 * changes (but that a topic not in `next` may be there now, expecting 1: as it would be taken)
 * and None. A topic may come twice (its seqs then follow on). */
static PyObject *
take_mixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !Py_IS_TYPE(args[0], &SeqTableType) || !Py_IS_TYPE(args[1], &SeqTableType)
            || !Py_IS_TYPE(args[2], &NameTableType) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "take_mixed(SeqTable, SeqTable, NameTable, bytes, int, int, int)");
        return NULL;
    }
    SeqTable *next = (SeqTable *)args[0], *last = (SeqTable *)args[1];
    NameTable *names = (NameTable *)args[2];
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[3]);
    Py_ssize_t off = PyLong_AsSsize_t(args[4]), n = PyLong_AsSsize_t(args[5]);
    long long sseq = PyLong_AsLongLong(args[6]);
    if ((off == -1 || n == -1 || sseq == -1) && PyErr_Occurred())
        return NULL;
    if (n <= 0 || off > size || n > off / ENTRY || sseq < 0 || (uint64_t)sseq + n > SEQ_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "a mixed run's entries out of its datagram");
        return NULL;
    }
    const unsigned char *e = data + off - n * ENTRY;
    Py_ssize_t at = off;  /* the next payload */
    PyObject *out_names = PyList_New(n), *seqs = PyList_New(n), *payloads = PyList_New(n);
    if (out_names == NULL || seqs == NULL || payloads == NULL)
        goto fail;
    Py_ssize_t i;
    Py_ssize_t end = at;
    for (i = 0; i < n; i++) {
        const unsigned char *x = e + i * ENTRY;
        uint32_t topic = be32(x);
        uint64_t seq = be64(x + 4);
        NameSlot *name = (NameSlot *)ot_lookup(&names->tab, (uint64_t)topic + 1);
        Slot *s = find(next, topic);
        uint32_t len = be32(x + 12);
        if (s == NULL && seq == 1 && name != NULL) {
            /* the first message of its topic from this session: its topic starts here (put
             * back, it expects 1, which is what a topic not started yet takes too) */
            s = insert(next, topic);
            if (s == NULL) {
                put_back(next, e, i);
                goto fail;
            }
            s->value = 1;
        }
        if (name == NULL || s == NULL || seq >= SEQ_LIMIT || s->value != (int64_t)seq
                || len > size - end)
            break;
        end += len;
        s->value++;
        PyList_SET_ITEM(out_names, i, Py_NewRef(name->name));
    }
    if (i < n) {  /* not all in order: those moved are put back (a topic twice, twice) */
        put_back(next, e, i);
        Py_DECREF(out_names);
        Py_DECREF(seqs);
        Py_DECREF(payloads);
        Py_RETURN_NONE;
    }
    for (i = 0; i < n; i++) {
        const unsigned char *x = e + i * ENTRY;
        uint32_t len = be32(x + 12);
        PyObject *seq = PyLong_FromUnsignedLongLong(be64(x + 4));
        PyObject *payload = PyBytes_FromStringAndSize((const char *)data + at, len);
        if (seq == NULL || payload == NULL) {
            Py_XDECREF(seq);
            Py_XDECREF(payload);
            put_back(next, e, n);
            goto fail;
        }
        PyList_SET_ITEM(seqs, i, seq);
        PyList_SET_ITEM(payloads, i, payload);
        at += len;
    }
    for (i = 0; i < n; i++) {
        Slot *s = insert(last, be32(e + i * ENTRY));
        if (s == NULL) {
            put_back(next, e, n);
            goto fail;
        }
        s->value = sseq + i;
    }
    return Py_BuildValue("(NNNn)", out_names, seqs, payloads, end - off);
fail:
    Py_XDECREF(out_names);
    Py_XDECREF(seqs);
    Py_XDECREF(payloads);
    return NULL;
}

static PyObject *
table_repr(SeqTable *t)
{
    return PyUnicode_FromFormat("SeqTable(%zd topics)", t->tab.len);
}

static PyMethodDef table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))table_get, METH_FASTCALL,
     "get(topic, default=None): the topic's number, or default."},
    {"items", (PyCFunction)table_items, METH_NOARGS,
     "items(): (topic, number) pairs in insertion order (a snapshot)."},
    {"keys_after", (PyCFunction)table_keys_after, METH_O,
     "keys_after(n): the topics put in after the first n, in insertion order."},
    {NULL, NULL, 0, NULL},
};

OT_TABLE_TYPE(SeqTableType, "scopecast.netio._seq_table.SeqTable", sizeof(SeqTable),
              "topic id (u32) -> 64-bit int, compact; keys never taken out", table_iter);

static PyMethodDef module_methods[] = {
    {"mixed_extent", (PyCFunction)(void (*)(void))mixed_extent, METH_FASTCALL,
     "mixed_extent(view, offset, n) -> payload bytes, or -1, -2, -3 (see the module source)."},
    {"take_mixed", (PyCFunction)(void (*)(void))take_mixed, METH_FASTCALL,
     "take_mixed(next, last, names, data, offset, n, first_sseq) -> (names, seqs, payloads, "
     "payload bytes) or None (see the module source)."},
    {"mixed_parts", (PyCFunction)(void (*)(void))mixed_parts, METH_FASTCALL,
     "mixed_parts(head, messages) -> [head, entries, payloads...] (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_seq_table",
    "Compact per-topic numbers of a receiver's source sessions.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__seq_table(void)
{
    PyObject *m = ot_module(&module, &SeqTableType, "SeqTable");
    if (m != NULL && (PyType_Ready(&NameTableType) < 0
                      || PyModule_AddObjectRef(m, "NameTable", (PyObject *)&NameTableType) < 0))
        Py_CLEAR(m);
    return m;
}
