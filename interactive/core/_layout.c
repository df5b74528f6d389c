/* The layout (view) ops recorded in C: ops/shape.py's reshape, transpose, expand_dims,
 * squeeze, swapaxes, moveaxis and their method forms (array_methods.py: ``a.reshape(...)``,
 * ``a.transpose(...)``, ``a.T``, ``a.mT``, ``a.squeeze``, ``a.swapaxes``, ``a.moveaxis``),
 * and ``a.astype`` (convert.py astype). The Python functions are the reference: they run
 * every case not taken here (each error, with MLX's message, included), and wherever this
 * is not built.
 *
 * MLX's ops (mlx/ops.cpp reshape / transpose / expand_dims / squeeze / swapaxes / moveaxis /
 * astype) record one primitive of the input's dtype: Reshape (its shape; the requested one
 * too when a -1 was inferred: shapeless compile's spec), Transpose (the permutation),
 * ExpandDims / Squeeze (the result's shape and the sorted axes), AsType. Here, for an
 * mx.array (exactly) and shape / axes arguments that are Python ints or tuples / lists of
 * them (exactly) in the 32-bit range, valid for the array (nothing to report):
 *
 *   the node recorded as array._make1 records it (_binary.c record1), its primitive as
 *   Primitive(name, stream, **params) makes it, with the Python's parameters in its order;
 *   where the Python returns ``a._handle()`` (a reshape to the same shape, a squeeze of
 *   nothing, astype to the same dtype) a new handle on the same desc.
 */
#include "_core.h"

#define MAXD 64 /* more dimensions: the Python's case */

PyObject *bare_of(PyObject *type); /* (_call.c) */

static PyObject *l_array_type, *l_dtype_type;
static PyObject *l_reshape, *l_transpose, *l_expand_dims, *l_squeeze, *l_swapaxes,
    *l_moveaxis, *l_m_reshape, *l_m_transpose, *l_m_squeeze, *l_m_swapaxes, *l_m_moveaxis,
    *l_m_astype, *l_t_py, *l_mt_py, *l_getitem_py, *l_setitem_py;
static PyObject *k_spec, *k_axes, *k_dtype, *k_stream, *k_shape_arg, *k_axis, *k_axis1,
    *k_axis2, *k_source, *k_destination, *n_reshape, *n_transpose, *n_expand, *n_squeeze,
    *n_astype, *k_np, *n_slice, *n_slice_update, *k_start, *k_end, *k_strides;
static Py_ssize_t l_d_off;
static int layout_configured = 0, methods_configured = 0;

static int intern(PyObject **slot, const char *s) {
    return *slot != NULL || (*slot = PyUnicode_InternFromString(s)) != NULL ? 0 : -1;
}

/* ---- reading the arguments ---------------------------------------------------------- */

/* ``v`` as a C int when it is a Python int (exactly) in the 32-bit range: 1, else 0 */
static int int32_of(PyObject *v, long long *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int ov = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &ov);
    if (ov || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    if (x < -2147483648LL || x > 2147483647LL) return 0;
    *out = x;
    return 1;
}

/* ``v``'s ints: an int (``one`` set: one entry) or a tuple / list of them (exactly); 1 and
 * ``*n``, else 0 */
static int ints_of(PyObject *v, int one, long long *buf, Py_ssize_t *n) {
    if (one && PyLong_CheckExact(v)) {
        *n = 1;
        return int32_of(v, buf);
    }
    if (!PyTuple_CheckExact(v) && !PyList_CheckExact(v)) return 0;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(v);
    if (k > MAXD) return 0;
    PyObject **items = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t i = 0; i < k; i++)
        if (!int32_of(items[i], &buf[i])) return 0;
    *n = k;
    return 1;
}

/* an mx.array's (exactly) desc and its shape's dimensions: the desc (borrowed), else NULL */
static PyObject *desc_dims(PyObject *a, long long *dims, Py_ssize_t *nd) {
    if ((PyObject *)Py_TYPE(a) != l_array_type) return NULL;
    PyObject *d = SLOT(a, l_d_off);
    PyObject *shape = d ? SLOT(d, desc_off[D_SHAPE]) : NULL;
    if (shape == NULL || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) > MAXD)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(shape, i);
        int ov = 0;
        long long x = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &ov) : -1;
        if (ov || x < 0) { PyErr_Clear(); return NULL; }
        dims[i] = x;
    }
    *nd = n;
    return d;
}

static PyObject *tuple_of(const long long *v, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (x == NULL) { Py_CLEAR(t); break; }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* a new handle on ``d`` (array._handle / _wrap) */
static PyObject *handle_on(PyObject *d) {
    PyObject *h = bare_of(l_array_type);
    if (h != NULL) put(h, l_d_off, d);
    return h;
}

/* the node ``name(stream, k1=v1[, k2=v2])`` over ``d`` into ``shape`` x ``dtype``: its array.
 * v1 / v2 stolen (NULL: an error before, or no parameter) */
static PyObject *record_view(PyObject *name, PyObject *stream, PyObject *d, PyObject *shape,
                             PyObject *dtype, PyObject *k1, PyObject *v1, PyObject *k2,
                             PyObject *v2) {
    PyObject *out = NULL, *s = resolve_stream(NULL, &stream, 1);
    PyObject *kw = s && shape && (k1 == NULL || v1) && (k2 == NULL || v2) ? PyDict_New() : NULL;
    if (kw != NULL && ((k1 && PyDict_SetItem(kw, k1, v1) < 0) ||
                       (k2 && PyDict_SetItem(kw, k2, v2) < 0)))
        Py_CLEAR(kw);
    PyObject *descs = kw ? PyList_New(1) : NULL;
    if (descs != NULL) {
        PyList_SET_ITEM(descs, 0, Py_NewRef(d));
        out = record1(new_primitive(name, s, kw), descs, shape,
                      dtype ? dtype : SLOT(d, desc_off[D_DTYPE]), 1);
    } else {
        Py_XDECREF(kw);
    }
    Py_XDECREF(s); Py_XDECREF(v1); Py_XDECREF(v2); Py_XDECREF(shape);
    return out;
}

/* the arguments after the array: ``npos`` positional-or-keyword names (``pos`` filled,
 * ``nreq`` of them required), then ``stream`` (keyword only unless ``stream_pos``); 1, or 0
 * for the Python's case (its TypeError) */
static int parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                 PyObject *const *names, int npos, int nreq, int stream_pos, PyObject **pos,
                 PyObject **stream) {
    *stream = Py_None;
    if (nargs > npos + (stream_pos ? 1 : 0)) return 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (i < npos) pos[i] = args[i];
        else *stream = args[i];
    }
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        int at = -2;
        if (k == k_stream || PyUnicode_Compare(k, k_stream) == 0) {
            if (nargs > npos) return 0;
            *stream = args[nargs + i];
            continue;
        }
        for (int j = 0; j < npos; j++)
            if (k == names[j] || PyUnicode_Compare(k, names[j]) == 0) at = j;
        if (PyErr_Occurred()) { PyErr_Clear(); return 0; }
        if (at < 0 || at < nargs) return 0;
        pos[at] = args[nargs + i];
    }
    for (int j = 0; j < nreq; j++)
        if (pos[j] == NULL) return 0;
    return 1;
}

/* ``py(self?, *args, **kw)``: the Python's case */
static PyObject *fall_back(PyObject *py, PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames) {
    if (self == NULL) return PyObject_Vectorcall(py, args, nargs, kwnames);
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0, n = nargs + nk + 1;
    PyObject *small[8], **all = n <= 8 ? small : PyMem_Malloc(n * sizeof(PyObject *));
    if (all == NULL) return PyErr_NoMemory();
    all[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nk; i++) all[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(py, all, nargs + 1, kwnames);
    if (all != small) PyMem_Free(all);
    return r;
}

static int ready_methods(void) {
    if (!methods_configured) PyErr_SetString(PyExc_RuntimeError, "layout methods: not configured");
    return methods_configured;
}

static int ready(void) {
    if (!layout_configured) PyErr_SetString(PyExc_RuntimeError, "layout ops: not configured");
    return layout_configured;
}

/* ---- the ops' common cases: NULL and no error set means the Python's case ------------ */

/* reshape(a, shape): ops/shape.py reshape */
static PyObject *do_reshape(PyObject *a, PyObject *shape_arg, PyObject *stream) {
    long long dims[MAXD], want[MAXD], out[MAXD];
    Py_ssize_t nd, n;
    PyObject *d = desc_dims(a, dims, &nd);
    if (d == NULL || !ints_of(shape_arg, 0, want, &n)) return NULL;
    long long size = 1, rest = 1;
    Py_ssize_t infer = -1;
    for (Py_ssize_t i = 0; i < nd; i++)
        if (__builtin_mul_overflow(size, dims[i], &size)) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (want[i] == -1) {
            if (infer >= 0) return NULL; /* (two to infer: the Python's error) */
            infer = i;
        } else if (want[i] < 0 || __builtin_mul_overflow(rest, want[i], &rest)) {
            return NULL;
        }
        out[i] = want[i];
    }
    if (infer >= 0) {
        if (rest == 0) return NULL;
        out[infer] = size / rest;
        if (out[infer] * rest != size) return NULL;
    } else if (rest != size) {
        return NULL;
    }
    int same = n == nd;
    for (Py_ssize_t i = 0; same && i < n; i++) same = out[i] == dims[i];
    if (same) return handle_on(d);
    PyObject *t = tuple_of(out, n), *spec = NULL;
    if (t == NULL) return NULL;
    if (infer >= 0 && (spec = tuple_of(want, n)) == NULL) { Py_DECREF(t); return NULL; }
    return record_view(n_reshape, stream, d, Py_NewRef(t), NULL, k_shape_arg, t,
                       infer >= 0 ? k_spec : NULL, spec);
}

/* transpose by ``perm`` (``n`` axes given, or NULL: reversed) */
static PyObject *transposed(PyObject *a, const long long *axes, Py_ssize_t n, PyObject *stream) {
    long long dims[MAXD], norm[MAXD], out[MAXD];
    Py_ssize_t nd;
    PyObject *d = desc_dims(a, dims, &nd);
    if (d == NULL || (axes != NULL && n != nd)) return NULL;
    unsigned char seen[MAXD] = {0};
    for (Py_ssize_t i = 0; i < nd; i++) {
        long long ax = axes ? axes[i] : nd - 1 - i;
        if (ax < 0) ax += nd;
        if (ax < 0 || ax >= nd || seen[ax]) return NULL;
        seen[ax] = 1;
        norm[i] = ax;
        out[i] = dims[ax];
    }
    PyObject *t = tuple_of(out, nd);
    if (t == NULL) return NULL;
    return record_view(n_transpose, stream, d, t, NULL, k_axes, tuple_of(norm, nd), NULL, NULL);
}

static PyObject *do_transpose(PyObject *a, PyObject *axes_arg, PyObject *stream) {
    long long axes[MAXD];
    Py_ssize_t n;
    if (axes_arg == NULL || axes_arg == Py_None) return transposed(a, NULL, 0, stream);
    if (!ints_of(axes_arg, 0, axes, &n)) return NULL;
    return transposed(a, axes, n, stream);
}

/* swapaxes (``move`` 0) or moveaxis (1) of two int axes */
static PyObject *do_two_axes(PyObject *a, PyObject *x, PyObject *y, int move, PyObject *stream) {
    long long dims[MAXD], perm[MAXD], i1, i2;
    Py_ssize_t nd;
    if (desc_dims(a, dims, &nd) == NULL || !int32_of(x, &i1) || !int32_of(y, &i2)) return NULL;
    if (i1 < 0) i1 += nd;
    if (i2 < 0) i2 += nd;
    if (i1 < 0 || i1 >= nd || i2 < 0 || i2 >= nd) return NULL;
    for (Py_ssize_t i = 0; i < nd; i++) perm[i] = i;
    if (!move) {
        perm[i1] = i2;
        perm[i2] = i1;
    } else { /* perm.pop(source); perm.insert(destination, source) */
        Py_ssize_t j = 0;
        for (Py_ssize_t i = 0; i < nd; i++)
            if (i != i1) perm[j++] = i;
        for (Py_ssize_t i = nd - 1; i > i2; i--) perm[i] = perm[i - 1];
        perm[i2] = i1;
    }
    return transposed(a, perm, nd, stream);
}

static int cmp_ll(const void *x, const void *y) {
    long long a = *(const long long *)x, b = *(const long long *)y;
    return (a > b) - (a < b);
}

/* expand_dims(a, axis) */
static PyObject *do_expand_dims(PyObject *a, PyObject *axis_arg, PyObject *stream) {
    long long dims[MAXD], axes[MAXD], out[MAXD];
    Py_ssize_t nd, n;
    PyObject *d = desc_dims(a, dims, &nd);
    if (d == NULL || !ints_of(axis_arg, 1, axes, &n) || n == 0 || nd + n > MAXD) return NULL;
    Py_ssize_t total = nd + n;
    unsigned char ones[MAXD] = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        if (axes[i] < 0) axes[i] += total;
        if (axes[i] < 0 || axes[i] >= total || ones[axes[i]]) return NULL;
        ones[axes[i]] = 1;
    }
    qsort(axes, n, sizeof(long long), cmp_ll);
    for (Py_ssize_t i = 0, j = 0; i < total; i++) out[i] = ones[i] ? 1 : dims[j++];
    return record_view(n_expand, stream, d, tuple_of(out, total), NULL, k_shape_arg,
                       tuple_of(out, total), k_axes, tuple_of(axes, n));
}

/* squeeze(a, axis=None) */
static PyObject *do_squeeze(PyObject *a, PyObject *axis_arg, PyObject *stream) {
    long long dims[MAXD], axes[MAXD], out[MAXD];
    Py_ssize_t nd, n = 0, m = 0;
    PyObject *d = desc_dims(a, dims, &nd);
    if (d == NULL) return NULL;
    unsigned char gone[MAXD] = {0};
    if (axis_arg == NULL || axis_arg == Py_None) {
        for (Py_ssize_t i = 0; i < nd; i++)
            if (dims[i] == 1) gone[i] = 1, axes[n++] = i;
    } else {
        if (!ints_of(axis_arg, 1, axes, &n)) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (axes[i] < 0) axes[i] += nd;
            if (axes[i] < 0 || axes[i] >= nd || gone[axes[i]] || dims[axes[i]] != 1) return NULL;
            gone[axes[i]] = 1;
        }
        qsort(axes, n, sizeof(long long), cmp_ll);
    }
    if (n == 0) return handle_on(d);
    for (Py_ssize_t i = 0; i < nd; i++)
        if (!gone[i]) out[m++] = dims[i];
    return record_view(n_squeeze, stream, d, tuple_of(out, m), NULL, k_shape_arg,
                       tuple_of(out, m), k_axes, tuple_of(axes, n));
}

/* astype(a, dtype): the same dtype a new handle, another an AsType node */
static PyObject *do_astype(PyObject *a, PyObject *dtype, PyObject *stream) {
    if ((PyObject *)Py_TYPE(a) != l_array_type || (PyObject *)Py_TYPE(dtype) != l_dtype_type)
        return NULL;
    PyObject *d = SLOT(a, l_d_off);
    PyObject *shape = d ? SLOT(d, desc_off[D_SHAPE]) : NULL;
    if (shape == NULL) return NULL;
    if (SLOT(d, desc_off[D_DTYPE]) == dtype) return handle_on(d);
    PyObject *np = PyObject_GetAttr(dtype, k_np);
    if (np == NULL) return NULL;
    return record_view(n_astype, stream, d, Py_NewRef(shape), dtype, k_dtype, np, NULL, NULL);
}

/* the result, else (no error set) the Python's */
#define TAKE(expr, py, self)                                                                 \
    do {                                                                                     \
        PyObject *r_ = (expr);                                                               \
        if (r_ != NULL || PyErr_Occurred()) return r_;                                       \
        return fall_back(py, self, args, nargs, kwnames);                                    \
    } while (0)

/* ---- mx.reshape / transpose / expand_dims / squeeze / swapaxes / moveaxis ------------ */

#define FN_ARGS PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames

static PyObject *py_reshape(FN_ARGS) {
    PyObject *pos[1] = {NULL}, *st, *names[1] = {k_shape_arg};
    if (!ready()) return NULL;
    if (nargs < 1 || !parse(args + 1, nargs - 1, kwnames, names, 1, 1, 0, pos, &st))
        return fall_back(l_reshape, NULL, args, nargs, kwnames);
    TAKE(do_reshape(args[0], pos[0], st), l_reshape, NULL);
}

static PyObject *py_transpose(FN_ARGS) {
    PyObject *pos[1] = {NULL}, *st, *names[1] = {k_axes};
    if (!ready()) return NULL;
    if (nargs < 1 || !parse(args + 1, nargs - 1, kwnames, names, 1, 0, 0, pos, &st))
        return fall_back(l_transpose, NULL, args, nargs, kwnames);
    TAKE(do_transpose(args[0], pos[0], st), l_transpose, NULL);
}

static PyObject *py_expand_dims(FN_ARGS) {
    PyObject *pos[1] = {NULL}, *st, *names[1] = {k_axis};
    if (!ready()) return NULL;
    if (nargs < 1 || !parse(args + 1, nargs - 1, kwnames, names, 1, 1, 0, pos, &st))
        return fall_back(l_expand_dims, NULL, args, nargs, kwnames);
    TAKE(do_expand_dims(args[0], pos[0], st), l_expand_dims, NULL);
}

static PyObject *py_squeeze(FN_ARGS) {
    PyObject *pos[1] = {NULL}, *st, *names[1] = {k_axis};
    if (!ready()) return NULL;
    if (nargs < 1 || !parse(args + 1, nargs - 1, kwnames, names, 1, 0, 0, pos, &st))
        return fall_back(l_squeeze, NULL, args, nargs, kwnames);
    TAKE(do_squeeze(args[0], pos[0], st), l_squeeze, NULL);
}

static PyObject *py_swapaxes(FN_ARGS) {
    PyObject *pos[2] = {NULL, NULL}, *st, *names[2] = {k_axis1, k_axis2};
    if (!ready()) return NULL;
    if (nargs < 1 || !parse(args + 1, nargs - 1, kwnames, names, 2, 2, 0, pos, &st))
        return fall_back(l_swapaxes, NULL, args, nargs, kwnames);
    TAKE(do_two_axes(args[0], pos[0], pos[1], 0, st), l_swapaxes, NULL);
}

static PyObject *py_moveaxis(FN_ARGS) {
    PyObject *pos[2] = {NULL, NULL}, *st, *names[2] = {k_source, k_destination};
    if (!ready()) return NULL;
    if (nargs < 1 || !parse(args + 1, nargs - 1, kwnames, names, 2, 2, 0, pos, &st))
        return fall_back(l_moveaxis, NULL, args, nargs, kwnames);
    TAKE(do_two_axes(args[0], pos[0], pos[1], 1, st), l_moveaxis, NULL);
}

/* ---- the method forms (``self`` the array; array_methods.py's signatures) ------------ */

/* ``a.reshape(*shape)`` / ``a.transpose(*axes)``: one sequence, or ints */
static PyObject *star_arg(PyObject *const *args, Py_ssize_t nargs, PyObject **tmp) {
    *tmp = NULL;
    if (nargs == 1 && !PyLong_Check(args[0])) return args[0];
    PyObject *t = PyTuple_New(nargs);
    for (Py_ssize_t i = 0; t != NULL && i < nargs; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
    return *tmp = t;
}

static PyObject *star_stream(PyObject *kwnames, PyObject *const *args, Py_ssize_t nargs,
                             int *ok) {
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    *ok = nk == 0 || (nk == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), k_stream) == 0);
    if (PyErr_Occurred()) { PyErr_Clear(); *ok = 0; }
    return nk == 1 ? args[nargs] : Py_None;
}

static PyObject *py_m_reshape(FN_ARGS) {
    int ok;
    PyObject *st = star_stream(kwnames, args, nargs, &ok), *tmp;
    if (!ready_methods()) return NULL;
    if (!ok || nargs == 0) return fall_back(l_m_reshape, self, args, nargs, kwnames);
    PyObject *shape = star_arg(args, nargs, &tmp);
    if (shape == NULL) return NULL;
    PyObject *r = do_reshape(self, shape, st);
    Py_XDECREF(tmp);
    if (r != NULL || PyErr_Occurred()) return r;
    return fall_back(l_m_reshape, self, args, nargs, kwnames);
}

static PyObject *py_m_transpose(FN_ARGS) {
    int ok;
    PyObject *st = star_stream(kwnames, args, nargs, &ok), *tmp = NULL, *axes = NULL;
    if (!ready_methods()) return NULL;
    if (!ok) return fall_back(l_m_transpose, self, args, nargs, kwnames);
    if (nargs > 0 && (axes = star_arg(args, nargs, &tmp)) == NULL) return NULL;
    PyObject *r = do_transpose(self, axes, st);
    Py_XDECREF(tmp);
    if (r != NULL || PyErr_Occurred()) return r;
    return fall_back(l_m_transpose, self, args, nargs, kwnames);
}

static PyObject *py_m_squeeze(FN_ARGS) {
    PyObject *pos[1] = {NULL}, *st, *names[1] = {k_axis};
    if (!ready_methods()) return NULL;
    if (!parse(args, nargs, kwnames, names, 1, 0, 0, pos, &st))
        return fall_back(l_m_squeeze, self, args, nargs, kwnames);
    TAKE(do_squeeze(self, pos[0], st), l_m_squeeze, self);
}

static PyObject *py_m_swapaxes(FN_ARGS) {
    PyObject *pos[2] = {NULL, NULL}, *st, *names[2] = {k_axis1, k_axis2};
    if (!ready_methods()) return NULL;
    if (!parse(args, nargs, kwnames, names, 2, 2, 0, pos, &st))
        return fall_back(l_m_swapaxes, self, args, nargs, kwnames);
    TAKE(do_two_axes(self, pos[0], pos[1], 0, st), l_m_swapaxes, self);
}

static PyObject *py_m_moveaxis(FN_ARGS) {
    PyObject *pos[2] = {NULL, NULL}, *st, *names[2] = {k_source, k_destination};
    if (!ready_methods()) return NULL;
    if (!parse(args, nargs, kwnames, names, 2, 2, 0, pos, &st))
        return fall_back(l_m_moveaxis, self, args, nargs, kwnames);
    TAKE(do_two_axes(self, pos[0], pos[1], 1, st), l_m_moveaxis, self);
}

static PyObject *py_m_astype(FN_ARGS) {
    PyObject *pos[1] = {NULL}, *st, *names[1] = {k_dtype};
    if (!ready_methods()) return NULL;
    if (!parse(args, nargs, kwnames, names, 1, 1, 1, pos, &st))
        return fall_back(l_m_astype, self, args, nargs, kwnames);
    TAKE(do_astype(self, pos[0], st), l_m_astype, self);
}

/* ---- a[idx] of ints, slices, None and one Ellipsis (array_indexing.py getitem _basic) -- */

/* the Slice of ``d`` (``shape`` its result's), then the Squeeze of the int axes, then the
 * ExpandDims of the None positions, as _basic records them; NULL and no error: the
 * Python's case */
/* a basic index read against an array: its desc, dimensions, the Slice's bounds and
 * shape (``out``: the window), the int entries' axes, the None entries' positions among
 * the entries that are not ints */
typedef struct {
    PyObject *d;
    Py_ssize_t nd, ni, nn;
    long long dims[MAXD], start[MAXD], stop[MAXD], step[MAXD], out[MAXD], ints[MAXD],
        nones[MAXD];
} Basic;

/* ``idx`` as _expand / _check_entries / _basic read it: 1 and ``B``, or 0 for the
 * Python's case (an error of its, a lone int, arrays, anything else) */
static int parse_basic(PyObject *a, PyObject *idx, Basic *B) {
    long long *dims = B->dims, *start = B->start, *stop = B->stop, *step = B->step,
              *out = B->out, *ints = B->ints, *nones = B->nones;
    Py_ssize_t nd, n, used = 0, ell = -1, ni = 0, nn = 0;
    PyObject *d = desc_dims(a, dims, &nd);
    if (d == NULL) return 0;
    PyObject *one[1] = {idx}, *const *items = one;
    if (PyTuple_CheckExact(idx)) {
        n = PyTuple_GET_SIZE(idx);
        items = &PyTuple_GET_ITEM(idx, 0);
    } else if (PySlice_Check(idx) || idx == Py_None) {
        n = 1;
    } else {
        return 0; /* (a lone int: a Gather; Ellipsis, arrays, lists: the Python's) */
    }
    if (n == 0 || n > MAXD) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = items[i];
        long long v = 0;
        if (e == Py_Ellipsis) {
            if (ell >= 0) return 0;
            ell = i;
        } else if (e == Py_None) {
        } else if (PySlice_Check(e)) {
            PySliceObject *sl = (PySliceObject *)e;
            PyObject *b[3] = {sl->start, sl->stop, sl->step};
            for (int k = 0; k < 3; k++)
                if (b[k] != Py_None && !int32_of(b[k], &v)) return 0;
            if (sl->step != Py_None && v == 0) return 0; /* (v: the step, read last) */
            used++;
        } else if (int32_of(e, &v)) {
            used++;
        } else {
            return 0;
        }
    }
    if (used > nd) return 0;
    Py_ssize_t ax = 0, kept = 0, m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = items[i];
        if (e == Py_Ellipsis) { /* full slices over the axes no entry names */
            for (Py_ssize_t k = 0; k < nd - used; k++, ax++, kept++) {
                start[ax] = 0, stop[ax] = dims[ax], step[ax] = 1, out[m++] = dims[ax];
            }
        } else if (e == Py_None) {
            nones[nn++] = kept++;
        } else if (PySlice_Check(e)) {
            Py_ssize_t b, f, st;
            if (PySlice_Unpack(e, &b, &f, &st) < 0) { PyErr_Clear(); return 0; }
            Py_ssize_t len = PySlice_AdjustIndices((Py_ssize_t)dims[ax], &b, &f, st);
            start[ax] = b, stop[ax] = f, step[ax] = st, out[m++] = len;
            ax++, kept++;
        } else {
            long long v = 0;
            int32_of(e, &v);
            if (v < -dims[ax] || v >= dims[ax]) return 0; /* (numpy's IndexError) */
            if (v < 0) v += dims[ax];
            start[ax] = v, stop[ax] = v + 1, step[ax] = 1, out[m++] = 1;
            ints[ni++] = ax++;
        }
    }
    for (; ax < nd; ax++) /* (no Ellipsis: the rest are full slices) */
        start[ax] = 0, stop[ax] = dims[ax], step[ax] = 1, out[m++] = dims[ax];
    B->d = d, B->nd = nd, B->ni = ni, B->nn = nn;
    return 1;
}

static PyObject *basic_index(PyObject *a, PyObject *idx) {
    Basic B;
    long long sq[MAXD], ex[MAXD];
    if (!parse_basic(a, idx, &B)) return NULL;
    PyObject *d = B.d;
    Py_ssize_t nd = B.nd, ni = B.ni, nn = B.nn, m = nd;
    long long *dims = B.dims, *start = B.start, *stop = B.stop, *step = B.step, *out = B.out,
              *ints = B.ints, *nones = B.nones;
    int whole = 1;
    for (Py_ssize_t i = 0; whole && i < nd; i++) whole = out[i] == dims[i] && step[i] == 1;
    PyObject *none = Py_None, *s = resolve_stream(NULL, &none, 1), *r;
    if (s == NULL) return NULL;
    if (whole) {
        r = handle_on(d);
    } else {
        PyObject *kw = PyDict_New();
        PyObject *t0 = tuple_of(start, nd), *t1 = tuple_of(stop, nd), *t2 = tuple_of(step, nd);
        r = NULL;
        if (kw && t0 && t1 && t2 && PyDict_SetItem(kw, k_start, t0) == 0 &&
            PyDict_SetItem(kw, k_end, t1) == 0 && PyDict_SetItem(kw, k_strides, t2) == 0) {
            PyObject *descs = PyList_New(1), *shape = tuple_of(out, nd);
            if (descs && shape) {
                PyList_SET_ITEM(descs, 0, Py_NewRef(d));
                r = record1(new_primitive(n_slice, s, kw), descs, shape,
                            SLOT(d, desc_off[D_DTYPE]), 1);
                kw = NULL;
            } else {
                Py_XDECREF(descs);
            }
            Py_XDECREF(shape);
        }
        Py_XDECREF(kw); Py_XDECREF(t0); Py_XDECREF(t1); Py_XDECREF(t2);
    }
    if (r != NULL && ni > 0) { /* squeeze(out, ints) */
        Py_ssize_t k = 0;
        for (Py_ssize_t i = 0, j = 0; i < nd; i++) {
            if (j < ni && ints[j] == i) { j++; continue; }
            sq[k++] = out[i];
        }
        PyObject *x = SLOT(r, l_d_off);
        Py_INCREF(x);
        Py_DECREF(r);
        r = record_view(n_squeeze, s, x, tuple_of(sq, k), NULL, k_shape_arg, tuple_of(sq, k),
                        k_axes, tuple_of(ints, ni));
        Py_DECREF(x);
        m = k;
        memcpy(out, sq, k * sizeof(long long));
    }
    if (r != NULL && nn > 0) { /* expand_dims(out, nones) */
        Py_ssize_t total = m + nn;
        for (Py_ssize_t i = 0, j = 0, k = 0; i < total; i++)
            ex[i] = j < nn && nones[j] == i ? (j++, 1) : out[k++];
        PyObject *x = SLOT(r, l_d_off);
        Py_INCREF(x);
        Py_DECREF(r);
        r = record_view(n_expand, s, x, tuple_of(ex, total), NULL, k_shape_arg,
                        tuple_of(ex, total), k_axes, tuple_of(nones, nn));
        Py_DECREF(x);
    }
    Py_DECREF(s);
    return r;
}

static PyObject *py_getitem(PyObject *self, PyObject *idx) {
    if (!ready_methods()) return NULL;
    PyObject *r = basic_index(self, idx);
    return r != NULL || PyErr_Occurred() ? r : PyObject_CallFunctionObjArgs(l_getitem_py, self,
                                                                            idx, NULL);
}

/* ``a[idx] = v`` of ints, slices and one Ellipsis with ``v`` an mx.array of ``a``'s dtype and
 * of the indexed shape (array_indexing.py setitem _basic_update: v's Reshape to the window
 * where ints dropped axes, then the SliceUpdate, or v itself for the whole array): 1 done, 0
 * the Python's case, -1 an error */
static int basic_update(PyObject *a, PyObject *idx, PyObject *v) {
    Basic B;
    long long target[MAXD];
    if ((PyObject *)Py_TYPE(v) != l_array_type || !parse_basic(a, idx, &B) || B.nn > 0) return 0;
    PyObject *vd = SLOT(v, l_d_off), *d = B.d;
    PyObject *vshape = vd ? SLOT(vd, desc_off[D_SHAPE]) : NULL;
    if (vshape == NULL || !PyTuple_CheckExact(vshape) ||
        SLOT(vd, desc_off[D_DTYPE]) != SLOT(d, desc_off[D_DTYPE]))
        return 0;
    Py_ssize_t nt = 0, nd = B.nd;
    for (Py_ssize_t i = 0, j = 0; i < nd; i++) {
        if (j < B.ni && B.ints[j] == i) { j++; continue; }
        target[nt++] = B.out[i];
    }
    if (PyTuple_GET_SIZE(vshape) != nt) return 0;
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *x = PyTuple_GET_ITEM(vshape, i);
        int ov = 0;
        if (!PyLong_CheckExact(x) || PyLong_AsLongLongAndOverflow(x, &ov) != target[i] || ov) {
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *none = Py_None, *s = resolve_stream(NULL, &none, 1);
    if (s == NULL) return -1;
    PyObject *upd = Py_NewRef(vd);
    if (B.ni > 0) { /* reshape_known(v, window) */
        PyObject *r = record_view(n_reshape, s, vd, tuple_of(B.out, nd), NULL, k_shape_arg,
                                  tuple_of(B.out, nd), NULL, NULL);
        Py_SETREF(upd, r ? Py_NewRef(SLOT(r, l_d_off)) : NULL);
        Py_XDECREF(r);
    }
    int whole = 1;
    for (Py_ssize_t i = 0; whole && i < nd; i++) whole = B.out[i] == B.dims[i] && B.step[i] == 1;
    PyObject *out = NULL;
    if (upd != NULL && whole) {
        out = Py_NewRef(upd);
    } else if (upd != NULL) {
        PyObject *kw = PyDict_New(), *t0 = tuple_of(B.start, nd), *t1 = tuple_of(B.stop, nd),
                 *t2 = tuple_of(B.step, nd), *descs = PyList_New(2);
        if (kw && t0 && t1 && t2 && descs && PyDict_SetItem(kw, k_start, t0) == 0 &&
            PyDict_SetItem(kw, k_end, t1) == 0 && PyDict_SetItem(kw, k_strides, t2) == 0) {
            PyList_SET_ITEM(descs, 0, Py_NewRef(d));
            PyList_SET_ITEM(descs, 1, Py_NewRef(upd));
            out = record1(new_primitive(n_slice_update, s, kw), descs, SLOT(d, desc_off[D_SHAPE]),
                          SLOT(d, desc_off[D_DTYPE]), 0);
            kw = descs = NULL; /* (taken) */
        }
        Py_XDECREF(kw); Py_XDECREF(t0); Py_XDECREF(t1); Py_XDECREF(t2); Py_XDECREF(descs);
    }
    Py_XDECREF(upd); Py_DECREF(s);
    if (out == NULL) return -1;
    put(a, l_d_off, out);
    Py_DECREF(out);
    return 1;
}

static PyObject *py_setitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready_methods()) return NULL;
    if (nargs != 2) return fall_back(l_setitem_py, self, args, nargs, NULL);
    int r = basic_update(self, args[0], args[1]);
    if (r < 0) return NULL;
    if (r > 0) Py_RETURN_NONE;
    return fall_back(l_setitem_py, self, args, nargs, NULL);
}

/* ``a.T`` / ``a.mT`` (the properties' getters) */
static PyObject *py_T(PyObject *self, PyObject *a) {
    if (!ready_methods()) return NULL;
    PyObject *r = transposed(a, NULL, 0, Py_None);
    return r != NULL || PyErr_Occurred() ? r : PyObject_CallOneArg(l_t_py, a);
}

static PyObject *py_mT(PyObject *self, PyObject *a) {
    static PyObject *m1, *m2;
    if (!ready_methods()) return NULL;
    if (m1 == NULL && ((m1 = PyLong_FromLong(-1)) == NULL || (m2 = PyLong_FromLong(-2)) == NULL))
        return NULL;
    PyObject *r = do_two_axes(a, m1, m2, 0, Py_None);
    return r != NULL || PyErr_Occurred() ? r : PyObject_CallOneArg(l_mt_py, a);
}

#define FN(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, doc}
static PyMethodDef fns[] = {
    FN("reshape", py_reshape, "reshape(a, /, shape, *, stream=None)\n--\n\n"
       "Reshape ``a`` to ``shape`` (one dimension may be -1); a view when MLX makes one."),
    FN("transpose", py_transpose, "transpose(a, /, axes=None, *, stream=None)\n--\n\n"
       "Permute the axes (reverse them by default); a view."),
    FN("expand_dims", py_expand_dims, "expand_dims(a, /, axis, *, stream=None)\n--\n\n"
       "Insert size-1 axes at the positions ``axis`` of the result."),
    FN("squeeze", py_squeeze, "squeeze(a, /, axis=None, *, stream=None)\n--\n\n"
       "Remove size-1 axes (all of them, or those in ``axis``)."),
    FN("swapaxes", py_swapaxes, "swapaxes(a, /, axis1, axis2, *, stream=None)\n--\n\n"
       "Swap two axes (a Transpose)."),
    FN("moveaxis", py_moveaxis, "moveaxis(a, /, source, destination, *, stream=None)\n--\n\n"
       "Move axis ``source`` to position ``destination`` (a Transpose)."),
    {NULL, NULL, 0, NULL},
};
static PyMethodDef getters[] = {
    {"T", (PyCFunction)py_T, METH_O, "Equivalent to ``self.transpose()``."},
    {"mT", (PyCFunction)py_mT, METH_O, "The transpose of the last two axes."},
    {NULL, NULL, 0, NULL},
};
static PyMethodDef meths[] = {
    FN("reshape", py_m_reshape, "reshape(self, *shape, stream=None)\n--\n\n"
       "``mx.reshape``; the shape may be given as one sequence or as ints."),
    FN("transpose", py_m_transpose, "transpose(self, *axes, stream=None)\n--\n\n"
       "``mx.transpose``; the axes may be given as one sequence or as ints."),
    FN("squeeze", py_m_squeeze, "squeeze(self, axis=None, *, stream=None)\n--\n\n"
       "``mx.squeeze`` of this array."),
    FN("swapaxes", py_m_swapaxes, "swapaxes(self, axis1, axis2, *, stream=None)\n--\n\n"
       "``mx.swapaxes`` of this array."),
    FN("moveaxis", py_m_moveaxis, "moveaxis(self, source, destination, *, stream=None)\n--\n\n"
       "``mx.moveaxis`` of this array."),
    FN("astype", py_m_astype, "astype(self, dtype, stream=None)\n--\n\n"
       "Convert the array to ``dtype`` (a new handle when it has that dtype already)."),
    {"__getitem__", (PyCFunction)py_getitem, METH_O, "``a[idx]`` with MLX's semantics."},
    {"__setitem__", (PyCFunction)(void (*)(void))py_setitem, METH_FASTCALL,
     "``a[idx] = v``: ``a`` now refers to a new lazy array."},
    {NULL, NULL, 0, NULL},
};

/* configure_layout({...}): ops/shape.py's Python versions (the fallbacks) in; the C
 * functions {"reshape", ...} out */
PyObject *configure_layout(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"array_type", "dtype_type", "reshape", "transpose",
                                        "expand_dims", "squeeze", "swapaxes", "moveaxis"};
    PyObject **const slots[] = {&l_array_type, &l_dtype_type, &l_reshape, &l_transpose,
                                &l_expand_dims, &l_squeeze, &l_swapaxes, &l_moveaxis};
    layout_configured = methods_configured = 0;
    if (take_all(kw, "configure_layout", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyType_Check(l_array_type) || !PyType_Check(l_dtype_type) || !binary_configured) {
        PyErr_SetString(PyExc_TypeError, "configure_layout: the array and dtype types, after "
                                         "configure_binary");
        return NULL;
    }
    if ((l_d_off = slot_offset(l_array_type, "_d")) < 0) return NULL;
    if (intern(&k_spec, "spec") || intern(&k_axes, "axes") || intern(&k_dtype, "dtype") ||
        intern(&k_stream, "stream") || intern(&k_shape_arg, "shape") || intern(&k_axis, "axis") ||
        intern(&k_axis1, "axis1") || intern(&k_axis2, "axis2") || intern(&k_source, "source") ||
        intern(&k_destination, "destination") || intern(&n_reshape, "Reshape") ||
        intern(&n_transpose, "Transpose") || intern(&n_expand, "ExpandDims") ||
        intern(&n_squeeze, "Squeeze") || intern(&n_astype, "AsType") || intern(&k_np, "np") ||
        intern(&n_slice, "Slice") || intern(&n_slice_update, "SliceUpdate") || intern(&k_start, "start_indices") ||
        intern(&k_end, "end_indices") || intern(&k_strides, "strides"))
        return NULL;
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && fns[i].ml_name != NULL; i++) {
        PyObject *f = PyCFunction_New(&fns[i], NULL);
        if (f == NULL || PyDict_SetItemString(out, fns[i].ml_name, f) < 0) Py_CLEAR(out);
        Py_XDECREF(f);
    }
    layout_configured = out != NULL;
    return out;
}

/* configure_layout_methods({...}) after configure_layout: array_methods.py's Python method
 * forms (the fallbacks) in; the method descriptors {"reshape", ...} and the getters of the
 * properties {"T", "mT"} out */
PyObject *configure_layout_methods(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"reshape", "transpose", "squeeze", "swapaxes",
                                        "moveaxis", "astype", "T", "mT", "__getitem__",
                                        "__setitem__"};
    PyObject **const slots[] = {&l_m_reshape, &l_m_transpose, &l_m_squeeze, &l_m_swapaxes,
                                &l_m_moveaxis, &l_m_astype, &l_t_py, &l_mt_py, &l_getitem_py,
                                &l_setitem_py};
    methods_configured = 0;
    if (!layout_configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure_layout_methods: after configure_layout");
        return NULL;
    }
    if (take_all(kw, "configure_layout_methods", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && meths[i].ml_name != NULL; i++) {
        PyObject *m = PyDescr_NewMethod((PyTypeObject *)l_array_type, &meths[i]);
        if (m == NULL || PyDict_SetItemString(out, meths[i].ml_name, m) < 0) Py_CLEAR(out);
        Py_XDECREF(m);
    }
    for (int i = 0; out != NULL && getters[i].ml_name != NULL; i++) {
        PyObject *f = PyCFunction_New(&getters[i], NULL);
        if (f == NULL || PyDict_SetItemString(out, getters[i].ml_name, f) < 0) Py_CLEAR(out);
        Py_XDECREF(f);
    }
    methods_configured = out != NULL;
    return out;
}
