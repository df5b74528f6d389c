/* matmul and addmm recorded in C: ops/products.py ``_matmul`` / ``_addmm``'s common case
 * (``matmul_py`` / ``addmm_py`` are the reference; they run every other case, each error
 * included, and wherever this is not built), and the array's ``@`` (array_methods.py
 * ``_matmul``'s op: an mx.array operand straight here, any other through the Python op).
 *
 * MLX's matmul (mlx/ops.cpp) of an (M, K) by a (K, N) matrix of one inexact dtype records
 * one Matmul; of an (..., K) array by a (K, N) matrix, outside a shapeless trace
 * (compile_trace._dynamic.on false), Flatten (shape (n, K), start_axis 0, end_axis ndim - 2),
 * Matmul, Unflatten (shape (..., N), axis 0, spec the leading axes). Its addmm of two
 * matrices and a ``c`` that broadcasts to their (M, N) product (c of at most two axes, each
 * 1 or the product's), all of one real float dtype: c's Broadcast when its shape differs,
 * then one AddMM (alpha=float(alpha), beta=float(beta)). Here: those cases for mx.arrays
 * (exactly), the nodes recorded as array._make1 records them (_binary.c record1), the
 * primitives as Primitive(name, stream, **params) makes them, the stream resolved once. */
#include "_core.h"

static PyObject *m_array_type, *m_resolve, *m_inexact, *m_floating, *m_dynamic, *m_matmul_py,
    *m_addmm_py, *m_matmul_op;
static PyObject *n_matmul, *n_flatten, *n_unflatten, *n_addmm, *n_broadcast, *k_shape,
    *k_start_axis, *k_end_axis, *k_axis, *k_spec, *k_alpha, *k_beta, *k_on, *k_stream, *v_zero,
    *kw_stream; /* ("stream",): a fallback's keyword names */
static Py_ssize_t m_d_off;
static int products_configured = 0;

#define INTERN(var, text) \
    if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) return NULL;

PyObject *configure_products(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"array_type", "resolve_stream", "inexact", "floating",
                                        "dynamic", "matmul_py", "addmm_py"};
    PyObject **const slots[] = {&m_array_type, &m_resolve, &m_inexact, &m_floating,
                                &m_dynamic, &m_matmul_py, &m_addmm_py};
    products_configured = 0;
    if (take_all(kw, "configure_products", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if (!PyType_Check(m_array_type) || !PyAnySet_Check(m_inexact) ||
        !PyAnySet_Check(m_floating) || !binary_configured) {
        PyErr_SetString(PyExc_TypeError, "configure_products: the array type, the inexact and "
                                         "floating dtypes (sets), after configure_binary");
        return NULL;
    }
    if ((m_d_off = slot_offset(m_array_type, "_d")) < 0) return NULL;
    INTERN(n_matmul, "Matmul") INTERN(n_flatten, "Flatten") INTERN(n_unflatten, "Unflatten")
    INTERN(n_addmm, "AddMM") INTERN(n_broadcast, "Broadcast") INTERN(k_shape, "shape")
    INTERN(k_start_axis, "start_axis") INTERN(k_end_axis, "end_axis") INTERN(k_axis, "axis")
    INTERN(k_spec, "spec") INTERN(k_alpha, "alpha") INTERN(k_beta, "beta") INTERN(k_on, "on")
    INTERN(k_stream, "stream")
    if (v_zero == NULL && (v_zero = PyLong_FromLong(0)) == NULL) return NULL;
    if (kw_stream == NULL && (kw_stream = PyTuple_Pack(1, k_stream)) == NULL) return NULL;
    products_configured = 1;
    Py_RETURN_NONE;
}

/* the desc of an mx.array (exactly), else NULL (borrowed) */
static PyObject *desc_of(PyObject *a) {
    if ((PyObject *)Py_TYPE(a) != m_array_type) return NULL;
    PyObject *d = SLOT(a, m_d_off);
    if (d == NULL || (PyObject *)Py_TYPE(d) != c_desc_type) return NULL;
    PyObject *shape = SLOT(d, desc_off[D_SHAPE]), *dt = SLOT(d, desc_off[D_DTYPE]);
    if (shape == NULL || !PyTuple_CheckExact(shape) || dt == NULL) return NULL;
    return d;
}

#define SHAPE(d) SLOT(d, desc_off[D_SHAPE])
#define DTYPE(d) SLOT(d, desc_off[D_DTYPE])

/* a set's membership, errors cleared as a miss (the dtypes hash by identity) */
static int member(PyObject *set, PyObject *key) {
    int r = PySet_Contains(set, key);
    if (r < 0) { PyErr_Clear(); return 0; }
    return r;
}

/* two ints equal (shape entries: exact ints) */
static int same_int(PyObject *x, PyObject *y) {
    if (x == y) return 1;
    if (!PyLong_CheckExact(x) || !PyLong_CheckExact(y)) return 0;
    int r = PyObject_RichCompareBool(x, y, Py_EQ);
    if (r < 0) { PyErr_Clear(); return 0; }
    return r;
}

static PyObject *list_of(PyObject *x, PyObject *y, PyObject *z) { /* new list, new refs */
    PyObject *l = PyList_New(z ? 3 : y ? 2 : 1);
    if (l == NULL) return NULL;
    PyList_SET_ITEM(l, 0, Py_NewRef(x));
    if (y) PyList_SET_ITEM(l, 1, Py_NewRef(y));
    if (z) PyList_SET_ITEM(l, 2, Py_NewRef(z));
    return l;
}

/* the common case's array, or NULL without an error where it does not apply (the Python
 * version runs), NULL with one on error */
static PyObject *matmul_c(PyObject *a, PyObject *b, PyObject *stream) {
    PyObject *ad = desc_of(a), *bd = desc_of(b);
    if (ad == NULL || bd == NULL) return NULL;
    PyObject *sa = SHAPE(ad), *sb = SHAPE(bd), *dt = DTYPE(ad);
    Py_ssize_t nd = PyTuple_GET_SIZE(sa);
    if (nd < 2 || PyTuple_GET_SIZE(sb) != 2 || DTYPE(bd) != dt ||
        !same_int(PyTuple_GET_ITEM(sa, nd - 1), PyTuple_GET_ITEM(sb, 0)) || !member(m_inexact, dt))
        return NULL;
    PyObject *N = PyTuple_GET_ITEM(sb, 1);
    if (nd == 2) {
        PyObject *s = PyObject_CallOneArg(m_resolve, stream);
        if (s == NULL) return NULL;
        PyObject *shape = PyTuple_Pack(2, PyTuple_GET_ITEM(sa, 0), N);
        PyObject *descs = shape ? list_of(ad, bd, NULL) : NULL;
        PyObject *out = descs ? record1(new_primitive(n_matmul, s, NULL), descs, shape, dt, 1)
                              : NULL;
        Py_XDECREF(shape);
        Py_DECREF(s);
        return out;
    }
    PyObject *on = PyObject_GetAttr(m_dynamic, k_on); /* (in_dynamic_tracing) */
    int dynamic = on ? PyObject_IsTrue(on) : -1;
    Py_XDECREF(on);
    if (dynamic != 0) { if (dynamic < 0) PyErr_Clear(); return NULL; }
    /* a Linear's (..., K) @ (K, N): Flatten, Matmul, Unflatten */
    Py_ssize_t n = 1;
    for (Py_ssize_t i = 0; i < nd - 1; i++) {
        PyObject *v = PyTuple_GET_ITEM(sa, i);
        Py_ssize_t d = PyLong_CheckExact(v) ? PyLong_AsSsize_t(v) : -1;
        if (d < 0) { PyErr_Clear(); return NULL; }
        n *= d;
    }
    PyObject *s = PyObject_CallOneArg(m_resolve, stream);
    if (s == NULL) return NULL;
    PyObject *out = NULL, *flat = NULL, *lead = NULL, *full = NULL, *x = NULL, *mm = NULL,
             *nobj = PyLong_FromSsize_t(n), *endax = PyLong_FromSsize_t(nd - 2), *kw = NULL;
    if (nobj == NULL || endax == NULL) goto done;
    flat = PyTuple_Pack(2, nobj, PyTuple_GET_ITEM(sa, nd - 1));
    lead = PyTuple_GetSlice(sa, 0, nd - 1);
    full = lead ? PyTuple_New(nd) : NULL;
    if (flat == NULL || full == NULL) goto done;
    for (Py_ssize_t i = 0; i < nd - 1; i++)
        PyTuple_SET_ITEM(full, i, Py_NewRef(PyTuple_GET_ITEM(sa, i)));
    PyTuple_SET_ITEM(full, nd - 1, Py_NewRef(N));
    kw = PyDict_New();
    if (kw == NULL || PyDict_SetItem(kw, k_shape, flat) < 0 ||
        PyDict_SetItem(kw, k_start_axis, v_zero) < 0 || PyDict_SetItem(kw, k_end_axis, endax) < 0)
        goto done;
    PyObject *descs = list_of(ad, NULL, NULL);
    if (descs == NULL) goto done;
    x = record1(new_primitive(n_flatten, s, kw), descs, flat, dt, 0); /* (kw stolen) */
    kw = NULL;
    if (x == NULL) goto done;
    PyObject *mshape = PyTuple_Pack(2, nobj, N);
    descs = mshape ? list_of(x, bd, NULL) : NULL;
    mm = descs ? record1(new_primitive(n_matmul, s, NULL), descs, mshape, dt, 0) : NULL;
    Py_XDECREF(mshape);
    if (mm == NULL) goto done;
    kw = PyDict_New();
    if (kw == NULL || PyDict_SetItem(kw, k_shape, full) < 0 ||
        PyDict_SetItem(kw, k_axis, v_zero) < 0 || PyDict_SetItem(kw, k_spec, lead) < 0)
        goto done;
    descs = list_of(mm, NULL, NULL);
    if (descs == NULL) goto done;
    out = record1(new_primitive(n_unflatten, s, kw), descs, full, dt, 1);
    kw = NULL;
done:
    Py_XDECREF(kw); Py_XDECREF(nobj); Py_XDECREF(endax); Py_XDECREF(flat); Py_XDECREF(lead);
    Py_XDECREF(full); Py_XDECREF(x); Py_XDECREF(mm);
    Py_DECREF(s);
    return out;
}

/* _matmul(a, b, stream): the common case here, else matmul_py(a, b, stream=stream) */
PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!products_configured || nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_matmul(a, b, stream), once configured");
        return NULL;
    }
    PyObject *out = matmul_c(args[0], args[1], args[2]);
    if (out != NULL || PyErr_Occurred()) return out;
    return PyObject_Vectorcall(m_matmul_py, args, 2, kw_stream);  /* (..., stream=stream) */
}

/* ``a @ b`` (array.__matmul__): an mx.array operand's matmul here, any other operand (and
 * its errors) through array_methods.py's op */
static PyObject *op_matmul(PyObject *self, PyObject *other) {
    if (products_configured && (PyObject *)Py_TYPE(self) == m_array_type &&
        (PyObject *)Py_TYPE(other) == m_array_type) {
        PyObject *args[3] = {self, other, Py_None};
        return py_matmul(NULL, args, 3);
    }
    if (m_matmul_op == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "array.__matmul__: not configured");
        return NULL;
    }
    PyObject *args[2] = {self, other};
    return PyObject_Vectorcall(m_matmul_op, args, 2, NULL);
}

static PyMethodDef matmul_def = {"__matmul__", op_matmul, METH_O,
                                 "``matmul`` as the ``__matmul__`` operator (in C: _products.c)."};

/* install_matmul(op): the array's ``@`` in C (after configure_products), ``op`` (the
 * Python operator) kept as the fallback */
PyObject *install_matmul(PyObject *self, PyObject *op) {
    if (!products_configured || !PyCallable_Check(op)) {
        PyErr_SetString(PyExc_TypeError, "install_matmul(op) after configure_products");
        return NULL;
    }
    Py_XSETREF(m_matmul_op, Py_NewRef(op));
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)m_array_type, &matmul_def);
    if (descr == NULL) return NULL;
    int rc = PyObject_SetAttrString(m_array_type, "__matmul__", descr);
    Py_DECREF(descr);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* a float of ``v`` as float(v) makes it (new ref) */
static PyObject *as_float(PyObject *v) {
    if (PyFloat_CheckExact(v)) return Py_NewRef(v);
    return PyNumber_Float(v);
}

static PyObject *addmm_c(PyObject *c, PyObject *a, PyObject *b, PyObject *alpha, PyObject *beta,
                         PyObject *stream) {
    PyObject *ad = desc_of(a), *bd = desc_of(b), *cd = desc_of(c);
    if (ad == NULL || bd == NULL || cd == NULL) return NULL;
    PyObject *sa = SHAPE(ad), *sb = SHAPE(bd), *sc = SHAPE(cd), *dt = DTYPE(ad);
    Py_ssize_t nc = PyTuple_GET_SIZE(sc);
    if (PyTuple_GET_SIZE(sa) != 2 || PyTuple_GET_SIZE(sb) != 2 || DTYPE(bd) != dt ||
        DTYPE(cd) != dt || !same_int(PyTuple_GET_ITEM(sa, 1), PyTuple_GET_ITEM(sb, 0)) ||
        !member(m_floating, dt) || nc > 2)
        return NULL;
    PyObject *M = PyTuple_GET_ITEM(sa, 0), *N = PyTuple_GET_ITEM(sb, 1);
    if (nc >= 1) {
        PyObject *last = PyTuple_GET_ITEM(sc, nc - 1);
        if (!PyLong_CheckExact(last) || !(PyLong_AsLong(last) == 1 || same_int(last, N)))
            { PyErr_Clear(); return NULL; }
    }
    if (nc == 2) {
        PyObject *first = PyTuple_GET_ITEM(sc, 0);
        if (!PyLong_CheckExact(first) || !(PyLong_AsLong(first) == 1 || same_int(first, M)))
            { PyErr_Clear(); return NULL; }
    }
    PyObject *fa = NULL, *fb = NULL, *z = NULL, *out = NULL, *kw = NULL;
    PyObject *s = PyObject_CallOneArg(m_resolve, stream);
    PyObject *shape = s ? PyTuple_Pack(2, M, N) : NULL;
    if (shape == NULL) goto done;
    int same = nc == 2 && same_int(PyTuple_GET_ITEM(sc, 0), M) &&
               same_int(PyTuple_GET_ITEM(sc, 1), N);
    if (same) {
        z = Py_NewRef(cd);
    } else { /* convert.py broadcast_known: one Broadcast node */
        kw = PyDict_New();
        if (kw == NULL || PyDict_SetItem(kw, k_shape, shape) < 0) goto done;
        PyObject *descs = list_of(cd, NULL, NULL);
        if (descs == NULL) goto done;
        z = record1(new_primitive(n_broadcast, s, kw), descs, shape, dt, 0);
        kw = NULL;
        if (z == NULL) goto done;
    }
    if ((fa = as_float(alpha)) == NULL || (fb = as_float(beta)) == NULL) /* (float()'s errors) */
        goto done;
    kw = PyDict_New();
    if (kw == NULL || PyDict_SetItem(kw, k_alpha, fa) < 0 || PyDict_SetItem(kw, k_beta, fb) < 0)
        goto done;
    PyObject *descs = list_of(ad, bd, z);
    if (descs == NULL) goto done;
    out = record1(new_primitive(n_addmm, s, kw), descs, shape, dt, 1);
    kw = NULL;
done:
    Py_XDECREF(kw); Py_XDECREF(z); Py_XDECREF(shape); Py_XDECREF(s);
    Py_XDECREF(fa); Py_XDECREF(fb);
    return out;
}

/* _addmm(c, a, b, alpha, beta, stream): the common case here, else addmm_py(c, a, b, alpha,
 * beta, stream=stream) */
PyObject *py_addmm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!products_configured || nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "_addmm(c, a, b, alpha, beta, stream), once configured");
        return NULL;
    }
    PyObject *out = addmm_c(args[0], args[1], args[2], args[3], args[4], args[5]);
    if (out != NULL || PyErr_Occurred()) return out;
    return PyObject_Vectorcall(m_addmm_py, args, 5, kw_stream);  /* (..., stream=stream) */
}
