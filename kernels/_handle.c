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
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
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
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_finalize = (destructor)handle_finalize,
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_members = members,
    .tp_weaklistoffset = offsetof(Handle, weakrefs),
};


/* -- AllocatorBase: Allocator.malloc / free / adopt in C ---------------------------------
 *
 * kernels/allocator.py's Allocator derives from this type; its three hot methods are here,
 * over the same Python state (the counters ``active`` / ``peak``, ``cache_limit``, the
 * ``_lock``, the ``cache`` (a BufferCache) and its structures), with the same steps in the
 * same order as the Python methods they stand for (Allocator._malloc / _free / _adopt,
 * which run where this extension is not built):
 *
 *   malloc(size)  the policy's rounding (``_round``); under the lock, the cache's reuse
 *                 (BufferCache.reuse_from_cache: the exact size, else the smallest cached
 *                 size inside the reuse window, its oldest buffer: _take), the counters,
 *                 the trim after a malloc where the policy trims; a miss (or size 0) is
 *                 the Python _malloc, which allocates (and evicts where the policy does);
 *   free(buf)     active down, then into the cache by the policy's rule
 *                 (recycle_to_cache) or released (``_release``);
 *   adopt(owner)  a buffer of the allocator's buffer_type over memory numpy allocated,
 *                 active and peak up.
 *
 * Where the timeline records, the same steps run and the allocator's ``_record`` makes
 * the record the Python method makes. This is the one copy of the buffer cache's hot
 * steps in C (tests/test_lane_cache.py compares cache_take / cache_recycle with
 * BufferCache's methods on random sequences; tests/test_allocator.py runs both paths). */
static PyObject *a_timeline = NULL, *deque_type = NULL;
static PyObject *s_active, *s_peak, *s_cache, *s__lock, *s_cache_limit, *s__round, *s_page_size,
    *s_policy, *s_trim_after_malloc, *s_recycle_if_fits, *s_pool_size, *s__by_size, *s__sizes,
    *s__lru, *s__seq, *s_size, *s_raw, *s__release, *s__evict, *s__malloc, *s_enabled,
    *s__record, *s_buffer_type, *s_nbytes, *s_acquire, *s_release, *s_popleft, *s_append,
    *s_alloc, *s_cache_reuse, *s_free_to_cache, *s_free_name;

static PyObject *get(PyObject *o, PyObject *name) { return PyObject_GetAttr(o, name); }

/* i such that sizes[:i] < size <= sizes[i:] (bisect.bisect_left over a list of ints) */
static Py_ssize_t bisect_left(PyObject *sizes, PyObject *size) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(sizes);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        int lt = PyObject_RichCompareBool(PyList_GET_ITEM(sizes, mid), size, Py_LT);
        if (lt < 0) return -1;
        if (lt) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* obj.attr += sign * v (Python ints) */
static int add_to(PyObject *obj, PyObject *attr, PyObject *v, int sign) {
    PyObject *old = PyObject_GetAttr(obj, attr);
    if (old == NULL) return -1;
    PyObject *nv = sign > 0 ? PyNumber_Add(old, v) : PyNumber_Subtract(old, v);
    Py_DECREF(old);
    if (nv == NULL) return -1;
    int rc = PyObject_SetAttr(obj, attr, nv);
    Py_DECREF(nv);
    return rc;
}

/* BufferCache._take: the oldest cached buffer of exactly ``size`` bytes (which must be
 * cached: KeyError otherwise, nothing changed) */
static PyObject *cache_take(PyObject *cache, PyObject *size) {
    PyObject *by_size = get(cache, s__by_size), *sizes = NULL, *lru = NULL, *item = NULL,
             *buf = NULL, *q = NULL;
    if (by_size == NULL || !PyDict_Check(by_size)) goto done;
    q = Py_XNewRef(PyDict_GetItemWithError(by_size, size));
    if (q == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, size);
        goto done;
    }
    if ((sizes = get(cache, s__sizes)) == NULL || (lru = get(cache, s__lru)) == NULL) goto done;
    if (!PyList_Check(sizes)) { PyErr_SetString(PyExc_TypeError, "_sizes is a list"); goto done; }
    item = PyObject_CallMethodNoArgs(q, s_popleft);
    if (item == NULL) goto done;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        PyErr_SetString(PyExc_TypeError, "a cache entry is (seq, buffer)");
        goto done;
    }
    Py_ssize_t left = PyObject_Length(q);
    int ok = left >= 0;
    if (ok && left == 0) { /* the size's last one: the size leaves the index */
        Py_ssize_t i = bisect_left(sizes, size);
        ok = i >= 0 && PyDict_DelItem(by_size, size) == 0 && PySequence_DelItem(sizes, i) == 0;
    }
    ok = ok && PyObject_DelItem(lru, PyTuple_GET_ITEM(item, 0)) == 0 &&
         add_to(cache, s_pool_size, size, -1) == 0;
    if (ok) buf = Py_NewRef(PyTuple_GET_ITEM(item, 1));
done:
    Py_XDECREF(by_size); Py_XDECREF(sizes); Py_XDECREF(lru); Py_XDECREF(item); Py_XDECREF(q);
    return buf;
}

/* BufferCache.recycle_to_cache with the buffer's ``size`` given (its get_size) */
static int cache_recycle(PyObject *cache, PyObject *buf, PyObject *size) {
    int rc = -1;
    PyObject *by_size = get(cache, s__by_size), *sizes = NULL, *lru = NULL, *seqs = NULL,
             *seq = NULL, *q = NULL, *item = NULL;
    if (by_size == NULL || !PyDict_Check(by_size) || (sizes = get(cache, s__sizes)) == NULL ||
        (lru = get(cache, s__lru)) == NULL || (seqs = get(cache, s__seq)) == NULL)
        goto done;
    if (!PyList_Check(sizes)) { PyErr_SetString(PyExc_TypeError, "_sizes is a list"); goto done; }
    if ((seq = PyIter_Next(seqs)) == NULL) goto done;
    q = Py_XNewRef(PyDict_GetItemWithError(by_size, size));
    if (q == NULL) { /* a new size: its FIFO, and the size into the sorted index */
        if (PyErr_Occurred()) goto done;
        Py_ssize_t i = bisect_left(sizes, size);
        q = i >= 0 ? PyObject_CallNoArgs(deque_type) : NULL;
        if (q == NULL || PyDict_SetItem(by_size, size, q) < 0 || PyList_Insert(sizes, i, size) < 0)
            goto done;
    }
    item = PyTuple_Pack(2, seq, buf);
    PyObject *r = item ? PyObject_CallMethodOneArg(q, s_append, item) : NULL;
    if (r == NULL) goto done;
    Py_DECREF(r);
    if (PyObject_SetItem(lru, seq, size) < 0 || add_to(cache, s_pool_size, size, +1) < 0) goto done;
    rc = 0;
done:
    Py_XDECREF(by_size); Py_XDECREF(sizes); Py_XDECREF(lru); Py_XDECREF(seqs); Py_XDECREF(seq);
    Py_XDECREF(q); Py_XDECREF(item);
    return rc;
}

/* BufferCache.reuse_from_cache (the lock held): a buffer, or None on a miss (new refs) */
static PyObject *cache_reuse(PyObject *cache, PyObject *size) {
    PyObject *by_size = get(cache, s__by_size), *sizes = NULL, *page = NULL, *r = NULL;
    if (by_size == NULL || !PyDict_Check(by_size)) goto done;
    int has = PyDict_Contains(by_size, size);
    if (has < 0) goto done;
    if (has) { r = cache_take(cache, size); goto done; }
    if ((sizes = get(cache, s__sizes)) == NULL || !PyList_Check(sizes)) goto done;
    Py_ssize_t i = bisect_left(sizes, size);
    if (i < 0) goto done;
    if (i == PyList_GET_SIZE(sizes)) { r = Py_NewRef(Py_None); goto done; }
    PyObject *cached = PyList_GET_ITEM(sizes, i); /* cached >= min(2 size, size + 2 page) */
    long long c = PyLong_AsLongLong(cached), n = PyLong_AsLongLong(size);
    if ((page = get(cache, s_page_size)) == NULL) goto done;
    long long pg = PyLong_AsLongLong(page);
    if (PyErr_Occurred()) goto done;
    long long window = 2 * n < n + 2 * pg ? 2 * n : n + 2 * pg;
    r = c >= window ? Py_NewRef(Py_None) : cache_take(cache, cached);
done:
    Py_XDECREF(by_size); Py_XDECREF(sizes); Py_XDECREF(page);
    return r;
}

static int call_none(PyObject *r) {
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int recording(void) {
    if (a_timeline == NULL) return 0;
    PyObject *e = get(a_timeline, s_enabled);
    int on = e == Py_True;
    Py_XDECREF(e);
    PyErr_Clear();
    return on;
}

/* self._record(kind, buf, requested) (Allocator._record: the timeline's record) */
static int record(PyObject *self, PyObject *kind, PyObject *buf, PyObject *requested) {
    PyObject *args[4] = {self, kind, buf, requested};
    return call_none(PyObject_VectorcallMethod(s__record, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                               NULL));
}

static PyObject *alloc_malloc(PyObject *self, PyObject *size) {
    long long n = PyLong_Check(size) ? PyLong_AsLongLong(size) : 0;
    if (n <= 0) { /* size 0 (or not an int, or huge): the Python malloc */
        PyErr_Clear();
        return PyObject_CallMethodOneArg(self, s__malloc, size);
    }
    PyObject *round = get(self, s__round), *buf = NULL, *lock = NULL, *cache = NULL;
    if (round == NULL) return NULL;
    Py_INCREF(size);
    if (round != Py_None) { /* the policy's rounding */
        PyObject *page = get(self, s_page_size);
        PyObject *r = page ? PyObject_CallFunctionObjArgs(round, size, page, NULL) : NULL;
        Py_XDECREF(page);
        Py_DECREF(size);
        size = r;
    }
    Py_DECREF(round);
    if (size == NULL) return NULL;
    if ((lock = get(self, s__lock)) == NULL || (cache = get(self, s_cache)) == NULL) goto done;
    if (call_none(PyObject_CallMethodNoArgs(lock, s_acquire)) < 0) goto done;
    buf = cache_reuse(cache, size);
    if (buf != NULL && buf != Py_None) { /* active += the real size; peak; the trim */
        PyObject *bsize = get(buf, s_size);
        int ok = bsize != NULL && add_to(self, s_active, bsize, +1) == 0;
        Py_XDECREF(bsize);
        PyObject *active = ok ? get(self, s_active) : NULL, *peak = active ? get(self, s_peak) : NULL;
        if (peak != NULL) {
            int more = PyObject_RichCompareBool(active, peak, Py_GT);
            ok = more >= 0 && (!more || PyObject_SetAttr(self, s_peak, active) == 0);
        } else {
            ok = 0;
        }
        Py_XDECREF(active); Py_XDECREF(peak);
        PyObject *policy = ok ? get(self, s_policy) : NULL;
        PyObject *trim = policy ? get(policy, s_trim_after_malloc) : NULL;
        Py_XDECREF(policy);
        if (trim == NULL) ok = 0;
        else if (trim == Py_True) {
            PyObject *pool = get(cache, s_pool_size);
            PyObject *limit = pool ? get(self, s_cache_limit) : NULL;
            int over = limit ? PyObject_RichCompareBool(pool, limit, Py_GT) : -1;
            if (over < 0) ok = 0;
            else if (over) {
                PyObject *excess = PyNumber_Subtract(pool, limit);
                ok = excess && call_none(PyObject_CallMethodOneArg(self, s__evict, excess)) == 0;
                Py_XDECREF(excess);
            }
            Py_XDECREF(pool); Py_XDECREF(limit);
        }
        Py_XDECREF(trim);
        if (!ok) Py_CLEAR(buf);
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int unlocked = call_none(PyObject_CallMethodNoArgs(lock, s_release));
    if (type != NULL) { PyErr_Restore(type, value, tb); Py_CLEAR(buf); }
    else if (unlocked < 0) Py_CLEAR(buf);
    if (buf == Py_None) { /* a miss: the Python malloc allocates (its own lock, its record) */
        Py_DECREF(buf);
        buf = PyObject_CallMethodOneArg(self, s__malloc, size);
    } else if (buf != NULL && recording() && record(self, s_cache_reuse, buf, size) < 0) {
        Py_CLEAR(buf);
    }
done:
    Py_DECREF(size); Py_XDECREF(lock); Py_XDECREF(cache);
    return buf;
}

static PyObject *alloc_free(PyObject *self, PyObject *buf) {
    PyObject *size = get(buf, s_size), *raw = size ? get(buf, s_raw) : NULL;
    PyObject *lock = NULL, *cache = NULL, *result = NULL;
    int keep = -1, locked = 0;
    if (raw == NULL) goto done;
    if (raw == Py_None || PyObject_IsTrue(size) != 1) { /* size 0 or released: nothing */
        PyErr_Clear();
        result = Py_NewRef(Py_None);
        goto done;
    }
    if ((lock = get(self, s__lock)) == NULL || (cache = get(self, s_cache)) == NULL) goto done;
    if (call_none(PyObject_CallMethodNoArgs(lock, s_acquire)) < 0) goto done;
    locked = 1;
    if (add_to(self, s_active, size, -1) < 0) goto done;
    PyObject *pool = get(cache, s_pool_size), *limit = pool ? get(self, s_cache_limit) : NULL;
    PyObject *policy = limit ? get(self, s_policy) : NULL;
    PyObject *fits = policy ? get(policy, s_recycle_if_fits) : NULL;
    if (fits == Py_True) { /* cached + size <= limit */
        PyObject *sum = PyNumber_Add(pool, size);
        keep = sum ? PyObject_RichCompareBool(sum, limit, Py_LE) : -1;
        Py_XDECREF(sum);
    } else if (fits != NULL) { /* cached < limit */
        keep = PyObject_RichCompareBool(pool, limit, Py_LT);
    }
    Py_XDECREF(pool); Py_XDECREF(limit); Py_XDECREF(policy); Py_XDECREF(fits);
    if (keep < 0 || (keep == 1 && cache_recycle(cache, buf, size) < 0)) goto done;
    locked = 0;
    if (call_none(PyObject_CallMethodNoArgs(lock, s_release)) < 0) goto done;
    if (recording() && record(self, keep ? s_free_to_cache : s_free_name, buf, Py_None) < 0)
        goto done;
    if (!keep && call_none(PyObject_CallMethodOneArg(self, s__release, buf)) < 0) goto done;
    result = Py_NewRef(Py_None);
done:
    if (locked) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (call_none(PyObject_CallMethodNoArgs(lock, s_release)) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(size); Py_XDECREF(raw); Py_XDECREF(lock); Py_XDECREF(cache);
    return result;
}

static PyObject *alloc_adopt(PyObject *self, PyObject *owner) {
    PyObject *bt = get(self, s_buffer_type), *nbytes = bt ? get(owner, s_nbytes) : NULL;
    PyObject *buf = nbytes ? PyObject_CallFunctionObjArgs(bt, owner, nbytes, NULL) : NULL;
    Py_XDECREF(bt);
    if (buf == NULL || PyObject_IsTrue(nbytes) != 1) { Py_XDECREF(nbytes); return buf; }
    PyObject *lock = get(self, s__lock);
    int ok = lock && call_none(PyObject_CallMethodNoArgs(lock, s_acquire)) == 0;
    if (ok) {
        PyObject *bsize = get(buf, s_size);
        ok = bsize && add_to(self, s_active, bsize, +1) == 0;
        Py_XDECREF(bsize);
        PyObject *active = ok ? get(self, s_active) : NULL, *peak = active ? get(self, s_peak) : NULL;
        int more = peak ? PyObject_RichCompareBool(active, peak, Py_GT) : -1;
        ok = more >= 0 && (!more || PyObject_SetAttr(self, s_peak, active) == 0);
        Py_XDECREF(active); Py_XDECREF(peak);
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (call_none(PyObject_CallMethodNoArgs(lock, s_release)) < 0) ok = 0;
        if (type != NULL) PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(lock);
    if (ok && recording() && record(self, s_alloc, buf, Py_True) < 0) ok = 0; /* adopted */
    Py_DECREF(nbytes);
    if (!ok) Py_CLEAR(buf);
    return buf;
}

static PyObject *py_cache_take(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "cache_take(cache, size)"); return NULL; }
    return cache_take(args[0], args[1]);
}

static PyObject *py_cache_recycle(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "cache_recycle(cache, buf, size)"); return NULL; }
    if (cache_recycle(args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_cache_reuse(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "cache_reuse(cache, size)"); return NULL; }
    return cache_reuse(args[0], args[1]);
}

static PyObject *configure(PyObject *self, PyObject *timeline) {
    Py_XSETREF(a_timeline, Py_NewRef(timeline));
    Py_RETURN_NONE;
}

static PyMethodDef alloc_methods[] = {
    {"malloc", (PyCFunction)alloc_malloc, METH_O,
     "A buffer of at least ``size`` bytes, from the cache when one fits."},
    {"free", (PyCFunction)alloc_free, METH_O,
     "Return a buffer: to the cache when the policy's limit allows, else to the system."},
    {"adopt", (PyCFunction)alloc_adopt, METH_O,
     "Account for memory numpy allocated by itself (``owner`` owns its data)."},
    {NULL},
};

static PyTypeObject AllocatorBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._handle.AllocatorBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The allocator's malloc / free / adopt in C (kernels/_handle.c); the subclass "
              "keeps the state and the Python _malloc for a cache miss.",
    .tp_new = PyType_GenericNew,
    .tp_methods = alloc_methods,
};

static PyMethodDef module_methods[] = {
    {"configure", (PyCFunction)configure, METH_O, "Hand over kernels.timeline."},
    {"cache_take", (PyCFunction)(void (*)(void))py_cache_take, METH_FASTCALL,
     "BufferCache._take in C: the oldest cached buffer of exactly ``size`` bytes."},
    {"cache_recycle", (PyCFunction)(void (*)(void))py_cache_recycle, METH_FASTCALL,
     "BufferCache.recycle_to_cache in C (the buffer's size given)."},
    {"cache_reuse", (PyCFunction)(void (*)(void))py_cache_reuse, METH_FASTCALL,
     "BufferCache.reuse_from_cache in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_handle",
                                    "BufferHandle and the allocator's hot steps in C (see "
                                    "_handle.c).", -1, module_methods};

PyMODINIT_FUNC PyInit__handle(void) {
    if ((s_free = PyUnicode_InternFromString("free")) == NULL || PyType_Ready(&HandleType) < 0 ||
        PyType_Ready(&AllocatorBaseType) < 0)
        return NULL;
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL;
    I(s_active, "active") I(s_peak, "peak") I(s_cache, "cache") I(s__lock, "_lock")
    I(s_cache_limit, "cache_limit") I(s__round, "_round") I(s_page_size, "page_size")
    I(s_policy, "policy") I(s_trim_after_malloc, "trim_after_malloc")
    I(s_recycle_if_fits, "recycle_if_fits") I(s_pool_size, "pool_size") I(s__by_size, "_by_size")
    I(s__sizes, "_sizes") I(s__lru, "_lru") I(s__seq, "_seq") I(s_size, "size") I(s_raw, "raw")
    I(s__release, "_release") I(s__evict, "_evict") I(s__malloc, "_malloc")
    I(s_enabled, "enabled") I(s__record, "_record") I(s_buffer_type, "buffer_type")
    I(s_nbytes, "nbytes") I(s_acquire, "acquire") I(s_release, "release")
    I(s_popleft, "popleft") I(s_append, "append") I(s_alloc, "alloc")
    I(s_cache_reuse, "cache_reuse") I(s_free_to_cache, "free_to_cache") I(s_free_name, "free")
#undef I
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return NULL;
    deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BufferHandle", (PyObject *)&HandleType) < 0 ||
        PyModule_AddObjectRef(m, "AllocatorBase", (PyObject *)&AllocatorBaseType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
