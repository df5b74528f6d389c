/* A buffer's typed view made in C (kernels/_handle.c view_c), for the eval loop's fresh
 * outputs (interactive/core/_loop.c buffer_view): handed over as a capsule named
 * VIEW_API_NAME, the _handle module's attribute VIEW_API_ATTR.
 *
 * - view(buf, nbytes, npdt, shape): the first nbytes of the buffer as a C-contiguous array
 *   of numpy dtype npdt and shape (a tuple), as the buffer's ``view`` method makes it, for a
 *   buffer type registered with _handle.view_form; NULL with no error set: not such a
 *   buffer (the caller calls the method); NULL with an error: it failed. GIL held.
 * - wrap(wrapper, raw): ``wrapper(raw)`` for a storage class of slots raw / shape / strides
 *   / data (a BF16Array over a device's uint16 array) made without its __init__, any other
 *   class by its constructor; a new reference, NULL with an error. GIL held.
 */
#ifndef TAPESCOPE_VIEW_API_H
#define TAPESCOPE_VIEW_API_H
#include <Python.h>

#define VIEW_API_NAME "tapescope.kernels._handle._view_api"
#define VIEW_API_ATTR "_view_api"
#define VIEW_API_ABI 2

typedef struct {
    int abi; /* VIEW_API_ABI */
    PyObject *(*view)(PyObject *buf, Py_ssize_t nbytes, PyObject *npdt, PyObject *shape);
    PyObject *(*wrap)(PyObject *wrapper, PyObject *raw);
} ViewApi;

#endif
