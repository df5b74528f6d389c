/* A device backend's launch and wait in C, as the eval loop (interactive/core/_loop.c) calls
 * them: one table per backend, handed over as a capsule named DEVICE_API_NAME by the
 * backend's ``device_api`` attribute (None: the backend has none, the loop calls its Python
 * hooks ``launch_fused`` and its events' ``wait``). MLX's loop calls its backend's
 * ``eval_gpu`` and waits on the stream's completion in C++ (mlx/transforms.cpp eval_impl,
 * mlx/backend/cuda/event.cu); this is the same contract for the loop in C.
 *
 * Both run with the GIL held (``wait`` releases it while it waits):
 *
 * - launch(plan, ins, n, out, index): the backend's loaded fused-call plan (what its
 *   ``compiled_launch`` returned) enqueued on the device stream of the mx stream ``index``,
 *   reading the device arrays ins[0..n) and writing ``out`` (a fresh buffer's view of the
 *   plan's dtype and shape, or a donated input's; for a plan of several outputs, a fused
 *   tape's, a tuple of one such array per output, in the tape's order). 1 launched; 0
 *   declined, nothing done (the loop then calls ``launch_fused`` with the same ``out``);
 *   -1 an error, set.
 * - wait(index): the host waits until everything enqueued on that stream so far has
 *   finished, and the stream is noted finished (its buffers free with no event). 1 done;
 *   0 declined, nothing done (the loop waits on the eval's event in Python); -1 error.
 */
#ifndef TAPESCOPE_DEVICE_API_H
#define TAPESCOPE_DEVICE_API_H
#include <Python.h>

#define DEVICE_API_NAME "tapescope.kernels.device_api"
#define DEVICE_API_ABI 1

typedef struct {
    int abi; /* DEVICE_API_ABI */
    int (*launch)(PyObject *plan, PyObject *const *ins, Py_ssize_t n, PyObject *out,
                  PyObject *index);
    int (*wait)(PyObject *index);
} DeviceApi;

#endif
