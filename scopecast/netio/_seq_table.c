/* A receiver's numbers of one source session by topic: topic id (u32) -> signed 64-bit int.
 *
 * A receiver keeps, per source session, each topic's next seq and last stream seq (see
 * key_table.py). As Python dicts of ints, every message of a run across thousands of topics cost
 * several cache misses (hash index, entry, key object, value object, a new value object) besides
 * the interpreter's work; here a topic is one 16-byte slot found by its id (ids are handed out
 * in sequence, so topics made together sit side by side, and a publisher going round them walks
 * the slots in order), and `take_in_order` checks and moves a whole mixed run in one C loop.
 * Keys are never taken out; iteration follows insertion order. Values are 64-bit: a larger one
 * is an OverflowError (the wire bounds seqs below that, see wire.SEQ_LIMIT). */

#include "_open_table.h"

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

/* take_in_order(next, last, entries, first_sseq) -> bool: a mixed run's entries (topic, seq,
 * length, flat) are each the next of its topic in `next`; if so, every topic's next seq moves
 * past its message and its last stream seq (in `last`, made if new) becomes the message's, and
 * True. Else nothing changes and False. A topic may come twice (its seqs then follow on). */
static PyObject *
take_in_order(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !Py_IS_TYPE(args[0], &SeqTableType) || !Py_IS_TYPE(args[1], &SeqTableType)
            || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "take_in_order(SeqTable, SeqTable, tuple, int)");
        return NULL;
    }
    SeqTable *next = (SeqTable *)args[0], *last = (SeqTable *)args[1];
    PyObject *entries = args[2];
    long long sseq = PyLong_AsLongLong(args[3]);
    if (sseq == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(entries) / 3;
    if (n == 0 || PyTuple_GET_SIZE(entries) % 3 || sseq > INT64_MAX - n)
        Py_RETURN_FALSE;
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        uint32_t key;
        int overflow;
        if (as_key(PyTuple_GET_ITEM(entries, 3 * i), &key) < 0)
            break;
        long long seq = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(entries, 3 * i + 1),
                                                     &overflow);
        Slot *s = find(next, key);
        if (overflow || seq == -1 || s == NULL || s->value != seq || seq == INT64_MAX)
            break;
        s->value = seq + 1;
    }
    if (i < n) {  /* not all in order: those moved are put back (a topic twice, twice) */
        PyErr_Clear();
        while (i-- > 0) {
            uint32_t key = 0;  /* (checked in the first pass) */
            as_key(PyTuple_GET_ITEM(entries, 3 * i), &key);
            find(next, key)->value--;
        }
        Py_RETURN_FALSE;
    }
    for (i = 0; i < n; i++) {
        uint32_t key = 0;
        as_key(PyTuple_GET_ITEM(entries, 3 * i), &key);
        Slot *s = insert(last, key);
        if (s == NULL)
            return NULL;
        s->value = sseq + i;
    }
    Py_RETURN_TRUE;
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
    {"take_in_order", (PyCFunction)(void (*)(void))take_in_order, METH_FASTCALL,
     "take_in_order(next, last, entries, first_sseq) -> bool (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_seq_table",
    "Compact per-topic numbers of a receiver's source sessions.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__seq_table(void)
{
    return ot_module(&module, &SeqTableType, "SeqTable");
}
