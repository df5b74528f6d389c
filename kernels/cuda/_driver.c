/* The CUDA backend's launch and wait in C, for the one eval loop (kernels/_device_api.h).
 *
 * What a small fused call costs on the device is the launch and the host's wait; done from
 * Python (CuPy's ``launchKernel`` binding converts every argument, ~1 us; ``Event.done``
 * ~1.4 us a poll; the covering event's record ~2.4 us) they were most of a 16-element call.
 * MLX makes both in C++ (mlx/backend/cuda/compiled.cpp Compiled::eval_gpu launches with
 * cuLaunchKernel; mlx/backend/cuda/event.cu's SharedEvent is a word in host-visible memory
 * the GPU writes and the host spins on). Here, through the driver's own entry points, from
 * the libcuda CuPy loaded (dlopen("libcuda.so.1", RTLD_NOLOAD) at configure: nothing is
 * linked, and without a loaded driver, as with the tests' stand-in CuPy, ``configure``
 * returns None and the loop calls the Python hooks):
 *
 * - launch: the plan's (compiled.Launch's) kernel, grid, block and argument slots read once
 *   into a record kept in its ``lane`` slot (a capsule); this thread's argument pack
 *   (Launch._pack) gets the inputs' and the output's device pointers; cuLaunchKernel on the
 *   mx stream's CUDA stream, inside the stream's work record (device.enter_work and
 *   leave_work at once: made holding the work lock and the GIL, nobody sees it running);
 *   the kernel cache's hit counted as Launch.call counts it. A plan of several launches
 *   (primitive_plans.PlanSequence: a two-pass column or all reduction) has its later
 *   launches' records too (``then``), issued in order in the same work record; slots of
 *   input index -1 take the plan's scratch buffer on this CUDA stream (``scratch_for``,
 *   asked when the stream is not the last one's). While the timeline records,
 *   the backend's timing bracket (``launch_start`` / ``launch_end``) surrounds it: the same
 *   launch either way.
 * - wait: the stream writes the next value of a counter into its completion word (a word
 *   per stream index in a page of pinned host memory mapped for the device,
 *   cuStreamWriteValue32) and the host spins on the word with the GIL released, up to
 *   200 us, then polls cuStreamQuery between 20 us sleeps (events.host_wait's schedule).
 *   Without the word (no entry point, the page not made) it polls cuStreamQuery. Measured
 *   on the H200's host in C, a 16-element kernel from launch to seen finished: 9.1-10.0 us
 *   polling cuStreamQuery, 8.5 by the stream's write. The stream is then noted finished
 *   (device.note_finished's check: nothing enqueued since the write), the timing records
 *   flushed (timing.flush) and, while the timeline records, the wait recorded. Then the
 *   deferred bounds check: the stream's record (cuda/bounds.py, mapped pinned memory the
 *   gather / scatter kernels write an index out of bounds into) read, and where it holds
 *   one, bounds.check raises numpy's IndexError from the wait (no read-back at launch).
 * - a GEMM plan's launch (cuda/gemm.py GemmPlan: its ``cublas`` words read once into a
 *   record kept in its ``lane`` slot, as a kernel's): cublasSetStream_v2 and
 *   cublasGemmStridedBatchedEx on the mx stream's CUDA stream with CuPy's handle for this
 *   thread (cupy.cuda.device.get_cublas_handle, asked once per thread), from the libcublas
 *   CuPy's binding links (dlsym through the binding module's own handle, so its dependency,
 *   never a second cuBLAS; else the one libcublas.so loaded in the process), inside the
 *   stream's work record as a kernel's launch; the compute type TF32 only where the plan's
 *   dtype takes it and the ``tf32`` switch (a list kept by settings.watch) is on. AddMM's
 *   ``c`` is first copied into the output by its copy plan (a one-op kernel, launched here
 *   as any other) for the GEMM's beta. MLX's Matmul::eval_gpu calls cuBLAS(Lt) from C++
 *   (mlx/backend/cuda/gemms/cublas_gemm.cpp); no cuBLAS is linked to build this.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../_device_api.h"

typedef int (*cu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, void *, void **, void **);
typedef int (*cu_query_t)(void *);
typedef int (*cu_error_name_t)(int, const char **);
typedef int (*cu_write_value_t)(void *, unsigned long long, unsigned, unsigned);
typedef int (*cu_host_alloc_t)(void **, size_t, unsigned);
typedef int (*cu_host_device_ptr_t)(unsigned long long *, void *, unsigned);
static cu_launch_t cu_launch;
static cu_query_t cu_stream_query;
static cu_error_name_t cu_error_name;
static cu_write_value_t cu_write_value;
static cu_host_alloc_t cu_host_alloc;
static cu_host_device_ptr_t cu_host_device_ptr;
/* cuBLAS (cublas_api.h), resolved at the first GEMM launch */
typedef int (*cublas_gemm_t)(void *, int, int, int, int, int, const void *, const void *, int,
                             int, long long, const void *, int, int, long long, const void *,
                             void *, int, int, long long, int, int, int);
typedef int (*cublas_set_stream_t)(void *, void *);
static cublas_gemm_t cublas_gemm;
static cublas_set_stream_t cublas_set_stream;
static int cublas_state = 0; /* 0 not looked for yet, 1 found, -1 not there (Python path) */
static long long gemms = 0;
static int cublas_wanted = 1; /* use_cublas(False): GEMM plans declined (the Python hook) */
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_INITIALIZED 3

#define WORDS 1024
static volatile uint32_t *word_host; /* the page, as the host reads it */
static unsigned long long word_dev;  /* the page, as the device writes it */
static int word_state = 0;           /* 0 not made yet, 1 in use, -1 off */
static int word_tries = 0;           /* (made on a thread with the context current) */
static uint32_t word_seq = 0;        /* the last value written */
static int word_wanted = 1;          /* use_completion_word(False): poll instead */
static long long waits_by_word = 0, waits_by_query = 0, launches = 0;

/* configure's objects (device.py's and timing's, kept for the process's life) */
static PyObject *c_streams, *c_work, *c_work_of, *c_work_lock, *c_unfinished, *c_timeline,
    *c_timing_pending, *c_timing_flush, *c_launch_start, *c_launch_end, *c_wait_record, *c_now,
    *c_bounds, *c_bounds_check;
/* (optional) CuPy's cuBLAS handle getter, the binding module's file, the TF32 switch's list */
static PyObject *c_cublas_handle, *c_cublas_module, *c_tf32;
static int configured = 0;
static PyObject *s_values;
static PyObject *s_then, *s_scratch_for, *s_cublas, *s_copy;
static PyObject *s_lane, *s_dtypes, *s_order, *s_slots, *s_gen, *s_shape, *s_entry, *s_packs,
    *s_pack, *s_hits, *s_data, *s_ptr, *s_dtype, *s_C, *s_enabled, *s_acquire, *s_release;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cuda_error(const char *call, int rc) {
    const char *name = "unknown";
    if (cu_error_name != NULL) cu_error_name(rc, &name);
    PyErr_Format(PyExc_RuntimeError, "[cuda] %s failed: %s (%d)", call, name, rc);
    return -1;
}

/* (the work lock's acquire and release, bound once at configure: no method lookup a call) */
static PyObject *c_lock_acquire, *c_lock_release;

static int lock(PyObject *l) {
    PyObject *r = l == c_work_lock && c_lock_acquire != NULL ? PyObject_CallNoArgs(c_lock_acquire)
                                                              : PyObject_CallMethodNoArgs(l, s_acquire);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static void unlock(PyObject *l) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* released even while an error is set */
    PyObject *r = l == c_work_lock && c_lock_release != NULL ? PyObject_CallNoArgs(c_lock_release)
                                                              : PyObject_CallMethodNoArgs(l, s_release);
    if (r == NULL) PyErr_Clear();
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

static int recording(void) {
    PyObject *e = PyObject_GetAttr(c_timeline, s_enabled);
    int on = e == Py_True;
    Py_XDECREF(e);
    if (e == NULL) PyErr_Clear();
    return on;
}

/* the stream's CUDA stream (device._streams[index].ptr), or NULL: none made (no error) */
static PyObject *last_cs; /* (strong: the last CUDA stream object read, and its pointer) */
static void *last_st;

static void *stream_ptr(PyObject *index) {
    PyObject *cs = PyDict_GetItemWithError(c_streams, index);
    if (cs == NULL) { PyErr_Clear(); return NULL; }
    if (cs == last_cs) return last_st; /* (a CuPy stream's pointer is fixed for its life) */
    PyObject *p = PyObject_GetAttr(cs, s_ptr);
    void *st = p ? PyLong_AsVoidPtr(p) : NULL;
    Py_XDECREF(p);
    if (PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    Py_XSETREF(last_cs, Py_NewRef(cs));
    last_st = st;
    return st;
}

/* the stream's [generation, running, index] record (device.work), borrowed from _work */
static PyObject *work_of(PyObject *index) {
    PyObject *w = PyDict_GetItemWithError(c_work, index);
    if (w == NULL && !PyErr_Occurred()) {
        PyObject *r = PyObject_CallOneArg(c_work_of, index);
        Py_XDECREF(r); /* (_work keeps it) */
        if (r != NULL) w = PyDict_GetItemWithError(c_work, index);
    }
    if (w != NULL && (!PyList_CheckExact(w) || PyList_GET_SIZE(w) != 3)) {
        PyErr_SetString(PyExc_TypeError, "a stream's work record is [generation, running, index]");
        return NULL;
    }
    return w;
}

/* -- the launch --------------------------------------------------------------------------
 * What launch reads of a plan (compiled.Launch), once, kept in its ``lane`` slot: a plan
 * whose outputs are written in C or F order (Launch.takes; a fused tape's several outputs,
 * one word each from n_out_at, as Launch.call writes them); False remembers the others. */
#define MAX_SLOTS 64
#define MAX_OUTS 24 /* a fused tape's outputs (codegen/tape.py MAX_COMPILE_ARRAYS at most) */
#define MAX_THEN 4 /* later launches of a sequence */
#define SCRATCH -1 /* a slot's input index: the sequence's scratch buffer */
typedef struct Record Record;
struct Record {
    void *fn;
    unsigned grid, block;
    Py_ssize_t n_out_at, word_at, nslots, si[MAX_SLOTS], sj[MAX_SLOTS];
    Py_ssize_t nvalues, vi[MAX_SLOTS], vj[MAX_SLOTS], vsize[MAX_SLOTS]; /* by-value scalars */
    Py_ssize_t ndims, di[MAX_SLOTS], dax[MAX_SLOTS], dj[MAX_SLOTS]; /* sizes per call (dims) */
    PyObject *npdt, *shape, *entry, *packs; /* strong references */
    Py_ssize_t nouts;         /* its outputs (a fused tape's several: the words from n_out_at) */
    PyObject *npdts[MAX_OUTS]; /* their dtypes (strong; npdts[0] is npdt) */
    unsigned long tid; /* the thread whose pack ``ptrs`` is (packs keeps it) */
    uint64_t **ptrs;
    Py_ssize_t nthen;         /* a sequence's later launches (PlanSequence.then) */
    Record *then[MAX_THEN];   /* their records (each kept by its plan's lane) */
    PyObject *then_plans;     /* strong: the tuple of those plans */
    int scratch;              /* some launch's slot takes the scratch buffer */
    int forder;               /* it writes its output in column order (a transposed input's) */
    void *scratch_st;         /* the CUDA stream the scratch pointer is for */
    uint64_t scratch_ptr;
};
#define RECORD_NAME "tapescope.kernels.cuda._driver.Record"

static void record_release(Record *r) {
    for (Py_ssize_t j = 0; j < r->nouts; j++) Py_XDECREF(r->npdts[j]);
    Py_XDECREF(r->npdt); Py_XDECREF(r->shape); Py_XDECREF(r->entry); Py_XDECREF(r->packs);
    Py_XDECREF(r->then_plans);
    PyMem_Free(r);
}

static void record_free(PyObject *capsule) {
    Record *r = PyCapsule_GetPointer(capsule, RECORD_NAME);
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

/* the plan's record: NULL, no error, when it is not the plain case; ``cap``: its ``lane``
 * already read (borrowed), or NULL */
static Record *plan_record_of(PyObject *ln, PyObject *cap) {
    if (cap == NULL) {
        cap = PyObject_GetAttr(ln, s_lane);
        if (cap == NULL) { /* a plan without the slot: not ours */
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
            return NULL;
        }
        Py_DECREF(cap); /* ln keeps it */
    }
    if (cap != Py_None)
        return cap == Py_False ? NULL : PyCapsule_GetPointer(cap, RECORD_NAME);
    Record *r = PyMem_Calloc(1, sizeof(Record));
    if (r == NULL) { PyErr_NoMemory(); return NULL; }
    PyObject *dtypes = PyObject_GetAttr(ln, s_dtypes);
    PyObject *order = dtypes ? PyObject_GetAttr(ln, s_order) : NULL;
    PyObject *slots = order ? PyObject_GetAttr(ln, s_slots) : NULL;
    PyObject *values = slots ? PyObject_GetAttr(ln, s_values) : NULL;
    int err = values == NULL;
    int plain = !err && PyList_Check(dtypes) && PyList_GET_SIZE(dtypes) >= 1 &&
                PyList_GET_SIZE(dtypes) <= MAX_OUTS &&
                PyUnicode_Check(order) &&
                (PyUnicode_Compare(order, s_C) == 0 || PyUnicode_CompareWithASCIIString(order, "F") == 0) &&
                PyTuple_Check(slots) && PyTuple_GET_SIZE(slots) <= MAX_SLOTS &&
                PyTuple_Check(values) && PyTuple_GET_SIZE(values) <= MAX_SLOTS;
    long long v;
    if (plain) {
        r->npdt = Py_NewRef(PyList_GET_ITEM(dtypes, 0));
        r->nouts = PyList_GET_SIZE(dtypes);
        for (Py_ssize_t j = 0; j < r->nouts; j++) r->npdts[j] = Py_NewRef(PyList_GET_ITEM(dtypes, j));
        r->forder = PyUnicode_Compare(order, s_C) != 0;
        r->nslots = PyTuple_GET_SIZE(slots);
        for (Py_ssize_t k = 0; k < r->nslots && !err; k++) {
            PyObject *ij = PyTuple_GET_ITEM(slots, k);
            r->si[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ij, 0));
            r->sj[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ij, 1));
            err = PyErr_Occurred() != NULL || r->si[k] < SCRATCH;
            r->scratch |= r->si[k] == SCRATCH;
        }
        r->nvalues = err ? 0 : PyTuple_GET_SIZE(values);
        for (Py_ssize_t k = 0; k < r->nvalues && !err; k++) { /* (input, word, itemsize) */
            PyObject *v = PyTuple_GET_ITEM(values, k);
            r->vi[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(v, 0));
            r->vj[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(v, 1));
            r->vsize[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(v, 2));
            err = PyErr_Occurred() != NULL || r->vi[k] < 0 || r->vsize[k] < 1 || r->vsize[k] > 8;
        }
        PyObject *dims = err ? NULL : PyObject_GetAttrString(ln, "dims"); /* (KernelPlan.dims) */
        if (dims == NULL) PyErr_Clear();
        else if (!PyTuple_Check(dims) || PyTuple_GET_SIZE(dims) > MAX_SLOTS) err = 1;
        else r->ndims = PyTuple_GET_SIZE(dims);
        for (Py_ssize_t k = 0; !err && k < r->ndims; k++) { /* (input, axis, word, most) */
            PyObject *d = PyTuple_GET_ITEM(dims, k);
            err = !PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 4;
            if (err) break;
            r->di[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(d, 0));
            r->dax[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(d, 1));
            r->dj[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(d, 2));
            err = PyErr_Occurred() != NULL || r->di[k] < 0 || r->dax[k] < 0 || r->dj[k] < 0;
        }
        Py_XDECREF(dims);
        if (!err) err = (r->shape = PyObject_GetAttr(ln, s_shape)) == NULL ||
                        (r->entry = PyObject_GetAttr(ln, s_entry)) == NULL ||
                        (r->packs = PyObject_GetAttr(ln, s_packs)) == NULL ||
                        !PyTuple_Check(r->shape) || !PyDict_Check(r->packs);
        if (!err) err = as_long(ln, "fn_ptr", &v) < 0 || (r->fn = (void *)(intptr_t)v, 0) ||
                        as_long(ln, "grid", &v) < 0 || (r->grid = (unsigned)v, 0) ||
                        as_long(ln, "block", &v) < 0 || (r->block = (unsigned)v, 0) ||
                        as_long(ln, "n_out_at", &v) < 0 || (r->n_out_at = (Py_ssize_t)v, 0) ||
                        as_long(ln, "word_at", &v) < 0 || (r->word_at = (Py_ssize_t)v, 0);
        PyObject *then = err ? NULL : PyObject_GetAttr(ln, s_then);
        if (then == NULL && !err) { /* a single launch's plan: no ``then`` */
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
            else err = 1;
        } else if (then != NULL && then != Py_None) {
            plain = PyTuple_Check(then) && PyTuple_GET_SIZE(then) <= MAX_THEN;
            for (Py_ssize_t k = 0; plain && !err && k < PyTuple_GET_SIZE(then); k++) {
                Record *q = plan_record_of(PyTuple_GET_ITEM(then, k), NULL);
                if (q == NULL) { err = PyErr_Occurred() != NULL; plain = 0; break; }
                r->then[k] = q;
                r->scratch |= q->scratch;
            }
            if (plain && !err) r->nthen = PyTuple_GET_SIZE(then), r->then_plans = Py_NewRef(then);
        }
        Py_XDECREF(then);
    }
    Py_XDECREF(dtypes); Py_XDECREF(order); Py_XDECREF(slots); Py_XDECREF(values);
    PyObject *kept;
    if (err || !plain) {
        record_release(r);
        if (err) return NULL;
        r = NULL;
        kept = Py_NewRef(Py_False);
    } else if ((kept = PyCapsule_New(r, RECORD_NAME, record_free)) == NULL) {
        record_release(r);
        return NULL;
    }
    int rc = PyObject_SetAttr(ln, s_lane, kept);
    Py_DECREF(kept); /* ln keeps it, and with it the record */
    return rc < 0 ? NULL : r;
}

/* this thread's argument pack of the plan (Launch.packs, else Launch._pack, which also
 * makes the device's primary context current on the thread): its array of slot pointers */
static uint64_t **thread_pack(PyObject *ln, Record *r) {
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
    Py_DECREF(pack); /* packs keeps it */
    if (ptrs == NULL) return NULL;
    r->tid = tid, r->ptrs = ptrs;
    return ptrs;
}

/* a CuPy array's device pointer (x.data.ptr); 0 with an error set on failure */
static uint64_t device_ptr(PyObject *x) {
    PyObject *mp = PyObject_GetAttr(x, s_data);
    PyObject *p = mp ? PyObject_GetAttr(mp, s_ptr) : NULL;
    Py_XDECREF(mp);
    if (p == NULL) return 0;
    uint64_t v = (uint64_t)PyLong_AsUnsignedLongLong(p);
    Py_DECREF(p);
    return v;
}

static int same(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0) PyErr_Clear();
    return r == 1;
}

static int bump(PyObject *w, Py_ssize_t k, long delta) { /* w[k] += delta */
    PyObject *n = PyLong_FromLong(PyLong_AsLong(PyList_GET_ITEM(w, k)) + delta);
    if (n == NULL) return -1;
    PyList_SetItem(w, k, n); /* steals n, drops the old value */
    return 0;
}

static int hit(PyObject *entry) { /* entry.hits += 1 */
    PyObject *h = PyObject_GetAttr(entry, s_hits);
    if (h == NULL) return -1;
    PyObject *h1 = PyLong_FromLong(PyLong_AsLong(h) + 1);
    Py_DECREF(h);
    if (h1 == NULL) return -1;
    int rc = PyObject_SetAttr(entry, s_hits, h1);
    Py_DECREF(h1);
    return rc;
}


/* -- a GEMM plan's launch (cuBLAS) -------------------------------------------------------
 * What gemm_launch reads of a GemmPlan, once: its ``cublas`` words (cuBLAS's column-major
 * arguments, B first: transa, transb, m, n, k, lda, strideA, ldb, strideB, ldc, strideC,
 * count, data type, compute type, whether TF32 applies, alpha's and beta's host addresses,
 * whether c is copied in), its ``copy`` plan, its output's shape and dtype. */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, count, type, compute, tf32, with_c;
    long long sa, sb, sc;
    const void *alpha, *beta;
    PyObject *copy, *shape, *npdt; /* strong */
    unsigned long tid;             /* the thread whose handle ``handle`` is */
    void *handle;
} Gemm;
#define GEMM_NAME "tapescope.kernels.cuda._driver.Gemm"
#define CUBLAS_COMPUTE_32F_FAST_TF32 77
#define GEMM_WORDS 17

static void gemm_free(PyObject *capsule) {
    Gemm *g = PyCapsule_GetPointer(capsule, GEMM_NAME);
    if (g == NULL) { PyErr_Clear(); return; }
    Py_XDECREF(g->copy); Py_XDECREF(g->shape); Py_XDECREF(g->npdt);
    PyMem_Free(g);
}

/* the plan's record, made on its first launch (NULL, no error: not a GEMM plan we take) */
static Gemm *gemm_record(PyObject *ln, PyObject *cap) {
    if (cap != Py_None) return PyCapsule_IsValid(cap, GEMM_NAME) ? PyCapsule_GetPointer(cap, GEMM_NAME) : NULL;
    PyObject *w = PyObject_GetAttr(ln, s_cublas);
    if (w == NULL) return NULL;
    Gemm *g = PyMem_Calloc(1, sizeof(Gemm));
    int err = g == NULL;
    long long v[GEMM_WORDS];
    err = err || !PyTuple_Check(w) || PyTuple_GET_SIZE(w) != GEMM_WORDS;
    for (Py_ssize_t i = 0; !err && i < GEMM_WORDS; i++) {
        v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(w, i));
        err = PyErr_Occurred() != NULL;
    }
    Py_DECREF(w);
    if (!err) {
        g->ta = (int)v[0], g->tb = (int)v[1], g->m = (int)v[2], g->n = (int)v[3], g->k = (int)v[4];
        g->lda = (int)v[5], g->sa = v[6], g->ldb = (int)v[7], g->sb = v[8];
        g->ldc = (int)v[9], g->sc = v[10], g->count = (int)v[11], g->type = (int)v[12];
        g->compute = (int)v[13], g->tf32 = (int)v[14];
        g->alpha = (const void *)(intptr_t)v[15], g->beta = (const void *)(intptr_t)v[16];
        err = (g->copy = PyObject_GetAttr(ln, s_copy)) == NULL ||
              (g->shape = PyObject_GetAttrString(ln, "out_shape")) == NULL ||
              (g->npdt = PyObject_GetAttrString(ln, "out_dtype")) == NULL;
        if (!err) g->with_c = g->copy != Py_None;
    }
    PyObject *kept = err ? NULL : PyCapsule_New(g, GEMM_NAME, gemm_free);
    if (kept == NULL) {
        if (g != NULL) {
            Py_XDECREF(g->copy); Py_XDECREF(g->shape); Py_XDECREF(g->npdt);
            PyMem_Free(g);
        }
        return NULL;
    }
    int rc = PyObject_SetAttr(ln, s_lane, kept);
    Py_DECREF(kept);
    return rc < 0 ? NULL : g;
}

/* the libcublas of CuPy's binding (dl_iterate_phdr's fallback: the one loaded, if one) */
typedef struct { char path[4096]; int found; } CublasScan;

static int cublas_scan(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    CublasScan *c = data;
    const char *name = info->dlpi_name, *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : name;
    if (base == NULL || strncmp(base, "libcublas.so", 12) != 0) return 0;
    if (c->found++ == 0) snprintf(c->path, sizeof(c->path), "%s", name);
    return 0;
}

static void resolve_cublas(void) {
    cublas_state = -1;
    void *lib = NULL;
    if (c_cublas_module != NULL && PyUnicode_Check(c_cublas_module)) {
        /* the binding's extension module: dlsym through it finds what it links */
        const char *path = PyUnicode_AsUTF8(c_cublas_module);
        if (path != NULL) lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        PyErr_Clear();
        if (lib != NULL && dlsym(lib, "cublasGemmStridedBatchedEx") == NULL) lib = NULL;
    }
    if (lib == NULL) {
        CublasScan c = {{0}, 0};
        dl_iterate_phdr(cublas_scan, &c);
        if (c.found == 1) lib = dlopen(c.path, RTLD_NOW | RTLD_NOLOAD); /* never a second one */
    }
    if (lib == NULL) return;
    cublas_gemm = (cublas_gemm_t)dlsym(lib, "cublasGemmStridedBatchedEx");
    cublas_set_stream = (cublas_set_stream_t)dlsym(lib, "cublasSetStream_v2");
    if (cublas_set_stream == NULL) cublas_set_stream = (cublas_set_stream_t)dlsym(lib, "cublasSetStream");
    if (cublas_gemm != NULL && cublas_set_stream != NULL) cublas_state = 1;
}

static int launch(PyObject *ln, PyObject *const *ins, Py_ssize_t n, PyObject *out,
                  PyObject *index);

/* the launch's timing record closed (timing's launch_end with the inputs as a list): 1 or 0
 * with an error set */
static int launch_ended(PyObject *index, PyObject *ev0, PyObject *ln, PyObject *const *ins,
                        Py_ssize_t n, PyObject *out) {
    PyObject *insl = PyList_New(n);
    for (Py_ssize_t i = 0; insl != NULL && i < n; i++) PyList_SET_ITEM(insl, i, Py_NewRef(ins[i]));
    PyObject *args[5] = {index, ev0, ln, insl, out};
    PyObject *res = insl ? PyObject_Vectorcall(c_launch_end, args, 5, NULL) : NULL;
    Py_XDECREF(insl);
    Py_XDECREF(res);
    return res != NULL;
}

/* 1 launched, 0 declined (nothing done: the Python hook runs it all), -1 an error */
static int gemm_launch(Gemm *g, PyObject *ln, PyObject *const *ins, Py_ssize_t n, PyObject *out,
                       PyObject *index) {
    if (!cublas_wanted || n < 2 + g->with_c || PyTuple_Check(out)) return 0;
    unsigned long tid = PyThread_get_thread_ident();
    if (g->tid != tid || g->handle == NULL) { /* CuPy's handle for this thread's device */
        if (c_cublas_handle == NULL) return 0;
        PyObject *h = PyObject_CallNoArgs(c_cublas_handle);
        if (h == NULL) return -1;
        g->handle = PyLong_AsVoidPtr(h);
        Py_DECREF(h);
        if (PyErr_Occurred()) return -1;
        g->tid = tid;
    }
    if (cublas_state == 0) resolve_cublas();
    if (cublas_state != 1) return 0;
    PyObject *dt = PyObject_GetAttr(out, s_dtype), *sh = dt ? PyObject_GetAttr(out, s_shape) : NULL;
    int takes = sh != NULL && same(dt, g->npdt) && same(sh, g->shape);
    Py_XDECREF(dt); Py_XDECREF(sh);
    if (!takes) { PyErr_Clear(); return 0; }
    uint64_t pa = device_ptr(ins[0]);
    uint64_t pb = PyErr_Occurred() ? 0 : device_ptr(ins[1]);
    uint64_t pc = PyErr_Occurred() ? 0 : device_ptr(out);
    if (PyErr_Occurred()) return -1;
    void *st = stream_ptr(index);
    PyObject *w = st ? work_of(index) : NULL;
    if (w == NULL) return PyErr_Occurred() ? -1 : 0;
    if (g->with_c) { /* c into the output first (MLX's copy_gpu(c, out)), the GEMM adds beta c */
        int rc = launch(g->copy, ins + 2, 1, out, index);
        if (rc != 1) return rc;
    }
    int compute = g->compute;
    if (g->tf32 && c_tf32 != NULL && PyList_Check(c_tf32) && PyList_GET_SIZE(c_tf32) > 0 &&
        PyList_GET_ITEM(c_tf32, 0) == Py_True)
        compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    int rec = recording();
    PyObject *ev0 = NULL;
    if (rec && (ev0 = PyObject_CallOneArg(c_launch_start, index)) == NULL) return -1;
    if (lock(c_work_lock) < 0) { Py_XDECREF(ev0); return -1; }
    /* row-major C = A B is column-major C^T = B^T A^T: the plan's words have B first */
    int st1 = cublas_set_stream(g->handle, st);
    int st2 = st1 ? 0 : cublas_gemm(g->handle, g->ta, g->tb, g->m, g->n, g->k, g->alpha,
                                    (const void *)(uintptr_t)pb, g->type, g->lda, g->sa,
                                    (const void *)(uintptr_t)pa, g->type, g->ldb, g->sb, g->beta,
                                    (void *)(uintptr_t)pc, g->type, g->ldc, g->sc, g->count,
                                    compute, -1 /* CUBLAS_GEMM_DEFAULT */);
    int ok = st1 == 0 && st2 == 0;
    if (ok) ok = PySet_Add(c_unfinished, index) == 0 && bump(w, 0, +1) == 0;
    else PyErr_Format(PyExc_RuntimeError, "[cuda] %s failed: cuBLAS status %d",
                      st1 ? "cublasSetStream_v2" : "cublasGemmStridedBatchedEx", st1 ? st1 : st2);
    unlock(c_work_lock);
    if (ok) gemms++;
    if (ok && ev0 != NULL) ok = launch_ended(index, ev0, ln, ins, n, out);
    Py_XDECREF(ev0);
    return ok ? 1 : -1;
}

static int launch(PyObject *ln, PyObject *const *ins, Py_ssize_t n, PyObject *out,
                  PyObject *index) {
    if (!configured) return 0;
    /* the plan's lane, read once: a kernel's Record or a GEMM plan's Gemm capsule, False (not
     * ours), or None (not read yet: a GEMM plan has a ``cublas`` attribute) */
    PyObject *cap = PyObject_GetAttr(ln, s_lane);
    if (cap == NULL) { PyErr_Clear(); return 0; }
    Py_DECREF(cap); /* ln keeps it */
    Record *r = NULL;
    if (cap == Py_False) return 0;
    if (PyCapsule_CheckExact(cap) && PyCapsule_IsValid(cap, RECORD_NAME)) {
        r = PyCapsule_GetPointer(cap, RECORD_NAME);
    } else {
        int gemm = cap == Py_None ? PyObject_HasAttr(ln, s_cublas) : PyCapsule_IsValid(cap, GEMM_NAME);
        if (gemm) {
            Gemm *g = gemm_record(ln, cap);
            if (g == NULL) return PyErr_Occurred() ? -1 : 0;
            return gemm_launch(g, ln, ins, n, out, index);
        }
        r = plan_record_of(ln, cap);
    }
    if (r == NULL) return PyErr_Occurred() ? -1 : 0;
    /* the outputs: one array, or a tuple of one per output of a fused tape's plan */
    int many = PyTuple_Check(out);
    Py_ssize_t m = many ? PyTuple_GET_SIZE(out) : 1;
    if (m != r->nouts) return 0;
    uint64_t outp[MAX_OUTS];
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *o = many ? PyTuple_GET_ITEM(out, j) : out;
        /* Launch.takes for the loop's output (a fresh buffer's view: C-contiguous) */
        PyObject *dt = PyObject_GetAttr(o, s_dtype), *sh = dt ? PyObject_GetAttr(o, s_shape) : NULL;
        int takes = sh != NULL && same(dt, r->npdts[j]) && same(sh, r->shape);
        Py_XDECREF(dt); Py_XDECREF(sh);
        if (takes && r->forder) { /* a column-order kernel: the loop's out in that order */
            PyObject *fl = PyObject_GetAttrString(o, "flags");
            PyObject *f = fl ? PyObject_GetAttrString(fl, "f_contiguous") : NULL;
            takes = f == Py_True;
            Py_XDECREF(fl); Py_XDECREF(f);
        }
        if (!takes) { PyErr_Clear(); return 0; }
        outp[j] = device_ptr(o);
        if (PyErr_Occurred()) return -1;
    }
    void *st = stream_ptr(index);
    PyObject *w = st ? work_of(index) : NULL;
    if (w == NULL) return PyErr_Occurred() ? -1 : 0;
    uint64_t scratch = 0;
    if (r->scratch) { /* the sequence's scratch buffer on this stream */
        if (r->scratch_st != st || r->scratch_ptr == 0) {
            PyObject *sp = PyLong_FromVoidPtr(st);
            PyObject *p = sp ? PyObject_CallMethodOneArg(ln, s_scratch_for, sp) : NULL;
            Py_XDECREF(sp);
            if (p == NULL) return -1;
            r->scratch_ptr = (uint64_t)PyLong_AsUnsignedLongLong(p);
            Py_DECREF(p);
            if (PyErr_Occurred()) { r->scratch_ptr = 0; return -1; }
            r->scratch_st = st;
        }
        scratch = r->scratch_ptr;
    }
    Record *recs[1 + MAX_THEN];
    uint64_t **packs[1 + MAX_THEN];
    Py_ssize_t nrec = 1 + r->nthen;
    for (Py_ssize_t q = 0; q < nrec; q++) { /* every launch's arguments, before any runs */
        Record *s = recs[q] = q == 0 ? r : r->then[q - 1];
        uint64_t **ptrs = packs[q] = thread_pack(q == 0 ? ln : PyTuple_GET_ITEM(r->then_plans, q - 1), s);
        if (ptrs == NULL) return -1;
        uint64_t *vals = ptrs[0]; /* argument 0 starts at word 0: the words' start */
        for (Py_ssize_t k = 0; k < s->nslots; k++) {
            Py_ssize_t i = s->si[k];
            if (i >= n) { PyErr_SetString(PyExc_IndexError, "a launch slot past the inputs"); return -1; }
            vals[s->sj[k]] = i == SCRATCH ? scratch : device_ptr(ins[i]);
            if (PyErr_Occurred()) return -1;
        }
        for (Py_ssize_t k = 0; k < s->nvalues; k++) { /* a host scalar's bits (its first element) */
            Py_ssize_t i = s->vi[k];
            if (i >= n) { PyErr_SetString(PyExc_IndexError, "a launch value past the inputs"); return -1; }
            Py_buffer v;
            if (PyObject_GetBuffer(ins[i], &v, PyBUF_STRIDES) < 0) { PyErr_Clear(); return 0; }
            uint64_t bits = 0;
            if (v.len > 0 && v.itemsize == s->vsize[k]) memcpy(&bits, v.buf, (size_t)s->vsize[k]);
            int ok = v.len > 0 && v.itemsize == s->vsize[k];
            PyBuffer_Release(&v);
            if (!ok) return 0; /* not the plan's scalar: launch_fused */
            vals[s->vj[k]] = bits;
        }
        for (Py_ssize_t k = 0; k < s->ndims; k++) { /* a size the launch takes per call */
            Py_ssize_t i = s->di[k];
            if (i >= n) { PyErr_SetString(PyExc_IndexError, "a launch size past the inputs"); return -1; }
            PyObject *sh = PyObject_GetAttr(ins[i], s_shape);
            if (sh == NULL) return -1;
            long long v = PyTuple_Check(sh) && s->dax[k] < PyTuple_GET_SIZE(sh)
                          ? PyLong_AsLongLong(PyTuple_GET_ITEM(sh, s->dax[k])) : -1;
            Py_DECREF(sh);
            if (v < 0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a launch size's axis"); return -1; }
            vals[s->dj[k]] = (uint64_t)v;
        }
        if (s->n_out_at >= 0) /* (-1: writes only the scratch) */
            for (Py_ssize_t j = 0; j < (q == 0 ? m : 1); j++) vals[s->n_out_at + j] = outp[j];
        vals[s->word_at] = vals[s->word_at + 1] = 0; /* the kernel writes no completion word */
    }
    int rec = recording();
    PyObject *ev0 = NULL;
    if (rec && (ev0 = PyObject_CallOneArg(c_launch_start, index)) == NULL) return -1;
    if (lock(c_work_lock) < 0) { Py_XDECREF(ev0); return -1; }
    int ok = 1;
    Py_ssize_t done = 0;
    for (; ok && done < nrec; done++) {
        Record *s = recs[done];
        int lrc = cu_launch(s->fn, s->grid, 1, 1, s->block, 1, 1, 0, st, (void **)packs[done], NULL);
        ok = lrc == 0;
        if (ok) ok = PySet_Add(c_unfinished, index) == 0 && bump(w, 0, +1) == 0;
        else cuda_error("cuLaunchKernel", lrc);
    }
    unlock(c_work_lock);
    for (Py_ssize_t q = 0; ok && q < nrec; q++) { launches++; ok = hit(recs[q]->entry) == 0; }
    if (ok && ev0 != NULL) ok = launch_ended(index, ev0, ln, ins, n, out);
    Py_XDECREF(ev0);
    return ok ? 1 : -1;
}

/* -- the wait ---------------------------------------------------------------------------- */

/* the completion page (made on a thread whose context is current: after a launch here) */
static int word_page(void) {
    if (word_state == 0 && cu_write_value && cu_host_alloc && cu_host_device_ptr) {
        void *h = NULL;
        unsigned long long d = 0;
        if (cu_host_alloc(&h, WORDS * sizeof(uint32_t), 0x01 | 0x02) == 0 && /* PORTABLE | DEVICEMAP */
            cu_host_device_ptr(&d, h, 0) == 0) {
            memset(h, 0, WORDS * sizeof(uint32_t));
            word_host = (volatile uint32_t *)h, word_dev = d, word_state = 1;
        } else if (++word_tries >= 8) {
            word_state = -1;
        }
    }
    return word_state == 1;
}

/* the deferred bounds check (cuda/bounds.py): the stream's record, in mapped pinned host
 * memory, read once the stream has finished; a bad index its kernels noted is raised by
 * bounds.check (numpy's IndexError, the record cleared) */
static int bounds_seen(void *st) {
    PyObject *key = PyLong_FromVoidPtr(st);
    if (key == NULL) return -1;
    PyObject *addr = PyDict_GetItemWithError(c_bounds, key);
    int rc = 0;
    if (addr != NULL) {
        volatile uint64_t *rec = (volatile uint64_t *)PyLong_AsVoidPtr(addr);
        if (rec != NULL && rec[0] != 0) {
            PyObject *r = PyObject_CallOneArg(c_bounds_check, key);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
    }
    if (PyErr_Occurred()) rc = -1;
    Py_DECREF(key);
    return rc;
}

static int wait(PyObject *index) {
    if (!configured) return 0;
    void *st = stream_ptr(index);
    PyObject *w = st ? work_of(index) : NULL;
    if (w == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t slot = PyLong_AsSsize_t(index);
    if (slot < 0) PyErr_Clear();
    int rec = recording();
    PyObject *t0 = NULL;
    if (rec && (t0 = PyObject_CallNoArgs(c_now)) == NULL) return -1;
    /* the stream's generation now: nothing enqueued after it, the stream has finished */
    long gen = PyLong_AsLong(PyList_GET_ITEM(w, 0));
    uint32_t seq = 0;
    if (word_wanted && slot >= 0 && slot < WORDS && word_page()) {
        seq = ++word_seq;
        if (seq == 0) seq = ++word_seq; /* (0 is "none") */
        if (cu_write_value(st, word_dev + sizeof(uint32_t) * (unsigned long long)slot, seq, 0) != 0) {
            cu_write_value = NULL; /* not supported here: poll from now on */
            word_state = -1;
            seq = 0;
        }
    }
    int rc = CUDA_ERROR_NOT_READY;
    Py_BEGIN_ALLOW_THREADS
    double end = now_s() + 200e-6;
    if (seq != 0) {
        do {
            if ((int32_t)(word_host[slot] - seq) >= 0) rc = 0;
        } while (rc != 0 && now_s() < end);
    }
    while (rc == CUDA_ERROR_NOT_READY) {
        rc = cu_stream_query(st);
        if (rc == CUDA_ERROR_NOT_READY && now_s() >= end) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    Py_END_ALLOW_THREADS
    if (seq != 0 && rc == 0) waits_by_word++;
    else waits_by_query++;
    if (rc != 0) { Py_XDECREF(t0); return cuda_error("cuStreamQuery", rc); }
    /* device.note_finished: nothing enqueued since the generation read, nothing enqueueing */
    if (lock(c_work_lock) < 0) { Py_XDECREF(t0); return -1; }
    int err = 0;
    if (PyLong_AsLong(PyList_GET_ITEM(w, 0)) == gen && PyLong_AsLong(PyList_GET_ITEM(w, 1)) == 0)
        err = PySet_Discard(c_unfinished, index) < 0;
    unlock(c_work_lock);
    if (!err && PyList_Check(c_timing_pending) && PyList_GET_SIZE(c_timing_pending)) {
        PyObject *fr = PyObject_CallNoArgs(c_timing_flush);
        err = fr == NULL;
        Py_XDECREF(fr);
    }
    if (!err && t0 != NULL) {
        PyObject *args[2] = {index, t0};
        PyObject *res = PyObject_Vectorcall(c_wait_record, args, 2, NULL);
        err = res == NULL;
        Py_XDECREF(res);
    }
    Py_XDECREF(t0);
    if (!err && PyDict_GET_SIZE(c_bounds)) err = bounds_seen(st) < 0;
    return err ? -1 : 1;
}

static DeviceApi api = {DEVICE_API_ABI, launch, wait};

/* -- the module -------------------------------------------------------------------------- */

static PyObject *configure(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"streams", "work", "work_of", "work_lock", "unfinished",
                                        "timeline", "timing_pending", "timing_flush",
                                        "launch_start", "launch_end", "wait_record", "now",
                                        "bounds", "bounds_check"};
    PyObject **const slots[] = {&c_streams, &c_work, &c_work_of, &c_work_lock, &c_unfinished,
                                &c_timeline, &c_timing_pending, &c_timing_flush,
                                &c_launch_start, &c_launch_end, &c_wait_record, &c_now,
                                &c_bounds, &c_bounds_check};
    if (!PyDict_Check(kw)) {
        PyErr_SetString(PyExc_TypeError, "configure takes a dict");
        return NULL;
    }
    configured = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        PyObject *v = PyDict_GetItemString(kw, names[i]);
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "configure: missing %s", names[i]);
            return NULL;
        }
        Py_XSETREF(*slots[i], Py_NewRef(v));
    }
    const char *const optional[] = {"cublas_handle", "cublas_module", "tf32"};
    PyObject **const oslots[] = {&c_cublas_handle, &c_cublas_module, &c_tf32};
    for (size_t i = 0; i < 3; i++) {
        PyObject *v = PyDict_GetItemString(kw, optional[i]);
        Py_XSETREF(*oslots[i], v != NULL && v != Py_None ? Py_NewRef(v) : NULL);
    }
    cublas_state = 0; /* (looked for again at the next GEMM) */
    Py_CLEAR(last_cs);
    Py_XSETREF(c_lock_acquire, PyObject_GetAttr(c_work_lock, s_acquire));
    Py_XSETREF(c_lock_release, c_lock_acquire ? PyObject_GetAttr(c_work_lock, s_release) : NULL);
    if (c_lock_release == NULL) return NULL;
    if (!PyDict_Check(c_streams) || !PyDict_Check(c_work) || !PySet_Check(c_unfinished) ||
        !PyDict_Check(c_bounds)) {
        PyErr_SetString(PyExc_TypeError, "configure: streams, work and bounds dicts, unfinished a set");
        return NULL;
    }
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
    if (cu_launch == NULL || cu_stream_query == NULL) Py_RETURN_NONE; /* no driver: Python hooks */
    /* a driver another library loaded (a CUDA-aware MPI) that nobody initialised: CuPy is
       not using it (the tests' stand-in CuPy), so its calls would fail NOT_INITIALIZED */
    typedef int (*cu_ctx_get_t)(void **);
    cu_ctx_get_t cu_ctx_get = lib != NULL ? (cu_ctx_get_t)dlsym(lib, "cuCtxGetCurrent") : NULL;
    void *ctx = NULL;
    if (cu_ctx_get == NULL || cu_ctx_get(&ctx) == CUDA_ERROR_NOT_INITIALIZED) {
        cu_launch = NULL;
        cu_stream_query = NULL;
        Py_RETURN_NONE;
    }
    configured = 1;
    return PyCapsule_New(&api, DEVICE_API_NAME, NULL);
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:s,s:L,s:L,s:L,s:L,s:s}", "completion_word",
                         word_state == 1 ? "on" : word_state == 0 ? "not made" : "off",
                         "waits_by_word", waits_by_word, "waits_by_query", waits_by_query,
                         "launches", launches, "gemms", gemms, "cublas",
                         cublas_state == 1 ? "found" : cublas_state == 0 ? "not looked for" : "not found");
}

static PyObject *use_completion_word(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    word_wanted = v;
    Py_RETURN_NONE;
}

static PyObject *use_cublas(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    cublas_wanted = v;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use_cublas", (PyCFunction)use_cublas, METH_O,
     "use_cublas(on): GEMM plans launched here through cuBLAS (default) or declined"},
    {"configure", (PyCFunction)configure, METH_O,
     "configure(dict) -> the device_api capsule, or None without a loaded CUDA driver"},
    {"stats", (PyCFunction)stats, METH_NOARGS,
     "stats() -> {completion_word, waits_by_word, waits_by_query, launches, gemms, cublas}"},
    {"use_completion_word", (PyCFunction)use_completion_word, METH_O,
     "use_completion_word(on): waits read the completion word (default) or poll the stream"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_driver",
                                    "The CUDA backend's launch and wait in C (see _driver.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__driver(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL;
    I(s_values, "values") I(s_then, "then") I(s_cublas, "cublas") I(s_copy, "copy") I(s_scratch_for, "scratch_for") I(s_lane, "lane") I(s_dtypes, "dtypes") I(s_order, "order") I(s_slots, "slots")
    I(s_gen, "gen") I(s_shape, "shape") I(s_entry, "entry") I(s_packs, "packs")
    I(s_pack, "_pack") I(s_hits, "hits") I(s_data, "data") I(s_ptr, "ptr") I(s_dtype, "dtype")
    I(s_C, "C") I(s_enabled, "enabled") I(s_acquire, "acquire") I(s_release, "release")
#undef I
    return PyModule_Create(&module);
}
