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

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    int64_t value;
    uint32_t key;
    uint32_t used;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;        /* capacity - 1; capacity a power of two, at least twice len */
    uint32_t *order;    /* keys in insertion order */
    Py_ssize_t len;
    Py_ssize_t order_cap;
} SeqTable;

static PyTypeObject SeqTableType;

static inline Slot *
find(const SeqTable *t, uint32_t key)
{
    size_t i = key & t->mask;
    for (;;) {
        Slot *s = &t->slots[i];
        if (!s->used || s->key == key)
            return s;
        i = (i + 1) & t->mask;
    }
}

static int
grow(SeqTable *t)
{
    size_t cap = (t->mask + 1) * 2;
    Slot *slots = PyMem_Calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Slot *old = t->slots;
    size_t old_cap = t->mask + 1;
    t->slots = slots;
    t->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].used)
            *find(t, old[i].key) = old[i];
    PyMem_Free(old);
    return 0;
}

/* The slot of `key`, made (value 0) if there is none; NULL on memory error. */
static Slot *
insert(SeqTable *t, uint32_t key)
{
    Slot *s = find(t, key);
    if (s->used)
        return s;
    if ((size_t)(t->len + 1) * 2 > t->mask + 1) {
        if (grow(t) < 0)
            return NULL;
        s = find(t, key);
    }
    if (t->len == t->order_cap) {
        Py_ssize_t cap = t->order_cap ? t->order_cap * 2 : 8;
        uint32_t *order = PyMem_Realloc(t->order, cap * sizeof(uint32_t));
        if (order == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        t->order = order;
        t->order_cap = cap;
    }
    t->order[t->len++] = key;
    s->key = key;
    s->used = 1;
    s->value = 0;
    return s;
}

/* A Python int as a topic id; -1 (no exception) if it is not one. */
static int
as_key(PyObject *o, uint32_t *key)
{
    if (!PyLong_Check(o))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || v < 0 || v > UINT32_MAX) {
        PyErr_Clear();
        return -1;
    }
    *key = (uint32_t)v;
    return 0;
}

static PyObject *
table_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "SeqTable() takes no arguments");
        return NULL;
    }
    SeqTable *t = (SeqTable *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->slots = PyMem_Calloc(8, sizeof(Slot));
    if (t->slots == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    t->mask = 7;
    return (PyObject *)t;
}

static void
table_dealloc(SeqTable *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->order);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
table_len(SeqTable *t)
{
    return t->len;
}

/* The slot holding Python object `k` as a key; NULL (no exception) if there is none. */
static Slot *
lookup(SeqTable *t, PyObject *k)
{
    uint32_t key;
    if (as_key(k, &key) < 0)
        return NULL;
    Slot *s = find(t, key);
    return s->used ? s : NULL;
}

static PyObject *
table_getitem(SeqTable *t, PyObject *k)
{
    Slot *s = lookup(t, k);
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, k);
        return NULL;
    }
    return PyLong_FromLongLong(s->value);
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
table_contains(SeqTable *t, PyObject *k)
{
    return lookup(t, k) != NULL;
}

static PyObject *
table_get(SeqTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(topic, default=None)");
        return NULL;
    }
    Slot *s = lookup(t, args[0]);
    if (s == NULL)
        return Py_NewRef(nargs > 1 ? args[1] : Py_None);
    return PyLong_FromLongLong(s->value);
}

static PyObject *
keys_list(SeqTable *t, Py_ssize_t start)
{
    PyObject *out = PyList_New(t->len - start);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < t->len; i++) {
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
    return keys_list(t, n < t->len ? n : t->len);
}

static PyObject *
table_items(SeqTable *t, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(t->len);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < t->len; i++) {
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
        if (overflow || seq == -1 || !s->used || s->value != seq || seq == INT64_MAX)
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
    return PyUnicode_FromFormat("SeqTable(%zd topics)", t->len);
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

static PyMappingMethods table_as_mapping = {
    .mp_length = (lenfunc)table_len,
    .mp_subscript = (binaryfunc)table_getitem,
    .mp_ass_subscript = (objobjargproc)table_setitem,
};

static PySequenceMethods table_as_sequence = {
    .sq_contains = (objobjproc)table_contains,
};

static PyTypeObject SeqTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scopecast.netio._seq_table.SeqTable",
    .tp_doc = PyDoc_STR("topic id (u32) -> 64-bit int, compact; keys never taken out"),
    .tp_repr = (reprfunc)table_repr,
    .tp_basicsize = sizeof(SeqTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = table_new,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_as_mapping = &table_as_mapping,
    .tp_as_sequence = &table_as_sequence,
    .tp_iter = (getiterfunc)table_iter,
    .tp_methods = table_methods,
};

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
    if (PyType_Ready(&SeqTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "SeqTable", (PyObject *)&SeqTableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
