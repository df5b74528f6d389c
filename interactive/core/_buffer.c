/* The buffer protocol for mx.array on Python 3.10 and 3.11.
 *
 * Python 3.12 (PEP 688) lets a Python class export a buffer with __buffer__; older Pythons
 * only ask C types. BufferBase is that C type: mx.array derives from it there, and its
 * getbuffer asks the instance's __buffer__(flags) for an exporter (a memoryview of the data)
 * and hands out that exporter's buffer with the array as its owner. The exporter's buffer
 * is kept in view->internal and released with the view.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int base_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    PyObject *exporter = PyObject_CallMethod(self, "__buffer__", "i", flags);
    if (exporter == NULL) {
        view->obj = NULL;
        return -1;
    }
    Py_buffer *inner = PyMem_Malloc(sizeof(Py_buffer));
    if (inner == NULL) {
        Py_DECREF(exporter);
        PyErr_NoMemory();
        view->obj = NULL;
        return -1;
    }
    int rc = PyObject_GetBuffer(exporter, inner, flags);
    Py_DECREF(exporter); /* the inner buffer holds its own reference */
    if (rc < 0) {
        PyMem_Free(inner);
        view->obj = NULL;
        return -1;
    }
    *view = *inner;
    view->obj = Py_NewRef(self);
    view->internal = inner;
    return 0;
}

static void base_releasebuffer(PyObject *self, Py_buffer *view) {
    Py_buffer *inner = (Py_buffer *)view->internal;
    if (inner != NULL) {
        PyBuffer_Release(inner);
        PyMem_Free(inner);
        view->internal = NULL;
    }
}

static PyBufferProcs base_as_buffer = {base_getbuffer, base_releasebuffer};

static PyTypeObject BufferBase = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.core._buffer.BufferBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A base type whose instances export their __buffer__ through the buffer protocol.",
    .tp_as_buffer = &base_as_buffer,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_buffer", "The buffer protocol for mx.array before Python 3.12.", -1,
    NULL,
};

PyMODINIT_FUNC PyInit__buffer(void) {
    if (PyType_Ready(&BufferBase) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&BufferBase);
    if (PyModule_AddObject(m, "BufferBase", (PyObject *)&BufferBase) < 0) {
        Py_DECREF(&BufferBase);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
