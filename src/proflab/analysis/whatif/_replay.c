/* The what-if replay's walk (replay.py's ``_walk_py``, step for step): the host's calls in
 * order, each operation a call launches on its stream, the waits of synchronising calls and
 * of copies the host waits for. The walk is a chain of max-plus steps in which each call's
 * time depends on the one before it, so it has no topological level wide enough to pay for
 * numpy's per-call overhead: a report replays it a few dozen times, and in Python each walk
 * of a 50 MB trace cost 0.16 s.
 *
 * It computes exactly what the Python walk computes: the same IEEE double additions in the
 * same order, ``max``/``min`` picking the same operand on ties as Python's builtins (the
 * first unless the second is strictly larger / smaller), so the predictions are the same to
 * the last bit (build it without floating-point contraction: -ffp-contract=off).
 *
 * walk(work, call_dur, call_kind, call_ptr, call_ops, op_dur, op_alive, op_stream, n_streams,
 *      op_dep, op_free, op_not_before, op_gap, latency_ns, wake_ns, sync_overhead_ns,
 *      (LAUNCH, SYNC, COPY, FREE), call_start, op_start, op_end, op_ready) -> None
 *
 * Arrays are C-contiguous buffers: float64 (``d``), int64 (``q``/``l``), int8 call kinds,
 * bool flags. ``call_ptr``/``call_ops`` list each call's operations (CSR: the operations of
 * call i are call_ops[call_ptr[i]:call_ptr[i + 1]], in operation order); ``op_stream`` is a
 * dense stream index in [0, n_streams). The four output arrays are written in place; the
 * operation arrays must hold NaN on entry (an operation that does not run keeps it). Every
 * index is checked before the walk: a bad one raises ValueError and writes nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REPLAY_VERSION 1 /* raised with any change to walk()'s arguments (replay._NATIVE_VERSION) */

/* Python's max(a, b) and min(a, b): the first operand unless the second is strictly past it */
static inline double pmax(double a, double b) { return b > a ? b : a; }
static inline double pmin(double a, double b) { return b < a ? b : a; }

typedef struct {
    Py_buffer b;
    int held;
} Arr;

/* the buffer of `obj` as `n` items of `size` bytes of one of `kinds` (struct format chars) */
static int take(PyObject *obj, Arr *a, const char *what, Py_ssize_t size, const char *kinds, Py_ssize_t n, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &a->b, flags) < 0)
        return -1;
    a->held = 1;
    const char *f = a->b.format ? a->b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (a->b.itemsize != size || f[0] == 0 || f[1] != 0 || !strchr(kinds, f[0])) {
        PyErr_Format(PyExc_ValueError, "%s: expected items of %zd bytes (%s), got %zd bytes (%s)", what, size, kinds,
                     a->b.itemsize, a->b.format ? a->b.format : "B");
        return -1;
    }
    if (n >= 0 && a->b.len / size != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items, got %zd", what, n, a->b.len / size);
        return -1;
    }
    return 0;
}

#define N_ARRAYS 17

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *o[N_ARRAYS];
    Py_ssize_t n_streams;
    double lat, wake, sync_overhead;
    int k_launch, k_sync, k_copy, k_free;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnOOOOddd(iiii)OOOO:walk", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &n_streams, &o[8], &o[9], &o[10], &o[11], &lat, &wake, &sync_overhead, &k_launch, &k_sync, &k_copy,
                          &k_free, &o[12], &o[13], &o[14], &o[15]))
        return NULL;
    o[16] = NULL;
    Arr a[N_ARRAYS];
    memset(a, 0, sizeof a);
    PyObject *result = NULL;
    double *stream_end = NULL;

    /* the sizes: n calls (from work), m operations (from op_dur), the CSR's length */
    if (take(o[0], &a[0], "work", 8, "d", -1, 0) < 0)
        goto done;
    Py_ssize_t n = a[0].b.len / 8;
    if (take(o[5], &a[5], "op_dur", 8, "d", -1, 0) < 0)
        goto done;
    Py_ssize_t m = a[5].b.len / 8;
    if (take(o[1], &a[1], "call_dur", 8, "d", n, 0) < 0 || take(o[2], &a[2], "call_kind", 1, "bB", n, 0) < 0 ||
        take(o[3], &a[3], "call_ptr", 8, "qlQL", n + 1, 0) < 0 || take(o[4], &a[4], "call_ops", 8, "qlQL", -1, 0) < 0 ||
        take(o[6], &a[6], "op_alive", 1, "?bB", m, 0) < 0 || take(o[7], &a[7], "op_stream", 8, "ql", m, 0) < 0 ||
        take(o[8], &a[8], "op_dep", 8, "ql", m, 0) < 0 || take(o[9], &a[9], "op_free", 1, "?bB", m, 0) < 0 ||
        take(o[10], &a[10], "op_not_before", 8, "d", m, 0) < 0 || take(o[11], &a[11], "op_gap", 8, "d", m, 0) < 0 ||
        take(o[12], &a[12], "call_start", 8, "d", n, 1) < 0 || take(o[13], &a[13], "op_start", 8, "d", m, 1) < 0 ||
        take(o[14], &a[14], "op_end", 8, "d", m, 1) < 0 || take(o[15], &a[15], "op_ready", 8, "d", m, 1) < 0)
        goto done;

    const double *work = a[0].b.buf, *call_dur = a[1].b.buf, *op_dur = a[5].b.buf, *not_before = a[10].b.buf,
                 *gap = a[11].b.buf;
    const int8_t *kind = a[2].b.buf;
    const int64_t *ptr = a[3].b.buf, *ops = a[4].b.buf, *stream = a[7].b.buf, *dep = a[8].b.buf;
    const uint8_t *alive = a[6].b.buf, *free_ = a[9].b.buf;
    double *call_start = a[12].b.buf, *op_start = a[13].b.buf, *op_end = a[14].b.buf, *op_ready = a[15].b.buf;
    Py_ssize_t n_ops = a[4].b.len / 8;

    /* every index in range before anything is written */
    if (n_streams < 0 || (n > 0 && ptr[0] != 0) || ptr[n] != n_ops) {
        PyErr_SetString(PyExc_ValueError, "call_ptr: must start at 0 and end at len(call_ops)");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (ptr[i + 1] < ptr[i]) {
            PyErr_Format(PyExc_ValueError, "call_ptr: falls at call %zd", i);
            goto done;
        }
    for (Py_ssize_t q = 0; q < n_ops; q++)
        if (ops[q] < 0 || ops[q] >= m) {
            PyErr_Format(PyExc_ValueError, "call_ops[%zd] = %lld: not an operation (of %zd)", q, (long long)ops[q], m);
            goto done;
        }
    for (Py_ssize_t j = 0; j < m; j++) {
        if (stream[j] < 0 || stream[j] >= n_streams) {
            PyErr_Format(PyExc_ValueError, "op_stream[%zd] = %lld: not a stream index (of %zd)", j, (long long)stream[j], n_streams);
            goto done;
        }
        if (dep[j] < -1 || dep[j] >= m) {
            PyErr_Format(PyExc_ValueError, "op_dep[%zd] = %lld: not an operation (of %zd) or -1", j, (long long)dep[j], m);
            goto done;
        }
    }
    stream_end = calloc(n_streams > 0 ? (size_t)n_streams : 1, sizeof(double)); /* (0.0: a stream not used yet) */
    if (stream_end == NULL) {
        PyErr_NoMemory();
        goto done;
    }

    Py_BEGIN_ALLOW_THREADS
    double launched_end = 0.0; /* the latest end of the work launched so far (what a sync waits for) */
    double t = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        t += work[i];
        double cs = t;
        call_start[i] = cs;
        int k = kind[i];
        if (k == k_launch || k == k_copy) {
            double last = cs;
            for (int64_t q = ptr[i]; q < ptr[i + 1]; q++) {
                int64_t j = ops[q];
                if (!alive[j])
                    continue;
                int64_t s = stream[j];
                double start = pmax(cs + lat, stream_end[s] + gap[j]);
                int64_t d = dep[j];
                if (d >= 0 && !isnan(op_end[d]))
                    start = pmax(start, op_end[d]);
                op_ready[j] = start;
                start = pmax(start, not_before[j]);
                double end = start + op_dur[j];
                op_start[j] = start;
                op_end[j] = end;
                if (!free_[j]) {
                    stream_end[s] = end;
                    launched_end = pmax(launched_end, end);
                }
                last = pmax(last, end);
            }
            t = k == k_copy ? pmax(cs + call_dur[i], last + wake) : cs + call_dur[i];
        } else if (k == k_sync || k == k_free) {
            t = pmax(cs + pmin(call_dur[i], sync_overhead), launched_end + wake);
        } else {
            t = cs + call_dur[i];
        }
    }
    Py_END_ALLOW_THREADS

    result = Py_None;
    Py_INCREF(result);
done:
    free(stream_end);
    for (int i = 0; i < N_ARRAYS; i++)
        if (a[i].held)
            PyBuffer_Release(&a[i].b);
    return result;
}

static PyObject *version(PyObject *self, PyObject *unused) { return PyLong_FromLong(REPLAY_VERSION); }

static PyMethodDef METHODS[] = {
    {"walk", walk, METH_VARARGS, "Replay a step graph's calls and operations with a plan's durations (see the module source)."},
    {"version", version, METH_NOARGS, "The version of walk()'s arguments."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_replay", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&MODULE); }
