/* A reduction recorded in C: ops/reduction.py ``_reduce`` and ``_arg_reduce``'s common case
 * (their Python versions, ``_reduce_py`` / ``_arg_reduce_py``, are the reference; they run
 * every other case, each error included, and wherever this is not built).
 *
 * MLX's sum / prod / max / min / all / any (mlx/ops.cpp) record one Reduce primitive over the
 * sorted axes, kept as size 1 (compute_reduce_shape), then ``squeeze(out, sorted_axes)``
 * unless keepdims; argmax / argmin (mlx/ops.cpp argmax) an ArgReduce over one axis, uint32,
 * and the same squeeze; logsumexp over the last axis a LogSumExp (no parameters) and the
 * same squeeze. Here, for an mx.array (exactly) and ``keepdims`` True or False:
 *
 *   ``axis`` an int (exactly) naming an axis longer than 1 (LogSumExp: the last axis, of an
 *   array with no empty axis), or, for a Reduce, None over an array with no empty axis and
 *   some axis longer than 1 (all axes, a kept shape of ones);
 *   a Reduce's output dtype from its table (``out_dtypes[name]``, from the definitions'
 *   monoids: the input dtypes whose output needs no cast node; bool sums to int32 as the
 *   primitive does), a LogSumExp's its input's (``float_dtypes``: inexact but complex), an
 *   ArgReduce's uint32 over an array with no empty axis;
 *   the node recorded as array._make1 records it (_binary.c record1), its primitive as
 *   Primitive(name, stream, axes=axes) (ArgReduce: reduce_type=fname, axis=ax) makes it, the
 *   Squeeze's as squeeze_axes makes it (shape=the squeezed shape, axes=the sorted axes).
 *
 * And ops/reduction.py softmax's common case (``_softmax_py`` the reference): MLX's Softmax
 * primitive (mlx/ops.cpp softmax over the last axis) of an mx.array with no empty axis, over
 * ``axis`` an int naming the last axis, of a float dtype (``float_dtypes``: no cast node),
 * ``precise`` True or False (exactly): one node of the input's shape and dtype, its primitive
 * Primitive("Softmax", stream, precise=precise), no Squeeze.
 */
#include "_core.h"

static PyObject *r_array_type, *r_resolve, *r_out_dtypes, *r_float_dtypes, *r_uint32,
    *r_reduce_py, *r_last_py, *r_arg_py, *r_softmax_py;
static PyObject *r_axes, *r_axis, *r_reduce_type, *r_squeeze, *r_argreduce, *r_softmax,
    *r_precise;
static Py_ssize_t r_d_off;
static int reduce_configured = 0;

PyObject *configure_reduce(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"array_type", "resolve_stream", "out_dtypes",
                                        "float_dtypes", "uint32", "reduce_py",
                                        "last_reduce_py", "arg_reduce_py", "softmax_py"};
    PyObject **const slots[] = {&r_array_type, &r_resolve, &r_out_dtypes, &r_float_dtypes,
                                &r_uint32, &r_reduce_py, &r_last_py, &r_arg_py, &r_softmax_py};
    reduce_configured = 0;
    if (take_all(kw, "configure_reduce", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyType_Check(r_array_type) || !PyDict_Check(r_out_dtypes) ||
        !PyDict_Check(r_float_dtypes) || !binary_configured) {
        PyErr_SetString(PyExc_TypeError, "configure_reduce: the array type, the out dtypes (a "
                                         "dict of dicts), the float dtypes (a dict), after "
                                         "configure_binary");
        return NULL;
    }
    if ((r_d_off = slot_offset(r_array_type, "_d")) < 0) return NULL;
    if ((r_axes == NULL && (r_axes = PyUnicode_InternFromString("axes")) == NULL) ||
        (r_axis == NULL && (r_axis = PyUnicode_InternFromString("axis")) == NULL) ||
        (r_reduce_type == NULL &&
         (r_reduce_type = PyUnicode_InternFromString("reduce_type")) == NULL) ||
        (r_squeeze == NULL && (r_squeeze = PyUnicode_InternFromString("Squeeze")) == NULL) ||
        (r_argreduce == NULL && (r_argreduce = PyUnicode_InternFromString("ArgReduce")) == NULL) ||
        (r_softmax == NULL && (r_softmax = PyUnicode_InternFromString("Softmax")) == NULL) ||
        (r_precise == NULL && (r_precise = PyUnicode_InternFromString("precise")) == NULL))
        return NULL;
    reduce_configured = 1;
    Py_RETURN_NONE;
}

/* the kept and the squeezed shape of ``shape`` reduced over ``axis`` (an int; -1: all axes),
 * new references; 0 where the common case does not hold (an axis out of range or of length
 * 1; for all axes, an empty axis or none longer than 1), -1 on error */
static int shapes_of(PyObject *shape, Py_ssize_t axis, PyObject **kept, PyObject **squeezed) {
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    *kept = *squeezed = NULL;
    if (axis >= 0) {
        if (axis >= nd) return 0;
        PyObject *n = PyTuple_GET_ITEM(shape, axis);
        int ov = 0;
        long long v = PyLong_CheckExact(n) ? PyLong_AsLongLongAndOverflow(n, &ov) : 0;
        if (ov || v <= 1) { PyErr_Clear(); return 0; }
    } else {
        int longer = 0;
        for (Py_ssize_t i = 0; i < nd; i++) {
            PyObject *n = PyTuple_GET_ITEM(shape, i);
            int ov = 0;
            long long v = PyLong_CheckExact(n) ? PyLong_AsLongLongAndOverflow(n, &ov) : 0;
            if (ov || v < 1) { PyErr_Clear(); return 0; }
            longer |= v > 1;
        }
        if (!longer) return 0;
    }
    PyObject *one = PyLong_FromLong(1);
    *kept = PyTuple_New(nd);
    *squeezed = PyTuple_New(axis >= 0 ? nd - 1 : 0);
    if (one == NULL || *kept == NULL || *squeezed == NULL) {
        Py_XDECREF(one); Py_CLEAR(*kept); Py_CLEAR(*squeezed);
        return -1;
    }
    for (Py_ssize_t i = 0, j = 0; i < nd; i++) {
        int reduced = axis < 0 || i == axis;
        PyObject *n = PyTuple_GET_ITEM(shape, i);
        PyTuple_SET_ITEM(*kept, i, Py_NewRef(reduced ? one : n));
        if (!reduced) PyTuple_SET_ITEM(*squeezed, j++, Py_NewRef(n));
    }
    Py_DECREF(one);
    return 1;
}

/* ``axis`` normalised against ``nd`` dimensions: 0..nd-1, -1 for None (``all`` set), -2 for
 * anything else (the Python's case) */
static Py_ssize_t axis_of(PyObject *axis, Py_ssize_t nd, int all) {
    if (axis == Py_None) return all && nd > 0 ? -1 : -2;
    if (!PyLong_CheckExact(axis)) return -2;
    int ov = 0;
    long long v = PyLong_AsLongLongAndOverflow(axis, &ov);
    if (ov || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return -2; }
    if (v < 0) v += nd;
    return v >= 0 && v < nd ? (Py_ssize_t)v : -2;
}

/* the node of ``prim`` (stolen) over ``d`` into ``kept`` x ``dt``, then, unless ``keepdims``,
 * its Squeeze over ``axes`` into ``squeezed``: the last one's array (a new reference) */
static PyObject *record_reduction(PyObject *prim, PyObject *d, PyObject *kept, PyObject *dt,
                                  PyObject *axes, PyObject *squeezed, int keepdims,
                                  PyObject *s) {
    PyObject *descs = PyList_New(1);
    if (descs == NULL) { Py_XDECREF(prim); return NULL; }
    PyList_SET_ITEM(descs, 0, Py_NewRef(d));
    PyObject *out = record1(prim, descs, kept, dt, keepdims);
    if (keepdims || out == NULL) return out;
    PyObject *kw = PyDict_New(); /* squeeze_axes's parameters, in its order */
    if (kw == NULL || PyDict_SetItem(kw, s_shape, squeezed) < 0 ||
        PyDict_SetItem(kw, r_axes, axes) < 0) {
        Py_XDECREF(kw); Py_DECREF(out);
        return NULL;
    }
    if ((descs = PyList_New(1)) == NULL) { Py_DECREF(kw); Py_DECREF(out); return NULL; }
    PyList_SET_ITEM(descs, 0, out); /* (the list takes the reference) */
    return record1(new_primitive(r_squeeze, s, kw), descs, squeezed, dt, 1);
}

/* the sorted axes a common case reduces (a new tuple) */
static PyObject *axes_tuple(Py_ssize_t axis, Py_ssize_t nd) {
    PyObject *axes = PyTuple_New(axis >= 0 ? 1 : nd);
    for (Py_ssize_t i = 0; axes != NULL && i < PyTuple_GET_SIZE(axes); i++) {
        PyObject *v = PyLong_FromSsize_t(axis >= 0 ? axis : i);
        if (v == NULL) { Py_CLEAR(axes); break; }
        PyTuple_SET_ITEM(axes, i, v);
    }
    return axes;
}

static PyObject *fall_back(PyObject *fn, PyObject *const *args, Py_ssize_t nargs) {
    return PyObject_Vectorcall(fn, args, nargs, NULL);
}

/* whether no axis of ``shape`` is empty (its dimensions Python ints) */
static int none_empty(PyObject *shape) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        PyObject *n = PyTuple_GET_ITEM(shape, i);
        int ov = 0;
        if (!PyLong_CheckExact(n) || (PyLong_AsLongLongAndOverflow(n, &ov) == 0 && !ov)) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

enum { AXES, LAST, ARG }; /* a Reduce (its axes), LogSumExp (the last axis), an ArgReduce */

/* the common case of a reduction of kind ``kind`` of ``a`` over ``axis`` into ``name``'s
 * node (``fname``: an ArgReduce's reduce_type), else ``py(*args)`` */
static PyObject *reduction(int kind, PyObject *name, PyObject *fname, PyObject *a,
                           PyObject *axis_arg, PyObject *keep, PyObject *stream, PyObject *py,
                           PyObject *const *args, Py_ssize_t nargs) {
    if ((PyObject *)Py_TYPE(a) != r_array_type || (keep != Py_True && keep != Py_False))
        return fall_back(py, args, nargs);
    PyObject *d = SLOT(a, r_d_off);
    PyObject *shape = d ? SLOT(d, desc_off[D_SHAPE]) : NULL;
    if (shape == NULL || !PyTuple_CheckExact(shape)) return fall_back(py, args, nargs);
    Py_ssize_t nd = PyTuple_GET_SIZE(shape), axis = axis_of(axis_arg, nd, kind == AXES);
    if (axis == -2 || (kind == LAST && axis != nd - 1) ||
        (kind != AXES && !none_empty(shape))) /* (an empty array: the Python's error) */
        return fall_back(py, args, nargs);
    PyObject *odt = r_uint32;
    if (kind != ARG) {
        PyObject *table = kind == LAST ? r_float_dtypes : PyDict_GetItemWithError(r_out_dtypes, name);
        odt = table ? PyDict_GetItemWithError(table, SLOT(d, desc_off[D_DTYPE])) : NULL;
        if (odt == NULL) {
            if (PyErr_Occurred()) return NULL;
            return fall_back(py, args, nargs); /* (a cast first, or no table) */
        }
    }
    PyObject *kept, *squeezed;
    int r = shapes_of(shape, axis, &kept, &squeezed);
    if (r <= 0) return r < 0 ? NULL : fall_back(py, args, nargs);
    PyObject *out = NULL, *kw = NULL, *s = PyObject_CallOneArg(r_resolve, stream);
    PyObject *axes = s ? axes_tuple(axis, nd) : NULL;
    if (axes != NULL && (kw = PyDict_New()) != NULL &&
        (kind == LAST || (kind == AXES && PyDict_SetItem(kw, r_axes, axes) == 0) ||
         (kind == ARG && PyDict_SetItem(kw, r_reduce_type, fname) == 0 &&
          PyDict_SetItem(kw, r_axis, PyTuple_GET_ITEM(axes, 0)) == 0))) {
        out = record_reduction(new_primitive(name, s, kw), d, kept, odt, axes, squeezed,
                               keep == Py_True, s);
        kw = NULL; /* (new_primitive took it) */
    }
    Py_XDECREF(kw); Py_XDECREF(axes); Py_XDECREF(s); Py_DECREF(kept); Py_DECREF(squeezed);
    return out;
}

static int usable(const char *who, Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (!reduce_configured) {
        PyErr_Format(PyExc_RuntimeError, "%s: not configured", who);
        return 0;
    }
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    return 1;
}

/* reduce(name, fname, a, axis, keepdims, stream): ops/reduction.py _reduce */
PyObject *py_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!usable("reduce", nargs, 6, "reduce(name, fname, a, axis, keepdims, stream)")) return NULL;
    return reduction(AXES, args[0], args[1], args[2], args[3], args[4], args[5], r_reduce_py,
                     args, nargs);
}

/* last_reduce(name, a, axis, keepdims, stream): ops/reduction.py _last_reduce */
PyObject *py_last_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!usable("last_reduce", nargs, 5, "last_reduce(name, a, axis, keepdims, stream)"))
        return NULL;
    return reduction(LAST, args[0], NULL, args[1], args[2], args[3], args[4], r_last_py, args,
                     nargs);
}

/* arg_reduce(fname, a, axis, keepdims, stream): ops/reduction.py _arg_reduce */
PyObject *py_arg_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!usable("arg_reduce", nargs, 5, "arg_reduce(fname, a, axis, keepdims, stream)"))
        return NULL;
    return reduction(ARG, r_argreduce, args[0], args[1], args[2], args[3], args[4], r_arg_py,
                     args, nargs);
}

/* softmax(a, axis, precise, stream): ops/reduction.py _softmax (the common case above) */
PyObject *py_softmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!usable("softmax", nargs, 4, "softmax(a, axis, precise, stream)")) return NULL;
    PyObject *a = args[0], *precise = args[2];
    if ((PyObject *)Py_TYPE(a) != r_array_type || (precise != Py_True && precise != Py_False))
        return fall_back(r_softmax_py, args, nargs);
    PyObject *d = SLOT(a, r_d_off);
    PyObject *shape = d ? SLOT(d, desc_off[D_SHAPE]) : NULL;
    if (shape == NULL || !PyTuple_CheckExact(shape)) return fall_back(r_softmax_py, args, nargs);
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd == 0 || axis_of(args[1], nd, 0) != nd - 1 || !none_empty(shape))
        return fall_back(r_softmax_py, args, nargs);
    PyObject *dt = PyDict_GetItemWithError(r_float_dtypes, SLOT(d, desc_off[D_DTYPE]));
    if (dt == NULL) return PyErr_Occurred() ? NULL : fall_back(r_softmax_py, args, nargs);
    PyObject *s = PyObject_CallOneArg(r_resolve, args[3]), *kw = s ? PyDict_New() : NULL;
    PyObject *descs = kw ? PyList_New(1) : NULL, *out = NULL;
    if (descs != NULL && PyDict_SetItem(kw, r_precise, precise) == 0) {
        PyList_SET_ITEM(descs, 0, Py_NewRef(d));
        out = record1(new_primitive(r_softmax, s, kw), descs, shape, dt, 1);
        kw = descs = NULL; /* (new_primitive took kw, record1 descs) */
    }
    Py_XDECREF(kw); Py_XDECREF(descs); Py_XDECREF(s);
    return out;
}
