/* The CUDA runtime's eager lane in C: one fused call evaluated by mx.eval, end to end.
 *
 * What MLX does in C++ for a small eval (mlx/transforms.cpp eval_impl, then
 * mlx/backend/cuda/compiled.cpp Compiled::eval_gpu and the stream's completion), the Python
 * eval loop does in ~25 us of interpreter time, most of a 16-element call. eval_fused does
 * exactly the same steps as the Python path it stands in for, over the same objects:
 *
 *   evaluate._gpu_fused_lane   the call plan for these layouts (compiled.launch_for), an
 *                              output buffer from the allocator (its CudaBuffer view), the
 *                              launch on the mx stream's CUDA stream (CudaBackend.launch_fused,
 *                              Launch.call), set_data and detach;
 *   CudaEvent.wait / signal    the polled host wait (events.host_wait) for the stream (its
 *                              own work and any before it: what the covering event would
 *                              cover), then the signal, with no CUDA event to record, and
 *                              the stream noted finished (device.note_finished).
 *
 * eval_one(desc) is mx.eval's first step for one array (scheduling.evaluate): _eval_one's
 * checks, the node claimed under the schedule lock, then the same. Both return False before
 * touching anything when the call is not the plain case (no plan yet, a donatable input,
 * several outputs, a tracer's node, a non-C output order, a transformation or the timeline
 * running, ...): the Python path then runs it. A cache hit of the exact size is taken with
 * the cache's own _take (Allocator.malloc's counters kept here); anything else goes through
 * the allocator's malloc. configure() and configure_eval() hand over the objects once;
 * without the CUDA driver's entry points configure() says False and nothing runs here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <time.h>

/* The CUDA driver's own entry points, from the libcuda CuPy loaded: launching and polling
 * through CuPy's bindings converts every argument in Python (~1 us a launch, ~1.4 us a
 * poll on the H200's host). Without them (no libcuda loaded: the tests' stand-in CuPy)
 * configure() leaves the lane off and the Python path runs everything. */
typedef int (*cu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, void *, void **, void **);
typedef int (*cu_query_t)(void *);
typedef int (*cu_error_name_t)(int, const char **);
static cu_launch_t cu_launch;
static cu_query_t cu_stream_query;
static cu_error_name_t cu_error_name;
#define CUDA_ERROR_NOT_READY 600

static PyObject *cfg_array_type, *cfg_generation, *cfg_work, *cfg_work_lock,
    *cfg_unfinished, *cfg_streams, *cfg_handle_type, *cfg_alloc,
    *cfg_host_wait, *cfg_timing_pending, *cfg_timing_flush, *cfg_python_free, *cfg_timeline;
static int configured = 0;

static PyObject *s_primitive, *s_kw, *s_tape, *s_shape, *s_outputs, *s_inputs, *s_data,
    *s_launches, *s_cuda, *s_strides, *s_gen, *s_dtypes, *s_order, *s_C, *s_dtype, *s_np,
    *s_size, *s_malloc, *s_view, *s_packs, *s_pack, *s_slots, *s_ptr, *s_n_out_at, *s_entry,
    *s_hits, *s_fn_ptr, *s_grid, *s_block, *s_stream, *s_index, *s_buffer, *s_node,
    *s_keep, *s_recorded, *s_value, *s_cond, *s_done, *s_acquire, *s_release,
    *s_notify_all, *s__pending, *s__lock, *s_cache, *s__by_size, *s__take, *s_active,
    *s_peak, *s_policy, *s_trim_after_malloc, *s_pool_size, *s_cache_limit, *s__evict,
    *s_raw, *s_free, *s_event, *s__active, *s_enabled, *s_defn, *s_takes_runtime, *s__owner,
    *s_recycle_if_fits, *s_recycle_to_cache, *s__release;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int intern_all(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    I(s_primitive, "primitive") I(s_kw, "kw") I(s_tape, "tape") I(s_shape, "shape")
    I(s_outputs, "outputs") I(s_inputs, "inputs") I(s_data, "data") I(s_launches, "launches")
    I(s_cuda, "cuda") I(s_strides, "strides") I(s_gen, "gen") I(s_dtypes, "dtypes")
    I(s_order, "order") I(s_C, "C") I(s_dtype, "dtype") I(s_np, "np") I(s_size, "size")
    I(s_malloc, "malloc") I(s_view, "view") I(s_packs, "packs") I(s_pack, "_pack")
    I(s_slots, "slots") I(s_ptr, "ptr") I(s_n_out_at, "n_out_at") I(s_entry, "entry")
    I(s_hits, "hits") I(s_fn_ptr, "fn_ptr") I(s_grid, "grid") I(s_block, "block")
    I(s_stream, "stream") I(s_index, "index") I(s_buffer, "buffer") I(s_node, "node")
    I(s_keep, "keep") I(s_recorded, "recorded") I(s_value, "value") I(s_cond, "_cond")
    I(s_done, "done") I(s_acquire, "acquire") I(s_release, "release")
    I(s_notify_all, "notify_all") I(s__pending, "_pending") I(s__lock, "_lock")
    I(s_cache, "cache") I(s__by_size, "_by_size") I(s__take, "_take") I(s_active, "active")
    I(s_peak, "peak") I(s_policy, "policy") I(s_trim_after_malloc, "trim_after_malloc")
    I(s_pool_size, "pool_size") I(s_cache_limit, "cache_limit") I(s__evict, "_evict")
    I(s_raw, "raw") I(s_free, "free") I(s_event, "event") I(s__active, "_active")
    I(s_enabled, "enabled") I(s_defn, "defn") I(s_takes_runtime, "takes_runtime")
    I(s__owner, "_owner") I(s_recycle_if_fits, "recycle_if_fits")
    I(s_recycle_to_cache, "recycle_to_cache") I(s__release, "_release")
#undef I
    return 0;
}

/* Each of ``names`` from the dict ``kw`` into its slot (a new reference); KeyError naming
 * the first missing one. */
static int take_config(PyObject *kw, const char *who, const char *const *names,
                       PyObject **const *slots, size_t n) {
    if (!PyDict_Check(kw)) {
        PyErr_Format(PyExc_TypeError, "%s takes a dict", who);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *v = PyDict_GetItemString(kw, names[i]);
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "%s: missing %s", who, names[i]);
            return -1;
        }
        Py_INCREF(v);
        Py_XSETREF(*slots[i], v);
    }
    return 0;
}

static PyObject *configure(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"array_type", "generation", "work", "work_lock",
                                        "unfinished", "streams", "handle_type", "allocator",
                                        "host_wait", "timing_pending", "timing_flush",
                                        "python_free", "timeline"};
    static PyObject **const slots[] = {&cfg_array_type, &cfg_generation, &cfg_work,
                                       &cfg_work_lock, &cfg_unfinished, &cfg_streams,
                                       &cfg_handle_type, &cfg_alloc, &cfg_host_wait,
                                       &cfg_timing_pending, &cfg_timing_flush,
                                       &cfg_python_free, &cfg_timeline};
    if (take_config(kw, "configure", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    cu_launch = NULL;
    cu_stream_query = NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); /* only if CuPy loaded it */
    if (lib != NULL) {
        cu_launch = (cu_launch_t)dlsym(lib, "cuLaunchKernel");
        cu_stream_query = (cu_query_t)dlsym(lib, "cuStreamQuery");
        cu_error_name = (cu_error_name_t)dlsym(lib, "cuGetErrorName");
    }
    configured = cu_launch != NULL && cu_stream_query != NULL; /* no driver: no lane */
    return PyBool_FromLong(configured);
}

/* the attribute or NULL with the error cleared: "not the plain case" */
static PyObject *get(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) PyErr_Clear();
    return v;
}

static int lock(PyObject *l) {
    PyObject *r = PyObject_CallMethodNoArgs(l, s_acquire);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static void unlock(PyObject *l) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* release even while an error is set */
    PyObject *r = PyObject_CallMethodNoArgs(l, s_release);
    Py_XDECREF(r);
    if (r == NULL) PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

/* w[k] += delta for the stream's [generation, running, index] record */
static int bump(PyObject *w, Py_ssize_t k, long delta) {
    PyObject *v = PyList_GET_ITEM(w, k);
    PyObject *n = PyLong_FromLong(PyLong_AsLong(v) + delta);
    if (n == NULL) return -1;
    PyList_SetItem(w, k, n); /* steals n, drops the old value */
    return 0;
}

static int cuda_error(const char *call, int rc) {
    const char *name = "unknown";
    if (cu_error_name != NULL) cu_error_name(rc, &name);
    PyErr_Format(PyExc_RuntimeError, "[Compiled::eval_gpu] %s failed: %s (%d)", call, name, rc);
    return -1;
}

/* events.host_wait for a CUDA stream: the driver's cuStreamQuery polled for up to 200 us
 * with the GIL released, then the Python wait (sleeps between polls) */
static int host_wait(PyObject *cs) {
    double end = now_s() + 200e-6;
    PyObject *p = PyObject_GetAttr(cs, s_ptr);
    void *stream = p ? PyLong_AsVoidPtr(p) : NULL;
    Py_XDECREF(p);
    if (PyErr_Occurred()) return -1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    do {
        rc = cu_stream_query(stream);
    } while (rc == CUDA_ERROR_NOT_READY && now_s() < end);
    Py_END_ALLOW_THREADS
    if (rc == 0) return 0;
    if (rc != CUDA_ERROR_NOT_READY) return cuda_error("cuStreamQuery", rc);
    PyObject *r = PyObject_CallOneArg(cfg_host_wait, cs);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* device.note_finished for a stream the host saw idle: nothing enqueued since generation
 * ``gen`` (our launch's) and nothing being enqueued now */
static int stream_finished(PyObject *index, PyObject *w, long gen) {
    if (lock(cfg_work_lock) < 0) return -1;
    int rc = 0;
    if (PyLong_AsLong(PyList_GET_ITEM(w, 0)) == gen && PyLong_AsLong(PyList_GET_ITEM(w, 1)) == 0)
        rc = PySet_Discard(cfg_unfinished, index) < 0 ? -1 : 0;
    unlock(cfg_work_lock);
    return rc;
}

/* The layouts key of compiled.launch_for: ("cuda", shape, (shape, strides) per array input) */
static PyObject *launch_key(PyObject *arrays, PyObject *shape, PyObject **data, Py_ssize_t n) {
    Py_ssize_t k = PyTuple_GET_SIZE(arrays);
    PyObject *key = PyTuple_New(2 + k);
    if (key == NULL) return NULL;
    Py_INCREF(s_cuda);
    PyTuple_SET_ITEM(key, 0, s_cuda);
    Py_INCREF(shape);
    PyTuple_SET_ITEM(key, 1, shape);
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(arrays, j));
        if (i < 0 || i >= n) {
            Py_DECREF(key);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "launch input index");
            return NULL;
        }
        PyObject *sh = PyObject_GetAttr(data[i], s_shape);
        PyObject *st = sh ? PyObject_GetAttr(data[i], s_strides) : NULL;
        PyObject *pair = st ? PyTuple_Pack(2, sh, st) : NULL;
        Py_XDECREF(sh);
        Py_XDECREF(st);
        if (pair == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, 2 + j, pair);
    }
    return key;
}

static int set_attr_hits(PyObject *entry) {
    PyObject *h = PyObject_GetAttr(entry, s_hits);
    if (h == NULL) return -1;
    PyObject *one = PyLong_FromLong(1);
    PyObject *h1 = one ? PyNumber_Add(h, one) : NULL;
    Py_XDECREF(one);
    Py_DECREF(h);
    if (h1 == NULL) return -1;
    int rc = PyObject_SetAttr(entry, s_hits, h1);
    Py_DECREF(h1);
    return rc;
}

/* -- eval_one's configuration (core's objects, handed over by core/scheduling.py) -------- */
static PyObject *ec_schedule_lock, *ec_tracer, *ec_workers, *ec_by_stream,
    *ec_backend, *ec_event_type;
static int eval_configured = 0;

static PyObject *configure_eval(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"schedule_lock", "tracer", "workers", "by_stream",
                                        "backend", "event_type"};
    static PyObject **const slots[] = {&ec_schedule_lock, &ec_tracer, &ec_workers,
                                       &ec_by_stream, &ec_backend, &ec_event_type};
    if (take_config(kw, "configure_eval", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    eval_configured = 1;
    Py_RETURN_NONE;
}

/* lock.acquire(False): 1 taken, 0 busy, -1 error */
static int try_lock(PyObject *l) {
    PyObject *r = PyObject_CallMethodOneArg(l, s_acquire, Py_False);
    if (r == NULL) return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

/* A buffer of the allocator for ``nbytes`` (a new reference). Allocator.malloc's cache hit
 * done here: the exact size is in the cache, nothing pending, the lock free: the cache's
 * own ``_take``, then the counters and the trim as malloc keeps them. Anything else is the
 * allocator's malloc (CudaAllocator.malloc). */
static long long last_request = -1, last_rounded = -1;

static PyObject *lane_malloc(long long nbytes) {
    PyObject *alloc = cfg_alloc, *buf = NULL;
    PyObject *pending = PyObject_GetAttr(alloc, s__pending);
    if (pending == NULL) return NULL;
    Py_ssize_t npend = PyObject_Length(pending);
    Py_DECREF(pending);
    if (npend != 0) goto python;
    if (nbytes != last_request) { /* the policy's rounding (Allocator.round_size) */
        PyObject *r = PyObject_CallMethod(alloc, "round_size", "L", nbytes);
        if (r == NULL) return NULL;
        long long rounded = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (rounded < 0) return NULL;
        last_request = nbytes, last_rounded = rounded;
    }
    PyObject *size = PyLong_FromLongLong(last_rounded);
    PyObject *lk = size ? PyObject_GetAttr(alloc, s__lock) : NULL;
    if (lk == NULL) { Py_XDECREF(size); return NULL; }
    int taken = try_lock(lk);
    if (taken <= 0) {
        Py_DECREF(size);
        Py_DECREF(lk);
        if (taken < 0) return NULL;
        goto python;
    }
    PyObject *cache = PyObject_GetAttr(alloc, s_cache);
    PyObject *by_size = cache ? PyObject_GetAttr(cache, s__by_size) : NULL;
    int hit = by_size ? PyDict_Contains(by_size, size) : -1;
    Py_XDECREF(by_size);
    if (hit == 1) buf = PyObject_CallMethodOneArg(cache, s__take, size);
    if (buf != NULL) { /* active += real size; peak; the trim after a malloc */
        PyObject *bsize = PyObject_GetAttr(buf, s_size);
        PyObject *active = bsize ? PyObject_GetAttr(alloc, s_active) : NULL;
        PyObject *na = active ? PyNumber_Add(active, bsize) : NULL;
        PyObject *peak = na ? PyObject_GetAttr(alloc, s_peak) : NULL;
        int ok = peak != NULL && PyObject_SetAttr(alloc, s_active, na) == 0;
        if (ok) {
            int more = PyObject_RichCompareBool(na, peak, Py_GT);
            ok = more >= 0 && (!more || PyObject_SetAttr(alloc, s_peak, na) == 0);
        }
        Py_XDECREF(bsize); Py_XDECREF(active); Py_XDECREF(na); Py_XDECREF(peak);
        PyObject *policy = ok ? PyObject_GetAttr(alloc, s_policy) : NULL;
        PyObject *trim = policy ? PyObject_GetAttr(policy, s_trim_after_malloc) : NULL;
        Py_XDECREF(policy);
        if (trim == NULL) ok = 0;
        else if (PyObject_IsTrue(trim)) {
            PyObject *pool = PyObject_GetAttr(cache, s_pool_size);
            PyObject *limit = pool ? PyObject_GetAttr(alloc, s_cache_limit) : NULL;
            int over = limit ? PyObject_RichCompareBool(pool, limit, Py_GT) : -1;
            if (over < 0) ok = 0;
            else if (over) {
                PyObject *excess = PyNumber_Subtract(pool, limit);
                PyObject *er = excess ? PyObject_CallMethodOneArg(alloc, s__evict, excess) : NULL;
                Py_XDECREF(excess);
                if (er == NULL) ok = 0;
                Py_XDECREF(er);
            }
            Py_XDECREF(pool); Py_XDECREF(limit);
        }
        Py_XDECREF(trim);
        if (!ok) Py_CLEAR(buf); /* (an error in the bookkeeping: raised below) */
    }
    unlock(lk);
    Py_DECREF(lk);
    Py_XDECREF(cache);
    Py_DECREF(size);
    if (buf != NULL || PyErr_Occurred()) return buf;
python:
    return PyObject_CallMethod(alloc, "malloc", "L", nbytes);
}

/* CudaAllocator.free(buf), installed as the allocator's ``free`` (what a BufferHandle calls
 * when its last array goes): with every GPU stream seen finished (no event to record) and
 * the timeline off, Allocator.free's steps here (active down; into the cache by the
 * policy's rule, with the cache's own recycle_to_cache, else released); anything else is
 * the Python method. */
static PyObject *lane_free(PyObject *self, PyObject *buf) {
    PyObject *alloc = cfg_alloc, *size = NULL, *raw = NULL, *lk = NULL, *v = NULL;
    int taken = 0, done = 0;
    if (!configured) goto python;
    if (PySet_GET_SIZE(cfg_unfinished) != 0) goto python;
    v = get(cfg_timeline, s_enabled);
    if (v == NULL || v != Py_False) goto python;
    size = get(buf, s_size);
    raw = get(buf, s_raw);
    if (size == NULL || raw == NULL || raw == Py_None || !PyLong_Check(size) ||
        PyLong_AsLongLong(size) <= 0)
        goto python;
    lk = get(alloc, s__lock);
    if (lk == NULL || (taken = try_lock(lk)) <= 0) { PyErr_Clear(); taken = 0; goto python; }
    PyObject *active = PyObject_GetAttr(alloc, s_active);
    PyObject *na = active ? PyNumber_Subtract(active, size) : NULL;
    Py_XDECREF(active);
    if (na == NULL || PyObject_SetAttr(alloc, s_active, na) < 0) { Py_XDECREF(na); goto fail; }
    Py_DECREF(na);
    done = 1; /* counted: from here errors raise, never a second free */
    PyObject *cache = PyObject_GetAttr(alloc, s_cache);
    PyObject *pool = cache ? PyObject_GetAttr(cache, s_pool_size) : NULL;
    PyObject *limit = pool ? PyObject_GetAttr(alloc, s_cache_limit) : NULL;
    PyObject *policy = limit ? PyObject_GetAttr(alloc, s_policy) : NULL;
    PyObject *fits = policy ? PyObject_GetAttr(policy, s_recycle_if_fits) : NULL;
    int keep = -1;
    if (fits != NULL) {
        if (PyObject_IsTrue(fits)) { /* cached + size <= limit */
            PyObject *sum = PyNumber_Add(pool, size);
            keep = sum ? PyObject_RichCompareBool(sum, limit, Py_LE) : -1;
            Py_XDECREF(sum);
        } else { /* cached < limit */
            keep = PyObject_RichCompareBool(pool, limit, Py_LT);
        }
    }
    PyObject *rr = NULL;
    if (keep == 1) rr = PyObject_CallMethodOneArg(cache, s_recycle_to_cache, buf);
    Py_XDECREF(cache); Py_XDECREF(pool); Py_XDECREF(limit); Py_XDECREF(policy); Py_XDECREF(fits);
    unlock(lk);
    taken = 0;
    if (keep < 0 || (keep == 1 && rr == NULL)) goto fail;
    Py_XDECREF(rr);
    if (keep == 0) {
        rr = PyObject_CallMethodOneArg(alloc, s__release, buf);
        if (rr == NULL) goto fail;
        Py_DECREF(rr);
    }
    Py_XDECREF(lk); Py_XDECREF(size); Py_XDECREF(raw); Py_XDECREF(v);
    Py_RETURN_NONE;
fail:
    if (taken) unlock(lk);
    Py_XDECREF(lk); Py_XDECREF(size); Py_XDECREF(raw); Py_XDECREF(v);
    if (!done) {
        PyErr_Clear();
        return PyObject_CallFunctionObjArgs(cfg_python_free, alloc, buf, NULL);
    }
    return NULL;
python:
    PyErr_Clear();
    Py_XDECREF(lk); Py_XDECREF(size); Py_XDECREF(raw); Py_XDECREF(v);
    if (cfg_python_free == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_lane.free: not configured");
        return NULL;
    }
    return PyObject_CallFunctionObjArgs(cfg_python_free, alloc, buf, NULL);
}

/* The CudaEvent of ``ev`` signalled with its work done (no CUDA event left to wait for),
 * its waiters woken: CudaEvent.signal after the host wait */
static int signal_done(PyObject *ev) {
    if (PyObject_SetAttr(ev, s_recorded, Py_None) < 0) return -1;
    PyObject *one = PyLong_FromLong(1);
    int rc = one ? PyObject_SetAttr(ev, s_value, one) : -1;
    Py_XDECREF(one);
    if (rc < 0) return -1;
    PyObject *cond = PyObject_GetAttr(ev, s_cond);
    if (cond == NULL) return -1;
    if (cond != Py_None) {
        if (lock(cond) < 0) { Py_DECREF(cond); return -1; }
        PyObject *nr = PyObject_CallMethodNoArgs(cond, s_notify_all);
        unlock(cond);
        Py_XDECREF(nr);
        if (nr == NULL) { Py_DECREF(cond); return -1; }
    }
    Py_DECREF(cond);
    return 0;
}

/* the node scheduled by this eval (``_eval_one``: node.event set under the schedule lock):
 * 1, or 0 when another eval has it or the lock is busy (the Python path then decides) */
static int claim(PyObject *node, PyObject *index, PyObject **ev) {
    *ev = PyObject_CallOneArg(ec_event_type, index);
    if (*ev == NULL) return -1;
    int taken = try_lock(ec_schedule_lock);
    if (taken <= 0) { Py_CLEAR(*ev); return taken; }
    PyObject *cur = PyObject_GetAttr(node, s_event);
    int ok = cur == Py_None && PyObject_SetAttr(node, s_event, *ev) == 0;
    Py_XDECREF(cur);
    unlock(ec_schedule_lock);
    if (!ok) { Py_CLEAR(*ev); return PyErr_Occurred() ? -1 : 0; }
    return 1;
}

#define MAX_INPUTS 64

/* A loaded fused call on a GPU stream, run and waited for: 1 done, 0 not the plain case
 * (nothing touched), -1 error (the node left unevaluated, its event signalled). ``ev_in``:
 * the eval's event with node.event already set (``_eval_one``), or NULL: claim the node. */
static int run_fused(PyObject *node, PyObject *ev_in) {
    int result = 0;
    PyObject *ev = ev_in;
    int claimed = 0;
    /* every reference below is released at "out" */
    PyObject *prim = NULL, *kw, *tape, *shape, *outputs = NULL, *inputs = NULL, *stream = NULL,
             *index = NULL, *launches = NULL, *key = NULL, *ln = NULL, *lgen = NULL,
             *dtypes = NULL, *order = NULL, *target = NULL, *tdtype = NULL, *npdt = NULL,
             *tshape = NULL, *lshape = NULL, *itemsize = NULL, *buf = NULL, *outv = NULL,
             *handle = NULL, *packs = NULL, *pack = NULL, *slots = NULL, *nout = NULL,
             *entry = NULL, *keep = NULL, *w = NULL, *cs = NULL, *raw = NULL;
    PyObject *data[MAX_INPUTS];
    Py_ssize_t n = 0;
    long gen_after = -1;

    keep = get(node, s_keep);
    if (keep == NULL || keep != Py_False) goto out; /* a tracer's node keeps its inputs */
    prim = get(node, s_primitive);
    if (prim == NULL) goto out;
    kw = PyObject_GetAttr(prim, s_kw);
    if (kw == NULL) { PyErr_Clear(); goto out; }
    Py_DECREF(kw); /* the primitive keeps kw, kw keeps tape and shape */
    tape = PyDict_GetItemWithError(kw, s_tape);
    shape = tape ? PyDict_GetItemWithError(kw, s_shape) : NULL;
    if (shape == NULL) { PyErr_Clear(); goto out; }
    outputs = get(node, s_outputs);
    inputs = get(node, s_inputs);
    if (outputs == NULL || inputs == NULL || !PyList_CheckExact(outputs) ||
        PyList_GET_SIZE(outputs) != 1 || !PyList_CheckExact(inputs))
        goto out;
    n = PyList_GET_SIZE(inputs);
    if (n > MAX_INPUTS) { n = 0; goto out; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(inputs, i);
        /* held by the node alone: it may donate its buffer, which the Python path decides */
        if (Py_REFCNT(d) <= 1) { n = i; goto out; }
        PyObject *dn = PyObject_GetAttr(d, s_node);
        if (dn != Py_None) { Py_XDECREF(dn); PyErr_Clear(); n = i; goto out; } /* not available */
        Py_DECREF(dn);
        data[i] = PyObject_GetAttr(d, s_data);
        if (data[i] == NULL) { PyErr_Clear(); n = i; goto out; }
        if ((PyObject *)Py_TYPE(data[i]) != cfg_array_type) { n = i + 1; goto out; }
    }
    stream = get(prim, s_stream);
    index = stream ? get(stream, s_index) : NULL;
    if (index == NULL) goto out;
    w = PyDict_GetItemWithError(cfg_work, index);
    cs = w ? PyDict_GetItemWithError(cfg_streams, index) : NULL;
    if (cs == NULL || !PyList_CheckExact(w) || PyList_GET_SIZE(w) != 3) {
        PyErr_Clear();
        w = cs = NULL;
        goto out;
    }
    Py_INCREF(w);
    Py_INCREF(cs);
    /* compiled.launch_for */
    launches = get(tape, s_launches);
    if (launches == NULL || !PyDict_Check(launches)) goto out;
    PyObject *arrays = PyDict_GetItemWithError(launches, s_cuda);
    if (arrays == NULL || !PyTuple_Check(arrays)) { PyErr_Clear(); goto out; }
    key = launch_key(arrays, shape, data, n);
    if (key == NULL) { PyErr_Clear(); goto out; }
    ln = PyDict_GetItemWithError(launches, key);
    if (ln == NULL) { PyErr_Clear(); goto out; }
    Py_INCREF(ln);
    lgen = get(ln, s_gen);
    if (lgen == NULL || PyObject_RichCompareBool(lgen, PyList_GET_ITEM(cfg_generation, 0), Py_EQ) != 1) {
        PyErr_Clear();
        goto out;
    }
    /* the output: one, of the plan's dtype and shape, C order (Launch.takes) */
    target = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
    if (target == NULL || target == Py_None) { PyErr_Clear(); target = NULL; goto out; }
    Py_INCREF(target);
    dtypes = get(ln, s_dtypes);
    order = get(ln, s_order);
    tdtype = get(target, s_dtype);
    tshape = get(target, s_shape);
    lshape = get(ln, s_shape);
    if (!dtypes || !order || !tdtype || !tshape || !lshape || !PyList_Check(dtypes) ||
        PyList_GET_SIZE(dtypes) != 1 || PyUnicode_Compare(order, s_C) != 0 ||
        !PyTuple_Check(tshape))
        goto out;
    npdt = get(tdtype, s_np);
    itemsize = get(tdtype, s_size);
    if (!npdt || !itemsize) goto out;
    if (PyObject_RichCompareBool(npdt, PyList_GET_ITEM(dtypes, 0), Py_EQ) != 1 ||
        PyObject_RichCompareBool(tshape, lshape, Py_EQ) != 1) {
        PyErr_Clear();
        goto out;
    }
    long long nbytes = PyLong_AsLongLong(itemsize);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tshape); i++)
        nbytes *= PyLong_AsLongLong(PyTuple_GET_ITEM(tshape, i));
    if (nbytes <= 0 || PyErr_Occurred()) { PyErr_Clear(); goto out; }
    if (ev == NULL) {
        int c = claim(node, index, &ev);
        if (c <= 0) { result = c; goto out; }
        claimed = 1;
    }
    /* from here on the call is ours: errors propagate */
    result = -1;
    buf = lane_malloc(nbytes);
    if (buf == NULL) goto out;
    /* Launch.call: this thread's argument slots, the pointers written in */
    packs = PyObject_GetAttr(ln, s_packs);
    if (packs == NULL) goto out;
    PyObject *tid = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (tid == NULL) goto out;
    pack = PyDict_GetItemWithError(packs, tid);
    Py_DECREF(tid);
    if (pack != NULL) Py_INCREF(pack);
    else if (PyErr_Occurred() || (pack = PyObject_CallMethodNoArgs(ln, s_pack)) == NULL) goto out;
    if (!PyTuple_Check(pack) || PyTuple_GET_SIZE(pack) != 3) {
        PyErr_SetString(PyExc_TypeError, "a launch pack is (slots, pointers, address)");
        goto out;
    }
    uint64_t **ptrs = (uint64_t **)PyLong_AsVoidPtr(PyTuple_GET_ITEM(pack, 2));
    if (ptrs == NULL) goto out;
    uint64_t *vals = ptrs[0]; /* pointer i points at slot i: slot 0 is the array's start */
    slots = PyObject_GetAttr(ln, s_slots);
    if (slots == NULL || !PyTuple_Check(slots)) goto out;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(slots); k++) {
        PyObject *ij = PyTuple_GET_ITEM(slots, k);
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(ij, 0));
        Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(ij, 1));
        if (i < 0 || i >= n) { PyErr_SetString(PyExc_IndexError, "launch slot"); goto out; }
        PyObject *mp = PyObject_GetAttr(data[i], s_data);
        PyObject *p = mp ? PyObject_GetAttr(mp, s_ptr) : NULL;
        Py_XDECREF(mp);
        if (p == NULL) goto out;
        vals[j] = (uint64_t)PyLong_AsUnsignedLongLong(p);
        Py_DECREF(p);
    }
    /* the output's pointer: the buffer's start (its typed view, made after the launch,
     * starts there: Buffer.view) */
    nout = PyObject_GetAttr(ln, s_n_out_at);
    raw = nout ? PyObject_GetAttr(buf, s_raw) : NULL;
    PyObject *omp = raw ? PyObject_GetAttr(raw, s_data) : NULL;
    PyObject *outptr = omp ? PyObject_GetAttr(omp, s_ptr) : NULL;
    Py_XDECREF(omp);
    if (outptr == NULL) goto out;
    vals[PyLong_AsSsize_t(nout)] = (uint64_t)PyLong_AsUnsignedLongLong(outptr);
    Py_DECREF(outptr);
    if (PyErr_Occurred()) goto out;
    PyObject *sp = PyObject_GetAttr(cs, s_ptr);
    PyObject *fn = sp ? PyObject_GetAttr(ln, s_fn_ptr) : NULL;
    PyObject *grid = fn ? PyObject_GetAttr(ln, s_grid) : NULL;
    PyObject *block = grid ? PyObject_GetAttr(ln, s_block) : NULL;
    if (block == NULL) {
        Py_XDECREF(sp); Py_XDECREF(fn); Py_XDECREF(grid);
        goto out;
    }
    /* CudaBackend.launch_fused: the launch inside the stream's work record */
    PyObject *r = NULL;
    if (lock(cfg_work_lock) < 0) { Py_DECREF(sp); Py_DECREF(fn); Py_DECREF(grid); Py_DECREF(block); goto out; }
    int ok = bump(w, 1, +1) == 0 && PySet_Add(cfg_unfinished, index) == 0;
    unlock(cfg_work_lock);
    if (ok) {
        void *f = PyLong_AsVoidPtr(fn), *st = PyLong_AsVoidPtr(sp);
        unsigned gx = (unsigned)PyLong_AsUnsignedLong(grid), bx = (unsigned)PyLong_AsUnsignedLong(block);
        if (!PyErr_Occurred()) {
            int rc = cu_launch(f, gx, 1, 1, bx, 1, 1, 0, st, (void **)ptrs, NULL);
            if (rc == 0) r = Py_NewRef(Py_None);
            else cuda_error("cuLaunchKernel", rc);
        }
        if (lock(cfg_work_lock) == 0) {
            bump(w, 0, +1);
            bump(w, 1, -1);
            gen_after = PyLong_AsLong(PyList_GET_ITEM(w, 0));
            unlock(cfg_work_lock);
        }
    }
    Py_DECREF(sp); Py_DECREF(fn); Py_DECREF(grid); Py_DECREF(block);
    Py_XDECREF(r);
    if (!ok || r == NULL || PyErr_Occurred()) goto out;
    /* while the kernel runs: the buffer's handle (from here it frees the buffer), its typed
     * view (CudaBuffer.view), the kernel cache's hit */
    handle = PyObject_CallFunctionObjArgs(cfg_handle_type, buf, cfg_alloc, NULL);
    if (handle == NULL) goto out;
    outv = PyObject_CallMethod(buf, "view", "LOO", nbytes, npdt, tshape);
    if (outv == NULL) goto out;
    entry = PyObject_GetAttr(ln, s_entry);
    if (entry == NULL || set_attr_hits(entry) < 0) goto out;
    /* CudaEvent.wait on the host, for the whole stream (its work done: no event to record);
     * the stream has finished unless somebody enqueued more since our launch */
    if (host_wait(cs) < 0 || stream_finished(index, w, gen_after) < 0) goto out;
    /* then set_data and detach (not before: a thread that sees the output without a node
     * reads it at once; until then it waits for the event), and the signal */
    if (PyObject_SetAttr(target, s_data, outv) < 0 || PyObject_SetAttr(target, s_buffer, handle) < 0 ||
        PyObject_SetAttr(target, s_node, Py_None) < 0)
        goto out;
    PyObject *empty = PyList_New(0);
    if (empty == NULL) goto out;
    int rc = PyObject_SetAttr(node, s_inputs, empty);
    Py_DECREF(empty);
    if (rc < 0 || signal_done(ev) < 0) goto out;
    if (PyList_Check(cfg_timing_pending) && PyList_GET_SIZE(cfg_timing_pending)) {
        PyObject *fr = PyObject_CallNoArgs(cfg_timing_flush);
        if (fr == NULL) goto out;
        Py_DECREF(fr);
    }
    result = 1;
out:
    if (result < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (buf != NULL && handle == NULL) { /* the memory goes back (after the kernel: free) */
            PyObject *fr = PyObject_CallMethodOneArg(cfg_alloc, s_free, buf);
            Py_XDECREF(fr);
            PyErr_Clear();
        }
        if (claimed) { /* as _eval_one: the node unscheduled, its event signalled */
            PyObject_SetAttr(node, s_event, Py_None);
            PyObject *sr = PyObject_CallMethod(ev, "signal", "i", 1);
            Py_XDECREF(sr);
            PyErr_Clear();
        }
        PyErr_Restore(type, value, tb);
    }
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(data[i]);
    if (claimed) Py_XDECREF(ev);
    Py_XDECREF(keep); Py_XDECREF(prim); Py_XDECREF(outputs); Py_XDECREF(inputs);
    Py_XDECREF(stream); Py_XDECREF(index); Py_XDECREF(launches); Py_XDECREF(key);
    Py_XDECREF(ln); Py_XDECREF(lgen); Py_XDECREF(dtypes); Py_XDECREF(order);
    Py_XDECREF(target); Py_XDECREF(tdtype); Py_XDECREF(npdt); Py_XDECREF(tshape);
    Py_XDECREF(lshape); Py_XDECREF(itemsize); Py_XDECREF(buf); Py_XDECREF(outv);
    Py_XDECREF(handle); Py_XDECREF(packs); Py_XDECREF(pack); Py_XDECREF(slots);
    Py_XDECREF(nout); Py_XDECREF(entry); Py_XDECREF(w); Py_XDECREF(cs); Py_XDECREF(raw);
    return result;
}

static PyObject *as_bool(int r) {
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

/* eval_fused(node, ev) -> bool: from ``_eval_one``, which scheduled the node with ``ev`` */
static PyObject *eval_fused(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "eval_fused(node, ev)");
        return NULL;
    }
    if (!configured) Py_RETURN_FALSE;
    return as_bool(run_fused(args[0], args[1]));
}

/* eval_one(desc) -> bool: ``mx.eval`` of one array whose node is such a call, from its
 * first line (scheduling.evaluate): what _eval_one checks (no transformation running, the
 * timeline off, the node unscheduled, its stream this thread's with no worker, on this
 * backend), then the node claimed and run. False: the Python path evaluates it. */
static PyObject *eval_one(PyObject *self, PyObject *desc) {
    if (!configured || !eval_configured) Py_RETURN_FALSE;
    PyObject *node = NULL, *prim = NULL, *defn = NULL, *stream = NULL, *index = NULL, *v = NULL;
    int r = 0, t;
    node = get(desc, s_node);
    if (node == NULL || node == Py_None) goto out;
    v = get(ec_tracer, s__active); /* a transformation runs: before_eval's walk */
    if (v == NULL || (t = PyObject_IsTrue(v)) != 0) goto out;
    Py_CLEAR(v);
    v = get(cfg_timeline, s_enabled);
    if (v == NULL || (t = PyObject_IsTrue(v)) != 0) goto out;
    Py_CLEAR(v);
    v = get(node, s_event);
    if (v != Py_None) goto out;
    Py_CLEAR(v);
    prim = get(node, s_primitive);
    defn = prim ? get(prim, s_defn) : NULL;
    v = defn ? get(defn, s_takes_runtime) : NULL;
    if (v != Py_True) goto out;
    Py_CLEAR(v);
    stream = get(prim, s_stream);
    v = stream ? get(stream, s__owner) : NULL; /* any thread's, or this one's: check_thread */
    if (v == NULL) goto out;
    if (v != Py_None) {
        if (!PyLong_Check(v) || PyLong_AsUnsignedLong(v) != PyThread_get_thread_ident()) goto out;
    }
    Py_CLEAR(v);
    index = get(stream, s_index);
    if (index == NULL) goto out;
    if (PyDict_GetItemWithError(ec_by_stream, index) != ec_backend) { PyErr_Clear(); goto out; }
    if (PyDict_GetItemWithError(ec_workers, index) != NULL || PyErr_Occurred()) {
        PyErr_Clear();
        goto out;
    }
    r = run_fused(node, NULL);
out:
    if (r == 0) PyErr_Clear(); /* a check that could not be read: the Python path */
    Py_XDECREF(node); Py_XDECREF(prim); Py_XDECREF(defn); Py_XDECREF(stream);
    Py_XDECREF(index); Py_XDECREF(v);
    return as_bool(r);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)configure, METH_O, "Hand over the runtime's objects (a dict)."},
    {"configure_eval", (PyCFunction)configure_eval, METH_O,
     "Hand over core's scheduling objects (a dict) for eval_one."},
    {"eval_fused", (PyCFunction)(void (*)(void))eval_fused, METH_FASTCALL,
     "eval_fused(node, ev) -> bool: run a loaded fused call of a GPU stream and wait for it."},
    {"free", (PyCFunction)lane_free, METH_O,
     "free(buf): CudaAllocator.free of the configured allocator, its usual case in C."},
    {"eval_one", (PyCFunction)eval_one, METH_O,
     "eval_one(desc) -> bool: mx.eval of one array whose node is such a call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lane",
                                    "The CUDA runtime's eager lane in C (see _lane.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__lane(void) {
    if (intern_all() < 0) return NULL;
    return PyModule_Create(&module);
}
