/* A compiled function's call in C: CompiledFunction's base type, whose call takes the hit
 * of the Python fast path (CompiledFunction._call) here.
 *
 * MLX records a compiled call in C++ (mlx/compile.cpp compile's returned function: the
 * cache lookup, then the tape's primitives applied to the inputs). The Python fast path
 * (core/ops/compile_api.py) takes ~2.5 us for a one-kernel function on the H200's host,
 * most of a small call; this does the same steps for its common shape:
 *
 *   positional mx.array arguments only; compile enabled; no transformation running (the
 *   new array's tracer flag is then False: tracer.any_tracer); the signature (the default
 *   stream's index, the fusion mode, each argument's shape and dtype name) already in the
 *   function's ``_fast`` table; its entry returns one array; its ReplayPlan is ``single``
 *   (one single-output node whose output is the result).
 *
 * Then the Node and the ArrayDesc are made as their constructors make them (primitive.Node,
 * array.ArrayDesc with data=None, buffer=None: every slot set, nothing else run; the test
 * tests/test_compile_call_c.py compares every slot with the Python path's), the desc
 * weakly listed as the node's output, and a new mx.array handle returned. Anything else:
 * None, and the Python path runs the call.
 */
#include "_core.h"

PyObject *c_node_type, *c_desc_type;
static PyObject *c_array_type, *c_node_ids, *c_tracer, *c_fusion, *c_state, *c_resolve_stream,
    *c_device;
static PyObject *s__default_device, *s__tls, *s_defaults, *s__direct, *s__fast, *s__call, *s__hash;
static int configured = 0;

Py_ssize_t node_off[N_COUNT], desc_off[D_COUNT];
static Py_ssize_t array_d_off;

PyObject *s_enabled, *s__active, *s__d, *s_shape, *s_dtype, *s_name, *s_index, *s_lone,
    *s_plan, *s_single, *s_steps, *s_consts, *s_stream, *s_primitive, *s_inputs, *s_outputs,
    *s_id, *s_event, *s_keep, *s_node, *s_data, *s_buffer, *s_tracer, *s_kept;

static int intern_all(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    I(s_enabled, "enabled") I(s__active, "_active") I(s__d, "_d") I(s_shape, "shape")
    I(s_dtype, "dtype") I(s_name, "name") I(s_index, "index") I(s_lone, "lone")
    I(s_plan, "plan") I(s_single, "single") I(s_steps, "steps") I(s_consts, "consts")
    I(s_stream, "stream") I(s_primitive, "primitive") I(s_inputs, "inputs")
    I(s_outputs, "outputs") I(s_id, "id") I(s_event, "event") I(s_keep, "keep")
    I(s_node, "node") I(s_data, "data") I(s_buffer, "buffer") I(s_tracer, "tracer")
    I(s_kept, "kept") I(s__default_device, "_default_device") I(s__tls, "_tls")
    I(s_defaults, "defaults") I(s__direct, "_direct") I(s__fast, "_fast") I(s__call, "_call") I(s__hash, "_hash")
#undef I
    return 0;
}

/* the offset of the __slots__ entry ``name`` of ``type`` (its member descriptor's) */
Py_ssize_t slot_offset(PyObject *type, const char *name) {
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == Py_T_OBJECT_EX && !(m->flags & Py_READONLY)) off = m->offset;
    }
    Py_DECREF(d);
    if (off < 0) PyErr_Format(PyExc_TypeError, "configure: %s is not a slot", name);
    return off;
}

/* Each of ``names`` from the dict ``kw`` into its slot (a new reference); KeyError naming
 * the first missing one (``who`` is the configuring function) */
int take_all(PyObject *kw, const char *who, const char *const *names,
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
        Py_XSETREF(*slots[i], Py_NewRef(v));
    }
    return 0;
}

/* node_off / desc_off: where a Node's and an ArrayDesc's slots live */
int core_offsets(PyObject *node_type, PyObject *desc_type) {
    static const char *const node_slots[N_COUNT] = {"primitive", "inputs", "outputs", "id",
                                                    "event", "keep", "backward"};
    static const char *const desc_slots[D_COUNT] = {"shape", "dtype", "stream", "node", "index",
                                                    "data", "buffer", "tracer", "kept"};
    for (int i = 0; i < N_COUNT; i++)
        if ((node_off[i] = slot_offset(node_type, node_slots[i])) < 0) return -1;
    for (int i = 0; i < D_COUNT; i++)
        if ((desc_off[i] = slot_offset(desc_type, desc_slots[i])) < 0) return -1;
    return 0;
}

static PyObject *configure(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"node_type", "desc_type", "array_type", "node_ids",
                                        "tracer", "fusion", "state", "resolve_stream", "device"};
    PyObject **const slots[] = {&c_node_type, &c_desc_type, &c_array_type, &c_node_ids,
                                &c_tracer, &c_fusion, &c_state, &c_resolve_stream, &c_device};
    if (take_all(kw, "configure", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyType_Check(c_node_type) || !PyType_Check(c_desc_type) || !PyType_Check(c_array_type) ||
        !PyList_Check(c_fusion) || !PyDict_Check(c_state)) {
        PyErr_SetString(PyExc_TypeError, "configure: types, a list and a dict expected");
        return NULL;
    }
    configured = 0;
    if (core_offsets(c_node_type, c_desc_type) < 0) return NULL;
    if ((array_d_off = slot_offset(c_array_type, "_d")) < 0) return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

/* an instance of the (Python, slotted) class ``type`` without running its __init__ */
static PyObject *bare(PyObject *type) {
    PyTypeObject *t = (PyTypeObject *)type;
    return t->tp_alloc(t, 0);
}

/* the slot at ``off`` of a new instance (empty) set to ``v`` */
void put(PyObject *obj, Py_ssize_t off, PyObject *v) {
    PyObject **p = (PyObject **)((char *)obj + off);
    Py_XSETREF(*p, Py_NewRef(v));
}

/* ``obj.name`` of a module: from its dict (a module's getattr goes through the type
 * first), else its getattr (a name it does not hold, or not a module); new ref */
PyObject *module_attr(PyObject *mod, PyObject *name) {
    if (PyModule_CheckExact(mod)) {
        PyObject *v = PyDict_GetItemWithError(PyModule_GetDict(mod), name);
        if (v != NULL) return Py_NewRef(v);
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_GetAttr(mod, name);
}

/* ``obj.name`` where it is a __slots__ entry of obj's class (Dtype.name, Stream.index,
 * _Entry.plan, ...): read at the slot's offset, which is found once per class (and again
 * when the class changes: its version tag); else its getattr. New ref. */
typedef struct {
    PyTypeObject *type; /* borrowed: compared by identity with its version tag */
    unsigned int version;
    Py_ssize_t off;
} SlotCache;

static PyObject *slot_attr(PyObject *obj, PyObject *name, SlotCache *c) {
    PyTypeObject *t = Py_TYPE(obj);
    if (t != c->type || t->tp_version_tag != c->version ||
        !(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        c->type = NULL;
        PyObject *d = _PyType_Lookup(t, name); /* (borrowed; sets the type's version tag) */
        if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
            ((PyMemberDescrObject *)d)->d_member->type == Py_T_OBJECT_EX &&
            (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
            c->type = t;
            c->version = t->tp_version_tag;
            c->off = ((PyMemberDescrObject *)d)->d_member->offset;
        }
        if (c->type == NULL) return PyObject_GetAttr(obj, name);
    }
    PyObject *v = SLOT(obj, c->off);
    if (v == NULL) return PyObject_GetAttr(obj, name); /* (its AttributeError) */
    return Py_NewRef(v);
}

/* resolve_stream(None): its hot path (this thread's default stream of the default device,
 * already made: device._tls.defaults[device._default_device]), else the function */
static PyObject *default_stream(void) {
    static SlotCache hash_slot;
    PyObject *d = module_attr(c_device, s__default_device);
    PyObject *tls = d ? module_attr(c_device, s__tls) : NULL;
    PyObject *defaults = tls ? PyObject_GetAttr(tls, s_defaults) : NULL;
    PyObject *st = NULL;
    if (defaults != NULL && d != Py_None && PyDict_Check(defaults)) {
#if PY_VERSION_HEX < 0x030D0000
        /* the key's hash is its _hash slot (Device.__hash__, a Python method, returns it) */
        PyObject *h = slot_attr(d, s__hash, &hash_slot);
        Py_hash_t hash = h ? PyLong_AsSsize_t(h) : -1;
        Py_XDECREF(h);
        if (hash != -1) st = Py_XNewRef(_PyDict_GetItem_KnownHash(defaults, d, hash));
#else
        st = Py_XNewRef(PyDict_GetItemWithError(defaults, d));
#endif
    }
    Py_XDECREF(d); Py_XDECREF(tls); Py_XDECREF(defaults);
    if (st != NULL) return st;
    PyErr_Clear();
    return PyObject_CallOneArg(c_resolve_stream, Py_None);
}

#define MAX_ARGS 32

/* The fast path over the function's ``_fast`` table: the result's mx.array, or None (the
 * Python path runs the call), or NULL with an error */
static PyObject *fast_call(PyObject *fast, PyObject *args) {
    if (!configured || !PyDict_Check(fast)) Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n > MAX_ARGS) Py_RETURN_NONE;
    PyObject *enabled = PyDict_GetItemWithError(c_state, s_enabled);
    if (enabled != Py_True) { PyErr_Clear(); Py_RETURN_NONE; }
    PyObject *result = NULL, *stream = NULL, *sig = NULL, *entry = NULL, *v = NULL,
             *plan = NULL, *steps = NULL, *consts = NULL, *inputs = NULL, *node = NULL,
             *desc = NULL, *outputs = NULL, *ref = NULL, *id = NULL, *pstream = NULL;
    PyObject *descs[MAX_ARGS];
    Py_ssize_t got = 0;
    static SlotCache index_slot, name_slot, lone_slot, plan_slot, single_slot, steps_slot,
        consts_slot, stream_slot;
    v = module_attr(c_tracer, s__active); /* a transformation runs: any_tracer's walk */
    if (v == NULL || !PyLong_Check(v) || PyLong_AsLong(v) != 0) goto fallback;
    Py_CLEAR(v);
    for (; got < n; got++) {
        PyObject *a = PyTuple_GET_ITEM(args, got);
        if ((PyObject *)Py_TYPE(a) != c_array_type) goto fallback;
        descs[got] = Py_XNewRef(SLOT(a, array_d_off)); /* (a slot: read by its offset) */
        if (descs[got] == NULL) goto fallback;
        if ((PyObject *)Py_TYPE(descs[got]) != c_desc_type) { got++; goto fallback; }
    }
    stream = default_stream();
    if (stream == NULL) goto fallback; /* (the Python path raises it again) */
    /* the fast table's key: [stream.index, fusion mode, (shape, dtype name) per argument] */
    sig = PyTuple_New(2 + 2 * n);
    if (sig == NULL) goto error;
    PyObject *si = slot_attr(stream, s_index, &index_slot);
    if (si == NULL) goto fallback;
    PyTuple_SET_ITEM(sig, 0, si);
    PyObject *mode = PyList_GET_SIZE(c_fusion) ? PyList_GET_ITEM(c_fusion, 0) : Py_None;
    PyTuple_SET_ITEM(sig, 1, Py_NewRef(mode));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sh = SLOT(descs[i], desc_off[D_SHAPE]), *dt = SLOT(descs[i], desc_off[D_DTYPE]);
        if (sh == NULL || dt == NULL) goto fallback;
        PyTuple_SET_ITEM(sig, 2 + 2 * i, Py_NewRef(sh));
        PyObject *nm = slot_attr(dt, s_name, &name_slot);
        if (nm == NULL) goto fallback;
        PyTuple_SET_ITEM(sig, 3 + 2 * i, nm);
    }
    entry = PyDict_GetItemWithError(fast, sig);
    if (entry == NULL) goto fallback;
    Py_INCREF(entry);
    v = slot_attr(entry, s_lone, &lone_slot);
    if (v != Py_True) goto fallback;
    Py_CLEAR(v);
    plan = slot_attr(entry, s_plan, &plan_slot);
    v = plan ? slot_attr(plan, s_single, &single_slot) : NULL;
    if (v != Py_True) goto fallback;
    Py_CLEAR(v);
    steps = slot_attr(plan, s_steps, &steps_slot);
    consts = steps ? slot_attr(plan, s_consts, &consts_slot) : NULL;
    if (consts == NULL || !PyTuple_Check(steps) || PyTuple_GET_SIZE(steps) != 1 ||
        !PyList_Check(consts))
        goto fallback;
    /* the step: (primitive, input slots, ((shape, dtype),)) */
    PyObject *step = PyTuple_GET_ITEM(steps, 0);
    if (!PyTuple_Check(step) || PyTuple_GET_SIZE(step) != 3) goto fallback;
    PyObject *prim = PyTuple_GET_ITEM(step, 0), *ins = PyTuple_GET_ITEM(step, 1),
             *outs = PyTuple_GET_ITEM(step, 2);
    if (!PyTuple_Check(ins) || !PyTuple_Check(outs) || PyTuple_GET_SIZE(outs) != 1) goto fallback;
    PyObject *sd = PyTuple_GET_ITEM(outs, 0);
    if (!PyTuple_Check(sd) || PyTuple_GET_SIZE(sd) != 2) goto fallback;
    Py_ssize_t nc = PyList_GET_SIZE(consts), k = PyTuple_GET_SIZE(ins);
    inputs = PyList_New(k);
    if (inputs == NULL) goto error;
    for (Py_ssize_t j = 0; j < k; j++) { /* env = arguments + constants */
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(ins, j));
        PyObject *d;
        if (i >= 0 && i < n) d = descs[i];
        else if (i >= n && i < n + nc) d = PyList_GET_ITEM(consts, i - n);
        else { PyErr_Clear(); goto fallback; }
        PyList_SET_ITEM(inputs, j, Py_NewRef(d));
    }
    pstream = slot_attr(prim, s_stream, &stream_slot);
    if (pstream == NULL) goto fallback;
    /* Node(prim, inputs) */
    id = PyIter_Next(c_node_ids);
    outputs = id ? PyList_New(0) : NULL;
    node = outputs ? bare(c_node_type) : NULL;
    if (node == NULL) goto error;
    put(node, node_off[N_PRIMITIVE], prim);
    put(node, node_off[N_INPUTS], inputs);
    put(node, node_off[N_OUTPUTS], outputs);
    put(node, node_off[N_ID], id);
    put(node, node_off[N_EVENT], Py_None);
    put(node, node_off[N_KEEP], Py_False);
    put(node, node_off[N_BACKWARD], Py_False);
    /* ArrayDesc(shape, dtype, prim.stream, node=node) */
    desc = bare(c_desc_type);
    if (desc == NULL) goto error;
    {
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL) goto error;
        put(desc, desc_off[D_SHAPE], PyTuple_GET_ITEM(sd, 0));
        put(desc, desc_off[D_DTYPE], PyTuple_GET_ITEM(sd, 1));
        put(desc, desc_off[D_STREAM], pstream);
        put(desc, desc_off[D_NODE], node);
        put(desc, desc_off[D_INDEX], zero);
        put(desc, desc_off[D_DATA], Py_None);
        put(desc, desc_off[D_BUFFER], Py_None);
        put(desc, desc_off[D_TRACER], Py_False);
        put(desc, desc_off[D_KEPT], Py_None);
        Py_DECREF(zero);
    }
    ref = PyWeakref_NewRef(desc, NULL);
    if (ref == NULL || PyList_Append(outputs, ref) < 0) goto error;
    result = bare(c_array_type);
    if (result == NULL) goto error;
    put(result, array_d_off, desc);
    goto done;
fallback:
    PyErr_Clear();
    result = Py_NewRef(Py_None);
    goto done;
error:
    Py_CLEAR(result);
done:
    for (Py_ssize_t i = 0; i < got; i++) Py_DECREF(descs[i]);
    Py_XDECREF(stream); Py_XDECREF(sig); Py_XDECREF(entry); Py_XDECREF(v);
    Py_XDECREF(plan); Py_XDECREF(steps); Py_XDECREF(consts); Py_XDECREF(inputs);
    Py_XDECREF(node); Py_XDECREF(desc); Py_XDECREF(outputs); Py_XDECREF(ref);
    Py_XDECREF(id); Py_XDECREF(pstream);
    return result;
}

/* -- Recording a node, in C: array._make1 / array._make ---------------------------------
 *
 * What every op does last (MLX's array constructor with a primitive and inputs): Node(
 * primitive, [x._d for x in inputs]) with the next node id, one ArrayDesc per output
 * (shape, dtype, the primitive's stream, node, index; no data; the tracer flag as
 * tracer.any_tracer gives it: False while no transformation runs, else that function),
 * each weakly listed as the node's output, and an mx.array handle on each. The same
 * objects and slots as array.py's Python versions (tests/test_eval_loop.py compares them).
 * configure_record hands over the types once.
 *
 * These objects are left out of the cyclic garbage collector (as CPython leaves out a
 * tuple of atoms), as MLX's graph is C++ objects it never sees: a graph is acyclic by
 * construction (a node holds its inputs, older arrays; its outputs only weakly; an array
 * holds its desc, a desc its node and data), so reference counting frees all of it, and
 * an op adds nothing the collector's generations have to walk (~12% of a small model's
 * decode time went to collections, most of it full ones over the whole heap). What they
 * reference stays tracked, and is kept alive by them as by any reference the collector
 * does not see. */
static PyObject *r_node_type, *r_desc_type, *r_array_type, *r_node_ids, *r_tracer, *r_any_tracer,
    *r_zero, *r_float64, *r_float64_check;
static Py_ssize_t r_array_d_off = -1, r_prim_stream_off = -1, r_prim_kw_off = -1;
static int record_configured = 0;

static PyObject *configure_record(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"node_type", "desc_type", "array_type", "node_ids",
                                        "tracer", "any_tracer", "float64", "float64_check"};
    PyObject **const slots[] = {&r_node_type, &r_desc_type, &r_array_type, &r_node_ids,
                                &r_tracer, &r_any_tracer, &r_float64, &r_float64_check};
    record_configured = 0;
    if (take_all(kw, "configure_record", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    PyObject *prim_type = PyDict_GetItemString(kw, "primitive_type");
    if (!prim_type || !PyType_Check(r_node_type) || !PyType_Check(r_desc_type) ||
        !PyType_Check(r_array_type) || !PyType_Check(prim_type)) {
        PyErr_SetString(PyExc_TypeError, "configure_record: the node, desc, array and "
                                         "primitive types");
        return NULL;
    }
    if (core_offsets(r_node_type, r_desc_type) < 0) return NULL;
    if ((r_array_d_off = slot_offset(r_array_type, "_d")) < 0) return NULL;
    if ((r_prim_stream_off = slot_offset(prim_type, "stream")) < 0) return NULL;
    if ((r_prim_kw_off = slot_offset(prim_type, "kw")) < 0) return NULL;
    if (r_zero == NULL && (r_zero = PyLong_FromLong(0)) == NULL) return NULL;
    Py_XSETREF(c_node_type, Py_NewRef(r_node_type));
    Py_XSETREF(c_desc_type, Py_NewRef(r_desc_type));
    record_configured = 1;
    Py_RETURN_NONE;
}

/* ``shape`` as a tuple of ints (array._make's tuple(int(s) for s in shape)); new ref */
static PyObject *int_shape(PyObject *shape) {
    if (PyTuple_CheckExact(shape)) {
        Py_ssize_t n = PyTuple_GET_SIZE(shape), i = 0;
        while (i < n && PyLong_CheckExact(PyTuple_GET_ITEM(shape, i))) i++;
        if (i == n) return Py_NewRef(shape);
    }
    PyObject *seq = PySequence_Fast(shape, "a shape is a sequence of ints");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++) {
        PyObject *v = PyNumber_Long(PySequence_Fast_GET_ITEM(seq, i));
        if (v == NULL) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i, v);
    }
    Py_DECREF(seq);
    return t;
}

/* MLX's array constructor refuses float64 on a GPU stream (mlx/array.cpp): when an input's
 * or an output's dtype is float64, array._no_gpu_float64(stream) decides (a pointer compare
 * per dtype otherwise: the dtypes are singletons) */
static int float64_ok(PyObject *prim, PyObject *descs, PyObject *const *dtypes, Py_ssize_t nd) {
    int hit = 0;
    for (Py_ssize_t i = 0; !hit && i < nd; i++) hit = dtypes[i] == r_float64;
    for (Py_ssize_t i = 0; !hit && i < PyList_GET_SIZE(descs); i++)
        hit = SLOT(PyList_GET_ITEM(descs, i), desc_off[D_DTYPE]) == r_float64;
    if (!hit) return 0;
    PyObject *r = PyObject_CallOneArg(r_float64_check, SLOT(prim, r_prim_stream_off));
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* transform_tracers.any_tracer(descs) while a transformation runs (a new reference): this
 * thread's state (its ``_local``'s retain / depth ints) read here, else the function */
static PyObject *tracer_flag(PyObject *descs) {
    static PyObject *s__local, *s___dict__, *s_retain, *s_depth;
    if (s__local == NULL && (!(s__local = PyUnicode_InternFromString("_local")) ||
                             !(s___dict__ = PyUnicode_InternFromString("__dict__")) ||
                             !(s_retain = PyUnicode_InternFromString("retain")) ||
                             !(s_depth = PyUnicode_InternFromString("depth"))))
        return NULL;
    PyObject *local = module_attr(r_tracer, s__local);
    PyObject *d = local ? PyObject_GetAttr(local, s___dict__) : NULL;
    Py_XDECREF(local);
    if (d == NULL) return NULL;
    PyObject *retain = PyDict_Check(d) ? PyDict_GetItemWithError(d, s_retain) : NULL;
    PyObject *depth = retain ? PyDict_GetItemWithError(d, s_depth) : NULL;
    PyObject *r = NULL;
    if (depth != NULL && PyLong_CheckExact(retain) && PyLong_CheckExact(depth)) {
        int ov = 0;
        long long rv = PyLong_AsLongLongAndOverflow(retain, &ov), dv;
        if (!ov) dv = PyLong_AsLongLongAndOverflow(depth, &ov);
        if (!ov) {
            int hit = rv > 0;
            for (Py_ssize_t i = 0; !hit && dv != 0 && i < PyList_GET_SIZE(descs); i++) {
                PyObject *t = SLOT(PyList_GET_ITEM(descs, i), desc_off[D_TRACER]);
                hit = t == Py_True ? 1 : t == NULL || t == Py_False ? 0 : PyObject_IsTrue(t);
                if (hit < 0) { Py_DECREF(d); return NULL; }
            }
            r = Py_NewRef(hit ? Py_True : Py_False);
        }
    }
    Py_DECREF(d);
    if (r != NULL) return r;
    if (PyErr_Occurred()) return NULL;
    return PyObject_CallOneArg(r_any_tracer, descs); /* (a state not made yet: its _state) */
}

/* the node of ``primitive`` over ``descs`` (a list of ArrayDescs, taken as the node's
 * inputs list) and its outputs' tracer flag (``*flag``, a new reference) */
/* no transformation runs (transform_tracers._active is 0): 1, 0, -1 with an error */
static int no_tracers(void) {
    PyObject *active = PyObject_GetAttr(r_tracer, s__active);
    if (active == NULL) return -1;
    int quiet = PyLong_CheckExact(active) && PyLong_AsLong(active) == 0;
    Py_DECREF(active);
    return quiet;
}

static PyObject *node_of_descs_q(PyObject *prim, PyObject *descs, PyObject **flag, int quiet);

static PyObject *node_of_descs(PyObject *prim, PyObject *descs, PyObject **flag) {
    int quiet = no_tracers();
    return quiet < 0 ? NULL : node_of_descs_q(prim, descs, flag, quiet);
}

/* node_of_descs with no_tracers' answer given (a replay asks once for all its nodes) */
static PyObject *node_of_descs_q(PyObject *prim, PyObject *descs, PyObject **flag, int quiet) {
    PyObject *id = NULL, *outputs = NULL, *node = NULL;
    *flag = quiet ? Py_NewRef(Py_False) : tracer_flag(descs);
    if (*flag == NULL) return NULL;
    id = PyIter_Next(r_node_ids);
    outputs = id ? PyList_New(0) : NULL;
    node = outputs ? bare(r_node_type) : NULL;
    if (node == NULL) {
        Py_CLEAR(*flag);
        if (id == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_StopIteration, "node ids");
        goto done;
    }
    put(node, node_off[N_PRIMITIVE], prim);
    put(node, node_off[N_INPUTS], descs);
    put(node, node_off[N_OUTPUTS], outputs);
    put(node, node_off[N_ID], id);
    put(node, node_off[N_EVENT], Py_None);
    put(node, node_off[N_KEEP], Py_False);
    put(node, node_off[N_BACKWARD], Py_False);
    PyObject_GC_UnTrack(node); /* (acyclic: see above; its primitive and its parameters too) */
    if (PyObject_IS_GC(prim) && PyObject_GC_IsTracked(prim)) {
        PyObject_GC_UnTrack(prim);
        PyObject *kw = SLOT(prim, r_prim_kw_off);
        if (kw != NULL && PyDict_CheckExact(kw) && PyObject_GC_IsTracked(kw))
            PyObject_GC_UnTrack(kw);
    }
    PyObject_GC_UnTrack(descs);
    PyObject_GC_UnTrack(outputs);
done:
    Py_XDECREF(id); Py_XDECREF(outputs);
    return node;
}

/* the node of ``primitive`` over ``inputs`` (a list of mx.arrays) and its tracer flag;
 * ``dtypes``: the outputs' (float64_ok) */
static PyObject *record_node(PyObject *prim, PyObject *inputs, PyObject **flag,
                             PyObject *const *dtypes, Py_ssize_t nd) {
    PyObject *seq = PySequence_Fast(inputs, "inputs are a sequence of arrays");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *descs = PyList_New(n);
    for (Py_ssize_t i = 0; descs != NULL && i < n; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *d = (PyObject *)Py_TYPE(x) == r_array_type
                          ? Py_XNewRef(SLOT(x, r_array_d_off)) : PyObject_GetAttr(x, s__d);
        if (d == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_d");
            Py_CLEAR(descs);
        } else {
            PyList_SET_ITEM(descs, i, d);
        }
    }
    Py_DECREF(seq);
    if (descs == NULL) return NULL;
    PyObject *node = NULL;
    if (float64_ok(prim, descs, dtypes, nd) == 0) node = node_of_descs(prim, descs, flag);
    Py_DECREF(descs);
    return node;
}

/* output ``index`` of ``node``: its ArrayDesc, listed weakly on the node (a new reference) */
static PyObject *output_desc(PyObject *node, PyObject *stream, PyObject *shape,
                             PyObject *dtype, PyObject *index, PyObject *flag) {
    PyObject *desc = bare(r_desc_type);
    if (desc == NULL) return NULL;
    put(desc, desc_off[D_SHAPE], shape);
    put(desc, desc_off[D_DTYPE], dtype);
    put(desc, desc_off[D_STREAM], stream);
    put(desc, desc_off[D_NODE], node);
    put(desc, desc_off[D_INDEX], index);
    put(desc, desc_off[D_DATA], Py_None);
    put(desc, desc_off[D_BUFFER], Py_None);
    put(desc, desc_off[D_TRACER], flag);
    put(desc, desc_off[D_KEPT], Py_None);
    PyObject_GC_UnTrack(desc);
    PyObject *ref = PyWeakref_NewRef(desc, NULL);
    if (ref != NULL) PyObject_GC_UnTrack(ref);
    if (ref == NULL || PyList_Append(SLOT(node, node_off[N_OUTPUTS]), ref) < 0) Py_CLEAR(desc);
    Py_XDECREF(ref);
    return desc;
}

/* output ``index`` of ``node``: its ArrayDesc listed weakly on the node, and a handle */
static PyObject *record_output(PyObject *node, PyObject *stream, PyObject *shape,
                               PyObject *dtype, PyObject *index, PyObject *flag) {
    PyObject *desc = output_desc(node, stream, shape, dtype, index, flag), *a = NULL;
    if (desc == NULL) return NULL;
    if ((a = bare(r_array_type)) != NULL) {
        put(a, r_array_d_off, desc);
        PyObject_GC_UnTrack(a);
    }
    Py_DECREF(desc);
    return a;
}

/* for _binary.c: a node over ``descs`` after the float64 check (record_node's steps over
 * descs), an output's handle, a new instance */
PyObject *record_node_descs(PyObject *prim, PyObject *descs, PyObject **flag,
                            PyObject *const *dtypes, Py_ssize_t nd) {
    if (float64_ok(prim, descs, dtypes, nd) < 0) return NULL;
    return node_of_descs(prim, descs, flag);
}

PyObject *record_output_of(PyObject *node, PyObject *stream, PyObject *shape,
                           PyObject *dtype, PyObject *flag) {
    return record_output(node, stream, shape, dtype, r_zero, flag);
}

PyObject *bare_of(PyObject *type) { return bare(type); }

static int record_args(const char *who, Py_ssize_t nargs, PyObject *const *args) {
    if (!record_configured) {
        PyErr_Format(PyExc_RuntimeError, "%s: not configured", who);
        return -1;
    }
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s(shape(s), dtype(s), primitive, inputs)", who);
        return -1;
    }
    return 0;
}

/* make1(shape, dtype, primitive, inputs): array._make1 (``shape`` a tuple of ints) */
static PyObject *make1(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (record_args("make1", nargs, args) < 0) return NULL;
    PyObject *flag = NULL, *node = record_node(args[2], args[3], &flag, &args[1], 1);
    if (node == NULL) return NULL;
    PyObject *a = record_output(node, SLOT(args[2], r_prim_stream_off), args[0], args[1],
                                r_zero, flag);
    Py_DECREF(node); Py_DECREF(flag);
    return a;
}

/* make(shapes, dtypes, primitive, inputs): array._make, a list of arrays */
static PyObject *make(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (record_args("make", nargs, args) < 0) return NULL;
    PyObject *shapes = PySequence_Fast(args[0], "shapes are a sequence");
    if (shapes == NULL) return NULL;
    PyObject *dtypes = PySequence_Fast(args[1], "dtypes are a sequence");
    if (dtypes == NULL) { Py_DECREF(shapes); return NULL; }
    PyObject *flag = NULL, *outs = NULL,
             *node = record_node(args[2], args[3], &flag, PySequence_Fast_ITEMS(dtypes),
                                 PySequence_Fast_GET_SIZE(dtypes));
    if (node == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(shapes);
    if (PySequence_Fast_GET_SIZE(dtypes) < n) n = PySequence_Fast_GET_SIZE(dtypes); /* zip */
    outs = PyList_New(n);
    PyObject *stream = SLOT(args[2], r_prim_stream_off);
    for (Py_ssize_t i = 0; outs != NULL && i < n; i++) {
        PyObject *shape = int_shape(PySequence_Fast_GET_ITEM(shapes, i));
        PyObject *index = shape ? PyLong_FromSsize_t(i) : NULL;
        PyObject *a = index ? record_output(node, stream, shape, PySequence_Fast_GET_ITEM(dtypes, i),
                                            index, flag) : NULL;
        Py_XDECREF(shape); Py_XDECREF(index);
        if (a == NULL) Py_CLEAR(outs);
        else PyList_SET_ITEM(outs, i, a);
    }
done:
    Py_DECREF(shapes); Py_DECREF(dtypes); Py_XDECREF(node); Py_XDECREF(flag);
    return outs;
}

/* handles(descs): [array._wrap(d) for d in descs], a compiled call's results' handles */
static PyObject *handles(PyObject *self, PyObject *descs) {
    if (!record_configured || !PyList_Check(descs)) {
        PyErr_SetString(PyExc_TypeError, "handles(descs: list), configured");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(descs);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *a = bare(r_array_type);
        if (a == NULL) { Py_CLEAR(out); break; }
        put(a, r_array_d_off, PyList_GET_ITEM(descs, i));
        PyList_SET_ITEM(out, i, a);
    }
    return out;
}

/* replay(steps, env): compile_trace.ReplayPlan.run's loop. Each step is (primitive, input
 * slots, ((shape, dtype), ...)): a node of the primitive over the descs of ``env`` (a list:
 * the arguments' descs, the constants', then every step's outputs) at those slots, its
 * output descs appended to ``env`` in order; the same Node and ArrayDesc as the Python
 * loop (the tracer flag as ArrayDesc's: any_tracer of the inputs). Returns None. */
static PyObject *replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!record_configured) {
        PyErr_SetString(PyExc_RuntimeError, "replay: not configured");
        return NULL;
    }
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "replay(steps: tuple, env: list)");
        return NULL;
    }
    PyObject *steps = args[0], *env = args[1];
    int quiet = no_tracers(); /* (the nodes' Python code runs none: one answer for them all) */
    if (quiet < 0) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(steps); k++) {
        PyObject *step = PyTuple_GET_ITEM(steps, k);
        if (!PyTuple_Check(step) || PyTuple_GET_SIZE(step) != 3 ||
            !PyTuple_Check(PyTuple_GET_ITEM(step, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(step, 2))) {
            PyErr_SetString(PyExc_TypeError, "replay: a step is (primitive, slots, outputs)");
            return NULL;
        }
        PyObject *prim = PyTuple_GET_ITEM(step, 0), *ins = PyTuple_GET_ITEM(step, 1),
                 *outs = PyTuple_GET_ITEM(step, 2);
        PyObject *stream = SLOT(prim, r_prim_stream_off);
        if (stream == NULL) {
            PyErr_SetString(PyExc_AttributeError, "replay: a primitive without its stream");
            return NULL;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(ins), have = PyList_GET_SIZE(env);
        PyObject *descs = PyList_New(n);
        if (descs == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(ins, i));
            if (j < 0 || j >= have) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "replay: a slot out of range");
                Py_DECREF(descs);
                return NULL;
            }
            PyList_SET_ITEM(descs, i, Py_NewRef(PyList_GET_ITEM(env, j)));
        }
        PyObject *flag = NULL, *node = node_of_descs_q(prim, descs, &flag, quiet);
        Py_DECREF(descs);
        if (node == NULL) return NULL;
        int bad = 0;
        for (Py_ssize_t i = 0; !bad && i < PyTuple_GET_SIZE(outs); i++) {
            PyObject *sd = PyTuple_GET_ITEM(outs, i);
            if (!PyTuple_Check(sd) || PyTuple_GET_SIZE(sd) != 2) {
                PyErr_SetString(PyExc_TypeError, "replay: an output is (shape, dtype)");
                bad = 1;
                break;
            }
            PyObject *index = i == 0 ? Py_NewRef(r_zero) : PyLong_FromSsize_t(i);
            PyObject *d = index ? output_desc(node, stream, PyTuple_GET_ITEM(sd, 0),
                                              PyTuple_GET_ITEM(sd, 1), index, flag) : NULL;
            Py_XDECREF(index);
            bad = d == NULL || PyList_Append(env, d) < 0;
            Py_XDECREF(d);
        }
        Py_DECREF(node); Py_DECREF(flag);
        if (bad) return NULL;
    }
    Py_RETURN_NONE;
}

/* CompiledBase: what CompiledFunction derives from, its call in C. A call with positional
 * arguments only, of a function whose ``_direct`` is True, tries the fast path; anything
 * else (and every miss) is the subclass's ``_call(*args, **kwargs)``. */
typedef struct {
    PyObject_HEAD
    PyObject *direct, *fast; /* ``_direct`` / ``_fast``: the call reads them here */
} Compiled;

static PyObject *base_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0) {
        Compiled *c = (Compiled *)self;
        if (c->direct == NULL || c->fast == NULL) {
            PyErr_SetString(PyExc_AttributeError, "a compiled function's _direct and _fast");
            return NULL;
        }
        if (c->direct == Py_True) {
            PyObject *fast = Py_NewRef(c->fast);
            PyObject *h = fast_call(fast, args);
            Py_DECREF(fast);
            if (h != Py_None) return h; /* the result, or NULL with the error */
            Py_DECREF(h);
        }
    }
    PyObject *slow = PyObject_GetAttr(self, s__call);
    if (slow == NULL) return NULL;
    PyObject *r = PyObject_Call(slow, args, kwargs);
    Py_DECREF(slow);
    return r;
}

static int compiled_traverse(Compiled *c, visitproc visit, void *arg) {
    Py_VISIT(c->direct);
    Py_VISIT(c->fast);
    return 0;
}

static int compiled_clear(Compiled *c) {
    Py_CLEAR(c->direct);
    Py_CLEAR(c->fast);
    return 0;
}

static void compiled_dealloc(Compiled *c) {
    PyObject_GC_UnTrack(c);
    compiled_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMemberDef compiled_members[] = {
    {"_direct", Py_T_OBJECT_EX, offsetof(Compiled, direct), 0,
     "positional arrays only may take the fast table"},
    {"_fast", Py_T_OBJECT_EX, offsetof(Compiled, fast), 0,
     "signature -> entry, for the calls that pass only arrays positionally"},
    {NULL},
};

static PyTypeObject CompiledBase = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.core._call.CompiledBase",
    .tp_basicsize = sizeof(Compiled),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_call = base_call,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)compiled_dealloc,
    .tp_traverse = (traverseproc)compiled_traverse,
    .tp_clear = (inquiry)compiled_clear,
    .tp_members = compiled_members,
    .tp_doc = "A compiled function's call in C (core/_call.c); the subclass has _call. Its "
              "_direct and _fast are C slots the call reads.",
};

/* mx.eval's first step in C: one mx.array whose eval is the plain case runs in the loop's
 * C part (_loop.c eager_eval, every backend); anything else, and whatever that declines, is
 * the Python eval (eval_api._eval), given with configure_eval. */
static PyObject *e_python = NULL;

static PyObject *configure_eval(PyObject *self, PyObject *kw) {
    PyObject *py = PyDict_Check(kw) ? PyDict_GetItemString(kw, "python") : NULL;
    if (py == NULL || !PyCallable_Check(py)) {
        PyErr_SetString(PyExc_TypeError, "configure_eval({'python': eval})");
        return NULL;
    }
    Py_XSETREF(e_python, Py_NewRef(py));
    Py_RETURN_NONE;
}

static PyObject *c_eval(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (e_python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_call.eval: not configured");
        return NULL;
    }
    if (nargs == 1 && eager_configured && r_array_type != NULL &&
        (PyObject *)Py_TYPE(args[0]) == r_array_type) {
        PyObject *desc = PyObject_GetAttr(args[0], s__d);
        PyObject *descs = desc ? PyList_New(1) : NULL;
        if (descs == NULL) { Py_XDECREF(desc); return NULL; }
        PyList_SET_ITEM(descs, 0, desc);
        int r = eager_eval(descs);
        Py_DECREF(descs);
        if (r < 0) return NULL;
        if (r == 1) Py_RETURN_NONE;
    }
    return PyObject_Vectorcall(e_python, args, nargs, NULL);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)configure, METH_O, "Hand over core's types and state (a dict)."},
    {"configure_eval", (PyCFunction)configure_eval, METH_O,
     "Hand over the Python eval (a dict: {'python': eval_api._eval})."},
    {"configure_loop", (PyCFunction)configure_loop, METH_O,
     "Hand over the eval loop's objects (a dict): the CPU backend, evaluate's helpers."},
    {"topo_order", (PyCFunction)topo_order, METH_O,
     "(the unscheduled nodes the arrays need, inputs first; scheduled nodes they wait on)"},
    {"eager_eval", (PyCFunction)py_eager_eval, METH_O,
     "Evaluate a list of ArrayDescs on one CPU stream here (True), or decline (False)."},
    {"configure_eager", (PyCFunction)configure_eager, METH_O,
     "Hand over eval_loop's objects for an eager op's eval in C (a dict)."},
    {"run_node", (PyCFunction)run_node, METH_O,
     "Run one graph node (evaluate.run_node; the common host node in C)."},
    {"configure_record", (PyCFunction)configure_record, METH_O,
     "Hand over core's node, desc and array types for recording nodes (a dict)."},
    {"make1", (PyCFunction)(void (*)(void))make1, METH_FASTCALL,
     "make1(shape, dtype, primitive, inputs): one output's node recorded (array._make1)."},
    {"make", (PyCFunction)(void (*)(void))make, METH_FASTCALL,
     "make(shapes, dtypes, primitive, inputs): a node's outputs recorded (array._make)."},
    {"configure_products", (PyCFunction)configure_products, METH_O,
     "Hand over ops/products.py's helpers for recording matmul / addmm in C (a dict)."},
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL,
     "matmul(a, b, stream): ops/products.py _matmul (_products.c)."},
    {"addmm", (PyCFunction)(void (*)(void))py_addmm, METH_FASTCALL,
     "addmm(c, a, b, alpha, beta, stream): ops/products.py _addmm (_products.c)."},
    {"install_matmul", (PyCFunction)install_matmul, METH_O,
     "install_matmul(op): the array's @ in C, op the Python fallback (_products.c)."},
    {"configure_autodiff", (PyCFunction)configure_autodiff, METH_O,
     "Hand over autodiff/engine.py's helpers for reverse mode's walk in C (a dict)."},
    {"vjp_walk", (PyCFunction)(void (*)(void))vjp_walk, METH_FASTCALL,
     "vjp_walk(outputs, primals, active, cmap, state): engine._reverse_py (_autodiff.c)."},
    {"vjp_mark", (PyCFunction)(void (*)(void))vjp_mark, METH_FASTCALL,
     "vjp_mark(grads, start): engine._mark_py, Node.backward set (_autodiff.c)."},
    {"configure_fields", (PyCFunction)configure_fields, METH_O,
     "array's shape / dtype / ndim descriptors, _wrap and _handle in C (_fields.c)."},
    {"primitive", (PyCFunction)(void (*)(void))py_primitive, METH_FASTCALL | METH_KEYWORDS,
     "Primitive.__new__(cls, name, stream, **params) in C (_binary.c)."},
    {"configure_stream", (PyCFunction)configure_stream, METH_O,
     "device.py's resolve_stream, its module dict and Stream (_stream.c)."},
    {"resolve_stream", (PyCFunction)(void (*)(void))resolve_stream, METH_FASTCALL,
     "device.resolve_stream: stream=None's default remembered per thread (_stream.c)."},
    {"configure_binary", (PyCFunction)configure_binary, METH_O,
     "Hand over the op layer's helpers for recording binary ops (a dict; _binary.c)."},
    {"install_operators", (PyCFunction)install_operators, METH_O,
     "install_operators({method: op}): the array's + - * / operators in C (_binary.c)."},
    {"binary", (PyCFunction)(void (*)(void))py_binary, METH_FASTCALL | METH_KEYWORDS,
     "binary(name, a, b, stream, dtype, out_dtype): ops/elementwise.py binary (_binary.c)."},
    {"scalar", (PyCFunction)(void (*)(void))py_scalar, METH_FASTCALL,
     "scalar(v, dtype): a Python scalar's 0-d array (convert.py _scalar; _binary.c)."},
    {"configure_reduce", (PyCFunction)configure_reduce, METH_O,
     "Hand over ops/reduction.py's tables and Python paths (a dict; _reduce.c)."},
    {"reduce", (PyCFunction)(void (*)(void))py_reduce, METH_FASTCALL,
     "reduce(name, fname, a, axis, keepdims, stream): ops/reduction.py _reduce (_reduce.c)."},
    {"last_reduce", (PyCFunction)(void (*)(void))py_last_reduce, METH_FASTCALL,
     "last_reduce(name, a, axis, keepdims, stream): ops/reduction.py _last_reduce (_reduce.c)."},
    {"arg_reduce", (PyCFunction)(void (*)(void))py_arg_reduce, METH_FASTCALL,
     "arg_reduce(fname, a, axis, keepdims, stream): ops/reduction.py _arg_reduce (_reduce.c)."},
    {"softmax", (PyCFunction)(void (*)(void))py_softmax, METH_FASTCALL,
     "softmax(a, axis, precise, stream): ops/reduction.py _softmax (_reduce.c)."},
    {"configure_layout", (PyCFunction)configure_layout, METH_O,
     "Hand over ops/shape.py's Python layout ops; the C ones back (a dict; _layout.c)."},
    {"configure_layout_methods", (PyCFunction)configure_layout_methods, METH_O,
     "Hand over the layout ops' Python method forms; the C ones back (a dict; _layout.c)."},
    {"handles", (PyCFunction)handles, METH_O,
     "handles(descs): a list of descs' array handles ([array._wrap(d) for d in descs])."},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(steps, env): a replay plan's nodes recorded over env's descs, outputs appended."},
    {"eval", (PyCFunction)(void (*)(void))c_eval, METH_FASTCALL,
     "eval($module, /, *args)\n--\n\n"
     "Evaluate the arrays (or pytrees of arrays) given, and everything they depend on.\n\n"
     "Leaves that are not arrays are ignored. Blocks until the outputs are available."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_call",
                                    "A compiled function's call in C (see _call.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__call(void) {
    if (intern_all() < 0 || PyType_Ready(&CompiledBase) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "CompiledBase", (PyObject *)&CompiledBase) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
