/* A decoder of one slice of Kineto events (a JSON array of event objects) into a table of
 * fixed-size rows for each kind of event, with no Python object per event: the numbers land
 * in buffers that numpy views as columns, and each distinct string (name, category, phase)
 * becomes one Python str, however many events carry it.
 *
 * It accepts exactly what proflab's typed msgspec decode (kineto._Event) accepts without a
 * validation error, and gives up on anything else: an unexpected type, a value out of the
 * model's range, a duplicated key, a lone surrogate, invalid UTF-8, malformed JSON. Giving
 * up returns a short reason (a str) and the caller decodes the slice the usual way, which
 * then also produces the precise error or the tolerant decode. So this file only has to be
 * right about what it accepts; everything odd takes the path that has always handled it.
 *
 * scan(buffer, categories) -> (count, tables: (gpu, op, frame, other), strings: list[str]) | reason: str
 * live() -> how many tables scan() made are not yet freed
 * structure(buffer, in_string, backslashes, depth, inner) -> (commas: bytes, close, in_string, backslashes, depth, broken)
 *     one read of a document's structure once its events array is open (readers._slices._Structure):
 *     see structure() below
 *
 * Each event goes to the table of its category's kind (`categories`: a tuple of (category as
 * UTF-8 bytes, kind) pairs, kind 1 operator, 2 GPU activity, 3 Python frame; any other is
 * kind 0), operators and frames only where their phase is "X" (the rest are only counted).
 * A table is a read-only buffer of `cap` rows of TABLE_FIELDS[kind] 8-byte words, the first
 * `n` filled: an event's record words that its kind keeps (a GPU activity's 21 of the
 * record's 40), so numpy views each column (a word of every row) without a gather. The
 * "other" table holds only the category. (Column after column instead cost the parse more
 * than the views saved: a word written to each of twenty pages an event. The 514 MB trace's
 * 31 slices, one thread: the parse 0.69 -> 0.77 CPU s, the rest 0.50 -> 0.37.)
 *
 * The parse runs without the GIL (plain C memory, no Python object until it is done), so
 * two threads decode two slices at once; the strings are made after it.
 *
 * Record layout (little-endian, all 8-byte fields; mirrored by kineto_native.WORDS):
 *   ph, cat, name            int64  index into strings (0 = "" = absent)
 *   pid, tid                 int64  (absent: 0; a string's index where bit 62 / 63 of valid is set)
 *   ts, dur                  double (ts absent or null: NaN; dur absent: 0.0)
 *   ints[N_INTS]             int64  the integer args (see INT_KEYS), valid where bit i of `valid`
 *   span_off[N_SPANS]        int64  byte offset of a raw arg value in the buffer (-1: absent); for the
 *                                   operator's inputs (INPUT_TYPES, INPUT_DIMS, INPUT_CONCRETE), the index in strings of the
 *                                   value's JSON text instead
 *   span_len[N_SPANS]        int64  the value's bytes (-1: absent)
 *   valid                    uint64
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__GLIBC__) || defined(__APPLE__)
#include <locale.h>
#ifdef __APPLE__
#include <xlocale.h>
#endif
#define HAVE_STRTOD_L 1
static locale_t C_NUMERIC; /* strtod in the "C" locale, whatever the program set */
#endif

#define KSCAN_VERSION 5 /* raised with any change to what scan() returns (_kineto_native._VERSION) */
#define N_INTS 20
#define N_SPANS 6
#define MAX_DEPTH 64
#define PID_TEXT 62 /* bits of Rec.valid: pid / tid is a string (its index in strings) */
#define TID_TEXT 63

typedef struct {
    int64_t ph, cat, name, pid, tid;
    double ts, dur;
    int64_t ints[N_INTS];
    int64_t span_off[N_SPANS];
    int64_t span_len[N_SPANS];
    uint64_t valid;
} Rec;

/* The record's words each kind's table keeps, in column order (-1 ends a list): GPU activity
 * all but the phase and the raw spans; operators their ids, sequence, collective counts and
 * spans; Python frames their ids; other events their category. */
enum { W_PH, W_CAT, W_NAME, W_PID, W_TID, W_TS, W_DUR, W_INTS, W_SPAN_OFF = W_INTS + N_INTS, W_SPAN_LEN = W_SPAN_OFF + N_SPANS,
       W_VALID = W_SPAN_LEN + N_SPANS, N_WORDS };
enum { K_OTHER, K_OP, K_GPU, K_FRAME, N_KINDS };
_Static_assert(sizeof(Rec) == N_WORDS * sizeof(uint64_t), "a record is its words");

typedef struct {
    uint64_t *data; /* row i at data + i * ncols */
    Py_ssize_t n, cap;
    int ncols;
    const int *fields;
} Table;

/* integer args: key, lower and upper bound (I32 or I64) */
enum {
    I_EXTERNAL_ID, I_EXTERNAL_ID_OLD, I_CORRELATION, I_DEVICE, I_STREAM, I_BYTES, I_REGISTERS,
    I_SHARED_MEMORY, I_PYTHON_ID, I_PYTHON_PARENT_ID, I_SEQUENCE, I_IN_NELEMS, I_OUT_NELEMS,
    I_GROUP_SIZE, I_GRID_X, I_GRID_Y, I_GRID_Z, I_BLOCK_X, I_BLOCK_Y, I_BLOCK_Z
};
enum { S_INPUT_TYPES, S_INPUT_DIMS, S_COLLECTIVE, S_DTYPE, S_PG_NAME, S_INPUT_CONCRETE };

static const int GPU_WORDS[] = {
    W_CAT, W_NAME, W_PID, W_TID, W_TS, W_DUR, W_VALID, W_INTS + I_EXTERNAL_ID, W_INTS + I_EXTERNAL_ID_OLD, W_INTS + I_CORRELATION,
    W_INTS + I_DEVICE, W_INTS + I_STREAM, W_INTS + I_BYTES, W_INTS + I_REGISTERS, W_INTS + I_SHARED_MEMORY, W_INTS + I_GRID_X,
    W_INTS + I_GRID_Y, W_INTS + I_GRID_Z, W_INTS + I_BLOCK_X, W_INTS + I_BLOCK_Y, W_INTS + I_BLOCK_Z, -1};
static const int OP_WORDS[] = {
    W_CAT, W_NAME, W_PID, W_TID, W_TS, W_DUR, W_VALID, W_INTS + I_EXTERNAL_ID, W_INTS + I_EXTERNAL_ID_OLD, W_INTS + I_CORRELATION,
    W_INTS + I_SEQUENCE, W_INTS + I_IN_NELEMS, W_INTS + I_OUT_NELEMS, W_INTS + I_GROUP_SIZE, W_SPAN_OFF + S_INPUT_TYPES,
    W_SPAN_OFF + S_INPUT_DIMS, W_SPAN_OFF + S_COLLECTIVE, W_SPAN_OFF + S_DTYPE, W_SPAN_OFF + S_PG_NAME, W_SPAN_OFF + S_INPUT_CONCRETE,
    W_SPAN_LEN + S_INPUT_TYPES, W_SPAN_LEN + S_INPUT_DIMS, W_SPAN_LEN + S_COLLECTIVE, W_SPAN_LEN + S_DTYPE, W_SPAN_LEN + S_PG_NAME,
    W_SPAN_LEN + S_INPUT_CONCRETE, -1};
static const int FRAME_WORDS[] = {W_NAME, W_PID, W_TID, W_TS, W_DUR, W_VALID, W_INTS + I_PYTHON_ID, W_INTS + I_PYTHON_PARENT_ID, -1};
static const int OTHER_WORDS[] = {W_CAT, -1};
/* each kind's columns: the record words its table keeps, -1 ended */
static const int *const TABLE_FIELDS[N_KINDS] = {[K_OTHER] = OTHER_WORDS, [K_OP] = OP_WORDS, [K_GPU] = GPU_WORDS, [K_FRAME] = FRAME_WORDS};

typedef struct {
    const char *key;
    int kind;  /* 0 int, 1 int32, 2 grid, 3 block, 4 raw, 5 str|null, 6 str|int|null */
    int slot;
} ArgKey;

static const ArgKey ARG_KEYS[] = {
    {"External id", 0, I_EXTERNAL_ID},
    {"external id", 0, I_EXTERNAL_ID_OLD},
    {"correlation", 0, I_CORRELATION},
    {"device", 1, I_DEVICE},
    {"stream", 0, I_STREAM},
    {"bytes", 0, I_BYTES},
    {"grid", 2, I_GRID_X},
    {"block", 3, I_BLOCK_X},
    {"registers per thread", 1, I_REGISTERS},
    {"shared memory", 0, I_SHARED_MEMORY},
    {"Python id", 0, I_PYTHON_ID},
    {"Python parent id", 0, I_PYTHON_PARENT_ID},
    {"Sequence number", 0, I_SEQUENCE},
    {"Input type", 4, S_INPUT_TYPES},
    {"Input Dims", 4, S_INPUT_DIMS},
    {"Concrete Inputs", 4, S_INPUT_CONCRETE},
    {"Collective name", 5, S_COLLECTIVE},
    {"In msg nelems", 0, I_IN_NELEMS},
    {"Out msg nelems", 0, I_OUT_NELEMS},
    {"dtype", 5, S_DTYPE},
    {"Process Group Name", 6, S_PG_NAME},
    {"Group size", 1, I_GROUP_SIZE},
};
#define N_ARG_KEYS ((int)(sizeof(ARG_KEYS) / sizeof(ARG_KEYS[0])))

enum { E_PH, E_CAT, E_NAME, E_PID, E_TID, E_TS, E_DUR, E_ARGS, E_ID, N_EVENT_KEYS };
static const char *const EVENT_KEYS[N_EVENT_KEYS] = {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id"};

/* ---- interned strings: raw bytes between the quotes -> index in a Python list ---- */
typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
    uint64_t h;
    int64_t index;
    int verbatim;
} Slot;

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
    int escaped;
} Entry; /* a distinct string, in the order of the strings list */

/* The keys the last object of a kind had, by place (an object's `at`-th member): Kineto
 * writes each kind of object's keys in the same order, so most keys are the one the object
 * before had at that place, found by one comparison with it. */
#define GUESSES 32
typedef struct {
    const unsigned char *key[GUESSES]; /* (in the slice) */
    Py_ssize_t n[GUESSES];             /* 0: no guess */
    int k[GUESSES];
} Guess;

typedef struct {
    const unsigned char *s, *end, *base;
    Table tables[N_KINDS];
    Py_ssize_t n;          /* events read */
    const unsigned char *const *cat_bytes; /* the categories of a known kind (scan's argument) */
    const Py_ssize_t *cat_len;
    const int *cat_kind;
    int ncats;
    signed char *kinds;    /* the kind of each string as a category (-1: not yet told) */
    Py_ssize_t kinds_cap;
    Slot *slots;
    Py_ssize_t nslots;
    Entry *entries;
    Py_ssize_t nentries, entries_cap;
    const char *why;       /* reason for giving up, NULL while fine */
    int nomem;
    unsigned char *tmp;    /* decoded escapes */
    Py_ssize_t tmp_cap;
    PyThreadState *thread; /* saved while the GIL is released */
    Guess event_keys, arg_keys;
} P;

#define GIVE_UP(p, reason) do { if (!(p)->why) (p)->why = (reason); return -1; } while (0)
#define FAILED(p) ((p)->why != NULL)

static inline void ws(P *p) {
    const unsigned char *s = p->s, *e = p->end;
    if (s < e && *s > ' ') return;  /* (most calls: no white space) */
    if (s + 1 < e && *s == ' ' && s[1] > ' ') { p->s = s + 1; return; }  /* one space (a key's ": ") */
#ifdef __SSE2__
    while (s + 16 <= e) {  /* a line's end and indent (Kineto's layout) at once */
        __m128i v = _mm_loadu_si128((const __m128i *)s);
        __m128i w = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'))),
                                 _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\r')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'))));
        unsigned other = ~(unsigned)_mm_movemask_epi8(w) & 0xFFFFu;
        if (other) { p->s = s + __builtin_ctz(other); return; }
        s += 16;
    }
#endif
    while (s < e && *s <= ' ' && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) s++;
    p->s = s;
}

/* Whether n bytes at a and b are the same (inline: most are a few dozen bytes). */
static inline int same(const unsigned char *a, const unsigned char *b, Py_ssize_t n) {
    if (n > 64) return memcmp(a, b, (size_t)n) == 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) return 0;
    }
    for (; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static uint64_t hash(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h ^ (h >> 32);
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
/* The high bit of each byte of w that is a quote, a backslash, a control character or not
 * ASCII; bytes above the first such byte may be flagged too, never one below it. */
static inline uint64_t special(uint64_t w) {
    uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | (w - ONES * 0x20) | w) & HIGHS;
}

#ifdef __SSE2__
/* A bit per byte of the 16 at s that is a quote, a backslash, a control character or not
 * ASCII (the signed compare takes bytes of 0x80 and up as below 0x20). */
static inline unsigned specials16(const unsigned char *s) {
    __m128i v = _mm_loadu_si128((const __m128i *)s);
    __m128i q = _mm_cmpeq_epi8(v, _mm_set1_epi8('"')), b = _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'));
    return (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(q, b), _mm_cmplt_epi8(v, _mm_set1_epi8(0x20))));
}
#endif

/* A string at p->s that closes within the next 16 bytes with nothing special before its
 * closing quote (most keys and names): its bytes, and p->s past it; 0 (p->s unmoved) for any
 * other, which string() then reads. */
static inline int short_plain(P *p, const unsigned char **raw, Py_ssize_t *rawn) {
#ifdef __SSE2__
    const unsigned char *q = p->s + 1;
    if (p->end - q < 16) return 0;
    unsigned m = specials16(q);
    if (!m) return 0;
    int n = __builtin_ctz(m);
    if (q[n] != '"') return 0;
    *raw = q;
    *rawn = n;
    p->s = q + n + 1;
    return 1;
#else
    return 0;
#endif
}

/* Valid UTF-8 as Python's strict decoder takes it: no overlong forms, no surrogates, <= U+10FFFF. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        int more;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { more = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { more = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { more = 3; cp = c & 0x07; }
        else return 0;
        if (i + more >= n) return 0;
        for (int k = 1; k <= more; k++) {
            unsigned char d = s[i + k];
            if ((d & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (d & 0x3F);
        }
        if ((more == 2 && cp < 0x800) || (more == 3 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
        if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
        i += more + 1;
    }
    return 1;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const unsigned char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(s[i]);
        if (h < 0) return 0;
        v = (v << 4) | (uint32_t)h;
    }
    *out = v;
    return 1;
}

/* A string at p->s (its opening quote). Sets *raw / *rawn to the bytes between the quotes,
 * *plain to whether those bytes are the text itself (no escapes). Escapes are checked (and,
 * where decode is set, written to p->tmp as UTF-8, *dec / *decn). */
static int string(P *p, const unsigned char **raw, Py_ssize_t *rawn, int *plain, int decode,
                  const unsigned char **dec, Py_ssize_t *decn) {
    const unsigned char *s = p->s + 1, *e = p->end, *start = s;
    int escaped = 0, high = 0;
    while (1) {
#ifdef __SSE2__
        while (s + 16 <= e) {  /* sixteen at a time: the first byte that is special (specials16) */
            unsigned m = specials16(s);
            if (!m) { s += 16; continue; }
            s += __builtin_ctz(m);
            if (*s < 0x80) break;
            high = 1;
            s++;
        }
#endif
        while (s + 8 <= e) {  /* eight plain bytes at a time (little-endian: the first is lowest) */
            uint64_t w, m;
            memcpy(&w, s, 8);
            m = special(w);
            if (!m) { s += 8; continue; }
            s += __builtin_ctzll(m) >> 3;
            if (*s < 0x80) break;
            high = 1;
            s++;
        }
        while (s < e && *s != '"' && *s != '\\' && *s >= 0x20) {
            if (*s >= 0x80) high = 1;
            s++;
        }
        if (s >= e) GIVE_UP(p, "unterminated string");
        if (*s == '"') break;
        if (*s < 0x20) GIVE_UP(p, "control character in a string");
        /* a backslash */
        escaped = 1;
        if (s + 1 >= e) GIVE_UP(p, "unterminated string");
        unsigned char c = s[1];
        if (c == 'u') {
            if (s + 6 > e) GIVE_UP(p, "short \\u escape");
            uint32_t u;
            if (!hex4(s + 2, &u)) GIVE_UP(p, "bad \\u escape");
            if (u >= 0xDC00 && u <= 0xDFFF) GIVE_UP(p, "lone low surrogate");
            if (u >= 0xD800 && u <= 0xDBFF) {
                uint32_t lo;
                if (s + 12 > e || s[6] != '\\' || s[7] != 'u' || !hex4(s + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    GIVE_UP(p, "lone high surrogate");
                s += 12;
            } else {
                s += 6;
            }
        } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            s += 2;
        } else {
            GIVE_UP(p, "bad escape");
        }
    }
    *raw = start;
    *rawn = s - start;
    *plain = !escaped;
    p->s = s + 1;
    if (high && !utf8_ok(start, s - start)) GIVE_UP(p, "invalid UTF-8");
    if (!decode || !escaped) {
        if (dec) { *dec = start; *decn = s - start; }
        return 0;
    }
    /* decode the escapes (the text between is valid UTF-8, checked above) */
    Py_ssize_t n = s - start;
    if (p->tmp_cap < n) {
        unsigned char *t = realloc(p->tmp, (size_t)n);
        if (!t) { p->nomem = 1; GIVE_UP(p, "out of memory"); }
        p->tmp = t;
        p->tmp_cap = n;
    }
    unsigned char *o = p->tmp;
    for (const unsigned char *q = start; q < s;) {
        if (*q != '\\') { *o++ = *q++; continue; }
        unsigned char c = q[1];
        if (c != 'u') {
            *o++ = c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
            q += 2;
            continue;
        }
        uint32_t u, lo;
        hex4(q + 2, &u);
        q += 6;
        if (u >= 0xD800 && u <= 0xDBFF) {
            hex4(q + 2, &lo);
            q += 6;
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        /* UTF-8 of u: never longer than the escape it came from */
        if (u < 0x80) *o++ = (unsigned char)u;
        else if (u < 0x800) { *o++ = 0xC0 | (u >> 6); *o++ = 0x80 | (u & 0x3F); }
        else if (u < 0x10000) { *o++ = 0xE0 | (u >> 12); *o++ = 0x80 | ((u >> 6) & 0x3F); *o++ = 0x80 | (u & 0x3F); }
        else {
            *o++ = 0xF0 | (u >> 18); *o++ = 0x80 | ((u >> 12) & 0x3F);
            *o++ = 0x80 | ((u >> 6) & 0x3F); *o++ = 0x80 | (u & 0x3F);
        }
    }
    *dec = p->tmp;
    *decn = o - p->tmp;
    return 0;
}

/* Twice the room (at least 1024 items) for an array of `item`-byte items. */
static int grow(P *p, void **items, Py_ssize_t *cap, size_t item) {
    Py_ssize_t n = *cap >= 512 ? *cap * 2 : 1024;
    void *t = realloc(*items, (size_t)n * item);
    if (!t) { p->nomem = 1; GIVE_UP(p, "out of memory"); }
    *items = t;
    *cap = n;
    return 0;
}

static int grow_slots(P *p) {
    Py_ssize_t n = p->nslots ? p->nslots * 2 : 1024;
    Slot *t = calloc((size_t)n, sizeof(Slot));
    if (!t) { p->nomem = 1; GIVE_UP(p, "out of memory"); }
    for (Py_ssize_t i = 0; i < p->nslots; i++) {
        if (!p->slots[i].p) continue;
        Py_ssize_t j = (Py_ssize_t)(p->slots[i].h & (uint64_t)(n - 1));
        while (t[j].p) j = (j + 1) & (n - 1);
        t[j] = p->slots[i];
    }
    free(p->slots);
    p->slots = t;
    p->nslots = n;
    return 0;
}

/* The index in p->strings of the n bytes at raw (added on first sight). `escaped`: they are
 * a JSON string's content with escapes (decoded when the str is made); `verbatim`: they are
 * a raw JSON value, kept as its text (an operator's input shapes). The two kinds never share
 * an entry, whatever their bytes. */
static int intern_bytes(P *p, const unsigned char *raw, Py_ssize_t rawn, int escaped, int verbatim, int64_t *index) {
    uint64_t h = hash(raw, rawn) ^ (verbatim ? 0x9E3779B97F4A7C15ULL : 0);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(p->nslots - 1));
    while (p->slots[j].p) {
        Slot *sl = &p->slots[j];
        if (sl->h == h && sl->n == rawn && sl->verbatim == verbatim && same(sl->p, raw, rawn)) { *index = sl->index; return 0; }
        j = (j + 1) & (p->nslots - 1);
    }
    /* first sight: a new entry (its str is made once the parse is done) */
    if (p->nentries == p->entries_cap && grow(p, (void **)&p->entries, &p->entries_cap, sizeof(Entry)) < 0) return -1;
    *index = p->nentries;
    p->entries[p->nentries].p = raw;
    p->entries[p->nentries].n = rawn;
    p->entries[p->nentries].escaped = escaped;
    p->nentries++;
    p->slots[j].p = raw;
    p->slots[j].n = rawn;
    p->slots[j].h = h;
    p->slots[j].verbatim = verbatim;
    p->slots[j].index = *index;
    if (p->nentries * 2 > p->nslots && grow_slots(p) < 0) return -1;
    return 0;
}

/* The index of the string at p->s in p->strings (added on first sight). */
static int interned(P *p, int64_t *index) {
    const unsigned char *raw;
    Py_ssize_t rawn;
    int plain;
    if (p->s >= p->end || *p->s != '"') GIVE_UP(p, "expected a string");
    if (short_plain(p, &raw, &rawn)) plain = 1;
    else if (string(p, &raw, &rawn, &plain, 0, NULL, NULL) < 0) return -1;
    if (rawn == 0) { *index = 0; return 0; }
    return intern_bytes(p, raw, rawn, !plain, 0, index);
}

/* A JSON number. *is_int: no fraction nor exponent; then *iv holds it (*big: past int64).
 * *dv: its double value, correctly rounded (only computed where want_double). */
static int number(P *p, int *is_int, int64_t *iv, int *big, double *dv, int want_double) {
    const unsigned char *s = p->s, *e = p->end, *start = s;
    int neg = 0;
    if (s < e && *s == '-') { neg = 1; s++; }
    if (s >= e || *s < '0' || *s > '9') GIVE_UP(p, "not a value");
    uint64_t m = 0;
    int digits = 0, overflow = 0;
    if (*s == '0') { s++; digits = 1; }
    else {
        while (s < e && *s >= '0' && *s <= '9') {
            if (digits < 18) m = m * 10 + (uint64_t)(*s - '0');  /* 18 digits never overflow */
            else if (m > (UINT64_MAX - 9) / 10) overflow = 1;
            else m = m * 10 + (uint64_t)(*s - '0');
            digits++;
            s++;
        }
    }
    /* the digits as one integer while they fit (for the fast path below) */
    int frac_digits = 0, total = digits;
    uint64_t mf = m;
    int fast = !overflow && digits <= 19;
    if (s < e && *s == '.') {
        s++;
        if (s >= e || *s < '0' || *s > '9') GIVE_UP(p, "bad number");
        while (s < e && *s >= '0' && *s <= '9') {
            if (fast && total < 19) { mf = mf * 10 + (uint64_t)(*s - '0'); total++; }
            else fast = 0;
            frac_digits++;
            s++;
        }
    }
    int has_exp = 0;
    if (s < e && (*s == 'e' || *s == 'E')) {
        has_exp = 1;
        s++;
        if (s < e && (*s == '+' || *s == '-')) s++;
        if (s >= e || *s < '0' || *s > '9') GIVE_UP(p, "bad number");
        while (s < e && *s >= '0' && *s <= '9') s++;
    }
    p->s = s;
    *is_int = !frac_digits && !has_exp;
    *big = 0;
    if (*is_int) {
        if (overflow || (!neg && m > (uint64_t)INT64_MAX) || (neg && m > (uint64_t)INT64_MAX + 1)) *big = 1;
        else *iv = neg ? (int64_t)(0 - m) : (int64_t)m;
    }
    if (!want_double) return 0;
    static const double P10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    if (fast && !has_exp && mf <= (1ULL << 53) && frac_digits <= 22) {
        /* Clinger's fast path: both the mantissa (< 2^53) and 10^k are exact doubles, so one
         * division is correctly rounded */
        double v = (double)mf;
        if (frac_digits) v /= P10[frac_digits];
        *dv = neg ? -v : v;
        return 0;
    }
    Py_ssize_t n = s - start;
    char buf[128];
    if (n >= (Py_ssize_t)sizeof(buf)) GIVE_UP(p, "long number");
    memcpy(buf, start, (size_t)n);
    buf[n] = 0;
    double v;
#ifdef HAVE_STRTOD_L
    v = strtod_l(buf, NULL, C_NUMERIC);  /* correctly rounded, as msgspec's own */
#else
    PyEval_RestoreThread(p->thread);
    v = PyOS_string_to_double(buf, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) PyErr_Clear();
    p->thread = PyEval_SaveThread();
#endif
    *dv = v;
    return 0;
}

static int value_skip(P *p, int depth);

static int literal(P *p, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n) != 0) GIVE_UP(p, "not a value");
    p->s += n;
    return 0;
}

static int value_skip(P *p, int depth) {
    if (depth > MAX_DEPTH) GIVE_UP(p, "nested too deep");
    ws(p);
    if (p->s >= p->end) GIVE_UP(p, "truncated");
    unsigned char c = *p->s;
    const unsigned char *raw;
    Py_ssize_t rawn;
    int plain;
    if (c == '"') return string(p, &raw, &rawn, &plain, 0, NULL, NULL);
    if (c == '{') {
        p->s++;
        ws(p);
        if (p->s < p->end && *p->s == '}') { p->s++; return 0; }
        while (1) {
            ws(p);
            if (p->s >= p->end || *p->s != '"') GIVE_UP(p, "expected a key");
            if (string(p, &raw, &rawn, &plain, 0, NULL, NULL) < 0) return -1;
            ws(p);
            if (p->s >= p->end || *p->s != ':') GIVE_UP(p, "expected ':'");
            p->s++;
            if (value_skip(p, depth + 1) < 0) return -1;
            ws(p);
            if (p->s < p->end && *p->s == ',') { p->s++; continue; }
            if (p->s < p->end && *p->s == '}') { p->s++; return 0; }
            GIVE_UP(p, "expected ',' or '}'");
        }
    }
    if (c == '[') {
        p->s++;
        ws(p);
        if (p->s < p->end && *p->s == ']') { p->s++; return 0; }
        while (1) {
            if (value_skip(p, depth + 1) < 0) return -1;
            ws(p);
            if (p->s < p->end && *p->s == ',') { p->s++; continue; }
            if (p->s < p->end && *p->s == ']') { p->s++; return 0; }
            GIVE_UP(p, "expected ',' or ']'");
        }
    }
    if (c == 't') return literal(p, "true");
    if (c == 'f') return literal(p, "false");
    if (c == 'n') return literal(p, "null");
    int is_int, big;
    int64_t iv;
    double dv;
    return number(p, &is_int, &iv, &big, &dv, 0);
}

static int is_null(P *p) {
    if (p->end - p->s >= 4 && memcmp(p->s, "null", 4) == 0) { p->s += 4; return 1; }
    return 0;
}

/* An integer (within lo..hi) or, where nullable, null (*present = 0). */
static int integer(P *p, int64_t lo, int64_t hi, int nullable, int64_t *out, int *present) {
    ws(p);
    if (nullable && is_null(p)) { *present = 0; return 0; }
    if (p->s >= p->end || (*p->s != '-' && (*p->s < '0' || *p->s > '9'))) GIVE_UP(p, "not an integer");
    int is_int, big;
    double dv;
    if (number(p, &is_int, out, &big, &dv, 0) < 0) return -1;
    if (!is_int) GIVE_UP(p, "not an integer");
    if (big || *out < lo || *out > hi) GIVE_UP(p, "integer out of range");
    *present = 1;
    return 0;
}

/* A float of the model's microsecond range (ints are taken as floats, as msgspec does). */
static int micros(P *p, int nullable, double *out) {
    ws(p);
    if (nullable && is_null(p)) { *out = NAN; return 0; }
    if (p->s >= p->end || (*p->s != '-' && (*p->s < '0' || *p->s > '9'))) GIVE_UP(p, "not a number");
    int is_int, big;
    int64_t iv;
    if (number(p, &is_int, &iv, &big, out, 1) < 0) return -1;
    if (!(*out >= -9.2e15 && *out <= 9.2e15)) GIVE_UP(p, "time out of range");
    return 0;
}

/* Keys of each length (at most 4 of a length here), found by length and then compared: the
 * first eight bytes as one word (a key's first word is kept beside its index), the rest
 * byte by byte (only keys longer than 8 bytes have a rest). */
#define MAX_KEY 32
typedef struct {
    signed char index[MAX_KEY][4];
    uint64_t head[MAX_KEY][4];
} Keys;
static Keys ARG_INDEX, EVENT_INDEX;

/* The first min(n, 8) bytes at s as a word, zero above them. `room`: bytes readable at s
 * (a word is loaded at once where 8 are, else byte by byte). */
static inline uint64_t head_word(const unsigned char *s, Py_ssize_t n, Py_ssize_t room) {
    uint64_t w = 0;
    if (room >= 8) {
        memcpy(&w, s, 8);
        if (n < 8) w &= (1ULL << (8 * n)) - 1;  /* (little-endian: the first byte is lowest) */
    } else {
        for (Py_ssize_t i = 0; i < n && i < 8; i++) w |= (uint64_t)s[i] << (8 * i);
    }
    return w;
}

/* 0, or -1 where a key is too long or a fifth of one length (the module then does not load,
 * and the reader decodes with msgspec): a key added to the tables never goes unmatched. */
static int index_keys(Keys *k, const char *const *names, int n) {
    memset(k->index, -1, sizeof(k->index));
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        int j = 0;
        while (len < MAX_KEY && j < 4 && k->index[len][j] >= 0) j++;
        if (len >= MAX_KEY || j == 4) return -1;
        k->index[len][j] = (signed char)i;
        k->head[len][j] = head_word((const unsigned char *)names[i], (Py_ssize_t)len, 0);
    }
    return 0;
}

/* The index among names of the n-byte key at raw (room: bytes readable there), or -1. */
static inline int key_of(const Keys *k, const char *const *names, const unsigned char *raw, Py_ssize_t n, Py_ssize_t room) {
    if (n >= MAX_KEY) return -1;
    uint64_t w = head_word(raw, n, room);
    for (int j = 0; j < 4; j++) {
        int i = k->index[n][j];
        if (i < 0) return -1;
        if (k->head[n][j] != w) continue;
        Py_ssize_t b = 8;
        while (b < n && raw[b] == (unsigned char)names[i][b]) b++;
        if (b >= n) return i;
    }
    return -1;
}

static const char *ARG_NAMES[N_ARG_KEYS];

/* grid/block: null or a list of int32; the first three kept */
static int dims(P *p, Rec *r, int slot) {
    ws(p);
    if (is_null(p)) return 0;
    if (p->s >= p->end || *p->s != '[') GIVE_UP(p, "dims not a list");
    p->s++;
    ws(p);
    if (p->s < p->end && *p->s == ']') { p->s++; return 0; }
    for (int i = 0;; i++) {
        int64_t v;
        int present;
        if (integer(p, -2147483648LL, 2147483647LL, 0, &v, &present) < 0) return -1;
        if (i < 3) { r->ints[slot + i] = v; r->valid |= 1ULL << (slot + i); }
        ws(p);
        if (p->s < p->end && *p->s == ',') { p->s++; continue; }
        if (p->s < p->end && *p->s == ']') { p->s++; return 0; }
        GIVE_UP(p, "expected ',' or ']'");
    }
}

/* An object's '{': 1 where it is empty (its '}' read too), 0 where members follow, -1. */
static int object_open(P *p, const char *what) {
    ws(p);
    if (p->s >= p->end || *p->s != '{') GIVE_UP(p, what);
    p->s++;
    ws(p);
    if (p->s < p->end && *p->s == '}') { p->s++; return 1; }
    return 0;
}

/* A member's key and its ':'. *k: the key's index among names (-1: another key); a known
 * key seen twice in the object gives up (which of the two msgspec keeps is not this
 * decoder's to guess). `at`: the member's place in its object (guess: the keys the last such
 * object had, updated). */
static int member_key(P *p, const Keys *index, const char *const *names, uint32_t *seen, int *k, Guess *guess, int at) {
    const unsigned char *raw;
    Py_ssize_t rawn;
    int plain;
    ws(p);
    if (p->s >= p->end || *p->s != '"') GIVE_UP(p, "expected a key");
    const unsigned char *q = p->s + 1;
    at &= GUESSES - 1;
    rawn = guess->n[at];
    if (rawn && p->end - q > rawn && q[rawn] == '"' && same(q, guess->key[at], rawn)) {
        p->s = q + rawn + 1;  /* the key the last object had here */
        *k = guess->k[at];
    } else {
        if (!short_plain(p, &raw, &rawn)) {
            if (string(p, &raw, &rawn, &plain, 0, NULL, NULL) < 0) return -1;
            if (!plain) GIVE_UP(p, "escaped key");
        }
        *k = key_of(index, names, raw, rawn, p->end - raw);
        guess->key[at] = raw;
        guess->n[at] = rawn;
        guess->k[at] = *k;
    }
    ws(p);
    if (p->s >= p->end || *p->s != ':') GIVE_UP(p, "expected ':'");
    p->s++;
    ws(p);
    if (*k >= 0) {
        if (*seen & (1U << *k)) GIVE_UP(p, "duplicate key");
        *seen |= 1U << *k;
    }
    return 0;
}

/* After a member: 1 at ',' (another follows), 0 at the object's '}', -1. */
static int member_end(P *p) {
    ws(p);
    if (p->s < p->end && *p->s == ',') { p->s++; return 1; }
    if (p->s < p->end && *p->s == '}') { p->s++; return 0; }
    GIVE_UP(p, "expected ',' or '}'");
}

static int args(P *p, Rec *r) {
    int empty = object_open(p, "args not an object");
    if (empty) return empty < 0 ? -1 : 0;
    uint32_t seen = 0;
    int at = 0;
    for (int more = 1; more;) {
        const unsigned char *raw;
        Py_ssize_t rawn;
        int plain, k;
        if (member_key(p, &ARG_INDEX, ARG_NAMES, &seen, &k, &p->arg_keys, at++) < 0) return -1;
        if (k < 0) {
            if (value_skip(p, 2) < 0) return -1;
        } else {
            const ArgKey *a = &ARG_KEYS[k];
            int64_t v;
            int present;
            ws(p);
            const unsigned char *at = p->s;
            switch (a->kind) {
            case 0:
            case 1:
                if (integer(p, a->kind ? -2147483648LL : INT64_MIN, a->kind ? 2147483647LL : INT64_MAX, 1, &v, &present) < 0)
                    return -1;
                if (present) { r->ints[a->slot] = v; r->valid |= 1ULL << a->slot; }
                break;
            case 2:
                if (dims(p, r, I_GRID_X) < 0) return -1;
                break;
            case 3:
                if (dims(p, r, I_BLOCK_X) < 0) return -1;
                break;
            case 4:  /* the value's JSON text, interned: a model's operators repeat a few shapes */
                if (value_skip(p, 2) < 0) return -1;
                if (intern_bytes(p, at, p->s - at, 0, 1, &r->span_off[a->slot]) < 0) return -1;
                r->span_len[a->slot] = p->s - at;
                break;
            default:  /* 5: str | null; 6: str | int | null */
                if (is_null(p)) break;
                if (p->s < p->end && *p->s == '"') {
                    if (string(p, &raw, &rawn, &plain, 0, NULL, NULL) < 0) return -1;
                } else if (a->kind == 6) {
                    int is_int, big;
                    double dv;
                    if (p->s >= p->end || (*p->s != '-' && (*p->s < '0' || *p->s > '9'))) GIVE_UP(p, "not a string");
                    if (number(p, &is_int, &v, &big, &dv, 0) < 0) return -1;
                    if (!is_int) GIVE_UP(p, "not a string or integer");
                } else {
                    GIVE_UP(p, "not a string");
                }
                r->span_off[a->slot] = at - p->base;
                r->span_len[a->slot] = p->s - at;
            }
        }
        if ((more = member_end(p)) < 0) return -1;
    }
    return 0;
}

static Rec BLANK; /* a record before its event is read: ts NaN, no spans (set at import) */

/* Twice the rows for a table (at least 1024). */
static int grow_table(P *p, Table *t) {
    Py_ssize_t cap = t->cap >= 512 ? t->cap * 2 : 1024;
    uint64_t *d = realloc(t->data, (size_t)t->ncols * (size_t)cap * sizeof(uint64_t));
    if (!d) { p->nomem = 1; GIVE_UP(p, "out of memory"); }
    t->data = d;
    t->cap = cap;
    return 0;
}

/* The kind of the string of that index as a category (K_OTHER for any but scan's categories),
 * -1 where the category is written with escapes (the usual path reads those). */
static int kind_of(P *p, int64_t index) {
    if (index >= p->kinds_cap) {
        Py_ssize_t cap = p->kinds_cap ? p->kinds_cap : 1024;
        while (cap <= index) cap *= 2;
        signed char *k = realloc(p->kinds, (size_t)cap);
        if (!k) { p->nomem = 1; GIVE_UP(p, "out of memory"); }
        memset(k + p->kinds_cap, -1, (size_t)(cap - p->kinds_cap));
        p->kinds = k;
        p->kinds_cap = cap;
    }
    if (p->kinds[index] >= 0) return p->kinds[index];
    const Entry *e = &p->entries[index];
    if (e->escaped) GIVE_UP(p, "escaped category");
    int kind = K_OTHER;
    for (int i = 0; i < p->ncats; i++)
        if (p->cat_len[i] == e->n && (e->n == 0 || memcmp(p->cat_bytes[i], e->p, (size_t)e->n) == 0)) { kind = p->cat_kind[i]; break; }
    p->kinds[index] = (signed char)kind;
    return kind;
}

/* The event's record into its kind's table (operators and frames only of phase "X"). */
static int route(P *p, const Rec *r) {
    p->n++;
    int kind = kind_of(p, r->cat);
    if (kind < 0) return -1;
    if (kind == K_OP || kind == K_FRAME) {
        const Entry *ph = &p->entries[r->ph];
        if (ph->escaped) GIVE_UP(p, "escaped phase");
        if (ph->n != 1 || ph->p[0] != 'X') return 0;
    }
    Table *t = &p->tables[kind];
    if (t->n == t->cap && grow_table(p, t) < 0) return -1;
    const uint64_t *w = (const uint64_t *)r;
    uint64_t *d = t->data + (size_t)t->n * (size_t)t->ncols;
    for (int j = 0; j < t->ncols; j++) d[j] = w[t->fields[j]];
    t->n++;
    return 0;
}

static int event(P *p) {
    Rec rec = BLANK, *r = &rec;
    int empty = object_open(p, "event not an object");
    if (empty) {
        if (empty < 0) return -1;
        return route(p, r);
    }
    uint32_t seen = 0;
    int at = 0;
    for (int more = 1; more;) {
        const unsigned char *raw;
        Py_ssize_t rawn;
        int plain, k;
        if (member_key(p, &EVENT_INDEX, EVENT_KEYS, &seen, &k, &p->event_keys, at++) < 0) return -1;
        int present, is_int, big;
        int64_t iv;
        double dv;
        switch (k) {
        case E_PH: if (interned(p, &r->ph) < 0) return -1; break;
        case E_CAT: if (interned(p, &r->cat) < 0) return -1; break;
        case E_NAME: if (interned(p, &r->name) < 0) return -1; break;
        case E_PID:  /* int | str: a string's index is kept, and flagged */
        case E_TID: {
            int64_t *v = k == E_PID ? &r->pid : &r->tid;
            if (p->s < p->end && *p->s == '"') {
                if (interned(p, v) < 0) return -1;
                r->valid |= 1ULL << (k == E_PID ? PID_TEXT : TID_TEXT);
            } else if (integer(p, INT64_MIN, INT64_MAX, 0, v, &present) < 0) {
                return -1;
            }
            break;
        }
        case E_TS: if (micros(p, 1, &r->ts) < 0) return -1; break;
        case E_DUR: if (micros(p, 0, &r->dur) < 0) return -1; break;
        case E_ARGS: if (args(p, r) < 0) return -1; break;
        case E_ID:  /* int | str | None: checked, not kept (flows are linked by the usual path) */
            if (is_null(p)) break;
            if (p->s < p->end && *p->s == '"') {
                if (string(p, &raw, &rawn, &plain, 0, NULL, NULL) < 0) return -1;
                break;
            }
            if (p->s >= p->end || (*p->s != '-' && (*p->s < '0' || *p->s > '9'))) GIVE_UP(p, "id not an integer");
            if (number(p, &is_int, &iv, &big, &dv, 0) < 0) return -1;
            if (!is_int) GIVE_UP(p, "id not an integer");
            break;
        default:
            if (value_skip(p, 1) < 0) return -1;
        }
        if ((more = member_end(p)) < 0) return -1;
    }
    return route(p, r);
}

/* The parse, without the GIL: 0 or -1 (p->why says why). */
static int parse(P *p) {
    p->entries_cap = 1024;
    p->entries = malloc((size_t)p->entries_cap * sizeof(Entry));
    if (!p->entries) { p->nomem = 1; GIVE_UP(p, "out of memory"); }
    p->entries[0].p = NULL;  /* strings[0] is "" */
    p->entries[0].n = 0;
    p->entries[0].escaped = 0;
    p->nentries = 1;
    if (grow_slots(p) < 0) return -1;
    ws(p);
    if (p->s >= p->end || *p->s != '[') GIVE_UP(p, "not an array");
    p->s++;
    ws(p);
    if (p->s < p->end && *p->s == ']') p->s++;
    else {
        while (1) {
            if (event(p) < 0) return -1;
            ws(p);
            if (p->s < p->end && *p->s == ',') { p->s++; continue; }
            if (p->s < p->end && *p->s == ']') { p->s++; break; }
            GIVE_UP(p, "expected ',' or ']'");
        }
    }
    ws(p);
    if (p->s != p->end) GIVE_UP(p, "data after the array");
    return 0;
}

/* The distinct strings as a list of str, in index order. */
static PyObject *strings(P *p) {
    PyObject *list = PyList_New(p->nentries);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < p->nentries; i++) {
        Entry *e = &p->entries[i];
        const unsigned char *raw, *dec = e->p;
        Py_ssize_t rawn, decn = e->n;
        int plain;
        if (e->escaped) {  /* decode the escapes again, now to keep */
            p->s = e->p - 1;
            if (string(p, &raw, &rawn, &plain, 1, &dec, &decn) < 0) { Py_DECREF(list); return NULL; }
        }
        PyObject *u = PyUnicode_DecodeUTF8((const char *)(dec ? dec : (const unsigned char *)""), decn, "strict");
        if (!u) {
            PyErr_Clear();
            Py_DECREF(list);
            p->why = "invalid UTF-8";
            return NULL;
        }
        PyList_SET_ITEM(list, i, u);
    }
    return list;
}

/* A table's first room, in rows: as many a byte as the last slice's parse found (rows are what
 * was parsed, never what the bytes might hold), no more than an event of MIN_EVENT_BYTES a
 * row, and FIRST_ROWS in a first slice; a table that fills grows by doubling (grow_table).
 * Sizing a first slice by its braces gave a slice of only '{' 8 M rows a table, 216 bytes of
 * room an input byte (3.6 GB for 16 MiB), where no event was parsed at all. */
#define MIN_EVENT_BYTES 64
#define FIRST_ROWS 1024
static Py_ssize_t first_room(Py_ssize_t len, Py_ssize_t last_rows_k, Py_ssize_t last_bytes_) {
    Py_ssize_t most = len / MIN_EVENT_BYTES + 16;
    if (!last_bytes_) return FIRST_ROWS < most ? FIRST_ROWS : most;
    double g = (double)len * (double)last_rows_k / (double)last_bytes_ * 1.1 + 16;
    return g < (double)most ? (Py_ssize_t)g : most;
}

/* One table of a slice, handed to Python without a copy: the buffer the parse wrote, freed
 * with the object. */
typedef struct {
    PyObject_HEAD
    Table t;
} Columns;

static int columns_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Table *t = &((Columns *)self)->t;
    return PyBuffer_FillInfo(view, self, t->data, (Py_ssize_t)t->ncols * t->cap * (Py_ssize_t)sizeof(uint64_t), 1, flags);
}

static long live_tables; /* Columns not yet freed (live(): for the tests; the GIL guards it) */

static void columns_dealloc(PyObject *self) {
    free(((Columns *)self)->t.data);
    live_tables--;
    Py_TYPE(self)->tp_free(self);
}

static PyObject *columns_shape(PyObject *self, PyObject *unused) {
    Table *t = &((Columns *)self)->t;
    return Py_BuildValue("(nni)", t->n, t->cap, t->ncols);
}

static PyMethodDef COLUMNS_METHODS[] = {
    {"shape", columns_shape, METH_NOARGS, "(rows, rows of room, columns)"},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs COLUMNS_BUFFER = {columns_getbuffer, NULL};

static PyTypeObject COLUMNS_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proflab.readers._kscan.Columns",
    .tp_basicsize = sizeof(Columns),
    .tp_dealloc = columns_dealloc,
    .tp_as_buffer = &COLUMNS_BUFFER,
    .tp_methods = COLUMNS_METHODS,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One kind's table of a slice: a read-only buffer of rows of 8-byte words (shape(): rows, room, columns).",
};

/* The last slice's rows of each kind and its bytes, for the next slice's guess of its tables'
 * rows (read and written with the GIL held). */
static Py_ssize_t last_rows[N_KINDS], last_bytes;

#define MAX_CATEGORIES 64

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *buffer, *categories;
    if (!PyArg_ParseTuple(args, "OO!", &buffer, &PyTuple_Type, &categories)) return NULL;
    const unsigned char *cat_bytes[MAX_CATEGORIES];
    Py_ssize_t cat_len[MAX_CATEGORIES];
    int cat_kind[MAX_CATEGORIES];
    Py_ssize_t ncats = PyTuple_GET_SIZE(categories);
    if (ncats > MAX_CATEGORIES) { PyErr_SetString(PyExc_ValueError, "too many categories"); return NULL; }
    for (Py_ssize_t i = 0; i < ncats; i++) {
        PyObject *pair = PyTuple_GET_ITEM(categories, i);
        char *b;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "categories: (bytes, kind) pairs");
            return NULL;
        }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        if (kind < 1 || kind >= N_KINDS) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "categories: a kind of 1 to 3");
            return NULL;
        }
        if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(pair, 0), &b, &cat_len[i]) < 0) return NULL;
        cat_bytes[i] = (const unsigned char *)b;  /* (the tuple holds the bytes through the parse) */
        cat_kind[i] = (int)kind;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) return NULL;
    Columns *out[N_KINDS] = {NULL};
    for (int k = 0; k < N_KINDS; k++) {
        out[k] = PyObject_New(Columns, &COLUMNS_TYPE);
        if (!out[k]) {
            for (int j = 0; j < k; j++) Py_DECREF(out[j]);
            PyBuffer_Release(&view);
            return NULL;
        }
        memset(&out[k]->t, 0, sizeof(Table));
        live_tables++;
    }
    P p;
    memset(&p, 0, sizeof(p));
    p.base = p.s = (const unsigned char *)view.buf;
    p.end = p.s + view.len;
    p.cat_bytes = cat_bytes;
    p.cat_len = cat_len;
    p.cat_kind = cat_kind;
    p.ncats = (int)ncats;
    Py_ssize_t guess[N_KINDS], bytes = last_bytes;
    for (int k = 0; k < N_KINDS; k++) guess[k] = last_rows[k];
    p.thread = PyEval_SaveThread();
    /* one allocation a table in most slices (growing by doubling copies a table twice): each
     * kind's rows a byte as the last slice's parse found them (``first_room``) */
    int ok = 1;
    for (int k = 0; k < N_KINDS && ok; k++) {
        Table *t = &p.tables[k];
        t->fields = TABLE_FIELDS[k];
        while (t->fields[t->ncols] >= 0) t->ncols++;
        t->cap = first_room(view.len, guess[k], bytes);
        t->data = malloc((size_t)t->ncols * (size_t)t->cap * sizeof(uint64_t));
        if (!t->data) p.nomem = 1, ok = 0;
    }
    ok = ok && parse(&p) == 0;
    PyEval_RestoreThread(p.thread);
    for (int k = 0; k < N_KINDS; k++) out[k]->t = p.tables[k];  /* (freed with out, whatever happens below) */
    PyObject *result = NULL;
    if (p.nomem) {
        PyErr_NoMemory();
    } else if (ok) {
        for (int k = 0; k < N_KINDS; k++) last_rows[k] = p.tables[k].n;
        last_bytes = view.len > 0 ? view.len : 1;
        PyObject *list = strings(&p);
        if (list) {
            result = Py_BuildValue("(n(OOOO)N)", p.n, (PyObject *)out[K_GPU], (PyObject *)out[K_OP], (PyObject *)out[K_FRAME],
                                   (PyObject *)out[K_OTHER], list);
        }
    }
    for (int k = 0; k < N_KINDS; k++) Py_DECREF(out[k]);
    if (!result && !PyErr_Occurred()) result = PyUnicode_FromString(p.why ? p.why : "unknown");
    free(p.slots);
    free(p.entries);
    free(p.kinds);
    free(p.tmp);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *table_fields(void) {
    PyObject *all = PyTuple_New(N_KINDS);
    if (!all) return NULL;
    for (int k = 0; k < N_KINDS; k++) {
        int n = 0;
        while (TABLE_FIELDS[k][n] >= 0) n++;
        PyObject *one = PyTuple_New(n);
        if (!one) { Py_DECREF(all); return NULL; }
        for (int j = 0; j < n; j++) PyTuple_SET_ITEM(one, j, PyLong_FromLong(TABLE_FIELDS[k][j]));
        PyTuple_SET_ITEM(all, k, one);
    }
    return all;
}

static PyObject *layout(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(inii(iiii)N)", KSCAN_VERSION, (Py_ssize_t)sizeof(Rec), N_INTS, N_SPANS, K_GPU, K_OP, K_FRAME, K_OTHER,
                         table_fields());
}

static PyObject *live(PyObject *self, PyObject *unused) { return PyLong_FromLong(live_tables); }

/* One read of a JSON document's structure, its state carried in and out: whether it ends
 * inside a string, the run of backslashes it ends with (a quote after an odd run is escaped;
 * the run may go on from the read before) and the nesting depth outside strings. With
 * `inner` >= 0 (the events array's depth, open and not yet closed): the offsets of the
 * commas at that depth (int64, native order, as bytes) up to the array's `]` at that depth,
 * whose offset is `close` (-1: not in this read); the depth is followed to the read's end
 * either way. `broken`: the depth went below zero (not a JSON document). It is the numpy scan
 * of readers._slices._Structure.feed, byte for byte, at a pass over the bytes. */
static PyObject *structure(PyObject *self, PyObject *args) {
    PyObject *buffer;
    int in_string;
    Py_ssize_t backslashes, depth, inner;
    if (!PyArg_ParseTuple(args, "Opnnn", &buffer, &in_string, &backslashes, &depth, &inner)) return NULL;
    if (backslashes < 0 || depth < 0) { PyErr_SetString(PyExc_ValueError, "structure: a negative state"); return NULL; }
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *s = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, cap = 0, count = 0, close = -1;
    int64_t *commas = NULL;
    int broken = 0, want = inner >= 0;
    /* (the state in locals: stores through `commas` may alias what the parse wrote into) */
    int str = in_string;
    Py_ssize_t bs = backslashes, d = depth, i = 0;
    Py_BEGIN_ALLOW_THREADS
    while (i < n) {
        if (str) {
            /* inside a string only a quote can end it: to the next one, then the run of
             * backslashes before it (where the run reaches back to where this search began,
             * the run carried into it counts too) */
            const unsigned char *q = memchr(s + i, '"', (size_t)(n - i));
            Py_ssize_t j = q ? (Py_ssize_t)(q - s) : n, k = j;
            while (k > i && s[k - 1] == '\\') k--;
            Py_ssize_t run = (k == i ? bs : 0) + (j - k);
            if (!q) { bs = run; break; }
            if ((run & 1) == 0) str = 0;
            bs = 0;
            i = j + 1;
            continue;
        }
        unsigned char c = s[i++];
        if (c == '\\') { bs++; continue; }
        if (c == '"') {
            if ((bs & 1) == 0) str = 1;
            bs = 0;
            continue;
        }
        bs = 0;
        if (c == '{' || c == '[') {
            d++;
        } else if (c == '}' || c == ']') {
            if (want && c == ']' && d == inner) { close = i - 1; want = 0; }
            if (--d < 0) { broken = 1; break; }
        } else if (c == ',' && want && d == inner) {
            if (count == cap) {
                Py_ssize_t grown = cap ? cap * 2 : 1024;
                int64_t *more = realloc(commas, (size_t)grown * sizeof(int64_t));
                if (!more) { broken = -1; break; }
                commas = more;
                cap = grown;
            }
            commas[count++] = (int64_t)(i - 1);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (broken < 0) { free(commas); return PyErr_NoMemory(); }
    PyObject *found = PyBytes_FromStringAndSize((const char *)commas, (Py_ssize_t)(count * sizeof(int64_t)));
    free(commas);
    if (!found) return NULL;
    return Py_BuildValue("(NnNnnN)", found, close, PyBool_FromLong(str), bs, d, PyBool_FromLong(broken));
}

static PyMethodDef METHODS[] = {
    {"structure", structure, METH_VARARGS, "One read of a JSON document's structure inside its events array (see the source)."},
    {"scan", scan, METH_VARARGS, "Decode a JSON array of Kineto events into tables by kind; a str (the reason) where it gives up."},
    {"live", live, METH_NOARGS, "How many tables scan() made are not yet freed."},
    {"layout", layout, METH_NOARGS, "(version, record size, integer args, raw spans, (gpu, op, frame, other kinds), each kind's record words)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_kscan", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kscan(void) {
#ifdef HAVE_STRTOD_L
    if (!C_NUMERIC) C_NUMERIC = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!C_NUMERIC) return PyErr_NoMemory();
#endif
    for (int i = 0; i < N_ARG_KEYS; i++) ARG_NAMES[i] = ARG_KEYS[i].key;
    memset(&BLANK, 0, sizeof(BLANK));
    BLANK.ts = NAN;
    for (int i = 0; i < N_SPANS; i++) { BLANK.span_off[i] = -1; BLANK.span_len[i] = -1; }
    if (index_keys(&ARG_INDEX, ARG_NAMES, N_ARG_KEYS) < 0 || index_keys(&EVENT_INDEX, EVENT_KEYS, N_EVENT_KEYS) < 0) {
        PyErr_SetString(PyExc_ImportError, "_kscan: a key the decoder cannot index");
        return NULL;
    }
    if (PyType_Ready(&COLUMNS_TYPE) < 0) return NULL;
    return PyModule_Create(&MODULE);
}
