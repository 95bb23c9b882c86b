/* The probe schedule's due rows in C: `Plan` holds the state of a `prober.schedule.ProbePlan`
 * (`ProbePlan.compile` moves it here) and draws exactly what the Python plan draws.
 *
 * Included by _fastpath.c after _fastbatch.h (it queues into engines as `queue_rows` does).
 * Python's plan keeps, per stream, a `random.Random` (MT19937), its anchor, its probe count `k`
 * and the rest of its current port sweep; a heap of (time, stream). Here the same: each
 * stream's generator continues from `Random.getstate()` with CPython's own MT19937
 * (`_randommodule.c` genrand_uint32), `random()` is CPython's 53-bit double, a sweep's shuffle
 * is `Random.shuffle` (`_randbelow_with_getrandbits`: getrandbits(n.bit_length()) until < n),
 * the jitter is `int((random() * 2.0 - 1.0) * jitter * period)` in the same double operations,
 * and (time, stream) entries are unique, so any heap pops them in the one order. `prober.
 * schedule.ProbePlan.compile` checks these draws against the running Python's `random` once
 * before it hands a plan over (`draws`), and keeps the Python plan if they differ.
 *
 * `queue_plan` pops the due rows straight into the engines (what `due_rows` then `queue_rows`
 * did, without a Python tuple per row). */

#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t mt[MT_N];
    int idx;
} MT;

static uint32_t mt_next(MT *r) {
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    uint32_t y, *mt = r->mt;
    if (r->idx >= MT_N) {
        int kk;
        for (kk = 0; kk < MT_N - MT_M; kk++) {
            y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
            mt[kk] = mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 0x1U];
        }
        for (; kk < MT_N - 1; kk++) {
            y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
            mt[kk] = mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 0x1U];
        }
        y = (mt[MT_N - 1] & 0x80000000U) | (mt[0] & 0x7fffffffU);
        mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 0x1U];
        r->idx = 0;
    }
    y = mt[r->idx++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

/* random.Random.random(): 53 random bits as a double in [0, 1). */
static double mt_random(MT *r) {
    uint32_t a = mt_next(r) >> 5, b = mt_next(r) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

/* random.Random._randbelow_with_getrandbits(n), 2 <= n < 2**32. */
static uint32_t mt_below(MT *r, uint32_t n) {
    int k = 0;
    for (uint32_t v = n; v; v >>= 1) k++; /* n.bit_length() */
    uint32_t x = mt_next(r) >> (32 - k);
    while (x >= n) x = mt_next(r) >> (32 - k);
    return x;
}

/* random.Random.shuffle(x). */
static void mt_shuffle(MT *r, uint16_t *x, int n) {
    for (int i = n - 1; i >= 1; i--) {
        uint32_t j = mt_below(r, (uint32_t)i + 1);
        uint16_t t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

/* `Random.getstate()[1]` (624 words and the index) -> MT; -1 with an error set. */
static int mt_from_state(MT *r, PyObject *state) {
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != MT_N + 1) {
        PyErr_SetString(PyExc_ValueError, "a generator state is 625 ints (Random.getstate()[1])");
        return -1;
    }
    for (int i = 0; i < MT_N; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(state, i));
        if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
        if (v > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "generator state words are 32-bit");
            return -1;
        }
        r->mt[i] = (uint32_t)v;
    }
    long idx = PyLong_AsLong(PyTuple_GET_ITEM(state, MT_N));
    if (idx == -1 && PyErr_Occurred()) return -1;
    if (idx < 0 || idx > MT_N) {
        PyErr_SetString(PyExc_ValueError, "bad generator state index");
        return -1;
    }
    r->idx = (int)idx;
    return 0;
}

static PyObject *mt_to_state(const MT *r) {
    PyObject *t = PyTuple_New(MT_N + 1);
    if (!t) return NULL;
    for (int i = 0; i <= MT_N; i++) {
        PyObject *v = i < MT_N ? PyLong_FromUnsignedLong(r->mt[i]) : PyLong_FromLong(r->idx);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* draws(state, floats, shuffle_len) -> ([random() x floats], shuffled list(range(shuffle_len)),
 * the state after): the generator alone, for `ProbePlan.compile`'s check against `random`. */
static PyObject *py_draws(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *state;
    Py_ssize_t nf, ns;
    if (!PyArg_ParseTuple(args, "O!nn", &PyTuple_Type, &state, &nf, &ns)) return NULL;
    if (nf < 0 || ns < 0 || ns > 65536) {
        PyErr_SetString(PyExc_ValueError, "0 <= floats, 0 <= shuffle_len <= 65536");
        return NULL;
    }
    MT r;
    if (mt_from_state(&r, state) < 0) return NULL;
    PyObject *floats = PyList_New(nf), *perm = NULL, *after = NULL;
    if (!floats) return NULL;
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *f = PyFloat_FromDouble(mt_random(&r));
        if (!f) goto fail;
        PyList_SET_ITEM(floats, i, f);
    }
    uint16_t *x = PyMem_Malloc((size_t)(ns ? ns : 1) * sizeof(uint16_t));
    if (!x) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < ns; i++) x[i] = (uint16_t)i;
    mt_shuffle(&r, x, (int)ns);
    perm = PyList_New(ns);
    for (Py_ssize_t i = 0; perm && i < ns; i++) {
        PyObject *v = PyLong_FromLong(x[i]);
        if (!v) Py_CLEAR(perm);
        else PyList_SET_ITEM(perm, i, v);
    }
    PyMem_Free(x);
    if (!perm || !(after = mt_to_state(&r))) goto fail;
    return Py_BuildValue("(NNN)", floats, perm, after);

fail:
    Py_XDECREF(floats);
    Py_XDECREF(perm);
    return NULL;
}

typedef struct {
    MT rng;
    int64_t anchor, k;
    int src;                  /* index of the source NIC's port set */
    int norder;               /* ports left in this sweep: order[0..norder) */
    uint16_t *order;          /* capacity: the source NIC's port count */
    /* where `queue_plan` queues this stream (`set_targets`) */
    int has_target;
    Py_ssize_t slot;
    int32_t dst;
    uint64_t dst_hash;
    struct sockaddr_in dest;
} PStream;

typedef struct {
    int64_t at;
    Py_ssize_t i;
} PEnt;

typedef struct {
    PyObject_HEAD
    int64_t period;
    double jitter;
    int nsrc;
    uint16_t **ports;         /* per source NIC: its port set, in the plan's order */
    int *nports;
    PStream *st;
    Py_ssize_t ns;
    PEnt *heap;
    Py_ssize_t hn;
} Plan;

static inline int pless(const PEnt *a, const PEnt *b) {
    return a->at < b->at || (a->at == b->at && a->i < b->i);
}

static void plan_sift_down(Plan *p, Py_ssize_t i) {
    PEnt x = p->heap[i];
    Py_ssize_t n = p->hn;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        const PEnt *best = &x;
        if (l < n && pless(&p->heap[l], best)) { m = l; best = &p->heap[l]; }
        if (r < n && pless(&p->heap[r], best)) m = r;
        if (m == i) break;
        p->heap[i] = p->heap[m];
        i = m;
    }
    p->heap[i] = x;
}

/* Take the next due row (at <= now) into *at, *stream, *sport: 1; nothing due: 0; -1 with an
 * error set (a source NIC without ports, as `list.pop` of an empty list raises). */
static int plan_take(Plan *p, int64_t now, int64_t *at, Py_ssize_t *stream, int *sport) {
    if (!p->hn || p->heap[0].at > now) return 0;
    PEnt top = p->heap[0];
    PStream *s = &p->st[top.i];
    if (!s->norder) {
        int n = p->nports[s->src];
        if (!n) {
            PyErr_SetString(PyExc_IndexError, "pop from empty list");
            return -1;
        }
        memcpy(s->order, p->ports[s->src], (size_t)n * sizeof(uint16_t));
        mt_shuffle(&s->rng, s->order, n);
        s->norder = n;
    }
    *at = top.at;
    *stream = top.i;
    *sport = s->order[--s->norder];
    int64_t k = ++s->k;
    double r = mt_random(&s->rng);
    double j = r * 2.0;
    j = j - 1.0;
    j = j * p->jitter;
    j = j * (double)p->period;
    int64_t nxt = s->anchor + k * p->period + (int64_t)j;
    p->heap[0].at = nxt > top.at ? nxt : top.at + 1;
    plan_sift_down(p, 0);
    return 1;
}

/* Copy the ints of `seq` (a PySequence_Fast) into `out` as source ports: their count, or -1
 * with an error set (not an int, or outside [0, 65535]). */
static Py_ssize_t copy_ports(PyObject *seq, uint16_t *out) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t j = 0; j < n; j++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if ((v == -1 && PyErr_Occurred()) || v < 0 || v > 65535) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad source port");
            return -1;
        }
        out[j] = (uint16_t)v;
    }
    return n;
}

static void Plan_free_arrays(Plan *p) {
    for (Py_ssize_t i = 0; p->st && i < p->ns; i++) PyMem_Free(p->st[i].order);
    for (int i = 0; p->ports && i < p->nsrc; i++) PyMem_Free(p->ports[i]);
    PyMem_Free(p->st);
    PyMem_Free(p->ports);
    PyMem_Free(p->nports);
    PyMem_Free(p->heap);
    p->st = NULL;
    p->ports = NULL;
    p->nports = NULL;
    p->heap = NULL;
    p->ns = p->hn = 0;
    p->nsrc = 0;
}

/* Plan(period_ns, jitter, ports, streams, heap): `ports` one sequence of source ports per source
 * NIC; `streams` (src index, anchor, k, Random.getstate()[1], the sweep's remaining ports in
 * pop order: the last is next); `heap` the (time, stream) entries. */
static int Plan_init(Plan *p, PyObject *args, PyObject *kw) {
    long long period;
    double jitter;
    PyObject *ports, *streams, *heap;
    if (!PyArg_ParseTuple(args, "LdO!O!O!", &period, &jitter, &PyList_Type, &ports, &PyList_Type,
                          &streams, &PyList_Type, &heap))
        return -1;
    if (period <= 0) {
        PyErr_SetString(PyExc_ValueError, "period_ns must be positive");
        return -1;
    }
    Plan_free_arrays(p);
    p->period = period;
    p->jitter = jitter;
    Py_ssize_t nsrc = PyList_GET_SIZE(ports), ns = PyList_GET_SIZE(streams);
    Py_ssize_t hn = PyList_GET_SIZE(heap);
    if (nsrc > 65536 || ns > (1 << 24) || hn > ns) {
        PyErr_SetString(PyExc_ValueError, "too many source NICs or streams, or heap entries");
        return -1;
    }
    p->ports = PyMem_Calloc((size_t)(nsrc ? nsrc : 1), sizeof(uint16_t *));
    p->nports = PyMem_Calloc((size_t)(nsrc ? nsrc : 1), sizeof(int));
    p->st = PyMem_Calloc((size_t)(ns ? ns : 1), sizeof(PStream));
    p->heap = PyMem_Calloc((size_t)(hn ? hn : 1), sizeof(PEnt));
    if (!p->ports || !p->nports || !p->st || !p->heap) {
        PyErr_NoMemory();
        goto fail;
    }
    p->nsrc = (int)nsrc;
    p->ns = ns;
    for (Py_ssize_t i = 0; i < nsrc; i++) {
        PyObject *seq = PySequence_Fast(PyList_GET_ITEM(ports, i), "ports are sequences of ints");
        if (!seq) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        p->ports[i] = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
        if (!p->ports[i] || n > 65536) {
            Py_DECREF(seq);
            if (p->ports[i]) PyErr_SetString(PyExc_ValueError, "too many ports");
            else PyErr_NoMemory();
            goto fail;
        }
        p->nports[i] = (int)n;
        Py_ssize_t got = copy_ports(seq, p->ports[i]);
        Py_DECREF(seq);
        if (got < 0) goto fail;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        PStream *s = &p->st[i];
        int src;
        long long anchor, k;
        PyObject *state, *order;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(streams, i),
                              "iLLO!O;streams are (src, anchor, k, rng state, order)", &src,
                              &anchor, &k, &PyTuple_Type, &state, &order))
            goto fail;
        if (src < 0 || src >= p->nsrc) {
            PyErr_SetString(PyExc_ValueError, "no such source NIC");
            goto fail;
        }
        s->src = src;
        s->anchor = anchor;
        s->k = k;
        if (mt_from_state(&s->rng, state) < 0) goto fail;
        s->order = PyMem_Malloc((size_t)(p->nports[src] ? p->nports[src] : 1) * sizeof(uint16_t));
        if (!s->order) {
            PyErr_NoMemory();
            goto fail;
        }
        PyObject *seq = PySequence_Fast(order, "a stream's order is a sequence of ints");
        if (!seq) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > p->nports[src]) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a stream's order is longer than its port set");
            goto fail;
        }
        Py_ssize_t got = copy_ports(seq, s->order);
        Py_DECREF(seq);
        if (got < 0) goto fail;
        s->norder = (int)n;
    }
    for (Py_ssize_t h = 0; h < hn; h++) {
        long long at;
        Py_ssize_t i;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(heap, h), "Ln;heap entries are (at_ns, stream)",
                              &at, &i))
            goto fail;
        if (i < 0 || i >= ns) {
            PyErr_SetString(PyExc_ValueError, "heap entry of no stream");
            goto fail;
        }
        p->heap[h].at = at;
        p->heap[h].i = i;
    }
    p->hn = hn;
    for (Py_ssize_t h = hn / 2; h-- > 0;) plan_sift_down(p, h);
    return 0;

fail:
    Plan_free_arrays(p);
    return -1;
}

static void Plan_dealloc(Plan *p) {
    Plan_free_arrays(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Plan_next_at(Plan *p, PyObject *Py_UNUSED(ignored)) {
    if (!p->hn) Py_RETURN_NONE;
    return PyLong_FromLongLong(p->heap[0].at);
}

/* due_rows(now_ns) -> [(at_ns, stream, sport)]: `ProbePlan.due_rows`. */
static PyObject *Plan_due_rows(Plan *p, PyObject *arg) {
    long long now = PyLong_AsLongLong(arg);
    if (now == -1 && PyErr_Occurred()) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (;;) {
        int64_t at;
        Py_ssize_t i;
        int sport;
        int rc = plan_take(p, now, &at, &i, &sport);
        if (rc == 0) break;
        PyObject *row = rc < 0 ? NULL : Py_BuildValue("(Lni)", (long long)at, i, sport);
        if (!row || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(row);
    }
    return out;
}

/* rng_state(stream) -> Random.getstate()[1] of that stream's generator now (for tests). */
static PyObject *Plan_rng_state(Plan *p, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= p->ns) {
        PyErr_SetString(PyExc_IndexError, "no such stream");
        return NULL;
    }
    return mt_to_state(&p->st[i].rng);
}

/* set_targets(table): where `queue_plan` queues each stream, `queue_rows`' table (None: nowhere
 * to probe, its rows are consumed and skipped; else (engine index, dst index, dst hash, IPv4
 * address as a host-order int, port)). */
static PyObject *Plan_set_targets(Plan *p, PyObject *table) {
    if (!PyList_Check(table) || PyList_GET_SIZE(table) != p->ns) {
        PyErr_SetString(PyExc_ValueError, "the table is a list with one entry per stream");
        return NULL;
    }
    Py_ssize_t slot;
    int32_t dst;
    uint64_t dst_hash;
    struct sockaddr_in dest;
    for (Py_ssize_t i = 0; i < p->ns; i++) { /* all or nothing: check every entry first */
        PyObject *ent = PyList_GET_ITEM(table, i);
        if (ent == Py_None) continue;
        if (parse_target(ent, &slot, &dst, &dst_hash, &dest) < 0) return NULL;
        if (slot < 0) {
            PyErr_Format(PyExc_ValueError, "bad engine index for stream %zd", i);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < p->ns; i++) {
        PyObject *ent = PyList_GET_ITEM(table, i);
        PStream *s = &p->st[i];
        s->has_target = ent != Py_None;
        if (s->has_target &&
            parse_target(ent, &s->slot, &s->dst, &s->dst_hash, &s->dest) < 0) /* checked above */
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Plan_methods[] = {
    {"next_at", (PyCFunction)Plan_next_at, METH_NOARGS,
     "next_at() -> the next probe's time, or None"},
    {"due_rows", (PyCFunction)Plan_due_rows, METH_O,
     "due_rows(now_ns) -> [(at_ns, stream, sport)], consumed"},
    {"rng_state", (PyCFunction)Plan_rng_state, METH_O,
     "rng_state(stream) -> its generator's state (Random.getstate()[1])"},
    {"set_targets", (PyCFunction)Plan_set_targets, METH_O,
     "set_targets(table) -> None: where queue_plan queues each stream"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prober._fastpath.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A probe schedule's state and draws (see prober/schedule.py ProbePlan.compile).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

/* queue_plan(plan, engines, until_ns, plan_now_ns, offset_ns, spacing_ns, coded)
 *   -> (probes queued, [(engine index, source port without a socket), ...] or None)
 *
 * `plan.due_rows(until_ns)` queued as `queue_rows(engines, table, rows, [offset_ns] * n,
 * plan_now_ns, spacing_ns, coded)` with the table of `plan.set_targets`: the same probes, times
 * and pair ids, in the same order. A stream without a target is consumed and skipped. */
static PyObject *py_queue_plan(PyObject *Py_UNUSED(self), PyObject *args) {
    Plan *p;
    PyObject *engines;
    long long until, plan_now, off, spacing;
    int coded;
    if (!PyArg_ParseTuple(args, "O!O!LLLLp", &PlanType, &p, &PyTuple_Type, &engines, &until,
                          &plan_now, &off, &spacing, &coded))
        return NULL;
    if (coded && spacing < 0) {
        PyErr_SetString(PyExc_ValueError, "spacing_ns must be >= 0");
        return NULL;
    }
    Py_ssize_t queued = 0;
    PyObject *missing = NULL;
    for (;;) {
        int64_t at;
        Py_ssize_t i;
        int sport;
        int rc = plan_take(p, until, &at, &i, &sport);
        if (rc == 0) break;
        if (rc < 0) goto fail;
        PStream *s = &p->st[i];
        if (!s->has_target) continue;
        Engine *e = batch_engine(engines, s->slot);
        if (!e) goto fail;
        int n = queue_probe(e, s->slot, &s->dest, at, plan_now, off, s->dst, s->dst_hash, sport,
                            coded, spacing, &missing);
        if (n < 0) goto fail;
        queued += n;
    }
    if (!missing) return Py_BuildValue("(nO)", queued, Py_None);
    return Py_BuildValue("(nN)", queued, missing);

fail:
    Py_XDECREF(missing);
    return NULL;
}
