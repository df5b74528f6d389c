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
 *   CudaEvent.wait / signal    the host wait for the stream (its own work and any before it:
 *                              what the covering event would cover; on the completion word
 *                              below, else polled as events.host_wait polls), then the
 *                              signal, with no CUDA event to record, and the stream noted
 *                              finished (device.note_finished).
 *
 * eval_one(desc) is mx.eval's first step for one array (scheduling.evaluate): _eval_one's
 * checks, the node claimed under the schedule lock, then the same. Both return False before
 * touching anything when the call is not the plain case (no plan yet, a donatable input,
 * several outputs, a tracer's node, a non-C output order, a transformation or the timeline
 * running, ...): the Python path then runs it. The output buffer is the allocator's
 * (Allocator.malloc, kernels/_handle.c: the one buffer cache in C, which every backend's
 * allocator runs). configure() and configure_eval() hand over the objects
 * once; without the CUDA driver's entry points configure() says False and nothing runs
 * here. The eval's Python frames are gone too: mx.eval's first step and a compiled
 * function's call are C (core/_call.c), a buffer's handle is (kernels/_handle.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
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

/* The host-visible completion word (what MLX's SharedEvent is on CUDA, mlx/backend/cuda/
 * event.cu: a word in host-visible memory written from the GPU, which the host reads by
 * spinning instead of asking the driver). A page of pinned host memory mapped for the
 * device holds one word per stream index below WORDS. A one-block fused kernel writes
 * its word itself once all its threads are done (codegen/cuda.py: after a system-wide
 * fence, so its outputs first); after a larger launch the stream writes it with the
 * driver's stream memory operation (cuStreamWriteValue32, fenced likewise). Measured on the
 * H200 host in C, a 16-element kernel from launch to seen finished: 9.1-10.0 us polling
 * cuStreamQuery (whose last, successful query alone costs ~1.4 us), 8.5 by the stream's
 * write (its enqueue costs ~0.7), 8.0-8.2 by the kernel's. Each launch writes the next
 * value of one counter: a stream's word only grows, so a later value also says an earlier
 * launch is done. Without the entry points, or when the page cannot be made, the lane
 * polls cuStreamQuery. */
typedef int (*cu_write_value_t)(void *, unsigned long long, unsigned, unsigned);
typedef int (*cu_host_alloc_t)(void **, size_t, unsigned);
typedef int (*cu_host_device_ptr_t)(unsigned long long *, void *, unsigned);
static cu_write_value_t cu_write_value;
static cu_host_alloc_t cu_host_alloc;
static cu_host_device_ptr_t cu_host_device_ptr;
#define WORDS 1024
static volatile uint32_t *word_host;       /* the page, as the host reads it */
static unsigned long long word_dev;         /* the page, as the device writes it */
static int word_state = 0;                  /* 0 not made yet, 1 in use, -1 off */
static uint32_t word_seq = 0;               /* the last value written */
static long long waits_by_word = 0, waits_by_query = 0;
static int word_wanted = 1;                 /* use_completion_word(False): poll instead */

/* the page, made on the first use (this thread's CUDA context is current: making its
 * launch pack made it so, Launch._pack) */
static int word_page(void) {
    if (word_state == 0) {
        void *h = NULL;
        unsigned long long d = 0;
        word_state = -1;
        if (cu_host_alloc && cu_host_device_ptr &&
            cu_host_alloc(&h, WORDS * sizeof(uint32_t), 0x01 | 0x02) == 0 && /* PORTABLE | DEVICEMAP */
            cu_host_device_ptr(&d, h, 0) == 0) {
            memset(h, 0, WORDS * sizeof(uint32_t));
            word_host = (volatile uint32_t *)h, word_dev = d, word_state = 1;
        }
    }
    return word_state == 1;
}

/* The next value for word ``slot`` (the GIL held from here to the launch: the values
 * follow the launches' order), or 0: no word (poll the stream) */
static uint32_t next_word_value(Py_ssize_t slot) {
    if (!word_wanted || slot < 0 || slot >= WORDS || !word_page()) return 0;
    uint32_t seq = ++word_seq;
    if (seq == 0) seq = ++word_seq; /* (0 is "none") */
    return seq;
}

/* After a launch on ``stream``: the value the stream will write into word ``slot`` when it
 * gets past the kernel (cuStreamWriteValue32), or 0 (no word: poll the stream) */
static uint32_t word_after_launch(void *stream, Py_ssize_t slot) {
    if (cu_write_value == NULL) return 0;
    uint32_t seq = next_word_value(slot);
    if (seq == 0) return 0;
    if (cu_write_value(stream, word_dev + sizeof(uint32_t) * (unsigned long long)slot, seq, 0) != 0) {
        cu_write_value = NULL; /* not supported here: multi-block launches poll from now on */
        return 0;
    }
    return seq;
}

static PyObject *cfg_array_type, *cfg_generation, *cfg_work, *cfg_work_lock,
    *cfg_unfinished, *cfg_streams, *cfg_handle_type, *cfg_alloc,
    *cfg_host_wait, *cfg_timing_pending, *cfg_timing_flush, *cfg_python_free, *cfg_timeline;
static int configured = 0;

static PyObject *s_primitive, *s_kw, *s_tape, *s_shape, *s_outputs, *s_inputs, *s_data,
    *s_launches, *s_cuda, *s_strides, *s_gen, *s_dtypes, *s_order, *s_C, *s_dtype, *s_np,
    *s_size, *s_packs, *s_pack, *s_slots, *s_ptr, *s_entry, *s_hits, *s_stream, *s_index,
    *s_buffer, *s_node, *s_keep, *s_recorded, *s_value, *s_cond, *s_acquire, *s_release,
    *s_notify_all, *s__pending, *s__lock, *s_cache, *s__by_size, *s_active, *s_peak, *s_policy,
    *s_trim_after_malloc, *s_pool_size, *s_cache_limit, *s__evict, *s_raw, *s_free, *s_event,
    *s__active, *s_enabled, *s_defn, *s_takes_runtime, *s__owner, *s_recycle_if_fits,
    *s__release, *s_lane, *s_popleft, *s_append, *s__sizes, *s__lru, *s__seq;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Where a call's time goes: profile(True) starts summing the time from each mark to the
 * next, per phase (a clock read per mark while on, nothing while off); profile(False)
 * stops and returns {phase: (seconds, count)}, zeroed for the next. The step table in
 * BENCHMARKS.md ("GPU fusion") was made with it. */
enum { PH_START, PH_CHECKS, PH_PLAN, PH_CLAIM, PH_MALLOC, PH_POINTERS, PH_LAUNCH, PH_HANDLE,
       PH_VIEW, PH_HITS, PH_WAIT, PH_FINISHED, PH_DETACH, PH_SIGNAL, PH_TIMING, PH_FREE, NPH };
static const char *const phase_names[NPH] = {
    "start", "eval_one's checks", "the plan (checks, launch key, record)", "the claim",
    "malloc", "the argument pointers", "the launch (and the stream's work record)",
    "BufferHandle", "the buffer's view", "cache hit, next event", "the host wait",
    "the stream noted finished", "set_data, detach", "the signal", "the timing flush",
    "free (_lane.free)"};
static int prof_on = 0;
static double prof_acc[NPH], prof_last;
static long prof_cnt[NPH];
#define PH(k) do { if (prof_on) { double t_ = now_s(); prof_acc[k] += t_ - prof_last; prof_cnt[k]++; prof_last = t_; } } while (0)
#define PH0() do { if (prof_on) prof_last = now_s(); } while (0)

static PyObject *profile(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    PyObject *d = PyDict_New();
    for (int k = 1; d != NULL && k < NPH; k++) {
        PyObject *t = Py_BuildValue("(dl)", prof_acc[k], prof_cnt[k]);
        if (t == NULL || PyDict_SetItemString(d, phase_names[k], t) < 0) Py_CLEAR(d);
        Py_XDECREF(t);
        prof_acc[k] = 0, prof_cnt[k] = 0;
    }
    prof_on = v;
    return d;
}

static int intern_all(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    I(s_primitive, "primitive") I(s_kw, "kw") I(s_tape, "tape") I(s_shape, "shape")
    I(s_outputs, "outputs") I(s_inputs, "inputs") I(s_data, "data") I(s_launches, "launches")
    I(s_cuda, "cuda") I(s_strides, "strides") I(s_gen, "gen") I(s_dtypes, "dtypes")
    I(s_order, "order") I(s_C, "C") I(s_dtype, "dtype") I(s_np, "np") I(s_size, "size")
    I(s_packs, "packs") I(s_pack, "_pack") I(s_slots, "slots") I(s_ptr, "ptr")
    I(s_entry, "entry") I(s_hits, "hits") I(s_stream, "stream") I(s_index, "index")
    I(s_buffer, "buffer") I(s_node, "node") I(s_keep, "keep") I(s_recorded, "recorded")
    I(s_value, "value") I(s_cond, "_cond") I(s_acquire, "acquire") I(s_release, "release")
    I(s_notify_all, "notify_all") I(s__pending, "_pending") I(s__lock, "_lock")
    I(s_cache, "cache") I(s__by_size, "_by_size") I(s_active, "active") I(s_peak, "peak")
    I(s_policy, "policy") I(s_trim_after_malloc, "trim_after_malloc")
    I(s_pool_size, "pool_size") I(s_cache_limit, "cache_limit") I(s__evict, "_evict")
    I(s_raw, "raw") I(s_free, "free") I(s_event, "event") I(s__active, "_active")
    I(s_enabled, "enabled") I(s_defn, "defn") I(s_takes_runtime, "takes_runtime")
    I(s__owner, "_owner") I(s_recycle_if_fits, "recycle_if_fits") I(s_lane, "lane")
    I(s_popleft, "popleft") I(s_append, "append") I(s__sizes, "_sizes") I(s__lru, "_lru")
    I(s__seq, "_seq") I(s__release, "_release")
#undef I
    return 0;
}

/* the configured allocator's pending frees (CudaAllocator._pending, made in its __init__)
 * and the allocator's own malloc / free steps (kernels/_handle.c AllocatorBase: the one copy
 * of the buffer cache's hot steps, which every backend's allocator runs) */
static PyObject *alloc_pending = NULL, *cfg_base_malloc = NULL, *cfg_base_free = NULL;

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
                                        "python_free", "timeline", "base_malloc",
                                        "base_free"};
    static PyObject **const slots[] = {&cfg_array_type, &cfg_generation, &cfg_work,
                                       &cfg_work_lock, &cfg_unfinished, &cfg_streams,
                                       &cfg_handle_type, &cfg_alloc, &cfg_host_wait,
                                       &cfg_timing_pending, &cfg_timing_flush,
                                       &cfg_python_free, &cfg_timeline, &cfg_base_malloc,
                                       &cfg_base_free};
    if (take_config(kw, "configure", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    Py_XSETREF(alloc_pending, PyObject_GetAttr(cfg_alloc, s__pending));
    if (alloc_pending == NULL) return NULL;
    cu_launch = NULL;
    cu_stream_query = NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); /* only if CuPy loaded it */
    if (lib != NULL) {
        cu_launch = (cu_launch_t)dlsym(lib, "cuLaunchKernel");
        cu_stream_query = (cu_query_t)dlsym(lib, "cuStreamQuery");
        cu_error_name = (cu_error_name_t)dlsym(lib, "cuGetErrorName");
        cu_write_value = (cu_write_value_t)dlsym(lib, "cuStreamWriteValue32_v2");
        if (cu_write_value == NULL) cu_write_value = (cu_write_value_t)dlsym(lib, "cuStreamWriteValue32");
        cu_host_alloc = (cu_host_alloc_t)dlsym(lib, "cuMemHostAlloc");
        cu_host_device_ptr = (cu_host_device_ptr_t)dlsym(lib, "cuMemHostGetDevicePointer_v2");
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

/* events.host_wait for a CUDA stream, with the GIL released: the completion word read
 * until it reaches ``seq`` (when there is one), else the driver's cuStreamQuery polled; for
 * up to 200 us, then the Python wait (sleeps between polls) */
static int host_wait(PyObject *cs, void *stream, Py_ssize_t slot, uint32_t seq) {
    double end = now_s() + 200e-6;
    int rc = CUDA_ERROR_NOT_READY;
    Py_BEGIN_ALLOW_THREADS
    if (seq != 0) {
        do {
            if ((int32_t)(word_host[slot] - seq) >= 0) rc = 0;
        } while (rc != 0 && now_s() < end);
    }
    if (rc != 0) {
        do {
            rc = cu_stream_query(stream);
        } while (rc == CUDA_ERROR_NOT_READY && now_s() < end);
    }
    Py_END_ALLOW_THREADS
    if (seq != 0 && rc == 0) waits_by_word++;
    else waits_by_query++;
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

/* A buffer of the allocator for ``nbytes`` (a new reference): CudaAllocator.malloc, whose
 * usual case (no frees pending on the device) is the allocator's own malloc
 * (Allocator.malloc: kernels/_handle.c's, the cache's reuse in C) */
static PyObject *lane_malloc(long long nbytes) {
    Py_ssize_t npend = PyObject_Length(alloc_pending);
    if (npend < 0) return NULL;
    PyObject *size = PyLong_FromLongLong(nbytes);
    if (size == NULL) return NULL;
    PyObject *buf = npend != 0 ? PyObject_CallMethod(cfg_alloc, "malloc", "O", size)
                               : PyObject_CallFunctionObjArgs(cfg_base_malloc, cfg_alloc, size, NULL);
    Py_DECREF(size);
    return buf;
}

/* CudaAllocator.free(buf), installed as the allocator's ``free`` (what a BufferHandle calls
 * when its last array goes): with every GPU stream seen finished (no event to record), the
 * allocator's own free (Allocator.free: kernels/_handle.c's); anything else is the Python
 * method. */
static PyObject *lane_free(PyObject *self, PyObject *buf) {
    PH0();
    if (cfg_python_free == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_lane.free: not configured");
        return NULL;
    }
    PyObject *r = configured && PySet_GET_SIZE(cfg_unfinished) == 0
                      ? PyObject_CallFunctionObjArgs(cfg_base_free, cfg_alloc, buf, NULL)
                      : PyObject_CallFunctionObjArgs(cfg_python_free, cfg_alloc, buf, NULL);
    PH(PH_FREE);
    return r;
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
/* a new event of the backend for the stream ``index`` (CudaEvent(index)): the spare one
 * made while the last call's kernel ran when it is this stream's, else made now */
static PyObject *spare_event = NULL, *spare_index = NULL;

static PyObject *new_event(PyObject *index) {
    PyObject *ev = spare_event, *si = spare_index;
    spare_event = spare_index = NULL;
    if (ev != NULL) {
        int same = si == index || PyObject_RichCompareBool(si, index, Py_EQ) == 1;
        PyErr_Clear();
        Py_DECREF(si);
        if (same) return ev;
        Py_DECREF(ev);
    }
    return PyObject_CallOneArg(ec_event_type, index);
}

static void make_spare_event(PyObject *index) {
    if (spare_event != NULL || ec_event_type == NULL) return;
    spare_event = PyObject_CallOneArg(ec_event_type, index);
    if (spare_event == NULL) PyErr_Clear(); /* (made at the claim instead) */
    else spare_index = Py_NewRef(index);
}

static int claim(PyObject *node, PyObject *index, PyObject **ev) {
    *ev = new_event(index);
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

/* What run_fused reads of a Launch (compiled.Launch), read once and kept in its ``lane``
 * slot (a capsule): the kernel, grid and block, the argument slots, the output's dtype,
 * shape and size, the cache entry, and this thread's argument pack. Only a plan with one
 * C-order output gets one (Launch.takes); the Python path runs the others. */
typedef struct {
    void *fn;
    unsigned grid, block;
    Py_ssize_t n_out_at, word_at, nslots, si[MAX_INPUTS], sj[MAX_INPUTS];
    long long nbytes;
    PyObject *gen, *npdt, *shape, *entry, *packs; /* strong references */
    unsigned long tid; /* the thread whose pack ``ptrs`` is (ln.packs keeps it) */
    uint64_t **ptrs;
} LaunchRecord;

#define RECORD_NAME "tapescope.kernels.cuda._lane.LaunchRecord"

static void record_release(LaunchRecord *r) {
    Py_XDECREF(r->gen); Py_XDECREF(r->npdt); Py_XDECREF(r->shape); Py_XDECREF(r->entry);
    Py_XDECREF(r->packs);
    PyMem_Free(r);
}

static void record_free(PyObject *capsule) {
    LaunchRecord *r = PyCapsule_GetPointer(capsule, RECORD_NAME);
    if (r == NULL) { PyErr_Clear(); return; }
    record_release(r);
}

static int as_long(PyObject *o, const char *attr, long long *out) {
    PyObject *v = PyObject_GetAttrString(o, attr);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* The record of ``ln``: made on its first use; NULL with no error set when the plan is not
 * the plain case (several outputs, not C order), NULL with an error on failure. */
static LaunchRecord *launch_record(PyObject *ln) {
    PyObject *cap = PyObject_GetAttr(ln, s_lane);
    if (cap == NULL) return NULL;
    if (cap != Py_None) {
        LaunchRecord *r = cap == Py_False ? NULL : PyCapsule_GetPointer(cap, RECORD_NAME);
        Py_DECREF(cap); /* ln keeps it */
        return r;
    }
    Py_DECREF(cap);
    LaunchRecord *r = PyMem_Calloc(1, sizeof(LaunchRecord));
    if (r == NULL) { PyErr_NoMemory(); return NULL; }
    PyObject *dtypes = PyObject_GetAttr(ln, s_dtypes);
    PyObject *order = dtypes ? PyObject_GetAttr(ln, s_order) : NULL;
    PyObject *slots = order ? PyObject_GetAttr(ln, s_slots) : NULL;
    int plain = slots != NULL && PyList_Check(dtypes) && PyList_GET_SIZE(dtypes) == 1 &&
                PyUnicode_Check(order) && PyUnicode_Compare(order, s_C) == 0 &&
                PyTuple_Check(slots) && PyTuple_GET_SIZE(slots) <= MAX_INPUTS;
    long long v;
    int err = slots == NULL;
    if (plain) {
        r->npdt = Py_NewRef(PyList_GET_ITEM(dtypes, 0));
        r->nslots = PyTuple_GET_SIZE(slots);
        for (Py_ssize_t k = 0; k < r->nslots && !err; k++) {
            PyObject *ij = PyTuple_GET_ITEM(slots, k);
            r->si[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ij, 0));
            r->sj[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ij, 1));
            err = PyErr_Occurred() != NULL || r->si[k] < 0;
        }
        if (!err) err = (r->gen = PyObject_GetAttr(ln, s_gen)) == NULL ||
                        (r->shape = PyObject_GetAttr(ln, s_shape)) == NULL ||
                        (r->entry = PyObject_GetAttr(ln, s_entry)) == NULL ||
                        (r->packs = PyObject_GetAttr(ln, s_packs)) == NULL ||
                        !PyTuple_Check(r->shape) || !PyDict_Check(r->packs);
        if (!err) err = as_long(ln, "fn_ptr", &v) < 0 || (r->fn = (void *)(intptr_t)v, 0) ||
                        as_long(ln, "grid", &v) < 0 || (r->grid = (unsigned)v, 0) ||
                        as_long(ln, "block", &v) < 0 || (r->block = (unsigned)v, 0) ||
                        as_long(ln, "n_out_at", &v) < 0 || (r->n_out_at = (Py_ssize_t)v, 0) ||
                        as_long(ln, "word_at", &v) < 0 || (r->word_at = (Py_ssize_t)v, 0);
        if (!err) { /* the output's bytes: its shape times the dtype's itemsize */
            err = as_long(r->npdt, "itemsize", &r->nbytes) < 0;
            for (Py_ssize_t i = 0; !err && i < PyTuple_GET_SIZE(r->shape); i++) {
                r->nbytes *= PyLong_AsLongLong(PyTuple_GET_ITEM(r->shape, i));
                err = PyErr_Occurred() != NULL;
            }
            if (!err && r->nbytes <= 0) plain = 0; /* (an empty output: the Python path) */
        }
    }
    Py_XDECREF(dtypes); Py_XDECREF(order); Py_XDECREF(slots);
    PyObject *kept;
    if (err || !plain) {
        record_release(r);
        if (err) return NULL;
        r = NULL;
        kept = Py_NewRef(Py_False); /* not the plain case: remembered too */
    } else {
        kept = PyCapsule_New(r, RECORD_NAME, record_free);
        if (kept == NULL) {
            record_release(r);
            return NULL;
        }
    }
    int rc = PyObject_SetAttr(ln, s_lane, kept);
    Py_DECREF(kept); /* ln keeps it (and with it the record) */
    if (rc < 0) return NULL;
    return r;
}

/* This thread's argument pack of ``ln`` (Launch.packs, else Launch._pack): its array of
 * pointers to the slots; the record remembers the last thread's */
static uint64_t **thread_pack(PyObject *ln, LaunchRecord *r) {
    unsigned long tid = PyThread_get_thread_ident();
    if (r->ptrs != NULL && r->tid == tid) return r->ptrs;
    PyObject *key = PyLong_FromUnsignedLong(tid);
    if (key == NULL) return NULL;
    PyObject *pack = PyDict_GetItemWithError(r->packs, key);
    Py_DECREF(key);
    if (pack != NULL) Py_INCREF(pack);
    else if (PyErr_Occurred() || (pack = PyObject_CallMethodNoArgs(ln, s_pack)) == NULL) return NULL;
    uint64_t **ptrs = NULL;
    if (!PyTuple_Check(pack) || PyTuple_GET_SIZE(pack) != 3)
        PyErr_SetString(PyExc_TypeError, "a launch pack is (slots, pointers, address)");
    else
        ptrs = (uint64_t **)PyLong_AsVoidPtr(PyTuple_GET_ITEM(pack, 2));
    Py_DECREF(pack); /* ln.packs keeps it */
    if (ptrs == NULL) return NULL;
    r->tid = tid;
    r->ptrs = ptrs;
    return ptrs;
}

/* What the lane reads of a primitive, fixed for its life (its stream's index and owner,
 * its definition's takes_runtime, the output shape of a Compiled's kw, its tape's launch
 * table): read once for the last primitive seen (the common case is one compiled function
 * called again and again), else read again. */
static struct {
    PyObject *prim, *index, *owner, *shape, *launches;
    int takes_runtime;
} pf;

static void facts_clear(void) {
    Py_CLEAR(pf.prim); Py_CLEAR(pf.index); Py_CLEAR(pf.owner); Py_CLEAR(pf.shape);
    Py_CLEAR(pf.launches);
}

/* 1: pf holds ``prim``'s facts; 0: not a primitive the lane runs (no error set) */
static int prim_facts(PyObject *prim) {
    if (prim == pf.prim) return 1;
    facts_clear();
    PyObject *defn = get(prim, s_defn);
    PyObject *tr = defn ? get(defn, s_takes_runtime) : NULL;
    PyObject *kw = tr ? get(prim, s_kw) : NULL;
    PyObject *tape = kw && PyDict_Check(kw) ? PyDict_GetItemWithError(kw, s_tape) : NULL;
    PyObject *shape = tape ? PyDict_GetItemWithError(kw, s_shape) : NULL;
    PyObject *stream = shape ? get(prim, s_stream) : NULL;
    PyObject *index = stream ? get(stream, s_index) : NULL;
    PyObject *owner = index ? get(stream, s__owner) : NULL;
    PyObject *launches = owner ? get(tape, s_launches) : NULL;
    int ok = launches != NULL && PyDict_Check(launches) && PyLong_Check(index) &&
             (owner == Py_None || PyLong_Check(owner));
    if (ok) {
        pf.prim = Py_NewRef(prim);
        pf.takes_runtime = tr == Py_True;
        pf.shape = Py_NewRef(shape), pf.index = Py_NewRef(index), pf.owner = Py_NewRef(owner);
        pf.launches = Py_NewRef(launches);
    }
    PyErr_Clear();
    Py_XDECREF(defn); Py_XDECREF(tr); Py_XDECREF(kw); Py_XDECREF(stream); Py_XDECREF(index);
    Py_XDECREF(owner); Py_XDECREF(launches);
    return ok;
}

/* A loaded fused call on a GPU stream, run and waited for: 1 done, 0 not the plain case
 * (nothing touched), -1 error (the node left unevaluated, its event signalled). ``ev_in``:
 * the eval's event with node.event already set (``_eval_one``), or NULL: claim the node. */
static int run_fused(PyObject *node, PyObject *ev_in) {
    int result = 0;
    PyObject *ev = ev_in;
    int claimed = 0;
    /* every reference below is released at "out" */
    PyObject *prim = NULL, *shape, *outputs = NULL, *inputs = NULL,
             *index = NULL, *launches = NULL, *key = NULL, *ln = NULL, *target = NULL,
             *tdtype = NULL, *npdt = NULL, *tshape = NULL, *buf = NULL, *outv = NULL,
             *handle = NULL, *keep = NULL, *w = NULL, *cs = NULL, *raw = NULL;
    LaunchRecord *rec = NULL; /* borrowed: the capsule in ln.lane */
    PyObject *data[MAX_INPUTS];
    Py_ssize_t n = 0;
    long gen_after = -1;

    PH(PH_CHECKS);
    keep = get(node, s_keep);
    if (keep == NULL || keep != Py_False) goto out; /* a tracer's node keeps its inputs */
    prim = get(node, s_primitive);
    if (prim == NULL || !prim_facts(prim)) goto out;
    shape = pf.shape; /* (the primitive keeps it) */
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
    index = Py_NewRef(pf.index);
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
    launches = Py_NewRef(pf.launches);
    PyObject *arrays = PyDict_GetItemWithError(launches, s_cuda);
    if (arrays == NULL || !PyTuple_Check(arrays)) { PyErr_Clear(); goto out; }
    key = launch_key(arrays, shape, data, n);
    if (key == NULL) { PyErr_Clear(); goto out; }
    ln = PyDict_GetItemWithError(launches, key);
    if (ln == NULL) { PyErr_Clear(); goto out; }
    Py_INCREF(ln);
    rec = launch_record(ln);
    if (rec == NULL) { PyErr_Clear(); goto out; }
    if (rec->gen != PyList_GET_ITEM(cfg_generation, 0) &&
        PyObject_RichCompareBool(rec->gen, PyList_GET_ITEM(cfg_generation, 0), Py_EQ) != 1) {
        PyErr_Clear();
        goto out;
    }
    /* the output: of the plan's dtype and shape (Launch.takes; the record is of a plan
     * with one C-order output) */
    target = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
    if (target == NULL || target == Py_None) { PyErr_Clear(); target = NULL; goto out; }
    Py_INCREF(target);
    tdtype = get(target, s_dtype);
    tshape = get(target, s_shape);
    npdt = tdtype ? get(tdtype, s_np) : NULL;
    if (!npdt || !tshape) goto out;
    if ((npdt != rec->npdt && PyObject_RichCompareBool(npdt, rec->npdt, Py_EQ) != 1) ||
        (tshape != rec->shape && PyObject_RichCompareBool(tshape, rec->shape, Py_EQ) != 1)) {
        PyErr_Clear();
        goto out;
    }
    long long nbytes = rec->nbytes;
    PH(PH_PLAN);
    if (ev == NULL) {
        int c = claim(node, index, &ev);
        if (c <= 0) { result = c; goto out; }
        claimed = 1;
    }
    /* from here on the call is ours: errors propagate */
    result = -1;
    PH(PH_CLAIM);
    buf = lane_malloc(nbytes);
    if (buf == NULL) goto out;
    PH(PH_MALLOC);
    /* Launch.call: this thread's argument slots, the pointers written in */
    uint64_t **ptrs = thread_pack(ln, rec);
    if (ptrs == NULL) goto out;
    uint64_t *vals = ptrs[0]; /* pointer i points at slot i: slot 0 is the array's start */
    for (Py_ssize_t k = 0; k < rec->nslots; k++) {
        Py_ssize_t i = rec->si[k];
        if (i >= n) { PyErr_SetString(PyExc_IndexError, "launch slot"); goto out; }
        PyObject *mp = PyObject_GetAttr(data[i], s_data);
        PyObject *p = mp ? PyObject_GetAttr(mp, s_ptr) : NULL;
        Py_XDECREF(mp);
        if (p == NULL) goto out;
        vals[rec->sj[k]] = (uint64_t)PyLong_AsUnsignedLongLong(p);
        Py_DECREF(p);
    }
    /* the output's pointer: the buffer's start (its typed view, made after the launch,
     * starts there: Buffer.view) */
    raw = PyObject_GetAttr(buf, s_raw);
    PyObject *omp = raw ? PyObject_GetAttr(raw, s_data) : NULL;
    PyObject *outptr = omp ? PyObject_GetAttr(omp, s_ptr) : NULL;
    Py_XDECREF(omp);
    if (outptr == NULL) goto out;
    vals[rec->n_out_at] = (uint64_t)PyLong_AsUnsignedLongLong(outptr);
    Py_DECREF(outptr);
    if (PyErr_Occurred()) goto out;
    PyObject *sp = PyObject_GetAttr(cs, s_ptr);
    if (sp == NULL) goto out;
    void *st = PyLong_AsVoidPtr(sp);
    Py_DECREF(sp);
    if (PyErr_Occurred()) goto out;
    /* CudaBackend.launch_fused: the launch inside the stream's work record */
    PH(PH_POINTERS);
    Py_ssize_t slot = PyLong_AsSsize_t(index);
    if (slot < 0) PyErr_Clear();
    uint32_t seq = 0; /* the completion word's value after our kernel (0: none) */
    /* device.enter_work and leave_work at once: the launch is made holding the lock and the
     * GIL (no Python code runs in between), so nobody sees it running: the stream's
     * generation moves on and the stream is unfinished */
    if (lock(cfg_work_lock) < 0) goto out;
    /* one block: the kernel writes the completion word itself; else the stream does */
    int by_kernel = rec->grid == 1 && (seq = next_word_value(slot)) != 0;
    vals[rec->word_at] = by_kernel ? word_dev + sizeof(uint32_t) * (unsigned long long)slot : 0;
    vals[rec->word_at + 1] = seq;
    int lrc = cu_launch(rec->fn, rec->grid, 1, 1, rec->block, 1, 1, 0, st, (void **)ptrs, NULL);
    /* the launch copied the arguments: the pack's word goes back to null for this thread's
     * next launch through Launch.call (which writes only the pointers) */
    vals[rec->word_at] = vals[rec->word_at + 1] = 0;
    int ok = lrc == 0;
    if (ok) {
        if (!by_kernel) seq = word_after_launch(st, slot);
        ok = PySet_Add(cfg_unfinished, index) == 0 && bump(w, 0, +1) == 0;
        gen_after = PyLong_AsLong(PyList_GET_ITEM(w, 0));
    }
    else cuda_error("cuLaunchKernel", lrc);
    unlock(cfg_work_lock);
    if (!ok || PyErr_Occurred()) goto out;
    PH(PH_LAUNCH);
    /* while the kernel runs: the buffer's handle (from here it frees the buffer), its typed
     * view (CudaBuffer.view), the kernel cache's hit, the next claim's event */
    handle = PyObject_CallFunctionObjArgs(cfg_handle_type, buf, cfg_alloc, NULL);
    if (handle == NULL) goto out;
    PH(PH_HANDLE);
    outv = PyObject_CallMethod(buf, "view", "LOO", nbytes, npdt, tshape);
    if (outv == NULL) goto out;
    PH(PH_VIEW);
    if (set_attr_hits(rec->entry) < 0) goto out;
    if (claimed) make_spare_event(index);
    PH(PH_HITS);
    /* CudaEvent.wait on the host, for the whole stream (its work done: no event to record);
     * the stream has finished unless somebody enqueued more since our launch */
    if (host_wait(cs, st, slot, seq) < 0) goto out;
    PH(PH_WAIT);
    if (stream_finished(index, w, gen_after) < 0) goto out;
    PH(PH_FINISHED);
    /* then set_data and detach (not before: a thread that sees the output without a node
     * reads it at once; until then it waits for the event), and the signal */
    if (PyObject_SetAttr(target, s_data, outv) < 0 || PyObject_SetAttr(target, s_buffer, handle) < 0 ||
        PyObject_SetAttr(target, s_node, Py_None) < 0)
        goto out;
    PyObject *empty = PyList_New(0);
    if (empty == NULL) goto out;
    int rc = PyObject_SetAttr(node, s_inputs, empty);
    Py_DECREF(empty);
    PH(PH_DETACH);
    if (rc < 0 || signal_done(ev) < 0) goto out;
    PH(PH_SIGNAL);
    if (PyList_Check(cfg_timing_pending) && PyList_GET_SIZE(cfg_timing_pending)) {
        PyObject *fr = PyObject_CallNoArgs(cfg_timing_flush);
        if (fr == NULL) goto out;
        Py_DECREF(fr);
    }
    result = 1;
    PH(PH_TIMING);
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
    Py_XDECREF(index); Py_XDECREF(launches); Py_XDECREF(key);
    Py_XDECREF(target); Py_XDECREF(tdtype); Py_XDECREF(npdt); Py_XDECREF(tshape);
    Py_XDECREF(buf); Py_XDECREF(outv); Py_XDECREF(handle); Py_XDECREF(w); Py_XDECREF(cs);
    Py_XDECREF(raw);
    Py_XDECREF(ln); /* (after rec's last use: ln keeps the record) */
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
    PH0();
    return as_bool(run_fused(args[0], args[1]));
}

/* eval_one(desc) -> bool: ``mx.eval`` of one array whose node is such a call, from its
 * first line (scheduling.evaluate): what _eval_one checks (no transformation running, the
 * timeline off, the node unscheduled, its stream this thread's with no worker, on this
 * backend), then the node claimed and run. False: the Python path evaluates it. */
static PyObject *eval_one(PyObject *self, PyObject *desc) {
    if (!configured || !eval_configured) Py_RETURN_FALSE;
    PH0();
    PyObject *node = NULL, *prim = NULL, *index = NULL, *v = NULL;
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
    if (prim == NULL || !prim_facts(prim) || !pf.takes_runtime) goto out;
    /* the stream any thread's, or this one's: check_thread */
    if (pf.owner != Py_None && PyLong_AsUnsignedLong(pf.owner) != PyThread_get_thread_ident()) goto out;
    index = Py_NewRef(pf.index);
    if (PyDict_GetItemWithError(ec_by_stream, index) != ec_backend) { PyErr_Clear(); goto out; }
    if (PyDict_GetItemWithError(ec_workers, index) != NULL || PyErr_Occurred()) {
        PyErr_Clear();
        goto out;
    }
    r = run_fused(node, NULL);
out:
    if (r == 0) PyErr_Clear(); /* a check that could not be read: the Python path */
    Py_XDECREF(node); Py_XDECREF(prim); Py_XDECREF(index); Py_XDECREF(v);
    return as_bool(r);
}

/* stats() -> how the lane's host waits ended: by the completion word or by polling */
static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:s,s:L,s:L}", "completion_word",
                         word_state == 1 ? "on" : word_state == 0 ? "not made" : "off",
                         "waits_by_word", waits_by_word, "waits_by_query", waits_by_query);
}

/* use_completion_word(on): whether host waits read the completion word (True, the
 * default) or poll the stream (for comparing the two; the word stays made) */
static PyObject *use_completion_word(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    word_wanted = v;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use_completion_word", (PyCFunction)use_completion_word, METH_O,
     "use_completion_word(on): host waits read the completion word (default) or poll"},
    {"stats", (PyCFunction)stats, METH_NOARGS,
     "stats() -> {completion_word, waits_by_word, waits_by_query}"},
    {"configure", (PyCFunction)configure, METH_O, "Hand over the runtime's objects (a dict)."},
    {"configure_eval", (PyCFunction)configure_eval, METH_O,
     "Hand over core's scheduling objects (a dict) for eval_one."},
    {"eval_fused", (PyCFunction)(void (*)(void))eval_fused, METH_FASTCALL,
     "eval_fused(node, ev) -> bool: run a loaded fused call of a GPU stream and wait for it."},
    {"free", (PyCFunction)lane_free, METH_O,
     "free(buf): CudaAllocator.free of the configured allocator, its usual case in C."},
    {"profile", (PyCFunction)profile, METH_O,
     "profile(on) -> {phase: (seconds, count)} since the last call; on: keep summing"},
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
