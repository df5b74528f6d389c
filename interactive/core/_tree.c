/* Pytree walks in C: tree.py's ``tree_arrays`` and ``tree_fill`` (tree_update with the next
 * value of a list at each array), the same steps in the same order (tree.py is the
 * reference and runs where this extension is not built).
 *
 * MLX walks its trees in C++ (python/src/trees.cpp); a compiled function with captured
 * state (``mx.compile(step, inputs=state, outputs=state)``) walks its state twice a call and
 * ``mx.eval(state)`` once more, each walk ~10 us of Python for an optimizer's state.
 *
 * Exact lists, tuples and dicts, and dict subclasses that keep dict's own ``values``,
 * ``items`` and item assignment (``mlx.nn.Module``), are read directly; any other subclass
 * through its own methods (iteration, ``values()`` / ``items()``, ``tree[k] = v``), as the
 * Python walk calls them. ``mx.random.state`` stands for the calling thread's key. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *t_array, *t_random_state, *t_thread_key, *t_set_thread_key, *t_tuple_like;
static PyObject *s_values, *s_items;
static PyObject *dict_values, *dict_items; /* dict's own methods (_PyType_Lookup) */

static PyObject *configure(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"array", "random_state", "thread_key",
                                        "set_thread_key", "tuple_like"};
    PyObject **const slots[] = {&t_array, &t_random_state, &t_thread_key, &t_set_thread_key,
                                &t_tuple_like};
    if (!PyDict_Check(kw)) {
        PyErr_SetString(PyExc_TypeError, "configure(dict)");
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        PyObject *v = PyDict_GetItemString(kw, names[i]);
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "configure: %s", names[i]);
            return NULL;
        }
        Py_XSETREF(*slots[i], Py_NewRef(v));
    }
    if (!PyType_Check(t_array)) {
        PyErr_SetString(PyExc_TypeError, "configure: array is a type");
        return NULL;
    }
    Py_RETURN_NONE;
}

static int is_array(PyObject *x) { /* x.__class__ is array or isinstance(x, array) */
    if ((PyObject *)Py_TYPE(x) == t_array) return 1;
    return PyObject_IsInstance(x, t_array);
}

/* a dict subclass read as a dict: its values, items and item assignment are dict's */
static int plain_dict(PyObject *d) {
    if (PyDict_CheckExact(d)) return 1;
    PyTypeObject *t = Py_TYPE(d);
    return _PyType_Lookup(t, s_values) == dict_values && _PyType_Lookup(t, s_items) == dict_items &&
           t->tp_as_mapping != NULL &&
           t->tp_as_mapping->mp_ass_subscript == PyDict_Type.tp_as_mapping->mp_ass_subscript;
}

static int add_arrays(PyObject *tree, PyObject *out, int strict);

static int add_item(PyObject *t, PyObject *out, int strict) {
    if (PyDict_CheckExact(t) || PyList_CheckExact(t) || PyTuple_CheckExact(t)) /* (no array) */
        return add_arrays(t, out, strict);
    int a = is_array(t);
    if (a < 0) return -1;
    return a ? PyList_Append(out, t) : add_arrays(t, out, strict);
}

/* tree.py _arrays_of: the arrays of ``tree`` (not an array itself) appended to ``out`` */
static int add_arrays(PyObject *tree, PyObject *out, int strict) {
    if (tree == t_random_state) {
        PyObject *k = PyObject_CallNoArgs(t_thread_key);
        if (k == NULL) return -1;
        int r = PyList_Append(out, k);
        Py_DECREF(k);
        return r;
    }
    PyObject *items = NULL;
    if (PyList_CheckExact(tree) || PyTuple_CheckExact(tree) ||
        (PyDict_Check(tree) && plain_dict(tree))) {
        if (Py_EnterRecursiveCall(" in tree_arrays")) return -1;
        int r = 0;
        if (PyDict_Check(tree)) {
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            while (r == 0 && PyDict_Next(tree, &pos, &k, &v)) {
                Py_INCREF(v);
                r = add_item(v, out, strict);
                Py_DECREF(v);
            }
        } else if (PyList_CheckExact(tree)) {
            for (Py_ssize_t i = 0; r == 0 && i < PyList_GET_SIZE(tree); i++) {
                PyObject *v = Py_NewRef(PyList_GET_ITEM(tree, i));
                r = add_item(v, out, strict);
                Py_DECREF(v);
            }
        } else {
            for (Py_ssize_t i = 0; r == 0 && i < PyTuple_GET_SIZE(tree); i++)
                r = add_item(PyTuple_GET_ITEM(tree, i), out, strict);
        }
        Py_LeaveRecursiveCall();
        return r;
    }
    if (PyList_Check(tree) || PyTuple_Check(tree)) {
        items = Py_NewRef(tree);
    } else if (PyDict_Check(tree)) {
        if ((items = PyObject_CallMethodNoArgs(tree, s_values)) == NULL) return -1;
    } else if (strict) {
        PyErr_SetString(PyExc_ValueError, "[tree_flatten] The argument should contain only arrays");
        return -1;
    } else {
        return 0;
    }
    PyObject *it = PyObject_GetIter(items), *t;
    Py_DECREF(items);
    if (it == NULL) return -1;
    if (Py_EnterRecursiveCall(" in tree_arrays")) { Py_DECREF(it); return -1; }
    int r = 0;
    while (r == 0 && (t = PyIter_Next(it)) != NULL) {
        r = add_item(t, out, strict);
        Py_DECREF(t);
    }
    Py_LeaveRecursiveCall();
    Py_DECREF(it);
    return r == 0 && PyErr_Occurred() ? -1 : r;
}

/* tree_arrays(tree, out=None, strict=False) */
static PyObject *tree_arrays(PyObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    if (t_array == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_tree: not configured");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *given[3] = {NULL, Py_None, Py_False};
    for (Py_ssize_t i = 0; i < nargs && i < 3; i++) given[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int bad = nargs > 3;
    for (Py_ssize_t i = 0; !bad && i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        int at = PyUnicode_CompareWithASCIIString(k, "tree") == 0 ? 0
                 : PyUnicode_CompareWithASCIIString(k, "out") == 0 ? 1
                 : PyUnicode_CompareWithASCIIString(k, "strict") == 0 ? 2 : -1;
        if (at < 0 || at < nargs) bad = 1;
        else given[at] = args[nargs + i];
    }
    if (bad || given[0] == NULL) {
        PyErr_SetString(PyExc_TypeError, "tree_arrays(tree, out=None, strict=False)");
        return NULL;
    }
    args = given;
    nargs = 3;
    PyObject *out = nargs > 1 && args[1] != Py_None ? Py_NewRef(args[1]) : PyList_New(0);
    if (out == NULL) return NULL;
    if (!PyList_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "tree_arrays: out is a list");
        return NULL;
    }
    int strict = nargs > 2 ? PyObject_IsTrue(args[2]) : 0;
    int a = strict < 0 ? -1 : is_array(args[0]);
    int r = a < 0 ? -1 : a ? PyList_Append(out, args[0]) : add_arrays(args[0], out, strict);
    if (r < 0) { Py_DECREF(out); return NULL; }
    return out;
}

/* the values tree_fill hands out, in order */
typedef struct {
    PyObject *values;
    Py_ssize_t next;
} Source;

static PyObject *take(Source *s) { /* next(it): a new reference, or StopIteration */
    if (s->next >= PyList_GET_SIZE(s->values)) {
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(s->values, s->next++));
}

static PyObject *fill(PyObject *tree, Source *s);

/* one child's new value: visit(x) if x.__class__ is array else tree_update(x, visit) */
static PyObject *fill_child(PyObject *x, Source *s) {
    return (PyObject *)Py_TYPE(x) == t_array ? take(s) : fill(x, s);
}

/* tree.py tree_update(tree, lambda a: next(it)): a new reference to the updated tree */
static PyObject *fill(PyObject *tree, Source *s) {
    int a = PyDict_CheckExact(tree) || PyList_CheckExact(tree) ? 0 : is_array(tree);
    if (a < 0) return NULL;
    if (a) return take(s);
    if (tree == t_random_state) {
        PyObject *k = PyObject_CallNoArgs(t_thread_key);
        if (k == NULL) return NULL;
        Py_DECREF(k); /* (visit's argument: the value given does not depend on it) */
        PyObject *v = take(s);
        PyObject *r = v ? PyObject_CallOneArg(t_set_thread_key, v) : NULL;
        Py_XDECREF(v);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        return Py_NewRef(tree);
    }
    int list = PyList_Check(tree), tuple = !list && PyTuple_Check(tree),
        dict = !list && !tuple && PyDict_Check(tree);
    if (!list && !tuple && !dict) return Py_NewRef(tree);
    if (Py_EnterRecursiveCall(" in tree_update")) return NULL;
    PyObject *result = NULL;
    if (PyList_CheckExact(tree)) {
        Py_ssize_t i = 0;
        for (; i < PyList_GET_SIZE(tree); i++) {
            PyObject *x = Py_NewRef(PyList_GET_ITEM(tree, i));
            PyObject *v = fill_child(x, s);
            Py_DECREF(x);
            if (v == NULL) break;
            if (i >= PyList_GET_SIZE(tree)) { Py_DECREF(v); break; } /* (shrunk meanwhile) */
            PyList_SetItem(tree, i, v); /* steals v */
        }
        if (!PyErr_Occurred()) result = Py_NewRef(tree);
    } else if (dict && plain_dict(tree)) {
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        int bad = 0;
        while (!bad && PyDict_Next(tree, &pos, &k, &x)) {
            Py_INCREF(k); Py_INCREF(x);
            PyObject *v = fill_child(x, s);
            /* (an existing key's value replaced: the dict's size and order stay) */
            bad = v == NULL || PyDict_SetItem(tree, k, v) < 0;
            Py_XDECREF(v); Py_DECREF(k); Py_DECREF(x);
        }
        if (!bad) result = Py_NewRef(tree);
    } else if (tuple) { /* (a subclass's items as its iteration gives them) */
        PyObject *src = PySequence_Tuple(tree);
        Py_ssize_t n = src ? PyTuple_GET_SIZE(src) : 0;
        PyObject *items = src ? PyList_New(n) : NULL;
        for (Py_ssize_t i = 0; items != NULL && i < n; i++) {
            PyObject *v = fill(PyTuple_GET_ITEM(src, i), s);
            if (v == NULL) Py_CLEAR(items);
            else PyList_SET_ITEM(items, i, v);
        }
        Py_XDECREF(src);
        if (items != NULL)
            result = PyTuple_CheckExact(tree) ? PyList_AsTuple(items)
                     : PyObject_CallFunctionObjArgs(t_tuple_like, tree, items, NULL);
        Py_XDECREF(items);
    } else { /* a subclass with its own methods: for k, v in tree.items() / enumerate(tree) */
        PyObject *seq = dict ? PyObject_CallMethodNoArgs(tree, s_items) : Py_NewRef(tree);
        PyObject *it = seq ? PyObject_GetIter(seq) : NULL, *e;
        Py_XDECREF(seq);
        int bad = it == NULL;
        for (Py_ssize_t i = 0; !bad && (e = PyIter_Next(it)) != NULL; i++) {
            PyObject *key = NULL, *x = e;
            if (dict) {
                if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
                    PyErr_SetString(PyExc_TypeError, "tree_update: items() gives (key, value) pairs");
                    bad = 1;
                    Py_DECREF(e);
                    break;
                }
                key = Py_NewRef(PyTuple_GET_ITEM(e, 0));
                x = PyTuple_GET_ITEM(e, 1);
            } else {
                key = PyLong_FromSsize_t(i);
            }
            PyObject *v = key ? fill_child(x, s) : NULL;
            bad = v == NULL || PyObject_SetItem(tree, key, v) < 0;
            Py_XDECREF(v); Py_XDECREF(key); Py_DECREF(e);
        }
        if (!bad && !PyErr_Occurred()) result = Py_NewRef(tree);
        Py_XDECREF(it);
    }
    Py_LeaveRecursiveCall();
    return result;
}

/* tree_fill(tree, values): tree_update(tree, lambda a: next(it)) with it = iter(values) */
static PyObject *tree_fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (t_array == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_tree: not configured");
        return NULL;
    }
    if (nargs != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "tree_fill(tree, values: list)");
        return NULL;
    }
    Source s = {args[1], 0};
    return fill(args[0], &s);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)configure, METH_O,
     "Hand over tree.py's objects (a dict: array, random_state, thread_key, set_thread_key, "
     "tuple_like)."},
    {"tree_arrays", (PyCFunction)(void (*)(void))tree_arrays, METH_FASTCALL | METH_KEYWORDS,
     "tree_arrays(tree, out=None, strict=False): tree.py's tree_arrays."},
    {"tree_fill", (PyCFunction)(void (*)(void))tree_fill, METH_FASTCALL,
     "tree_fill(tree, values): tree_update(tree, lambda a: next(it)), it = iter(values)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tree",
                                    "Pytree walks in C (see _tree.c).", -1, methods};

PyMODINIT_FUNC PyInit__tree(void) {
    if (!(s_values = PyUnicode_InternFromString("values")) ||
        !(s_items = PyUnicode_InternFromString("items")))
        return NULL;
    dict_values = _PyType_Lookup(&PyDict_Type, s_values);
    dict_items = _PyType_Lookup(&PyDict_Type, s_items);
    if (dict_values == NULL || dict_items == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_tree: dict's values / items");
        return NULL;
    }
    Py_INCREF(dict_values);
    Py_INCREF(dict_items);
    return PyModule_Create(&module);
}
