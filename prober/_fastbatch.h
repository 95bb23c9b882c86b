/* One C call per tick for all of a prober's engines (prober/drive.py, `CompiledDriver` with
 * `batch`), and the schedule's due rows queued into them in one call.
 *
 * Included by _fastpath.c after the Engine type (it uses the engine's internals: the queue,
 * drain_epoll, take_due, settle, poll_engine). Nothing here changes what an engine does with a
 * datagram: `tick_all` runs, per engine, exactly what `Engine.poll` (every `poll_ns`) and
 * `Engine.tick` run, then the coded pairs' second probes as `Engine.send_due` does; only the
 * Python around them goes (a wrapper call per NIC and tick, a clock read per NIC, a
 * `next_send_ns` per NIC). `queue_rows` queues what `Engine.queue` would for each row. */

static int64_t batch_clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Engine number `i` of the tuple, checked. */
static Engine *batch_engine(PyObject *engines, Py_ssize_t i) {
    if (i < 0 || i >= PyTuple_GET_SIZE(engines)) {
        PyErr_SetString(PyExc_IndexError, "no such engine");
        return NULL;
    }
    PyObject *o = PyTuple_GET_ITEM(engines, i);
    if (!PyObject_TypeCheck(o, &EngineType)) {
        PyErr_SetString(PyExc_TypeError, "engines must be prober._fastpath.Engine objects");
        return NULL;
    }
    return (Engine *)o;
}

/* tick_all(engines, poll_ns, spin_ns) -> [(index, deferred, renumber, error), ...] or None.
 *
 * `now` is CLOCK_REALTIME (time.time_ns), read once for all engines: the caller passes only
 * engines whose NIC clock is the host's (no clock mapping). An engine without sockets (its
 * endpoint closed) is skipped. Per engine: its timeouts and held
 * t3s every `poll_ns` (`Engine.poll`), then `Engine.tick` (drain what epoll reports, send what
 * is due, read the TX stamps). An engine whose next probe (a coded pair's second) is due
 * within `spin_ns` is waited for once for all of them (busy, as the Python driver did) and
 * sent (`Engine.send_due` at the clock then). Returned: the engines Python has work for,
 * with what they handed back (trace datagrams, ICMP errors: a list or None), whether a
 * refused send wants its socket renumbered (`take_renumber` has it), and an OSError an
 * engine raised (that engine skipped its turn; the others went on). */
static PyObject *py_tick_all(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *engines;
    long long poll_ns, spin_ns;
    if (!PyArg_ParseTuple(args, "O!LL", &PyTuple_Type, &engines, &poll_ns, &spin_ns)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(engines);
    if (n > 1024) {
        PyErr_SetString(PyExc_ValueError, "at most 1024 engines");
        return NULL;
    }
    PyObject *errors[1024];
    uint8_t spin[1024];
    int64_t gap = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        errors[i] = NULL;
        spin[i] = 0;
    }
    int64_t now = batch_clock_ns(CLOCK_REALTIME);
    for (Py_ssize_t i = 0; i < n; i++) {
        Engine *e = batch_engine(engines, i);
        if (!e) goto fail;
        if (e->nsocks == 0) continue; /* closed (forget_sockets): as the per-NIC tick, skipped */
        int rc = 0;
        if (now >= e->next_poll) {
            e->next_poll = now + poll_ns;
            rc = poll_engine(e, now);
        }
        if (rc == 0) rc = drain_epoll(e, now);
        if (rc == 0) rc = take_due(e, now);
        if (rc == 0) rc = settle(e, now, 1);
        if (rc < 0) {
            if (!PyErr_ExceptionMatches(PyExc_OSError)) goto fail;
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            PyErr_NormalizeException(&t, &v, &tb);
            Py_XDECREF(t);
            Py_XDECREF(tb);
            errors[i] = v ? v : Py_NewRef(Py_None);
            continue;
        }
        if (e->qn && e->q[0].at - now <= spin_ns) {
            spin[i] = 1;
            if (e->q[0].at - now > gap) gap = e->q[0].at - now;
        }
    }
    if (gap >= 0) {
        int64_t end = batch_clock_ns(CLOCK_MONOTONIC) + gap;
        while (batch_clock_ns(CLOCK_MONOTONIC) < end) {
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!spin[i]) continue;
            Engine *e = (Engine *)PyTuple_GET_ITEM(engines, i);
            int64_t t = batch_clock_ns(CLOCK_REALTIME);
            if (take_due(e, t) < 0 || settle(e, t, 0) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_OSError)) goto fail;
                PyObject *ty, *v, *tb;
                PyErr_Fetch(&ty, &v, &tb);
                PyErr_NormalizeException(&ty, &v, &tb);
                Py_XDECREF(ty);
                Py_XDECREF(tb);
                errors[i] = v ? v : Py_NewRef(Py_None);
            }
        }
    }
    PyObject *work = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Engine *e = (Engine *)PyTuple_GET_ITEM(engines, i);
        if (!e->deferred && !e->renumber && !errors[i]) continue;
        if (!work && !(work = PyList_New(0))) goto fail;
        PyObject *d = take_deferred(e); /* a new reference (None when nothing) */
        PyObject *item = Py_BuildValue("(nNOO)", i, d, e->renumber ? Py_True : Py_False,
                                       errors[i] ? errors[i] : Py_None);
        Py_CLEAR(errors[i]);
        if (!item || PyList_Append(work, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(work);
            goto fail;
        }
        Py_DECREF(item);
    }
    if (!work) Py_RETURN_NONE;
    return work;

fail:
    for (Py_ssize_t i = 0; i < n; i++) Py_CLEAR(errors[i]);
    return NULL;
}

/* queue_rows(engines, table, rows, offsets, plan_now_ns, spacing_ns, coded)
 *   -> (probes queued, [(engine index, source port without a socket), ...] or None)
 *
 * `rows` are `prober.schedule.ProbePlan.due_rows` tuples (at_ns on the plan's clock, stream,
 * source port); `table[stream]` is None (nowhere to probe: skipped) or (engine index, the
 * session's dst index, dst hash, IPv4 address as a host-order int, port); `offsets[engine]`
 * is that NIC's clock minus the plan's at `plan_now_ns`. Each row is queued as
 * `CompiledSession.queue_pair` (coded: a pair id from the engine's counter, the second probe
 * `spacing_ns` after the first) or `queue_probe` would, at max(at, plan_now) + offset. A source
 * port with no socket yet is returned: the caller opens it before the next tick sends. */
/* One entry of a stream table (`queue_rows`, `Plan.set_targets`): (engine index, dst index, dst
 * hash, IPv4 address as a host-order int, UDP port) into its parts and the destination
 * address; -1 with a TypeError or ValueError set when it is not one. */
static int parse_target(PyObject *ent, Py_ssize_t *slot, int32_t *dst, uint64_t *dst_hash,
                        struct sockaddr_in *dest) {
    int d, port;
    unsigned long long h;
    unsigned long ip;
    if (!PyArg_ParseTuple(ent, "niKki;table entries are (engine, dst, hash, ip, port)", slot, &d,
                          &h, &ip, &port))
        return -1;
    if (port < 0 || port > 65535 || ip > 0xFFFFFFFFul) {
        PyErr_Format(PyExc_ValueError, "bad destination: address %lu, port %d", ip, port);
        return -1;
    }
    memset(dest, 0, sizeof(*dest));
    dest->sin_family = AF_INET;
    dest->sin_port = htons((uint16_t)port);
    dest->sin_addr.s_addr = htonl((uint32_t)ip);
    *dst = d;
    *dst_hash = h;
    return 0;
}

/* Queue one probe (a coded pair when `coded`, `spacing` ns apart) on engine `e` (slot `slot`)
 * for `dest` at max(at, plan_now) + off, numbering its pair; when `e` has no socket on
 * `sport` yet, append (slot, sport) to *missing (a list made on first use). Returns the
 * datagrams queued (1 or 2), or -1 with a Python error set. */
static int queue_probe(Engine *e, Py_ssize_t slot, const struct sockaddr_in *dest, long long at,
                       long long plan_now, long long off, int32_t dst, uint64_t dst_hash,
                       int sport, int coded, long long spacing, PyObject **missing) {
    Queued q;
    memset(&q, 0, sizeof(q));
    q.dest = *dest;
    q.at = (at > plan_now ? at : plan_now) + off;
    q.order = ++e->order;
    q.dst = dst;
    q.dst_hash = dst_hash;
    q.sport = (uint16_t)sport;
    if (coded) {
        q.pair = (int32_t)e->next_pair;
        e->next_pair = (e->next_pair + 1) & 0x7FFFFFFFu;
        q.spacing = spacing;
    } else {
        q.pair = -1;
        q.spacing = -1;
    }
    q.pos = 0;
    if (qpush(e, &q) < 0) return -1;
    if (e->port_sock[q.sport] < 0) {
        if (!*missing && !(*missing = PyList_New(0))) return -1;
        PyObject *m = Py_BuildValue("(ni)", slot, sport);
        if (!m || PyList_Append(*missing, m) < 0) {
            Py_XDECREF(m);
            return -1;
        }
        Py_DECREF(m);
    }
    return coded ? 2 : 1;
}

static PyObject *py_queue_rows(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *engines, *table, *rows, *offsets;
    long long plan_now, spacing;
    int coded;
    if (!PyArg_ParseTuple(args, "O!O!O!O!LLp", &PyTuple_Type, &engines, &PyList_Type, &table,
                          &PyList_Type, &rows, &PyList_Type, &offsets, &plan_now, &spacing,
                          &coded))
        return NULL;
    if (coded && spacing < 0) {
        PyErr_SetString(PyExc_ValueError, "spacing_ns must be >= 0");
        return NULL;
    }
    Py_ssize_t nrows = PyList_GET_SIZE(rows), queued = 0;
    PyObject *missing = NULL;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 3) {
            PyErr_SetString(PyExc_TypeError, "rows must be (at_ns, stream, sport) tuples");
            goto fail;
        }
        long long at = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 0));
        Py_ssize_t stream = PyLong_AsSsize_t(PyTuple_GET_ITEM(row, 1));
        long sport = PyLong_AsLong(PyTuple_GET_ITEM(row, 2));
        if (PyErr_Occurred()) goto fail;
        if (stream < 0 || stream >= PyList_GET_SIZE(table) || sport < 0 || sport > 65535) {
            PyErr_Format(PyExc_ValueError, "bad row: stream %zd, source port %ld", stream, sport);
            goto fail;
        }
        PyObject *ent = PyList_GET_ITEM(table, stream);
        if (ent == Py_None) continue;
        Py_ssize_t slot;
        int32_t dst;
        uint64_t dst_hash;
        struct sockaddr_in dest;
        if (parse_target(ent, &slot, &dst, &dst_hash, &dest) < 0) goto fail;
        Engine *e = batch_engine(engines, slot);
        if (!e) goto fail;
        if (slot >= PyList_GET_SIZE(offsets)) {
            PyErr_SetString(PyExc_IndexError, "no offset for that engine");
            goto fail;
        }
        long long off = PyLong_AsLongLong(PyList_GET_ITEM(offsets, slot));
        if (off == -1 && PyErr_Occurred()) goto fail;
        int n = queue_probe(e, slot, &dest, at, plan_now, off, dst, dst_hash, (int)sport, coded,
                            spacing, &missing);
        if (n < 0) goto fail;
        queued += n;
    }
    if (!missing) return Py_BuildValue("(nO)", queued, Py_None);
    return Py_BuildValue("(nN)", queued, missing);

fail:
    Py_XDECREF(missing);
    return NULL;
}

static int queued_cmp(const void *a, const void *b) {
    const Queued *x = a, *y = b;
    if (x->at != y->at) return x->at < y->at ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

/* Engine.queued() -> [(at_ns, dst, dst_hash, ip, port, sport, pair_id, pair_pos, spacing_ns)],
 * in send order: what `queue` and `queue_rows` queued and is not sent yet (for tests). */
static PyObject *Engine_queued(Engine *e, PyObject *Py_UNUSED(ignored)) {
    Queued *copy = PyMem_Malloc((size_t)(e->qn ? e->qn : 1) * sizeof(Queued));
    if (!copy) return PyErr_NoMemory();
    memcpy(copy, e->q, (size_t)e->qn * sizeof(Queued));
    qsort(copy, (size_t)e->qn, sizeof(Queued), queued_cmp);
    PyObject *out = PyList_New(e->qn);
    for (Py_ssize_t i = 0; out && i < e->qn; i++) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &copy[i].dest.sin_addr, ip, sizeof(ip));
        PyObject *t = Py_BuildValue("(LiKsiiiiL)", (long long)copy[i].at, copy[i].dst,
                                    (unsigned long long)copy[i].dst_hash, ip,
                                    ntohs(copy[i].dest.sin_port), copy[i].sport, copy[i].pair,
                                    copy[i].pos, (long long)copy[i].spacing);
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, t);
    }
    PyMem_Free(copy);
    return out;
}
