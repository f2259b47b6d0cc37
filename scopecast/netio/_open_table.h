/* The hash table under the compiled per-topic tables (_seq_table.c, _tail_table.c): slots of a
 * fixed size, each starting with its key as the table stores it, never 0 (0 marks an empty
 * slot: SeqTable stores a topic id plus one, TailTable a topic, never 0, and a session), found
 * by a hash the table chooses (& mask, linear probing), at most three quarters full; keys are
 * never taken out. A hash that keeps sequential topic ids sequential puts topics made together
 * side by side, so a publisher going round them walks the slots in order, and their probes
 * seldom meet another key: filling to 3/4 rather than 1/2 halves the bytes a topic of a member
 * of many topics (10,000 tails: 16,384 slots of 40 bytes, not 32,768). */

#ifndef SCOPECAST_OPEN_TABLE_H
#define SCOPECAST_OPEN_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef size_t (*ot_hash)(uint64_t stored);

typedef struct {
    char *slots;
    size_t mask;       /* capacity - 1; capacity a power of two, at least 4/3 of len */
    size_t size;       /* bytes per slot, the stored key first */
    ot_hash hash;
    Py_ssize_t len;
} OpenTable;

#define OT_STORED(slot) (*(uint64_t *)(slot))

#define SEQ_LIMIT ((int64_t)1 << 62)  /* wire.SEQ_LIMIT: the tables' seqs stay below */

static int
ot_init(OpenTable *t, size_t size, ot_hash hash)
{
    t->slots = PyMem_Calloc(8, size);
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = 7;
    t->size = size;
    t->hash = hash;
    t->len = 0;
    return 0;
}

/* The slot of `stored` (a stored key, never 0), or the empty slot where it would go. */
static inline char *
ot_find(const OpenTable *t, uint64_t stored)
{
    size_t i = t->hash(stored) & t->mask;
    for (;;) {
        char *s = t->slots + i * t->size;
        uint64_t k = OT_STORED(s);
        if (k == stored || k == 0)
            return s;
        i = (i + 1) & t->mask;
    }
}

/* The slot of `stored` if it is there, else NULL. */
static inline char *
ot_lookup(const OpenTable *t, uint64_t stored)
{
    char *s = ot_find(t, stored);
    return OT_STORED(s) ? s : NULL;
}

static int
ot_grow(OpenTable *t)
{
    size_t cap = (t->mask + 1) * 2;
    char *slots = PyMem_Calloc(cap, t->size);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char *old = t->slots;
    size_t old_cap = t->mask + 1;
    t->slots = slots;
    t->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++) {
        char *s = old + i * t->size;
        if (OT_STORED(s))
            memcpy(ot_find(t, OT_STORED(s)), s, t->size);
    }
    PyMem_Free(old);
    return 0;
}

/* The slot of `stored`, made (zeroed but for the key, *made set) if there is none; NULL on
 * memory error. */
static char *
ot_insert(OpenTable *t, uint64_t stored, int *made)
{
    char *s = ot_find(t, stored);
    *made = !OT_STORED(s);
    if (!*made)
        return s;
    if ((size_t)(t->len + 1) * 4 > (t->mask + 1) * 3) {
        if (ot_grow(t) < 0)
            return NULL;
        s = ot_find(t, stored);
    }
    OT_STORED(s) = stored;
    t->len++;
    return s;
}

/* A Python int in [0, 2**32) into *out; -1 (an exception set) if it is not one. */
static int
ot_u32(PyObject *o, uint32_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (v > UINT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%R is not a 32-bit id", o);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* ---- the Python side shared by the table types: each type's object starts with this */

typedef struct {
    PyObject_HEAD
    OpenTable tab;
} TableObject;

typedef char *(*ot_key_lookup)(TableObject *t, PyObject *key);  /* NULL, no exception: none */
typedef PyObject *(*ot_value)(const char *slot);

/* tp_new of a table type: takes no arguments; slots of `size` bytes found by `hash`. */
static PyObject *
ot_object_new(PyTypeObject *type, PyObject *args, PyObject *kwds, size_t size, ot_hash hash)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments", type->tp_name);
        return NULL;
    }
    TableObject *t = (TableObject *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    if (ot_init(&t->tab, size, hash) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static void
ot_object_dealloc(TableObject *t)
{
    PyMem_Free(t->tab.slots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
ot_object_len(TableObject *t)
{
    return t->tab.len;
}

/* t[k]: the value of k's slot, KeyError if there is none. */
static PyObject *
ot_object_getitem(TableObject *t, PyObject *k, ot_key_lookup lookup, ot_value value)
{
    char *s = lookup(t, k);
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, k);
        return NULL;
    }
    return value(s);
}

/* t.get(k, default=None). */
static PyObject *
ot_object_get(TableObject *t, PyObject *const *args, Py_ssize_t nargs, ot_key_lookup lookup,
              ot_value value)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    char *s = lookup(t, args[0]);
    if (s == NULL)
        return Py_NewRef(nargs > 1 ? args[1] : Py_None);
    return value(s);
}

/* A table type `var` (Python name `qualname`, object size `size`, tp_iter `iter` or NULL),
 * made of the functions each table file names alike: table_new, table_dealloc, table_repr,
 * table_getitem, table_setitem, table_contains and table_methods. */
#define OT_TABLE_TYPE(var, qualname, size, doc, iter)                                        \
    static PyMappingMethods table_as_mapping = {                                              \
        .mp_length = (lenfunc)ot_object_len,                                                  \
        .mp_subscript = (binaryfunc)table_getitem,                                            \
        .mp_ass_subscript = (objobjargproc)table_setitem,                                     \
    };                                                                                        \
    static PySequenceMethods table_as_sequence = {.sq_contains = (objobjproc)table_contains}; \
    static PyTypeObject var = {                                                               \
        PyVarObject_HEAD_INIT(NULL, 0)                                                        \
        .tp_name = qualname,                                                                  \
        .tp_doc = PyDoc_STR(doc),                                                             \
        .tp_repr = (reprfunc)table_repr,                                                      \
        .tp_basicsize = size,                                                                 \
        .tp_flags = Py_TPFLAGS_DEFAULT,                                                       \
        .tp_new = table_new,                                                                  \
        .tp_dealloc = (destructor)table_dealloc,                                              \
        .tp_as_mapping = &table_as_mapping,                                                   \
        .tp_as_sequence = &table_as_sequence,                                                 \
        .tp_iter = (getiterfunc)(iter),                                                       \
        .tp_methods = table_methods,                                                          \
    }

/* A module holding one table type under `name`. */
static PyObject *
ot_module(PyModuleDef *def, PyTypeObject *type, const char *name)
{
    if (PyType_Ready(type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(def);
    if (m != NULL && PyModule_AddObjectRef(m, name, (PyObject *)type) < 0)
        Py_CLEAR(m);
    return m;
}

#endif
