/* BufferHandle in C: shared ownership of one in-use buffer (kernels/allocator.py has the
 * same class in Python, used where this extension is not built).
 *
 * Arrays and their views hold the same handle; when the last holder lets go, the handle's
 * finalizer gives the buffer back: allocator.free(buffer). The Python class does that in a
 * __del__, a Python frame on every free (~0.3 us of a 16-element GPU call on the H200's
 * host); here it is a C finalizer. As __del__'s ``except Exception: pass`` (interpreter
 * shutdown), an Exception from free is dropped; anything else is reported as unraisable.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

typedef struct {
    PyObject_HEAD
    PyObject *buffer;
    PyObject *allocator;
    PyObject *weakrefs;
} Handle;

static PyObject *s_free;

static int handle_init(Handle *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"buffer", "allocator", NULL};
    PyObject *buffer, *allocator;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:BufferHandle", names, &buffer, &allocator))
        return -1;
    Py_XSETREF(self->buffer, Py_NewRef(buffer));
    Py_XSETREF(self->allocator, Py_NewRef(allocator));
    return 0;
}

/* the buffer goes back to its allocator (once: the fields are cleared) */
static void handle_finalize(Handle *self) {
    PyObject *allocator = self->allocator, *buffer = self->buffer;
    if (allocator == NULL || buffer == NULL) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* keep an error that is being raised */
    self->allocator = self->buffer = NULL;
    PyObject *r = PyObject_CallMethodOneArg(allocator, s_free, buffer);
    if (r != NULL) Py_DECREF(r);
    else if (PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    else PyErr_WriteUnraisable((PyObject *)self);
    Py_DECREF(allocator);
    Py_DECREF(buffer);
    PyErr_Restore(type, value, tb);
}

static int handle_traverse(Handle *self, visitproc visit, void *arg) {
    Py_VISIT(self->buffer);
    Py_VISIT(self->allocator);
    return 0;
}

static int handle_clear(Handle *self) {
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->allocator);
    return 0;
}

static void handle_dealloc(Handle *self) {
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) return; /* resurrected */
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef members[] = {
    {"buffer", Py_T_OBJECT_EX, offsetof(Handle, buffer), 0, "the buffer held"},
    {"allocator", Py_T_OBJECT_EX, offsetof(Handle, allocator), 0, "the allocator it goes back to"},
    {NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tapescope.kernels._handle.BufferHandle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Shared ownership of one in-use buffer: arrays (and their views) hold the same "
              "handle, and the buffer goes back to its allocator when the last holder is gone.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)handle_init,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_finalize = (destructor)handle_finalize,
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_members = members,
    .tp_weaklistoffset = offsetof(Handle, weakrefs),
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_handle",
                                    "BufferHandle in C (see _handle.c).", -1, NULL};

PyMODINIT_FUNC PyInit__handle(void) {
    if ((s_free = PyUnicode_InternFromString("free")) == NULL || PyType_Ready(&HandleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BufferHandle", (PyObject *)&HandleType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
