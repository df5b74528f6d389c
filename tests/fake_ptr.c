/* The stand-in CuPy's ``x.data.ptr`` in C, as CuPy's own is (``ndarray.data`` a MemoryPointer
 * attribute, its ``ptr`` an integer: two C attribute reads), so that host-cost measurements
 * over tests/fake_cupy.py count what a GPU's CuPy costs there, not numpy's
 * ``__array_interface__`` dict built per read. Built by tests/fake_cuda_driver.py with the
 * Python headers and loaded through ctypes.PyDLL; ``fake_data_descriptor()`` returns the
 * descriptor installed as ``cupy.ndarray.data``: it reads the array's data pointer (the first
 * field of numpy's PyArrayObject after the object head) into a new object whose ``ptr`` is it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *ptr;
} Ptr;

static PyMemberDef ptr_members[] = {
    {"ptr", T_OBJECT_EX, offsetof(Ptr, ptr), READONLY, "the device pointer (a host address)"},
    {NULL},
};

static void ptr_dealloc(Ptr *p) {
    Py_XDECREF(p->ptr);
    PyObject_Free(p);
}

static PyTypeObject PtrType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_cupy.MemoryPointer",
    .tp_basicsize = sizeof(Ptr),
    .tp_dealloc = (destructor)ptr_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_members = ptr_members,
};

typedef struct {
    PyObject_HEAD
    char *data;
} NpHead; /* numpy's PyArrayObject: its data pointer right after the head */

static PyObject *data_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    Ptr *p = PyObject_New(Ptr, &PtrType);
    if (p == NULL) return NULL;
    p->ptr = PyLong_FromVoidPtr(((NpHead *)obj)->data);
    if (p->ptr == NULL) {
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static PyTypeObject DataType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_cupy.DataDescriptor",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_descr_get = data_get,
};

PyObject *fake_data_descriptor(void) {
    if (PyType_Ready(&PtrType) < 0 || PyType_Ready(&DataType) < 0) return NULL;
    return PyObject_New(PyObject, &DataType);
}
