/* A binary op recorded in C: ops/elementwise.py ``binary``'s steps (its Python version,
 * ``binary_py``, is the reference and runs where this is not built).
 *
 * MLX's bindings convert a ``scalar | array`` operand in C++ (python/src/utils.cpp
 * to_arrays: a Python scalar next to an array is typed weakly against the array's dtype),
 * then the op promotes, casts and broadcasts its operands (mlx/ops.cpp add / multiply /
 * ...: broadcast_arrays, a Broadcast node per operand whose shape differs) and records one
 * primitive. Here, for operands that are mx.arrays or Python floats:
 *
 *   a Python float next to an array takes the array's dtype when it is inexact, else
 *   float32 (convert.py ``_weak_float``), and when it fits that dtype (float32 / complex64
 *   / float64 / float16 / bfloat16, the 16-bit ones rounded from the float32; NaN, inf and
 *   any other operand go through convert.py's
 *   ``to_array``) its 0-d array is made here as ``_scalar`` makes it (an ArrayDesc over
 *   numpy's 0-d array, adopted by the CPU allocator, on the default stream when a scalar's
 *   array there is host data: the host's streams, and a device's whose allocator keeps
 *   its scalars on the host, ``scalars_on_host``: CUDA's);
 *   the compute dtype is ``dtype`` (the caller's) or the operands' (promote_types when they
 *   differ), an operand of another dtype cast (convert.py ``cast``);
 *   equal shapes need nothing; a 0-d operand broadcasts to the other's shape; otherwise
 *   convert.py ``broadcast_shapes`` gives the shape (its ValueError before anything is
 *   recorded); an operand of another shape gets a Broadcast node (its ``shape`` parameter);
 *   the op's node is recorded as array._make1 records it (_call.c node_of_descs /
 *   record_output), its primitive made as primitive.Primitive(name, stream) makes it.
 */
#include "_core.h"

PyObject *record_node_descs(PyObject *prim, PyObject *descs, PyObject **flag,
                            PyObject *const *dtypes, Py_ssize_t nd);
PyObject *record_output_of(PyObject *node, PyObject *stream, PyObject *shape,
                           PyObject *dtype, PyObject *flag);
PyObject *bare_of(PyObject *type);

static PyObject *b_prim_type, *b_registry, *b_promote, *b_to_array, *b_cast,
    *b_broadcast_shapes, *b_resolve, *b_allocator, *b_handle_type, *b_np_array, *b_host_stream,
    *b_array_type, *b_f16, *b_bf16, *b_f32, *b_f64, *b_c64, *b_inexact, *b_dtype_type;
static PyObject *b_cpu, *b_shape_key, *b_empty, *b_zero, *b_broadcast, *b_adopt, *b_cpu_alloc;
static Py_ssize_t p_name_off, p_params_off, p_kw_off, p_stream_off, p_defn_off, b_d_off,
    dt_np_off;
int binary_configured = 0;
/* the last default stream asked about and whether its memory is the host's */
static PyObject *host_stream_seen;
static int host_stream_ok;

PyObject *configure_binary(PyObject *self, PyObject *kw) {
    static const char *const names[] = {
        "primitive_type", "registry", "promote_types", "to_array", "cast", "broadcast_shapes",
        "resolve_stream", "allocator", "handle_type", "np_array", "host_stream", "array_type",
        "float16", "bfloat16", "float32", "float64", "complex64", "inexact", "dtype_type"};
    PyObject *dtype_type = NULL;
    PyObject **const slots[] = {&b_prim_type, &b_registry, &b_promote, &b_to_array, &b_cast,
                                &b_broadcast_shapes, &b_resolve, &b_allocator, &b_handle_type,
                                &b_np_array, &b_host_stream, &b_array_type, &b_f16, &b_bf16, &b_f32,
                                &b_f64, &b_c64, &b_inexact, &dtype_type};
    binary_configured = 0;
    if (take_all(kw, "configure_binary", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyType_Check(b_prim_type) || !PyType_Check(b_array_type) || !PyType_Check(dtype_type) ||
        !PyDict_Check(b_registry) || !PyAnySet_Check(b_inexact) || c_node_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "configure_binary: the primitive, array and dtype "
                                         "types, the registry (a dict), the inexact dtypes (a "
                                         "set), after configure_record");
        return NULL;
    }
    if ((p_name_off = slot_offset(b_prim_type, "name")) < 0 ||
        (p_params_off = slot_offset(b_prim_type, "_params")) < 0 ||
        (p_kw_off = slot_offset(b_prim_type, "kw")) < 0 ||
        (p_stream_off = slot_offset(b_prim_type, "stream")) < 0 ||
        (p_defn_off = slot_offset(b_prim_type, "defn")) < 0 ||
        (b_d_off = slot_offset(b_array_type, "_d")) < 0 ||
        (dt_np_off = slot_offset(dtype_type, "np")) < 0)
        return NULL;
    if (b_cpu == NULL && (b_cpu = PyUnicode_InternFromString("cpu")) == NULL) return NULL;
    if (b_shape_key == NULL && (b_shape_key = PyUnicode_InternFromString("shape")) == NULL)
        return NULL;
    if (b_empty == NULL && (b_empty = PyTuple_New(0)) == NULL) return NULL;
    if (b_zero == NULL && (b_zero = PyLong_FromLong(0)) == NULL) return NULL;
    if (b_broadcast == NULL && (b_broadcast = PyUnicode_InternFromString("Broadcast")) == NULL)
        return NULL;
    if (b_adopt == NULL && (b_adopt = PyUnicode_InternFromString("adopt")) == NULL) return NULL;
    Py_CLEAR(b_cpu_alloc);
    Py_CLEAR(host_stream_seen);
    Py_XSETREF(b_dtype_type, Py_NewRef(dtype_type));
    binary_configured = 1;
    Py_RETURN_NONE;
}

/* primitive.Primitive(name, stream, **kw) (``kw`` a new dict, stolen; NULL: no parameters) */
PyObject *new_primitive(PyObject *name, PyObject *stream, PyObject *kw) {
    PyObject *defn = PyDict_GetItemWithError(b_registry, name);
    if (defn == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "unregistered primitive %U", name);
        Py_XDECREF(kw);
        return NULL;
    }
    if (kw == NULL && (kw = PyDict_New()) == NULL) return NULL;
    PyObject *p = bare_of(b_prim_type);
    if (p != NULL) {
        put(p, p_defn_off, defn);
        put(p, p_name_off, name);
        put(p, p_stream_off, stream);
        put(p, p_kw_off, kw);
        put(p, p_params_off, Py_None);
    }
    Py_DECREF(kw);
    return p;
}

/* ``Primitive(name, stream, **params)`` as the class's ``__new__`` (ops/elementwise.py puts
 * it there and takes the Python ``__init__`` away where this is configured): the definition
 * looked up, the parameters' dict, new_primitive's slots; ``cls`` Primitive or a subclass */
PyObject *py_primitive(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames) {
    if (!binary_configured) {
        PyErr_SetString(PyExc_RuntimeError, "_call.primitive: not configured");
        return NULL;
    }
    if (nargs != 3 || !PyType_Check(args[0]) ||
        !PyType_IsSubtype((PyTypeObject *)args[0], (PyTypeObject *)b_prim_type)) {
        PyErr_SetString(PyExc_TypeError, "Primitive(name, stream, **params)");
        return NULL;
    }
    PyObject *name = args[1], *defn = PyDict_GetItemWithError(b_registry, name);
    if (defn == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "unregistered primitive %S", name);
        return NULL;
    }
    PyObject *kw = PyDict_New();
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; kw != NULL && i < nkw; i++)
        if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) Py_CLEAR(kw);
    PyObject *p = kw ? bare_of(args[0]) : NULL;
    if (p != NULL) {
        put(p, p_defn_off, defn);
        put(p, p_name_off, name);
        put(p, p_stream_off, args[2]);
        put(p, p_kw_off, kw);
        put(p, p_params_off, Py_None);
    }
    Py_XDECREF(kw);
    return p;
}

/* the desc (``handle`` 0) or the array (1) of a one-output node of ``prim`` (stolen) over
 * ``descs`` (a new list, stolen) */
PyObject *record1(PyObject *prim, PyObject *descs, PyObject *shape, PyObject *dtype,
                         int handle) {
    PyObject *flag = NULL, *out = NULL;
    PyObject *node = prim ? record_node_descs(prim, descs, &flag, &dtype, 1) : NULL;
    if (node != NULL) {
        PyObject *a = record_output_of(node, SLOT(prim, p_stream_off), shape, dtype, flag);
        if (a != NULL && !handle) {
            out = Py_NewRef(SLOT(a, b_d_off));
            Py_DECREF(a);
        } else {
            out = a;
        }
    }
    Py_XDECREF(node); Py_XDECREF(flag); Py_XDECREF(prim); Py_DECREF(descs);
    return out;
}

static PyObject *list2(PyObject *x, PyObject *y) { /* a new list of x (and y), new refs */
    PyObject *l = PyList_New(y ? 2 : 1);
    if (l == NULL) return NULL;
    PyList_SET_ITEM(l, 0, Py_NewRef(x));
    if (y) PyList_SET_ITEM(l, 1, Py_NewRef(y));
    return l;
}

/* whether a scalar's 0-d array on ``stream`` is host data (host_stream(stream): the host's
 * memory, or a device's that keeps scalars there), remembered for the last stream asked
 * about; -1 on error */
static int host_memory(PyObject *stream) {
    if (stream == host_stream_seen) return host_stream_ok;
    PyObject *r = PyObject_CallOneArg(b_host_stream, stream);
    if (r == NULL) return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (ok < 0) return -1;
    Py_XSETREF(host_stream_seen, Py_NewRef(stream));
    host_stream_ok = ok;
    return ok;
}

/* the default stream (resolve_stream(None)); new ref */
static PyObject *the_default_stream(void) { return PyObject_CallOneArg(b_resolve, Py_None); }

/* convert.py ``_scalar(v, dt)``'s desc (``v`` known to fit ``dt``): 1 and ``*out`` (a new
 * reference), 0 when a scalar's array on the default stream is not host data (``_scalar``
 * makes it there), -1 on error */
static int scalar_desc(PyObject *v, PyObject *dt, PyObject **out) {
    PyObject *stream = the_default_stream();
    if (stream == NULL) return -1;
    int host = host_memory(stream);
    if (host != 1) { Py_DECREF(stream); return host; }
    /* MLX makes a Python float a float32 first (python/src/convert.cpp): a 16-bit float
     * rounds from that float32, not from the double */
    PyObject *v32 = NULL;
    if ((dt == b_f16 || dt == b_bf16) && PyFloat_Check(v)) {
        v32 = PyFloat_FromDouble((double)(float)PyFloat_AS_DOUBLE(v));
        if (v32 == NULL) { Py_DECREF(stream); return -1; }
        v = v32;
    }
    PyObject *args[2] = {v, SLOT(dt, dt_np_off)};
    PyObject *data = args[1] ? PyObject_Vectorcall(b_np_array, args, 2, NULL) : NULL;
    Py_XDECREF(v32);
    /* the host's allocator, made once per process (allocator.allocator("cpu")): asked once */
    if (data != NULL && b_cpu_alloc == NULL) b_cpu_alloc = PyObject_CallOneArg(b_allocator, b_cpu);
    PyObject *alloc = data ? Py_XNewRef(b_cpu_alloc) : NULL;
    PyObject *buf = alloc ? PyObject_CallMethodOneArg(alloc, b_adopt, data) : NULL;
    PyObject *hargs[2] = {buf, alloc};
    PyObject *handle = buf ? PyObject_Vectorcall(b_handle_type, hargs, 2, NULL) : NULL;
    PyObject *desc = handle ? bare_of(c_desc_type) : NULL;
    if (desc != NULL) {
        put(desc, desc_off[D_SHAPE], b_empty);
        put(desc, desc_off[D_DTYPE], dt);
        put(desc, desc_off[D_STREAM], stream);
        put(desc, desc_off[D_NODE], Py_None);
        put(desc, desc_off[D_INDEX], b_zero);
        put(desc, desc_off[D_DATA], data);
        put(desc, desc_off[D_BUFFER], handle);
        put(desc, desc_off[D_TRACER], Py_False);
        put(desc, desc_off[D_KEPT], Py_None);
        PyObject_GC_UnTrack(desc); /* (acyclic: its data and buffer handle) */
    }
    Py_DECREF(stream); Py_XDECREF(data); Py_XDECREF(alloc); Py_XDECREF(buf); Py_XDECREF(handle);
    if (desc == NULL) return -1;
    *out = desc;
    return 1;
}

/* a Python float's 0-d ArrayDesc typed weakly against ``like``: 1 and ``*out`` (a new
 * reference), 0 when convert.py must make it, -1 on error */
static int weak_float_desc(PyObject *v, PyObject *like, PyObject **out) {
    PyObject *dt = PySet_Contains(b_inexact, like) == 1 ? like : b_f32;
    double x = PyFloat_AS_DOUBLE(v), lim;
    if (dt == b_f32 || dt == b_c64) lim = 3.4028234663852886e38;
    else if (dt == b_f64) lim = 1.7976931348623157e308;
    else if (dt == b_f16) lim = 65504.0;
    else if (dt == b_bf16) lim = 3.3895313892515355e38; /* (NaN: the constructor's rule) */
    else return 0;
    if (!(-lim <= x && x <= lim)) return 0; /* (NaN too) */
    return scalar_desc(v, dt, out);
}

/* an mx.array's desc (a new reference) */
static PyObject *array_desc(PyObject *a) {
    PyObject *d = SLOT(a, b_d_off);
    if (d == NULL) PyErr_SetString(PyExc_AttributeError, "_d");
    return Py_XNewRef(d);
}

/* an operand's desc (a new reference): an mx.array's, a Python float's made here, else
 * convert.py to_array(v, like)'s */
static PyObject *operand_desc(PyObject *v, PyObject *like) {
    if ((PyObject *)Py_TYPE(v) == b_array_type) return array_desc(v);
    if (PyFloat_CheckExact(v) && like != NULL) {
        PyObject *d = NULL;
        int r = weak_float_desc(v, like, &d);
        if (r != 0) return r > 0 ? d : NULL;
    }
    PyObject *a = like ? PyObject_CallFunctionObjArgs(b_to_array, v, like, NULL)
                       : PyObject_CallOneArg(b_to_array, v);
    if (a == NULL) return NULL;
    PyObject *d = PyObject_GetAttr(a, s__d);
    Py_DECREF(a);
    return d;
}

static int is_array(PyObject *v) {
    return (PyObject *)Py_TYPE(v) == b_array_type || PyObject_TypeCheck(v, (PyTypeObject *)b_array_type);
}

/* convert.py cast(desc's array, dt, stream)'s desc (a new reference) */
static PyObject *cast_desc(PyObject *d, PyObject *dt, PyObject *stream) {
    PyObject *a = bare_of(b_array_type);
    if (a == NULL) return NULL;
    put(a, b_d_off, d);
    PyObject *r = PyObject_CallFunctionObjArgs(b_cast, a, dt, stream, NULL);
    Py_DECREF(a);
    if (r == NULL) return NULL;
    PyObject *out = PyObject_GetAttr(r, s__d);
    Py_DECREF(r);
    return out;
}

/* a Broadcast node of ``d`` to ``shape``: its output desc (a new reference) */
static PyObject *broadcast_desc(PyObject *d, PyObject *shape, PyObject *stream) {
    PyObject *kw = PyDict_New();
    if (kw == NULL || PyDict_SetItem(kw, b_shape_key, shape) < 0) { Py_XDECREF(kw); return NULL; }
    PyObject *descs = list2(d, NULL);
    if (descs == NULL) { Py_DECREF(kw); return NULL; }
    return record1(new_primitive(b_broadcast, stream, kw), descs, shape,
                   SLOT(d, desc_off[D_DTYPE]), 0);
}

/* the shape two shapes (tuples of ints) broadcast to, numpy's rule as convert.py
 * broadcast_shape_of applies it; shapes that do not broadcast (or a dimension that is not
 * a small int) go to convert.py broadcast_shapes, which raises MLX's ValueError. New ref. */
static PyObject *broadcast_pair(PyObject *a, PyObject *b) {
    Py_ssize_t na = PyTuple_GET_SIZE(a), nb = PyTuple_GET_SIZE(b), n = na > nb ? na : nb;
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = i >= n - na ? PyTuple_GET_ITEM(a, i - (n - na)) : NULL;
        PyObject *y = i >= n - nb ? PyTuple_GET_ITEM(b, i - (n - nb)) : NULL;
        int ox = 0, oy = 0;
        long long vx = x ? (PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &ox) : -2) : 1;
        long long vy = y ? (PyLong_CheckExact(y) ? PyLong_AsLongLongAndOverflow(y, &oy) : -2) : 1;
        PyObject *r = NULL;
        if (vx >= 0 && vy >= 0 && !ox && !oy) {
            if (vx == vy || vy == 1) r = x ? x : y;
            else if (vx == 1) r = y;
        }
        if (r == NULL) { /* (a mismatch: the Python rule's error) */
            Py_DECREF(out);
            PyErr_Clear();
            return PyObject_CallFunctionObjArgs(b_broadcast_shapes, a, b, NULL);
        }
        PyTuple_SET_ITEM(out, i, Py_NewRef(r));
    }
    return out;
}

/* binary(name, a, b, stream, dtype=None, out_dtype=None): ops/elementwise.py binary */
PyObject *py_binary(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *usage = "binary(name, a, b, stream, dtype=None, out_dtype=None)";
    if (!binary_configured) {
        PyErr_SetString(PyExc_RuntimeError, "binary: not configured");
        return NULL;
    }
    PyObject *v[6] = {NULL, NULL, NULL, NULL, Py_None, Py_None};
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 4 || nargs > 6 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) v[i] = args[i];
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        int at = PyUnicode_CompareWithASCIIString(k, "dtype") == 0 ? 4
                 : PyUnicode_CompareWithASCIIString(k, "out_dtype") == 0 ? 5 : -1;
        if (at < 0 || at < nargs) {
            PyErr_SetString(PyExc_TypeError, usage);
            return NULL;
        }
        v[at] = args[nargs + i];
    }
    PyObject *name = v[0], *a = v[1], *b = v[2], *dtype = v[4], *odt = v[5];
    PyObject *s = v[3] == Py_None ? the_default_stream() : PyObject_CallOneArg(b_resolve, v[3]);
    if (s == NULL) return NULL;
    PyObject *ad = NULL, *bd = NULL, *out = NULL, *shape = NULL, *dt = NULL;
    int aa = is_array(a), ba = is_array(b);
    /* to_arrays: a non-array next to an array typed weakly against it */
    if (aa) {
        ad = array_desc(a);
        bd = ad ? operand_desc(b, ba ? NULL : SLOT(ad, desc_off[D_DTYPE])) : NULL;
    } else if (ba) {
        bd = array_desc(b);
        ad = bd ? operand_desc(a, SLOT(bd, desc_off[D_DTYPE])) : NULL;
    } else {
        ad = operand_desc(a, NULL);
        bd = ad ? operand_desc(b, NULL) : NULL;
    }
    if (ad == NULL || bd == NULL) goto done;
    PyObject *adt = SLOT(ad, desc_off[D_DTYPE]), *bdt = SLOT(bd, desc_off[D_DTYPE]);
    if (dtype != Py_None) dt = Py_NewRef(dtype);
    else if (adt == bdt) dt = Py_NewRef(adt);
    else if ((dt = PyObject_CallFunctionObjArgs(b_promote, adt, bdt, NULL)) == NULL) goto done;
    PyObject *ash = SLOT(ad, desc_off[D_SHAPE]), *bsh = SLOT(bd, desc_off[D_SHAPE]);
    int same = ash == bsh;
    if (!same) {
        int eq = PyObject_RichCompareBool(ash, bsh, Py_EQ);
        if (eq < 0) goto done;
        same = eq;
    }
    if (same) shape = Py_NewRef(ash);
    else if (!PyTuple_Check(ash) || !PyTuple_Check(bsh)) {
        if ((shape = PyObject_CallFunctionObjArgs(b_broadcast_shapes, ash, bsh, NULL)) == NULL)
            goto done;
    } else if (PyTuple_GET_SIZE(bsh) == 0) shape = Py_NewRef(ash);
    else if (PyTuple_GET_SIZE(ash) == 0) shape = Py_NewRef(bsh);
    else if ((shape = broadcast_pair(ash, bsh)) == NULL)
        goto done;
    if (adt != dt) {
        PyObject *c = cast_desc(ad, dt, s);
        if (c == NULL) goto done;
        Py_SETREF(ad, c);
    }
    if (bdt != dt) {
        PyObject *c = cast_desc(bd, dt, s);
        if (c == NULL) goto done;
        Py_SETREF(bd, c);
    }
    if (!same) {
        for (int k = 0; k < 2; k++) {
            PyObject **d = k ? &bd : &ad;
            int eq = PyObject_RichCompareBool(SLOT(*d, desc_off[D_SHAPE]), shape, Py_EQ);
            if (eq < 0) goto done;
            if (eq) continue;
            PyObject *bc = broadcast_desc(*d, shape, s);
            if (bc == NULL) goto done;
            Py_SETREF(*d, bc);
        }
    }
    PyObject *descs = list2(ad, bd);
    if (descs == NULL) goto done;
    out = record1(new_primitive(name, s, NULL), descs, shape, odt == Py_None ? dt : odt, 1);
done:
    Py_DECREF(s); Py_XDECREF(ad); Py_XDECREF(bd); Py_XDECREF(shape); Py_XDECREF(dt);
    return out;
}

/* scalar(v, dtype): convert.py ``_scalar`` (a 0-d mx.array of a Python scalar known to fit
 * ``dtype``), or None where the default stream's memory is not the host's */
PyObject *py_scalar(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!binary_configured) {
        PyErr_SetString(PyExc_RuntimeError, "scalar: not configured");
        return NULL;
    }
    if (nargs != 2 || (PyObject *)Py_TYPE(args[1]) != b_dtype_type) {
        PyErr_SetString(PyExc_TypeError, "scalar(v, dtype: Dtype)");
        return NULL;
    }
    PyObject *d = NULL;
    int r = scalar_desc(args[0], args[1], &d);
    if (r <= 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *a = bare_of(b_array_type);
    if (a != NULL) {
        put(a, b_d_off, d);
        PyObject_GC_UnTrack(a);
    }
    Py_DECREF(d);
    return a;
}

/* -- The array's arithmetic operators in C ------------------------------------------------
 * ``a + b``, ``a - b``, ``a * b``, ``a / b`` and their reflected forms (array_methods.py
 * _operator's ``op``): where the other operand is an mx.array or a Python float, the op's
 * ``binary(name, a, b, None)`` above without the Python frame (for ``/``: where ``a`` is
 * inexact and the other a float or of a's dtype, as ``op`` tests); any other operand, and
 * every error, through ``op`` itself (its MLX messages), kept here per operator. The
 * commutative reflected ones keep the array first, as ``op`` does (MLX's ``2 * y`` is
 * Multiply(y, 2)). Method descriptors of the array type: called as f(self, other). */
enum { OP_ADD, OP_RADD, OP_SUB, OP_RSUB, OP_MUL, OP_RMUL, OP_DIV, OP_RDIV, OP_COUNT };
static const char *const op_methods[OP_COUNT] = {"__add__", "__radd__", "__sub__", "__rsub__",
                                                 "__mul__", "__rmul__", "__truediv__",
                                                 "__rtruediv__"};
static const char *const op_prims[OP_COUNT] = {"Add", "Add", "Subtract", "Subtract", "Multiply",
                                               "Multiply", "Divide", "Divide"};
static const int op_swapped[OP_COUNT] = {0, 0, 0, 1, 0, 0, 0, 1}; /* other first */
static PyObject *op_names[OP_COUNT], *op_python[OP_COUNT];
static PyObject *s_kind, *s_dtype_attr;

static PyObject *op_call(int k, PyObject *self, PyObject *other) {
    PyObject *py = op_python[k];
    if (py == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "array operators: not installed");
        return NULL;
    }
    int given = binary_configured && (PyObject *)Py_TYPE(self) == b_array_type &&
                ((PyObject *)Py_TYPE(other) == b_array_type || PyFloat_CheckExact(other));
    if (given && (k == OP_DIV || k == OP_RDIV)) { /* inexact a; a float or a's dtype */
        PyObject *d = SLOT(self, b_d_off);
        PyObject *dt = d ? PyObject_GetAttr(d, s_dtype_attr) : NULL;
        PyObject *kind = dt ? PyObject_GetAttr(dt, s_kind) : NULL;
        const char *kc = kind && PyUnicode_Check(kind) ? PyUnicode_AsUTF8(kind) : NULL;
        given = kc != NULL && kc[0] != 0 && kc[1] == 0 && strchr("fVc", kc[0]) != NULL;
        if (given && !PyFloat_CheckExact(other)) {
            PyObject *od = SLOT(other, b_d_off);
            PyObject *odt = od ? PyObject_GetAttr(od, s_dtype_attr) : NULL;
            given = odt != NULL && odt == dt;
            Py_XDECREF(odt);
        }
        Py_XDECREF(dt); Py_XDECREF(kind);
        PyErr_Clear();
    }
    if (!given) {
        PyObject *args[2] = {self, other};
        return PyObject_Vectorcall(py, args, 2, NULL);
    }
    PyObject *args[4] = {op_names[k], op_swapped[k] ? other : self, op_swapped[k] ? self : other,
                         Py_None};
    return py_binary(NULL, args, 4, NULL);
}

#define OP_FN(K, fn) static PyObject *fn(PyObject *self, PyObject *other) { return op_call(K, self, other); }
OP_FN(OP_ADD, op_add) OP_FN(OP_RADD, op_radd) OP_FN(OP_SUB, op_sub) OP_FN(OP_RSUB, op_rsub)
OP_FN(OP_MUL, op_mul) OP_FN(OP_RMUL, op_rmul) OP_FN(OP_DIV, op_div) OP_FN(OP_RDIV, op_rdiv)
#undef OP_FN
static PyMethodDef op_defs[OP_COUNT] = {
    {"__add__", op_add, METH_O, "``add`` as the ``__add__`` operator (in C: _binary.c)."},
    {"__radd__", op_radd, METH_O, "``add`` as the ``__radd__`` operator (in C: _binary.c)."},
    {"__sub__", op_sub, METH_O, "``subtract`` as the ``__sub__`` operator (in C: _binary.c)."},
    {"__rsub__", op_rsub, METH_O, "``subtract`` as the ``__rsub__`` operator (in C: _binary.c)."},
    {"__mul__", op_mul, METH_O, "``multiply`` as the ``__mul__`` operator (in C: _binary.c)."},
    {"__rmul__", op_rmul, METH_O, "``multiply`` as the ``__rmul__`` operator (in C: _binary.c)."},
    {"__truediv__", op_div, METH_O, "``divide`` as the ``__truediv__`` operator (in C: _binary.c)."},
    {"__rtruediv__", op_rdiv, METH_O, "``divide`` as the ``__rtruediv__`` operator (in C: _binary.c)."},
};

/* install_operators({method name: the Python op}): each of the operators above that the
 * dict names put on the array type (after configure_binary), its Python op kept as the
 * fallback; returns the names installed */
PyObject *install_operators(PyObject *self, PyObject *ops) {
    if (!binary_configured || !PyDict_Check(ops)) {
        PyErr_SetString(PyExc_TypeError, "install_operators(dict), after configure_binary");
        return NULL;
    }
    if (s_kind == NULL && ((s_kind = PyUnicode_InternFromString("kind")) == NULL ||
                           (s_dtype_attr = PyUnicode_InternFromString("dtype")) == NULL))
        return NULL;
    PyObject *done = PyList_New(0);
    for (int k = 0; done != NULL && k < OP_COUNT; k++) {
        PyObject *py = PyDict_GetItemString(ops, op_methods[k]);
        if (py == NULL) continue;
        if (op_names[k] == NULL && (op_names[k] = PyUnicode_InternFromString(op_prims[k])) == NULL)
            goto fail;
        Py_XSETREF(op_python[k], Py_NewRef(py));
        PyObject *descr = PyDescr_NewMethod((PyTypeObject *)b_array_type, &op_defs[k]);
        if (descr == NULL) goto fail;
        int rc = PyObject_SetAttrString(b_array_type, op_methods[k], descr);
        Py_DECREF(descr);
        PyObject *name = rc < 0 ? NULL : PyUnicode_FromString(op_methods[k]);
        if (name == NULL || PyList_Append(done, name) < 0) { Py_XDECREF(name); goto fail; }
        Py_DECREF(name);
    }
    return done;
fail:
    Py_XDECREF(done);
    return NULL;
}
