/* KernelCall in C: one generated kernel's call, planned once for a layout (kernels/
 * kernel_call.py has the same class in Python, used where this extension is not built).
 *
 * A plan holds the kernel's function, its argument vector with every integer and constant
 * buffer filled in, and where each array of a call goes in it. ``plan(*arrays, out)`` puts
 * the arrays' data pointers into a copy of that vector on the stack and calls the kernel:
 * holding the GIL for a small call, releasing it otherwise, as KernelEntry.fast_fn does. It
 * counts the call as a hit of the kernel's cache entry and, while the timeline records,
 * times the kernel and gives the times and the call's arrays to the plan's ``note`` (its
 * timeline records: note(t0, t1, arrays)).
 * The eval loop (core/_loop.c) calls a plan through its vectorcall, without Python code.
 *
 * The arrays must be numpy arrays of the layouts the plan was made for (its key): the
 * caller checks that; here only their type is checked.
 *
 * PlanLookup (below): where a fused call's plan is found, by the layouts of its call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h> /* offsetof */
#include <stdint.h>
#include <structmember.h> /* T_INT, T_OBJECT_EX, READONLY */

#define MAX_ARGV 64

typedef void (*kernel_fn)(void **);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    kernel_fn fn;
    int gil;
    Py_ssize_t nargv, nslots;
    void *argv[MAX_ARGV];
    Py_ssize_t slots[MAX_ARGV]; /* per call argument: its place in argv (-1: not passed) */
    PyObject *keep, *entry, *note, *out_shape, *out_dtype, *out_strides;
} KernelCall;

static PyObject *k_ndarray, *k_timeline, *k_now, *s_enabled, *s_hits;
static Py_ssize_t data_offset = sizeof(PyObject); /* PyArrayObject's ``data`` */

#define DATA(a) (*(void **)((char *)(a) + data_offset))

/* timeline.enabled (from the module's dict): 1, 0, -1 with an error */
static int timeline_enabled(void) {
    PyObject *e = PyModule_CheckExact(k_timeline)
                  ? PyDict_GetItemWithError(PyModule_GetDict(k_timeline), s_enabled) : NULL;
    if (e != NULL) return e == Py_True;
    if (PyErr_Occurred()) return -1;
    if ((e = PyObject_GetAttr(k_timeline, s_enabled)) == NULL) return -1;
    int on = e == Py_True;
    Py_DECREF(e);
    return on;
}

static PyObject *kc_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    KernelCall *self = (KernelCall *)op;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "[KernelCall] takes its arrays positionally");
        return NULL;
    }
    if (n != self->nslots) {
        PyErr_Format(PyExc_TypeError, "[KernelCall] takes %zd arrays (its inputs and output), got %zd",
                     self->nslots, n);
        return NULL;
    }
    if (k_ndarray == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "[KernelCall] not configured");
        return NULL;
    }
    void *argv[MAX_ARGV];
    memcpy(argv, self->argv, sizeof(void *) * self->nargv);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(args[i], (PyTypeObject *)k_ndarray)) {
            PyErr_Format(PyExc_TypeError, "[KernelCall] takes numpy arrays, got %s",
                         Py_TYPE(args[i])->tp_name);
            return NULL;
        }
        if (self->slots[i] >= 0) argv[self->slots[i]] = DATA(args[i]);
    }
    int recording = timeline_enabled();
    if (recording < 0) return NULL;
    PyObject *t0 = NULL;
    if (recording && (t0 = PyObject_CallNoArgs(k_now)) == NULL) return NULL;
    if (self->gil) {
        self->fn(argv);
    } else {
        Py_BEGIN_ALLOW_THREADS
        self->fn(argv);
        Py_END_ALLOW_THREADS
    }
    if (self->entry != Py_None) { /* entry.hits += 1 */
        PyObject *h = PyObject_GetAttr(self->entry, s_hits);
        PyObject *one = h ? PyLong_FromLong(1) : NULL;
        PyObject *h1 = one ? PyNumber_Add(h, one) : NULL;
        Py_XDECREF(h); Py_XDECREF(one);
        int bad = h1 == NULL || PyObject_SetAttr(self->entry, s_hits, h1) < 0;
        Py_XDECREF(h1);
        if (bad) { Py_XDECREF(t0); return NULL; }
    }
    if (recording) {
        PyObject *t1 = PyObject_CallNoArgs(k_now), *arrays = NULL, *r = NULL;
        if (t1 != NULL && (arrays = PyTuple_New(n)) != NULL) {
            for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(arrays, i, Py_NewRef(args[i]));
            r = PyObject_CallFunctionObjArgs(self->note, t0, t1, arrays, NULL);
        }
        Py_XDECREF(t1);
        Py_XDECREF(arrays);
        Py_DECREF(t0);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static int kc_init(KernelCall *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fn", "gil", "argv", "slots", "keep", "entry", "note",
                            "out_shape", "out_dtype", "out_strides", NULL};
    PyObject *fn, *argv, *slots, *keep, *entry, *note, *out_shape, *out_dtype,
        *out_strides = Py_None;
    int gil;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OpO!O!OOOO!O|O:KernelCall", names, &fn, &gil,
                                     &PyTuple_Type, &argv, &PyTuple_Type, &slots, &keep,
                                     &entry, &note, &PyTuple_Type, &out_shape, &out_dtype,
                                     &out_strides))
        return -1;
    Py_ssize_t na = PyTuple_GET_SIZE(argv), ns = PyTuple_GET_SIZE(slots);
    if (na > MAX_ARGV || ns > MAX_ARGV) {
        PyErr_Format(PyExc_ValueError, "[KernelCall] at most %d arguments", MAX_ARGV);
        return -1;
    }
    void *f = PyLong_AsVoidPtr(fn);
    if (f == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "[KernelCall] a null function");
        return -1;
    }
    for (Py_ssize_t i = 0; i < na; i++) {
        PyObject *v = PyTuple_GET_ITEM(argv, i);
        long long x = PyLong_AsLongLong(v); /* an integer, or a pointer as ctypes stores it */
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
            x = (long long)u;
        }
        self->argv[i] = (void *)(intptr_t)x;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, i));
        if (s == -1 && PyErr_Occurred()) return -1;
        if (s < -1 || s >= na) {
            PyErr_Format(PyExc_ValueError, "[KernelCall] slot %zd outside the %zd arguments", s, na);
            return -1;
        }
        self->slots[i] = s;
    }
    self->fn = (kernel_fn)f;
    self->gil = gil;
    self->nargv = na;
    self->nslots = ns;
    Py_XSETREF(self->keep, Py_NewRef(keep));
    Py_XSETREF(self->entry, Py_NewRef(entry));
    Py_XSETREF(self->note, Py_NewRef(note));
    Py_XSETREF(self->out_shape, Py_NewRef(out_shape));
    Py_XSETREF(self->out_dtype, Py_NewRef(out_dtype));
    Py_XSETREF(self->out_strides, Py_NewRef(out_strides));
    self->vectorcall = kc_vectorcall;
    return 0;
}

static PyObject *kc_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    KernelCall *self = (KernelCall *)type->tp_alloc(type, 0);
    if (self != NULL) self->vectorcall = kc_vectorcall;
    return (PyObject *)self;
}

static int kc_traverse(KernelCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->keep); Py_VISIT(self->entry); Py_VISIT(self->note);
    Py_VISIT(self->out_shape); Py_VISIT(self->out_dtype); Py_VISIT(self->out_strides);
    return 0;
}

static int kc_clear(KernelCall *self) {
    Py_CLEAR(self->keep); Py_CLEAR(self->entry); Py_CLEAR(self->note);
    Py_CLEAR(self->out_shape); Py_CLEAR(self->out_dtype); Py_CLEAR(self->out_strides);
    return 0;
}

static void kc_dealloc(KernelCall *self) {
    PyObject_GC_UnTrack(self);
    kc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *kc_call(PyObject *self, PyObject *args, PyObject *kwds) {
    return PyVectorcall_Call(self, args, kwds);
}

static PyMemberDef kc_members[] = {
    {"gil", T_INT, offsetof(KernelCall, gil), READONLY, "runs holding the GIL (a small call)"},
    {"keep", T_OBJECT_EX, offsetof(KernelCall, keep), READONLY, "what the arguments point into"},
    {"entry", T_OBJECT_EX, offsetof(KernelCall, entry), READONLY, "the kernel's cache entry"},
    {"note", T_OBJECT_EX, offsetof(KernelCall, note), READONLY, "note(t0, t1, arrays): the launch record"},
    {"out_shape", T_OBJECT_EX, offsetof(KernelCall, out_shape), READONLY, "the output's shape"},
    {"out_dtype", T_OBJECT_EX, offsetof(KernelCall, out_dtype), READONLY, "the output's dtype"},
    {"out_strides", T_OBJECT_EX, offsetof(KernelCall, out_strides), READONLY,
     "the output's byte strides (None: row-contiguous)"},
    {NULL}};

static PyTypeObject KernelCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._kernel_call.KernelCall",
    .tp_basicsize = sizeof(KernelCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "KernelCall(fn, gil, argv, slots, keep, entry, note, out_shape, out_dtype, "
              "out_strides=None): one "
              "generated kernel's call for one layout; plan(*arrays, out) runs it.",
    .tp_new = kc_new,
    .tp_init = (initproc)kc_init,
    .tp_dealloc = (destructor)kc_dealloc,
    .tp_traverse = (traverseproc)kc_traverse,
    .tp_clear = (inquiry)kc_clear,
    .tp_call = kc_call,
    .tp_vectorcall_offset = offsetof(KernelCall, vectorcall),
    .tp_members = kc_members,
};

/* -- PlanLookup: a fused call's launch plan for its layouts ---------------------------------
 *
 * ``lookup(tape, inputs, shape)``: the launch plan a backend made for a fused tape's call
 * with these layouts, ``tape.launches[(*tag, shape, *((a.shape, a.strides) of each
 * non-constant input a))]`` (the non-constant inputs' positions under
 * ``tape.launches[tag]``; no tag in the key when ``tag`` is None), or None: no plan made
 * yet, a plan of an older kernel cache (its ``gen`` not ``generation[0]``), or an input of
 * the ``refused`` type. kernel_call.py's PyPlanLookup is the same in Python. The eval loop
 * asks a backend's ``compiled_launch`` (one of these) before every fused call. */
/* A hit remembered per tape (a direct-mapped table by its ``launches`` dict): the dict at
 * that version (a dict's version tag changes at every change, and no two dicts share one, so
 * the plan found is still its value), the generation then, the call's shape and its inputs'
 * layouts as read from their numpy structs. A call with the same dict version, generation
 * and layouts is that plan without building the key (its shape / strides tuples and their
 * hash). Python 3.11's dicts have the tag; elsewhere every call builds the key. */
#if PY_VERSION_HEX < 0x030C0000
#define PL_MEMO 64 /* slots per lookup: a training step's fused calls (a dozen or two) each keep one */
#else
#define PL_MEMO 0
#endif
#define PL_INTS 96

typedef struct {
    PyObject *launches, *result; /* borrowed: identity, and its value at ``version`` */
    uint64_t version;
    long long gen;
    Py_ssize_t n, nints;    /* the non-constant inputs; the ints in ``ints`` */
    Py_ssize_t pos[16];     /* their positions in the inputs */
    Py_ssize_t ints[PL_INTS]; /* the shape's length and dims; per input nd, dims, strides */
} Memo;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *tag, *generation, *refused;
#if PL_MEMO
    Memo memo[PL_MEMO];
#endif
} PlanLookup;

static PyObject *s_launches, *s_gen, *s_shape, *s_strides;
static int memo_on = 0; /* numpy's struct read as numpy reads it (checked by kernel_call.py) */

/* PyArrayObject's head (numpy/ndarraytypes.h PyArrayObject_fields) */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions, *strides;
} ArrayHead;

#if PL_MEMO
static Memo *memo_slot(PlanLookup *self, PyObject *launches) {
    /* (Fibonacci hashing of the dict's address: its low bits are the allocator's alignment) */
    return &self->memo[(((uint64_t)(uintptr_t)launches * 0x9E3779B97F4A7C15ull) >> 32) % PL_MEMO];
}

/* the call's ints as a memo holds them into ``out`` (at most PL_INTS); -1: not memoable */
static Py_ssize_t layout_ints(PyObject *seq, const Py_ssize_t *pos, Py_ssize_t n,
                              PyObject *shape, Py_ssize_t *out) {
    if (!PyTuple_Check(shape)) return -1;
    Py_ssize_t k = 0, ns = PyTuple_GET_SIZE(shape);
    if (ns + 1 > PL_INTS) return -1;
    out[k++] = ns;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *d = PyTuple_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(d)) return -1;
        Py_ssize_t v = PyLong_AsSsize_t(d);
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
        out[k++] = v;
    }
    Py_ssize_t len = PyList_Check(seq) ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
    PyObject **items = PyList_Check(seq) ? ((PyListObject *)seq)->ob_item : ((PyTupleObject *)seq)->ob_item;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (pos[j] < 0 || pos[j] >= len) return -1;
        PyObject *a = items[pos[j]];
        if ((PyObject *)Py_TYPE(a) != k_ndarray) return -1;
        ArrayHead *h = (ArrayHead *)a;
        if (h->nd < 0 || k + 1 + 2 * h->nd > PL_INTS) return -1;
        out[k++] = h->nd;
        for (int d = 0; d < h->nd; d++) out[k++] = h->dimensions[d];
        for (int d = 0; d < h->nd; d++) out[k++] = h->strides[d];
    }
    return k;
}
#endif

static PyObject *pl_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    PlanLookup *self = (PlanLookup *)op;
    if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "[PlanLookup] takes (tape, inputs, shape)");
        return NULL;
    }
    PyObject *launches = PyObject_GetAttr(args[0], s_launches), *result = NULL, *key = NULL,
             *seq = NULL;
    if (launches == NULL) return NULL;
    if (!PyDict_Check(launches)) {
        PyErr_SetString(PyExc_TypeError, "[PlanLookup] a tape's launches are a dict");
        goto done;
    }
#if PL_MEMO
    PyObject *now0 = PyList_Check(self->generation) && PyList_GET_SIZE(self->generation)
                     ? PyList_GET_ITEM(self->generation, 0) : NULL;
    long long gen_now = now0 && PyLong_CheckExact(now0) ? PyLong_AsLongLong(now0) : -1;
    if (gen_now == -1) PyErr_Clear();
    int memoable = memo_on && gen_now != -1 && self->refused != k_ndarray &&
                   (PyList_Check(args[1]) || PyTuple_Check(args[1]));
    Memo *slot = memoable ? memo_slot(self, launches) : NULL;
    Py_ssize_t ints[PL_INTS];
    if (slot != NULL && slot->launches == launches &&
        slot->version == ((PyDictObject *)launches)->ma_version_tag && slot->gen == gen_now) {
        Py_ssize_t k = layout_ints(args[1], slot->pos, slot->n, args[2], ints);
        if (k == slot->nints && memcmp(ints, slot->ints, k * sizeof(Py_ssize_t)) == 0) {
            Py_DECREF(launches);
            return Py_NewRef(slot->result);
        }
    }
#endif
    PyObject *arrays = PyDict_GetItemWithError(launches, self->tag);
    if (arrays == NULL || !PyTuple_Check(arrays)) {
        if (!PyErr_Occurred()) result = Py_NewRef(Py_None); /* (no call planned yet) */
        goto done;
    }
    if (!(seq = PySequence_Fast(args[1], "[PlanLookup] the inputs are a sequence"))) goto done;
    Py_ssize_t m = PyTuple_GET_SIZE(arrays), n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t lead = self->tag != Py_None;
    for (Py_ssize_t j = 0; j < m && self->refused != Py_None; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(arrays, j));
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= n) { PyErr_SetString(PyExc_IndexError, "list index out of range"); goto done; }
        if ((PyObject *)Py_TYPE(PySequence_Fast_GET_ITEM(seq, i)) == self->refused) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    if (!(key = PyTuple_New(lead + 1 + m))) goto done;
    if (lead) PyTuple_SET_ITEM(key, 0, Py_NewRef(self->tag));
    PyTuple_SET_ITEM(key, lead, Py_NewRef(args[2]));
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(arrays, j));
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= n) { PyErr_SetString(PyExc_IndexError, "list index out of range"); goto done; }
        PyObject *a = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *sh = PyObject_GetAttr(a, s_shape);
        PyObject *st = sh ? PyObject_GetAttr(a, s_strides) : NULL;
        PyObject *pair = st ? PyTuple_Pack(2, sh, st) : NULL;
        Py_XDECREF(sh); Py_XDECREF(st);
        if (pair == NULL) goto done;
        PyTuple_SET_ITEM(key, lead + 1 + j, pair);
    }
    PyObject *ln = PyDict_GetItemWithError(launches, key);
    if (ln == NULL || ln == Py_None) {
        if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
        goto done;
    }
    Py_INCREF(ln);
    PyObject *gen = PyObject_GetAttr(ln, s_gen);
    PyObject *now = PyList_Check(self->generation) && PyList_GET_SIZE(self->generation)
                    ? PyList_GET_ITEM(self->generation, 0) : NULL;
    int same = gen != NULL && now != NULL ? PyObject_RichCompareBool(gen, now, Py_EQ) : -1;
    Py_XDECREF(gen);
    if (same < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "[PlanLookup] generation is [int]");
        Py_DECREF(ln);
        goto done;
    }
    if (same) result = ln;
    else { Py_DECREF(ln); result = Py_NewRef(Py_None); }
#if PL_MEMO
    if (same && slot != NULL && m <= 16) { /* remembered for the next call of this tape */
        for (Py_ssize_t j = 0; j < m; j++) slot->pos[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(arrays, j));
        Py_ssize_t k = layout_ints(args[1], slot->pos, m, args[2], slot->ints);
        if (k >= 0) {
            slot->launches = launches;
            slot->version = ((PyDictObject *)launches)->ma_version_tag;
            slot->result = ln;
            slot->gen = gen_now;
            slot->n = m;
            slot->nints = k;
        } else {
            slot->launches = NULL;
        }
    }
#endif
done:
    Py_DECREF(launches);
    Py_XDECREF(key);
    Py_XDECREF(seq);
    return result;
}

static int pl_init(PlanLookup *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"tag", "generation", "refused", NULL};
    PyObject *tag, *generation, *refused = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!|O:PlanLookup", names, &tag, &PyList_Type,
                                     &generation, &refused))
        return -1;
    if (PyObject_Hash(tag) == -1) return -1;
    Py_XSETREF(self->tag, Py_NewRef(tag));
    Py_XSETREF(self->generation, Py_NewRef(generation));
    Py_XSETREF(self->refused, Py_NewRef(refused));
    self->vectorcall = pl_vectorcall;
    return 0;
}

static PyObject *pl_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PlanLookup *self = (PlanLookup *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->vectorcall = pl_vectorcall;
        self->tag = Py_NewRef(Py_None);
        self->generation = PyList_New(0);
        self->refused = Py_NewRef(Py_None);
        if (self->generation == NULL) { Py_DECREF(self); return NULL; }
    }
    return (PyObject *)self;
}

static int pl_traverse(PlanLookup *self, visitproc visit, void *arg) {
    Py_VISIT(self->tag); Py_VISIT(self->generation); Py_VISIT(self->refused);
    return 0;
}

static int pl_clear(PlanLookup *self) {
    Py_CLEAR(self->tag); Py_CLEAR(self->generation); Py_CLEAR(self->refused);
    return 0;
}

static void pl_dealloc(PlanLookup *self) {
    PyObject_GC_UnTrack(self);
    pl_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef pl_members[] = {
    {"tag", T_OBJECT_EX, offsetof(PlanLookup, tag), READONLY, "the backend's tag in the keys"},
    {"generation", T_OBJECT_EX, offsetof(PlanLookup, generation), READONLY,
     "[the kernel cache's generation]: a plan of another is stale"},
    {"refused", T_OBJECT_EX, offsetof(PlanLookup, refused), READONLY,
     "an input of this type has no plan (None: none refused)"},
    {NULL}};

static PyTypeObject PlanLookupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._kernel_call.PlanLookup",
    .tp_basicsize = sizeof(PlanLookup),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PlanLookup(tag, generation, refused=None): lookup(tape, inputs, shape) is the "
              "launch plan made for a fused call with these layouts, or None.",
    .tp_new = pl_new,
    .tp_init = (initproc)pl_init,
    .tp_dealloc = (destructor)pl_dealloc,
    .tp_traverse = (traverseproc)pl_traverse,
    .tp_clear = (inquiry)pl_clear,
    .tp_call = kc_call,
    .tp_vectorcall_offset = offsetof(PlanLookup, vectorcall),
    .tp_members = pl_members,
};

/* configure(ndarray, timeline): numpy's array type and the timeline module (its
 * ``enabled`` and ``now``) */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *nd, *tl;
    if (!PyArg_ParseTuple(args, "O!O:configure", &PyType_Type, &nd, &tl)) return NULL;
    PyObject *now = PyObject_GetAttrString(tl, "now");
    if (now == NULL) return NULL;
    Py_XSETREF(k_ndarray, Py_NewRef(nd));
    Py_XSETREF(k_timeline, Py_NewRef(tl));
    Py_XSETREF(k_now, now);
    Py_RETURN_NONE;
}

/* layout(a): (shape, strides) as PlanLookup reads them from the numpy struct (checked
 * against a.shape / a.strides before use_layouts(True) lets it remember hits) */
static PyObject *layout(PyObject *self, PyObject *a) {
    if (k_ndarray == NULL || !PyObject_TypeCheck(a, (PyTypeObject *)k_ndarray)) {
        PyErr_SetString(PyExc_TypeError, "layout: a numpy array (after configure)");
        return NULL;
    }
    ArrayHead *h = (ArrayHead *)a;
    PyObject *sh = PyTuple_New(h->nd), *st = PyTuple_New(h->nd);
    if (sh == NULL || st == NULL) { Py_XDECREF(sh); Py_XDECREF(st); return NULL; }
    for (int d = 0; d < h->nd; d++) {
        PyTuple_SET_ITEM(sh, d, PyLong_FromSsize_t(h->dimensions[d]));
        PyTuple_SET_ITEM(st, d, PyLong_FromSsize_t(h->strides[d]));
    }
    return Py_BuildValue("(NN)", sh, st);
}

static PyObject *use_layouts(PyObject *self, PyObject *on) {
    memo_on = PyObject_IsTrue(on) == 1;
    Py_RETURN_NONE;
}

/* data_pointer(a): the data pointer the plans read (checked against a.ctypes.data) */
static PyObject *data_pointer(PyObject *self, PyObject *a) {
    if (k_ndarray == NULL || !PyObject_TypeCheck(a, (PyTypeObject *)k_ndarray)) {
        PyErr_SetString(PyExc_TypeError, "data_pointer: a numpy array (after configure)");
        return NULL;
    }
    return PyLong_FromVoidPtr(DATA(a));
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(ndarray, timeline)"},
    {"data_pointer", data_pointer, METH_O, "the data pointer a plan reads of a numpy array"},
    {"layout", layout, METH_O, "(shape, strides) as PlanLookup reads them of a numpy array"},
    {"use_layouts", use_layouts, METH_O, "let PlanLookup remember hits by their layouts"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel_call",
                                    "KernelCall: a generated kernel's call planned once per layout; PlanLookup",
                                    -1, methods};

PyMODINIT_FUNC PyInit__kernel_call(void) {
    if (PyType_Ready(&KernelCallType) < 0 || PyType_Ready(&PlanLookupType) < 0) return NULL;
    if (!(s_enabled = PyUnicode_InternFromString("enabled")) ||
        !(s_hits = PyUnicode_InternFromString("hits")) ||
        !(s_launches = PyUnicode_InternFromString("launches")) ||
        !(s_gen = PyUnicode_InternFromString("gen")) ||
        !(s_shape = PyUnicode_InternFromString("shape")) ||
        !(s_strides = PyUnicode_InternFromString("strides")))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&KernelCallType);
    if (PyModule_AddObject(m, "KernelCall", (PyObject *)&KernelCallType) < 0) {
        Py_DECREF(&KernelCallType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "PlanLookup", (PyObject *)&PlanLookupType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
