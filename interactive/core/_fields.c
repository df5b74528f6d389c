/* An array handle's hot attributes in C (array.py's ``_c_record`` puts them on the class):
 * ``shape`` / ``dtype`` / ``ndim`` as read-only descriptors that read the handle's ``_d``
 * and that desc's slot (the properties' values, without a Python frame: mlx.nn and the op
 * layer ask them a few hundred times a training step), and ``_wrap`` / ``_handle`` (a new
 * handle on a desc / on the same desc). */
#include "_core.h"

static PyTypeObject *f_array;  /* array.array */
static Py_ssize_t f_d_off = -1; /* its ``_d`` slot */

typedef struct {
    PyObject_HEAD
    PyObject *name, *doc;
    Py_ssize_t off; /* the desc's slot */
    int ndim;       /* the slot's length (``ndim``: len(shape)) */
} Field;

static PyObject *field_get(Field *f, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(f); /* on the class: the descriptor */
    if (!PyObject_TypeCheck(obj, f_array)) {
        PyErr_Format(PyExc_TypeError, "descriptor %R for 'array' objects doesn't apply to a "
                     "%R object", f->name, Py_TYPE(obj));
        return NULL;
    }
    PyObject *d = SLOT(obj, f_d_off);
    if (d == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_d");
        return NULL;
    }
    PyObject *v = PyObject_TypeCheck(d, (PyTypeObject *)c_desc_type) ? SLOT(d, f->off) : NULL;
    if (v == NULL) return PyObject_GetAttr(d, f->ndim ? s_shape : f->name); /* (not set) */
    if (!f->ndim) return Py_NewRef(v);
    Py_ssize_t n = PyTuple_Check(v) ? PyTuple_GET_SIZE(v) : PyObject_Length(v);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static int field_set(Field *f, PyObject *obj, PyObject *value) { /* a property's error */
    PyObject *qualname = PyType_GetQualName(Py_TYPE(obj));
    if (qualname == NULL) return -1;
    PyErr_Format(PyExc_AttributeError, value == NULL ? "property %R of %R object has no deleter"
                                                     : "property %R of %R object has no setter",
                 f->name, qualname);
    Py_DECREF(qualname);
    return -1;
}

static void field_dealloc(Field *f) {
    Py_XDECREF(f->name);
    Py_XDECREF(f->doc);
    PyObject_Free(f);
}

static PyMemberDef field_members[] = {
    {"__doc__", Py_T_OBJECT_EX, offsetof(Field, doc), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FieldType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.core._call.Field",
    .tp_basicsize = sizeof(Field),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An array's attribute read off its desc in C (array.py's property, its value).",
    .tp_dealloc = (destructor)field_dealloc,
    .tp_descr_get = (descrgetfunc)field_get,
    .tp_descr_set = (descrsetfunc)field_set,
    .tp_members = field_members,
};

/* whether configure_fields ran (handle_of can make handles) */
int fields_ready(void) { return f_array != NULL; }

/* a new handle (array.array) on ``d`` */
PyObject *handle_of(PyObject *d) {
    PyObject *h = f_array->tp_alloc(f_array, 0);
    if (h != NULL) put(h, f_d_off, d);
    return h;
}

static PyObject *wrap(PyObject *self, PyObject *d) { return handle_of(d); }

static PyObject *handle(PyObject *self, PyObject *a) {
    if (!PyObject_TypeCheck(a, f_array) || SLOT(a, f_d_off) == NULL) {
        PyErr_SetString(PyExc_TypeError, "_handle: an array");
        return NULL;
    }
    return handle_of(SLOT(a, f_d_off));
}

static PyMethodDef field_methods[] = {
    {"_wrap", (PyCFunction)wrap, METH_O, "array._wrap(desc): a new handle on desc."},
    {"_handle", (PyCFunction)handle, METH_O, "array._handle(): a new handle on the same desc."},
    {NULL, NULL, 0, NULL},
};

/* configure_fields({"array_type", "docs": {name: doc}}) after configure_record (the desc's
 * slots): {"shape", "dtype", "ndim": descriptors, "_wrap": a function, "_handle": a method} */
PyObject *configure_fields(PyObject *self, PyObject *kw) {
    PyObject *at = PyDict_Check(kw) ? PyDict_GetItemString(kw, "array_type") : NULL;
    PyObject *docs = PyDict_Check(kw) ? PyDict_GetItemString(kw, "docs") : NULL;
    if (at == NULL || !PyType_Check(at) || docs == NULL || !PyDict_Check(docs) ||
        c_desc_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "configure_fields({array_type, docs}) after "
                                         "configure_record");
        return NULL;
    }
    if (PyType_Ready(&FieldType) < 0) return NULL;
    Py_ssize_t off = slot_offset(at, "_d");
    if (off < 0) return NULL;
    Py_XSETREF(f_array, (PyTypeObject *)Py_NewRef(at));
    f_d_off = off;
    PyObject *out = PyDict_New();
    static const char *const names[] = {"shape", "dtype", "ndim"};
    const Py_ssize_t offs[] = {desc_off[D_SHAPE], desc_off[D_DTYPE], desc_off[D_SHAPE]};
    for (int i = 0; out != NULL && i < 3; i++) {
        Field *f = PyObject_New(Field, &FieldType);
        if (f == NULL) { Py_CLEAR(out); break; }
        f->name = PyUnicode_InternFromString(names[i]);
        PyObject *doc = f->name ? PyDict_GetItemWithError(docs, f->name) : NULL;
        f->doc = Py_NewRef(doc != NULL ? doc : Py_None);
        f->off = offs[i];
        f->ndim = i == 2;
        if (f->name == NULL || PyErr_Occurred() || PyDict_SetItem(out, f->name, (PyObject *)f) < 0)
            Py_CLEAR(out);
        Py_DECREF(f);
    }
    for (int i = 0; out != NULL && i < 2; i++) {
        PyObject *fn = PyCFunction_New(&field_methods[i], NULL);
        PyObject *v = fn != NULL && i == 1 ? PyInstanceMethod_New(fn) : Py_XNewRef(fn);
        if (v == NULL || PyDict_SetItemString(out, field_methods[i].ml_name, v) < 0) Py_CLEAR(out);
        Py_XDECREF(fn);
        Py_XDECREF(v);
    }
    return out;
}
