/* The CPU's view rules in C: cpu/views.py's ``broadcast`` and the definitions' ``reshape``
 * and ``transpose`` (rules/shape.py: the array's own method), the same steps without a
 * Python frame (those are the reference and run where this extension is not built). The eval loop calls a node's rule with its parameters as
 * keywords (core/_loop.c call_rule); a training step runs a dozen or more views. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *v_ndarray, *s_reshape, *s_transpose, *s_broadcast_to, *s_shape, *s_axes,
    *s_flags, *s_writeable, *s_dtype, *s_ndim, *s_strides, *s_c_contiguous;

static PyObject *configure(PyObject *self, PyObject *ndarray) {
    if (!PyType_Check(ndarray)) {
        PyErr_SetString(PyExc_TypeError, "configure(np.ndarray)");
        return NULL;
    }
    Py_XSETREF(v_ndarray, Py_NewRef(ndarray));
    Py_RETURN_NONE;
}

/* rule(xp, a, *, <name>=..., **_): the keyword ``name``'s value (borrowed), NULL: absent */
static PyObject *keyword(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                         PyObject *name) {
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == name || PyUnicode_Compare(k, name) == 0) return args[nargs + i];
    }
    return NULL;
}

/* a rule of one array and one keyword: xp, a, the keyword's value; -1: a TypeError set */
static int unpack(const char *who, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                  PyObject *name, PyObject **value) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (v_ndarray == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_views: not configured");
        return -1;
    }
    if (nargs != 2 || (*value = keyword(args, nargs, kwnames, name)) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s(xp, a, *, %U)", who, name);
        return -1;
    }
    return 0;
}

/* one method of the array, or the array module's function where a is not a numpy array */
static PyObject *method_or_module(PyObject *xp, PyObject *a, PyObject *name, PyObject *arg) {
    if (Py_TYPE(a) == (PyTypeObject *)v_ndarray) {
        PyObject *margs[2] = {a, arg};
        return PyObject_VectorcallMethod(name, margs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    PyObject *fargs[3] = {xp, a, arg};
    return PyObject_VectorcallMethod(name, fargs, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* rules/shape.reshape: a.reshape(shape) (np.reshape's method), xp.reshape off numpy */
static PyObject *reshape(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *shape;
    if (unpack("reshape", args, nargsf, kwnames, s_shape, &shape) < 0) return NULL;
    return method_or_module(args[0], args[1], s_reshape, shape);
}

/* rules/shape.transpose: a.transpose(axes), xp.transpose off numpy */
static PyObject *transpose(PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    PyObject *axes;
    if (unpack("transpose", args, nargsf, kwnames, s_axes, &axes) < 0) return NULL;
    return method_or_module(args[0], args[1], s_transpose, axes);
}

/* views.broadcast: np.ndarray(shape, a.dtype, a, 0, strides), read-only, with stride 0 along
 * the new and the stretched dimensions, for a 0-d or row-contiguous numpy array; else
 * xp.broadcast_to(a, shape) */
static PyObject *broadcast(PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    PyObject *shape, *xp, *a;
    if (unpack("broadcast", args, nargsf, kwnames, s_shape, &shape) < 0) return NULL;
    xp = args[0];
    a = args[1];
    if (Py_TYPE(a) != (PyTypeObject *)v_ndarray || !PyTuple_Check(shape)) {
        PyObject *fargs[3] = {xp, a, shape};
        return PyObject_VectorcallMethod(s_broadcast_to, fargs, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         NULL);
    }
    PyObject *ashape = NULL, *astrides = NULL, *strides = NULL, *dtype = NULL, *v = NULL,
             *flags = NULL, *zero = NULL, *result = NULL;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (!(ashape = PyObject_GetAttr(a, s_shape)) || !PyTuple_Check(ashape)) goto done;
    Py_ssize_t and_ = PyTuple_GET_SIZE(ashape);
    int contiguous = 1;
    if (and_ > 0) {
        PyObject *f = PyObject_GetAttr(a, s_flags);
        PyObject *c = f ? PyObject_GetAttr(f, s_c_contiguous) : NULL;
        Py_XDECREF(f);
        if (c == NULL) goto done;
        contiguous = c == Py_True;
        Py_DECREF(c);
    }
    if (!contiguous || and_ > nd) {
        PyObject *fargs[3] = {xp, a, shape};
        result = PyObject_VectorcallMethod(s_broadcast_to, fargs,
                                           3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        goto done;
    }
    if (!(astrides = PyObject_GetAttr(a, s_strides)) || !PyTuple_Check(astrides) ||
        !(strides = PyTuple_New(nd)) || !(zero = PyLong_FromLong(0)))
        goto done;
    Py_ssize_t lead = nd - and_;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *st = zero;
        if (i >= lead) { /* 0 if n == 1 and m != 1 else the array's stride */
            PyObject *n = PyTuple_GET_ITEM(ashape, i - lead), *m = PyTuple_GET_ITEM(shape, i);
            long ln = PyLong_AsLong(n), lm = PyLong_AsLong(m);
            if ((ln == -1 || lm == -1) && PyErr_Occurred()) goto done;
            if (!(ln == 1 && lm != 1)) st = PyTuple_GET_ITEM(astrides, i - lead);
        }
        PyTuple_SET_ITEM(strides, i, Py_NewRef(st));
    }
    if (!(dtype = PyObject_GetAttr(a, s_dtype))) goto done;
    PyObject *cargs[5] = {shape, dtype, a, zero, strides};
    if (!(v = PyObject_Vectorcall(v_ndarray, cargs, 5, NULL))) goto done;
    if (!(flags = PyObject_GetAttr(v, s_flags)) || PyObject_SetAttr(flags, s_writeable, Py_False) < 0)
        goto done;
    result = Py_NewRef(v);
done:
    Py_XDECREF(ashape); Py_XDECREF(astrides); Py_XDECREF(strides); Py_XDECREF(dtype);
    Py_XDECREF(v); Py_XDECREF(flags); Py_XDECREF(zero);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)configure, METH_O, "Hand over np.ndarray."},
    {"reshape", (PyCFunction)(void (*)(void))reshape, METH_FASTCALL | METH_KEYWORDS,
     "reshape(xp, a, *, shape, **_): rules/shape.reshape in C."},
    {"transpose", (PyCFunction)(void (*)(void))transpose, METH_FASTCALL | METH_KEYWORDS,
     "transpose(xp, a, *, axes): rules/shape.transpose in C."},
    {"broadcast", (PyCFunction)(void (*)(void))broadcast, METH_FASTCALL | METH_KEYWORDS,
     "broadcast(xp, a, *, shape): views.broadcast in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_views",
                                    "The CPU's view rules in C (see _views.c).", -1, methods};

PyMODINIT_FUNC PyInit__views(void) {
    if (!(s_reshape = PyUnicode_InternFromString("reshape")) ||
        !(s_transpose = PyUnicode_InternFromString("transpose")) ||
        !(s_broadcast_to = PyUnicode_InternFromString("broadcast_to")) ||
        !(s_shape = PyUnicode_InternFromString("shape")) ||
        !(s_axes = PyUnicode_InternFromString("axes")) ||
        !(s_flags = PyUnicode_InternFromString("flags")) ||
        !(s_writeable = PyUnicode_InternFromString("writeable")) ||
        !(s_dtype = PyUnicode_InternFromString("dtype")) ||
        !(s_ndim = PyUnicode_InternFromString("ndim")) ||
        !(s_strides = PyUnicode_InternFromString("strides")) ||
        !(s_c_contiguous = PyUnicode_InternFromString("c_contiguous")))
        return NULL;
    return PyModule_Create(&module);
}
