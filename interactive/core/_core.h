/* What core/_call.c and core/_loop.c share (one extension, tapescope.core._call): where a
 * Node's and an ArrayDesc's slots live, core's types, the interned names, and the helpers
 * that read and write slots. */
#ifndef TAPESCOPE_CORE_H
#define TAPESCOPE_CORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h> /* offsetof (Python 3.12's headers no longer include it) */
#include <stdint.h>
#if PY_VERSION_HEX < 0x030C0000 /* the member types' public names from 3.12 */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

/* where each slot lives in an instance: the slot's member descriptor's offset */
enum { N_PRIMITIVE, N_INPUTS, N_OUTPUTS, N_ID, N_EVENT, N_KEEP, N_BACKWARD, N_COUNT };
enum { D_SHAPE, D_DTYPE, D_STREAM, D_NODE, D_INDEX, D_DATA, D_BUFFER, D_TRACER, D_KEPT, D_COUNT };
extern Py_ssize_t node_off[N_COUNT], desc_off[D_COUNT];
extern PyObject *c_node_type, *c_desc_type; /* primitive.Node, array.ArrayDesc */

extern PyObject *s_enabled, *s__active, *s__d, *s_shape, *s_dtype, *s_name, *s_index, *s_lone,
    *s_plan, *s_single, *s_steps, *s_consts, *s_stream, *s_primitive, *s_inputs, *s_outputs,
    *s_id, *s_event, *s_keep, *s_node, *s_data, *s_buffer, *s_tracer, *s_kept;

/* the slot at ``off`` (borrowed; NULL when unset) */
#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* _call.c */
Py_ssize_t slot_offset(PyObject *type, const char *name);
int take_all(PyObject *kw, const char *who, const char *const *names, PyObject **const *slots,
             size_t n);
int core_offsets(PyObject *node_type, PyObject *desc_type);
void put(PyObject *obj, Py_ssize_t off, PyObject *v);
/* ``mod.name`` of a module from its dict (else its getattr); new ref (_call.c) */
PyObject *module_attr(PyObject *mod, PyObject *name);

/* _binary.c */
PyObject *configure_binary(PyObject *self, PyObject *kw);
PyObject *py_binary(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *install_operators(PyObject *self, PyObject *ops);
PyObject *py_scalar(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_primitive(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames);
/* Primitive(name, stream, **kw) (kw stolen, NULL: none) and a one-output node's desc or array
 * (record1: prim and descs stolen), the ops in C share them (after configure_binary) */
extern int binary_configured;
PyObject *new_primitive(PyObject *name, PyObject *stream, PyObject *kw);
PyObject *record1(PyObject *prim, PyObject *descs, PyObject *shape, PyObject *dtype, int handle);

/* _reduce.c */
PyObject *configure_reduce(PyObject *self, PyObject *kw);
PyObject *py_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_arg_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_last_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_softmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _layout.c */
PyObject *configure_layout(PyObject *self, PyObject *kw);
PyObject *configure_layout_methods(PyObject *self, PyObject *kw);

/* _fields.c */
PyObject *configure_fields(PyObject *self, PyObject *kw);
int fields_ready(void);           /* configure_fields ran */
PyObject *handle_of(PyObject *d); /* a new array handle on the desc d (new ref) */

/* _products.c */
PyObject *configure_products(PyObject *self, PyObject *kw);
PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_addmm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *install_matmul(PyObject *self, PyObject *op);

/* _autodiff.c */
PyObject *configure_autodiff(PyObject *self, PyObject *kw);
PyObject *vjp_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *vjp_mark(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _stream.c */
PyObject *configure_stream(PyObject *self, PyObject *kw);
PyObject *resolve_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* a stack of owned references and a set of pointers, small ones without an allocation
 * (_loop.c; topo_order's and autodiff's walks) */
#define SMALL_STACK 32
#define SMALL_SET 64
typedef struct { PyObject **items; Py_ssize_t n, cap; PyObject *small[SMALL_STACK]; } Stack;
typedef struct { void **slots; size_t cap, n; void *small[SMALL_SET]; } PtrSet;
int stack_push(Stack *s, PyObject *o); /* a new reference pushed; -1: no memory */
int set_add(PtrSet *s, void *p);       /* 1 added, 0 there already, -1 no memory */
int set_has(PtrSet *s, void *p);

/* _loop.c */
PyObject *configure_loop(PyObject *self, PyObject *kw);
PyObject *configure_eager(PyObject *self, PyObject *kw);
PyObject *run_node(PyObject *self, PyObject *node);
PyObject *topo_order(PyObject *self, PyObject *descs);
PyObject *py_eager_eval(PyObject *self, PyObject *descs);
int eager_eval(PyObject *descs);
extern int eager_configured;

#endif
