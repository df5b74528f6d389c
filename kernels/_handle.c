/* BufferHandle in C: shared ownership of one in-use buffer (kernels/allocator.py has the
 * same class in Python, used where this extension is not built); and AllocatorBase, the
 * allocator's hot steps in C (below).
 *
 * Arrays and their views hold the same handle; when the last holder lets go, the handle's
 * finalizer gives the buffer back: allocator.free(buffer). The Python class does that in a
 * __del__, a Python frame on every free (~0.3 us of a 16-element GPU call on the H200's
 * host); here it is a C finalizer. As __del__'s ``except Exception: pass`` (interpreter
 * shutdown), an Exception from free is dropped; anything else is reported as unraisable.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include "_view_api.h"
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_LONGLONG T_LONGLONG
#define Py_T_ULONGLONG T_ULONGLONG
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_T_BOOL T_BOOL
#define Py_T_INT T_INT
#define Py_READONLY READONLY
#endif

typedef struct {
    PyObject_HEAD
    PyObject *buffer;
    PyObject *allocator;
    PyObject *weakrefs;
} Handle;

static PyObject *s_free;

static int handle_init(Handle *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"buffer", "allocator", NULL};
    PyObject *buffer, *allocator;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:BufferHandle", names, &buffer, &allocator))
        return -1;
    Py_XSETREF(self->buffer, Py_NewRef(buffer));
    Py_XSETREF(self->allocator, Py_NewRef(allocator));
    return 0;
}

/* the buffer goes back to its allocator (once: the fields are cleared) */
static void handle_finalize(Handle *self) {
    PyObject *allocator = self->allocator, *buffer = self->buffer;
    if (allocator == NULL || buffer == NULL) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* keep an error that is being raised */
    self->allocator = self->buffer = NULL;
    PyObject *r = PyObject_CallMethodOneArg(allocator, s_free, buffer);
    if (r != NULL) Py_DECREF(r);
    else if (PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    else PyErr_WriteUnraisable((PyObject *)self);
    Py_DECREF(allocator);
    Py_DECREF(buffer);
    PyErr_Restore(type, value, tb);
}

/* BufferHandle(buffer, allocator) without the argument parser (the loop makes one per
 * fresh output) */
static int untrack_buffer(PyObject *buf);

static PyObject *handle_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    Handle *h = (Handle *)((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (h == NULL) return NULL;
    if (n == 2 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
        h->buffer = Py_NewRef(args[0]);
        h->allocator = Py_NewRef(args[1]);
        /* a handle of an allocator.Buffer, acyclic (the buffer's raw array and ints; the
         * allocator holds no handle): left out of the cyclic collector, whose young
         * generation an eval's handles would otherwise fill */
        if (untrack_buffer(args[0])) PyObject_GC_UnTrack(h);
        return (PyObject *)h;
    }
    Py_ssize_t k = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *tuple = PyTuple_New(n), *kw = k ? PyDict_New() : NULL;
    int rc = tuple != NULL && (k == 0 || kw != NULL) ? 0 : -1;
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    for (Py_ssize_t i = 0; rc == 0 && i < k; i++)
        rc = PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[n + i]);
    if (rc == 0) rc = handle_init(h, tuple, kw);
    Py_XDECREF(tuple);
    Py_XDECREF(kw);
    if (rc < 0) Py_CLEAR(h);
    return (PyObject *)h;
}

static int handle_traverse(Handle *self, visitproc visit, void *arg) {
    Py_VISIT(self->buffer);
    Py_VISIT(self->allocator);
    return 0;
}

static int handle_clear(Handle *self) {
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->allocator);
    return 0;
}

static void handle_dealloc(Handle *self) {
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) return; /* resurrected */
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef members[] = {
    {"buffer", Py_T_OBJECT_EX, offsetof(Handle, buffer), 0, "the buffer held"},
    {"allocator", Py_T_OBJECT_EX, offsetof(Handle, allocator), 0, "the allocator it goes back to"},
    {NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._handle.BufferHandle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Shared ownership of one in-use buffer: arrays (and their views) hold the same "
              "handle, and the buffer goes back to its allocator when the last holder is gone.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)handle_init,
    .tp_vectorcall = handle_vectorcall,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_finalize = (destructor)handle_finalize,
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_members = members,
    .tp_weaklistoffset = offsetof(Handle, weakrefs),
};


/* -- Lock, BufferCache and AllocatorBase: the allocator's state and hot steps in C ---------
 *
 * kernels/allocator.py's Allocator derives from AllocatorBase and PyAllocator (the Python
 * class, which is the whole allocator where this extension is not built). The state the
 * hot steps touch is C-owned here: the counters ``active`` / ``peak``, ``cache_limit``,
 * ``page_size``, the policy's ``_recycle_if_fits`` / ``_trim_after_malloc`` / ``_round``,
 * the ``cache`` (this file's BufferCache: the size index and the LRU in C) and the
 * ``_lock`` (this file's Lock, reentrant as threading.RLock). Python code reads and sets the
 * same fields (they are members), so the allocator's Python methods (limits, the memory API,
 * a cache miss: PyAllocator._malloc) run over this state unchanged, under the same lock.
 *
 *   malloc(size)  the policy's rounding (``_round``: None keeps the request, as the CPU's);
 *                 under the lock, the cache's reuse (the exact size, else the smallest
 *                 cached size inside the reuse window, its oldest buffer), the counters,
 *                 the trim after a malloc where the policy trims (``_evict``); a miss (or
 *                 size 0) is the Python _malloc, which allocates (and evicts where the
 *                 policy does);
 *   free(buf)     active down, then into the cache by the policy's rule (cache + size <=
 *                 limit, or cache < limit) or released (``_release``);
 *   adopt(owner)  a buffer of the allocator's buffer_type over memory numpy allocated,
 *                 active and peak up.
 *
 * Where the timeline records, the same steps run and the allocator's ``_record`` makes the
 * record the Python method makes. The steps are PyAllocator._malloc / _free / _adopt's and
 * buffer_cache.PyBufferCache's, in the same order (tests/test_allocator_c.py runs random
 * sequences through both and compares the counters, the cache and the records). */

/* -- Lock: a reentrant lock (threading.RLock's acquire / release / with) -------------------- */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner;
    long count;
} Lock;

/* acquire (waiting without the GIL when another thread holds it); -1 with an error */
static int lock_take(Lock *l) {
    unsigned long me = PyThread_get_thread_ident();
    if (l->count > 0 && l->owner == me) {
        l->count++;
        return 0;
    }
    if (!PyThread_acquire_lock(l->lock, NOWAIT_LOCK)) {
        int got;
        Py_BEGIN_ALLOW_THREADS
        got = PyThread_acquire_lock(l->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
        if (!got) { PyErr_SetString(PyExc_RuntimeError, "could not acquire the allocator's lock"); return -1; }
    }
    l->owner = me;
    l->count = 1;
    return 0;
}

static int lock_give(Lock *l) {
    if (l->count == 0 || l->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (--l->count == 0) {
        l->owner = 0;
        PyThread_release_lock(l->lock);
    }
    return 0;
}

static PyObject *lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    Lock *l = (Lock *)type->tp_alloc(type, 0);
    if (l == NULL) return NULL;
    if ((l->lock = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(l);
        return PyErr_NoMemory();
    }
    return (PyObject *)l;
}

static void lock_dealloc(Lock *l) {
    if (l->lock != NULL) {
        if (l->count > 0) PyThread_release_lock(l->lock);
        PyThread_free_lock(l->lock);
    }
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static PyObject *lock_acquire(Lock *l, PyObject *args, PyObject *kwds) {
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", names, &blocking, &timeout))
        return NULL;
    if (!blocking) { /* a try: the owner's reentry, or a free lock */
        unsigned long me = PyThread_get_thread_ident();
        if (l->count > 0 && l->owner == me) { l->count++; Py_RETURN_TRUE; }
        if (!PyThread_acquire_lock(l->lock, NOWAIT_LOCK)) Py_RETURN_FALSE;
        l->owner = me;
        l->count = 1;
        Py_RETURN_TRUE;
    }
    if (timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "the allocator's lock waits without a timeout");
        return NULL;
    }
    if (lock_take(l) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *lock_enter(Lock *l, PyObject *unused) {
    if (lock_take(l) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *lock_release(Lock *l, PyObject *unused) {
    if (lock_give(l) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *lock_exit(Lock *l, PyObject *args) {
    if (lock_give(l) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *lock_is_owned(Lock *l, PyObject *unused) {
    return PyBool_FromLong(l->count > 0 && l->owner == PyThread_get_thread_ident());
}

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "Acquire the lock (reentrant: the owner may acquire it again); True."},
    {"release", (PyCFunction)lock_release, METH_NOARGS, "Release the lock once."},
    {"__enter__", (PyCFunction)lock_enter, METH_NOARGS, "acquire()"},
    {"__exit__", (PyCFunction)lock_exit, METH_VARARGS, "release()"},
    {"_is_owned", (PyCFunction)lock_is_owned, METH_NOARGS, "Whether this thread holds it."},
    {NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._handle.Lock",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The allocator's reentrant lock (threading.RLock's acquire / release / with), "
              "taken by the C steps without a method call.",
    .tp_new = lock_new,
    .tp_dealloc = (destructor)lock_dealloc,
    .tp_methods = lock_methods,
};

/* -- BufferCache: MLX's (mlx/backend/common/buffer_cache.h) with its state in C -------- */

typedef struct Entry {
    PyObject *buf;
    long long size;
    struct Entry *older, *newer; /* the LRU list, oldest first */
    struct Entry *next;          /* the next (newer) cached buffer of the same size */
} Entry;

typedef struct {
    long long size;
    Entry *head, *tail; /* the size's buffers, oldest first */
} Bin;

typedef struct {
    PyObject_HEAD
    long long page_size;
    PyObject *get_size; /* NULL: the buffer's ``size`` */
    PyObject *free_cb;
    Bin *bins; /* the sizes present, ascending (MLX's multimap) */
    Py_ssize_t nbins, cap;
    Entry *oldest, *newest;
    Py_ssize_t count;
    long long pool_size;
    Entry *spare; /* entries to reuse */
} Cache;

static PyTypeObject CacheType;

/* a Buffer's ``raw`` / ``size`` read at their slots (allocator.Buffer's __slots__, also in
 * its subclasses), else by getattr */
static PyTypeObject *buffer_base = NULL;
static Py_ssize_t raw_off = -1, size_off = -1, id_off = -1;
static PyObject *buffer_ids = NULL; /* allocator._ids: the Buffers' ids, in order */

/* an allocator.Buffer itself (not a subclass, which may hold more) is acyclic: its raw
 * array (numpy's, or a device array over its memory) and two ints. Made here, it leaves
 * the cyclic collector (an eval adopts and allocates ~30 a small step; tracked, they set
 * off young collections and were most of the objects that reached the full ones).
 * Returns whether ``buf`` is one (and untracked). */
static int untrack_buffer(PyObject *buf) {
    if (buf == NULL || buffer_base == NULL || Py_TYPE(buf) != buffer_base) return 0;
    if (PyObject_GC_IsTracked(buf)) PyObject_GC_UnTrack(buf);
    return 1;
}

/* ``Buffer(raw, size)`` of the Buffer class itself (a subclass: its own constructor), its
 * __init__'s steps (raw, size, the next id) without its Python frame */
static PyObject *new_buffer(PyObject *type, PyObject *raw, PyObject *size) {
    if ((PyTypeObject *)type != buffer_base || id_off < 0 || buffer_ids == NULL)
        return PyObject_CallFunctionObjArgs(type, raw, size, NULL);
    PyObject *id = PyIter_Next(buffer_ids);
    if (id == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "Buffer ids ran out");
        return NULL;
    }
    PyObject *buf = buffer_base->tp_alloc(buffer_base, 0);
    if (buf == NULL) { Py_DECREF(id); return NULL; }
    *(PyObject **)((char *)buf + raw_off) = Py_NewRef(raw);
    *(PyObject **)((char *)buf + size_off) = Py_NewRef(size);
    *(PyObject **)((char *)buf + id_off) = id;
    return buf;
}

static PyObject *buffer_field(PyObject *buf, Py_ssize_t off, PyObject *name) {
    if (off >= 0 && PyObject_TypeCheck(buf, buffer_base)) {
        PyObject *v = *(PyObject **)((char *)buf + off);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(buf, name);
}

static PyObject *s_size, *s_raw;

/* the first bin whose size is >= size */
static Py_ssize_t bin_search(Cache *c, long long size) {
    Py_ssize_t lo = 0, hi = c->nbins;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (c->bins[mid].size < size) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* the oldest buffer of bin i out of the cache (its reference handed to the caller) */
static PyObject *cache_pop(Cache *c, Py_ssize_t i) {
    Bin *b = &c->bins[i];
    Entry *e = b->head;
    b->head = e->next;
    if (b->head == NULL) { /* the size's last one: the size leaves the index */
        memmove(&c->bins[i], &c->bins[i + 1], (c->nbins - i - 1) * sizeof(Bin));
        c->nbins--;
    }
    if (e->older) e->older->newer = e->newer;
    else c->oldest = e->newer;
    if (e->newer) e->newer->older = e->older;
    else c->newest = e->older;
    c->pool_size -= e->size;
    c->count--;
    PyObject *buf = e->buf;
    e->next = c->spare;
    c->spare = e;
    return buf;
}

/* reuse_from_cache: a cached buffer of at least ``size`` bytes within the reuse window
 * (size <= cached < min(2 size, size + 2 pages)), its oldest; NULL (no error) on a miss */
static PyObject *cache_reuse_c(Cache *c, long long size, long long *real) {
    Py_ssize_t i = bin_search(c, size);
    if (i == c->nbins) return NULL;
    long long cached = c->bins[i].size;
    if (cached != size) {
        long long window = 2 * size < size + 2 * c->page_size ? 2 * size : size + 2 * c->page_size;
        if (cached >= window) return NULL;
    }
    *real = cached;
    return cache_pop(c, i);
}

/* recycle_to_cache with the buffer's size known: it becomes the newest */
static int cache_push(Cache *c, PyObject *buf, long long size) {
    Entry *e = c->spare;
    if (e != NULL) c->spare = e->next;
    else if ((e = PyMem_Malloc(sizeof(Entry))) == NULL) { PyErr_NoMemory(); return -1; }
    Py_ssize_t i = bin_search(c, size);
    if (i == c->nbins || c->bins[i].size != size) { /* a new size: into the sorted index */
        if (c->nbins == c->cap) {
            Py_ssize_t cap = c->cap ? 2 * c->cap : 16;
            Bin *bins = PyMem_Realloc(c->bins, cap * sizeof(Bin));
            if (bins == NULL) { e->next = c->spare; c->spare = e; PyErr_NoMemory(); return -1; }
            c->bins = bins;
            c->cap = cap;
        }
        memmove(&c->bins[i + 1], &c->bins[i], (c->nbins - i) * sizeof(Bin));
        c->nbins++;
        c->bins[i].size = size;
        c->bins[i].head = c->bins[i].tail = NULL;
    }
    Bin *b = &c->bins[i];
    e->buf = Py_NewRef(buf);
    e->size = size;
    e->next = NULL;
    if (b->tail) b->tail->next = e;
    else b->head = e;
    b->tail = e;
    e->newer = NULL;
    e->older = c->newest;
    if (c->newest) c->newest->newer = e;
    else c->oldest = e;
    c->newest = e;
    c->pool_size += size;
    c->count++;
    return 0;
}

/* a buffer's size as the cache counts it: get_size(buf), else buf.size */
static int cache_size_of(Cache *c, PyObject *buf, long long *size) {
    PyObject *v = c->get_size ? PyObject_CallOneArg(c->get_size, buf) : buffer_field(buf, size_off, s_size);
    if (v == NULL) return -1;
    *size = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *size == -1 && PyErr_Occurred() ? -1 : 0;
}

/* clear: every cached buffer freed in the multimap's order (buffer_cache.h's clear:
 * ascending size, oldest first within a size); the count, -1 when a free raised (the cache
 * is empty either way) */
static Py_ssize_t cache_clear_c(Cache *c) {
    Py_ssize_t n = c->count, k = 0;
    PyObject **bufs = n ? PyMem_Malloc(n * sizeof(PyObject *)) : NULL;
    if (n && bufs == NULL) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < c->nbins; i++)
        for (Entry *e = c->bins[i].head, *next; e != NULL; e = next) {
            next = e->next;
            bufs[k++] = e->buf;
            e->next = c->spare;
            c->spare = e;
        }
    c->nbins = 0;
    c->oldest = c->newest = NULL;
    c->count = 0;
    c->pool_size = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!failed) {
            PyObject *r = PyObject_CallOneArg(c->free_cb, bufs[i]);
            if (r == NULL) failed = 1;
            else Py_DECREF(r);
        }
        Py_DECREF(bufs[i]);
    }
    PyMem_Free(bufs);
    return failed ? -1 : k;
}

/* release_cached_buffers: the oldest freed until min_bytes are (all at >= 90% of the pool) */
static Py_ssize_t cache_release_c(Cache *c, long long min_bytes, int all) {
    if (all || (double)min_bytes >= 0.9 * (double)c->pool_size) return cache_clear_c(c);
    long long freed = 0;
    Py_ssize_t n = 0;
    while (c->oldest != NULL && freed < min_bytes) {
        long long size = c->oldest->size; /* the oldest of its size is the oldest overall */
        PyObject *buf = cache_pop(c, bin_search(c, size));
        PyObject *r = PyObject_CallOneArg(c->free_cb, buf);
        Py_DECREF(buf);
        if (r == NULL) return -1;
        Py_DECREF(r);
        freed += size;
        n++;
    }
    return n;
}

static int cache_init(Cache *c, PyObject *args, PyObject *kwds) {
    static char *names[] = {"page_size", "get_size", "free", NULL};
    long long page;
    PyObject *get_size, *free_cb;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LOO:BufferCache", names, &page, &get_size, &free_cb))
        return -1;
    if (c->count) {
        PyErr_SetString(PyExc_RuntimeError, "BufferCache is initialised once");
        return -1;
    }
    c->page_size = page;
    Py_XSETREF(c->get_size, get_size == Py_None ? NULL : Py_NewRef(get_size));
    Py_XSETREF(c->free_cb, Py_NewRef(free_cb));
    return 0;
}

static int cache_traverse(Cache *c, visitproc visit, void *arg) {
    Py_VISIT(c->get_size);
    Py_VISIT(c->free_cb);
    for (Entry *e = c->oldest; e != NULL; e = e->newer) Py_VISIT(e->buf);
    return 0;
}

static void cache_drop(Cache *c) { /* the buffers let go of without freeing them */
    Entry *e = c->oldest;
    c->oldest = c->newest = NULL;
    c->nbins = 0;
    c->count = 0;
    c->pool_size = 0;
    while (e != NULL) {
        Entry *next = e->newer;
        Py_DECREF(e->buf);
        PyMem_Free(e);
        e = next;
    }
}

static int cache_tp_clear(Cache *c) {
    Py_CLEAR(c->get_size);
    Py_CLEAR(c->free_cb);
    cache_drop(c);
    return 0;
}

static void cache_dealloc(Cache *c) {
    PyObject_GC_UnTrack(c);
    cache_tp_clear(c);
    while (c->spare) {
        Entry *next = c->spare->next;
        PyMem_Free(c->spare);
        c->spare = next;
    }
    PyMem_Free(c->bins);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int ready(Cache *c) {
    if (c->free_cb == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BufferCache is not initialised");
        return 0;
    }
    return 1;
}

static PyObject *cache_m_reuse(Cache *c, PyObject *size) {
    long long n = PyLong_AsLongLong(size), real;
    if (n == -1 && PyErr_Occurred()) return NULL;
    PyObject *buf = cache_reuse_c(c, n, &real);
    return buf ? buf : Py_NewRef(Py_None);
}

static PyObject *cache_m_recycle(Cache *c, PyObject *buf) {
    long long size;
    if (!ready(c) || cache_size_of(c, buf, &size) < 0 || cache_push(c, buf, size) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *cache_m_release(Cache *c, PyObject *nbytes) {
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(nbytes, &overflow);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (!ready(c)) return NULL;
    Py_ssize_t k = overflow < 0 ? 0 : cache_release_c(c, n, overflow > 0);
    return k < 0 ? NULL : PyLong_FromSsize_t(k);
}

static PyObject *cache_m_clear(Cache *c, PyObject *unused) {
    if (!ready(c)) return NULL;
    Py_ssize_t k = cache_clear_c(c);
    return k < 0 ? NULL : PyLong_FromSsize_t(k);
}

static PyObject *cache_m_size(Cache *c, PyObject *unused) { return PyLong_FromLongLong(c->pool_size); }

static PyObject *cache_m_buffers(Cache *c, PyObject *unused) {
    PyObject *out = PyList_New(c->count);
    if (out == NULL) return NULL;
    Py_ssize_t i = 0;
    for (Entry *e = c->oldest; e != NULL; e = e->newer) PyList_SET_ITEM(out, i++, Py_NewRef(e->buf));
    return out;
}

static Py_ssize_t cache_len(Cache *c) { return c->count; }

static PyMethodDef cache_methods[] = {
    {"reuse_from_cache", (PyCFunction)cache_m_reuse, METH_O,
     "The smallest cached buffer of at least ``size`` bytes within the reuse window, or None."},
    {"recycle_to_cache", (PyCFunction)cache_m_recycle, METH_O,
     "Keep ``buf`` for reuse (it becomes the most recently used)."},
    {"release_cached_buffers", (PyCFunction)cache_m_release, METH_O,
     "Free the oldest buffers until ``min_bytes_to_free`` bytes are freed (all of them when "
     "that is at least 90% of the pool); returns how many buffers were freed."},
    {"clear", (PyCFunction)cache_m_clear, METH_NOARGS,
     "Free every cached buffer (ascending size, oldest first within a size); returns how many."},
    {"cache_size", (PyCFunction)cache_m_size, METH_NOARGS, "Bytes held in the cache."},
    {"buffers", (PyCFunction)cache_m_buffers, METH_NOARGS, "The cached buffers, oldest first."},
    {NULL},
};

static PyMemberDef cache_members[] = {
    {"page_size", Py_T_LONGLONG, offsetof(Cache, page_size), Py_READONLY, "the reuse window's page"},
    {"pool_size", Py_T_LONGLONG, offsetof(Cache, pool_size), Py_READONLY, "bytes held in the cache"},
    {NULL},
};

static PySequenceMethods cache_as_seq = {.sq_length = (lenfunc)cache_len};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._handle.BufferCache",
    .tp_basicsize = sizeof(Cache),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "MLX's BufferCache with its size index and LRU in C (buffer_cache.PyBufferCache "
              "is the same cache in Python): BufferCache(page_size, get_size, free).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)cache_init,
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_traverse = (traverseproc)cache_traverse,
    .tp_clear = (inquiry)cache_tp_clear,
    .tp_methods = cache_methods,
    .tp_members = cache_members,
    .tp_as_sequence = &cache_as_seq,
};

/* -- AllocatorBase ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    long long active, peak;
    unsigned long long cache_limit;
    Py_ssize_t page_size;
    char recycle_if_fits, trim_after_malloc;
    PyObject *round; /* None / NULL: a buffer is the request's size (the CPU's policy) */
    Cache *cache;
    Lock *lock;
    /* stream-ordered frees (a device's: cuda/memory.py): while the set ``defer`` is not
     * empty (the device streams whose enqueued work may still run) a freed buffer is held
     * in the list ``held``, counted active, until ``_seal`` (Python) orders the batch after
     * that work by one event per stream; every ``batch`` buffers or ``batch_bytes`` bytes
     * it is called. ``held_batches``: sealed batches not yet given back (Python keeps it) */
    PyObject *defer, *held;
    Py_ssize_t batch, held_batches;
    long long batch_bytes, held_bytes;
    /* ``round_kind``: the policy's rounding done here (ROUND_*), 0: ``round`` called;
     * ``pending``: the sealed batches, a list of (events, buffers) in order of sealing;
     * ``event_source``: None, the Python ``_seal_events`` makes a seal's events; else the
     * device's stream state (seal_events_c), so a seal calls no Python code */
    int round_kind;
    PyObject *pending, *event_source;
} Alloc;

enum { ROUND_CALL = 0, ROUND_EXACT = 1, ROUND_PAGES_ABOVE_ONE = 2, ROUND_CUDA = 3 };

/* allocator.py's _exact / _whole_pages_above_one / _cuda_round (mlx/backend/metal/allocator.cpp,
 * mlx/backend/cuda/allocator.cpp: 8 bytes at most from the scalar pool, under a page the next
 * power of two, else whole pages) */
static long long round_c(int kind, long long size, long long page) {
    if (kind == ROUND_PAGES_ABOVE_ONE) return size > page ? (size + page - 1) / page * page : size;
    if (kind == ROUND_CUDA) {
        if (size <= 8) return 8;
        if (size < page) return 1LL << (64 - __builtin_clzll((unsigned long long)(size - 1)));
        return (size + page - 1) / page * page;
    }
    return size;
}

static PyObject *a_timeline_dict = NULL;
static PyObject *s_enabled, *s__record, *s_buffer_type, *s_nbytes, *s__release, *s__evict,
    *s__malloc, *s_alloc, *s_cache_reuse, *s_free_to_cache, *s_free_name, *s__seal,
    *s__seal_events, *s_done, *s_record, *s__malloc_fresh, *s_acquire, *s_release;

static int call_none(PyObject *r) {
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int recording(void) {
    if (a_timeline_dict == NULL) return 0;
    return PyDict_GetItemWithError(a_timeline_dict, s_enabled) == Py_True;
}

/* self._record(kind, buf, requested) (PyAllocator._record: the timeline's record) */
static int record(PyObject *self, PyObject *kind, PyObject *buf, PyObject *requested) {
    PyObject *args[4] = {self, kind, buf, requested};
    return call_none(PyObject_VectorcallMethod(s__record, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                               NULL));
}

static int alloc_ready(Alloc *a) {
    if (a->cache == NULL || a->lock == NULL || a->cache->free_cb == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the allocator's cache and lock are not set up");
        return 0;
    }
    return 1;
}

/* self._evict(nbytes) (its record where the timeline records) */
static int evict(Alloc *a, long long nbytes) {
    PyObject *n = PyLong_FromLongLong(nbytes);
    int rc = n ? call_none(PyObject_CallMethodOneArg((PyObject *)a, s__evict, n)) : -1;
    Py_XDECREF(n);
    return rc;
}

static void count_active(Alloc *a, long long size) {
    a->active += size;
    if (a->active > a->peak) a->peak = a->active;
}

static int seal_c(Alloc *a);

/* malloc: the policy's rounding (in C for MLX's policies, ``round_kind``; else the
 * ``_round`` callable); under the lock, the cache's reuse (the exact size, else the
 * smallest cached size inside the reuse window, its oldest buffer), the counters, the trim
 * after a malloc where the policy trims (``_evict``). A miss while buffers are held or
 * sealed first seals (``_seal``: those whose work has finished go to the cache) and tries
 * the cache again, as PyAllocator._malloc; a miss after that is ``_malloc_fresh`` (Python:
 * evict at the gc limit, allocate or raise, its record); size 0 (or not an int, or huge)
 * is the Python _malloc. */
static PyObject *alloc_malloc(Alloc *a, PyObject *size) {
    int overflow = 0;
    long long n = PyLong_Check(size) ? PyLong_AsLongLongAndOverflow(size, &overflow) : 0;
    if (n <= 0 || overflow || n > (1LL << 60)) { /* the Python malloc */
        PyErr_Clear();
        return PyObject_CallMethodOneArg((PyObject *)a, s__malloc, size);
    }
    if (!alloc_ready(a)) return NULL;
    PyObject *rsize = NULL;
    if (a->round_kind > ROUND_EXACT) {
        long long r = round_c(a->round_kind, n, a->page_size);
        if (r != n && (rsize = PyLong_FromLongLong(r)) == NULL) return NULL;
        n = r;
    } else if (a->round_kind == ROUND_CALL && a->round != NULL && a->round != Py_None) {
        PyObject *page = PyLong_FromSsize_t(a->page_size);
        rsize = page ? PyObject_CallFunctionObjArgs(a->round, size, page, NULL) : NULL;
        Py_XDECREF(page);
        if (rsize == NULL) return NULL;
        n = PyLong_AsLongLongAndOverflow(rsize, &overflow);
        if (n <= 0 || overflow) {
            PyErr_Clear();
            PyObject *r = PyObject_CallMethodOneArg((PyObject *)a, s__malloc, rsize);
            Py_DECREF(rsize);
            return r;
        }
    }
    Cache *c = a->cache;
    PyObject *buf = NULL;
    for (int sealed = 0;; sealed = 1) {
        if (lock_take(a->lock) < 0) { Py_XDECREF(rsize); return NULL; }
        long long real; /* the buffer's real size: the cached size (its ``size``) */
        buf = cache_reuse_c(c, n, &real);
        int ok = 1;
        if (buf != NULL) { /* active += the real size; peak; the trim */
            count_active(a, real);
            if (a->trim_after_malloc && (unsigned long long)c->pool_size > a->cache_limit)
                ok = evict(a, c->pool_size - (long long)a->cache_limit) == 0;
        }
        if (lock_give(a->lock) < 0) ok = 0;
        if (!ok) { Py_XDECREF(buf); Py_XDECREF(rsize); return NULL; }
        if (buf != NULL || sealed) break;
        int held = a->held != NULL && PyList_Check(a->held) && PyList_GET_SIZE(a->held) > 0;
        if (!held && !a->held_batches) break;
        if (call_none(PyObject_CallMethodNoArgs((PyObject *)a, s__seal)) < 0) {
            Py_XDECREF(rsize);
            return NULL;
        }
    }
    if (buf == NULL) { /* a miss: allocated in Python (its own lock, its record) */
        buf = PyObject_CallMethodOneArg((PyObject *)a, s__malloc_fresh, rsize ? rsize : size);
        untrack_buffer(buf);
    } else if (recording()) {
        PyObject *req = rsize ? Py_NewRef(rsize) : Py_NewRef(size);
        if (record((PyObject *)a, s_cache_reuse, buf, req) < 0) Py_CLEAR(buf);
        Py_DECREF(req);
    }
    Py_XDECREF(rsize);
    return buf;
}

/* the buffer's size; 0: nothing to give back (size 0, or released: raw None); -1 error */
static long long freed_size(PyObject *buf) {
    PyObject *size = buffer_field(buf, size_off, s_size), *raw = size ? buffer_field(buf, raw_off, s_raw) : NULL;
    if (raw == NULL) { Py_XDECREF(size); return -1; }
    long long n = PyLong_Check(size) ? PyLong_AsLongLong(size) : -1;
    int skip = raw == Py_None || n == 0;
    Py_DECREF(raw);
    if (!skip && n < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a buffer's size is a non-negative int");
    Py_DECREF(size);
    if (skip) { PyErr_Clear(); return 0; }
    return n;
}

static PyObject *free_now(Alloc *a, PyObject *buf, long long n);

/* free: held while the device may still read it (``defer`` not empty), else given back;
 * the first free after the device's streams were all seen finished gives back what is
 * held first (``_seal``: no event needed then) */
static PyObject *alloc_free(Alloc *a, PyObject *buf) {
    long long n = freed_size(buf);
    if (n <= 0) { if (n < 0) return NULL; Py_RETURN_NONE; }
    PyObject *d = a->defer;
    if (d != NULL && PyAnySet_Check(d) && a->held != NULL && PyList_CheckExact(a->held)) {
        if (PySet_GET_SIZE(d) > 0) {
            if (PyList_Append(a->held, buf) < 0) return NULL;
            a->held_bytes += n;
            if (PyList_GET_SIZE(a->held) >= a->batch || a->held_bytes >= a->batch_bytes)
                return PyObject_CallMethodNoArgs((PyObject *)a, s__seal);
            Py_RETURN_NONE;
        }
        if ((PyList_GET_SIZE(a->held) || a->held_batches) &&
            call_none(PyObject_CallMethodNoArgs((PyObject *)a, s__seal)) < 0)
            return NULL;
    }
    return free_now(a, buf, n);
}

/* _free_now: the buffer back to the cache (or the system) at once */
static PyObject *alloc_free_now(Alloc *a, PyObject *buf) {
    long long n = freed_size(buf);
    if (n <= 0) { if (n < 0) return NULL; Py_RETURN_NONE; }
    return free_now(a, buf, n);
}

static PyObject *free_now(Alloc *a, PyObject *buf, long long n) {
    if (!alloc_ready(a)) return NULL;
    Cache *c = a->cache;
    if (lock_take(a->lock) < 0) return NULL;
    a->active -= n;
    unsigned long long pool = c->pool_size < 0 ? 0 : (unsigned long long)c->pool_size;
    int keep = a->recycle_if_fits ? pool + (unsigned long long)n <= a->cache_limit
                                  : pool < a->cache_limit;
    int ok = !keep || cache_push(c, buf, n) == 0;
    if (lock_give(a->lock) < 0) ok = 0;
    if (!ok) return NULL;
    if (recording() && record((PyObject *)a, keep ? s_free_to_cache : s_free_name, buf, Py_None) < 0)
        return NULL;
    if (!keep && call_none(PyObject_CallMethodOneArg((PyObject *)a, s__release, buf)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* -- stream-ordered frees: the seal ---------------------------------------------------------
 * PyAllocator._seal / _collect / _seal_events (the reference) in C: the held buffers become
 * one batch ordered after the device work that may still read them (the events of a seal),
 * or go to the cache at once where no stream may still run; then every sealed batch whose
 * events have all completed goes to the cache, oldest first, stopping at the first one
 * still running (events complete in about the order they were recorded). */

/* _free_now(buf) for a buffer of the batch */
static int give_back(Alloc *a, PyObject *buf) {
    long long n = freed_size(buf);
    if (n <= 0) return (int)n;
    return call_none(free_now(a, buf, n));
}

/* -- a seal's events from the device's stream state (cuda/device.py's, in C) -------------
 * ``event_source`` is (unfinished, work, marks, streams, work_lock, new_event): device.py's
 * ``_unfinished`` set, ``_work`` (index -> [generation, running, index]), ``_marks``
 * (index -> (generation, event)), ``_streams`` (index -> CUDA stream), ``_work_lock`` and
 * a callable making an event (recorded by its ``record(stream)``). For each stream that may
 * still run: its covering event (device.covering_event: the mark while no node has left
 * the stream's context since and none runs there, else a new event recorded on the stream
 * and marked); a completed one notes the stream finished (device.note_finished), the others
 * are the seal's. 1 made (*out a new list), 0: a stream without its records (the Python
 * ``_seal_events`` makes them), -1 an error. */
static int seal_events_c(PyObject *src, PyObject **out) {
    if (!PyTuple_CheckExact(src) || PyTuple_GET_SIZE(src) != 6) {
        PyErr_SetString(PyExc_TypeError, "an event source is (unfinished, work, marks, streams, "
                                         "work_lock, new_event)");
        return -1;
    }
    PyObject *unfinished = PyTuple_GET_ITEM(src, 0), *work = PyTuple_GET_ITEM(src, 1),
             *marks = PyTuple_GET_ITEM(src, 2), *streams = PyTuple_GET_ITEM(src, 3),
             *wlock = PyTuple_GET_ITEM(src, 4), *new_event = PyTuple_GET_ITEM(src, 5);
    if (!PyAnySet_Check(unfinished) || !PyDict_Check(work) || !PyDict_Check(marks) ||
        !PyDict_Check(streams)) {
        PyErr_SetString(PyExc_TypeError, "an event source's unfinished a set, work, marks and "
                                         "streams dicts");
        return -1;
    }
    PyObject *indices = PySequence_List(unfinished); /* (list(device.unfinished())) */
    if (indices == NULL) return -1;
    Py_ssize_t k = PyList_GET_SIZE(indices);
    for (Py_ssize_t i = 0; i < k; i++) { /* every stream's records there, else Python */
        PyObject *index = PyList_GET_ITEM(indices, i);
        PyObject *w = PyDict_GetItemWithError(work, index);
        PyObject *st = w ? PyDict_GetItemWithError(streams, index) : NULL;
        if (st == NULL || !PyList_CheckExact(w) || PyList_GET_SIZE(w) != 3) {
            Py_DECREF(indices);
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    PyObject *events = PyList_New(0);
    int rc = events ? 1 : -1;
    for (Py_ssize_t i = 0; rc == 1 && i < k; i++) {
        PyObject *index = PyList_GET_ITEM(indices, i);
        PyObject *w = PyDict_GetItemWithError(work, index); /* (checked above) */
        if (w == NULL || !PyList_CheckExact(w) || PyList_GET_SIZE(w) != 3) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "a stream's work record went");
            rc = -1;
            break;
        }
        PyObject *gen = Py_NewRef(PyList_GET_ITEM(w, 0));
        int running = PyObject_IsTrue(PyList_GET_ITEM(w, 1));
        PyObject *mark = PyDict_GetItemWithError(marks, index), *ev = NULL;
        if (running < 0 || (mark == NULL && PyErr_Occurred())) { rc = -1; Py_DECREF(gen); break; }
        int fresh = mark == NULL || !PyTuple_CheckExact(mark) || PyTuple_GET_SIZE(mark) != 2 ||
                    running;
        if (!fresh) {
            int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(mark, 0), gen, Py_EQ);
            if (eq < 0) { rc = -1; Py_DECREF(gen); break; }
            fresh = !eq;
        }
        if (fresh) { /* a new event recorded on the stream after its work, marked */
            PyObject *st = PyDict_GetItemWithError(streams, index);
            ev = st ? PyObject_CallNoArgs(new_event) : NULL;
            PyObject *r = ev ? PyObject_CallMethodOneArg(ev, s_record, st) : NULL;
            PyObject *m = r ? PyTuple_Pack(2, gen, ev) : NULL;
            Py_XDECREF(r);
            if (m == NULL || PyDict_SetItem(marks, index, m) < 0) rc = -1;
            Py_XDECREF(m);
        } else {
            ev = Py_NewRef(PyTuple_GET_ITEM(mark, 1));
        }
        Py_DECREF(gen);
        PyObject *d = rc == 1 ? PyObject_GetAttr(ev, s_done) : NULL;
        int done = d ? PyObject_IsTrue(d) : -1;
        Py_XDECREF(d);
        if (done < 0) rc = -1;
        else if (!done) rc = PyList_Append(events, ev) < 0 ? -1 : 1;
        else { /* device.note_finished(index, ev), under the work lock */
            PyObject *r = PyObject_CallMethodNoArgs(wlock, s_acquire);
            if (r == NULL) rc = -1;
            Py_XDECREF(r);
            if (rc == 1) {
                PyObject *w2 = PyDict_GetItemWithError(work, index);
                PyObject *m2 = w2 ? PyDict_GetItemWithError(marks, index) : NULL;
                if (m2 != NULL && PyList_CheckExact(w2) && PyList_GET_SIZE(w2) == 3 &&
                    PyTuple_CheckExact(m2) && PyTuple_GET_SIZE(m2) == 2 &&
                    PyTuple_GET_ITEM(m2, 1) == ev) {
                    int idle = PyObject_Not(PyList_GET_ITEM(w2, 1));
                    int same = idle == 1 ? PyObject_RichCompareBool(PyTuple_GET_ITEM(m2, 0),
                                                                    PyList_GET_ITEM(w2, 0), Py_EQ) : 0;
                    if (idle < 0 || same < 0 || (same == 1 && PySet_Discard(unfinished, index) < 0))
                        rc = -1;
                } else if (PyErr_Occurred()) {
                    rc = -1;
                }
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                PyObject *q = PyObject_CallMethodNoArgs(wlock, s_release);
                if (q == NULL) { Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb); rc = -1; }
                else { Py_DECREF(q); PyErr_Restore(type, value, tb); }
            }
        }
        Py_XDECREF(ev);
    }
    Py_DECREF(indices);
    if (rc < 0) { Py_XDECREF(events); return -1; }
    *out = events;
    return 1;
}

/* the events a seal orders its batch after (a new list): the event source's in C, else
 * ``self._seal_events()`` */
static PyObject *seal_events(Alloc *a) {
    PyObject *events = NULL;
    if (a->event_source != NULL && a->event_source != Py_None) {
        int r = seal_events_c(a->event_source, &events);
        if (r != 0) return r > 0 ? events : NULL;
    }
    PyObject *got = PyObject_CallMethodNoArgs((PyObject *)a, s__seal_events);
    if (got == NULL || PyList_CheckExact(got)) return got;
    Py_SETREF(got, PySequence_List(got));
    return got;
}

static int collect_c(Alloc *a);

static int seal_c(Alloc *a) {
    if (!alloc_ready(a)) return -1;
    if (a->pending == NULL || !PyList_Check(a->pending)) {
        PyErr_SetString(PyExc_TypeError, "the allocator's _pending is a list");
        return -1;
    }
    PyObject *held = a->held;
    if (held != NULL && PyList_Check(held) && PyList_GET_SIZE(held) > 0) {
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL) return -1;
        a->held = fresh; /* _take_held: the list is ours now */
        a->held_bytes = 0;
        PyObject *events = seal_events(a);
        int rc = events ? 0 : -1;
        if (rc == 0 && PyList_GET_SIZE(events) > 0) {
            PyObject *batch = PyTuple_Pack(2, events, held);
            if (batch == NULL || lock_take(a->lock) < 0) rc = -1;
            else {
                rc = PyList_Append(a->pending, batch);
                a->held_batches = PyList_GET_SIZE(a->pending);
                if (lock_give(a->lock) < 0) rc = -1;
            }
            Py_XDECREF(batch);
        } else if (rc == 0) { /* no enqueued kernel can still read them */
            for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(held); i++)
                rc = give_back(a, PyList_GET_ITEM(held, i));
        }
        Py_XDECREF(events);
        Py_DECREF(held);
        if (rc < 0) return -1;
    }
    return PyList_GET_SIZE(a->pending) ? collect_c(a) : 0;
}

static int collect_c(Alloc *a) {
    PyObject *done = PyList_New(0);
    if (done == NULL) return -1;
    if (lock_take(a->lock) < 0) { Py_DECREF(done); return -1; }
    int rc = 0;
    while (rc == 0 && PyList_GET_SIZE(a->pending) > 0) {
        /* (held: an event's ``done`` may run a finalizer whose free seals, re-entrantly) */
        PyObject *batch = Py_NewRef(PyList_GET_ITEM(a->pending, 0));
        PyObject *evs = PyTuple_Check(batch) && PyTuple_GET_SIZE(batch) == 2 ?
                        PySequence_Fast(PyTuple_GET_ITEM(batch, 0), "events") : NULL;
        if (evs == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a batch is (events, buffers)");
            Py_DECREF(batch);
            rc = -1;
            break;
        }
        int all = 1;
        for (Py_ssize_t i = 0; all == 1 && i < PySequence_Fast_GET_SIZE(evs); i++) {
            PyObject *d = PyObject_GetAttr(PySequence_Fast_GET_ITEM(evs, i), s_done);
            all = d ? PyObject_IsTrue(d) : -1;
            Py_XDECREF(d);
        }
        Py_DECREF(evs);
        if (all < 0) rc = -1;
        if (all != 1) { Py_DECREF(batch); break; }
        if (PyList_GET_SIZE(a->pending) == 0 || PyList_GET_ITEM(a->pending, 0) != batch) {
            Py_DECREF(batch); /* given back meanwhile: look again */
            continue;
        }
        PyObject *fast = PySequence_Fast(PyTuple_GET_ITEM(batch, 1), "buffers");
        if (fast == NULL) { Py_DECREF(batch); rc = -1; break; }
        for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(fast); i++)
            rc = PyList_Append(done, PySequence_Fast_GET_ITEM(fast, i));
        Py_DECREF(fast);
        if (rc == 0) rc = PySequence_DelItem(a->pending, 0);
        Py_DECREF(batch);
    }
    a->held_batches = PyList_GET_SIZE(a->pending);
    if (lock_give(a->lock) < 0) rc = -1;
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(done); i++)
        rc = give_back(a, PyList_GET_ITEM(done, i));
    Py_DECREF(done);
    return rc;
}

static PyObject *alloc_seal(Alloc *a, PyObject *unused) {
    if (seal_c(a) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *alloc_collect(Alloc *a, PyObject *unused) {
    if (!alloc_ready(a)) return NULL;
    if (a->pending == NULL || !PyList_Check(a->pending)) {
        PyErr_SetString(PyExc_TypeError, "the allocator's _pending is a list");
        return NULL;
    }
    if (collect_c(a) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *alloc_adopt(Alloc *a, PyObject *owner) {
    if (!alloc_ready(a)) return NULL;
    PyObject *bt = PyObject_GetAttr((PyObject *)a, s_buffer_type);
    PyObject *nbytes = bt ? PyObject_GetAttr(owner, s_nbytes) : NULL;
    PyObject *buf = nbytes ? new_buffer(bt, owner, nbytes) : NULL;
    untrack_buffer(buf);
    Py_XDECREF(bt);
    if (buf == NULL || PyObject_IsTrue(nbytes) != 1) { Py_XDECREF(nbytes); return buf; }
    Py_DECREF(nbytes);
    PyObject *bs = buffer_field(buf, size_off, s_size);
    long long n = bs ? PyLong_AsLongLong(bs) : -1;
    Py_XDECREF(bs);
    if (n == -1 && PyErr_Occurred()) { Py_DECREF(buf); return NULL; }
    if (lock_take(a->lock) < 0) { Py_DECREF(buf); return NULL; }
    count_active(a, n);
    if (lock_give(a->lock) < 0 || (recording() && record((PyObject *)a, s_alloc, buf, Py_True) < 0))
        Py_CLEAR(buf); /* adopted */
    return buf;
}

static int alloc_traverse(Alloc *a, visitproc visit, void *arg) {
    Py_VISIT(a->defer);
    Py_VISIT(a->held);
    Py_VISIT(a->pending);
    Py_VISIT(a->event_source);
    Py_VISIT(a->round);
    Py_VISIT(a->cache);
    Py_VISIT(a->lock);
    return 0;
}

static int alloc_clear(Alloc *a) {
    Py_CLEAR(a->defer);
    Py_CLEAR(a->held);
    Py_CLEAR(a->pending);
    Py_CLEAR(a->event_source);
    Py_CLEAR(a->round);
    Py_CLEAR(a->cache);
    Py_CLEAR(a->lock);
    return 0;
}

static void alloc_dealloc(Alloc *a) {
    PyObject_GC_UnTrack(a);
    alloc_clear(a);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyObject *alloc_get_cache(Alloc *a, void *unused) {
    if (a->cache == NULL) { PyErr_SetString(PyExc_AttributeError, "cache"); return NULL; }
    return Py_NewRef(a->cache);
}

static int alloc_set_cache(Alloc *a, PyObject *v, void *unused) {
    if (v == NULL || !Py_IS_TYPE(v, &CacheType)) {
        PyErr_SetString(PyExc_TypeError, "the allocator's cache is a _handle.BufferCache");
        return -1;
    }
    Py_XSETREF(a->cache, (Cache *)Py_NewRef(v));
    return 0;
}

static PyObject *alloc_get_lock(Alloc *a, void *unused) {
    if (a->lock == NULL) { PyErr_SetString(PyExc_AttributeError, "_lock"); return NULL; }
    return Py_NewRef(a->lock);
}

static int alloc_set_lock(Alloc *a, PyObject *v, void *unused) {
    if (v == NULL || !Py_IS_TYPE(v, &LockType)) {
        PyErr_SetString(PyExc_TypeError, "the allocator's lock is a _handle.Lock");
        return -1;
    }
    Py_XSETREF(a->lock, (Lock *)Py_NewRef(v));
    return 0;
}

static PyGetSetDef alloc_getset[] = {
    {"cache", (getter)alloc_get_cache, (setter)alloc_set_cache, "the buffer cache (C)", NULL},
    {"_lock", (getter)alloc_get_lock, (setter)alloc_set_lock, "the allocator's lock (C)", NULL},
    {NULL},
};

static PyMemberDef alloc_members[] = {
    {"active", Py_T_LONGLONG, offsetof(Alloc, active), 0, "bytes in buffers in use"},
    {"peak", Py_T_LONGLONG, offsetof(Alloc, peak), 0, "the most active bytes since the last reset"},
    {"cache_limit", Py_T_ULONGLONG, offsetof(Alloc, cache_limit), 0, "the cache limit in bytes"},
    {"page_size", Py_T_PYSSIZET, offsetof(Alloc, page_size), 0, "the allocator's page"},
    {"_recycle_if_fits", Py_T_BOOL, offsetof(Alloc, recycle_if_fits), 0,
     "free caches a buffer if cache + size <= limit (else: while cache < limit)"},
    {"_trim_after_malloc", Py_T_BOOL, offsetof(Alloc, trim_after_malloc), 0,
     "the cache is cut back to its limit after every malloc"},
    {"_round", Py_T_OBJECT_EX, offsetof(Alloc, round), 0, "the policy's rounding, None: none"},
    {"_defer", Py_T_OBJECT_EX, offsetof(Alloc, defer), 0,
     "a set: while it is not empty frees are held (stream-ordered), None: never"},
    {"_held", Py_T_OBJECT_EX, offsetof(Alloc, held), 0, "the buffers freed and held, a list"},
    {"_batch", Py_T_PYSSIZET, offsetof(Alloc, batch), 0, "held buffers that call _seal"},
    {"_batch_bytes", Py_T_LONGLONG, offsetof(Alloc, batch_bytes), 0, "held bytes that call _seal"},
    {"_held_bytes", Py_T_LONGLONG, offsetof(Alloc, held_bytes), 0, "the held buffers' bytes"},
    {"_held_batches", Py_T_PYSSIZET, offsetof(Alloc, held_batches), 0,
     "sealed batches not given back yet"},
    {"_round_kind", Py_T_INT, offsetof(Alloc, round_kind), 0,
     "the policy's rounding done in C: 1 none, 2 whole pages above one, 3 CUDA's; 0: _round"},
    {"_pending", Py_T_OBJECT_EX, offsetof(Alloc, pending), 0,
     "the sealed batches, a list of (events, buffers), oldest first"},
    {"_event_source", Py_T_OBJECT_EX, offsetof(Alloc, event_source), 0,
     "the device's stream state a seal's events come from in C; None: _seal_events"},
    {NULL},
};

static PyMethodDef alloc_methods[] = {
    {"malloc", (PyCFunction)alloc_malloc, METH_O,
     "A buffer of at least ``size`` bytes, from the cache when one fits."},
    {"free", (PyCFunction)alloc_free, METH_O,
     "Return a buffer: held while the device may read it (``_defer``), else to the cache "
     "when the policy's limit allows, else to the system."},
    {"_free_now", (PyCFunction)alloc_free_now, METH_O,
     "Return a buffer to the cache (or the system) at once."},
    {"adopt", (PyCFunction)alloc_adopt, METH_O,
     "Account for memory numpy allocated by itself (``owner`` owns its data)."},
    {"_seal", (PyCFunction)alloc_seal, METH_NOARGS,
     "The held buffers ordered as one batch after the device work that may read them (or to "
     "the cache at once where none may still run), then the finished batches given back."},
    {"_collect", (PyCFunction)alloc_collect, METH_NOARGS,
     "The sealed batches whose events have completed given back, oldest first."},
    {NULL},
};

static PyTypeObject AllocatorBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._handle.AllocatorBase",
    .tp_basicsize = sizeof(Alloc),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The allocator's hot state (counters, cache limit, the cache, the lock) and its "
              "malloc / free / adopt in C (kernels/_handle.c); the subclass keeps the rest "
              "and the Python _malloc for a cache miss.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)alloc_dealloc,
    .tp_traverse = (traverseproc)alloc_traverse,
    .tp_clear = (inquiry)alloc_clear,
    .tp_methods = alloc_methods,
    .tp_members = alloc_members,
    .tp_getset = alloc_getset,
};

/* -- a buffer's typed view in C -------------------------------------------------------------
 * A device's Buffer subclass registers how its view is made (``view_form``), so the eval
 * loop makes a fresh output's view without the Python ``view`` (kernels/_view_api.h):
 *
 *   "pointer"  array_type(shape, dtype, raw.data): a CuPy array over the buffer's memory
 *              pointer (cuda/memory.py CudaBuffer.view);
 *   "slice"    raw[:nbytes].view(dtype).reshape(shape) (StandInBuffer._device_view);
 *
 * both only for a buffer whose ``raw`` is exactly ``array_type``, 1-d uint8 (the
 * allocator's own memory; adopted memory takes the Python method, which flattens it). A
 * dtype in ``wraps`` (bfloat16, which CuPy has no dtype for) is viewed as its storage
 * dtype and wrapped: ``wrapper(view)``, its slots raw / shape / strides / data filled here
 * as its __init__ fills them. A buffer type with a ``last`` slot keeps its last view as
 * CudaBuffer.view does: (shape, dtype, view), handed out again for the same dtype object
 * and an equal shape. */
#define MAX_FORMS 8
typedef struct {
    PyTypeObject *type;
    int pointer; /* 1 "pointer", 0 "slice" */
    PyObject *array_type, *wraps, *u8;
    Py_ssize_t last_off;
} Form;
static Form forms[MAX_FORMS];
static int nforms = 0;
static PyObject *s_data, *s_ndim, *s_dtype, *s_view, *s_reshape, *s_shape, *s_strides;

static Py_ssize_t object_slot(PyTypeObject *t, const char *name) {
    PyObject *m = PyObject_GetAttrString((PyObject *)t, name);
    Py_ssize_t off = -1;
    if (m != NULL && Py_IS_TYPE(m, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)m)->d_member->type == Py_T_OBJECT_EX)
        off = ((PyMemberDescrObject *)m)->d_member->offset;
    Py_XDECREF(m);
    PyErr_Clear();
    return off;
}

/* wrapper(v) for a wrapper class with the slots raw / shape / strides / data (a BF16Array:
 * its __init__'s fields), made without its __init__'s frame, else by its constructor; the
 * slots' offsets found once per class (the last class asked for is held). Exported through
 * the view API (``wrap``): the eval loop's storage results are made here too. */
static PyObject *wrap_view(PyObject *wrapper, PyObject *v) {
    static PyObject *seen = NULL;
    static Py_ssize_t o[4] = {-1, -1, -1, -1};
    PyTypeObject *t = (PyTypeObject *)wrapper;
    if (wrapper != seen) {
        static const char *const names[4] = {"raw", "shape", "strides", "data"};
        int plain = PyType_Check(wrapper) && t->tp_init != NULL && t->tp_dictoffset == 0;
        for (int i = 0; i < 4; i++) o[i] = plain ? object_slot(t, names[i]) : -1;
        Py_XSETREF(seen, Py_NewRef(wrapper));
    }
    if (o[0] < 0 || o[1] < 0 || o[2] < 0 || o[3] < 0)
        return PyObject_CallOneArg(wrapper, v);
    PyObject *shape = PyObject_GetAttr(v, s_shape);
    PyObject *strides = shape ? PyObject_GetAttr(v, s_strides) : NULL;
    PyObject *data = strides ? PyObject_GetAttr(v, s_data) : NULL;
    PyObject *w = data ? t->tp_alloc(t, 0) : NULL;
    if (w == NULL) { Py_XDECREF(shape); Py_XDECREF(strides); Py_XDECREF(data); return NULL; }
    PyObject *vals[4] = {Py_NewRef(v), shape, strides, data};
    for (int i = 0; i < 4; i++) *(PyObject **)((char *)w + o[i]) = vals[i];
    return w;
}

/* buf's view of nbytes as dtype and shape; NULL with no error: not a registered case */
static PyObject *view_c(PyObject *buf, Py_ssize_t nbytes, PyObject *npdt, PyObject *shape) {
    Form *f = NULL;
    for (int i = 0; i < nforms; i++)
        if (forms[i].type == Py_TYPE(buf)) { f = &forms[i]; break; }
    if (f == NULL || raw_off < 0 || !PyTuple_Check(shape)) return NULL;
    PyObject **lastp = f->last_off >= 0 ? (PyObject **)((char *)buf + f->last_off) : NULL;
    if (lastp != NULL && *lastp != NULL && PyTuple_CheckExact(*lastp) &&
        PyTuple_GET_SIZE(*lastp) == 3 && PyTuple_GET_ITEM(*lastp, 1) == npdt) {
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(*lastp, 0), shape, Py_EQ);
        if (eq < 0) return NULL;
        if (eq) return Py_NewRef(PyTuple_GET_ITEM(*lastp, 2));
    }
    PyObject *raw = *(PyObject **)((char *)buf + raw_off);
    if (raw == NULL || Py_TYPE(raw) != (PyTypeObject *)f->array_type) return NULL;
    PyObject *nd = PyObject_GetAttr(raw, s_ndim);
    PyObject *dt = nd ? PyObject_GetAttr(raw, s_dtype) : NULL;
    int flat = dt != NULL && PyLong_Check(nd) && PyLong_AsLong(nd) == 1 &&
               (dt == f->u8 || PyObject_RichCompareBool(dt, f->u8, Py_EQ) == 1);
    Py_XDECREF(nd); Py_XDECREF(dt);
    if (!flat) { PyErr_Clear(); return NULL; }
    PyObject *w = PyDict_GetItemWithError(f->wraps, npdt), *as = npdt, *wrapper = NULL;
    if (w == NULL && PyErr_Occurred()) return NULL;
    if (w != NULL) {
        if (!PyTuple_Check(w) || PyTuple_GET_SIZE(w) != 2) {
            PyErr_SetString(PyExc_TypeError, "a view form's wrap is (storage dtype, wrapper)");
            return NULL;
        }
        as = PyTuple_GET_ITEM(w, 0), wrapper = PyTuple_GET_ITEM(w, 1);
    }
    PyObject *v;
    if (f->pointer) {
        PyObject *data = PyObject_GetAttr(raw, s_data);
        PyObject *args[3] = {shape, as, data};
        v = data ? PyObject_Vectorcall(f->array_type, args, 3, NULL) : NULL;
        Py_XDECREF(data);
    } else {
        PyObject *end = PyLong_FromSsize_t(nbytes);
        PyObject *sl = end ? PySlice_New(NULL, end, NULL) : NULL;
        PyObject *part = sl ? PyObject_GetItem(raw, sl) : NULL;
        PyObject *typed = part ? PyObject_CallMethodOneArg(part, s_view, as) : NULL;
        v = typed ? PyObject_CallMethodOneArg(typed, s_reshape, shape) : NULL;
        Py_XDECREF(end); Py_XDECREF(sl); Py_XDECREF(part); Py_XDECREF(typed);
    }
    if (v != NULL && wrapper != NULL) Py_SETREF(v, wrap_view(wrapper, v));
    if (v != NULL && lastp != NULL) {
        PyObject *last = PyTuple_Pack(3, shape, npdt, v);
        if (last == NULL) { Py_DECREF(v); return NULL; }
        Py_XSETREF(*lastp, last);
    }
    return v;
}

/* view_form(buffer_type, form, array_type, wraps, uint8): see above */
static PyObject *view_form(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(args[0]) || !PyUnicode_Check(args[1]) ||
        !PyType_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "view_form(buffer type, 'pointer' | 'slice', array "
                                         "type, wraps dict, uint8 dtype)");
        return NULL;
    }
    int pointer = PyUnicode_CompareWithASCIIString(args[1], "pointer") == 0;
    if (!pointer && PyUnicode_CompareWithASCIIString(args[1], "slice") != 0) {
        PyErr_SetString(PyExc_ValueError, "a view form is 'pointer' or 'slice'");
        return NULL;
    }
    if (buffer_base == NULL || !PyType_IsSubtype((PyTypeObject *)args[0], buffer_base)) {
        PyErr_SetString(PyExc_TypeError, "view_form: a subclass of the configured Buffer");
        return NULL;
    }
    Form *f = NULL;
    for (int i = 0; i < nforms; i++)
        if (forms[i].type == (PyTypeObject *)args[0]) f = &forms[i];
    if (f == NULL) {
        if (nforms == MAX_FORMS) { PyErr_SetString(PyExc_RuntimeError, "too many view forms"); return NULL; }
        f = &forms[nforms++];
        f->type = (PyTypeObject *)Py_NewRef(args[0]);
    } else {
        Py_CLEAR(f->array_type); Py_CLEAR(f->wraps); Py_CLEAR(f->u8);
    }
    f->pointer = pointer;
    f->array_type = Py_NewRef(args[2]);
    f->wraps = Py_NewRef(args[3]);
    f->u8 = Py_NewRef(args[4]);
    f->last_off = object_slot(f->type, "last");
    Py_RETURN_NONE;
}

/* the view as a function (the tests compare it with the Python method) */
static PyObject *view_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "view(buffer, nbytes, dtype, shape)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n < 0 && PyErr_Occurred()) return NULL;
    PyObject *v = view_c(args[0], n, args[2], args[3]);
    return v != NULL || PyErr_Occurred() ? v : Py_NewRef(Py_None);
}

static ViewApi view_api = {VIEW_API_ABI, view_c, wrap_view};

/* configure(timeline, Buffer[, ids]): the timeline module (its ``enabled`` flag read from
 * its dict), the Buffer class (its ``raw`` / ``size`` / ``id`` slots' offsets) and the
 * iterator its ids come from (given: adopted Buffers are made here, new_buffer) */
static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3 || !PyModule_Check(args[0]) || !PyType_Check(args[1]) ||
        (nargs == 3 && !PyIter_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "configure(timeline module, Buffer class[, ids])");
        return NULL;
    }
    PyObject *d = PyModule_GetDict(args[0]);
    PyTypeObject *bt = (PyTypeObject *)args[1];
    Py_ssize_t offs[3] = {-1, -1, -1};
    PyObject *id_name = PyUnicode_InternFromString("id");
    if (id_name == NULL) return NULL;
    PyObject *names[3] = {s_raw, s_size, id_name};
    for (int i = 0; i < 3; i++) {
        PyObject *m = PyDict_GetItemWithError(bt->tp_dict, names[i]);
        if (m != NULL && Py_IS_TYPE(m, &PyMemberDescr_Type) &&
            ((PyMemberDescrObject *)m)->d_member->type == Py_T_OBJECT_EX)
            offs[i] = ((PyMemberDescrObject *)m)->d_member->offset;
        else if (PyErr_Occurred()) { Py_DECREF(id_name); return NULL; }
    }
    Py_DECREF(id_name);
    Py_XSETREF(a_timeline_dict, Py_NewRef(d));
    Py_XSETREF(buffer_base, (PyTypeObject *)Py_NewRef(bt));
    raw_off = offs[0] >= 0 && offs[1] >= 0 ? offs[0] : -1;
    size_off = offs[0] >= 0 && offs[1] >= 0 ? offs[1] : -1;
    id_off = raw_off >= 0 ? offs[2] : -1;
    Py_XSETREF(buffer_ids, nargs == 3 ? Py_NewRef(args[2]) : NULL);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "Hand over kernels.timeline and allocator.Buffer."},
    {"view_form", (PyCFunction)(void (*)(void))view_form, METH_FASTCALL,
     "view_form(buffer type, 'pointer' | 'slice', array type, wraps, uint8 dtype): how that "
     "Buffer subclass's views are made in C."},
    {"view", (PyCFunction)(void (*)(void))view_py, METH_FASTCALL,
     "view(buffer, nbytes, dtype, shape): the buffer's view made in C, None where its type "
     "has no view form (or its raw memory is not the form's)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_handle",
                                    "BufferHandle, the allocator's lock, buffer cache and hot "
                                    "steps in C (see _handle.c).", -1, module_methods};

PyMODINIT_FUNC PyInit__handle(void) {
    if ((s_free = PyUnicode_InternFromString("free")) == NULL || PyType_Ready(&HandleType) < 0 ||
        PyType_Ready(&LockType) < 0 || PyType_Ready(&CacheType) < 0 ||
        PyType_Ready(&AllocatorBaseType) < 0)
        return NULL;
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL;
    I(s_size, "size") I(s_raw, "raw") I(s__release, "_release") I(s__evict, "_evict")
    I(s__malloc, "_malloc") I(s_enabled, "enabled") I(s__record, "_record")
    I(s_buffer_type, "buffer_type") I(s_nbytes, "nbytes") I(s_alloc, "alloc")
    I(s_cache_reuse, "cache_reuse") I(s_free_to_cache, "free_to_cache") I(s_free_name, "free")
    I(s__seal, "_seal") I(s__seal_events, "_seal_events") I(s_done, "done") I(s_record, "record")
    I(s__malloc_fresh, "_malloc_fresh") I(s_acquire, "acquire") I(s_release, "release")
    I(s_data, "data") I(s_ndim, "ndim") I(s_dtype, "dtype") I(s_view, "view")
    I(s_reshape, "reshape") I(s_shape, "shape") I(s_strides, "strides")
#undef I
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BufferHandle", (PyObject *)&HandleType) < 0 ||
        PyModule_AddObjectRef(m, "Lock", (PyObject *)&LockType) < 0 ||
        PyModule_AddObjectRef(m, "BufferCache", (PyObject *)&CacheType) < 0 ||
        PyModule_AddObjectRef(m, "AllocatorBase", (PyObject *)&AllocatorBaseType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *cap = PyCapsule_New(&view_api, VIEW_API_NAME, NULL);
    if (cap == NULL || PyModule_AddObjectRef(m, VIEW_API_ATTR, cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(cap);
    return m;
}
