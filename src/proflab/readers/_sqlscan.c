/* The rows of one SQLite query as Arrow columns (the Arrow C data interface), read without
 * the GIL and without a Python object per value: what the Nsight Systems reader reads of an
 * export's event tables, a piece (a rowid range) at a time.
 *
 * Its columns are of three kinds only, as the reader asks: 'i' (64-bit integers), 't' (UTF-8
 * text) and 'd' (UTF-8 text as codes into the distinct texts of the result: a UInt32 column,
 * and the texts in first-seen order returned beside the batch). It accepts exactly an
 * INTEGER or NULL in an 'i' column and valid UTF-8 TEXT or NULL in a 't' or 'd' column, and gives up on anything else (a REAL, a BLOB, text where an
 * integer belongs, text that is not UTF-8, any SQLite error): giving up returns a short
 * reason (a str) and the caller reads the piece through the ADBC driver, as it always has,
 * which also produces the precise error or the repair. So this file only has to be right
 * about what it accepts.
 *
 * SQLite itself is the library Python's sqlite3 module is linked to, opened by path
 * (bind()): this file declares the dozen functions of SQLite's C interface it calls (stable
 * since 3.7) and needs no SQLite headers to build.
 *
 *   bind(path) -> str (SQLite's version) | raises OSError
 *   open(uri) -> connection (a capsule; read-only; one thread at a time) | str (the reason)
 *   read(connection, sql, kinds: bytes, names: tuple[str], cuts: tuple[bytes] = (), rows: int = 0)
 *       -> (n, columns, texts) | str
 *     columns: for each column, (schema capsule, array capsule) of an Arrow array of its own
 *     texts: for each 'd' column in order, the same of its distinct texts, named "value"
 *     (code i: text i)
 *     rows: how many rows to make room for at first (a rowid range's length; grown past it
 *     as needed)
 *     cuts: each text is kept up to the first of these markers (all starting with one byte),
 *     where one is in it: torch's emit_nvtx ranges carry the operator's name first, then
 *     ", seq = N, op_id = M, sizes = [...]", unique to each range.
 *   close(connection)
 *   live() -> how many arrays read() made are not yet released
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SQLSCAN_VERSION 1 /* raised with any change to what read() returns (_sqlite_native._VERSION) */
#define MAX_CUTS 8

/* -- SQLite's C interface (sqlite3.h), the parts used ------------------------------------- */
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_value sqlite3_value;
#define SQLITE_OK 0
#define SQLITE_ROW 100
#define SQLITE_DONE 101
#define SQLITE_INTEGER 1
#define SQLITE_TEXT 3
#define SQLITE_NULL 5
#define SQLITE_OPEN_READONLY 0x00000001
#define SQLITE_OPEN_URI 0x00000040
#define SQLITE_OPEN_NOMUTEX 0x00008000

static struct {
    int (*open_v2)(const char *, sqlite3 **, int, const char *);
    int (*close_v2)(sqlite3 *);
    int (*prepare_v2)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    int (*step)(sqlite3_stmt *);
    int (*finalize)(sqlite3_stmt *);
    int (*column_count)(sqlite3_stmt *);
    sqlite3_value *(*column_value)(sqlite3_stmt *, int);
    int (*value_type)(sqlite3_value *);
    int64_t (*value_int64)(sqlite3_value *);
    const unsigned char *(*value_text)(sqlite3_value *);
    int (*value_bytes)(sqlite3_value *);
    const char *(*errmsg)(sqlite3 *);
    int (*threadsafe)(void);
    const char *(*libversion)(void);
} api;
static int bound;

/* -- the Arrow C data interface (arrow/c/abi.h) -------------------------------------------- */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};
#define ARROW_FLAG_NULLABLE 2

/* One column while it is read, then the owner of its buffers once exported. */
typedef struct {
    char kind;          /* 'i', 't' or 'd' */
    uint8_t *valid;     /* a bit a row (1: a value) */
    int64_t nulls;
    int64_t *values;    /* 'i': the values; 't': the offsets (rows + 1); 'd': the distinct texts' offsets */
    char *data;         /* 't': the text, back to back; 'd': the distinct texts */
    int64_t data_len, data_cap;
    uint32_t *codes;    /* 'd': a code a row */
    uint32_t *slots;    /* 'd': the hash table (0: empty, else code + 1) */
    uint32_t *hashes;   /* 'd': each distinct text's hash */
    int64_t distinct, distinct_cap, slot_cap;
    const void *buffers[3];
} Column;

static void free_column(Column *col) {
    free(col->valid);
    free(col->values);
    free(col->data);
    free(col->codes);
    free(col->slots);
    free(col->hashes);
    memset(col, 0, sizeof(*col));
}

static void free_columns(Column *cols, int ncols) {
    if (!cols) return;
    for (int c = 0; c < ncols; c++) free_column(&cols[c]);
    free(cols);
}

/* Each column is exported as an Arrow array of its own, which owns its buffers: polars
 * frees a column's memory when that column goes, whatever other columns of the piece live
 * on (a record batch's columns would all live as long as any one of them). */
static long live_arrays; /* arrays exported and not yet released (live(): for the tests) */

static void release_column_array(struct ArrowArray *a) {
    __atomic_sub_fetch(&live_arrays, 1, __ATOMIC_RELAXED); /* (polars may release from a thread of its own) */
    Column *col = a->private_data;
    free_column(col);
    free(col);
    a->release = NULL;
}

static void release_column_schema(struct ArrowSchema *s) {
    free((char *)s->name);
    s->release = NULL;
}

static void schema_capsule_free(PyObject *capsule) {
    struct ArrowSchema *s = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (s) {
        if (s->release) s->release(s);
        free(s);
    }
}

static void array_capsule_free(PyObject *capsule) {
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a) {
        if (a->release) a->release(a);
        free(a);
    }
}

/* -- reading ------------------------------------------------------------------------------- */
typedef struct {
    sqlite3 *db;
    int busy; /* a read in progress (checked and set with the GIL held) */
} Conn;

static void conn_free(PyObject *capsule) {
    Conn *c = PyCapsule_GetPointer(capsule, "proflab.sqlscan");
    if (c) {
        if (c->db) api.close_v2(c->db);
        free(c);
    }
}

/* Whether s[0:n] is UTF-8 as Python's strict codec takes it (no surrogates, no overlongs). */
static int utf8_ok(const unsigned char *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        while (i + 8 <= n) { /* ASCII 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (int k = 1; k < len; k++) {
            unsigned char d = s[i + k];
            if ((d & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (d & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
        i += len;
    }
    return 1;
}

static uint64_t hash_seed;

/* A hash of s[0:n], seeded per process (the texts are the traced program's: no input can
 * count on colliding). */
static uint32_t hash_of(const unsigned char *s, int64_t n) {
    uint64_t h = hash_seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    return (uint32_t)h;
}

static int place(Column *col, int64_t slot_cap) {
    uint32_t *slots = calloc((size_t)slot_cap, sizeof(uint32_t));
    if (!slots) return -1;
    for (int64_t code = 0; code < col->distinct; code++) {
        uint64_t i = col->hashes[code] & (uint64_t)(slot_cap - 1);
        while (slots[i]) i = (i + 1) & (uint64_t)(slot_cap - 1);
        slots[i] = (uint32_t)(code + 1);
    }
    free(col->slots);
    col->slots = slots;
    col->slot_cap = slot_cap;
    return 0;
}

/* The code of s[0:n] among the column's distinct texts, added where it is new; -1: no memory,
 * -2: more distinct texts than codes. */
static int64_t code_of(Column *col, const unsigned char *s, int64_t n) {
    if (!col->slots && place(col, 1 << 10) < 0) return -1;
    uint32_t h = hash_of(s, n);
    uint64_t mask = (uint64_t)(col->slot_cap - 1), i = h & mask;
    for (; col->slots[i]; i = (i + 1) & mask) {
        int64_t code = col->slots[i] - 1;
        if (col->hashes[code] == h && col->values[code + 1] - col->values[code] == n &&
            (n == 0 || memcmp(col->data + col->values[code], s, (size_t)n) == 0)) /* (no text yet: data is NULL) */
            return code;
    }
    int64_t code = col->distinct;
    if (code >= UINT32_MAX - 1) return -2;
    if (code + 1 >= col->distinct_cap) {
        int64_t cap = col->distinct_cap ? col->distinct_cap * 2 : 1 << 10;
        int64_t *off = realloc(col->values, (size_t)(cap + 1) * sizeof(int64_t));
        if (!off) return -1;
        col->values = off;
        uint32_t *hs = realloc(col->hashes, (size_t)cap * sizeof(uint32_t));
        if (!hs) return -1;
        col->hashes = hs;
        if (!col->distinct_cap) col->values[0] = 0;
        col->distinct_cap = cap;
    }
    if (col->data_len + n > col->data_cap) {
        int64_t want = col->data_cap ? col->data_cap * 2 : 1 << 16;
        while (want < col->data_len + n) want *= 2;
        char *d = realloc(col->data, (size_t)want);
        if (!d) return -1;
        col->data = d;
        col->data_cap = want;
    }
    if (n) memcpy(col->data + col->data_len, s, (size_t)n);
    col->data_len += n;
    col->values[code + 1] = col->data_len;
    col->hashes[code] = h;
    col->slots[i] = (uint32_t)(code + 1);
    col->distinct = code + 1;
    if (col->distinct * 2 > col->slot_cap && place(col, col->slot_cap * 2) < 0) return -1;
    return code;
}

static int grow_rows(Column *cols, int ncols, int64_t cap) {
    for (int c = 0; c < ncols; c++) {
        Column *col = &cols[c];
        if (col->kind == 'd') {
            uint32_t *k = realloc(col->codes, (size_t)cap * sizeof(uint32_t));
            if (!k) return -1;
            col->codes = k;
        } else {
            int64_t *v = realloc(col->values, (size_t)(cap + 1) * sizeof(int64_t));
            if (!v) return -1;
            col->values = v;
        }
        uint8_t *m = realloc(col->valid, (size_t)(cap / 8 + 1));
        if (!m) return -1;
        col->valid = m;
    }
    return 0;
}

typedef struct {
    int n;
    const char *at[MAX_CUTS];
    Py_ssize_t len[MAX_CUTS];
} Cuts;

/* How much of s[0:n] comes before the first marker in it (n where none is). */
static int64_t cut_at(const unsigned char *s, int64_t n, const Cuts *cuts) {
    if (!cuts->n) return n;
    const unsigned char first = (unsigned char)cuts->at[0][0];
    const unsigned char *p = s, *end = s + n;
    while ((p = memchr(p, first, (size_t)(end - p))) != NULL) {
        for (int k = 0; k < cuts->n; k++)
            if (end - p >= cuts->len[k] && memcmp(p, cuts->at[k], (size_t)cuts->len[k]) == 0) return p - s;
        p++;
    }
    return n;
}

typedef struct {
    const char *why;   /* a reason (static text) */
    char msg[256];     /* or SQLite's message */
    int nomem;
} Outcome;

/* Step through the statement's rows into the columns; 0, or -1 with the outcome set. */
static int step_rows(sqlite3 *db, sqlite3_stmt *st, Column *cols, int ncols, const Cuts *cuts, int64_t first_cap,
                     int64_t *rows, Outcome *out) {
    int64_t n = 0, cap = 0;
    for (;;) {
        int rc = api.step(st);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) {
            snprintf(out->msg, sizeof(out->msg), "SQLite: %s", api.errmsg(db));
            return -1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : first_cap;
            if (grow_rows(cols, ncols, cap) < 0) { out->nomem = 1; return -1; }
            if (n == 0)
                for (int c = 0; c < ncols; c++)
                    if (cols[c].kind == 't') cols[c].values[0] = 0; /* a text column's first offset */
        }
        for (int c = 0; c < ncols; c++) {
            Column *col = &cols[c];
            /* (one call into the statement a value: each column_* call checks the statement's
             * state again; the value's own accessors only read it) */
            sqlite3_value *v = api.column_value(st, c);
            int t = api.value_type(v);
            uint8_t bit = (uint8_t)(1u << (n & 7));
            if (t == SQLITE_NULL) {
                col->valid[n >> 3] &= (uint8_t)~bit;
                col->nulls++;
                if (col->kind == 'i') col->values[n] = 0;
                else if (col->kind == 't') col->values[n + 1] = col->data_len;
                else col->codes[n] = 0;
                continue;
            }
            col->valid[n >> 3] |= bit;
            if (col->kind == 'i') {
                if (t != SQLITE_INTEGER) { out->why = "a value that is not an integer in an integer column"; return -1; }
                col->values[n] = api.value_int64(v);
            } else {
                if (t != SQLITE_TEXT) { out->why = "a value that is not text in a text column"; return -1; }
                const unsigned char *s = api.value_text(v);
                int64_t len = api.value_bytes(v);
                if (!s && len) { out->nomem = 1; return -1; }
                if (!utf8_ok(s, len)) { out->why = "text that is not UTF-8"; return -1; }
                len = cut_at(s, len, cuts); /* (before a marker's first byte: a character boundary) */
                if (col->kind == 'd') {
                    int64_t code = code_of(col, s, len);
                    if (code == -2) { out->why = "more distinct texts than 32-bit codes"; return -1; }
                    if (code < 0) { out->nomem = 1; return -1; }
                    col->codes[n] = (uint32_t)code;
                    continue;
                }
                if (col->data_len + len > col->data_cap) {
                    int64_t want = col->data_cap ? col->data_cap * 2 : 1 << 20;
                    while (want < col->data_len + len) want *= 2;
                    char *d = realloc(col->data, (size_t)want);
                    if (!d) { out->nomem = 1; return -1; }
                    col->data = d;
                    col->data_cap = want;
                }
                if (len) memcpy(col->data + col->data_len, s, (size_t)len);
                col->data_len += len;
                col->values[n + 1] = col->data_len;
            }
        }
        n++;
    }
    *rows = n;
    return 0;
}

static PyObject *do_bind(PyObject *self, PyObject *arg) {
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path)) return NULL;
    void *lib = dlopen(PyBytes_AS_STRING(path), RTLD_NOW | RTLD_LOCAL);
    Py_DECREF(path);
    if (!lib) return PyErr_Format(PyExc_OSError, "cannot load SQLite: %s", dlerror());
#define SYM(field, name)                                                              \
    do {                                                                              \
        *(void **)(&api.field) = dlsym(lib, name);                                    \
        if (!api.field) {                                                             \
            bound = 0;                                                                \
            return PyErr_Format(PyExc_OSError, "SQLite library without %s", name);   \
        }                                                                             \
    } while (0)
    SYM(open_v2, "sqlite3_open_v2");
    SYM(close_v2, "sqlite3_close_v2");
    SYM(prepare_v2, "sqlite3_prepare_v2");
    SYM(step, "sqlite3_step");
    SYM(finalize, "sqlite3_finalize");
    SYM(column_count, "sqlite3_column_count");
    SYM(column_value, "sqlite3_column_value");
    SYM(value_type, "sqlite3_value_type");
    SYM(value_int64, "sqlite3_value_int64");
    SYM(value_text, "sqlite3_value_text");
    SYM(value_bytes, "sqlite3_value_bytes");
    SYM(errmsg, "sqlite3_errmsg");
    SYM(threadsafe, "sqlite3_threadsafe");
    SYM(libversion, "sqlite3_libversion");
#undef SYM
    if (!api.threadsafe()) return PyErr_Format(PyExc_OSError, "SQLite built without thread support");
    bound = 1;
    return PyUnicode_FromString(api.libversion());
}

static PyObject *do_open(PyObject *self, PyObject *arg) {
    if (!bound) return PyErr_Format(PyExc_RuntimeError, "bind() first");
    const char *uri = PyUnicode_AsUTF8(arg);
    if (!uri) return NULL;
    Conn *c = calloc(1, sizeof(Conn));
    if (!c) return PyErr_NoMemory();
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = api.open_v2(uri, &c->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    Py_END_ALLOW_THREADS
    if (rc != SQLITE_OK) {
        char msg[512];
        snprintf(msg, sizeof(msg), "SQLite: %s", c->db ? api.errmsg(c->db) : "cannot open");
        PyObject *why = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");  /* (as do_read's reasons) */
        if (c->db) api.close_v2(c->db);
        free(c);
        return why;
    }
    PyObject *cap = PyCapsule_New(c, "proflab.sqlscan", conn_free);
    if (!cap) {
        api.close_v2(c->db);
        free(c);
    }
    return cap;
}

static PyObject *do_close(PyObject *self, PyObject *arg) {
    Conn *c = PyCapsule_GetPointer(arg, "proflab.sqlscan");
    if (!c) return NULL;
    if (c->busy) return PyErr_Format(PyExc_RuntimeError, "connection in use");
    if (c->db) api.close_v2(c->db);
    c->db = NULL;
    Py_RETURN_NONE;
}

/* One column as an Arrow array of ``n`` rows and its schema: (schema capsule, array capsule).
 * The column's buffers move into the array (``col`` is left empty), also where it fails. */
static PyObject *exported(Column *col, int64_t n, PyObject *name) {
    struct ArrowSchema *schema = calloc(1, sizeof(*schema));
    struct ArrowArray *array = calloc(1, sizeof(*array));
    Column *owned = malloc(sizeof(Column));
    const char *utf8 = PyUnicode_AsUTF8(name);
    char *copy = utf8 ? strdup(utf8) : NULL;
    if (!schema || !array || !owned || !copy) {
        free(schema);
        free(array);
        free(owned);
        free(copy);
        free_column(col);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    *owned = *col;
    memset(col, 0, sizeof(*col));
    if (!owned->nulls) {
        free(owned->valid);
        owned->valid = NULL;
    }
    owned->buffers[0] = owned->valid;
    owned->buffers[1] = owned->kind == 'd' ? (const void *)owned->codes : (const void *)owned->values;
    owned->buffers[2] = owned->data ? (const void *)owned->data : (const void *)owned->values; /* (no text: any valid pointer) */
    schema->format = owned->kind == 'i' ? "l" : owned->kind == 'd' ? "I" : "U";
    schema->name = copy;
    schema->flags = ARROW_FLAG_NULLABLE;
    schema->release = release_column_schema;
    array->length = n;
    array->null_count = owned->nulls;
    array->n_buffers = owned->kind == 't' ? 3 : 2;
    array->buffers = owned->buffers;
    array->release = release_column_array;
    array->private_data = owned;
    __atomic_add_fetch(&live_arrays, 1, __ATOMIC_RELAXED);
    PyObject *sc = PyCapsule_New(schema, "arrow_schema", schema_capsule_free);
    if (!sc) {
        release_column_schema(schema);
        free(schema);
        release_column_array(array);
        free(array);
        return NULL;
    }
    PyObject *ac = PyCapsule_New(array, "arrow_array", array_capsule_free);
    if (!ac) {
        Py_DECREF(sc);
        release_column_array(array);
        free(array);
        return NULL;
    }
    return Py_BuildValue("(NN)", sc, ac);
}

static PyObject *do_read(PyObject *self, PyObject *args) {
    PyObject *capsule, *names, *cut_list = NULL;
    const char *sql, *kinds;
    Py_ssize_t sql_len, ncols, rows_hint = 0;
    if (!PyArg_ParseTuple(args, "Os#y#O!|O!n", &capsule, &sql, &sql_len, &kinds, &ncols, &PyTuple_Type, &names, &PyTuple_Type, &cut_list,
                          &rows_hint))
        return NULL;
    int64_t first_cap = rows_hint > 0 && rows_hint <= (1 << 24) ? (int64_t)rows_hint : 1 << 16;
    Cuts cuts;
    memset(&cuts, 0, sizeof(cuts));
    if (cut_list) {
        if (PyTuple_GET_SIZE(cut_list) > MAX_CUTS) return PyErr_Format(PyExc_ValueError, "at most %d cuts", MAX_CUTS);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(cut_list); k++) {
            PyObject *m = PyTuple_GET_ITEM(cut_list, k);
            if (!PyBytes_Check(m) || PyBytes_GET_SIZE(m) < 1) return PyErr_Format(PyExc_ValueError, "cuts are non-empty bytes");
            cuts.at[k] = PyBytes_AS_STRING(m);
            cuts.len[k] = PyBytes_GET_SIZE(m);
            if (cuts.at[k][0] != cuts.at[0][0] || (cuts.at[k][0] & 0x80)) return PyErr_Format(PyExc_ValueError, "cuts start with one ASCII byte");
        }
        cuts.n = (int)PyTuple_GET_SIZE(cut_list);
    }
    Conn *conn = PyCapsule_GetPointer(capsule, "proflab.sqlscan");
    if (!conn) return NULL;
    if (PyTuple_GET_SIZE(names) != ncols || ncols < 1 || ncols > 1000) return PyErr_Format(PyExc_ValueError, "one name a column");
    for (Py_ssize_t c = 0; c < ncols; c++) {
        if (kinds[c] != 'i' && kinds[c] != 't' && kinds[c] != 'd') return PyErr_Format(PyExc_ValueError, "column kinds are 'i', 't' or 'd'");
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, c))) return PyErr_Format(PyExc_TypeError, "column names are str");
    }
    if (!conn->db) return PyErr_Format(PyExc_RuntimeError, "connection closed");
    if (conn->busy) return PyUnicode_FromString("connection in use");
    Column *cols = calloc((size_t)ncols, sizeof(Column));
    if (!cols) return PyErr_NoMemory();
    for (Py_ssize_t c = 0; c < ncols; c++) cols[c].kind = kinds[c];
    conn->busy = 1;
    Outcome out;
    memset(&out, 0, sizeof(out));
    int64_t n = 0;
    int ok = 0;
    Py_BEGIN_ALLOW_THREADS
    sqlite3_stmt *st = NULL;
    if (api.prepare_v2(conn->db, sql, (int)sql_len, &st, NULL) != SQLITE_OK || !st) {
        snprintf(out.msg, sizeof(out.msg), "SQLite: %s", st ? "no statement" : api.errmsg(conn->db));
    } else if (api.column_count(st) != ncols) {
        out.why = "the query's columns are not the kinds given";
    } else {
        ok = step_rows(conn->db, st, cols, (int)ncols, &cuts, first_cap, &n, &out) == 0;
    }
    if (st) api.finalize(st);
    Py_END_ALLOW_THREADS
    conn->busy = 0;
    if (!ok) {
        free_columns(cols, (int)ncols);
        if (out.nomem) return PyErr_NoMemory();
        /* SQLite's message may quote the damaged export's own bytes (a table or column name):
         * decoded with replacement, never an exception of its own */
        const char *why = out.why ? out.why : out.msg;
        return PyUnicode_DecodeUTF8(why, (Py_ssize_t)strlen(why), "replace");
    }
    if (n == 0) {
        free_columns(cols, (int)ncols);
        return Py_BuildValue("(L()())", 0LL);
    }
    /* each column an array of its own; each 'd' column's distinct texts one more */
    PyObject *columns = PyTuple_New(ncols), *texts = PyTuple_New(0), *value = PyUnicode_FromString("value");
    if (!columns || !texts || !value) goto fail;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        Column *col = &cols[c];
        if (col->kind == 'd') {
            free(col->slots);
            free(col->hashes);
            col->slots = col->hashes = NULL;
            Column dc;
            memset(&dc, 0, sizeof(dc));
            dc.kind = 't';
            dc.values = col->values ? col->values : calloc(1, sizeof(int64_t)); /* (no text at all: one offset, 0) */
            dc.data = col->data;
            col->values = NULL;
            col->data = NULL;
            if (!dc.values) {
                free_column(&dc);
                PyErr_NoMemory();
                goto fail;
            }
            PyObject *distinct = exported(&dc, col->distinct, value);
            if (!distinct) goto fail;
            Py_ssize_t k = PyTuple_GET_SIZE(texts);
            if (_PyTuple_Resize(&texts, k + 1) < 0) {
                Py_DECREF(distinct);
                goto fail;
            }
            PyTuple_SET_ITEM(texts, k, distinct);
        }
        PyObject *one = exported(col, n, PyTuple_GET_ITEM(names, c));
        if (!one) goto fail;
        PyTuple_SET_ITEM(columns, c, one);
    }
    Py_DECREF(value);
    free_columns(cols, (int)ncols); /* (emptied: their buffers are the arrays') */
    return Py_BuildValue("(LNN)", (long long)n, columns, texts);
fail:
    Py_XDECREF(columns);
    Py_XDECREF(texts);
    Py_XDECREF(value);
    free_columns(cols, (int)ncols);
    return NULL;
}

static PyObject *version(PyObject *self, PyObject *unused) { return PyLong_FromLong(SQLSCAN_VERSION); }

static PyObject *live(PyObject *self, PyObject *unused) { return PyLong_FromLong(__atomic_load_n(&live_arrays, __ATOMIC_RELAXED)); }

static PyMethodDef METHODS[] = {
    {"bind", do_bind, METH_O, "Load SQLite's C interface from the library at this path; its version."},
    {"open", do_open, METH_O, "A read-only connection to a URI; a str (the reason) where SQLite refuses."},
    {"read", do_read, METH_VARARGS, "(rows, schema capsule, array capsule) of a query; a str (the reason) where it gives up."},
    {"close", do_close, METH_O, "Close a connection."},
    {"version", version, METH_NOARGS, "The version of what read() returns."},
    {"live", live, METH_NOARGS, "How many arrays read() made are not yet released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_sqlscan", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__sqlscan(void) {
    int here;
    hash_seed = ((uint64_t)(uintptr_t)&here * 0x9E3779B97F4A7C15ULL) ^ (uint64_t)(uintptr_t)&MODULE ^ (uint64_t)getpid();
    return PyModule_Create(&MODULE);
}
