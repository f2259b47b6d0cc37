/* Batches of MTU-sized datagrams in one C loop each: what a GSO send call carries and what a GRO
 * receive call brings, in the common case of one plain run of one stream per datagram.
 *
 * With MTU-sized datagrams a 1 KB message is a datagram, and a system call carries some 40 of
 * them. Built or taken one by one in Python (runs, header, MAC, routing table, order,
 * bookkeeping) a datagram cost ~6 us to send and ~10 us to receive, several times what the
 * kernel spends on it.
 *
 * Both take the cluster key and whether the cluster encrypts (auth.GcmSealer): AES-256-GCM with
 * the 28-byte header as associated data and the rest of the datagram as plaintext (encrypted), or
 * the whole datagram as associated data and nothing encrypted (GMAC).
 *
 * BatchScanner (receive, see receive_path._take_segments): each segment's tag is checked
 * (OpenSSL, the cipher the `cryptography` package uses; an encrypted segment is decrypted into
 * the scanner's scratch buffer, the receive buffer is left as it came), its header and run are read and checked
 * as wire.unpack_header and wire.iter_runs do, and as long as each continues the one before
 * (same sender, channel, routing table, topic, source, session, stream, content type; the next
 * datagram number, seq and stream seq) they become one run: its payload lengths and its payloads
 * copied end to end. The fragments of one message (wire.FRAGMENT), all in the call from the
 * first on, become that message. A segment that is anything else (a MAC that fails, a control
 * or repair datagram, a fragment not so, several runs, a mixed run, an end marker, malformed)
 * ends the scan; the caller takes it the slow way, which counts its drop or handles it (its
 * reassembler takes a message's fragments that come over several calls).
 *
 * BatchSealer (send, see sealed_batches): the datagrams of consecutive plain chunks of a feed
 * (one run each), of a member's messages that each fill a datagram alone (seal_lone, from the
 * items its own-stream cache keeps: no run object each), or the fragments of one message larger
 * than a datagram, padded to one segment size but the last (see wire.padded) and signed as
 * auth.GmacAuthenticator signs, in one buffer for one GSO send call.
 *
 * Wire layout (see wire.py): header "!2sBBBBHIHHQI" (magic, version, type, flags, reserved, runs,
 * sender, channel, pad, datagram number, stamp), routing table (u16 length, msgpack), run
 * "!IIIQIQBBH" (topic, source, session, first seq, stream, first stream seq, content type, route
 * index, messages), u32 length each, payloads, `pad` zero bytes, then the 28-byte GMAC trailer
 * (12-byte nonce, 16-byte tag over everything before it). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#define HEADER_SIZE 28
#define RUN_SIZE 36
#define TRAILER 28
#define NONCE 12
#define TAG 16
#define VERSION 9
#define ABI 4  /* what seal() and scan() take and give (native.DATAGRAM_ABI); 2: fragments;
                 3: BatchScanner(key, encrypt), BatchSealer(key, encrypt); 4: seal_lone() */
#define PTYPE_DATA 1
#define FLAG_FRAGMENT 0x01
#define FRAGMENT_SIZE 16
#define CTYPE_END 3
#define SEQ_LIMIT (1ULL << 62)
#define MAX_SEGMENTS 128
#define MAX_DATAGRAM 65507

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t be64(const unsigned char *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }
static inline void put16(unsigned char *p, uint16_t v) { p[0] = v >> 8; p[1] = v & 0xFF; }
static inline void put32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = (v >> 16) & 0xFF; p[2] = (v >> 8) & 0xFF; p[3] = v & 0xFF;
}
static inline void put64(unsigned char *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }

/* An AES-256-GCM context under the 32-byte cluster key, to encrypt (sign) or decrypt (check),
 * and whether datagrams are encrypted (`*secret`); 0, or -1 with an exception set. */
static int
keyed_init(EVP_CIPHER_CTX **ctx, int *secret, PyObject *args, int encrypt)
{
    Py_buffer key;
    int ok;
    *secret = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &key, secret))
        return -1;
    if (key.len != 32) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "the cluster key is 32 bytes");
        return -1;
    }
    if (*ctx == NULL)
        *ctx = EVP_CIPHER_CTX_new();
    ok = *ctx != NULL
        && EVP_CipherInit_ex(*ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, encrypt) == 1
        && EVP_CIPHER_CTX_ctrl(*ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) == 1
        && EVP_CipherInit_ex(*ctx, NULL, NULL, key.buf, NULL, encrypt) == 1;
    PyBuffer_Release(&key);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL refused AES-256-GCM");
        return -1;
    }
    return 0;
}

static void
keyed_free(EVP_CIPHER_CTX *ctx, PyObject *self)
{
    if (ctx != NULL)
        EVP_CIPHER_CTX_free(ctx);
    Py_TYPE(self)->tp_free(self);
}

/* ---------------------------------------------------------------------------- receiving */

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *ctx;
    int secret;              /* datagrams are encrypted after their header */
    unsigned char *scratch;  /* (secret) a call's segments decrypted, at their offsets */
    Py_ssize_t scratch_len;
} BatchScanner;

/* What one segment holds when it is a plain single-run data datagram, or a fragment of one
 * message (`fragment`: then its fragment struct, and a run of that one message's piece); else
 * not filled. */
typedef struct {
    uint32_t sender, topic, source, session, stream, count;
    uint32_t ftotal, findex, fcount, fchunk;
    uint16_t channel, table_len;
    uint8_t flags, ctype, fragment;
    uint64_t dseq, seq, sseq;
    const unsigned char *table, *lengths, *payloads;
    Py_ssize_t payload_bytes;
} Segment;

static int
gmac_ok(EVP_CIPHER_CTX *ctx, const unsigned char *data, Py_ssize_t n)
{
    int outl;
    unsigned char out[16];
    const unsigned char *nonce = data + n, *tag = data + n + NONCE;
    if (n > INT32_MAX)
        return 0;
    if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1
        || EVP_DecryptUpdate(ctx, NULL, &outl, data, (int)n) != 1
        || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, (void *)tag) != 1)
        return 0;
    return EVP_DecryptFinal_ex(ctx, out, &outl) == 1;
}

/* Decrypt the `n` bytes before the trailer at `data` into `out` (the header copied as it is):
 * 1 if the tag checks. */
static int
gcm_open(EVP_CIPHER_CTX *ctx, const unsigned char *data, Py_ssize_t n, unsigned char *out)
{
    int outl;
    unsigned char fin[16];
    const unsigned char *nonce = data + n, *tag = data + n + NONCE;
    if (n > INT32_MAX || n < HEADER_SIZE)
        return 0;
    memcpy(out, data, HEADER_SIZE);
    return EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) == 1
        && EVP_DecryptUpdate(ctx, NULL, &outl, data, HEADER_SIZE) == 1
        && EVP_DecryptUpdate(ctx, out + HEADER_SIZE, &outl, data + HEADER_SIZE,
                             (int)(n - HEADER_SIZE)) == 1
        && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, (void *)tag) == 1
        && EVP_DecryptFinal_ex(ctx, fin, &outl) == 1;
}

/* 1 and `s` filled if the `len` bytes at `data` are an authentic plain single-run data datagram
 * or a well-formed fragment; 0 otherwise (the slow path decides what it is). Encrypted, the
 * segment is read from its plaintext, which `plain` (as long) receives. */
static int
read_segment(EVP_CIPHER_CTX *ctx, const unsigned char *data, Py_ssize_t len, Segment *s,
             unsigned char *plain)
{
    Py_ssize_t n = len - TRAILER, end, off;
    uint16_t pad;
    uint64_t total = 0;
    if (n < HEADER_SIZE + 2 + RUN_SIZE)
        return 0;
    if (data[0] != 'S' || data[1] != 'C' || data[2] != VERSION || data[3] != PTYPE_DATA)
        return 0;
    if (plain != NULL) {
        if (!gcm_open(ctx, data, n, plain))
            return 0;
        data = plain;
    }
    s->flags = data[4];
    s->fragment = (s->flags & FLAG_FRAGMENT) != 0;
    if (be16(data + 6) != 1)
        return 0;
    pad = be16(data + 14);
    if (HEADER_SIZE + (Py_ssize_t)pad > n)
        return 0;
    end = n - pad;
    s->sender = be32(data + 8);
    s->channel = be16(data + 12);
    s->dseq = be64(data + 16);
    s->table_len = be16(data + HEADER_SIZE);
    s->table = data + HEADER_SIZE + 2;
    off = HEADER_SIZE + 2 + s->table_len;
    if (s->fragment) {  /* (total, index, count, chunk), as wire.FRAGMENT */
        if (off + FRAGMENT_SIZE > end)
            return 0;
        s->ftotal = be32(data + off);
        s->findex = be32(data + off + 4);
        s->fcount = be32(data + off + 8);
        s->fchunk = be32(data + off + 12);
        if (s->fcount == 0 || s->findex >= s->fcount || s->fchunk == 0
            || (uint64_t)s->ftotal > (uint64_t)s->fcount * s->fchunk)
            return 0;
        off += FRAGMENT_SIZE;
    }
    if (off + RUN_SIZE > end)
        return 0;
    {
        const unsigned char *r = data + off;
        s->topic = be32(r);
        s->source = be32(r + 4);
        s->session = be32(r + 8);
        s->seq = be64(r + 12);
        s->stream = be32(r + 20);
        s->sseq = be64(r + 24);
        s->ctype = r[32];
        s->count = be16(r + 34);
        if (s->topic == 0 || r[33] != 0 || s->count == 0 || s->ctype == CTYPE_END
            || s->seq + s->count > SEQ_LIMIT || s->sseq + s->count > SEQ_LIMIT
            || (s->fragment && s->count != 1))
            return 0;
    }
    off += RUN_SIZE;
    if (off + 4 * (Py_ssize_t)s->count > end)
        return 0;
    s->lengths = data + off;
    off += 4 * (Py_ssize_t)s->count;
    for (uint32_t i = 0; i < s->count; i++)
        total += be32(s->lengths + 4 * i);
    if ((uint64_t)(end - off) != total)
        return 0;
    s->payloads = data + off;
    s->payload_bytes = (Py_ssize_t)total;
    return plain != NULL || gmac_ok(ctx, data, n);
}

static int
continues(const Segment *a, const Segment *b)
{
    return !a->fragment && !b->fragment
        && b->sender == a->sender && b->channel == a->channel && b->dseq == a->dseq + 1
        && b->table_len == a->table_len && memcmp(b->table, a->table, a->table_len) == 0
        && b->topic == a->topic && b->source == a->source && b->session == a->session
        && b->stream == a->stream && b->ctype == a->ctype
        && b->seq == a->seq + a->count && b->sseq == a->sseq + a->count;
}

/* `b` is the next fragment of the message whose fragment `a` is: same sender, channel, table and
 * message, the next datagram and index, `a` a whole chunk. */
static int
next_piece(const Segment *a, const Segment *b)
{
    return a->fragment && b->fragment && b->sender == a->sender && b->channel == a->channel
        && b->dseq == a->dseq + 1 && b->table_len == a->table_len
        && memcmp(b->table, a->table, a->table_len) == 0
        && b->topic == a->topic && b->source == a->source && b->session == a->session
        && b->stream == a->stream && b->ctype == a->ctype && b->seq == a->seq
        && b->sseq == a->sseq && b->ftotal == a->ftotal && b->fcount == a->fcount
        && b->fchunk == a->fchunk && b->findex == a->findex + 1
        && a->payload_bytes == (Py_ssize_t)a->fchunk;
}

PyDoc_STRVAR(scan_doc,
"scan(buffer, segment, start) -> tuple | None\n\n"
"From byte `start` of a GRO receive call's `buffer` (segments of `segment` bytes, the last may\n"
"be shorter): None if the segment there is not an authentic plain single-run data datagram;\n"
"else (end offset, segments, sender, channel, first datagram number, last, flags of any,\n"
"routing table bytes, topic, source, session, first seq, stream, first stream seq, content\n"
"type, payload lengths, payloads end to end) of it and the segments after it that continue it.\n"
"A fragment there is taken only with the rest of its message after it (index 0 first): then\n"
"the same tuple, of the one reassembled message.");

static PyObject *
scan(BatchScanner *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t segment, start, pos, nsegs = 0, total = 0, messages = 0;
    Segment segs[MAX_SEGMENTS];
    uint8_t flags = 0;
    PyObject *lengths = NULL, *payloads = NULL, *table = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &segment, &start))
        return NULL;
    if (segment <= 0 || start < 0) {
        PyErr_SetString(PyExc_ValueError, "segment must be positive, start not negative");
        goto done;
    }
    if (self->secret && self->scratch_len < buf.len) {
        unsigned char *grown = PyMem_Realloc(self->scratch, buf.len);
        if (grown == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        self->scratch = grown;
        self->scratch_len = buf.len;
    }
    for (pos = start; pos < buf.len && nsegs < MAX_SEGMENTS; pos += segment) {
        Py_ssize_t len = buf.len - pos < segment ? buf.len - pos : segment;
        Segment *s = &segs[nsegs];
        if (!read_segment(self->ctx, (const unsigned char *)buf.buf + pos, len, s,
                          self->secret ? self->scratch + pos : NULL))
            break;
        if (segs[0].fragment) {  /* one message's fragments, whole, or nothing */
            if (nsegs ? !next_piece(&segs[nsegs - 1], s) : s->findex != 0)
                break;
            flags |= s->flags & ~FLAG_FRAGMENT;
            total += s->payload_bytes;
            nsegs++;
            if (s->findex + 1 == s->fcount) {
                messages = 1;
                break;
            }
            continue;
        }
        if (nsegs && !continues(&segs[nsegs - 1], s))
            break;
        if (messages + s->count > 0xFFFF)  /* wire.MAX_RUN: still one run */
            break;
        flags |= s->flags;
        total += s->payload_bytes;
        messages += s->count;
        nsegs++;
    }
    if (nsegs == 0 || (segs[0].fragment && (messages != 1 || total != segs[0].ftotal))) {
        result = Py_NewRef(Py_None);  /* (fragments of a message not all here: the slow path) */
        goto done;
    }
    lengths = PyTuple_New(messages);
    payloads = PyBytes_FromStringAndSize(NULL, total);
    table = PyBytes_FromStringAndSize((const char *)segs[0].table, segs[0].table_len);
    if (lengths == NULL || payloads == NULL || table == NULL)
        goto done;
    {
        char *out = PyBytes_AS_STRING(payloads);
        Py_ssize_t k = 0;
        if (segs[0].fragment) {
            PyObject *v = PyLong_FromUnsignedLong(segs[0].ftotal);
            if (v == NULL)
                goto done;
            PyTuple_SET_ITEM(lengths, k++, v);
        }
        for (Py_ssize_t j = 0; j < nsegs; j++) {
            for (uint32_t i = 0; i < segs[j].count && !segs[0].fragment; i++) {
                PyObject *v = PyLong_FromUnsignedLong(be32(segs[j].lengths + 4 * i));
                if (v == NULL)
                    goto done;
                PyTuple_SET_ITEM(lengths, k++, v);
            }
            memcpy(out, segs[j].payloads, segs[j].payload_bytes);
            out += segs[j].payload_bytes;
        }
    }
    {
        const Segment *f = &segs[0];
        Py_ssize_t stop = start + nsegs * segment;
        result = Py_BuildValue("nnkHKKBOkkkKkKBOO", stop < buf.len ? stop : buf.len, nsegs,
                               (unsigned long)f->sender, f->channel,
                               (unsigned long long)f->dseq,
                               (unsigned long long)segs[nsegs - 1].dseq, flags, table,
                               (unsigned long)f->topic, (unsigned long)f->source,
                               (unsigned long)f->session, (unsigned long long)f->seq,
                               (unsigned long)f->stream, (unsigned long long)f->sseq, f->ctype,
                               lengths, payloads);
    }
done:
    Py_XDECREF(lengths);
    Py_XDECREF(payloads);
    Py_XDECREF(table);
    PyBuffer_Release(&buf);
    return result;
}

static int
scanner_init(BatchScanner *self, PyObject *args, PyObject *kwds)
{
    return keyed_init(&self->ctx, &self->secret, args, 0);
}

static void
scanner_dealloc(BatchScanner *self)
{
    PyMem_Free(self->scratch);
    keyed_free(self->ctx, (PyObject *)self);
}

static PyMethodDef scanner_methods[] = {
    {"scan", (PyCFunction)scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BatchScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scopecast.netio._datagram_batch.BatchScanner",
    .tp_doc = PyDoc_STR("BatchScanner(cluster_key, encrypt=False): reads a GRO batch's plain runs"),
    .tp_basicsize = sizeof(BatchScanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

/* ------------------------------------------------------------------------------ sending */

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *ctx;
    int secret;                   /* encrypt what follows each header */
    unsigned char nonce[NONCE];   /* 8 random bytes, then a 32-bit counter (as auth.py) */
    uint32_t counter;
} BatchSealer;

/* One plain run as the caller passes it: (topic, source, session, first seq, stream, first
 * stream seq, content type, payloads, stamp[, fragment]); with a fragment (total, index, count,
 * chunk) it is one piece of a message larger than a datagram (its one payload). */
typedef struct {
    unsigned long topic, source, session, stream, stamp;
    unsigned long frag[4];
    int fragment;
    unsigned long long seq, sseq;
    unsigned char ctype;
    PyObject *payloads;  /* a list of payloads, or NULL: the one payload `one` */
    PyObject *one;
    Py_ssize_t size;   /* the datagram's bytes before padding and MAC */
} PlainRun;

static inline Py_ssize_t
run_count(const PlainRun *r)
{
    return r->payloads != NULL ? PyList_GET_SIZE(r->payloads) : 1;
}

static inline PyObject *
run_payload(const PlainRun *r, Py_ssize_t j)
{
    return r->payloads != NULL ? PyList_GET_ITEM(r->payloads, j) : r->one;
}

static int
sign(BatchSealer *self, unsigned char *data, Py_ssize_t n)
{
    int outl;
    unsigned char out[16];
    if (++self->counter == 0) {   /* 2^32 datagrams: a new prefix, as auth.py does */
        if (RAND_bytes(self->nonce, 8) != 1)
            return 0;
        self->counter = 1;
    }
    put32(self->nonce + 8, self->counter);
    memcpy(data + n, self->nonce, NONCE);
    if (n > INT32_MAX)
        return 0;
    if (self->secret)  /* the header authenticated, the rest encrypted in place */
        return EVP_EncryptInit_ex(self->ctx, NULL, NULL, NULL, self->nonce) == 1
            && EVP_EncryptUpdate(self->ctx, NULL, &outl, data, HEADER_SIZE) == 1
            && EVP_EncryptUpdate(self->ctx, data + HEADER_SIZE, &outl, data + HEADER_SIZE,
                                 (int)(n - HEADER_SIZE)) == 1
            && EVP_EncryptFinal_ex(self->ctx, out, &outl) == 1
            && EVP_CIPHER_CTX_ctrl(self->ctx, EVP_CTRL_GCM_GET_TAG, TAG, data + n + NONCE) == 1;
    return EVP_EncryptInit_ex(self->ctx, NULL, NULL, NULL, self->nonce) == 1
        && EVP_EncryptUpdate(self->ctx, NULL, &outl, data, (int)n) == 1
        && EVP_EncryptFinal_ex(self->ctx, out, &outl) == 1
        && EVP_CIPHER_CTX_ctrl(self->ctx, EVP_CTRL_GCM_GET_TAG, TAG, data + n + NONCE) == 1;
}

/* A payload's size, copied to `to` unless NULL: a bytes object, or any contiguous buffer (the
 * DataFrame publisher queues views); -1 with an exception set for anything else. */
static Py_ssize_t
payload_copy(PyObject *payload, unsigned char *to)
{
    Py_buffer view;
    Py_ssize_t size;
    if (PyBytes_Check(payload)) {
        size = PyBytes_GET_SIZE(payload);
        if (to != NULL)
            memcpy(to, PyBytes_AS_STRING(payload), size);
        return size;
    }
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0)
        return -1;
    size = view.len;
    if (to != NULL)
        memcpy(to, view.buf, size);
    PyBuffer_Release(&view);
    return size;
}

/* Size run `r` (its `size`, the largest segment so far in `*segment`, its payload bytes added
 * to `*payload_bytes`); 0 with an exception set if it is no datagram. */
static int
size_run(PlainRun *r, Py_ssize_t table_len, Py_ssize_t *segment, Py_ssize_t *payload_bytes)
{
    Py_ssize_t count = run_count(r);
    r->size = HEADER_SIZE + table_len + (r->fragment ? FRAGMENT_SIZE : 0) + RUN_SIZE + 4 * count;
    for (Py_ssize_t j = 0; j < count; j++) {
        Py_ssize_t size = payload_copy(run_payload(r, j), NULL);
        if (size < 0)
            return 0;
        r->size += size;
        *payload_bytes += size;
    }
    if (r->size + TRAILER > MAX_DATAGRAM) {
        PyErr_SetString(PyExc_ValueError, "a run larger than a datagram");
        return 0;
    }
    if (r->size + TRAILER > *segment)
        *segment = r->size + TRAILER;
    return 1;
}

/* The sized runs[0..n) as one buffer of sealed datagrams numbered from `first_dseq`: (buffer,
 * segment, payload bytes), or (buffer, segment) where `payload_bytes` < 0; NULL with an
 * exception set. */
static PyObject *
build(BatchSealer *self, unsigned long sender, unsigned long channel,
      unsigned long long first_dseq, unsigned char flags, const Py_buffer *table,
      PlainRun *runs, Py_ssize_t n, Py_ssize_t segment, Py_ssize_t payload_bytes)
{  /* (payload_bytes < 0: the pair (buffer, segment)) */
    Py_ssize_t total = (n - 1) * segment + runs[n - 1].size + TRAILER;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    unsigned char *d;
    if (out == NULL)
        return NULL;
    d = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, d += segment) {
        PlainRun *r = &runs[i];
        Py_ssize_t count = run_count(r);
        Py_ssize_t body = i < n - 1 ? segment - TRAILER : r->size;
        unsigned char *p = d;
        p[0] = 'S'; p[1] = 'C'; p[2] = VERSION; p[3] = PTYPE_DATA;
        p[4] = flags | (r->fragment ? FLAG_FRAGMENT : 0); p[5] = 0;
        put16(p + 6, 1);
        put32(p + 8, (uint32_t)sender);
        put16(p + 12, (uint16_t)channel);
        put16(p + 14, (uint16_t)(body - r->size));
        put64(p + 16, first_dseq + i);
        put32(p + 24, (uint32_t)r->stamp);
        p += HEADER_SIZE;
        memcpy(p, table->buf, table->len);
        p += table->len;
        if (r->fragment) {
            for (int k = 0; k < 4; k++)
                put32(p + 4 * k, (uint32_t)r->frag[k]);
            p += FRAGMENT_SIZE;
        }
        put32(p, (uint32_t)r->topic);
        put32(p + 4, (uint32_t)r->source);
        put32(p + 8, (uint32_t)r->session);
        put64(p + 12, r->seq);
        put32(p + 20, (uint32_t)r->stream);
        put64(p + 24, r->sseq);
        p[32] = r->ctype;
        p[33] = 0;
        put16(p + 34, (uint16_t)count);
        p += RUN_SIZE;
        {
            unsigned char *lengths = p;
            p += 4 * count;
            for (Py_ssize_t j = 0; j < count; j++) {
                Py_ssize_t size = payload_copy(run_payload(r, j), p);
                if (size < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
                put32(lengths + 4 * j, (uint32_t)size);
                p += size;
            }
        }
        memset(p, 0, body - r->size);
        if (!sign(self, d, body)) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to sign");
            Py_DECREF(out);
            return NULL;
        }
    }
    if (payload_bytes < 0)
        return Py_BuildValue("Nn", out, n > 1 ? segment : (Py_ssize_t)0);
    return Py_BuildValue("Nnn", out, n > 1 ? segment : (Py_ssize_t)0, payload_bytes);
}

static int
batch_args_ok(Py_ssize_t n, unsigned long sender, unsigned long channel)
{
    if (n < 1 || n > MAX_SEGMENTS || sender > UINT32_MAX || channel > UINT16_MAX) {
        PyErr_SetString(PyExc_ValueError, "1 to 128 runs, a 32-bit sender, a 16-bit channel");
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(seal_doc,
"seal(sender, channel, first_dseq, flags, table, runs) -> (buffer, segment)\n\n"
"The data datagrams of `runs` (each (topic, source, session, first seq, stream, first stream\n"
"seq, content type, payloads, stamp (see wire.stamp_now)[, fragment (total, index, count,\n"
"chunk): a FRAGMENT datagram of the run's one payload]): one datagram each, numbered from\n"
"`first_dseq`, under the encoded routing table `table` (its u16 length first)), each but the\n"
"last padded to the largest one's size, `segment`, and sealed (signed, or encrypted after the\n"
"header): one buffer for one GSO send call.");

static PyObject *
seal(BatchSealer *self, PyObject *args)
{
    unsigned long sender, channel;
    unsigned long long first_dseq;
    unsigned char flags;
    Py_buffer table;
    PyObject *runs_obj, *out = NULL;
    PlainRun runs[MAX_SEGMENTS];
    Py_ssize_t n, segment = 0, payload_bytes = 0;
    if (!PyArg_ParseTuple(args, "kkKby*O!", &sender, &channel, &first_dseq, &flags, &table,
                          &PyList_Type, &runs_obj))
        return NULL;
    n = PyList_GET_SIZE(runs_obj);
    if (!batch_args_ok(n, sender, channel))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PlainRun *r = &runs[i];
        Py_ssize_t count;
        PyObject *frag = Py_None;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(runs_obj, i), "kkkKkKbO!k|O", &r->topic, &r->source,
                              &r->session, &r->seq, &r->stream, &r->sseq, &r->ctype,
                              &PyList_Type, &r->payloads, &r->stamp, &frag))
            goto done;
        r->one = NULL;
        count = PyList_GET_SIZE(r->payloads);
        if (count < 1 || count > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "a run holds 1..65535 messages");
            goto done;
        }
        r->fragment = frag != Py_None;
        if (r->fragment) {
            if (!PyArg_ParseTuple(frag, "kkkk", &r->frag[0], &r->frag[1], &r->frag[2], &r->frag[3]))
                goto done;
            if (count != 1 || r->frag[0] > UINT32_MAX || r->frag[3] > UINT32_MAX
                || r->frag[2] < 1 || r->frag[2] > UINT32_MAX || r->frag[1] >= r->frag[2]) {
                PyErr_SetString(PyExc_ValueError, "a fragment is one payload, index < count");
                goto done;
            }
        }
        if (!size_run(r, table.len, &segment, &payload_bytes))
            goto done;
    }
    out = build(self, sender, channel, first_dseq, flags, &table, runs, n, segment, -1);
done:
    PyBuffer_Release(&table);
    return out;
}

PyDoc_STRVAR(seal_lone_doc,
"seal_lone(sender, channel, first_dseq, flags, table, source, stream, stamp, items, start, n)\n"
"    -> (buffer, segment, payload_bytes)\n\n"
"As seal(), for `n` messages from items[start] on, each a datagram of its own: a run of one\n"
"message of `source`'s `stream`, taken as the send path's own-stream cache keeps them, (stream\n"
"seq, topic, session, seq, content type, payload) (see feed.LoneBatch); `payload_bytes` their\n"
"payloads together.");

static PyObject *
seal_lone(BatchSealer *self, PyObject *args)
{
    unsigned long sender, channel, source, stream, stamp;
    unsigned long long first_dseq;
    unsigned char flags;
    Py_buffer table;
    PyObject *items, *out = NULL;
    PlainRun runs[MAX_SEGMENTS];
    Py_ssize_t start, n, segment = 0, payload_bytes = 0;
    if (!PyArg_ParseTuple(args, "kkKby*kkkO!nn", &sender, &channel, &first_dseq, &flags, &table,
                          &source, &stream, &stamp, &PyList_Type, &items, &start, &n))
        return NULL;
    if (!batch_args_ok(n, sender, channel))
        goto done;
    if (start < 0 || start + n > PyList_GET_SIZE(items)) {
        PyErr_SetString(PyExc_ValueError, "items[start:start + n] out of the list");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PlainRun *r = &runs[i];
        PyObject *item = PyList_GET_ITEM(items, start + i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 6) {
            PyErr_SetString(PyExc_TypeError, "an item is (sseq, topic, session, seq, ctype, payload)");
            goto done;
        }
        r->sseq = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
        r->topic = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(item, 1));
        r->session = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(item, 2));
        r->seq = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 3));
        r->ctype = (unsigned char)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(item, 4));
        if (PyErr_Occurred())
            goto done;
        r->one = PyTuple_GET_ITEM(item, 5);
        r->payloads = NULL;
        r->source = source;
        r->stream = stream;
        r->stamp = stamp;
        r->fragment = 0;
        if (!size_run(r, table.len, &segment, &payload_bytes))
            goto done;
    }
    out = build(self, sender, channel, first_dseq, flags, &table, runs, n, segment, payload_bytes);
done:
    PyBuffer_Release(&table);
    return out;
}

static int
sealer_init(BatchSealer *self, PyObject *args, PyObject *kwds)
{
    self->counter = 0;
    if (RAND_bytes(self->nonce, 8) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL has no random bytes");
        return -1;
    }
    return keyed_init(&self->ctx, &self->secret, args, 1);
}

static void
sealer_dealloc(BatchSealer *self)
{
    keyed_free(self->ctx, (PyObject *)self);
}

static PyMethodDef sealer_methods[] = {
    {"seal", (PyCFunction)seal, METH_VARARGS, seal_doc},
    {"seal_lone", (PyCFunction)seal_lone, METH_VARARGS, seal_lone_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BatchSealerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scopecast.netio._datagram_batch.BatchSealer",
    .tp_doc = PyDoc_STR("BatchSealer(cluster_key, encrypt=False): builds a GSO batch of plain runs"),
    .tp_basicsize = sizeof(BatchSealer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sealer_init,
    .tp_dealloc = (destructor)sealer_dealloc,
    .tp_methods = sealer_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_datagram_batch",
    "Batches of plain-run datagrams built and read in C (see send_path, receive_path).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__datagram_batch(void)
{
    PyObject *m;
    if (PyType_Ready(&BatchScannerType) < 0 || PyType_Ready(&BatchSealerType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "BatchScanner", (PyObject *)&BatchScannerType) < 0
        || PyModule_AddObjectRef(m, "BatchSealer", (PyObject *)&BatchSealerType) < 0
        || PyModule_AddIntConstant(m, "WIRE_VERSION", VERSION) < 0
        || PyModule_AddIntConstant(m, "ABI", ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
