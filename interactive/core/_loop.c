/* The eval loop's hot part in C (eval_loop.py's and evaluate.py's steps for the common
 * case; the Python functions named below are the reference and run everything else):
 *
 * - run_node: one node (evaluate._run_node): a host node, or a device's loaded fused call;
 * - topo_order: the schedule's order (eval_loop._topo_order);
 * - eager_eval: a synchronous eval on one stream of any backend (eval_loop.evaluate /
 *   _run_inline / _evaluate's wait).
 *
 * Every eval of every backend comes through these or their Python references: there is
 * no other loop (a backend contributes its launch, ``Backend.launch_fused``, and its
 * events; see BackendInfo below).
 *
 * Built into the same extension as _call.c (which it shares core's slot offsets with, see
 * _core.h); configured by evaluate.py and eval_loop.py at import. */
#include "_core.h"
#include "../../kernels/_device_api.h"
#include "../../kernels/_view_api.h"
#include <signal.h> /* SIGINT */
#include <time.h> /* clock_gettime, nanosleep */

/* -- The eval loop's hot part: one host node run in C ------------------------------------
 *
 * ``run_node(node)`` is evaluate.run_node for the common node: on a host backend (the
 * CPU), not a tracer's, not a rule taking ``donatable=``, no bfloat16 input of an
 * elementwise op, every input a numpy array; or a fused call whose kernel is loaded, on
 * any backend (on a device: its inputs the device's arrays, none that could donate). Its steps are evaluate.py's, in the same
 * order: a single-output ``out=`` rule writes into a donated input's buffer (the same
 * checks as _donor: nobody else holds the input or its handle, same itemsize and shape,
 * C- or F-contiguous and writeable, the buffer within the 16 KiB slack) or a fresh buffer
 * of the allocator (its malloc, the buffer's view, a BufferHandle), under the backend's
 * quiet floating-point state (its context variable set and reset); the result stored, the
 * node detached. A loaded fused kernel is launched into its output buffer through the
 * backend's launch_fused (evaluate._fused_launch), or, on the host, through the plan's
 * KernelCall (kernels/kernel_call.py) without Python code. A generated kernel's rule (a
 * KernelRule) that has planned this call is not called: its KernelCall (``planned``) runs
 * into the output buffer. A view or another rule is called here and finished by
 * evaluate._finish.
 * The path is counted in evaluate's counters as the Python path counts it, and the
 * timeline records as it does there (the same records, the same code either way).
 * Anything else (and a rule that refuses ``out=`` with a TypeError) is the Python
 * run_node, given with configure_loop. */
static PyObject *l_python_run, *l_by_stream, *l_handle_type,
    *l_bf16, *l_ndarray, *l_timeline, *l_now, *l_record, *l_finish, *l_counts, *l_quiet_var,
    *l_quiet_value, *l_kwnames_out, *l_kernel_rule;
static PyObject *s_plans, *s_out_shape, *s_out_dtype, *s_out_strides, *s_strides, *s_kernel_call, *s_order;
static PyObject *s_takes, *s_launch_fused, *s_tape, *s_launches, *s_xp, *s_allocator, *s_array_type,
    *s_compiled_launch, *s_kernel_rules, *s_device_context, *s_device_api, *s_eager_kernel,
    *s_min_size, *s_storage_type, *s_casts, *s_astype;
static PyObject *s_view, *s_malloc, *s_size, *s_base, *s_raw, *s_flags, *s_owndata, *s_adopt,
    *s_nbytes, *s_c_contiguous, *s_f_contiguous, *s_T, *s_F, *s_reads, *s_donor, *s_in_place,
    *s_per_call, *s_linear, *s_at;
static int loop_configured = 0;
enum { P_KW, P_STREAM, P_DEFN, P_NAME, P_COUNT };
enum { F_RULE, F_OUT, F_DONATABLE, F_RUNTIME, F_VIEW, F_ELEMENTWISE, F_VIEW_STRIDES, F_FAMILY,
       F_COUNT };
enum { T_SIZE, T_NP, T_COUNT };
static Py_ssize_t prim_off[P_COUNT], defn_off[F_COUNT], dtype_off[T_COUNT], buf_size_off,
    buf_raw_off;
static PyObject *l_buffer_type; /* kernels.allocator.Buffer */
/* eager_eval's loop takes the quiet state at its first rule (loop_token) and holds it to the
 * loop's end: a loop of plans and views (a compiled call's) sets none; outside that loop
 * run_host sets it around each rule. Per thread, as the context variable is. */
static _Thread_local int loop_quiet = 0;
static _Thread_local PyObject *loop_token = NULL;
static PyObject *l_broadcast_view; /* kernels/cpu/views.broadcast: made by broadcast_view */
/* rules/shape.py's transpose and reshape (the layout rules numpy makes views by), made by
 * layout_view */
static PyObject *l_transpose_view, *l_reshape_view, *s_axes, *s_reshape, *s_transpose;
static PyObject *l_slice_view, *s_start_indices, *s_end_indices, *s_strides_kw; /* Slice's */
enum { PATH_RULE = 0, PATH_RULE_OUT = 1, PATH_VIEW = 2, PATH_FUSED = 3, PATH_FUSED_DEVICE = 4,
       PATH_EAGER_DEVICE = 6, PATH_EAGER = 7 };
/* (evaluate.PATHS' indices) */
#define DONATION_SLACK 16384 /* evaluate.DONATION_SLACK */

PyObject *configure_loop(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"python_run", "by_stream", "handle_type", "bfloat16",
                                        "ndarray", "timeline", "now", "record", "finish",
                                        "counts", "quiet_var", "quiet_value"};
    PyObject **const slots[] = {&l_python_run, &l_by_stream, &l_handle_type, &l_bf16,
                                &l_ndarray, &l_timeline, &l_now, &l_record, &l_finish,
                                &l_counts, &l_quiet_var, &l_quiet_value};
    loop_configured = 0;
    if (take_all(kw, "configure_loop", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyDict_Check(l_by_stream) || !PyList_Check(l_counts) ||
        !PyContextVar_CheckExact(l_quiet_var)) {
        PyErr_SetString(PyExc_TypeError, "configure_loop: by_stream a dict, counts a list, "
                                         "quiet_var a ContextVar");
        return NULL;
    }
    PyObject *node_type = PyDict_GetItemString(kw, "node_type");
    PyObject *desc_type = PyDict_GetItemString(kw, "desc_type");
    if (!node_type || !desc_type || !PyType_Check(node_type) || !PyType_Check(desc_type)) {
        PyErr_SetString(PyExc_KeyError, "configure_loop: the node and desc types");
        return NULL;
    }
    if (core_offsets(node_type, desc_type) < 0) return NULL;
    Py_XSETREF(c_node_type, Py_NewRef(node_type));
    Py_XSETREF(c_desc_type, Py_NewRef(desc_type));
    PyObject *prim_type = PyDict_GetItemString(kw, "primitive_type");
    PyObject *defn_type = PyDict_GetItemString(kw, "definition_type");
    PyObject *dtype_type = PyDict_GetItemString(kw, "dtype_type");
    PyObject *buffer_type = PyDict_GetItemString(kw, "buffer_type");
    PyObject *bview = PyDict_GetItemString(kw, "broadcast_view"); /* optional, and the next */
    Py_XSETREF(l_broadcast_view, bview ? Py_NewRef(bview) : NULL);
    if (s_axes == NULL && (s_axes = PyUnicode_InternFromString("axes")) == NULL) return NULL;
    if (s_reshape == NULL && (s_reshape = PyUnicode_InternFromString("reshape")) == NULL) return NULL;
    if (s_transpose == NULL && (s_transpose = PyUnicode_InternFromString("transpose")) == NULL)
        return NULL;
    PyObject *tview = PyDict_GetItemString(kw, "transpose_view");
    Py_XSETREF(l_transpose_view, tview ? Py_NewRef(tview) : NULL);
    PyObject *rview = PyDict_GetItemString(kw, "reshape_view");
    Py_XSETREF(l_reshape_view, rview ? Py_NewRef(rview) : NULL);
    PyObject *sview = PyDict_GetItemString(kw, "slice_view");
    Py_XSETREF(l_slice_view, sview ? Py_NewRef(sview) : NULL);
    if ((s_start_indices == NULL && (s_start_indices = PyUnicode_InternFromString("start_indices")) == NULL) ||
        (s_end_indices == NULL && (s_end_indices = PyUnicode_InternFromString("end_indices")) == NULL) ||
        (s_strides_kw == NULL && (s_strides_kw = PyUnicode_InternFromString("strides")) == NULL))
        return NULL;
    PyObject *kernel_rule = PyDict_GetItemString(kw, "kernel_rule_type"); /* optional */
    Py_XSETREF(l_kernel_rule, kernel_rule && PyType_Check(kernel_rule) ? Py_NewRef(kernel_rule) : NULL);
    if (!prim_type || !defn_type || !dtype_type || !buffer_type) {
        PyErr_SetString(PyExc_KeyError, "configure_loop: the primitive, definition, dtype and "
                                        "buffer types");
        return NULL;
    }
    static const char *const p_slots[P_COUNT] = {"kw", "stream", "defn", "name"};
    static const char *const f_slots[F_COUNT] = {"rule", "takes_out", "takes_donatable",
                                                 "takes_runtime", "view", "elementwise",
                                                 "view_strides", "family"};
    static const char *const t_slots[T_COUNT] = {"size", "np"};
    for (int i = 0; i < P_COUNT; i++)
        if ((prim_off[i] = slot_offset(prim_type, p_slots[i])) < 0) return NULL;
    for (int i = 0; i < F_COUNT; i++)
        if ((defn_off[i] = slot_offset(defn_type, f_slots[i])) < 0) return NULL;
    for (int i = 0; i < T_COUNT; i++)
        if ((dtype_off[i] = slot_offset(dtype_type, t_slots[i])) < 0) return NULL;
    if ((buf_size_off = slot_offset(buffer_type, "size")) < 0) return NULL;
    if ((buf_raw_off = slot_offset(buffer_type, "raw")) < 0) return NULL;
    Py_XSETREF(l_buffer_type, Py_NewRef(buffer_type));
    if (l_kwnames_out == NULL && (l_kwnames_out = Py_BuildValue("(s)", "out")) == NULL) return NULL;
    if (s_view == NULL && (!(s_view = PyUnicode_InternFromString("view")) ||
                           !(s_malloc = PyUnicode_InternFromString("malloc")) ||
                           !(s_size = PyUnicode_InternFromString("size")) ||
                           !(s_base = PyUnicode_InternFromString("base")) ||
                           !(s_raw = PyUnicode_InternFromString("raw")) ||
                           !(s_flags = PyUnicode_InternFromString("flags")) ||
                           !(s_owndata = PyUnicode_InternFromString("owndata")) ||
                           !(s_adopt = PyUnicode_InternFromString("adopt")) ||
                           !(s_nbytes = PyUnicode_InternFromString("nbytes")) ||
                           !(s_c_contiguous = PyUnicode_InternFromString("c_contiguous")) ||
                           !(s_f_contiguous = PyUnicode_InternFromString("f_contiguous")) ||
                           !(s_T = PyUnicode_InternFromString("T")) ||
                           !(s_F = PyUnicode_InternFromString("F")) ||
                           !(s_reads = PyUnicode_InternFromString("reads")) ||
                           !(s_takes = PyUnicode_InternFromString("takes")) ||
                           !(s_launch_fused = PyUnicode_InternFromString("launch_fused")) ||
                           !(s_tape = PyUnicode_InternFromString("tape")) ||
                           !(s_launches = PyUnicode_InternFromString("launches")) ||
                           !(s_xp = PyUnicode_InternFromString("xp")) ||
                           !(s_allocator = PyUnicode_InternFromString("allocator")) ||
                           !(s_array_type = PyUnicode_InternFromString("array_type")) ||
                           !(s_compiled_launch = PyUnicode_InternFromString("compiled_launch")) ||
                           !(s_kernel_rules = PyUnicode_InternFromString("kernel_rules")) ||
                           !(s_device_context = PyUnicode_InternFromString("device_context")) ||
                           !(s_device_api = PyUnicode_InternFromString("device_api")) ||
                           !(s_eager_kernel = PyUnicode_InternFromString("eager_kernel")) ||
                           !(s_min_size = PyUnicode_InternFromString("min_size")) ||
                           !(s_casts = PyUnicode_InternFromString("casts")) ||
                           !(s_astype = PyUnicode_InternFromString("astype")) ||
                           !(s_storage_type = PyUnicode_InternFromString("storage_type")) ||
                           !(s_plans = PyUnicode_InternFromString("plans")) ||
                           !(s_donor = PyUnicode_InternFromString("donor")) ||
                           !(s_in_place = PyUnicode_InternFromString("in_place")) ||
                           !(s_per_call = PyUnicode_InternFromString("per_call")) ||
                           !(s_linear = PyUnicode_InternFromString("linear")) ||
                           !(s_at = PyUnicode_InternFromString("at")) ||
                           !(s_out_shape = PyUnicode_InternFromString("out_shape")) ||
                           !(s_out_dtype = PyUnicode_InternFromString("out_dtype")) ||
                           !(s_strides = PyUnicode_InternFromString("strides")) ||
                           !(s_kernel_call = PyUnicode_InternFromString("kernel_call")) ||
                           !(s_order = PyUnicode_InternFromString("order")) ||
                           !(s_out_strides = PyUnicode_InternFromString("out_strides"))))
        return NULL;
    loop_configured = 1;
    Py_RETURN_NONE;
}


/* What the loop reads off a stream's backend (kernels.backends.Backend), once per backend:
 * its array module, allocator and array type, its loaded fused kernels' plans
 * (``compiled_launch``: None where it has none), its generated kernels per primitive
 * (``kernel_rules``), whether it computes on the host (no device context, numpy
 * arrays: the CPU), and its launch and wait in C (``device_api``: the table of
 * kernels/_device_api.h, or none). A backend's node runs here when it is the plain case: on
 * the host, any such node; on a device, a fused call whose kernel is loaded, launched by
 * the backend's C launch where it has one, else through its Python hook ``launch_fused``
 * (evaluate._gpu_fused_launch); anything else is the Python run_node. A device eval's wait
 * is the backend's C wait where it has one, else the eval's event's ``wait``. The
 * references are kept (a backend lives as long as the process). */
typedef struct {
    PyObject *be, *xp, *alloc, *array_type, *launch_for, *kernel_rules;
    int host;
    int plain_event; /* its event_type is stream_workers.Event, or a subclass that says which
                      * of its own slots its __init__ sets to None (``none_slots``): 1; else
                      * -1; 0 not known */
    PyObject *event_type; /* Backend.event_type, once plain_events has asked */
    Py_ssize_t none_off[2]; /* those slots' offsets (-1: none) */
    const DeviceApi *api; /* NULL: the Python hooks */
    PyObject *eager_for;  /* Backend.eager_kernel (a device's with api only); NULL: none */
    PyObject *eager_plans; /* its ``plans`` (a dict keyed as KernelRule.plans); NULL: none */
    long long eager_min;  /* its ``min_size``: outputs of fewer elements run their rule */
    int eager_casts;      /* its ``casts``: it plans AsType (a cast) too */
    PyObject *storage_type; /* Backend.storage_type (its ``raw`` an array_type); NULL: none */
} BackendInfo;
#define MAX_BACKENDS 16
static BackendInfo seen[MAX_BACKENDS];
static int n_seen = 0;

/* After a failed probe (an attribute looked up to choose a path): an ordinary error is
 * cleared (the Python path decides); a KeyboardInterrupt or SystemExit (Ctrl-C while a lazy
 * attribute imported its module on the first eval) stays set, and 1 says so: clearing it
 * would lose the user's interrupt. */
static int probe_interrupted(void) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return 1;
    PyErr_Clear();
    return 0;
}

/* the backend's info (NULL: not here, the Python path; no error set unless
 * probe_interrupted kept an interrupt) */
static BackendInfo *backend_info(PyObject *be) {
    for (int i = 0; i < n_seen; i++)
        if (seen[i].be == be) return &seen[i];
    if (n_seen == MAX_BACKENDS) return NULL;
    BackendInfo b = {.be = be}; /* every other field 0 / NULL: found out below or when asked */
    PyObject *ctx = NULL, *api = NULL;
    if (!(b.xp = PyObject_GetAttr(be, s_xp)) || !(b.alloc = PyObject_GetAttr(be, s_allocator)) ||
        !(b.array_type = PyObject_GetAttr(be, s_array_type)) ||
        !(b.launch_for = PyObject_GetAttr(be, s_compiled_launch)) ||
        !(b.kernel_rules = PyObject_GetAttr(be, s_kernel_rules)) ||
        !(ctx = PyObject_GetAttr(be, s_device_context)) || !PyType_Check(b.array_type) ||
        !PyDict_Check(b.kernel_rules)) {
        probe_interrupted();
        Py_XDECREF(b.xp); Py_XDECREF(b.alloc); Py_XDECREF(b.array_type);
        Py_XDECREF(b.launch_for); Py_XDECREF(b.kernel_rules); Py_XDECREF(ctx);
        return NULL;
    }
    b.host = ctx == Py_None && b.array_type == l_ndarray;
    Py_DECREF(ctx);
    if (!b.host && (api = PyObject_GetAttr(be, s_device_api)) != NULL && api != Py_None &&
        PyCapsule_IsValid(api, DEVICE_API_NAME)) {
        const DeviceApi *t = PyCapsule_GetPointer(api, DEVICE_API_NAME);
        if (t != NULL && t->abi == DEVICE_API_ABI) b.api = t; /* (the capsule is kept below) */
    }
    PyErr_Clear();
    if (b.api == NULL) Py_CLEAR(api); /* else kept with the backend, for the process's life */
    /* the one-op kernels of eager elementwise ops: the host's (its plans called in C), a
     * device's launched by its C launch */
    if ((b.host || b.api != NULL) && (b.eager_for = PyObject_GetAttr(be, s_eager_kernel)) == NULL)
        PyErr_Clear();
    if (b.eager_for == Py_None) Py_CLEAR(b.eager_for);
    if (b.eager_for != NULL && (b.eager_plans = PyObject_GetAttr(b.eager_for, s_plans)) == NULL)
        PyErr_Clear();
    if (b.eager_plans != NULL && !PyDict_Check(b.eager_plans)) Py_CLEAR(b.eager_plans);
    if (b.eager_for != NULL) {
        PyObject *m = PyObject_GetAttr(b.eager_for, s_min_size);
        b.eager_min = m != NULL ? PyLong_AsLongLong(m) : 0;
        Py_XDECREF(m);
        if (b.eager_min < 0 || PyErr_Occurred()) { PyErr_Clear(); b.eager_min = 0; }
        PyObject *c = PyObject_GetAttr(b.eager_for, s_casts);
        b.eager_casts = c == Py_True;
        Py_XDECREF(c);
        PyErr_Clear();
    }
    if (b.host && b.eager_plans == NULL) Py_CLEAR(b.eager_for); /* the host's: plans in C only */
    if (!b.host && (b.storage_type = PyObject_GetAttr(be, s_storage_type)) == NULL) PyErr_Clear();
    if (b.storage_type != NULL && !PyType_Check(b.storage_type)) Py_CLEAR(b.storage_type);
    Py_INCREF(be);
    seen[n_seen] = b;
    return &seen[n_seen++];
}

/* the backend of ``stream`` (kernels.backends._by_stream; NULL: not known yet) */
static BackendInfo *stream_info(PyObject *stream) {
    PyObject *index = PyObject_GetAttr(stream, s_index);
    if (index == NULL) { PyErr_Clear(); return NULL; }
    PyObject *be = PyDict_GetItemWithError(l_by_stream, index);
    Py_DECREF(index);
    if (be == NULL) { probe_interrupted(); return NULL; }
    return backend_info(be);
}

static int call_none(PyObject *r) { /* a call's result dropped: 0, or -1 on its error */
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int count_path(int path) {
    PyObject *old = PyList_GET_ITEM(l_counts, path);
    PyObject *one = PyLong_FromLong(1);
    PyObject *n = one ? PyNumber_Add(old, one) : NULL;
    Py_XDECREF(one);
    if (n == NULL) return -1;
    PyList_SetItem(l_counts, path, n); /* steals n */
    return 0;
}

/* the rule called as rule(xp, *ins, [out=out,] **kw); ``args`` has room for kw's values */
static PyObject *call_rule(PyObject *rule, PyObject **args, Py_ssize_t nargs, PyObject *out,
                           PyObject *kw) {
    Py_ssize_t nkw = PyDict_GET_SIZE(kw);
    if (nkw == 0 && out != NULL) {
        args[nargs] = out;
        return PyObject_Vectorcall(rule, args, nargs, l_kwnames_out);
    }
    PyObject *names = PyTuple_New(nkw + (out != NULL));
    if (names == NULL) return NULL;
    Py_ssize_t k = 0, pos = 0;
    if (out != NULL) {
        PyTuple_SET_ITEM(names, k++, Py_NewRef(PyTuple_GET_ITEM(l_kwnames_out, 0)));
        args[nargs] = out;
    }
    PyObject *key, *value;
    while (PyDict_Next(kw, &pos, &key, &value)) {
        PyTuple_SET_ITEM(names, k, Py_NewRef(key));
        args[nargs + k++] = value;
    }
    PyObject *r = PyObject_Vectorcall(rule, args, nargs, names);
    Py_DECREF(names);
    return r;
}

/* numpy's C API, from its _ARRAY_API table (slots numpy keeps for its ABI: 3 the dtype type,
 * 94 PyArray_NewFromDescr, 282 PyArray_SetBaseObject), and the head of its array struct
 * (numpy/ndarraytypes.h PyArrayObject_fields): a host buffer's typed view made as
 * ``np.ndarray(shape, dtype, raw)`` makes it, without its argument parsing and the buffer
 * protocol's format string (checked against that constructor before it is used) */
typedef PyObject *(*np_new_fn)(PyTypeObject *, PyObject *, int, const Py_ssize_t *,
                               const Py_ssize_t *, void *, int, PyObject *);
typedef int (*np_base_fn)(PyObject *, PyObject *);
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions, *strides;
    PyObject *base, *descr;
    int flags;
} NpHead;
#define NP_C_CONTIGUOUS 0x0001
#define NP_OWNDATA 0x0004
#define NP_ALIGNED 0x0100
#define NP_WRITEABLE 0x0400
#define NP_MAXDIMS 32
static np_new_fn np_new;
static np_base_fn np_set_base;
static PyTypeObject *np_descr_type;
static PyObject *np_u8; /* np.dtype(np.uint8), numpy's one builtin uint8 descr */
static int np_api = -1; /* -1 not looked at yet, 0 not usable, 1 usable */

/* the view of ``raw`` (a flat, writeable uint8 array of numpy's builtin uint8 descr, at least
 * ``nbytes`` of it: the allocator's own memory, or adopted memory flattened to bytes by
 * Buffer.view; its base is then raw's owner, as the constructor's: numpy's SetBaseObject
 * collapses a chain of views either way) as ``shape`` x ``npdt``, based on raw; NULL with no
 * error: not such a case (the caller makes it otherwise) */
static PyObject *np_view(PyObject *raw, Py_ssize_t nbytes, PyObject *npdt, PyObject *shape) {
    NpHead *r = (NpHead *)raw;
    const int need = NP_C_CONTIGUOUS | NP_WRITEABLE;
    if (r->nd != 1 || r->descr != np_u8 || r->strides[0] != 1 || r->dimensions[0] < nbytes ||
        (r->flags & need) != need ||
        !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > NP_MAXDIMS ||
        !PyObject_TypeCheck(npdt, np_descr_type))
        return NULL;
    Py_ssize_t dims[NP_MAXDIMS], nd = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < nd; i++) {
        dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (dims[i] < 0) { PyErr_Clear(); return NULL; }
    }
    Py_INCREF(npdt); /* (NewFromDescr takes this reference) */
    PyObject *v = np_new((PyTypeObject *)l_ndarray, npdt, (int)nd, dims, NULL, r->data,
                         NP_C_CONTIGUOUS | NP_ALIGNED | NP_WRITEABLE, NULL);
    if (v == NULL) return NULL;
    if (np_set_base(v, Py_NewRef(raw)) < 0) { Py_DECREF(v); return NULL; } /* (takes it) */
    return v;
}

/* views.broadcast(xp, a, shape=shape) without its Python: a read-only view of ``a`` (a numpy
 * array, 0-d or C-contiguous) in ``shape``, stride 0 along the broadcast axes, based on
 * ``a`` (np.ndarray(shape, a.dtype, a, 0, strides) with its writeable flag off); NULL with
 * no error: not such a case (the rule runs) */
static int numpy_api(void);
static PyObject *broadcast_view(PyObject *a, PyObject *shape) {
    if (Py_TYPE(a) != (PyTypeObject *)l_ndarray || shape == NULL || !PyTuple_Check(shape) ||
        numpy_api() != 1)
        return NULL;
    NpHead *h = (NpHead *)a;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape), lead = nd - h->nd;
    if (nd > NP_MAXDIMS || lead < 0 || (h->nd > 0 && !(h->flags & NP_C_CONTIGUOUS))) return NULL;
    Py_ssize_t dims[NP_MAXDIMS], strides[NP_MAXDIMS];
    for (Py_ssize_t i = 0; i < nd; i++) {
        dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (dims[i] < 0) { PyErr_Clear(); return NULL; }
        strides[i] = 0;
    }
    for (int j = 0; j < h->nd; j++) {
        Py_ssize_t n = h->dimensions[j], m = dims[lead + j];
        if (n != m && n != 1) return NULL; /* (the rule's broadcast_to raises) */
        strides[lead + j] = n == 1 && m != 1 ? 0 : h->strides[j];
    }
    Py_INCREF(h->descr); /* (NewFromDescr takes this reference) */
    PyObject *v = np_new((PyTypeObject *)l_ndarray, h->descr, (int)nd, dims, strides, h->data,
                         h->flags & NP_ALIGNED, NULL);
    if (v == NULL) return NULL;
    if (np_set_base(v, Py_NewRef(a)) < 0) { Py_DECREF(v); return NULL; } /* (takes it) */
    return v;
}

/* a host rule that is one numpy ufunc called as ``getattr(xp, rule.ufunc)(*ins, out=out)``
 * (rules/elementwise.py marks them): that ufunc (borrowed), remembered per rule; NULL: not
 * such a rule (with an error set only on a failure) */
static PyObject *l_ufuncs; /* {rule: (the array module asked, its ufunc or None)} */
static PyObject *host_ufunc(PyObject *rule, PyObject *xp) {
    if (l_ufuncs == NULL && (l_ufuncs = PyDict_New()) == NULL) return NULL;
    PyObject *got = PyDict_GetItemWithError(l_ufuncs, rule);
    if (got != NULL && PyTuple_GET_ITEM(got, 0) == xp) { /* (another backend's module: ask it) */
        PyObject *uf = PyTuple_GET_ITEM(got, 1);
        return uf == Py_None ? NULL : uf;
    }
    if (PyErr_Occurred()) return NULL;
    PyObject *name = PyObject_GetAttrString(rule, "ufunc");
    PyObject *found = name != NULL && PyUnicode_Check(name) ? PyObject_GetAttr(xp, name) : NULL;
    PyErr_Clear(); /* (no such attribute: the rule runs) */
    Py_XDECREF(name);
    PyObject *pair = PyTuple_Pack(2, xp, found != NULL ? found : Py_None);
    Py_XDECREF(found); /* (the pair holds it) */
    int bad = pair == NULL || PyDict_SetItem(l_ufuncs, rule, pair) < 0;
    Py_XDECREF(pair); /* (the dict holds it) */
    return bad ? NULL : PyTuple_GET_ITEM(PyDict_GetItem(l_ufuncs, rule), 1) == Py_None
                            ? NULL : PyTuple_GET_ITEM(PyDict_GetItem(l_ufuncs, rule), 1);
}

/* a.transpose(axes) (``kind`` 0: ``p`` the axes) or a.reshape(shape) of a C-contiguous ``a``
 * (``kind`` 1: ``p`` the shape) without the rule's Python: numpy's view of ``a``'s memory
 * (the input's writeable flag, based on ``a``); NULL with no error: another case (the rule:
 * a reshape that copies, an axis out of range, ...) */
static PyObject *layout_view(PyObject *a, PyObject *p, int kind) {
    if (Py_TYPE(a) != (PyTypeObject *)l_ndarray || p == NULL || !PyTuple_Check(p) ||
        numpy_api() != 1)
        return NULL;
    NpHead *h = (NpHead *)a;
    Py_ssize_t nd = PyTuple_GET_SIZE(p), dims[NP_MAXDIMS], strides[NP_MAXDIMS];
    if (nd > NP_MAXDIMS) return NULL;
    if (kind == 0) {
        if (nd != h->nd) return NULL;
        int seen[NP_MAXDIMS] = {0};
        for (Py_ssize_t i = 0; i < nd; i++) {
            Py_ssize_t ax = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, i));
            if (ax < 0 || ax >= nd || seen[ax]) { PyErr_Clear(); return NULL; }
            seen[ax] = 1;
            dims[i] = h->dimensions[ax];
            strides[i] = h->strides[ax];
        }
    } else {
        if (!(h->flags & NP_C_CONTIGUOUS)) return NULL;
        Py_ssize_t n = 1, m = 1;
        for (int j = 0; j < h->nd; j++) n *= h->dimensions[j];
        for (Py_ssize_t i = 0; i < nd; i++) {
            dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, i));
            if (dims[i] < 0) { PyErr_Clear(); return NULL; }
            m *= dims[i];
        }
        if (m != n || n == 0) return NULL; /* (the rule's error, or an empty array) */
    }
    Py_INCREF(h->descr); /* (NewFromDescr takes this reference; no strides: row-major ones) */
    PyObject *v = np_new((PyTypeObject *)l_ndarray, h->descr, (int)nd, dims,
                         kind == 0 ? strides : NULL, h->data,
                         h->flags & (NP_ALIGNED | NP_WRITEABLE), NULL);
    if (v == NULL) return NULL;
    if (np_set_base(v, Py_NewRef(a)) < 0) { Py_DECREF(v); return NULL; } /* (takes it) */
    return v;
}

/* np_api's table and its check: views made both ways agree on every field */
static int numpy_api(void) {
    if (np_api >= 0) return np_api;
    np_api = 0;
    PyObject *m = PyImport_ImportModule("numpy._core._multiarray_umath");
    if (m == NULL) { PyErr_Clear(); m = PyImport_ImportModule("numpy.core._multiarray_umath"); }
    PyObject *caps = m ? PyObject_GetAttrString(m, "_ARRAY_API") : NULL;
    void **api = caps && PyCapsule_CheckExact(caps) ? PyCapsule_GetPointer(caps, NULL) : NULL;
    PyObject *np = api ? PyImport_ImportModule("numpy") : NULL;
    PyObject *u8 = np ? PyObject_CallMethod(np, "dtype", "s", "uint8") : NULL;
    PyObject *f4 = u8 ? PyObject_CallMethod(np, "dtype", "s", "float32") : NULL;
    PyObject *raw = f4 ? PyObject_CallMethod(np, "empty", "iO", 64, u8) : NULL;
    int ok = 0;
    if (raw != NULL && Py_TYPE(raw) == (PyTypeObject *)l_ndarray) {
        np_new = (np_new_fn)api[94];
        np_set_base = (np_base_fn)api[282];
        np_descr_type = (PyTypeObject *)api[3];
        Py_XSETREF(np_u8, Py_NewRef(u8));
        PyObject *shape = Py_BuildValue("(ii)", 2, 3);
        PyObject *args[3] = {shape, f4, raw};
        PyObject *a = shape ? np_view(raw, 24, f4, shape) : NULL;
        PyObject *b = a ? PyObject_Vectorcall(l_ndarray, args, 3, NULL) : NULL;
        if (b != NULL) {
            NpHead *x = (NpHead *)a, *y = (NpHead *)b;
            ok = x->data == y->data && x->nd == y->nd && x->nd == 2 && x->descr == y->descr &&
                 x->flags == y->flags && x->base == raw && y->base == raw &&
                 memcmp(x->dimensions, y->dimensions, 2 * sizeof(Py_ssize_t)) == 0 &&
                 memcmp(x->strides, y->strides, 2 * sizeof(Py_ssize_t)) == 0;
        }
        Py_XDECREF(a); Py_XDECREF(b);
        /* a flat view of raw (adopted memory as Buffer.view flattens it): based on raw too */
        PyObject *flat = ok ? PyObject_CallMethod(raw, "reshape", "i", -1) : NULL;
        PyObject *fargs[3] = {shape, f4, flat};
        a = flat ? np_view(flat, 24, f4, shape) : NULL;
        b = a ? PyObject_Vectorcall(l_ndarray, fargs, 3, NULL) : NULL;
        ok = b != NULL && ((NpHead *)a)->data == ((NpHead *)b)->data &&
             ((NpHead *)a)->flags == ((NpHead *)b)->flags && ((NpHead *)a)->base == raw &&
             ((NpHead *)b)->base == raw;
        Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(flat); Py_XDECREF(shape);
    }
    PyErr_Clear();
    Py_XDECREF(m); Py_XDECREF(caps); Py_XDECREF(np); Py_XDECREF(u8); Py_XDECREF(f4);
    Py_XDECREF(raw);
    return np_api = ok;
}

/* kernels/_handle.c's view in C (kernels/_view_api.h), NULL where that extension is not
 * built (looked for once) */
static ViewApi *view_api(void) {
    static int state = 0; /* 0 not looked for, 1 found, -1 not there */
    static ViewApi *api = NULL;
    if (state == 0) {
        api = PyCapsule_Import(VIEW_API_NAME, 0);
        state = api != NULL && api->abi == VIEW_API_ABI ? 1 : -1;
        if (state < 0) { PyErr_Clear(); api = NULL; }
    }
    return api;
}

/* buf.view(nbytes, dtype, shape) (allocator.Buffer.view): for the host's Buffer over a flat
 * uint8 numpy array, ``np.ndarray(shape, dtype, raw)`` as the method makes it (np_view where
 * numpy's table is usable); a device's buffer type with a view form (kernels/_handle.c
 * view_c: a CUDA buffer's CuPy view over its pointer) in C; any other buffer (adopted
 * memory not yet flattened) through the method */
static PyObject *buffer_view(PyObject *buf, PyObject *nbytes, PyObject *npdt, PyObject *shape) {
    PyObject *raw = Py_TYPE(buf) == (PyTypeObject *)l_buffer_type ? SLOT(buf, buf_raw_off) : NULL;
    if (raw != NULL && Py_TYPE(raw) == (PyTypeObject *)l_ndarray && numpy_api() == 1) {
        Py_ssize_t n = PyLong_AsSsize_t(nbytes);
        if (n < 0) PyErr_Clear(); /* (the constructor's own error, below) */
        PyObject *v = n >= 0 ? np_view(raw, n, npdt, shape) : NULL;
        if (v != NULL || PyErr_Occurred()) return v;
    }
    if (raw != NULL && Py_TYPE(raw) == (PyTypeObject *)l_ndarray) {
        Py_buffer v;
        int flat = 0;
        if (PyObject_GetBuffer(raw, &v, PyBUF_FORMAT | PyBUF_ND) == 0) {
            flat = v.ndim == 1 && v.itemsize == 1 && v.format != NULL && strcmp(v.format, "B") == 0;
            PyBuffer_Release(&v);
        } else {
            PyErr_Clear();
        }
        if (flat) {
            PyObject *args[3] = {shape, npdt, raw};
            return PyObject_Vectorcall(l_ndarray, args, 3, NULL);
        }
    }
    ViewApi *va = raw == NULL ? view_api() : NULL; /* a device's buffer: its view in C */
    if (va != NULL) {
        Py_ssize_t n = PyLong_AsSsize_t(nbytes);
        PyObject *v = n >= 0 ? va->view(buf, n, npdt, shape) : NULL;
        if (v != NULL || PyErr_Occurred()) return v;
    }
    PyObject *vargs[4] = {buf, nbytes, npdt, shape};
    return PyObject_VectorcallMethod(s_view, vargs, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* an output desc's byte count, its shape, numpy dtype and item size (borrowed); -1 with an
 * error set where its dtype or shape cannot be read */
static long long target_bytes(PyObject *t, PyObject **shape, PyObject **npdt, long long *itemsize) {
    PyObject *dtype = SLOT(t, desc_off[D_DTYPE]);
    *shape = SLOT(t, desc_off[D_SHAPE]);
    *npdt = SLOT(dtype, dtype_off[T_NP]);
    *itemsize = PyLong_AsLongLong(SLOT(dtype, dtype_off[T_SIZE]));
    if (*itemsize < 0 || !PyTuple_Check(*shape)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an output without a shape tuple");
        return -1;
    }
    long long nbytes = *itemsize;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(*shape); i++)
        nbytes *= PyLong_AsLongLong(PyTuple_GET_ITEM(*shape, i));
    return PyErr_Occurred() ? -1 : nbytes;
}

/* a fresh output of ``nbytes`` from ``alloc``, viewed in ``shape`` (column order: the reversed
 * shape's view, transposed) and its handle: (new view, *handle) or NULL with an error set */
static PyObject *fresh_out(PyObject *alloc, long long nbytes, PyObject *npdt, PyObject *shape,
                           int forder, PyObject **handle) {
    PyObject *out = NULL, *size = PyLong_FromLongLong(nbytes);
    PyObject *buf = size ? PyObject_CallMethodOneArg(alloc, s_malloc, size) : NULL;
    *handle = NULL;
    if (buf != NULL && forder) {
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        PyObject *rev = PyTuple_New(nd), *v = NULL;
        for (Py_ssize_t i = 0; rev != NULL && i < nd; i++)
            PyTuple_SET_ITEM(rev, i, Py_NewRef(PyTuple_GET_ITEM(shape, nd - 1 - i)));
        v = rev ? buffer_view(buf, size, npdt, rev) : NULL;
        out = v ? PyObject_GetAttr(v, s_T) : NULL;
        Py_XDECREF(rev); Py_XDECREF(v);
    } else if (buf != NULL) {
        out = buffer_view(buf, size, npdt, shape);
    }
    if (out != NULL) {
        *handle = PyObject_CallFunctionObjArgs(l_handle_type, buf, alloc, NULL);
        if (*handle == NULL) Py_CLEAR(out);
    }
    Py_XDECREF(buf);
    Py_XDECREF(size);
    return out;
}

/* whether ``d`` (an input desc) may give its buffer to an output of ``shape``, ``itemsize``
 * and ``nbytes`` (evaluate._donor's checks, in its order) */
static int donates(PyObject *d, PyObject *shape, long long itemsize, long long nbytes) {
    if (Py_REFCNT(d) != 1) return 0; /* held elsewhere than node.inputs */
    PyObject *h = SLOT(d, desc_off[D_BUFFER]), *data = SLOT(d, desc_off[D_DATA]);
    if (h == NULL || h == Py_None || data == NULL || Py_TYPE(data) != (PyTypeObject *)l_ndarray)
        return 0;
    PyObject *dt = SLOT(d, desc_off[D_DTYPE]);
    PyObject *sz = dt ? SLOT(dt, dtype_off[T_SIZE]) : NULL;
    if (sz == NULL || PyLong_AsLongLong(sz) != itemsize) { PyErr_Clear(); return 0; }
    int same = PyObject_RichCompareBool(SLOT(d, desc_off[D_SHAPE]), shape, Py_EQ);
    if (same <= 0) { PyErr_Clear(); return 0; }
    Py_buffer v;
    if (PyObject_GetBuffer(data, &v, PyBUF_WRITABLE | PyBUF_STRIDES) < 0) { /* read-only */
        PyErr_Clear();
        return 0;
    }
    int contiguous = PyBuffer_IsContiguous(&v, 'C') || PyBuffer_IsContiguous(&v, 'F');
    PyBuffer_Release(&v);
    if (!contiguous || Py_REFCNT(h) != 1) return 0;
    PyObject *buf = PyObject_GetAttr(h, s_buffer);
    if (buf == NULL) { PyErr_Clear(); return 0; }
    PyObject *bs = SLOT(buf, buf_size_off);
    long long size = bs ? PyLong_AsLongLong(bs) : -1;
    Py_DECREF(buf);
    if (size < 0) { PyErr_Clear(); return 0; }
    return size <= nbytes + DONATION_SLACK;
}

/* ``donates`` for a device's array (evaluate._donor's checks): the array type's own, its
 * contiguous flag in the order the one-op kernel writes (``forder``: column order, a
 * transposed input's kernel) instead of the buffer protocol */
static int device_donates(PyObject *d, PyObject *shape, long long itemsize, long long nbytes,
                          PyObject *array_type, PyObject *storage_type, int forder) {
    if (Py_REFCNT(d) != 1) return 0;
    PyObject *h = SLOT(d, desc_off[D_BUFFER]), *data = SLOT(d, desc_off[D_DATA]);
    /* (the storage type too: a bfloat16 array's bits, viewed again as the storage type) */
    if (h == NULL || h == Py_None || data == NULL || Py_REFCNT(h) != 1 ||
        (Py_TYPE(data) != (PyTypeObject *)array_type &&
         (storage_type == NULL || Py_TYPE(data) != (PyTypeObject *)storage_type)))
        return 0;
    PyObject *dt = SLOT(d, desc_off[D_DTYPE]);
    PyObject *sz = dt ? SLOT(dt, dtype_off[T_SIZE]) : NULL;
    if (sz == NULL || PyLong_AsLongLong(sz) != itemsize) { PyErr_Clear(); return 0; }
    int same = PyObject_RichCompareBool(SLOT(d, desc_off[D_SHAPE]), shape, Py_EQ);
    if (same <= 0) { PyErr_Clear(); return 0; }
    /* (a storage type's flags are its raw's: read there, without its property's frame) */
    PyObject *raw = Py_TYPE(data) == (PyTypeObject *)storage_type ? PyObject_GetAttr(data, s_raw)
                                                                   : Py_NewRef(data);
    PyObject *flags = raw ? PyObject_GetAttr(raw, s_flags) : NULL;
    Py_XDECREF(raw);
    PyObject *c = flags ? PyObject_GetAttr(flags, forder ? s_f_contiguous : s_c_contiguous) : NULL;
    int contiguous = c == Py_True;
    Py_XDECREF(flags); Py_XDECREF(c);
    if (!contiguous) { PyErr_Clear(); return 0; }
    PyObject *buf = PyObject_GetAttr(h, s_buffer);
    if (buf == NULL) { PyErr_Clear(); return 0; }
    PyObject *bs = SLOT(buf, buf_size_off);
    long long size = bs ? PyLong_AsLongLong(bs) : -1;
    Py_DECREF(buf);
    if (size < 0) { PyErr_Clear(); return 0; }
    return size <= nbytes + DONATION_SLACK;
}

/* the object at the end of ``a``'s ``base`` chain (allocator._owner): a new reference */
static PyObject *owner_of(PyObject *a) {
    PyObject *o = Py_NewRef(a);
    for (;;) {
        PyObject *b = PyObject_GetAttr(o, s_base);
        if (b == NULL) { PyErr_Clear(); return o; }
        if (b == Py_None) { Py_DECREF(b); return o; }
        Py_DECREF(o);
        o = b;
    }
}

/* the owner of the memory of a handle's buffer (Allocator.memory_of(handle.buffer.raw)), new ref */
static PyObject *handle_memory(PyObject *h) {
    PyObject *buf = PyObject_GetAttr(h, s_buffer);
    PyObject *raw = buf ? PyObject_GetAttr(buf, s_raw) : NULL;
    Py_XDECREF(buf);
    if (raw == NULL) return NULL;
    PyObject *m = owner_of(raw);
    Py_DECREF(raw);
    return m;
}

/* evaluate._finish for one output whose result is a numpy array of its dtype and shape:
 * its handle is the out buffer's or an input's (the memory it lives in), or the memory is
 * adopted when it owns it; stored, the node detached. 1 done, 0 declined (nothing done:
 * evaluate._finish runs), -1 error. */
static int finish_one(PyObject *node, PyObject *res, PyObject *out_handle, PyObject *inputs,
                      PyObject *outputs, PyObject *alloc, long long *nbytes) {
    if (PyList_GET_SIZE(outputs) != 1 || Py_TYPE(res) != (PyTypeObject *)l_ndarray) return 0;
    PyObject *target = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
    if (target == NULL) { PyErr_Clear(); return 0; }
    if (target == Py_None || (PyObject *)Py_TYPE(target) != c_desc_type) return 0;
    PyObject *want = SLOT(SLOT(target, desc_off[D_DTYPE]), dtype_off[T_NP]);
    PyObject *dt = PyObject_GetAttr(res, s_dtype);
    int same = dt == NULL ? -1 : dt == want ? 1 : PyObject_RichCompareBool(dt, want, Py_EQ);
    Py_XDECREF(dt);
    if (same <= 0) { PyErr_Clear(); return 0; }
    PyObject *shape = PyObject_GetAttr(res, s_shape);
    same = shape ? PyObject_RichCompareBool(shape, SLOT(target, desc_off[D_SHAPE]), Py_EQ) : -1;
    Py_XDECREF(shape);
    if (same <= 0) { PyErr_Clear(); return 0; }
    PyObject *memory = owner_of(res), *handle = NULL;
    if (out_handle != Py_None) {
        PyObject *m = handle_memory(out_handle);
        if (m == NULL) { Py_DECREF(memory); PyErr_Clear(); return 0; }
        if (m == memory) handle = Py_NewRef(out_handle);
        Py_DECREF(m);
    }
    for (Py_ssize_t i = 0; handle == NULL && i < PyList_GET_SIZE(inputs); i++) {
        PyObject *h = SLOT(PyList_GET_ITEM(inputs, i), desc_off[D_BUFFER]);
        if (h == NULL || h == Py_None) continue;
        PyObject *m = handle_memory(h);
        if (m == NULL) { Py_DECREF(memory); PyErr_Clear(); return 0; }
        if (m == memory) handle = Py_NewRef(h);
        Py_DECREF(m);
    }
    if (handle == NULL) { /* adopted: memory numpy made for the result (Allocator.owner) */
        int owns = 0;
        if (Py_TYPE(memory) == (PyTypeObject *)l_ndarray) {
            PyObject *flags = PyObject_GetAttr(memory, s_flags);
            PyObject *od = flags ? PyObject_GetAttr(flags, s_owndata) : NULL;
            owns = od == Py_True;
            Py_XDECREF(flags); Py_XDECREF(od);
            PyErr_Clear();
        }
        if (!owns) { Py_DECREF(memory); return 0; } /* a copy first: evaluate._store */
        PyObject *buf = PyObject_CallMethodOneArg(alloc, s_adopt, memory);
        handle = buf ? PyObject_CallFunctionObjArgs(l_handle_type, buf, alloc, NULL) : NULL;
        Py_XDECREF(buf);
        if (handle == NULL) { Py_DECREF(memory); return -1; }
    }
    Py_DECREF(memory);
    Py_INCREF(target);
    put(target, desc_off[D_DATA], res);
    put(target, desc_off[D_BUFFER], handle);
    put(target, desc_off[D_NODE], Py_None);
    Py_DECREF(handle);
    Py_DECREF(target);
    if (nbytes != NULL) {
        PyObject *nb = PyObject_GetAttr(res, s_nbytes);
        *nbytes = nb ? PyLong_AsLongLong(nb) : -1;
        Py_XDECREF(nb);
        if (*nbytes < 0) return -1;
    }
    return 1;
}

/* node.inputs = [] (evaluate._detach of a node that is not a tracer's) */
static int detach(PyObject *node) {
    PyObject *empty = PyList_New(0);
    if (empty == NULL) return -1;
    put(node, node_off[N_INPUTS], empty);
    Py_DECREF(empty);
    return 0;
}

/* evaluate._record(prim, node, t0, nbytes) */
static int record(PyObject *prim, PyObject *node, PyObject *t0, long long nbytes) {
    PyObject *nb = PyLong_FromLongLong(nbytes);
    PyObject *r = nb ? PyObject_CallFunctionObjArgs(l_record, prim, node, t0, nb, NULL) : NULL;
    Py_XDECREF(nb);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

#define MAX_RULE_ARGS 48

/* A generated kernel's plan for this call (kernels/kernel_call.py: KernelRule.planned's
 * key, built the same way: the primitive's name, each input's type, dtype, shape and
 * strides, then the parameters as name, value pairs), when the rule is a KernelRule that
 * has made one and it writes ``out`` (its shape and dtype; ``out`` row-contiguous): a new
 * reference. NULL with no error: no plan (the rule runs, and makes the plan on a miss). */
/* (a shape with -1 at ``ax``: a rule's free axis, kernel_call.plan_key's ``free``) */
static PyObject *freed(PyObject *shape, Py_ssize_t ax) {
    if (!PyTuple_Check(shape) || ax < 0 || ax >= PyTuple_GET_SIZE(shape)) return Py_NewRef(shape);
    PyObject *t = PyTuple_New(PyTuple_GET_SIZE(shape)), *m1 = PyLong_FromLong(-1);
    if (t == NULL || m1 == NULL) { Py_XDECREF(t); Py_XDECREF(m1); return NULL; }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(i == ax ? m1 : PyTuple_GET_ITEM(shape, i)));
    Py_DECREF(m1);
    return t;
}

/* whether a plan's per-call sizes take these inputs (kernel_call.sized: each ``dims``
 * entry (input, axis, word, most) has its input's size there at most ``most``) */
static int sized(PyObject *plan, PyObject **ins, Py_ssize_t n) {
    PyObject *dims = PyObject_GetAttrString(plan, "dims");
    if (dims == NULL) { PyErr_Clear(); return 0; }
    int ok = PyTuple_Check(dims);
    for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(dims); k++) {
        PyObject *d = PyTuple_GET_ITEM(dims, k);
        Py_ssize_t i = PyTuple_Check(d) && PyTuple_GET_SIZE(d) == 4 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(d, 0)) : -1;
        Py_ssize_t ax = i >= 0 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(d, 1)) : -1;
        long long most = i >= 0 ? PyLong_AsLongLong(PyTuple_GET_ITEM(d, 3)) : -1;
        ok = i >= 0 && i < n && ax >= 0 && !PyErr_Occurred();
        PyObject *sh = ok ? PyObject_GetAttr(ins[i], s_shape) : NULL;
        ok = sh != NULL && PyTuple_Check(sh) && ax < PyTuple_GET_SIZE(sh) &&
             PyLong_AsLongLong(PyTuple_GET_ITEM(sh, ax)) <= most && !PyErr_Occurred();
        Py_XDECREF(sh);
    }
    PyErr_Clear();
    Py_DECREF(dims);
    return ok;
}

/* whether ``k`` is one of the names of the tuple ``skip`` (NULL: none) */
static int skipped(PyObject *skip, PyObject *k) {
    for (Py_ssize_t i = 0; skip != NULL && i < PyTuple_GET_SIZE(skip); i++) {
        PyObject *s = PyTuple_GET_ITEM(skip, i);
        if (s == k || (PyUnicode_Check(s) && PyUnicode_Check(k) && PyUnicode_Compare(s, k) == 0))
            return 1;
    }
    return 0;
}

/* ``free``: NULL, or the rule's (input, axis) pairs left out of the key (their sizes -1);
 * ``skip``: NULL, or the parameters left out of it (KernelRule.per_call, a tuple) */
static PyObject *plan_in_skip(PyObject *plans, PyObject *name, PyObject **ins, Py_ssize_t n,
                              PyObject *kw, PyObject *shape, PyObject *npdt, PyObject *free,
                              PyObject *skip) {
    Py_ssize_t nkw = 0, kpos = 0;
    PyObject *kk0, *vv0;
    while (PyDict_Next(kw, &kpos, &kk0, &vv0)) nkw += !skipped(skip, kk0);
    PyObject *key = PyTuple_New(1 + 4 * n + 2 * nkw), *plan = NULL;
    if (key == NULL) goto fail;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(name));
    Py_ssize_t k = 1, pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = ins[i], *v;
        PyTuple_SET_ITEM(key, k++, Py_NewRef((PyObject *)Py_TYPE(a)));
        if (!(v = PyObject_GetAttr(a, s_dtype))) goto fail;
        PyTuple_SET_ITEM(key, k++, v);
        if (!(v = PyObject_GetAttr(a, s_shape))) goto fail;
        for (Py_ssize_t f = 0; free != NULL && f < PyTuple_GET_SIZE(free); f++) {
            PyObject *ia = PyTuple_GET_ITEM(free, f);
            if (!PyTuple_Check(ia) || PyTuple_GET_SIZE(ia) != 2 ||
                PyLong_AsSsize_t(PyTuple_GET_ITEM(ia, 0)) != i)
                continue;
            PyObject *w = freed(v, PyLong_AsSsize_t(PyTuple_GET_ITEM(ia, 1)));
            Py_DECREF(v);
            if ((v = w) == NULL) goto fail;
        }
        PyTuple_SET_ITEM(key, k++, v);
        if (!(v = PyObject_GetAttr(a, s_strides))) goto fail;
        PyTuple_SET_ITEM(key, k++, v);
    }
    PyObject *kk, *vv;
    while (PyDict_Next(kw, &pos, &kk, &vv)) {
        if (skipped(skip, kk)) continue;
        PyTuple_SET_ITEM(key, k++, Py_NewRef(kk));
        PyTuple_SET_ITEM(key, k++, Py_NewRef(vv));
    }
    plan = PyDict_GetItemWithError(plans, key); /* an unhashable parameter: no plan */
    if (plan == NULL || plan == Py_None) goto fail;
    PyObject *os = PyObject_GetAttr(plan, s_out_shape), *od = PyObject_GetAttr(plan, s_out_dtype);
    int ok = os != NULL && od != NULL && PyObject_RichCompareBool(os, shape, Py_EQ) == 1 &&
             (od == npdt || PyObject_RichCompareBool(od, npdt, Py_EQ) == 1);
    Py_XDECREF(os); Py_XDECREF(od);
    if (!ok || (free != NULL && !sized(plan, ins, n))) goto fail;
    Py_DECREF(key);
    return Py_NewRef(plan);
fail:
    PyErr_Clear();
    Py_XDECREF(key);
    return NULL;
}

static PyObject *plan_in(PyObject *plans, PyObject *name, PyObject **ins, Py_ssize_t n,
                         PyObject *kw, PyObject *shape, PyObject *npdt) {
    return plan_in_skip(plans, name, ins, n, kw, shape, npdt, NULL, NULL);
}

/* ``skip``: NULL, or the rule's ``per_call`` parameters (a non-empty tuple) */
static PyObject *planned(PyObject *rule, PyObject *name, PyObject **ins, Py_ssize_t n,
                         PyObject *kw, PyObject *out, int out_c, PyObject *shape,
                         PyObject *npdt, PyObject *skip) {
    if (l_kernel_rule == NULL || Py_TYPE(rule) != (PyTypeObject *)l_kernel_rule || !out_c)
        return NULL;
    PyObject *plans = PyObject_GetAttr(rule, s_plans);
    if (plans == NULL || !PyDict_Check(plans)) { Py_XDECREF(plans); PyErr_Clear(); return NULL; }
    PyObject *plan = plan_in_skip(plans, name, ins, n, kw, shape, npdt, NULL, skip);
    if (plan == NULL) { /* a plan taking some sizes per call (KernelRule.free, its dims) */
        PyObject *free = PyObject_GetAttrString(rule, "free");
        if (free != NULL && PyTuple_Check(free) && PyTuple_GET_SIZE(free) > 0)
            plan = plan_in_skip(plans, name, ins, n, kw, shape, npdt, free, skip);
        if (free == NULL) PyErr_Clear();
        Py_XDECREF(free);
    }
    Py_DECREF(plans);
    return plan;
}

/* a donor's data as the output (its buffer given to it): on a device, the donor's array
 * itself where it has the output's dtype already (its layout device_donates checked; the
 * dying donor holds it only: no new CuPy array a donation), else its view in that dtype */
static PyObject *donor_out(PyObject *data, PyObject *npdt, int device) {
    if (device) {
        PyObject *dt = PyObject_GetAttr(data, s_dtype);
        int same = dt != NULL && dt == npdt;
        Py_XDECREF(dt);
        if (same) return Py_NewRef(data);
        PyErr_Clear();
    }
    return PyObject_CallMethodOneArg(data, s_view, npdt);
}

/* A plan's launch word from the call's per-call parameters (KernelRule.per_call;
 * kernel_call.per_call_value): sum(kw[name][d] * coefs[d]) over the plan's ``linear``,
 * written into its host 0-d int64 array ``at``, which is returned (a new reference) to be
 * passed after the call's inputs; NULL with an error set where the plan has none */
static PyObject *per_call_input(PyObject *ln, PyObject *kw) {
    PyObject *linear = PyObject_GetAttr(ln, s_linear);
    PyObject *at = linear ? PyObject_GetAttr(ln, s_at) : NULL;
    if (at == NULL) { Py_XDECREF(linear); return NULL; }
    long long v = 0;
    int ok = PyTuple_Check(linear);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(linear); i++) {
        PyObject *pc = PyTuple_GET_ITEM(linear, i);
        ok = PyTuple_Check(pc) && PyTuple_GET_SIZE(pc) == 2;
        PyObject *vals = ok ? PyDict_GetItemWithError(kw, PyTuple_GET_ITEM(pc, 0)) : NULL;
        PyObject *coefs = ok ? PyTuple_GET_ITEM(pc, 1) : NULL;
        ok = vals != NULL && PyTuple_Check(vals) && PyTuple_Check(coefs) &&
             PyTuple_GET_SIZE(vals) == PyTuple_GET_SIZE(coefs);
        for (Py_ssize_t d = 0; ok && d < PyTuple_GET_SIZE(vals); d++)
            v += PyLong_AsLongLong(PyTuple_GET_ITEM(vals, d)) * PyLong_AsLongLong(PyTuple_GET_ITEM(coefs, d));
        if (PyErr_Occurred()) ok = 0;
    }
    Py_buffer b;
    if (ok && PyObject_GetBuffer(at, &b, PyBUF_WRITABLE | PyBUF_STRIDES) == 0) {
        ok = b.len == (Py_ssize_t)sizeof v && b.itemsize == (Py_ssize_t)sizeof v;
        if (ok) memcpy(b.buf, &v, sizeof v);
        PyBuffer_Release(&b);
    } else {
        ok = 0;
    }
    Py_DECREF(linear);
    if (!ok) {
        Py_DECREF(at);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a plan's per-call word: no linear / at");
        return NULL;
    }
    return at;
}

/* A host fused call with several outputs (an optimizer's update: the parameter and its
 * moments), from its Launch's KernelCall (cpu/compiled.py): each output into a donor's
 * buffer where an input may give it (evaluate._donor's test, ``donates``, inputs in order,
 * one output each as allocate_outputs gives them) and is row-contiguous, else a fresh
 * allocator buffer in the row-major layout the kernel writes (the Launch's ``order`` "C").
 * 1: ran; 0: declined, nothing done (run_compiled); -1: an error. */
static int run_outputs(PyObject *node, PyObject *ln, PyObject **args, Py_ssize_t n,
                       PyObject *inputs, PyObject *outputs, BackendInfo *bi, int recording,
                       PyObject *prim, PyObject *t0) {
    Py_ssize_t m = PyList_GET_SIZE(outputs);
    if (n + m + 1 > MAX_RULE_ARGS) return 0;
    PyObject *kc = PyObject_GetAttr(ln, s_kernel_call), *order = PyObject_GetAttr(ln, s_order);
    int rc = 0;
    PyObject *targets[MAX_RULE_ARGS], *outs[MAX_RULE_ARGS], *handles[MAX_RULE_ARGS];
    Py_ssize_t made = 0, next_donor = 0;
    long long total = 0;
    if (kc == NULL || order == NULL) { PyErr_Clear(); goto done; }
    if (kc == Py_None || !PyUnicode_Check(order) ||
        PyUnicode_CompareWithASCIIString(order, "C") != 0)
        goto done;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *t = PyWeakref_GetObject(PyList_GET_ITEM(outputs, j));
        if (t == NULL) { PyErr_Clear(); goto done; }
        if (t == Py_None || (PyObject *)Py_TYPE(t) != c_desc_type) goto done; /* Python */
        targets[j] = t;
    }
    for (; made < m; made++) {
        PyObject *t = targets[made], *out = NULL, *handle = NULL;
        PyObject *shape, *npdt;
        long long itemsize, nbytes = target_bytes(t, &shape, &npdt, &itemsize);
        if (nbytes < 0) { rc = -1; goto done; }
        for (; next_donor < n && out == NULL; next_donor++) {
            PyObject *d = PyList_GET_ITEM(inputs, next_donor);
            if (!donates(d, shape, itemsize, nbytes)) continue;
            PyObject *v = PyObject_CallMethodOneArg(SLOT(d, desc_off[D_DATA]), s_view, npdt);
            Py_buffer b;
            int c = v != NULL && PyObject_GetBuffer(v, &b, PyBUF_WRITABLE | PyBUF_STRIDES) == 0;
            if (c) { c = PyBuffer_IsContiguous(&b, 'C'); PyBuffer_Release(&b); }
            PyErr_Clear();
            if (!c) { Py_XDECREF(v); continue; }
            out = v;
            handle = Py_NewRef(SLOT(d, desc_off[D_BUFFER]));
        }
        if (out == NULL) out = fresh_out(bi->alloc, nbytes, npdt, shape, 0, &handle);
        if (out == NULL || handle == NULL) { Py_XDECREF(out); Py_XDECREF(handle); rc = -1; goto done; }
        outs[made] = out, handles[made] = handle;
        total += nbytes;
    }
    PyObject *cargs[MAX_RULE_ARGS];
    for (Py_ssize_t i = 0; i < n; i++) cargs[i] = args[1 + i];
    for (Py_ssize_t j = 0; j < m; j++) cargs[n + j] = outs[j];
    if (call_none(PyObject_Vectorcall(kc, cargs, n + m, NULL)) < 0) { rc = -1; goto done; }
    for (Py_ssize_t j = 0; j < m; j++) {
        put(targets[j], desc_off[D_DATA], outs[j]);
        put(targets[j], desc_off[D_BUFFER], handles[j]);
        put(targets[j], desc_off[D_NODE], Py_None);
    }
    if (detach(node) < 0 || count_path(PATH_FUSED) < 0) { rc = -1; goto done; }
    if (recording && record(prim, node, t0, total) < 0) { rc = -1; goto done; }
    rc = 1;
done:
    for (Py_ssize_t j = 0; j < made; j++) { Py_DECREF(outs[j]); Py_DECREF(handles[j]); }
    Py_XDECREF(kc);
    Py_XDECREF(order);
    return rc;
}

/* A device's loaded fused call, of one output or several (a compiled step's optimizer
 * update: a parameter and its moments), from its plan (cuda/compiled.py Launch): each output,
 * in the tape's order, into the buffer of the next input that may give it (inputs walked
 * once, in order, as the CPU's run_outputs and cuda/compiled.py _outputs walk them: its
 * value reads the input, the plan's ``reads`` mask, as the kernels' pointers are
 * __restrict__; device_donates' tests in the order the plan writes), else a fresh allocator
 * buffer in that order; then the backend's C launch (several outputs as a tuple), else its
 * launch_fused (evaluate._gpu_fused_launch does the same steps in Python).
 * 1: ran; 0: declined, nothing done (the Python path); -1: an error. */
static int device_outputs(PyObject *node, PyObject *ln, PyObject **args, Py_ssize_t n,
                          PyObject *inputs, PyObject *outputs, PyObject *ins, PyObject *stream,
                          BackendInfo *bi, int recording, PyObject *prim, PyObject *t0) {
    Py_ssize_t m = PyList_GET_SIZE(outputs);
    if (m > MAX_RULE_ARGS) return 0;
    PyObject *targets[MAX_RULE_ARGS], *outs[MAX_RULE_ARGS], *handles[MAX_RULE_ARGS];
    unsigned long long masks[MAX_RULE_ARGS];
    Py_ssize_t made = 0, next_donor = 0, held = 0;
    long long total = 0;
    int rc = 0, forder = 0, donors = 0, launched = 0;
    PyObject *outarg = NULL, *index = NULL;
    PyObject *order = PyObject_GetAttr(ln, s_order), *reads = NULL;
    if (order == NULL || !PyUnicode_Check(order)) { PyErr_Clear(); goto done; }
    forder = PyUnicode_Compare(order, s_F) == 0;
    if (!forder && PyUnicode_CompareWithASCIIString(order, "C") != 0) goto done;
    /* no ``reads`` (not a fused tape's plan): no input gives its buffer */
    reads = PyObject_GetAttr(ln, s_reads);
    if (reads == NULL) PyErr_Clear();
    donors = reads != NULL && PyTuple_Check(reads) && PyTuple_GET_SIZE(reads) == m && n <= 64;
    for (Py_ssize_t j = 0; donors && j < m; j++) {
        masks[j] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(reads, j));
        if (PyErr_Occurred()) { PyErr_Clear(); donors = 0; }
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *t = PyWeakref_GetObject(PyList_GET_ITEM(outputs, j));
        if (t == NULL) { PyErr_Clear(); goto done; }
        if (t == Py_None || (PyObject *)Py_TYPE(t) != c_desc_type) goto done; /* Python */
        targets[held++] = Py_NewRef(t);
    }
    for (; made < m; made++) {
        PyObject *t = targets[made], *out = NULL, *handle = NULL;
        PyObject *shape, *npdt;
        long long itemsize, nbytes = target_bytes(t, &shape, &npdt, &itemsize);
        if (nbytes < 0) { rc = -1; goto done; }
        for (; donors && next_donor < n && out == NULL; next_donor++) {
            if (!((masks[made] >> next_donor) & 1)) continue;
            PyObject *d = PyList_GET_ITEM(inputs, next_donor);
            if (!device_donates(d, shape, itemsize, nbytes, bi->array_type, bi->storage_type,
                                forder))
                continue;
            PyObject *v = donor_out(SLOT(d, desc_off[D_DATA]), npdt, 1);
            if (v == NULL) { PyErr_Clear(); continue; }
            out = v;
            handle = Py_NewRef(SLOT(d, desc_off[D_BUFFER]));
        }
        if (out == NULL) out = fresh_out(bi->alloc, nbytes, npdt, shape, forder, &handle);
        if (out == NULL || handle == NULL) { Py_XDECREF(out); Py_XDECREF(handle); rc = -1; goto done; }
        outs[made] = out, handles[made] = handle;
        total += nbytes;
    }
    if (m == 1) {
        outarg = Py_NewRef(outs[0]);
    } else {
        if ((outarg = PyTuple_New(m)) == NULL) { rc = -1; goto done; }
        for (Py_ssize_t j = 0; j < m; j++) PyTuple_SET_ITEM(outarg, j, Py_NewRef(outs[j]));
    }
    if (bi->api != NULL) { /* the backend's launch in C (kernels/_device_api.h) */
        if ((index = PyObject_GetAttr(stream, s_index)) == NULL) { rc = -1; goto done; }
        launched = bi->api->launch(ln, &args[1], n, outarg, index);
        if (launched < 0) { rc = -1; goto done; }
    }
    if (launched == 0) {
        PyObject *largs[5] = {bi->be, stream, ln, ins, outarg};
        if (call_none(PyObject_VectorcallMethod(s_launch_fused, largs,
                                                5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)) < 0) {
            rc = -1;
            goto done;
        }
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        put(targets[j], desc_off[D_DATA], outs[j]);
        put(targets[j], desc_off[D_BUFFER], handles[j]);
        put(targets[j], desc_off[D_NODE], Py_None);
    }
    if (detach(node) < 0 || count_path(PATH_FUSED_DEVICE) < 0) { rc = -1; goto done; }
    if (recording && record(prim, node, t0, total) < 0) { rc = -1; goto done; }
    rc = 1;
done:
    for (Py_ssize_t j = 0; j < made; j++) { Py_DECREF(outs[j]); Py_DECREF(handles[j]); }
    for (Py_ssize_t j = 0; j < held; j++) Py_DECREF(targets[j]);
    Py_XDECREF(order); Py_XDECREF(reads); Py_XDECREF(outarg); Py_XDECREF(index);
    return rc;
}

/* A device's view node of host data holding one value (a Python scalar's 0-d array, which
 * a GPU keeps on the host), of the same dtype: that value broadcast to the view's shape, a
 * read-only stride-0 host array over the input's memory keeping the input's buffer
 * (evaluate._host_view; what else it takes runs there). 1 ran, 0 declined, -1 error. */
static int device_view(PyObject *node, PyObject *prim, PyObject *defn, PyObject *inputs,
                       PyObject *outputs, BackendInfo *bi);

static int host_view(PyObject *node, PyObject *prim, PyObject *inputs, PyObject *outputs) {
    if (PyList_GET_SIZE(inputs) != 1 || PyList_GET_SIZE(outputs) != 1) return 0;
    PyObject *d = PyList_GET_ITEM(inputs, 0);
    if ((PyObject *)Py_TYPE(d) != c_desc_type) return 0;
    PyObject *data = SLOT(d, desc_off[D_DATA]);
    if (data == NULL || Py_TYPE(data) != (PyTypeObject *)l_ndarray) return 0;
    PyObject *target = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
    if (target == NULL) { PyErr_Clear(); return 0; }
    if (target == Py_None || (PyObject *)Py_TYPE(target) != c_desc_type ||
        SLOT(target, desc_off[D_DTYPE]) != SLOT(d, desc_off[D_DTYPE]))
        return 0;
    PyObject *dshape = SLOT(d, desc_off[D_SHAPE]), *shape = SLOT(target, desc_off[D_SHAPE]);
    if (!PyTuple_Check(dshape) || PyTuple_GET_SIZE(dshape) != 0 || !PyTuple_Check(shape)) return 0;
    PyObject *dtype = SLOT(target, desc_off[D_DTYPE]);
    long long nbytes = PyLong_AsLongLong(SLOT(dtype, dtype_off[T_SIZE]));
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    PyObject *zeros = NULL, *zero = NULL, *npdt = NULL, *v = NULL;
    int rc = -1;
    if (nbytes < 0) goto done;
    for (Py_ssize_t i = 0; i < nd; i++) nbytes *= PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (PyErr_Occurred()) goto done;
    /* the read-only stride-0 view made by numpy's C API (broadcast_view), else
     * np.ndarray(shape, dtype, buf, 0, strides) with its writeable flag off */
    v = broadcast_view(data, shape);
    if (v != NULL) goto made;
    if (PyErr_Occurred() || (zeros = PyTuple_New(nd)) == NULL || (zero = PyLong_FromLong(0)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nd; i++) PyTuple_SET_ITEM(zeros, i, Py_NewRef(zero));
    if ((npdt = PyObject_GetAttr(data, s_dtype)) == NULL) goto done;
    PyObject *args[5] = {shape, npdt, data, zero, zeros}; /* np.ndarray(shape, dtype, buf, 0, strides) */
    v = PyObject_Vectorcall(l_ndarray, args, 5, NULL);
    if (v == NULL) { /* no buffer form (bfloat16): the Python path */
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError) &&
            !PyErr_ExceptionMatches(PyExc_BufferError))
            goto done;
        PyErr_Clear();
        rc = 0;
        goto done;
    }
    PyObject *flags = PyObject_GetAttr(v, s_flags); /* a broadcast: writing it would write the scalar */
    int bad = flags == NULL || PyObject_SetAttrString(flags, "writeable", Py_False) < 0;
    Py_XDECREF(flags);
    if (bad) goto done;
made:;
    PyObject *enabled = PyObject_GetAttr(l_timeline, s_enabled), *t0 = NULL;
    if (enabled == NULL) goto done;
    if (enabled == Py_True && (t0 = PyObject_CallNoArgs(l_now)) == NULL) { Py_DECREF(enabled); goto done; }
    Py_INCREF(target);
    put(target, desc_off[D_DATA], v);
    put(target, desc_off[D_BUFFER], SLOT(d, desc_off[D_BUFFER]));
    put(target, desc_off[D_NODE], Py_None);
    Py_DECREF(target);
    rc = detach(node) < 0 || count_path(PATH_VIEW) < 0 ||
         (t0 != NULL && record(prim, node, t0, nbytes) < 0) ? -1 : 1;
    Py_DECREF(enabled);
    Py_XDECREF(t0);
done:
    Py_XDECREF(zeros); Py_XDECREF(zero); Py_XDECREF(npdt); Py_XDECREF(v);
    return rc;
}

/* whether ``a``'s flags say it is C-contiguous (0 with no error otherwise) */
static int c_contiguous(PyObject *a) {
    PyObject *flags = PyObject_GetAttr(a, s_flags);
    PyObject *c = flags ? PyObject_GetAttr(flags, s_c_contiguous) : NULL;
    int yes = c == Py_True;
    Py_XDECREF(flags); Py_XDECREF(c);
    if (!yes) PyErr_Clear();
    return yes;
}

/* rules/indexing.py's Slice: a[_slices(start, end, strides)], the slices made here (with a
 * negative step, a start of -1 is an empty slice and an end of -1 runs to index 0): a new
 * reference, or NULL (an error set, or none: not Slice's parameters, the rule runs) */
static PyObject *slice_view(PyObject *a, PyObject *kw) {
    PyObject *st = PyDict_GetItemWithError(kw, s_start_indices);
    PyObject *en = st ? PyDict_GetItemWithError(kw, s_end_indices) : NULL;
    PyObject *sp = en ? PyDict_GetItemWithError(kw, s_strides_kw) : NULL;
    if (sp == NULL || !PyTuple_Check(st) || !PyTuple_Check(en) || !PyTuple_Check(sp) ||
        PyTuple_GET_SIZE(en) != PyTuple_GET_SIZE(st) || PyTuple_GET_SIZE(sp) != PyTuple_GET_SIZE(st))
        return NULL;
    Py_ssize_t nd = PyTuple_GET_SIZE(st);
    PyObject *idx = PyTuple_New(nd), *res = NULL;
    if (idx == NULL) return NULL;
    for (Py_ssize_t d = 0; d < nd; d++) {
        PyObject *b = PyTuple_GET_ITEM(st, d), *e = PyTuple_GET_ITEM(en, d), *k = PyTuple_GET_ITEM(sp, d);
        long long bv = PyLong_AsLongLong(b), ev = PyLong_AsLongLong(e), kv = PyLong_AsLongLong(k);
        if (PyErr_Occurred()) goto done;
        PyObject *sl;
        if (kv < 0 && bv < 0) { /* (empty) */
            PyObject *z = PyLong_FromLong(0);
            sl = z ? PySlice_New(z, z, NULL) : NULL;
            Py_XDECREF(z);
        } else {
            sl = PySlice_New(b, kv < 0 && ev < 0 ? Py_None : e, k);
        }
        if (sl == NULL) goto done;
        PyTuple_SET_ITEM(idx, d, sl);
    }
    res = PyObject_GetItem(a, idx);
done:
    Py_DECREF(idx);
    return res;
}

/* ``storage_type(raw)``: a BF16Array made without its __init__'s frame by _handle.c's
 * wrap (kernels/_view_api.h), by its constructor where that extension is not built */
static PyObject *storage_wrap(PyObject *type, PyObject *raw) {
    ViewApi *va = view_api();
    return va != NULL ? va->wrap(type, raw) : PyObject_CallOneArg(type, raw);
}

/* A device's view of its first input that never copies (its definition's view strides
 * follow from the parameters: Broadcast, Transpose, Squeeze, ExpandDims; or a reshape of a
 * C-contiguous input: Reshape, Flatten, Unflatten): the definition's rule with the device's
 * array module, no device context (no kernel runs), the result in the input's buffer
 * (evaluate._store finds that handle by the memory). 1 ran, 0 declined, -1 error. */
static int device_view(PyObject *node, PyObject *prim, PyObject *defn, PyObject *inputs,
                       PyObject *outputs, BackendInfo *bi) {
    Py_ssize_t n = PyList_GET_SIZE(inputs);
    PyObject *kw = SLOT(prim, prim_off[P_KW]);
    /* a reshape without view strides may copy: only a C-contiguous input's (checked below) */
    int reshape = SLOT(defn, defn_off[F_VIEW_STRIDES]) == Py_None;
    if (n < 1 || n + 1 > MAX_RULE_ARGS || PyList_GET_SIZE(outputs) != 1 ||
        (reshape && (n != 1 || SLOT(defn, defn_off[F_RULE]) != l_reshape_view)) || kw == NULL ||
        !PyDict_Check(kw))
        return 0;
    PyObject *args[MAX_RULE_ARGS];
    args[0] = bi->xp;
    int wrapped = 0; /* inputs of the backend's storage type: the rule views their ``raw`` */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(inputs, i);
        if ((PyObject *)Py_TYPE(d) != c_desc_type) return 0;
        PyObject *data = SLOT(d, desc_off[D_DATA]);
        if (data == NULL) return 0;
        if (bi->storage_type != NULL && Py_TYPE(data) == (PyTypeObject *)bi->storage_type &&
            (i == 0 || wrapped)) {
            wrapped = 1;
            continue;
        }
        if (Py_TYPE(data) != (PyTypeObject *)bi->array_type || wrapped) return 0;
        args[1 + i] = data;
    }
    PyObject *d0 = PyList_GET_ITEM(inputs, 0), *handle = SLOT(d0, desc_off[D_BUFFER]);
    if (handle == NULL || handle == Py_None) return 0;
    PyObject *target = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
    if (target == NULL) { PyErr_Clear(); return 0; }
    if (target == Py_None || (PyObject *)Py_TYPE(target) != c_desc_type) return 0;
    for (Py_ssize_t i = 0; wrapped && i < n; i++) { /* the storage: new references */
        PyObject *raw = PyObject_GetAttr(SLOT(PyList_GET_ITEM(inputs, i), desc_off[D_DATA]), s_raw);
        if (raw == NULL || Py_TYPE(raw) != (PyTypeObject *)bi->array_type) {
            for (Py_ssize_t j = 0; j < i; j++) Py_DECREF(args[1 + j]);
            Py_XDECREF(raw);
            PyErr_Clear();
            return 0;
        }
        args[1 + i] = raw;
    }
    if (reshape && !c_contiguous(args[1])) {
        if (wrapped) Py_DECREF(args[1]);
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(target);
    for (Py_ssize_t i = 0; i <= n; i++) if (!wrapped || i == 0) Py_INCREF(args[i]);
    Py_INCREF(handle);
    int rc = -1;
    PyObject *enabled = PyObject_GetAttr(l_timeline, s_enabled), *t0 = NULL, *res = NULL;
    if (enabled == NULL) goto done;
    if (enabled == Py_True && (t0 = PyObject_CallNoArgs(l_now)) == NULL) goto done;
    PyObject *rule = SLOT(defn, defn_off[F_RULE]);
    /* rules/shape.py's reshape and transpose: the array's method they call, called here */
    PyObject *p = n != 1 ? NULL : rule == l_reshape_view ? PyDict_GetItemWithError(kw, s_shape)
                : rule == l_transpose_view ? PyDict_GetItemWithError(kw, s_axes) : NULL;
    if (p != NULL) {
        PyObject *margs[2] = {args[1], p};
        res = PyObject_VectorcallMethod(rule == l_reshape_view ? s_reshape : s_transpose, margs,
                                        2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    } else if (n == 1 && rule == l_slice_view && !PyErr_Occurred() &&
               (res = slice_view(args[1], kw)) != NULL) {
        /* (Slice: the array's own basic indexing, as the rule does it) */
    } else if (PyErr_Occurred()) {
        res = NULL;
    } else {
        res = PyErr_Occurred() ? NULL : call_rule(rule, args, n + 1, NULL, kw);
    }
    if (res == NULL) goto done;
    if (Py_TYPE(res) != (PyTypeObject *)bi->array_type) { rc = 0; goto done; } /* Python: _store */
    if (wrapped) { /* the view of the storage, as the storage type (a bfloat16 array's bits) */
        Py_SETREF(res, storage_wrap(bi->storage_type, res));
        if (res == NULL) goto done;
    }
    PyObject *dt = PyObject_GetAttr(res, s_dtype), *sh = dt ? PyObject_GetAttr(res, s_shape) : NULL;
    PyObject *want = SLOT(SLOT(target, desc_off[D_DTYPE]), dtype_off[T_NP]);
    int same = sh != NULL && (dt == want || PyObject_RichCompareBool(dt, want, Py_EQ) == 1) &&
               PyObject_RichCompareBool(sh, SLOT(target, desc_off[D_SHAPE]), Py_EQ) == 1;
    Py_XDECREF(dt); Py_XDECREF(sh);
    if (PyErr_Occurred()) goto done;
    if (!same) { rc = 0; goto done; } /* (nothing stored: the Python path runs it again) */
    put(target, desc_off[D_DATA], res);
    put(target, desc_off[D_BUFFER], handle);
    put(target, desc_off[D_NODE], Py_None);
    long long nbytes = 0;
    if (t0 != NULL) {
        PyObject *nb = PyObject_GetAttr(res, s_nbytes);
        nbytes = nb ? PyLong_AsLongLong(nb) : -1;
        Py_XDECREF(nb);
        if (nbytes < 0) goto done;
    }
    rc = detach(node) < 0 || count_path(PATH_VIEW) < 0 ||
         (t0 != NULL && record(prim, node, t0, nbytes) < 0) ? -1 : 1;
done:
    for (Py_ssize_t i = 0; i <= n; i++) Py_DECREF(args[i]);
    Py_DECREF(target); Py_DECREF(handle);
    Py_XDECREF(enabled); Py_XDECREF(t0); Py_XDECREF(res);
    return rc;
}

/* the element count of a node's single output (-1: not known, or nobody holds it) */
static long long out_elems(PyObject *outputs) {
    PyObject *t = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
    if (t == NULL) { PyErr_Clear(); return -1; }
    if (t == Py_None || (PyObject *)Py_TYPE(t) != c_desc_type) return -1;
    PyObject *shape = SLOT(t, desc_off[D_SHAPE]);
    if (shape == NULL || !PyTuple_Check(shape)) return -1;
    long long n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++)
        n *= PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (PyErr_Occurred()) { PyErr_Clear(); return -1; }
    return n;
}

/* 1: ran the node; 0: declined, nothing done (the Python path runs it); -1: an error */
static int run_host(PyObject *node) {
    if (!loop_configured || (PyObject *)Py_TYPE(node) != c_node_type) return 0;
    if (SLOT(node, node_off[N_KEEP]) != Py_False) return 0; /* a tracer's: tracer.keep */
    PyObject *prim = SLOT(node, node_off[N_PRIMITIVE]);
    PyObject *stream = SLOT(prim, prim_off[P_STREAM]), *defn = SLOT(prim, prim_off[P_DEFN]);
    PyObject *kw = SLOT(prim, prim_off[P_KW]);
    PyObject *inputs = SLOT(node, node_off[N_INPUTS]), *outputs = SLOT(node, node_off[N_OUTPUTS]);
    if (stream == NULL || defn == NULL || kw == NULL || !PyDict_Check(kw) || inputs == NULL ||
        !PyList_CheckExact(inputs) || outputs == NULL || !PyList_CheckExact(outputs))
        return 0;
    int fused = SLOT(defn, defn_off[F_RUNTIME]) == Py_True; /* a fused tape (Compiled) */
    BackendInfo *bi = stream_info(stream);
    if (bi == NULL) return PyErr_Occurred() ? -1 : 0; /* (an interrupt kept by the probe) */
    int elementwise = SLOT(defn, defn_off[F_ELEMENTWISE]) == Py_True;
    /* an eager elementwise op (or a cast, where the backend's plans take casts) with a
     * one-op kernel of the backend (eager_kernel), planned and launched as a loaded fused
     * call is (evaluate._one_op, _eager_launch): a device's, or the host's from its min_size
     * on (the rule where it has no plan) */
    int one_op = elementwise || (bi->eager_casts && SLOT(defn, defn_off[F_FAMILY]) == s_astype);
    int eager = !fused && one_op && bi->eager_for != NULL && PyList_GET_SIZE(outputs) == 1 &&
                (!bi->host || out_elems(outputs) >= bi->eager_min);
    /* a device's node whose backend has a generated kernel's rule (Backend.kernel_rules, a
     * KernelRule: cuda/primitive_plans.py): launched from the plan a call of this layout
     * made, by the backend's C launch, into a fresh buffer (the kernels' buffers are
     * __restrict__: no donation); no plan yet: the Python path, in the device context */
    PyObject *krule = NULL;
    if (!bi->host && !fused && !eager && bi->api != NULL && l_kernel_rule != NULL &&
        PyList_GET_SIZE(outputs) == 1) {
        krule = PyDict_GetItemWithError(bi->kernel_rules, SLOT(prim, prim_off[P_NAME]));
        if (krule == NULL) PyErr_Clear();
        else if (Py_TYPE(krule) != (PyTypeObject *)l_kernel_rule) krule = NULL;
    }
    int kdev = krule != NULL;
    if (!bi->host && !fused && SLOT(defn, defn_off[F_VIEW]) == Py_True) {
        int r = host_view(node, prim, inputs, outputs);
        return r != 0 ? r : device_view(node, prim, defn, inputs, outputs, bi);
    }
    if (!bi->host && !fused && !eager && !kdev) return 0; /* a device's other nodes: Python */
    PyObject *be = bi->be;
    if (fused ? bi->launch_for == Py_None
              : !eager && SLOT(defn, defn_off[F_DONATABLE]) != Py_False)
        return 0;
    int from_plan = fused || eager || kdev; /* launched from a plan, not a rule */
    Py_ssize_t n = PyList_GET_SIZE(inputs), nkw = PyDict_GET_SIZE(kw);
    if (n + nkw + 2 > MAX_RULE_ARGS) return 0;
    PyObject *args[MAX_RULE_ARGS];
    args[0] = bi->xp;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(inputs, i);
        if ((PyObject *)Py_TYPE(d) != c_desc_type) return 0;
        /* a device's plans read its storage type (bfloat16's) themselves: its eager op's
         * plan (or eager_kernel), a kernel rule's plan and a fused call's are keyed by the
         * inputs' types (a fused call's by its tape), and take them or decline (the Python
         * path), a host scalar by value too (the C launch reads its bits through the buffer
         * protocol without a format, which bfloat16's numpy array gives); elsewhere a
         * bfloat16 elementwise rule computes in float32 (evaluate._run's upcast) */
        PyObject *data = SLOT(d, desc_off[D_DATA]);
        if (data == NULL) return 0;
        int storage = !bi->host && (eager || kdev || fused) && bi->storage_type != NULL &&
                      Py_TYPE(data) == (PyTypeObject *)bi->storage_type;
        int by_value = !bi->host && eager && Py_TYPE(data) == (PyTypeObject *)l_ndarray;
        if (elementwise && !storage && !by_value && SLOT(d, desc_off[D_DTYPE]) == l_bf16) return 0;
        if (Py_TYPE(data) != (PyTypeObject *)bi->array_type && /* a host scalar: by value */
            !((eager || fused) && Py_TYPE(data) == (PyTypeObject *)l_ndarray) && !storage)
            return 0;
        /* (on a device an input only the node holds may donate: an eager op's donor is
         * chosen below, as evaluate._donor does, a fused call's by device_outputs) */
        args[1 + i] = data;
    }
    int view = !fused && SLOT(defn, defn_off[F_VIEW]) == Py_True;
    int takes_out = from_plan || (!view && SLOT(defn, defn_off[F_OUT]) == Py_True &&
                              PyList_GET_SIZE(outputs) == 1);
    PyObject *target = NULL, *out = NULL, *handle = NULL, *res = NULL, *t0 = NULL,
             *ins = NULL, *ln = NULL, *plan = NULL;
    long long nbytes = 0;
    Py_ssize_t kdonor = -1; /* a kernel rule's input that may give its buffer (KernelRule.donor) */
    PyObject *at = NULL; /* a kernel plan's per-call word, passed after the inputs */
    int out_c = 0; /* out is row-contiguous and writeable (a plan may write it) */
    int forder = 0; /* a device's one-op kernel writes column order (a transposed input's) */
    if (takes_out) {
        target = PyWeakref_GetObject(PyList_GET_ITEM(outputs, 0));
        if (target == NULL) { PyErr_Clear(); return 0; }
        if (target == Py_None) return 0; /* nobody wants the result: the Python path */
    }
    /* from here the node runs: hold what the rule gets */
    for (Py_ssize_t i = 0; i <= n; i++) Py_INCREF(args[i]);
    Py_XINCREF(target);
    /* the backend's generated kernel for the primitive where it has one (Backend.kernel_rules),
     * else the definition's rule; the definition's flags either way, as evaluate._run */
    PyObject *rule = PyDict_GetItemWithError(bi->kernel_rules, SLOT(prim, prim_off[P_NAME]));
    if (rule == NULL && PyErr_Occurred()) PyErr_Clear();
    rule = Py_NewRef(rule != NULL ? rule : SLOT(defn, defn_off[F_RULE]));
    int rc = -1;
    PyObject *enabled = module_attr(l_timeline, s_enabled);
    if (enabled == NULL) goto done;
    if (enabled == Py_True && (t0 = PyObject_CallNoArgs(l_now)) == NULL) goto done;
    if (t0 == NULL) t0 = PyLong_FromLong(0);
    if (t0 == NULL) goto done;
    if (fused) { /* the launch plan made for these layouts, its kernel loaded (launch_for) */
        PyObject *tape = PyDict_GetItemWithError(kw, s_tape);
        PyObject *shape = tape ? PyDict_GetItemWithError(kw, s_shape) : NULL;
        ins = shape ? PyList_New(n) : NULL;
        if (ins == NULL) { if (!PyErr_Occurred()) rc = 0; goto done; }
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(ins, i, Py_NewRef(args[1 + i]));
        PyObject *largs[3] = {tape, ins, shape}; /* (a PlanLookup: C, kernel_call.py) */
        ln = PyObject_Vectorcall(bi->launch_for, largs, 3, NULL);
        if (ln == NULL) goto done;
        if (ln == Py_None && !bi->host && bi->eager_plans != NULL && target != NULL) {
            /* a device's call with host scalars taken by value: the plan a call of these
             * layouts made (eager_kernel.fused, kept in its plans), else the Python path */
            Py_DECREF(ln);
            /* (a plan of several outputs has no single out_dtype: None) */
            ln = plan_in(bi->eager_plans, SLOT(prim, prim_off[P_NAME]), &args[1], n, kw,
                         SLOT(target, desc_off[D_SHAPE]),
                         PyList_GET_SIZE(outputs) != 1 ? Py_None
                         : SLOT(SLOT(target, desc_off[D_DTYPE]), dtype_off[T_NP]));
            if (ln == NULL) { rc = 0; goto done; }
        }
        if (ln == Py_None) { rc = 0; goto done; } /* run_compiled: the Python path */
        if (!bi->host) { /* a device's: its outputs (donors, fresh buffers) and launch */
            rc = device_outputs(node, ln, args, n, inputs, outputs, ins, stream, bi,
                                enabled == Py_True, prim, t0);
            goto done;
        }
        if (PyList_GET_SIZE(outputs) != 1) { /* several outputs: the Launch's KernelCall */
            rc = run_outputs(node, ln, args, n, inputs, outputs, bi, enabled == Py_True,
                             prim, t0);
            goto done;
        }
    } else if (kdev) { /* the plan a call of this layout made (KernelRule.plans), or Python */
        PyObject *per = PyObject_GetAttr(krule, s_per_call); /* (KernelRule.per_call) */
        if (per == NULL) goto done;
        int pc = PyTuple_Check(per) && PyTuple_GET_SIZE(per) > 0;
        ln = planned(krule, SLOT(prim, prim_off[P_NAME]), &args[1], n, kw, NULL, 1,
                     SLOT(target, desc_off[D_SHAPE]),
                     SLOT(SLOT(target, desc_off[D_DTYPE]), dtype_off[T_NP]), pc ? per : NULL);
        Py_DECREF(per);
        if (ln == NULL) { rc = PyErr_Occurred() ? -1 : 0; goto done; }
        /* the plan's per-call word (its ``at``), one more input after the call's */
        if (pc && (at = per_call_input(ln, kw)) == NULL) goto done;
        /* a rule whose plans may write an input's own buffer (KernelRule.donor: a
         * SliceUpdate's input, its plan's ``in_place`` launch): that input, tested below */
        PyObject *dn = PyObject_GetAttr(krule, s_donor);
        if (dn == NULL) goto done;
        if (dn != Py_None) {
            kdonor = PyLong_AsSsize_t(dn);
            if (kdonor >= n) kdonor = -1;
            if (PyErr_Occurred()) { Py_DECREF(dn); goto done; }
        }
        Py_DECREF(dn);
        ins = PyList_New(n + (at != NULL));
        if (ins == NULL) goto done;
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(ins, i, Py_NewRef(args[1 + i]));
        if (at != NULL) PyList_SET_ITEM(ins, n, Py_NewRef(at));
    } else if (eager) { /* the op's one-op kernel for these layouts (Backend.eager_kernel) */
        ins = PyList_New(n);
        if (ins == NULL) goto done;
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(ins, i, Py_NewRef(args[1 + i]));
        PyObject *eargs[4] = {prim, ins, SLOT(SLOT(target, desc_off[D_DTYPE]), dtype_off[T_NP]),
                              SLOT(target, desc_off[D_SHAPE])};
        /* the plan a call of this layout made (eager_kernel.plans), else eager_kernel */
        ln = bi->eager_plans == NULL ? NULL
             : plan_in(bi->eager_plans, SLOT(prim, prim_off[P_NAME]), &args[1], n, kw,
                       eargs[3], eargs[2]);
        if (ln == NULL) ln = PyObject_Vectorcall(bi->eager_for, eargs, 4, NULL);
        if (ln == NULL) goto done;
        if (ln == Py_None && !bi->host) { rc = 0; goto done; } /* no kernel: the rule, in Python */
        if (ln == Py_None) { /* the host's without a plan (yet): its rule, here */
            Py_CLEAR(ln);
            eager = from_plan = 0;
            takes_out = SLOT(defn, defn_off[F_OUT]) == Py_True;
        }
    }
    if (!bi->host && (eager || fused) && ln != NULL && ln != Py_None) {
        /* the order a device plan writes (cuda/compiled.py PackedLaunch.order): "F" for
         * column-contiguous operands, whose strides MLX's output keeps */
        PyObject *o = PyObject_GetAttr(ln, s_order);
        if (o == NULL) PyErr_Clear();
        forder = o != NULL && (o == s_F || (PyUnicode_Check(o) && PyUnicode_Compare(o, s_F) == 0));
        Py_XDECREF(o);
    }
    if (takes_out) {
        PyObject *shape = SLOT(target, desc_off[D_SHAPE]), *dtype = SLOT(target, desc_off[D_DTYPE]);
        long long itemsize = PyLong_AsLongLong(SLOT(dtype, dtype_off[T_SIZE]));
        if (itemsize < 0 || !PyTuple_Check(shape)) goto done;
        nbytes = itemsize;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++)
            nbytes *= PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (PyErr_Occurred()) goto done;
        PyObject *npdt = SLOT(dtype, dtype_off[T_NP]);
        PyObject *donor = NULL;
        for (Py_ssize_t i = 0; (bi->host || eager) && i < n && donor == NULL; i++) {
            PyObject *d = PyList_GET_ITEM(inputs, i);
            if (bi->host ? donates(d, shape, itemsize, nbytes)
                         : device_donates(d, shape, itemsize, nbytes, bi->array_type,
                                          bi->storage_type, forder))
                donor = d;
        }
        if (kdonor >= 0 && device_donates(PyList_GET_ITEM(inputs, kdonor), shape, itemsize, nbytes,
                                          bi->array_type, bi->storage_type, 0)) {
            /* the input's own buffer, written by the plan's in-place launch alone (MLX's
             * copy_gpu into a donated buffer copies nothing: only the update is written) */
            PyObject *ip = PyObject_GetAttr(ln, s_in_place);
            if (ip == NULL) goto done;
            if (ip != Py_None) {
                Py_SETREF(ln, ip);
                donor = PyList_GET_ITEM(inputs, kdonor);
            } else {
                Py_DECREF(ip);
            }
        }
        if (donor != NULL) {
            out = donor_out(SLOT(donor, desc_off[D_DATA]), npdt, !bi->host);
            handle = Py_NewRef(SLOT(donor, desc_off[D_BUFFER]));
            Py_buffer v;
            if (out != NULL && PyObject_GetBuffer(out, &v, PyBUF_WRITABLE | PyBUF_STRIDES) == 0) {
                out_c = PyBuffer_IsContiguous(&v, 'C');
                PyBuffer_Release(&v);
            }
            PyErr_Clear();
        } else {
            out = fresh_out(bi->alloc, nbytes, npdt, shape, forder, &handle);
            out_c = out != NULL && !forder; /* the allocator's buffer viewed in the output's shape */
        }
        if (out == NULL || handle == NULL) goto done;
    }
    if (from_plan && bi->api != NULL) { /* the backend's launch in C (kernels/_device_api.h) */
        PyObject *index = PyObject_GetAttr(stream, s_index);
        if (at != NULL) args[n + 1] = at;
        int launched = index ? bi->api->launch(ln, &args[1], n + (at != NULL), out, index) : -1;
        Py_XDECREF(index);
        if (launched < 0) goto done;
        if (launched == 1) res = Py_NewRef(out);
    }
    if (from_plan && res == NULL) { /* generated code: no rule, no warning state; the Python hook */
        /* a host plan that carries its call (cpu/compiled.py Launch.kernel_call, a
         * kernels/kernel_call.py KernelCall): called here, without Python code, when ``out``
         * has the layout it writes (out is writeable: a fresh buffer or a donor's) */
        PyObject *kc = bi->host ? PyObject_GetAttr(ln, s_kernel_call) : NULL;
        if (kc == NULL) PyErr_Clear();
        int ok = -1;
        if (kc != NULL && kc != Py_None) {
            PyObject *st = PyObject_GetAttr(kc, s_out_strides), *os = PyObject_GetAttr(kc, s_out_shape),
                     *od = PyObject_GetAttr(kc, s_out_dtype), *ost = PyObject_GetAttr(out, s_strides),
                     *osh = PyObject_GetAttr(out, s_shape), *odt = PyObject_GetAttr(out, s_dtype);
            if (st && os && od && ost && osh && odt && st != Py_None)
                ok = PyObject_RichCompareBool(st, ost, Py_EQ) == 1 &&
                     PyObject_RichCompareBool(os, osh, Py_EQ) == 1 &&
                     (od == odt || PyObject_RichCompareBool(od, odt, Py_EQ) == 1);
            PyErr_Clear();
            Py_XDECREF(st); Py_XDECREF(os); Py_XDECREF(od);
            Py_XDECREF(ost); Py_XDECREF(osh); Py_XDECREF(odt);
        }
        if (ok < 0) { /* no call to check against: the plan's own test */
            PyObject *takes = PyObject_CallMethodOneArg(ln, s_takes, out);
            if (takes == NULL) { Py_XDECREF(kc); goto done; }
            ok = takes == Py_True;
            Py_DECREF(takes);
        }
        if (!ok) { Py_XDECREF(kc); rc = 0; goto done; } /* another layout: run_compiled */
        if (kc != NULL && kc != Py_None) {
            args[n + 1] = out;
            PyObject *r = PyObject_Vectorcall(kc, &args[1], n + 1, NULL);
            Py_DECREF(kc);
            if (call_none(r) < 0) goto done;
        } else {
            Py_XDECREF(kc);
            PyObject *largs[5] = {be, stream, ln, ins, out};
            if (call_none(PyObject_VectorcallMethod(s_launch_fused, largs,
                                                    5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)) < 0)
                goto done;
        }
        res = Py_NewRef(out);
    } else if (from_plan) {
        /* launched by the backend's C launch above */
    } else if (view) { /* the host's Broadcast, Transpose and reshapes made here, else the rule */
        /* (Transpose and the reshape family found by their definition's rule: the backend's
         * own rule in C, cpu/_views.c's, makes the same view through the array's method) */
        PyObject *drule = SLOT(defn, defn_off[F_RULE]);
        res = !bi->host || n != 1 ? NULL
              : rule == l_broadcast_view ? broadcast_view(args[1], PyDict_GetItemWithError(kw, s_shape))
              : drule == l_transpose_view ? layout_view(args[1], PyDict_GetItemWithError(kw, s_axes), 0)
              : drule == l_reshape_view ? layout_view(args[1], PyDict_GetItemWithError(kw, s_shape), 1)
              : NULL;
        if (res == NULL && !PyErr_Occurred()) res = call_rule(rule, args, n + 1, NULL, kw);
    } else if (out != NULL &&
               (plan = planned(rule, SLOT(prim, prim_off[P_NAME]), &args[1], n, kw, out, out_c,
                               SLOT(target, desc_off[D_SHAPE]),
                               SLOT(SLOT(target, desc_off[D_DTYPE]), dtype_off[T_NP]), NULL)) != NULL) {
        /* a generated kernel's plan (kernels/kernel_call.py): its C call, no rule code */
        args[n + 1] = out;
        res = PyObject_Vectorcall(plan, &args[1], n + 1, NULL);
        Py_DECREF(plan);
        if (res != NULL) Py_SETREF(res, Py_NewRef(out));
    } else {
        /* a ufunc's rule: the ufunc itself, into a writeable out (as the rule calls it) */
        PyObject *uf = bi->host && nkw == 0 && out != NULL && Py_TYPE(out) == (PyTypeObject *)l_ndarray &&
                       (((NpHead *)out)->flags & NP_WRITEABLE) ? host_ufunc(rule, bi->xp) : NULL;
        if (uf == NULL && PyErr_Occurred()) goto done;
        /* (eager_eval's loop takes the quiet state once, at its first rule: here otherwise) */
        PyObject *token = NULL;
        if (!loop_quiet) {
            if ((token = PyContextVar_Set(l_quiet_var, l_quiet_value)) == NULL) goto done;
        } else if (loop_token == NULL &&
                   (loop_token = PyContextVar_Set(l_quiet_var, l_quiet_value)) == NULL) {
            goto done;
        }
        if (uf != NULL) {
            args[n + 1] = out;
            res = PyObject_Vectorcall(uf, &args[1], n, l_kwnames_out);
        } else {
            res = call_rule(rule, args, n + 1, out, kw);
        }
        if (token != NULL && PyContextVar_Reset(l_quiet_var, token) < 0) Py_CLEAR(res);
        Py_XDECREF(token);
    }
    if (res == NULL) {
        if (out != NULL && PyErr_ExceptionMatches(PyExc_TypeError)) { /* refuses out=: Python */
            PyErr_Clear();
            rc = 0;
        }
        goto done;
    }
    if (out != NULL && res == out) { /* the common case: the result is the prepared buffer */
        put(target, desc_off[D_DATA], out);
        put(target, desc_off[D_BUFFER], handle);
        put(target, desc_off[D_NODE], Py_None);
        /* (a kernel rule's plan of a definition without out=: "rule", as the Python path
         * counts its call, which allocates the result itself) */
        int path = eager ? (bi->host ? PATH_EAGER : PATH_EAGER_DEVICE)
                   : !fused ? (kdev && SLOT(defn, defn_off[F_OUT]) != Py_True ? PATH_RULE : PATH_RULE_OUT)
                   : bi->host ? PATH_FUSED : PATH_FUSED_DEVICE;
        if (detach(node) < 0 || count_path(path) < 0) goto done;
        if (enabled == Py_True && record(prim, node, t0, nbytes) < 0) goto done;
        rc = 1;
        goto done;
    }
    if (count_path(view ? PATH_VIEW : PATH_RULE) < 0) goto done;
    int one = finish_one(node, res, handle ? handle : Py_None, inputs, outputs, bi->alloc,
                         enabled == Py_True ? &nbytes : NULL);
    if (one < 0) goto done;
    if (one == 1) {
        if (detach(node) < 0) goto done;
        if (enabled == Py_True && record(prim, node, t0, nbytes) < 0) goto done;
        rc = 1;
        goto done;
    }
    PyObject *fargs[6] = {node, prim, be, res, handle ? handle : Py_None, t0};
    PyObject *r = PyObject_Vectorcall(l_finish, fargs, 6, NULL);
    if (r == NULL) goto done;
    Py_DECREF(r);
    rc = 1;
done:
    for (Py_ssize_t i = 0; i <= n; i++) Py_DECREF(args[i]);
    Py_XDECREF(target); Py_DECREF(rule); Py_XDECREF(enabled); Py_XDECREF(t0);
    Py_XDECREF(out); Py_XDECREF(handle); Py_XDECREF(res); Py_XDECREF(ins); Py_XDECREF(ln);
    Py_XDECREF(at);
    return rc;
}

PyObject *run_node(PyObject *self, PyObject *node) {
    int r = run_host(node);
    if (r < 0) return NULL;
    if (r == 1) Py_RETURN_NONE;
    if (l_python_run == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_call.run_node: not configured");
        return NULL;
    }
    return PyObject_CallOneArg(l_python_run, node);
}

/* -- The schedule's order in C ------------------------------------------------------------
 *
 * ``topo_order(descs)`` is eval_loop.topo_order: walk.topological's depth-first order
 * (from the arrays in order, each node's inputs left to right, a node once, inputs before
 * their consumers) with its cut for a node another eval has scheduled (its event set: into
 * ``pending``, its inputs unvisited). Returns (order, pending). */
/* Both start in storage on the C stack (``small``: an eval's graph is mostly a few nodes,
 * and a heap table per eval cost more than the walk), moving to the heap when they grow. */
int stack_push(Stack *s, PyObject *o) {
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : SMALL_STACK;
        PyObject **items = s->cap == 0 ? s->small
                           : PyMem_Malloc(cap * sizeof(PyObject *));
        if (items == NULL) { PyErr_NoMemory(); return -1; }
        if (s->n) memcpy(items, s->items, s->n * sizeof(PyObject *));
        if (s->items != s->small) PyMem_Free(s->items);
        s->items = items, s->cap = cap;
    }
    s->items[s->n++] = Py_NewRef(o);
    return 0;
}

/* 1 added, 0 already there, -1 no memory (open addressing over pointers, load <= 1/2) */
int set_add(PtrSet *s, void *p) {
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : SMALL_SET;
        void **slots = s->cap == 0 ? memset(s->small, 0, sizeof(s->small))
                       : PyMem_Calloc(cap, sizeof(void *));
        if (slots == NULL) { PyErr_NoMemory(); return -1; }
        for (size_t i = 0; i < s->cap; i++) {
            void *q = s->slots[i];
            if (q == NULL) continue;
            size_t j = ((uintptr_t)q >> 4) & (cap - 1);
            while (slots[j] != NULL) j = (j + 1) & (cap - 1);
            slots[j] = q;
        }
        if (s->slots != s->small) PyMem_Free(s->slots);
        s->slots = slots, s->cap = cap;
    }
    size_t j = ((uintptr_t)p >> 4) & (s->cap - 1);
    while (s->slots[j] != NULL) {
        if (s->slots[j] == p) return 0;
        j = (j + 1) & (s->cap - 1);
    }
    s->slots[j] = p;
    s->n++;
    return 1;
}

int set_has(PtrSet *s, void *p) {
    if (s->cap == 0) return 0;
    size_t j = ((uintptr_t)p >> 4) & (s->cap - 1);
    while (s->slots[j] != NULL) {
        if (s->slots[j] == p) return 1;
        j = (j + 1) & (s->cap - 1);
    }
    return 0;
}

PyObject *topo_order(PyObject *self, PyObject *descs) {
    if (!loop_configured || !PyList_Check(descs)) {
        PyErr_SetString(PyExc_TypeError, "topo_order(list of ArrayDesc), once configured");
        return NULL;
    }
    PyObject *order = PyList_New(0), *pending = PyList_New(0), *result = NULL;
    Stack st;
    PtrSet seen;
    st.items = NULL, st.n = st.cap = 0;
    seen.slots = NULL, seen.cap = seen.n = 0;
    if (order == NULL || pending == NULL) goto done;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(descs); k++) {
        if (stack_push(&st, PyList_GET_ITEM(descs, k)) < 0) goto done;
        while (st.n) {
            PyObject *item = st.items[--st.n]; /* owned */
            if ((PyObject *)Py_TYPE(item) == c_node_type) { /* its inputs are done */
                int rc = PyList_Append(order, item);
                Py_DECREF(item);
                if (rc < 0) goto done;
                continue;
            }
            if ((PyObject *)Py_TYPE(item) != c_desc_type) {
                Py_DECREF(item);
                PyErr_SetString(PyExc_TypeError, "topo_order: an ArrayDesc expected");
                goto done;
            }
            PyObject *node = SLOT(item, desc_off[D_NODE]);
            if (node == NULL || node == Py_None) { Py_DECREF(item); continue; }
            Py_INCREF(node);
            Py_DECREF(item);
            int added = set_add(&seen, node);
            if (added <= 0) { Py_DECREF(node); if (added < 0) goto done; continue; }
            PyObject *ev = SLOT(node, node_off[N_EVENT]);
            if (ev != NULL && ev != Py_None) { /* another eval runs it: wait, do not enter */
                int rc = PyList_Append(pending, node);
                Py_DECREF(node);
                if (rc < 0) goto done;
                continue;
            }
            int rc = stack_push(&st, node);
            PyObject *inputs = SLOT(node, node_off[N_INPUTS]);
            Py_DECREF(node);
            if (rc < 0) goto done;
            if (inputs == NULL || !PyList_Check(inputs)) {
                PyErr_SetString(PyExc_TypeError, "topo_order: a node's inputs are a list");
                goto done;
            }
            for (Py_ssize_t i = PyList_GET_SIZE(inputs) - 1; i >= 0; i--) {
                PyObject *x = PyList_GET_ITEM(inputs, i);
                PyObject *n = SLOT(x, desc_off[D_NODE]);
                if (n != NULL && n != Py_None && !set_has(&seen, n) && stack_push(&st, x) < 0)
                    goto done;
            }
        }
    }
    result = PyTuple_Pack(2, order, pending);
done:
    while (st.n) Py_DECREF(st.items[--st.n]);
    if (st.items != st.small) PyMem_Free(st.items);
    if (seen.slots != seen.small) PyMem_Free(seen.slots);
    Py_XDECREF(order);
    Py_XDECREF(pending);
    return result;
}

/* -- mx.eval of one array whose node is ready, in C ------------------------------------
 *
 * eval_loop.evaluate's steps for its most common case (an eager op's eval): one array
 * whose node no eval has scheduled, over available inputs, on the CPU's stream with no
 * worker thread, on the thread that owns the stream, with no transformation running. The
 * SIGINT handler and the interrupt bracket (Interrupt.begin / end), the claim under the
 * schedule lock (its stream's new event set on the node), the node run by run_node (above),
 * the event signalled, and the timeline's eval records where it records (eval_loop's own
 * helpers). Anything else is declined before anything is done, and the Python eval runs. */
static PyObject *g_tracer, *g_interrupt, *g_sigint, *g_lock, *g_workers, *g_begin, *g_end,
    *g_state_type, *g_thread_ident, *g_interrupted, *g_prebuild, *g_sigint_state, *g_getsignal,
    *g_main_thread, *g_event_type, *g_event_ids, *g_fail_outputs;
static PyObject *s__flag, *s_begin, *s_end, *s_acquire, *s_release, *s_signal, *s__owner,
    *s_error, *s_interrupted, *s_one, *s_wait, *s__sigint_installed, *s_sigint_number,
    *s_event_type;
int eager_configured = 0;
/* where the interrupt flag's slots live (stream_workers._InterruptFlag: _lock, _running,
 * _flag; -1: another type, its methods are called) and the host event's (stream_workers.
 * Event: id, stream, value, _cond) */
static Py_ssize_t int_off[3] = {-1, -1, -1}, ev_off[4] = {-1, -1, -1, -1};
static unsigned long main_ident;

/* each of ``names`` a slot of ``type``: their offsets in ``off``, or all -1 */
static void slot_offsets(PyObject *type, const char *const *names, Py_ssize_t *off, int n) {
    for (int i = 0; i < n; i++)
        if ((off[i] = slot_offset(type, names[i])) < 0) {
            PyErr_Clear();
            for (int j = 0; j < n; j++) off[j] = -1;
            return;
        }
}

/* the device's wait raised (the error set): eval_loop.fail_outputs(order, error), the
 * eval's arrays holding the error instead of values its failed work wrote; the error kept */
static void fail_outputs(PyObject *order) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL) {
        PyObject *r = PyObject_CallFunctionObjArgs(g_fail_outputs, order, value, NULL);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
    }
    PyErr_Restore(type, value, tb);
}

PyObject *configure_eager(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"tracer", "interrupt", "install_sigint", "schedule_lock",
                                        "workers", "eval_begin", "eval_end", "state_type",
                                        "thread_ident", "interrupted_message", "prebuild",
                                        "sigint_state", "getsignal", "main_thread",
                                        "event_type", "event_ids", "fail_outputs"};
    PyObject **const slots[] = {&g_tracer, &g_interrupt, &g_sigint, &g_lock, &g_workers,
                                &g_begin, &g_end, &g_state_type, &g_thread_ident,
                                &g_interrupted, &g_prebuild, &g_sigint_state, &g_getsignal,
                                &g_main_thread, &g_event_type, &g_event_ids, &g_fail_outputs};
    eager_configured = 0;
    if (!loop_configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure_eager: configure_loop first");
        return NULL;
    }
    if (take_all(kw, "configure_eager", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyDict_Check(g_workers) || !PyDict_Check(g_sigint_state) || !PyType_Check(g_event_type)) {
        PyErr_SetString(PyExc_TypeError, "configure_eager: workers and sigint_state are dicts, "
                                         "event_type a type");
        return NULL;
    }
    main_ident = PyLong_AsUnsignedLong(g_main_thread);
    if (PyErr_Occurred()) return NULL;
    static const char *const int_slots[3] = {"_lock", "_running", "_flag"};
    static const char *const ev_slots[4] = {"id", "stream", "value", "_cond"};
    slot_offsets((PyObject *)Py_TYPE(g_interrupt), int_slots, int_off, 3);
    slot_offsets(g_event_type, ev_slots, ev_off, 4);
#define I(var, text) if (var == NULL && !(var = PyUnicode_InternFromString(text))) return NULL;
    I(s__flag, "_flag") I(s_begin, "begin") I(s_end, "end") I(s_acquire, "acquire")
    I(s_release, "release") I(s_signal, "signal") I(s__owner, "_owner") I(s_error, "error")
    I(s_interrupted, "interrupted") I(s_wait, "wait") I(s__sigint_installed, "_sigint_installed")
    I(s_event_type, "event_type")
#undef I
    if (s_one == NULL && (s_one = PyLong_FromLong(1)) == NULL) return NULL;
    if (s_sigint_number == NULL && (s_sigint_number = PyLong_FromLong(SIGINT)) == NULL) return NULL;
    eager_configured = 1;
    Py_RETURN_NONE;
}

/* eval_loop._install_sigint, its common case here: on the main thread with our handler
 * still installed, nothing to do; else the function (it installs it, or returns) */
static int install_sigint(void) {
    if (PyThread_get_thread_ident() != main_ident) return 0; /* not the main thread */
    PyObject *now = PyObject_CallOneArg(g_getsignal, s_sigint_number);
    if (now == NULL) return -1;
    PyObject *ours = PyDict_GetItemWithError(g_sigint_state, s__sigint_installed);
    int same = ours != NULL && ours == now && ours != Py_None;
    Py_DECREF(now);
    if (same) return 0;
    PyErr_Clear();
    return call_none(PyObject_CallNoArgs(g_sigint));
}

/* Interrupt.begin (delta 1) / Interrupt.end (-1): under the flag's lock, the count of
 * running evals moved, and the flag cleared when the last one ends. The steps here run no
 * Python code and keep the GIL, so while no thread holds the lock (``lock.locked()``: a
 * holder is inside a Python ``with`` block, which cannot run until this returns) they are
 * atomic without taking it; a held lock is waited for, as before. */
static int interrupt_step(int delta) {
    if (int_off[0] < 0)
        return call_none(PyObject_CallMethodNoArgs(g_interrupt, delta > 0 ? s_begin : s_end));
    PyObject *lock = SLOT(g_interrupt, int_off[0]);
    static PyObject *s_locked = NULL;
    if (s_locked == NULL && (s_locked = PyUnicode_InternFromString("locked")) == NULL) return -1;
    PyObject *held = PyObject_CallMethodNoArgs(lock, s_locked);
    if (held == Py_False) {
        Py_DECREF(held);
        PyObject *running = SLOT(g_interrupt, int_off[1]);
        long r = running != NULL ? PyLong_AsLong(running) : -1;
        PyObject *v = r == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(r + delta);
        if (v == NULL) return -1;
        put(g_interrupt, int_off[1], v);
        Py_DECREF(v);
        if (r + delta == 0) put(g_interrupt, int_off[2], Py_False);
        return 0;
    }
    Py_XDECREF(held);
    PyErr_Clear(); /* (held, or no locked(): the lock is taken) */
    if (call_none(PyObject_CallMethodNoArgs(lock, s_acquire)) < 0) return -1;
    PyObject *running = SLOT(g_interrupt, int_off[1]);
    long r = running != NULL ? PyLong_AsLong(running) : -1;
    PyObject *v = r == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(r + delta);
    if (v != NULL) {
        put(g_interrupt, int_off[1], v);
        Py_DECREF(v);
        if (r + delta == 0) put(g_interrupt, int_off[2], Py_False);
    }
    PyObject *t, *e, *tb;
    PyErr_Fetch(&t, &e, &tb);
    int rc = call_none(PyObject_CallMethodNoArgs(lock, s_release));
    if (t != NULL) { PyErr_Restore(t, e, tb); rc = -1; }
    return rc;
}

/* the interrupt flag (Interrupt._flag): 1 set, 0 not */
static int interrupt_flag(void) {
    if (int_off[2] >= 0) return SLOT(g_interrupt, int_off[2]) != Py_False;
    PyObject *flag = PyObject_GetAttr(g_interrupt, s__flag);
    int set = flag != Py_False;
    Py_XDECREF(flag);
    PyErr_Clear();
    return set;
}

/* Every 32 nodes of a loop that may stay in C for long (a GPU stream's launches, the small
 * kernels that keep the GIL): the pending signal handlers run (the eval's SIGINT handler sets
 * the interrupt flag), then a Python function that does nothing is called, so that the
 * interpreter's own eval breaker runs at its first instruction: where a thread waiting for
 * the GIL (a timer's or a widget's interrupt_eval) has asked for it (CPython's waiter asks
 * once a switch interval, sys.getswitchinterval, has passed without a switch) the GIL is
 * handed to it there, as between any two bytecodes (Python/ceval.c
 * eval_frame_handle_pending: drop_gil waits for the other thread to take it); an async
 * exception set for this thread is raised there too. Nothing is dropped or slept when nobody
 * asked (a bare release and re-take would not hand it over: every re-take counts as a switch,
 * so the waiter would never ask, and starve). -1: a handler or the call raised. */
static PyObject *g_yield_fn; /* (lambda: None, made once) */

static int yield_point(void) {
    if (PyErr_CheckSignals() < 0) return -1;
    if (g_yield_fn == NULL) {
        PyObject *globals = Py_BuildValue("{s:O}", "__builtins__", PyEval_GetBuiltins());
        g_yield_fn = globals ? PyRun_String("lambda: None", Py_eval_input, globals, globals) : NULL;
        Py_XDECREF(globals);
        if (g_yield_fn == NULL) return -1;
    }
    return call_none(PyObject_CallNoArgs(g_yield_fn));
}

/* whether a fused node's tape has not run yet: fewer than two entries in its ``launches``
 * (a tape that ran has its arrays' positions and a launch plan there; prebuild_kernels
 * skips the others before any work, as the backends' prebuild does) */
static int tape_new(PyObject *prim) {
    PyObject *kw = SLOT(prim, prim_off[P_KW]);
    PyObject *tape = kw != NULL && PyDict_Check(kw) ? PyDict_GetItemWithError(kw, s_tape) : NULL;
    PyObject *launches = tape != NULL ? PyObject_GetAttr(tape, s_launches) : NULL;
    int fresh = launches == NULL || !PyDict_Check(launches) || PyDict_GET_SIZE(launches) < 2;
    Py_XDECREF(launches);
    PyErr_Clear();
    return fresh;
}

/* the number of fused tapes in ``order`` that have not run (prebuild_kernels starts builds
 * for two or more), or -1 when a node is not on ``stream`` (the same object, as
 * _inline_stream asks) */
static Py_ssize_t one_stream(PyObject *order, PyObject *stream) {
    Py_ssize_t fused = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
        PyObject *prim = SLOT(PyList_GET_ITEM(order, i), node_off[N_PRIMITIVE]);
        if (SLOT(prim, prim_off[P_STREAM]) != stream) return -1;
        fused += SLOT(SLOT(prim, prim_off[P_DEFN]), defn_off[F_RUNTIME]) == Py_True &&
                 tape_new(prim);
    }
    return fused;
}

/* the error being raised, kept as the eval's (the first one wins) */
static void keep_error(PyObject **type, PyObject **value, PyObject **tb) {
    if (*type == NULL) {
        PyErr_Fetch(type, value, tb);
        PyErr_NormalizeException(type, value, tb);
    } else {
        PyErr_Clear();
    }
}

/* The eval's event signalled once the host has seen its stream's work done (the backend's
 * C wait): no device event to record (its ``recorded`` None: is_signaled is its value),
 * its value set and its waiters woken, as Event.signal; while the timeline records, the
 * event's own ``signal`` runs instead (its record; the covering event it records on the
 * idle stream is complete at once). 0, or -1 with an error set. */
static PyObject *s_recorded, *s_value, *s__cond, *s_notify_all;

static int intern_signal(void) {
    if (s_recorded == NULL && (!(s_recorded = PyUnicode_InternFromString("recorded")) ||
                               !(s_value = PyUnicode_InternFromString("value")) ||
                               !(s__cond = PyUnicode_InternFromString("_cond")) ||
                               !(s_notify_all = PyUnicode_InternFromString("notify_all"))))
        return -1;
    return 0;
}

/* with cond: cond.notify_all() (an event's waiters woken; cond None: nobody waits) */
static int notify(PyObject *cond) {
    if (cond == Py_None) return 0;
    int rc = call_none(PyObject_CallMethodNoArgs(cond, s_acquire));
    if (rc == 0) {
        rc = call_none(PyObject_CallMethodNoArgs(cond, s_notify_all));
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        if (call_none(PyObject_CallMethodNoArgs(cond, s_release)) < 0) rc = -1;
        if (t != NULL) PyErr_Restore(t, v, tb);
    }
    return rc;
}

static int signal_done(PyObject *ev, int recording) {
    if (intern_signal() < 0) return -1;
    if (recording) return call_none(PyObject_CallMethodOneArg(ev, s_signal, s_one));
    if (PyObject_SetAttr(ev, s_recorded, Py_None) < 0) return -1;
    PyObject *old = PyObject_GetAttr(ev, s_value);
    int below = old != NULL && PyObject_RichCompareBool(old, s_one, Py_LT) == 1;
    Py_XDECREF(old);
    if (old == NULL || PyErr_Occurred()) return -1;
    if (below && PyObject_SetAttr(ev, s_value, s_one) < 0) return -1;
    PyObject *cond = PyObject_GetAttr(ev, s__cond);
    if (cond == NULL) return -1;
    int rc = notify(cond);
    Py_DECREF(cond);
    return rc;
}

/* whether the backend's events are the host's (its event_type stream_workers.Event): made
 * and signalled through their slots here; the backend's event type is kept either way */
static int plain_events(BackendInfo *bi) {
    if (bi->plain_event == 0) {
        PyObject *et = PyObject_GetAttr(bi->be, s_event_type);
        if (et == NULL) return -1;
        bi->event_type = et; /* (kept with the backend, for the process's life) */
        bi->none_off[0] = bi->none_off[1] = -1;
        int ok = et == g_event_type && ev_off[0] >= 0;
        if (!ok && ev_off[0] >= 0 && PyType_Check(et) &&
            PyType_IsSubtype((PyTypeObject *)et, (PyTypeObject *)g_event_type)) {
            /* a subclass (CudaEvent) whose __init__ only sets its ``none_slots`` to None */
            PyObject *names = PyObject_GetAttrString(et, "none_slots");
            ok = names != NULL && PyTuple_CheckExact(names) && PyTuple_GET_SIZE(names) <= 2;
            for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(names); i++) {
                const char *n = PyUnicode_Check(PyTuple_GET_ITEM(names, i))
                                    ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i)) : NULL;
                ok = n != NULL && (bi->none_off[i] = slot_offset(et, n)) >= 0;
            }
            Py_XDECREF(names);
            PyErr_Clear();
        }
        bi->plain_event = ok ? 1 : -1;
    }
    return bi->plain_event == 1;
}

/* be.event_type(index): a new event of the stream (Event.__init__'s slots for the host's:
 * its id next of stream_workers._event_ids, value 0, no condition yet; a subclass's
 * ``none_slots`` None, as its __init__ sets them) */
static PyObject *new_event(BackendInfo *bi, PyObject *index) {
    int plain = plain_events(bi);
    if (plain < 0) return NULL;
    if (!plain) return PyObject_CallOneArg(bi->event_type, index);
    PyObject *id = PyIter_Next(g_event_ids);
    if (id == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "event ids ran out");
        return NULL;
    }
    PyTypeObject *et = (PyTypeObject *)bi->event_type;
    PyObject *ev = et->tp_alloc(et, 0);
    if (ev == NULL) { Py_DECREF(id); return NULL; }
    PyObject *zero = PyLong_FromLong(0);
    put(ev, ev_off[0], id);
    put(ev, ev_off[1], index);
    put(ev, ev_off[2], zero);
    put(ev, ev_off[3], Py_None);
    for (int i = 0; i < 2; i++)
        if (bi->none_off[i] >= 0) put(ev, bi->none_off[i], Py_None);
    Py_DECREF(id);
    Py_DECREF(zero);
    return ev;
}

/* ev.signal(1): for the host's event while the timeline does not record (Event.signal's
 * steps: the value raised to 1, its waiters woken), else the method (its record) */
static int signal_host(PyObject *ev) {
    PyObject *enabled = module_attr(l_timeline, s_enabled);
    if (enabled == NULL) return -1;
    int recording = enabled == Py_True;
    Py_DECREF(enabled);
    if (recording || ev_off[0] < 0 || (PyObject *)Py_TYPE(ev) != g_event_type)
        return call_none(PyObject_CallMethodOneArg(ev, s_signal, s_one));
    if (intern_signal() < 0) return -1;
    PyObject *old = SLOT(ev, ev_off[2]);
    int below = old != NULL ? PyObject_RichCompareBool(old, s_one, Py_LT) : -1;
    if (below < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "value");
        return -1;
    }
    if (below) put(ev, ev_off[2], s_one);
    PyObject *cond = SLOT(ev, ev_off[3]);
    if (cond == NULL) return 0;
    Py_INCREF(cond);
    int rc = notify(cond);
    Py_DECREF(cond);
    return rc;
}

/* 1: evaluated (or nothing to do); 0: declined, nothing done; -1: the eval's error */
int eager_eval(PyObject *descs) {
    if (!eager_configured || !PyList_CheckExact(descs)) return 0;
    PyObject *active = module_attr(g_tracer, s__active);
    int quiet = active != NULL && PyLong_Check(active) && PyLong_AsLong(active) == 0;
    Py_XDECREF(active);
    if (!quiet) { PyErr_Clear(); return 0; } /* a transformation may run: before_eval */
    PyObject *node = NULL; /* the first lazy array's node gives the stream */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(descs); i++) {
        PyObject *d = PyList_GET_ITEM(descs, i);
        if ((PyObject *)Py_TYPE(d) != c_desc_type) return 0;
        PyObject *n = SLOT(d, desc_off[D_NODE]);
        if (n == NULL) return 0;
        if (n != Py_None && node == NULL) node = n;
    }
    if (node == NULL) return 1; /* every array is available already */
    if ((PyObject *)Py_TYPE(node) != c_node_type) return 0;
    PyObject *stream = SLOT(SLOT(node, node_off[N_PRIMITIVE]), prim_off[P_STREAM]);
    PyObject *owner = PyObject_GetAttr(stream, s__owner);
    if (owner == NULL) { PyErr_Clear(); return 0; }
    int mine = owner == Py_None;
    if (!mine) { /* check_thread: a stream another thread owns is the Python path's error */
        PyObject *me = PyObject_CallNoArgs(g_thread_ident);
        mine = me != NULL && PyObject_RichCompareBool(owner, me, Py_EQ) == 1;
        Py_XDECREF(me);
        PyErr_Clear();
    }
    Py_DECREF(owner);
    if (!mine) return 0;
    PyObject *index = PyObject_GetAttr(stream, s_index);
    if (index == NULL) { PyErr_Clear(); return 0; }
    PyObject *be = PyDict_GetItemWithError(l_by_stream, index);
    BackendInfo *bi = be != NULL ? backend_info(be) : NULL;
    PyObject *w = bi != NULL ? PyDict_GetItemWithError(g_workers, index) : NULL;
    if (bi == NULL || w != NULL || PyErr_Occurred()) { /* not known yet, or a worker */
        Py_DECREF(index);
        return probe_interrupted() ? -1 : 0;
    }
    Py_INCREF(stream);
    PyObject *ev = NULL, *state = NULL, *t0 = NULL, *order = NULL;
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    int rc = -1, begun = 0, claimed = 0, interrupted = 0;
    if (install_sigint() < 0) goto done;
    if (interrupt_step(1) < 0) goto done;
    begun = 1;
    ev = new_event(bi, index);
    if (ev == NULL) goto done;
    /* the schedule, under its lock: the order, every node on this stream, none scheduled
     * by another eval; then each node marked with this eval's event */
    if (call_none(PyObject_CallMethodNoArgs(g_lock, s_acquire)) < 0) goto done;
    PyObject *both = topo_order(NULL, descs);
    Py_ssize_t fused = -1;
    if (both != NULL) {
        order = Py_NewRef(PyTuple_GET_ITEM(both, 0));
        fused = one_stream(order, stream);
        claimed = PyList_GET_SIZE(PyTuple_GET_ITEM(both, 1)) == 0 && PyList_GET_SIZE(order) > 0
                  && fused >= 0;
        Py_DECREF(both);
        for (Py_ssize_t i = 0; claimed && i < PyList_GET_SIZE(order); i++)
            put(PyList_GET_ITEM(order, i), node_off[N_EVENT], ev);
    }
    if (call_none(PyObject_CallMethodNoArgs(g_lock, s_release)) < 0) claimed = 0;
    if (order == NULL || PyErr_Occurred()) goto done;
    if (!claimed) { rc = 0; goto done; }
    if (fused > 1 && call_none(PyObject_CallOneArg(g_prebuild, order)) < 0) /* in parallel */
        keep_error(&type, &value, &tb);
    PyObject *enabled = module_attr(l_timeline, s_enabled);
    int recording = enabled == Py_True;
    Py_XDECREF(enabled);
    Py_ssize_t n = PyList_GET_SIZE(order);
    if (recording) { /* eval_loop._eval_begin / _record_end, as _run_inline records */
        PyObject *si = PyObject_GetAttr(ev, s_stream);
        state = si ? PyObject_CallOneArg(g_state_type, s_one) : NULL;
        if (state != NULL) {
            PyObject *bargs[4] = {order, si, state, Py_False};
            t0 = PyObject_Vectorcall(g_begin, bargs, 4, NULL);
        }
        Py_XDECREF(si);
        if (t0 == NULL) keep_error(&type, &value, &tb);
    }
    /* the backend's quiet floating-point state once for the loop, taken by run_host at the
     * loop's first rule (the Python path's _compute sets its own) */
    int was_quiet = loop_quiet;
    PyObject *was_token = loop_token;
    loop_quiet = 1;
    loop_token = NULL;
    for (Py_ssize_t i = 0; i < n; i++) { /* _run_inline's loop */
        PyObject *nd = PyList_GET_ITEM(order, i);
        if ((i & 31) == 31 && !interrupted && type == NULL && yield_point() < 0)
            keep_error(&type, &value, &tb);
        if (!interrupted && type == NULL) interrupted = interrupt_flag();
        if (interrupted || type != NULL) { /* stopped: the rest stay lazy, unscheduled */
            put(nd, node_off[N_EVENT], Py_None);
            continue;
        }
        int ran = run_host(nd);
        if (ran == 0) ran = call_none(PyObject_CallOneArg(l_python_run, nd)) < 0 ? -1 : 1;
        if (ran < 0) {
            keep_error(&type, &value, &tb);
            put(nd, node_off[N_EVENT], Py_None);
        }
    }
    if (loop_token != NULL) {
        if (PyContextVar_Reset(l_quiet_var, loop_token) < 0) keep_error(&type, &value, &tb);
        Py_DECREF(loop_token);
    }
    loop_quiet = was_quiet;
    loop_token = was_token;
    if (state != NULL) { /* what the end record says */
        if (value != NULL && PyObject_SetAttr(state, s_error, value) < 0) PyErr_Clear();
        if (interrupted && PyObject_SetAttr(state, s_interrupted, Py_True) < 0) PyErr_Clear();
    }
    /* a device's stream: the eval returns once its work is done. With the backend's wait
     * in C (kernels/_device_api.h) the host waits for the stream first, then the event is
     * signalled with its work done (nothing left to record on the device: as
     * CudaEvent.signal after a wait); else the event is signalled and the host waits on it,
     * as eval_loop._evaluate waits on every eval's events. */
    int waited = 0;
    if (!bi->host && bi->api != NULL) {
        waited = bi->api->wait(index);
        if (waited < 0) fail_outputs(order), keep_error(&type, &value, &tb);
    }
    if (waited != 0 ? signal_done(ev, recording) < 0 : signal_host(ev) < 0)
        keep_error(&type, &value, &tb);
    if (t0 != NULL) {
        PyObject *eargs[4] = {state, ev, t0, Py_True};
        if (call_none(PyObject_Vectorcall(g_end, eargs, 4, NULL)) < 0) keep_error(&type, &value, &tb);
    }
    if (!bi->host && waited == 0 && call_none(PyObject_CallMethodOneArg(ev, s_wait, s_one)) < 0)
        fail_outputs(order), keep_error(&type, &value, &tb);
    rc = 1;
done:
    if (begun && interrupt_step(-1) < 0) keep_error(&type, &value, &tb);
    if (type == NULL && PyErr_Occurred()) keep_error(&type, &value, &tb);
    if (type != NULL) {
        PyErr_Restore(type, value, tb);
        rc = -1;
    } else if (rc == 1 && interrupted) { /* MLX's message (eval_loop._INTERRUPTED) */
        PyErr_SetObject(PyExc_KeyboardInterrupt, g_interrupted);
        rc = -1;
    }
    Py_DECREF(stream); Py_DECREF(index); Py_XDECREF(ev); Py_XDECREF(state); Py_XDECREF(t0);
    Py_XDECREF(order);
    return rc;
}

PyObject *py_eager_eval(PyObject *self, PyObject *descs) {
    int r = eager_eval(descs);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

