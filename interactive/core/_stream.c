/* device.resolve_stream in C: an op's ``stream=None`` is this thread's default stream of the
 * default device, remembered per thread (in the thread state's dict, so a finished thread's
 * entry goes with it) beside device.py's ``_stream_generation``, which every change of a
 * default (set_default_device, set_default_stream, a StreamContext) moves on; a Stream
 * comes back as itself; anything else, and a miss, is device.py's ``_resolve_stream``. */
#include "_core.h"

static PyObject *r_py;      /* device._resolve_stream: the rule itself */
static PyObject *r_globals; /* device.py's module dict */
static PyObject *r_stream;  /* device.Stream */
static PyObject *s_generation, *s_cache_key;

PyObject *configure_stream(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"resolve", "globals", "stream_type"};
    PyObject **const slots[] = {&r_py, &r_globals, &r_stream};
    if (take_all(kw, "configure_stream", names, slots, 3) < 0) return NULL;
    if (!PyDict_Check(r_globals) || !PyType_Check(r_stream)) {
        Py_CLEAR(r_py); /* (resolve_stream: not configured) */
        PyErr_SetString(PyExc_TypeError, "configure_stream: globals a dict, stream_type a type");
        return NULL;
    }
    if (s_generation == NULL &&
        ((s_generation = PyUnicode_InternFromString("_stream_generation")) == NULL ||
         (s_cache_key = PyUnicode_InternFromString("tapescope.core.default_stream")) == NULL))
        return NULL;
    Py_RETURN_NONE;
}

PyObject *resolve_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (r_py == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_call.resolve_stream: not configured");
        return NULL;
    }
    if (nargs != 1) return PyObject_Vectorcall(r_py, args, nargs, NULL); /* its TypeError */
    PyObject *s = args[0];
    if (s != Py_None)
        return Py_TYPE(s) == (PyTypeObject *)r_stream ? Py_NewRef(s) : PyObject_CallOneArg(r_py, s);
    PyObject *gen = PyDict_GetItemWithError(r_globals, s_generation); /* borrowed */
    PyObject *tsd = gen != NULL ? PyThreadState_GetDict() : NULL;    /* borrowed */
    if (tsd != NULL) {
        PyObject *hit = PyDict_GetItemWithError(tsd, s_cache_key); /* (generation, stream) */
        if (hit != NULL && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 2 &&
            PyTuple_GET_ITEM(hit, 0) == gen)
            return Py_NewRef(PyTuple_GET_ITEM(hit, 1));
    }
    if (PyErr_Occurred()) return NULL;
    Py_XINCREF(gen); /* (the call may move the generation on: it is the one read before) */
    PyObject *st = PyObject_CallOneArg(r_py, Py_None);
    if (st != NULL && tsd != NULL && Py_TYPE(st) == (PyTypeObject *)r_stream) {
        PyObject *pair = PyTuple_Pack(2, gen, st);
        if (pair == NULL || PyDict_SetItem(tsd, s_cache_key, pair) < 0) Py_CLEAR(st);
        Py_XDECREF(pair);
    }
    Py_XDECREF(gen);
    return st;
}
