/* Reverse mode's walk in C: autodiff/engine.py's ``_reverse_py`` (``_tape`` over
 * walk.topological, then ``_walk_back``) and ``_mark_py``, the same steps in the same order.
 *
 * ``vjp_walk(outputs, primals, active, cmap, state)``: the tape between the ``primals``
 * (ArrayDescs; ``active``: those differentiated) and the ``outputs`` (ArrayDescs), walked
 * depth first through the graphs evaluated tracers keep (``kept``), a primal's node cut, a
 * StopGradient ending a path; the primals, the leaves and every walked output stop being
 * tracers. Then the tape backwards: each node with a cotangent in ``cmap`` ({desc: array},
 * seeded by the caller, grown and emptied in place) has its definition's VJP rule called
 * (Python: the rules stay in autodiff/) under ``state.retain`` (MLX's RetainGraph), each
 * input cotangent cast to its input's dtype (a bool input keeps it) and summed (``add``)
 * into ``cmap``. Errors (no VJP, a rule's wrong count) are engine.py's own, raised by its
 * helpers.
 *
 * ``vjp_mark(grads, start)``: ``Node.backward`` set on the nodes above the arrays ``grads``
 * whose ids are ``start`` or more, the walk stopping at an older node. */
#include "_core.h"

static int ad_configured = 0;
static PyObject *ad_add, *ad_astype, *ad_bool, *ad_released, *ad_zeros_like, *ad_no_vjp,
    *ad_check_vjp, *ad_array_type, *ad_prim_type, *ad_defn_type;
static Py_ssize_t ad_defn_off, ad_kw_off, ad_vjp_off, ad_stops_off, ad_d_off;
static PyObject *s_retain, *s_dict;

PyObject *configure_autodiff(PyObject *self, PyObject *kw) {
    static const char *const names[] = {"add", "astype", "bool", "released", "zeros_like",
                                        "no_vjp", "check_vjp", "array_type", "primitive_type",
                                        "definition_type"};
    PyObject **const slots[] = {&ad_add, &ad_astype, &ad_bool, &ad_released, &ad_zeros_like,
                                &ad_no_vjp, &ad_check_vjp, &ad_array_type, &ad_prim_type,
                                &ad_defn_type};
    if (c_node_type == NULL || c_desc_type == NULL || !fields_ready()) {
        PyErr_SetString(PyExc_TypeError, "configure_autodiff after configure_record and "
                                         "configure_fields");
        return NULL;
    }
    if (take_all(kw, "configure_autodiff", names, slots, sizeof(names) / sizeof(names[0])) < 0)
        return NULL;
    if ((ad_defn_off = slot_offset(ad_prim_type, "defn")) < 0 ||
        (ad_kw_off = slot_offset(ad_prim_type, "kw")) < 0 ||
        (ad_vjp_off = slot_offset(ad_defn_type, "vjp")) < 0 ||
        (ad_stops_off = slot_offset(ad_defn_type, "stops_gradient")) < 0 ||
        (ad_d_off = slot_offset(ad_array_type, "_d")) < 0)
        return NULL;
    if (s_retain == NULL && (s_retain = PyUnicode_InternFromString("retain")) == NULL)
        return NULL;
    ad_configured = 1;
    Py_RETURN_NONE;
}

/* the desc's node, or (a tracer evaluated inside a transformation) the node it keeps;
 * borrowed, NULL: none */
static PyObject *node_or_kept(PyObject *d) {
    PyObject *n = SLOT(d, desc_off[D_NODE]);
    if (n == NULL || n == Py_None) n = SLOT(d, desc_off[D_KEPT]);
    return n == NULL || n == Py_None ? NULL : n;
}

/* the node's live outputs (descs) as a new list */
static PyObject *live_outputs(PyObject *node) {
    PyObject *refs = SLOT(node, node_off[N_OUTPUTS]);
    if (refs == NULL || !PyList_Check(refs)) {
        PyErr_SetString(PyExc_TypeError, "vjp_walk: a node's outputs are a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(refs);
    PyObject *outs = PyList_New(0);
    for (Py_ssize_t i = 0; outs != NULL && i < n; i++) {
        PyObject *o = PyWeakref_GetObject(PyList_GET_ITEM(refs, i));
        if (o == NULL) Py_CLEAR(outs);
        else if (o != Py_None && PyList_Append(outs, o) < 0) Py_CLEAR(outs);
    }
    return outs;
}

static PyObject *defn_of(PyObject *node) {
    PyObject *prim = SLOT(node, node_off[N_PRIMITIVE]);
    if (prim == NULL || !PyObject_TypeCheck(prim, (PyTypeObject *)ad_prim_type)) {
        PyErr_SetString(PyExc_TypeError, "vjp_walk: a node's primitive expected");
        return NULL;
    }
    PyObject *defn = SLOT(prim, ad_defn_off);
    if (defn == NULL || !PyObject_TypeCheck(defn, (PyTypeObject *)ad_defn_type)) {
        PyErr_SetString(PyExc_TypeError, "vjp_walk: a primitive's definition expected");
        return NULL;
    }
    return defn;
}

/* walk.topological(outputs, cut=primals, leaf=..., kept=True) with _tape's steps folded
 * in: the tape (a new list) of the nodes with an active input; ``keep`` gets every walked
 * output (they own the active set's pointers) */
static PyObject *build_tape(PyObject *outputs, PtrSet *cut, PtrSet *active, PyObject *keep) {
    PyObject *tape = PyList_New(0);
    Stack st;
    PtrSet seen;
    st.items = NULL, st.n = st.cap = 0;
    seen.slots = NULL, seen.cap = seen.n = 0;
    if (tape == NULL) return NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(outputs); k++) {
        if (stack_push(&st, PyList_GET_ITEM(outputs, k)) < 0) goto fail;
        while (st.n) {
            PyObject *item = st.items[--st.n]; /* owned */
            if ((PyObject *)Py_TYPE(item) == c_node_type) { /* its inputs are done: _tape's step */
                PyObject *node = item, *outs = live_outputs(node);
                if (outs == NULL) { Py_DECREF(node); goto fail; }
                Py_ssize_t no = PyList_GET_SIZE(outs);
                for (Py_ssize_t i = 0; i < no; i++)
                    put(PyList_GET_ITEM(outs, i), desc_off[D_TRACER], Py_False);
                PyObject *defn = defn_of(node);
                PyObject *stops = defn ? SLOT(defn, ad_stops_off) : NULL;
                int stop = stops == NULL ? -1 : PyObject_IsTrue(stops);
                if (stop < 0) { Py_DECREF(outs); Py_DECREF(node); goto fail; }
                PyObject *ins = SLOT(node, node_off[N_INPUTS]);
                int hit = 0;
                if (!stop && ins != NULL && PyList_Check(ins))
                    for (Py_ssize_t i = 0; !hit && i < PyList_GET_SIZE(ins); i++)
                        hit = set_has(active, PyList_GET_ITEM(ins, i));
                int rc = 0;
                if (hit) {
                    rc = PyList_Append(tape, node);
                    for (Py_ssize_t i = 0; rc == 0 && i < no; i++)
                        if (set_add(active, PyList_GET_ITEM(outs, i)) < 0) rc = -1;
                    if (rc == 0) rc = PyList_SetSlice(keep, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, outs);
                }
                Py_DECREF(outs);
                Py_DECREF(node);
                if (rc < 0) goto fail;
                continue;
            }
            if ((PyObject *)Py_TYPE(item) != c_desc_type) {
                Py_DECREF(item);
                PyErr_SetString(PyExc_TypeError, "vjp_walk: an ArrayDesc expected");
                goto fail;
            }
            PyObject *node = node_or_kept(item);
            if (node == NULL) { /* a leaf: no longer a tracer */
                put(item, desc_off[D_TRACER], Py_False);
                Py_DECREF(item);
                continue;
            }
            int added = set_add(&seen, node);
            int is_cut = added > 0 && set_has(cut, item);
            Py_INCREF(node);
            Py_DECREF(item);
            if (added <= 0 || is_cut) { Py_DECREF(node); if (added < 0) goto fail; continue; }
            int pushed = stack_push(&st, node);
            PyObject *inputs = SLOT(node, node_off[N_INPUTS]);
            Py_DECREF(node); /* (the stack holds it) */
            if (pushed < 0) goto fail;
            if (inputs == NULL || !PyList_Check(inputs)) {
                PyErr_SetString(PyExc_TypeError, "vjp_walk: a node's inputs are a list");
                goto fail;
            }
            for (Py_ssize_t i = PyList_GET_SIZE(inputs) - 1; i >= 0; i--) {
                PyObject *x = PyList_GET_ITEM(inputs, i);
                PyObject *n = node_or_kept(x);
                if ((n == NULL || !set_has(&seen, n)) && stack_push(&st, x) < 0) goto fail;
            }
        }
    }
    goto done;
fail:
    Py_CLEAR(tape);
done:
    while (st.n) Py_DECREF(st.items[--st.n]);
    if (st.items != st.small) PyMem_Free(st.items);
    if (seen.slots != seen.small) PyMem_Free(seen.slots);
    return tape;
}

/* the walk's state: the object (``transform_tracers._state()``, this thread's
 * threading.local) and its attributes' dict where it has one (a local's is this thread's:
 * read and written there, without the local's getattr) */
typedef struct { PyObject *obj, *dict; } State;

static PyObject *state_get(State *st, PyObject *name) { /* new ref */
    if (st->dict == NULL) return PyObject_GetAttr(st->obj, name);
    PyObject *v = PyDict_GetItemWithError(st->dict, name);
    if (v == NULL && !PyErr_Occurred()) return PyObject_GetAttr(st->obj, name); /* (its error) */
    return Py_XNewRef(v);
}

/* state.retain += delta */
static int bump_retain(State *st, long delta) {
    PyObject *r = state_get(st, s_retain);
    if (r == NULL) return -1;
    PyObject *d = PyLong_FromLong(delta), *v = d ? PyNumber_Add(r, d) : NULL;
    Py_DECREF(r);
    Py_XDECREF(d);
    if (v == NULL) return -1;
    int rc = st->dict ? PyDict_SetItem(st->dict, s_retain, v) : PyObject_SetAttr(st->obj, s_retain, v);
    Py_DECREF(v);
    return rc;
}

/* a cotangent's desc's dtype (borrowed), an array expected */
static PyObject *cot_dtype(PyObject *g) {
    PyObject *d = PyObject_TypeCheck(g, (PyTypeObject *)ad_array_type) ? SLOT(g, ad_d_off) : NULL;
    if (d == NULL || (PyObject *)Py_TYPE(d) != c_desc_type) {
        PyObject *dd = PyObject_GetAttr(g, s__d); /* (its error: not an array) */
        if (dd == NULL) return NULL;
        Py_DECREF(dd);
        PyErr_SetString(PyExc_TypeError, "vjp_walk: a cotangent's _d is an ArrayDesc");
        return NULL;
    }
    return SLOT(d, desc_off[D_DTYPE]);
}

/* one tape node backwards (_walk_back's loop body); 0, or -1 with an error */
static int node_back(PyObject *node, PyObject *cmap, PtrSet *active, State *state) {
    PyObject *outs = live_outputs(node), *cots = NULL, *ins_h = NULL, *outs_h = NULL,
             *args = NULL, *vjps = NULL, *call = NULL;
    int rc = -1;
    if (outs == NULL) return -1;
    PyObject *refs = SLOT(node, node_off[N_OUTPUTS]);
    Py_ssize_t nrefs = PyList_GET_SIZE(refs), no = PyList_GET_SIZE(outs);
    int any = 0;
    for (Py_ssize_t i = 0; !any && i < no; i++) {
        any = PyDict_Contains(cmap, PyList_GET_ITEM(outs, i));
        if (any < 0) goto done;
    }
    if (!any) { rc = 0; goto done; }
    /* the cotangents and output handles, one per output reference (a dead output: None) */
    cots = PyList_New(nrefs);
    outs_h = PyList_New(nrefs);
    if (cots == NULL || outs_h == NULL) goto done;
    for (Py_ssize_t i = 0; i < nrefs; i++) {
        PyObject *o = PyWeakref_GetObject(PyList_GET_ITEM(refs, i)), *c, *h;
        if (o == NULL) goto done;
        if (o == Py_None) {
            c = Py_NewRef(Py_None), h = Py_NewRef(Py_None);
        } else {
            Py_INCREF(o);
            c = PyDict_GetItemWithError(cmap, o);
            if (c != NULL) {
                Py_INCREF(c);
                if (PyDict_DelItem(cmap, o) < 0) { Py_DECREF(c); c = NULL; }
            } else if (!PyErr_Occurred()) {
                c = PyObject_CallOneArg(ad_zeros_like, o);
            }
            h = c ? handle_of(o) : NULL;
            Py_DECREF(o);
            if (c == NULL || h == NULL) { Py_XDECREF(c); goto done; }
        }
        PyList_SET_ITEM(cots, i, c);
        PyList_SET_ITEM(outs_h, i, h);
    }
    PyObject *ins = SLOT(node, node_off[N_INPUTS]);
    if (ins == NULL || !PyList_Check(ins)) {
        PyErr_SetString(PyExc_TypeError, "vjp_walk: a node's inputs are a list");
        goto done;
    }
    Py_ssize_t ni = PyList_GET_SIZE(ins);
    ins_h = PyList_New(ni);
    args = PyList_New(0);
    if (ins_h == NULL || args == NULL) goto done;
    for (Py_ssize_t i = 0; i < ni; i++) {
        PyObject *x = PyList_GET_ITEM(ins, i), *h = handle_of(x);
        if (h == NULL) goto done;
        PyList_SET_ITEM(ins_h, i, h);
        if (set_has(active, x)) {
            PyObject *k = PyLong_FromSsize_t(i);
            int bad = k == NULL || PyList_Append(args, k) < 0;
            Py_XDECREF(k);
            if (bad) goto done;
        }
    }
    PyObject *prim = SLOT(node, node_off[N_PRIMITIVE]), *defn = defn_of(node);
    if (defn == NULL) goto done;
    PyObject *rule = SLOT(defn, ad_vjp_off);
    if (rule == NULL || rule == Py_None) {
        PyObject *r = PyObject_CallOneArg(ad_no_vjp, prim); /* raises engine.py's error */
        Py_XDECREF(r);
        if (r != NULL) PyErr_SetString(PyExc_RuntimeError, "vjp_walk: no_vjp returned");
        goto done;
    }
    PyObject *kw = SLOT(prim, ad_kw_off); /* (**prim.kw; none: no keywords) */
    if (kw == Py_None || (kw != NULL && PyDict_Check(kw) && PyDict_GET_SIZE(kw) == 0)) kw = NULL;
    if (kw != NULL && !PyDict_Check(kw)) {
        PyErr_SetString(PyExc_TypeError, "vjp_walk: a primitive's kw is a dict");
        goto done;
    }
    call = PyTuple_Pack(4, ins_h, cots, args, outs_h);
    if (call == NULL || bump_retain(state, 1) < 0) goto done;
    vjps = PyObject_Call(rule, call, kw); /* MLX's RetainGraph around Primitive::vjp */
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int ok = bump_retain(state, -1) == 0;
        PyObject *kept = ok ? state_get(state, s_kept) : NULL;
        int truth = kept ? PyObject_IsTrue(kept) : -1;
        Py_XDECREF(kept);
        if (truth > 0) {
            PyObject *r = PyObject_CallOneArg(ad_released, state->obj);
            if (r == NULL) truth = -1;
            Py_XDECREF(r);
        }
        if (et != NULL) { /* the rule's error wins */
            PyErr_Clear();
            PyErr_Restore(et, ev, tb);
            goto done;
        }
        if (truth < 0) goto done;
    }
    if (vjps == NULL) goto done;
    if (!PyList_CheckExact(vjps)) {
        PyObject *l = PySequence_List(vjps);
        Py_SETREF(vjps, l);
        if (vjps == NULL) goto done;
    }
    Py_ssize_t na = PyList_GET_SIZE(args);
    if (PyList_GET_SIZE(vjps) != na) {
        PyObject *r = PyObject_CallFunctionObjArgs(ad_check_vjp, node, args, vjps, NULL);
        Py_XDECREF(r);
        if (r != NULL) PyErr_SetString(PyExc_RuntimeError, "vjp_walk: check_vjp returned");
        goto done;
    }
    for (Py_ssize_t k = 0; k < na; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(args, k));
        PyObject *x = PyList_GET_ITEM(ins, i), *g = Py_NewRef(PyList_GET_ITEM(vjps, k));
        PyObject *gdt = cot_dtype(g);
        PyObject *xdt = (PyObject *)Py_TYPE(x) == c_desc_type ? SLOT(x, desc_off[D_DTYPE]) : NULL;
        if (gdt == NULL || xdt == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "vjp_walk: a node's inputs are ArrayDescs");
            Py_DECREF(g);
            goto done;
        }
        /* a bool input keeps the cotangent's own type (MLX casts none) */
        if (gdt != xdt && xdt != ad_bool) {
            Py_SETREF(g, PyObject_CallFunctionObjArgs(ad_astype, g, xdt, NULL));
            if (g == NULL) goto done;
        }
        PyObject *prev = PyDict_GetItemWithError(cmap, x);
        if (prev != NULL) {
            Py_SETREF(g, PyObject_CallFunctionObjArgs(ad_add, prev, g, NULL));
            if (g == NULL) goto done;
        } else if (PyErr_Occurred()) {
            Py_DECREF(g);
            goto done;
        }
        int bad = PyDict_SetItem(cmap, x, g) < 0;
        Py_DECREF(g);
        if (bad) goto done;
    }
    rc = 0;
done:
    Py_XDECREF(outs);
    Py_XDECREF(cots);
    Py_XDECREF(outs_h);
    Py_XDECREF(ins_h);
    Py_XDECREF(args);
    Py_XDECREF(vjps);
    Py_XDECREF(call);
    return rc;
}

PyObject *vjp_walk(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!ad_configured || nargs != 5 || !PyList_Check(a[0]) || !PyList_Check(a[1]) ||
        !PyList_Check(a[2]) || !PyDict_Check(a[3])) {
        PyErr_SetString(PyExc_TypeError, "vjp_walk(outputs, primals, active, cmap, state): "
                                         "lists of ArrayDescs, a dict, once configured");
        return NULL;
    }
    PyObject *outputs = a[0], *primals = a[1], *active0 = a[2], *cmap = a[3];
    State state = {a[4], NULL};
    PyObject *keep = PyList_New(0), *tape = NULL, *result = NULL;
    if (s_dict == NULL && (s_dict = PyUnicode_InternFromString("__dict__")) == NULL) return NULL;
    state.dict = PyObject_GetAttr(state.obj, s_dict);
    if (state.dict == NULL || !PyDict_Check(state.dict)) { PyErr_Clear(); Py_CLEAR(state.dict); }
    PtrSet cut, active;
    cut.slots = NULL, cut.cap = cut.n = 0;
    active.slots = NULL, active.cap = active.n = 0;
    if (keep == NULL || PyList_SetSlice(keep, 0, 0, primals) < 0 ||
        PyList_SetSlice(keep, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, active0) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(primals); i++)
        if (set_add(&cut, PyList_GET_ITEM(primals, i)) < 0) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(active0); i++)
        if (set_add(&active, PyList_GET_ITEM(active0, i)) < 0) goto done;
    tape = build_tape(outputs, &cut, &active, keep);
    if (tape == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(primals); i++) { /* (transform_tracers.untrace) */
        PyObject *d = PyList_GET_ITEM(primals, i);
        if ((PyObject *)Py_TYPE(d) == c_desc_type) put(d, desc_off[D_TRACER], Py_False);
        else if (PyObject_SetAttr(d, s_tracer, Py_False) < 0) goto done;
    }
    for (Py_ssize_t k = PyList_GET_SIZE(tape) - 1; k >= 0; k--)
        if (node_back(PyList_GET_ITEM(tape, k), cmap, &active, &state) < 0) goto done;
    result = Py_NewRef(Py_None);
done:
    if (cut.slots != cut.small) PyMem_Free(cut.slots);
    if (active.slots != active.small) PyMem_Free(active.slots);
    Py_XDECREF(tape);
    Py_XDECREF(keep);
    Py_XDECREF(state.dict);
    return result;
}

PyObject *vjp_mark(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!ad_configured || nargs != 2 || !PyList_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "vjp_mark(grads, start): a list of arrays, an int");
        return NULL;
    }
    long long start = PyLong_AsLongLong(a[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Stack st;
    PtrSet seen;
    st.items = NULL, st.n = st.cap = 0;
    seen.slots = NULL, seen.cap = seen.n = 0;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(a[0]); i++) {
        PyObject *g = PyList_GET_ITEM(a[0], i);
        PyObject *d = PyObject_TypeCheck(g, (PyTypeObject *)ad_array_type) ? SLOT(g, ad_d_off)
                                                                           : NULL;
        if (d == NULL) {
            PyErr_SetString(PyExc_TypeError, "vjp_mark: arrays expected");
            goto done;
        }
        if (stack_push(&st, d) < 0) goto done;
    }
    while (st.n) {
        PyObject *d = st.items[--st.n]; /* owned */
        PyObject *node = (PyObject *)Py_TYPE(d) == c_desc_type ? SLOT(d, desc_off[D_NODE]) : NULL;
        if (node == NULL || node == Py_None) { Py_DECREF(d); continue; }
        Py_INCREF(node);
        Py_DECREF(d);
        PyObject *id = SLOT(node, node_off[N_ID]);
        long long nid = id ? PyLong_AsLongLong(id) : -1;
        if (nid == -1 && PyErr_Occurred()) { Py_DECREF(node); goto done; }
        int added = nid < start ? 0 : set_add(&seen, node);
        if (added <= 0) { Py_DECREF(node); if (added < 0) goto done; continue; }
        put(node, node_off[N_BACKWARD], Py_True);
        PyObject *ins = SLOT(node, node_off[N_INPUTS]);
        int bad = 0;
        if (ins != NULL && PyList_Check(ins))
            for (Py_ssize_t i = 0; !bad && i < PyList_GET_SIZE(ins); i++)
                bad = stack_push(&st, PyList_GET_ITEM(ins, i)) < 0;
        Py_DECREF(node);
        if (bad) goto done;
    }
    result = Py_NewRef(Py_None);
done:
    while (st.n) Py_DECREF(st.items[--st.n]);
    if (st.items != st.small) PyMem_Free(st.items);
    if (seen.slots != seen.small) PyMem_Free(seen.slots);
    return result;
}
