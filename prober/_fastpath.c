/* The compiled UDP hot path of the prober: one `Engine` per NIC does the per-datagram work of
 * `prober.session.ProbeSession` (unauthenticated, two-step) over that NIC's sockets, a batch at a
 * time, and hands Python completed records as packed int64 rows.
 *
 * Python (prober/compiled.py) keeps: sockets (opening, options), the schedule, the event loop,
 * timers, path discovery, trace probes and ICMP errors (handed back as "deferred" items),
 * counters' names. This file keeps: the probe queue (a heap by time), the pending probes (a
 * table indexed by seq), replies waiting for their TX stamp, the OPT_ID -> token map of every
 * socket, recvmmsg/sendmmsg/error-queue reads, the wire format (same checks and the same
 * counter reasons as prober/wire.py `Codec.decode`), matching and results.
 *
 * Wire format: prober/wire.py (48-byte body, network byte order, zero padding).
 * Probe authentication (prober/wire.py `Codec` with a key): with `keys` (send key first, then
 * the others of a rotation) every datagram sent carries AUTH and a 16-byte tag,
 * HMAC-SHA256(send key, everything before the tag)[:16]; a datagram received must carry AUTH
 * and a tag one of the keys makes (compared in constant time), else it is counted `bad_auth`
 * and goes no further (no answer, no record). Without keys a tagged datagram is `bad_auth`.
 * SHA-256 and HMAC are in _sha256.h (FIPS 180-4, RFC 2104, no library): each key's inner and outer
 * padded blocks are compressed once at construction, so a 48-byte message costs 2 blocks.
 * Deferred follow-ups (prober/wire.py docstring): with `defer`, probes carry DEFER_OK and a
 * reply's t3 to an initiator that set it is held (per initiator NIC hash) and carried as the
 * t3 list of the next REPLY to that NIC, or after `hold_ns` sent as one FOLLOW_UP carrying
 * all held entries (`poll`, `flush_held`). Received t3 lists complete held probes.
 * Result rows (int64 x 11): seq, dst index, sport, pair_id, pair_pos, t1, t2, t3, t4, lost,
 * sent_ns (t2..t4 = MISSING for a loss, t1 MISSING when its TX stamp never came).
 * Nothing here raises on network input; bad input is counted (see COUNTER_NAMES).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>

#define BODY 48
#define MAGIC 0x5150
#define VERSION 1
#define FLAG_AUTH 1
#define FLAG_T3_FINAL 2
#define FLAG_TRACE 4
#define FLAG_DEFER_OK 8
#define FLAG_CARRIES_T3 16
#define KNOWN_FLAGS (FLAG_AUTH | FLAG_T3_FINAL | FLAG_TRACE | FLAG_DEFER_OK | FLAG_CARRIES_T3)
#define T3E 12         /* one (seq uint32, t3 int64) entry of a t3 list */
#define MAX_T3S 64     /* the decoder's limit (prober.wire.MAX_T3S) */
#define MAX_HELD 32    /* entries this engine holds per initiator before it must send them */
#define MAX_INITIATORS 4096 /* initiator NICs held for at once (bounds memory: ~1.7 MB) */
#define MAX_PAD 8192
#define RING 64
#define SLOT 2048
#define CTL 256
#define OUTMAX 256
#define MISSING INT64_MIN
#define I64MAX INT64_MAX
#define REPLY_TOKEN_BASE (1LL << 32)
#define NCOL 11
#define MAXERRNO 160
#define TAG 16         /* prober.wire.TAG_LEN: the HMAC-SHA256 tag is cut to 16 bytes */
#define MAX_KEYS 4     /* keys that verify (contract/keys.py allows 2: a rotation) */

#ifndef SO_TIMESTAMPING_OLD
#define SO_TIMESTAMPING_OLD 37
#endif
#ifndef SO_EE_ORIGIN_TIMESTAMPING
#define SO_EE_ORIGIN_TIMESTAMPING 4
#endif

enum {
    C_TRUNCATED, C_BAD_MAGIC, C_BAD_VERSION, C_BAD_TYPE, C_BAD_FIELD, C_BAD_AUTH,
    C_MISDIRECTED, C_WRONG_SENDER, C_MISMATCH, C_UNMATCHED, C_DUPLICATE, C_INCONSISTENT,
    C_INCOMPLETE, C_LATE_TX_STAMP, C_TX_STAMP_MISSING, C_OVERFLOW, C_LOST,
    C_STAMP_HW, C_STAMP_SW, C_STAMP_USER, C_TX_TOKEN_EVICTED, C_ERRQUEUE_UNKNOWN,
    C_SEND_PENDING_ICMP, C_RX_OVERSIZED, C_NO_SOCKET, C_BAD_STAMP, C_SEND_REFUSED,
    C_FOLLOW_UPS, C_T3_HELD, C_T3_CARRIED, C_T3_FLUSHED, C_T3_RECEIVED, C_N
};
static const char *COUNTER_NAMES[C_N] = {
    "truncated", "bad_magic", "bad_version", "bad_type", "bad_field", "bad_auth",
    "misdirected", "wrong_sender", "mismatch", "unmatched", "duplicate", "inconsistent",
    "incomplete", "late_tx_stamp", "tx_stamp_missing", "overflow", "lost",
    "stamp_hw", "stamp_sw", "stamp_user", "tx_token_evicted", "errqueue_unknown",
    "send_pending_icmp_error", "rx_oversized", "no_socket", "bad_stamp", "send_refused",
    "follow_ups_sent", "t3_held", "t3_carried", "t3_flushed", "t3_received",
};

/* ---- wire --------------------------------------------------------------------------------- */

typedef struct {
    int mtype, pos, t3_final, trace, defer_ok;
    uint64_t sender, peer;
    uint32_t seq;
    int32_t pair;
    int64_t ta, tb;
    int pad;
    int nt3;               /* entries of the t3 list (CARRIES_T3), 0 without */
    const uint8_t *t3p;    /* the first entry */
} Msg;

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t rd32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rd64(const uint8_t *p) { return ((uint64_t)rd32(p) << 32) | rd32(p + 4); }
static inline void wr16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static inline void wr32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)(v >> 32)); wr32(p + 4, (uint32_t)v); }

#include "_sha256.h" /* SHA-256 and HMAC-SHA256 with precomputed key states */

/* 1 when tag (TAG bytes) is the tag of d[:n] under one of the keys: the send key first, the
 * others only when it does not match (as prober.wire.Codec._verify); each comparison takes the
 * same time whatever the bytes. */
static int tag_ok(const HmacKey *keys, int nkeys, const uint8_t *d, size_t n, const uint8_t *tag) {
    for (int i = 0; i < nkeys; i++) {
        uint8_t t[32], diff = 0;
        hmac_sha256(&keys[i], d, n, t);
        for (int j = 0; j < TAG; j++) diff |= (uint8_t)(t[j] ^ tag[j]);
        if (!diff) return 1;
    }
    return 0;
}

/* Decode like prober.wire.Codec(key, accept).decode (keys: key first, then accept; none: the
 * unauthenticated codec); return -1 when valid, else the counter index of the reason (the same
 * reason, checked in the same order). */
static int decode(const HmacKey *keys, int nkeys, const uint8_t *d, size_t n, Msg *m) {
    if (n < BODY) return C_TRUNCATED;
    if (rd16(d) != MAGIC) return C_BAD_MAGIC;
    if (d[2] != VERSION) return C_BAD_VERSION;
    int mtype = d[3], flags = d[4];
    if (mtype < 1 || mtype > 3) return C_BAD_TYPE;
    if ((flags & ~KNOWN_FLAGS) || rd16(d + 6)) return C_BAD_FIELD;
    if (!(flags & FLAG_AUTH) != !nkeys) return C_BAD_AUTH; /* tag missing, or unexpected */
    if (nkeys) {
        if (n < BODY + TAG) return C_TRUNCATED; /* no room for the tag */
        n -= TAG;
        if (!tag_ok(keys, nkeys, d, n, d + n)) return C_BAD_AUTH;
    }
    size_t at = BODY;
    m->nt3 = 0;
    m->t3p = NULL;
    if (flags & FLAG_CARRIES_T3) {
        if (n < BODY + 1) return C_TRUNCATED;
        int c = d[BODY];
        if (c < 1 || c > MAX_T3S) return C_BAD_FIELD;
        at = BODY + 1 + (size_t)c * T3E;
        if (at > n) return C_TRUNCATED;
        m->nt3 = c;
        m->t3p = d + BODY + 1;
    }
    size_t pad = n - at;
    if (pad > MAX_PAD) return C_BAD_FIELD;
    for (size_t i = at; i < n; i++)
        if (d[i]) return C_BAD_FIELD;
    m->mtype = mtype;
    m->pos = d[5];
    m->sender = rd64(d + 8);
    m->peer = rd64(d + 16);
    m->seq = rd32(d + 24);
    m->pair = (int32_t)rd32(d + 28);
    m->ta = (int64_t)rd64(d + 32);
    m->tb = (int64_t)rd64(d + 40);
    m->t3_final = (flags & FLAG_T3_FINAL) != 0;
    m->trace = (flags & FLAG_TRACE) != 0;
    m->defer_ok = (flags & FLAG_DEFER_OK) != 0;
    m->pad = (int)pad;
    /* prober.wire.Message validation */
    if (m->pair < -1 || m->ta < 0 || m->tb < 0) return C_BAD_FIELD;
    if ((m->pos != 0 && m->pos != 1) || (m->pair == -1 && m->pos)) return C_BAD_FIELD;
    for (int i = 0; i < m->nt3; i++)
        if ((int64_t)rd64(m->t3p + i * T3E + 4) < 0) return C_BAD_FIELD;
    if (mtype == 1) {
        if (m->ta || m->tb || m->t3_final || m->nt3) return C_BAD_FIELD;
    } else if (m->defer_ok) {
        return C_BAD_FIELD;
    } else if (mtype == 2) {
        if (m->tb && !m->t3_final) return C_BAD_FIELD;
        if (m->nt3 && m->trace) return C_BAD_FIELD;
    } else {
        if (m->t3_final || m->trace) return C_BAD_FIELD;
        if (m->nt3 && (m->seq || m->pair != -1 || m->ta || m->tb)) return C_BAD_FIELD;
    }
    return -1;
}

static void encode(uint8_t *p, int mtype, int flags, int pos, uint64_t sender, uint64_t peer,
                   uint32_t seq, int32_t pair, int64_t ta, int64_t tb, int pad) {
    wr16(p, MAGIC);
    p[2] = VERSION;
    p[3] = (uint8_t)mtype;
    p[4] = (uint8_t)flags;
    p[5] = (uint8_t)pos;
    p[6] = p[7] = 0;
    wr64(p + 8, sender);
    wr64(p + 16, peer);
    wr32(p + 24, seq);
    wr32(p + 28, (uint32_t)pair);
    wr64(p + 32, (uint64_t)ta);
    wr64(p + 40, (uint64_t)tb);
    if (pad) memset(p + BODY, 0, (size_t)pad);
}

/* ---- engine state ------------------------------------------------------------------------- */

typedef struct {
    int64_t at;
    uint64_t order;
    uint64_t dst_hash;
    struct sockaddr_in dest;
    int64_t spacing;
    int32_t dst, pair;
    uint16_t sport;
    uint8_t pos;
} Queued;

typedef struct {
    uint64_t dst_hash;
    int64_t sent, t1, t2, t3, t4;
    uint32_t seq;
    int32_t dst, pair;
    uint16_t sport;
    uint8_t live, have, pos; /* have: bit0 t1, bit1 t2, bit2 t3, bit3 t4 */
} Pend;

typedef struct {
    int64_t ctr, created, ta;
    uint64_t peer;
    struct sockaddr_in dest;
    uint32_t seq;
    int32_t pair;
    uint8_t live, pos, defer; /* defer: the PROBE set DEFER_OK and this engine defers */
} Await;

/* The t3s held for one initiator NIC (deferred follow-ups): open addressing by its hash. */
typedef struct {
    uint64_t peer;
    int64_t since;            /* when the oldest held entry was taken */
    struct sockaddr_in dest;  /* where its last probe came from */
    uint8_t used, n;
    uint32_t seq[MAX_HELD];
    int64_t t3[MAX_HELD];
} Held;

typedef struct {
    int fd;
    int port;
    uint32_t sent;      /* OPT_ID: the kernel's counter of this socket's stamped sends */
    uint32_t kmask;
    int64_t *tok;       /* token per OPT_ID key (ring) */
    uint32_t *key;
    uint8_t *tvalid;
    int tainted;        /* a send was refused: nothing more leaves until Python renumbers it */
    int dead;           /* Python could not reopen it: datagrams for it are refused */
} Sock;

typedef struct {
    int sock;
    int64_t token;      /* -1: no TX stamp wanted */
    int len;
    struct sockaddr_in dest;
    uint8_t data[SLOT];
} Out;

typedef struct {
    PyObject_HEAD
    uint64_t nic;
    int64_t timeout;
    int64_t max_pending;
    int pad;
    int stamp_followups;      /* 0: follow-ups carry a per-message SO_TIMESTAMPING of 0 */
    int defer;                /* 1: probes set DEFER_OK, and DEFER_OK probes get no FOLLOW_UP */
    int64_t hold;             /* ns a held t3 waits for a REPLY to carry it */
    Held *htab;               /* initiator NIC -> held t3s (hmask + 1 slots) */
    uint32_t hmask, hused;
    int unstamped_count;      /* 1: OPT_ID also counts unstamped sends (older kernels) */
    HmacKey keys[MAX_KEYS];   /* probe HMAC keys: [0] tags what is sent, all verify */
    int nkeys;                /* 0: unauthenticated */
    PyObject *clock;          /* None or callable(kernel ns) -> NIC ns */
    /* queue: binary heap */
    Queued *q;
    Py_ssize_t qn, qcap;
    uint64_t order;
    /* pending: indexed by seq & pmask; oldest_seq..next_seq in order */
    Pend *pend;
    uint32_t pmask;
    uint32_t next_seq, oldest_seq;
    int64_t npending;
    /* replies awaiting TX stamps: ring indexed by ctr & amask */
    Await *aw;
    uint32_t amask;
    int64_t aw_next, aw_oldest, nawait;
    /* sockets */
    Sock *socks;
    int nsocks, responder;
    int32_t port_sock[65536];
    /* output rows */
    int64_t *rows;
    Py_ssize_t nrows, rowcap;
    /* outgoing datagrams */
    Out *out;
    int nout;
    /* receive ring */
    struct mmsghdr rhdr[RING];
    struct iovec riov[RING];
    struct sockaddr_in rname[RING];
    uint8_t (*rdata)[SLOT];
    uint8_t rctl[RING][CTL];
    int64_t counters[C_N];
    int64_t err_send[MAXERRNO], err_recv[MAXERRNO], err_errq[MAXERRNO];
    PyObject *deferred;       /* list or NULL */
    PyObject *renumber;       /* list of socket indices to replace, or NULL */
    Out scratch;              /* where a datagram goes that no out slot can take (dropped) */
    int epfd;                 /* epoll set of every socket: one readiness callback per NIC */
    long last_drained;        /* datagrams and error-queue entries the last drain_ready read */
    long drained;             /* running count (drain_data / drain_errq) */
    uint32_t next_pair;       /* the next coded pair's id (queue with pair -2 takes it) */
    int64_t next_poll;        /* tick_all: when poll_engine runs next */
} Engine;

static int64_t map_clock(Engine *e, int64_t ns, int *err) {
    if (e->clock == Py_None) return ns;
    PyObject *r = PyObject_CallFunction(e->clock, "L", (long long)ns);
    if (!r) { *err = 1; return ns; }
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) { *err = 1; return ns; }
    return v;
}

static int add_row(Engine *e, const int64_t r[NCOL]) {
    if (e->nrows == e->rowcap) {
        Py_ssize_t cap = e->rowcap ? e->rowcap * 2 : 256;
        int64_t *n = PyMem_Realloc(e->rows, (size_t)cap * NCOL * sizeof(int64_t));
        if (!n) { PyErr_NoMemory(); return -1; }
        e->rows = n;
        e->rowcap = cap;
    }
    memcpy(e->rows + e->nrows * NCOL, r, NCOL * sizeof(int64_t));
    e->nrows++;
    return 0;
}

static void count_err(int64_t *arr, int err) { arr[(err > 0 && err < MAXERRNO) ? err : 0]++; }

/* ---- heap --------------------------------------------------------------------------------- */

static inline int qless(const Queued *a, const Queued *b) {
    return a->at < b->at || (a->at == b->at && a->order < b->order);
}

static int qpush(Engine *e, const Queued *x) {
    if (e->qn == e->qcap) {
        Py_ssize_t cap = e->qcap ? e->qcap * 2 : 256;
        Queued *n = PyMem_Realloc(e->q, (size_t)cap * sizeof(Queued));
        if (!n) { PyErr_NoMemory(); return -1; }
        e->q = n;
        e->qcap = cap;
    }
    Py_ssize_t i = e->qn++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!qless(x, &e->q[p])) break;
        e->q[i] = e->q[p];
        i = p;
    }
    e->q[i] = *x;
    return 0;
}

static void qpop(Engine *e, Queued *top) {
    *top = e->q[0];
    Queued last = e->q[--e->qn];
    Py_ssize_t i = 0, n = e->qn;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        const Queued *best = &last;
        if (l < n && qless(&e->q[l], best)) { m = l; best = &e->q[l]; }
        if (r < n && qless(&e->q[r], best)) { m = r; }
        if (m == i) break;
        e->q[i] = e->q[m];
        i = m;
    }
    if (n) e->q[i] = last;
}

/* ---- sending ------------------------------------------------------------------------------ */

static int flush_out(Engine *e);
static int refused(Engine *e, int si, int64_t token);

static Out *out_slot(Engine *e) {
    if (e->nout == OUTMAX && flush_out(e) < 0) return NULL;
    if (e->nout == OUTMAX) { /* all kept for sockets awaiting renumbering: drop this one */
        e->counters[C_OVERFLOW]++;
        return &e->scratch;
    }
    return &e->out[e->nout++];
}

/* With keys: set AUTH and append the send key's tag over everything before it (prober.wire);
 * call once the datagram's bytes are final. Every caller leaves TAG bytes of room in the slot. */
static inline void seal(Engine *e, Out *o) {
    if (!e->nkeys) return;
    uint8_t t[32];
    o->data[4] |= FLAG_AUTH;
    hmac_sha256(&e->keys[0], o->data, (size_t)o->len, t);
    memcpy(o->data + o->len, t, TAG);
    o->len += TAG;
}

static void note_token(Engine *e, Sock *s, int64_t token) {
    uint32_t k = s->sent++;
    if (token < 0) return;
    uint32_t i = k & s->kmask;
    if (s->tvalid[i]) e->counters[C_TX_TOKEN_EVICTED]++;
    s->tok[i] = token;
    s->key[i] = k;
    s->tvalid[i] = 1;
}

static int is_pending_icmp(int err) {
    return err == EHOSTUNREACH || err == ENETUNREACH || err == ECONNREFUSED || err == EHOSTDOWN ||
           err == EPROTO || err == ENOPROTOOPT || err == ENONET;
}

/* Send every queued datagram, one sendmmsg per socket (in queue order within a socket).
 *
 * A datagram the kernel refuses (a netfilter drop, a full buffer, no route) is a lost probe at
 * once (or a dropped reply), as in prober/udp.py; the kernel may have used up an OPT_ID number
 * for it, so the socket is tainted: the rest of its datagrams stay queued until Python has
 * replaced it by a fresh socket (`take_renumber`, `replace_socket`), whose numbering starts
 * at 0 again. Datagrams of a tainted socket are kept for then (those of a dead one refused). */
static int flush_out(Engine *e) {
    int n = e->nout;
    if (!n) return 0;
    static __thread struct mmsghdr hdr[OUTMAX];
    static __thread struct iovec iov[OUTMAX];
    static __thread int idx[OUTMAX];
    static __thread uint8_t done[OUTMAX], keep[OUTMAX];
    union { char buf[CMSG_SPACE(sizeof(uint32_t))]; struct cmsghdr align; } ctl0;
    memset(done, 0, (size_t)n);
    memset(keep, 0, (size_t)n);
    memset(&ctl0, 0, sizeof(ctl0));
    {
        struct cmsghdr *c = (struct cmsghdr *)ctl0.buf;
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SO_TIMESTAMPING_OLD;
        c->cmsg_len = CMSG_LEN(sizeof(uint32_t));
        uint32_t zero = 0;
        memcpy(CMSG_DATA(c), &zero, sizeof(zero));
    }
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        int si = e->out[i].sock, k = 0;
        Sock *s = &e->socks[si];
        for (int j = i; j < n; j++) {
            if (done[j] || e->out[j].sock != si) continue;
            done[j] = 1;
            if (s->dead) {
                if (refused(e, si, e->out[j].token) < 0) return -1;
                continue;
            }
            if (s->tainted) { keep[j] = 1; continue; }
            Out *o = &e->out[j];
            idx[k] = j;
            iov[k].iov_base = o->data;
            iov[k].iov_len = (size_t)o->len;
            memset(&hdr[k], 0, sizeof(hdr[k]));
            hdr[k].msg_hdr.msg_name = &o->dest;
            hdr[k].msg_hdr.msg_namelen = sizeof(o->dest);
            hdr[k].msg_hdr.msg_iov = &iov[k];
            hdr[k].msg_hdr.msg_iovlen = 1;
            if (o->token == -2) { /* an unstamped follow-up */
                hdr[k].msg_hdr.msg_control = ctl0.buf;
                hdr[k].msg_hdr.msg_controllen = sizeof(ctl0.buf);
            }
            k++;
        }
        int at = 0, retried = 0;
        while (at < k) {
            int r = sendmmsg(s->fd, hdr + at, (unsigned)(k - at), MSG_DONTWAIT);
            if (r > 0) {
                for (int m = at; m < at + r; m++) {
                    int64_t tok = e->out[idx[m]].token;
                    if (tok == -2) {
                        if (e->unstamped_count) s->sent++;
                    } else {
                        note_token(e, s, tok);
                    }
                }
                at += r;
                retried = 0;
                continue;
            }
            int err = r < 0 ? errno : EAGAIN;
            if (err == EINTR) continue;
            if (is_pending_icmp(err) && !retried) {
                /* a pending ICMP error (IP_RECVERR) was reported instead of sending: once more */
                e->counters[C_SEND_PENDING_ICMP]++;
                retried = 1;
                continue;
            }
            count_err(e->err_send, err);
            if (refused(e, si, e->out[idx[at]].token) < 0) return -1;
            for (int m = at + 1; m < k; m++) keep[idx[m]] = 1; /* after the renumbering */
            break;
        }
    }
    int w = 0;
    for (int i = 0; i < n; i++)
        if (keep[i]) {
            if (w != i) e->out[w] = e->out[i];
            w++;
        }
    e->nout = w;
    return 0;
}

/* ---- deferred follow-ups ------------------------------------------------------------------ */

static inline uint32_t held_index(uint64_t peer) { return (uint32_t)(peer ^ (peer >> 29)); }

/* Rebuild the table with `cap` slots (a power of two); `drop_empty`: forget the initiators
 * nothing is held for. -1 with a Python error when out of memory. */
static int held_rehash(Engine *e, uint32_t cap, int drop_empty) {
    Held *n = PyMem_Calloc(cap, sizeof(Held));
    if (!n) { PyErr_NoMemory(); return -1; }
    uint32_t used = 0;
    for (uint32_t j = 0; e->htab && j <= e->hmask; j++) {
        if (!e->htab[j].used || (drop_empty && !e->htab[j].n)) continue;
        uint32_t i = held_index(e->htab[j].peer);
        while (n[i & (cap - 1)].used) i++;
        n[i & (cap - 1)] = e->htab[j];
        used++;
    }
    PyMem_Free(e->htab);
    e->htab = n;
    e->hmask = cap - 1;
    e->hused = used;
    return 0;
}

/* The held slot of initiator NIC `peer` (*out; NULL when there is none). With `create` a new
 * one when there is none; *out stays NULL when MAX_INITIATORS others hold t3s (the caller
 * then sends a FOLLOW_UP as without deferral). -1 with a Python error when out of memory. */
static int held_find(Engine *e, uint64_t peer, int create, Held **out) {
    *out = NULL;
    if (e->htab) {
        for (uint32_t i = held_index(peer);; i++) {
            Held *h = &e->htab[i & e->hmask];
            if (!h->used) break;
            if (h->peer == peer) { *out = h; return 0; }
        }
    }
    if (!create) return 0;
    if (e->hused >= MAX_INITIATORS) { /* forget the initiators nothing is held for */
        if (held_rehash(e, e->hmask + 1, 1) < 0) return -1;
        if (e->hused >= MAX_INITIATORS) return 0;
    }
    if (!e->htab || (e->hused + 1) * 2 > e->hmask + 1) {
        if (held_rehash(e, e->htab ? (e->hmask + 1) * 2 : 64, 0) < 0) return -1;
    }
    uint32_t i = held_index(peer);
    while (e->htab[i & e->hmask].used) i++;
    Held *h = &e->htab[i & e->hmask];
    memset(h, 0, sizeof(*h));
    h->used = 1;
    h->peer = peer;
    e->hused++;
    *out = h;
    return 0;
}

static size_t put_t3s(uint8_t *p, Held *h) {
    p[0] = h->n;
    for (int i = 0; i < h->n; i++) {
        wr32(p + 1 + i * T3E, h->seq[i]);
        wr64(p + 1 + i * T3E + 4, (uint64_t)h->t3[i]);
    }
    return 1 + (size_t)h->n * T3E;
}

/* Queue one FOLLOW_UP (empty body) carrying every t3 held for h's initiator. */
static int send_held(Engine *e, Held *h) {
    if (!h->n) return 0;
    if (e->responder < 0) { e->counters[C_NO_SOCKET]++; h->n = 0; return 0; }
    Out *o = out_slot(e);
    if (!o) return -1;
    o->sock = e->responder;
    o->token = e->stamp_followups ? -1 : -2;
    o->dest = h->dest;
    encode(o->data, 3, FLAG_CARRIES_T3, 0, e->nic, h->peer, 0, -1, 0, 0, 0);
    o->len = BODY + (int)put_t3s(o->data + BODY, h);
    seal(e, o);
    e->counters[C_FOLLOW_UPS]++;
    e->counters[C_T3_FLUSHED] += h->n;
    h->n = 0;
    return 0;
}

/* Queue a FOLLOW_UP for every initiator whose oldest held t3 is `hold` old by `now` (all of
 * them with `all`); return how many, or -1 with a Python error. */
static long flush_held(Engine *e, int64_t now, int all) {
    long sent = 0;
    for (uint32_t j = 0; e->htab && j <= e->hmask; j++) {
        Held *h = &e->htab[j];
        if (!h->used || !h->n || (!all && h->since + e->hold > now)) continue;
        if (send_held(e, h) < 0) return -1;
        sent++;
    }
    return sent;
}

/* ---- results ------------------------------------------------------------------------------ */

static int complete(Engine *e, Pend *p) {
    if (p->have != 15) return 0;
    p->live = 0;
    e->npending--;
    if (!(p->t1 <= p->t4 && p->t2 <= p->t3)) {
        e->counters[C_INCONSISTENT]++;
        return 0;
    }
    int64_t r[NCOL] = {p->seq, p->dst, p->sport, p->pair, p->pos, p->t1, p->t2, p->t3, p->t4, 0,
                       p->sent};
    return add_row(e, r);
}

/* A datagram the OS refused: a probe is lost now (t1 MISSING), a reply's follow-up will not
 * follow; the socket must be renumbered (see flush_out). */
static int refused(Engine *e, int si, int64_t token) {
    Sock *s = &e->socks[si];
    if (!s->tainted && !s->dead) {
        s->tainted = 1;
        if (!e->renumber && !(e->renumber = PyList_New(0))) return -1;
        PyObject *v = PyLong_FromLong(si);
        if (!v || PyList_Append(e->renumber, v) < 0) { Py_XDECREF(v); return -1; }
        Py_DECREF(v);
    }
    if (token < 0) return 0;
    e->counters[C_SEND_REFUSED]++;
    if (token >= REPLY_TOKEN_BASE) {
        int64_t ctr = token - REPLY_TOKEN_BASE;
        Await *a = &e->aw[ctr & e->amask];
        if (a->live && a->ctr == ctr) { a->live = 0; e->nawait--; }
        return 0;
    }
    Pend *p = &e->pend[(uint32_t)token & e->pmask];
    if (!p->live || p->seq != (uint32_t)token) return 0;
    p->live = 0;
    e->npending--;
    e->counters[C_LOST]++;
    int64_t r[NCOL] = {p->seq, p->dst, p->sport, p->pair, p->pos, MISSING, MISSING, MISSING,
                       MISSING, 1, p->sent};
    return add_row(e, r);
}

/* ---- receiving ---------------------------------------------------------------------------- */

static int defer(Engine *e, const uint8_t *d, size_t n, const struct sockaddr_in *src, int64_t rx) {
    if (!e->deferred && !(e->deferred = PyList_New(0))) return -1;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &src->sin_addr, ip, sizeof(ip));
    PyObject *t = Py_BuildValue("(y#(si)L)", (const char *)d, (Py_ssize_t)n, ip,
                                (int)ntohs(src->sin_port), (long long)rx);
    if (!t) return -1;
    int rc = PyList_Append(e->deferred, t);
    Py_DECREF(t);
    return rc;
}

static int take_t3s(Engine *e, const Msg *m);
static int match(Engine *e, const Msg *m, int64_t rx);

/* One received datagram (the same steps as ProbeSession.receive). */
static int process(Engine *e, const uint8_t *d, size_t n, const struct sockaddr_in *src,
                   int64_t rx, int64_t now) {
    Msg m;
    int why = decode(e->keys, e->nkeys, d, n, &m);
    if (why >= 0) { e->counters[why]++; return 0; }
    if (m.peer != e->nic) { e->counters[C_MISDIRECTED]++; return 0; }
    if (m.mtype == 1) {
        if (m.trace) return defer(e, d, n, src, rx); /* one-step trace reply: Python */
        if (rx < 0) { e->counters[C_BAD_STAMP]++; return 0; }
        if (e->nawait >= e->max_pending || e->aw[e->aw_next & e->amask].live) {
            e->counters[C_OVERFLOW]++;
            return 0;
        }
        if (e->responder < 0) { e->counters[C_NO_SOCKET]++; return 0; }
        size_t room = (size_t)SLOT - (e->nkeys ? TAG : 0); /* the reply's bytes before its tag */
        if (BODY + (size_t)m.pad > room) { e->counters[C_RX_OVERSIZED]++; return 0; }
        int64_t ctr = e->aw_next++;
        Await *a = &e->aw[ctr & e->amask];
        a->live = 1; a->ctr = ctr; a->created = now; a->ta = rx; a->peer = m.sender;
        a->dest = *src; a->seq = m.seq; a->pair = m.pair; a->pos = (uint8_t)m.pos;
        a->defer = (uint8_t)(e->defer && m.defer_ok);
        e->nawait++;
        Held *h = NULL;
        if (a->defer) held_find(e, m.sender, 0, &h); /* (no allocation: cannot fail) */
        Out *o = out_slot(e);
        if (!o) return -1;
        o->sock = e->responder;
        o->token = REPLY_TOKEN_BASE + ctr;
        o->dest = *src;
        if (h && h->n && BODY + 1 + (size_t)h->n * T3E + (size_t)m.pad <= room) {
            /* carry what is held for this initiator NIC: no FOLLOW_UP for those */
            encode(o->data, 2, FLAG_CARRIES_T3, m.pos, e->nic, m.sender, m.seq, m.pair, rx, 0, 0);
            size_t at = BODY + put_t3s(o->data + BODY, h);
            if (m.pad) memset(o->data + at, 0, (size_t)m.pad);
            o->len = (int)at + m.pad;
            e->counters[C_T3_CARRIED] += h->n;
            h->n = 0;
        } else {
            o->len = BODY + m.pad;
            encode(o->data, 2, 0, m.pos, e->nic, m.sender, m.seq, m.pair, rx, 0, m.pad);
        }
        seal(e, o);
        return 0;
    }
    if (m.trace) return defer(e, d, n, src, rx); /* TraceReached: Python */
    if (m.nt3 && m.mtype == 3) return take_t3s(e, &m); /* a held-t3 FOLLOW_UP: no body */
    if (match(e, &m, rx) < 0) return -1;
    return m.nt3 ? take_t3s(e, &m) : 0;
}

/* The t3 list of a REPLY or FOLLOW_UP: complete each held probe it names. */
static int take_t3s(Engine *e, const Msg *m) {
    for (int i = 0; i < m->nt3; i++) {
        uint32_t seq = rd32(m->t3p + i * T3E);
        int64_t t3 = (int64_t)rd64(m->t3p + i * T3E + 4);
        Pend *p = &e->pend[seq & e->pmask];
        if (!p->live || p->seq != seq) { e->counters[C_UNMATCHED]++; continue; }
        if (m->sender != p->dst_hash) { e->counters[C_WRONG_SENDER]++; continue; }
        if (p->have & 4) { e->counters[C_DUPLICATE]++; continue; }
        p->t3 = t3;
        p->have |= 4;
        e->counters[C_T3_RECEIVED]++;
        if (complete(e, p) < 0) return -1;
    }
    return 0;
}

/* The body of a REPLY or FOLLOW_UP against the pending probe it names. */
static int match(Engine *e, const Msg *mp, int64_t rx) {
    Msg m = *mp;
    Pend *p = &e->pend[m.seq & e->pmask];
    if (!p->live || p->seq != m.seq) { e->counters[C_UNMATCHED]++; return 0; }
    if (m.sender != p->dst_hash) { e->counters[C_WRONG_SENDER]++; return 0; }
    if (m.pair != p->pair || m.pos != p->pos) { e->counters[C_MISMATCH]++; return 0; }
    if ((p->have & 2) && m.ta != p->t2) { e->counters[C_DUPLICATE]++; return 0; }
    if (m.mtype == 2) {
        if (p->have & 8) { e->counters[C_DUPLICATE]++; return 0; }
        p->t4 = rx; p->t2 = m.ta; p->have |= 8 | 2;
        if (m.t3_final) { p->t3 = m.tb; p->have |= 4; }
    } else {
        if (p->have & 4) { e->counters[C_DUPLICATE]++; return 0; }
        p->t2 = m.ta; p->t3 = m.tb; p->have |= 2 | 4;
    }
    return complete(e, p);
}

/* Stamp in a control buffer: hardware when non-zero, else software; 0 when none. */
static int read_cmsgs(struct msghdr *h, int64_t *ns, int *hw, struct sock_extended_err **ee) {
    int found = 0;
    *ee = NULL;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING_OLD &&
            c->cmsg_len >= CMSG_LEN(3 * sizeof(struct timespec))) {
            struct timespec ts[3];
            memcpy(ts, CMSG_DATA(c), sizeof(ts));
            if (ts[2].tv_sec || ts[2].tv_nsec) {
                *ns = (int64_t)ts[2].tv_sec * 1000000000LL + ts[2].tv_nsec; *hw = 1; found = 1;
            } else if (ts[0].tv_sec || ts[0].tv_nsec) {
                *ns = (int64_t)ts[0].tv_sec * 1000000000LL + ts[0].tv_nsec; *hw = 0; found = 1;
            }
        } else if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR &&
                   c->cmsg_len >= CMSG_LEN(sizeof(struct sock_extended_err))) {
            *ee = (struct sock_extended_err *)CMSG_DATA(c);
        }
    }
    return found;
}

static void prep_ring(Engine *e, int errq) {
    for (int i = 0; i < RING; i++) {
        e->riov[i].iov_base = e->rdata[i];
        e->riov[i].iov_len = SLOT;
        struct msghdr *h = &e->rhdr[i].msg_hdr;
        h->msg_name = errq ? NULL : &e->rname[i];
        h->msg_namelen = errq ? 0 : sizeof(e->rname[i]);
        h->msg_iov = &e->riov[i];
        h->msg_iovlen = 1;
        h->msg_control = e->rctl[i];
        h->msg_controllen = CTL;
        h->msg_flags = 0;
        e->rhdr[i].msg_len = 0;
    }
}

static int defer_err(Engine *e, int si, struct msghdr *h, size_t len) {
    /* an ICMP error (or anything else) from the error queue: Python parses it */
    if (!e->deferred && !(e->deferred = PyList_New(0))) return -1;
    PyObject *cm = PyList_New(0);
    if (!cm) return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
        PyObject *t = Py_BuildValue("(iiy#)", c->cmsg_level, c->cmsg_type,
                                    (const char *)CMSG_DATA(c),
                                    (Py_ssize_t)(c->cmsg_len - CMSG_LEN(0)));
        if (!t || PyList_Append(cm, t) < 0) { Py_XDECREF(t); Py_DECREF(cm); return -1; }
        Py_DECREF(t);
    }
    PyObject *t = Py_BuildValue("(iy#N)", e->socks[si].port, (const char *)h->msg_iov->iov_base,
                                (Py_ssize_t)len, cm);
    if (!t) return -1;
    int rc = PyList_Append(e->deferred, t);
    Py_DECREF(t);
    return rc;
}

/* The TX stamp `tx` of the datagram sent with `token`: a probe's t1, or a reply's t3 (a
 * FOLLOW_UP now, or held for the initiator when deferring). */
static int on_tx(Engine *e, int64_t token, int64_t tx, int64_t now) {
    if (token >= REPLY_TOKEN_BASE) {
        int64_t ctr = token - REPLY_TOKEN_BASE;
        Await *a = &e->aw[ctr & e->amask];
        if (!a->live || a->ctr != ctr) { e->counters[C_LATE_TX_STAMP]++; return 0; }
        a->live = 0;
        e->nawait--;
        int64_t t3 = tx >= 0 ? (tx > a->ta ? tx : a->ta) : a->ta;
        Held *h = NULL;
        if (a->defer && held_find(e, a->peer, 1, &h) < 0) return -1;
        if (h) {
            if (h->n == MAX_HELD && send_held(e, h) < 0) return -1;
            if (!h->n) h->since = now;
            h->seq[h->n] = a->seq;
            h->t3[h->n] = t3;
            h->n++;
            h->dest = a->dest;
            e->counters[C_T3_HELD]++;
            return 0;
        }
        Out *o = out_slot(e);
        if (!o) return -1;
        o->sock = e->responder;
        o->token = e->stamp_followups ? -1 : -2;
        o->dest = a->dest;
        o->len = BODY;
        encode(o->data, 3, 0, a->pos, e->nic, a->peer, a->seq, a->pair, a->ta, t3, 0);
        seal(e, o);
        e->counters[C_FOLLOW_UPS]++;
        return 0;
    }
    Pend *p = &e->pend[(uint32_t)token & e->pmask];
    if (!p->live || p->seq != (uint32_t)token || (p->have & 1)) {
        e->counters[C_LATE_TX_STAMP]++;
        return 0;
    }
    p->t1 = tx;
    p->have |= 1;
    return complete(e, p);
}

/* Read the error queue of socket si: TX stamps -> t1 / follow-ups; the rest deferred. */
static int drain_errq(Engine *e, int si, int64_t now) {
    Sock *s = &e->socks[si];
    for (int round = 0; round < 64; round++) {
        prep_ring(e, 1);
        int n = recvmmsg(s->fd, e->rhdr, RING, MSG_ERRQUEUE | MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return 0;
            count_err(e->err_errq, errno);
            return 0;
        }
        e->drained += n;
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &e->rhdr[i].msg_hdr;
            int64_t ns = 0;
            int hw = 0, cerr = 0;
            struct sock_extended_err *ee;
            int stamped = read_cmsgs(h, &ns, &hw, &ee);
            if (!ee) { e->counters[C_ERRQUEUE_UNKNOWN]++; continue; }
            if (ee->ee_origin != SO_EE_ORIGIN_TIMESTAMPING) {
                if (defer_err(e, si, h, e->rhdr[i].msg_len) < 0) return -1;
                continue;
            }
            uint32_t k = ee->ee_data, j = k & s->kmask;
            if (!s->tvalid[j] || s->key[j] != k || !stamped) continue;
            s->tvalid[j] = 0;
            e->counters[hw ? C_STAMP_HW : C_STAMP_SW]++;
            int64_t tx = map_clock(e, ns, &cerr);
            if (cerr || on_tx(e, s->tok[j], tx, now) < 0) return -1;
        }
        if (n < RING) return 0;
    }
    return 0;
}

static int drain_data(Engine *e, int si, int64_t now) {
    Sock *s = &e->socks[si];
    for (int round = 0; round < 64; round++) {
        prep_ring(e, 0);
        int n = recvmmsg(s->fd, e->rhdr, RING, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno == EAGAIN) return 0;
            if (errno == EINTR) continue;
            count_err(e->err_recv, errno); /* e.g. ECONNREFUSED from IP_RECVERR: details queued */
            if (drain_errq(e, si, now) < 0) return -1;
            continue;
        }
        e->drained += n;
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &e->rhdr[i].msg_hdr;
            int64_t ns = 0, rx;
            int hw = 0, cerr = 0;
            struct sock_extended_err *ee;
            if (h->msg_flags & MSG_TRUNC) { e->counters[C_RX_OVERSIZED]++; continue; }
            if (read_cmsgs(h, &ns, &hw, &ee)) {
                e->counters[hw ? C_STAMP_HW : C_STAMP_SW]++;
                rx = map_clock(e, ns, &cerr);
                if (cerr) return -1;
            } else {
                e->counters[C_STAMP_USER]++;
                rx = now;
            }
            if (process(e, e->rdata[i], e->rhdr[i].msg_len, &e->rname[i], rx, now) < 0) return -1;
        }
        if (n < RING) return 0;
    }
    return 0;
}

/* ---- Python methods ----------------------------------------------------------------------- */

static PyObject *take_deferred(Engine *e) {
    if (!e->deferred) Py_RETURN_NONE;
    PyObject *d = e->deferred;
    e->deferred = NULL;
    return d;
}

static int sock_index(Engine *e, PyObject *arg, int *si) {
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0 || i >= e->nsocks) {
        PyErr_SetString(PyExc_IndexError, "no such socket");
        return -1;
    }
    *si = (int)i;
    return 0;
}

/* After sending: read the TX stamps the kernel already has (software stamps are queued during
 * the send), so follow-ups and t1 do not wait for another readiness callback. With
 * `defer_probes`, only the replies' stamps are read now (their follow-ups wait for them); a
 * probe's t1 stays queued until its socket is read next: by the send of the coded pair's
 * second probe 20 us later (one error-queue read for both stamps), else by the next tick
 * (epoll reports the queued stamp as EPOLLERR). */
static int settle(Engine *e, int64_t now, int defer_probes) {
    for (int round = 0; round < 4 && e->nout; round++) {
        uint8_t touched[1024] = {0};
        int many = 0;
        for (int i = 0; i < e->nout; i++) {
            int si = e->out[i].sock;
            int64_t tok = e->out[i].token;
            if (tok == -2) continue; /* unstamped follow-up: nothing to read back */
            if (defer_probes && tok >= 0 && tok < REPLY_TOKEN_BASE) continue; /* a probe's t1 */
            if (si < 1024) touched[si] = 1; else many = 1;
        }
        if (flush_out(e) < 0) return -1;
        for (int si = 0; si < e->nsocks; si++)
            if ((si < 1024 && touched[si]) || (si >= 1024 && many))
                if (drain_errq(e, si, now) < 0) return -1;
    }
    return flush_out(e);
}

static PyObject *Engine_drain(Engine *e, PyObject *args) {
    PyObject *sarg;
    long long now;
    int si;
    if (!PyArg_ParseTuple(args, "OL", &sarg, &now) || sock_index(e, sarg, &si) < 0) return NULL;
    if (drain_errq(e, si, now) < 0 || drain_data(e, si, now) < 0 || settle(e, now, 0) < 0)
        return NULL;
    return take_deferred(e);
}

/* Drain every socket epoll reports ready (data or error queue), up to 8 rounds of 128 events;
 * sets last_drained. Returns -1 with a Python error set on failure. */
static int drain_epoll(Engine *e, int64_t now) {
    struct epoll_event evs[128];
    e->drained = 0;
    for (int round = 0; round < 8; round++) {
        int n = epoll_wait(e->epfd, evs, 128, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            int si = (int)evs[i].data.u32;
            if (si >= e->nsocks || e->socks[si].dead) continue;
            /* the error queue only when epoll says it holds something (EPOLLERR): most
             * readiness is a datagram, and an empty error-queue read is a wasted system call */
            if ((evs[i].events & EPOLLERR) && drain_errq(e, si, now) < 0) return -1;
            if ((evs[i].events & EPOLLIN) && drain_data(e, si, now) < 0) return -1;
        }
        if (n < 128) break;
    }
    e->last_drained = e->drained;
    return 0;
}

/* Drain every socket epoll says is ready (data or error queue), then send what that made. */
static PyObject *Engine_drain_ready(Engine *e, PyObject *args) {
    long long now;
    if (!PyArg_ParseTuple(args, "L", &now)) return NULL;
    if (drain_epoll(e, now) < 0) return NULL;
    if (settle(e, now, 0) < 0) return NULL;
    return take_deferred(e);
}

static PyObject *Engine_epoll_fd(Engine *e, void *Py_UNUSED(c)) { return PyLong_FromLong(e->epfd); }

static PyObject *Engine_held(Engine *e, void *Py_UNUSED(c)) { return PyLong_FromSsize_t(e->nrows); }

static PyObject *Engine_last_drained(Engine *e, void *Py_UNUSED(c)) {
    return PyLong_FromLong(e->last_drained);
}

/* Queue every probe due by now for sending (the second probe of a coded pair goes back on the
 * queue, due `spacing` later); nothing is sent yet. Returns -1 on a Python error. */
static int take_due(Engine *e, int64_t now);

static PyObject *Engine_send_due(Engine *e, PyObject *args) {
    long long now;
    if (!PyArg_ParseTuple(args, "L", &now)) return NULL;
    if (take_due(e, now) < 0) return NULL;
    if (settle(e, now, 0) < 0) return NULL;
    return take_deferred(e); /* ICMP errors read from the error queues while settling */
}

/* One tick of a NIC driven by a shared timer (prober.compiled.CompiledDriver): drain every
 * socket epoll reports ready (answering probes, matching replies), queue the probes due by now,
 * then send all of it (one sendmmsg per socket) and read the TX stamps that sending queued.
 * One call per NIC and tick instead of a readiness callback, a drain and a flush. */
static PyObject *Engine_tick(Engine *e, PyObject *args) {
    long long now;
    if (!PyArg_ParseTuple(args, "L", &now)) return NULL;
    if (drain_epoll(e, now) < 0) return NULL;
    if (take_due(e, now) < 0) return NULL;
    if (settle(e, now, 1) < 0) return NULL;
    return take_deferred(e);
}

static int take_due(Engine *e, int64_t now) {
    long sent = 0;
    while (e->qn && e->q[0].at <= now) {
        Queued q;
        qpop(e, &q);
        Pend *p = &e->pend[e->next_seq & e->pmask];
        int32_t si = e->port_sock[q.sport];
        if (e->npending >= e->max_pending || p->live) {
            e->counters[C_OVERFLOW]++;
        } else if (si < 0) {
            e->counters[C_NO_SOCKET]++;
        } else {
            uint32_t seq = e->next_seq++;
            memset(p, 0, sizeof(*p));
            p->live = 1; p->seq = seq; p->dst = q.dst; p->dst_hash = q.dst_hash; p->sport = q.sport;
            p->pair = q.pair; p->pos = q.pos; p->sent = now;
            e->npending++;
            Out *o = out_slot(e);
            if (!o) return -1;
            o->sock = si;
            o->token = seq;
            o->dest = q.dest;
            o->len = BODY + e->pad;
            encode(o->data, 1, e->defer ? FLAG_DEFER_OK : 0, q.pos, e->nic, q.dst_hash, seq,
                   q.pair, 0, 0, e->pad);
            seal(e, o);
            sent++;
        }
        if (q.spacing >= 0) { /* the second probe of a coded pair */
            q.at = now + q.spacing;
            q.order = ++e->order;
            q.pos = 1;
            q.spacing = -1;
            if (qpush(e, &q) < 0) return -1;
        }
    }
    (void)sent;
    return 0;
}

static PyObject *Engine_queue(Engine *e, PyObject *args) {
    Queued q;
    long long at, spacing;
    unsigned long long dst_hash;
    const char *ip;
    int port, dst, sport, pair, pos;
    if (!PyArg_ParseTuple(args, "LiKsiiiiL", &at, &dst, &dst_hash, &ip, &port, &sport, &pair,
                          &pos, &spacing))
        return NULL;
    memset(&q, 0, sizeof(q));
    q.dest.sin_family = AF_INET;
    q.dest.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &q.dest.sin_addr) != 1 || sport < 0 || sport > 65535 ||
        port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "bad destination %s:%d or source port %d", ip, port, sport);
        return NULL;
    }
    if (pair == -2) { /* a coded pair: the engine numbers it */
        pair = (int)e->next_pair;
        e->next_pair = (e->next_pair + 1) & 0x7FFFFFFFu;
    }
    q.at = at; q.order = ++e->order; q.dst = dst; q.dst_hash = dst_hash; q.sport = (uint16_t)sport;
    q.pair = pair; q.pos = (uint8_t)pos; q.spacing = spacing;
    if (qpush(e, &q) < 0) return NULL;
    return PyLong_FromLong(pair);
}

/* Timeouts due by `now` (lost rows, stale replies) and the held t3s past their hold time.
 * Returns -1 with a Python error set on failure. */
static int poll_engine(Engine *e, int64_t now) {
    while (e->oldest_seq != e->next_seq) {
        Pend *p = &e->pend[e->oldest_seq & e->pmask];
        if (p->live && p->seq == e->oldest_seq) {
            if (p->sent + e->timeout > now) break;
            p->live = 0;
            e->npending--;
            if (p->have & 8) {
                e->counters[C_INCOMPLETE]++;
            } else {
                int64_t r[NCOL] = {p->seq, p->dst, p->sport, p->pair, p->pos,
                                   (p->have & 1) ? p->t1 : MISSING, MISSING, MISSING, MISSING, 1,
                                   p->sent};
                if (add_row(e, r) < 0) return -1;
                e->counters[C_LOST]++;
            }
        }
        e->oldest_seq++;
    }
    int64_t cutoff = now - e->timeout;
    while (e->aw_oldest < e->aw_next) {
        Await *a = &e->aw[e->aw_oldest & e->amask];
        if (a->live && a->ctr == e->aw_oldest) {
            if (a->created > cutoff) break;
            a->live = 0;
            e->nawait--;
            e->counters[C_TX_STAMP_MISSING]++;
        }
        e->aw_oldest++;
    }
    long flushed = flush_held(e, now, 0);
    if (flushed < 0 || (flushed && flush_out(e) < 0)) return -1;
    return 0;
}

static PyObject *Engine_poll(Engine *e, PyObject *args) {
    long long now;
    if (!PyArg_ParseTuple(args, "L", &now)) return NULL;
    if (poll_engine(e, now) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Engine_flush_held(Engine *e, PyObject *args) {
    long long now;
    int all = 0;
    if (!PyArg_ParseTuple(args, "L|p", &now, &all)) return NULL;
    long flushed = flush_held(e, now, all);
    if (flushed < 0 || (flushed && flush_out(e) < 0)) return NULL;
    return PyLong_FromLong(flushed);
}

static PyObject *Engine_feed_tx(Engine *e, PyObject *args) {
    /* a TX stamp as if read from socket `index`'s error queue with OPT_ID key `key` (tests) */
    PyObject *sarg;
    unsigned long key;
    long long ns, now;
    int si;
    if (!PyArg_ParseTuple(args, "OkLL", &sarg, &key, &ns, &now) || sock_index(e, sarg, &si) < 0)
        return NULL;
    Sock *s = &e->socks[si];
    uint32_t k = (uint32_t)key, j = k & s->kmask;
    if (!s->tvalid[j] || s->key[j] != k) Py_RETURN_FALSE;
    s->tvalid[j] = 0;
    if (on_tx(e, s->tok[j], ns, now) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Engine_take(Engine *e, PyObject *Py_UNUSED(ignored)) {
    if (!e->nrows) Py_RETURN_NONE;
    PyObject *b = PyBytes_FromStringAndSize((const char *)e->rows,
                                            e->nrows * NCOL * (Py_ssize_t)sizeof(int64_t));
    if (b) e->nrows = 0;
    return b;
}

static PyObject *Engine_take_counters(Engine *e, PyObject *Py_UNUSED(ignored)) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < C_N; i++) {
        if (!e->counters[i]) continue;
        PyObject *v = PyLong_FromLongLong(e->counters[i]);
        if (!v || PyDict_SetItemString(d, COUNTER_NAMES[i], v) < 0) { Py_XDECREF(v); Py_DECREF(d); return NULL; }
        Py_DECREF(v);
        e->counters[i] = 0;
    }
    const char *kinds[3] = {"send_error", "recv_error", "errqueue_error"};
    int64_t *arrs[3] = {e->err_send, e->err_recv, e->err_errq};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < MAXERRNO; i++) {
            if (!arrs[k][i]) continue;
            PyObject *key = Py_BuildValue("(si)", kinds[k], i);
            PyObject *v = PyLong_FromLongLong(arrs[k][i]);
            if (!key || !v || PyDict_SetItem(d, key, v) < 0) {
                Py_XDECREF(key); Py_XDECREF(v); Py_DECREF(d); return NULL;
            }
            Py_DECREF(key); Py_DECREF(v);
            arrs[k][i] = 0;
        }
    return d;
}

static PyObject *Engine_add_socket(Engine *e, PyObject *args) {
    int fd, port, responder = 0, kbits = 10;
    if (!PyArg_ParseTuple(args, "ii|pi", &fd, &port, &responder, &kbits)) return NULL;
    if (port < 0 || port > 65535 || kbits < 4 || kbits > 20) {
        PyErr_SetString(PyExc_ValueError, "bad port or key ring size");
        return NULL;
    }
    Sock *n = PyMem_Realloc(e->socks, (size_t)(e->nsocks + 1) * sizeof(Sock));
    if (!n) return PyErr_NoMemory();
    e->socks = n;
    Sock *s = &e->socks[e->nsocks];
    memset(s, 0, sizeof(*s));
    s->fd = fd;
    s->port = port;
    s->kmask = (1u << kbits) - 1;
    s->tok = PyMem_Calloc((size_t)s->kmask + 1, sizeof(int64_t));
    s->key = PyMem_Calloc((size_t)s->kmask + 1, sizeof(uint32_t));
    s->tvalid = PyMem_Calloc((size_t)s->kmask + 1, 1);
    if (!s->tok || !s->key || !s->tvalid) {
        PyMem_Free(s->tok); PyMem_Free(s->key); PyMem_Free(s->tvalid);
        return PyErr_NoMemory();
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)e->nsocks};
    if (e->epfd >= 0 && epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        PyMem_Free(s->tok); PyMem_Free(s->key); PyMem_Free(s->tvalid);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (responder) e->responder = e->nsocks;
    else e->port_sock[port] = e->nsocks;
    return PyLong_FromLong(e->nsocks++);
}

static PyObject *Engine_take_renumber(Engine *e, PyObject *Py_UNUSED(ignored)) {
    if (!e->renumber) Py_RETURN_NONE;
    PyObject *r = e->renumber;
    e->renumber = NULL;
    return r;
}

static PyObject *Engine_replace_socket(Engine *e, PyObject *args) {
    PyObject *sarg;
    int si, fd;
    if (!PyArg_ParseTuple(args, "Oi", &sarg, &fd) || sock_index(e, sarg, &si) < 0) return NULL;
    Sock *s = &e->socks[si];
    s->tainted = 0;
    if (fd < 0) {
        s->dead = 1;
    } else {
        s->fd = fd;
        s->dead = 0;
        s->sent = 0;
        memset(s->tvalid, 0, (size_t)s->kmask + 1);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)si};
        if (e->epfd >= 0 && epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (flush_out(e) < 0) return NULL; /* what waited for the new socket */
    Py_RETURN_NONE;
}

static PyObject *Engine_note_sent(Engine *e, PyObject *args) {
    PyObject *sarg;
    int si;
    if (!PyArg_ParseTuple(args, "O", &sarg) || sock_index(e, sarg, &si) < 0) return NULL;
    e->socks[si].sent++; /* a stamped send Python made on this socket (no token wanted) */
    Py_RETURN_NONE;
}

static PyObject *Engine_forget_sockets(Engine *e, PyObject *Py_UNUSED(ignored)) {
    for (int i = 0; i < e->nsocks; i++) {
        PyMem_Free(e->socks[i].tok); PyMem_Free(e->socks[i].key); PyMem_Free(e->socks[i].tvalid);
    }
    PyMem_Free(e->socks);
    e->socks = NULL;
    e->nsocks = 0;
    e->responder = -1;
    for (int i = 0; i < 65536; i++) e->port_sock[i] = -1;
    Py_RETURN_NONE;
}

static PyObject *Engine_set_clock(Engine *e, PyObject *clock) {
    if (clock != Py_None && !PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "clock must be None or callable");
        return NULL;
    }
    Py_INCREF(clock);
    Py_XSETREF(e->clock, clock);
    Py_RETURN_NONE;
}

static PyObject *Engine_next_send_ns(Engine *e, PyObject *Py_UNUSED(ignored)) {
    if (!e->qn) Py_RETURN_NONE;
    return PyLong_FromLongLong(e->q[0].at);
}

static PyObject *Engine_next_timeout_ns(Engine *e, PyObject *Py_UNUSED(ignored)) {
    uint32_t s = e->oldest_seq;
    while (s != e->next_seq) {
        Pend *p = &e->pend[s & e->pmask];
        if (p->live && p->seq == s) return PyLong_FromLongLong(p->sent + e->timeout);
        s++;
    }
    Py_RETURN_NONE;
}

/* When the oldest held t3 of any initiator is `hold` old (poll sends it then), or None when
 * nothing is held: an endpoint's own timer wakes for it (one pass over the held table). */
static PyObject *Engine_next_flush_ns(Engine *e, PyObject *Py_UNUSED(ignored)) {
    int found = 0;
    int64_t at = 0;
    for (uint32_t j = 0; e->htab && j <= e->hmask; j++) {
        Held *h = &e->htab[j];
        if (!h->used || !h->n) continue;
        if (!found || h->since + e->hold < at) at = h->since + e->hold;
        found = 1;
    }
    if (!found) Py_RETURN_NONE;
    return PyLong_FromLongLong(at);
}

static PyObject *Engine_stats(Engine *e, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{s:L,s:L,s:n,s:I}", "pending", (long long)e->npending, "awaiting_tx",
                         (long long)e->nawait, "queued", e->qn, "held_initiators", e->hused);
}

static PyObject *Engine_feed(Engine *e, PyObject *args) {
    /* process one datagram as if received (tests); replies are queued as if on the wire */
    Py_buffer buf;
    const char *ip;
    int port;
    long long rx, now;
    if (!PyArg_ParseTuple(args, "y*(si)LL", &buf, &ip, &port, &rx, &now)) return NULL;
    struct sockaddr_in src;
    memset(&src, 0, sizeof(src));
    src.sin_family = AF_INET;
    src.sin_port = htons((uint16_t)port);
    int ok = inet_pton(AF_INET, ip, &src.sin_addr) == 1;
    int rc = ok ? process(e, buf.buf, (size_t)buf.len, &src, rx, now) : 0;
    PyBuffer_Release(&buf);
    if (!ok) { PyErr_Format(PyExc_ValueError, "bad address %s", ip); return NULL; }
    if (rc < 0) return NULL;
    return take_deferred(e);
}

static PyObject *Engine_queued(Engine *e, PyObject *Py_UNUSED(ignored)); /* _fastbatch.h */

static PyMethodDef Engine_methods[] = {
    {"queued", (PyCFunction)Engine_queued, METH_NOARGS,
     "queued() -> the probes queued and not sent yet, in send order (for tests)"},
    {"add_socket", (PyCFunction)Engine_add_socket, METH_VARARGS,
     "add_socket(fd, port, responder=False, key_bits=10) -> index"},
    {"forget_sockets", (PyCFunction)Engine_forget_sockets, METH_NOARGS, "drop every socket"},
    {"take_renumber", (PyCFunction)Engine_take_renumber, METH_NOARGS,
     "take_renumber() -> socket indices whose send was refused (replace them), or None"},
    {"replace_socket", (PyCFunction)Engine_replace_socket, METH_VARARGS,
     "replace_socket(index, fd): the socket's fresh replacement (fd -1: none); sends what waited"},
    {"note_sent", (PyCFunction)Engine_note_sent, METH_VARARGS,
     "note_sent(index): Python sent one stamped datagram wanting no stamp on this socket"},
    {"queue", (PyCFunction)Engine_queue, METH_VARARGS,
     "queue(at_ns, dst_index, dst_hash, ip, port, sport, pair_id, pair_pos, spacing_ns)"},
    {"send_due", (PyCFunction)Engine_send_due, METH_VARARGS,
     "send_due(now_ns) -> deferred list or None: send due probes (and queued replies)"},
    {"tick", (PyCFunction)Engine_tick, METH_VARARGS,
     "tick(now_ns) -> deferred list or None: drain_ready, then send_due, in one call"},
    {"drain", (PyCFunction)Engine_drain, METH_VARARGS,
     "drain(index, now_ns) -> deferred list or None"},
    {"drain_ready", (PyCFunction)Engine_drain_ready, METH_VARARGS,
     "drain_ready(now_ns) -> deferred list or None: every socket epoll reports ready"},
    {"feed", (PyCFunction)Engine_feed, METH_VARARGS,
     "feed(data, (ip, port), rx_ns, now_ns) -> deferred list or None (no socket read)"},
    {"poll", (PyCFunction)Engine_poll, METH_VARARGS,
     "poll(now_ns): timeouts -> lost rows; held t3s older than hold_ns are sent"},
    {"flush_held", (PyCFunction)Engine_flush_held, METH_VARARGS,
     "flush_held(now_ns, all=False) -> FOLLOW_UPs sent for held t3s (all: whatever their age)"},
    {"feed_tx", (PyCFunction)Engine_feed_tx, METH_VARARGS,
     "feed_tx(index, key, tx_ns, now_ns) -> bool: a TX stamp as if from the error queue"},
    {"take", (PyCFunction)Engine_take, METH_NOARGS, "take() -> bytes of int64 rows or None"},
    {"take_counters", (PyCFunction)Engine_take_counters, METH_NOARGS,
     "take_counters() -> {name or (kind, errno): increment since the last call}"},
    {"set_clock", (PyCFunction)Engine_set_clock, METH_O,
     "set_clock(None or callable(kernel ns) -> NIC ns)"},
    {"next_send_ns", (PyCFunction)Engine_next_send_ns, METH_NOARGS, ""},
    {"next_timeout_ns", (PyCFunction)Engine_next_timeout_ns, METH_NOARGS, ""},
    {"next_flush_ns", (PyCFunction)Engine_next_flush_ns, METH_NOARGS,
     "next_flush_ns() -> when poll sends the oldest held t3 (since + hold_ns), or None"},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, ""},
    {NULL, NULL, 0, NULL},
};

/* Precompute the HMAC keys of `seq` (None or a sequence of bytes, each >= 16 bytes: the send
 * key first) into keys; return how many, or -1 with a Python error. */
static int parse_keys(PyObject *seq, HmacKey keys[MAX_KEYS]) {
    if (seq == Py_None) return 0;
    PyObject *fast = PySequence_Fast(seq, "keys must be None or a sequence of bytes");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_KEYS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "at most %d keys", MAX_KEYS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) < 16) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "HMAC key must be bytes, at least 16 of them");
            return -1;
        }
        hmac_key(&keys[i], (const uint8_t *)PyBytes_AS_STRING(k), (size_t)PyBytes_GET_SIZE(k));
    }
    Py_DECREF(fast);
    return (int)n;
}

static uint32_t pow2_at_least(int64_t n) {
    uint32_t p = 1024;
    while (p < n && p < (1u << 20)) p <<= 1;
    return p;
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"nic_hash", "timeout_ns", "max_pending", "pad", "seq_start", "clock",
                            "stamp_followups", "unstamped_count", "defer", "hold_ns", "keys",
                            NULL};
    unsigned long long nic, seq_start = 0;
    long long timeout, max_pending, hold = 250000000LL;
    int pad = 0, stamp_fu = 1, unstamped = 0, defer_fu = 0;
    PyObject *clock = Py_None, *keys = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KLL|iKOpppLO", names, &nic, &timeout,
                                     &max_pending, &pad, &seq_start, &clock, &stamp_fu,
                                     &unstamped, &defer_fu, &hold, &keys))
        return -1;
    if (e->pend) {
        PyErr_SetString(PyExc_RuntimeError, "Engine already initialised");
        return -1;
    }
    int nkeys = parse_keys(keys, e->keys);
    if (nkeys < 0) return -1;
    e->nkeys = nkeys;
    if (timeout <= 0 || max_pending <= 0 || pad < 0 || pad > SLOT - BODY - (nkeys ? TAG : 0) ||
        hold < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "timeout_ns and max_pending must be positive, pad small, hold_ns >= 0");
        return -1;
    }
    e->nic = nic; e->timeout = timeout; e->max_pending = max_pending; e->pad = pad;
    e->stamp_followups = stamp_fu; e->unstamped_count = unstamped;
    e->defer = defer_fu; e->hold = hold;
    Py_INCREF(clock);
    e->clock = clock;
    uint32_t p = pow2_at_least(max_pending < 65536 ? max_pending : 65536);
    e->pmask = p - 1;
    e->amask = p - 1;
    e->pend = PyMem_Calloc(p, sizeof(Pend));
    e->aw = PyMem_Calloc(p, sizeof(Await));
    e->out = PyMem_Calloc(OUTMAX, sizeof(Out));
    e->rdata = PyMem_Calloc(RING, SLOT);
    if (!e->pend || !e->aw || !e->out || !e->rdata) { PyErr_NoMemory(); return -1; }
    e->next_seq = e->oldest_seq = (uint32_t)seq_start;
    e->responder = -1;
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (e->epfd < 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
    for (int i = 0; i < 65536; i++) e->port_sock[i] = -1;
    return 0;
}

static void Engine_dealloc(Engine *e) {
    for (int i = 0; i < e->nsocks; i++) {
        PyMem_Free(e->socks[i].tok); PyMem_Free(e->socks[i].key); PyMem_Free(e->socks[i].tvalid);
    }
    PyMem_Free(e->socks);
    PyMem_Free(e->q); PyMem_Free(e->pend); PyMem_Free(e->aw); PyMem_Free(e->rows);
    PyMem_Free(e->out); PyMem_Free(e->rdata); PyMem_Free(e->htab);
    Py_XDECREF(e->clock);
    Py_XDECREF(e->deferred);
    Py_XDECREF(e->renumber);
    explicit_bzero(e->keys, sizeof(e->keys)); /* the padded-key states stand for the keys */
    if (e->epfd > 0) close(e->epfd);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Engine_get_pending(Engine *e, void *Py_UNUSED(c)) {
    return PyLong_FromLongLong(e->npending);
}

static PyGetSetDef Engine_getset[] = {
    {"pending", (getter)Engine_get_pending, NULL, "probes awaiting their reply or stamps", NULL},
    {"epoll_fd", (getter)Engine_epoll_fd, NULL, "the epoll fd of all sockets (readable: work)",
     NULL},
    {"held", (getter)Engine_held, NULL, "result rows not taken yet", NULL},
    {"last_drained", (getter)Engine_last_drained, NULL,
     "datagrams and error-queue entries the last drain_ready read", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prober._fastpath.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled datagram loop of one NIC (see prober/compiled.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};

/* decode(data, keys=None) -> reason string, or (mtype, sender, peer, seq, pair_id, pair_pos,
 * ta, tb, t3_final, pad, trace, defer_ok, t3s): the parser alone, for tests against
 * prober.wire.Codec (keys: the send key first, as Engine's). */
static PyObject *py_decode(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer buf;
    PyObject *keys = Py_None;
    HmacKey hk[MAX_KEYS];
    if (!PyArg_ParseTuple(args, "y*|O", &buf, &keys)) return NULL;
    int nkeys = parse_keys(keys, hk);
    if (nkeys < 0) { PyBuffer_Release(&buf); return NULL; }
    Msg msg;
    int why = decode(hk, nkeys, buf.buf, (size_t)buf.len, &msg);
    explicit_bzero(hk, sizeof(hk));
    PyBuffer_Release(&buf);
    if (why >= 0) return PyUnicode_FromString(COUNTER_NAMES[why]);
    PyObject *t3s = PyTuple_New(msg.nt3);
    if (!t3s) return NULL;
    for (int i = 0; i < msg.nt3; i++) {
        PyObject *t = Py_BuildValue("(kL)", (unsigned long)rd32(msg.t3p + i * T3E),
                                    (long long)rd64(msg.t3p + i * T3E + 4));
        if (!t) { Py_DECREF(t3s); return NULL; }
        PyTuple_SET_ITEM(t3s, i, t);
    }
    return Py_BuildValue("(iKKkiiLLOiOON)", msg.mtype, (unsigned long long)msg.sender,
                         (unsigned long long)msg.peer, (unsigned long)msg.seq, (int)msg.pair,
                         msg.pos, (long long)msg.ta, (long long)msg.tb,
                         msg.t3_final ? Py_True : Py_False, msg.pad,
                         msg.trace ? Py_True : Py_False, msg.defer_ok ? Py_True : Py_False, t3s);
}

/* hmac_sha256(key, data) -> the 32-byte HMAC-SHA256 through the engine's code (precomputed
 * key states; any key length), and sha256(data): for known-answer tests (RFC 4231, FIPS). */
static PyObject *py_hmac_sha256(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) return NULL;
    HmacKey k;
    uint8_t out[32];
    hmac_key(&k, key.buf, (size_t)key.len);
    hmac_sha256(&k, data.buf, (size_t)data.len, out);
    explicit_bzero(&k, sizeof(k));
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

static PyObject *py_sha256(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    uint8_t out[32];
    sha256_finish(SHA_IV, 0, data.buf, (size_t)data.len, out);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

#include "_fastbatch.h" /* tick_all, queue_rows: one call for all engines */
#include "_fastplan.h"  /* Plan, queue_plan, draws: the schedule's due rows in C */

static PyMethodDef module_methods[] = {
    {"tick_all", py_tick_all, METH_VARARGS,
     "tick_all(engines, poll_ns, spin_ns) -> [(index, deferred, renumber, error)] or None"},
    {"queue_rows", py_queue_rows, METH_VARARGS,
     "queue_rows(engines, table, rows, offsets, plan_now_ns, spacing_ns, coded) -> "
     "(queued, [(index, sport)] or None)"},
    {"queue_plan", py_queue_plan, METH_VARARGS,
     "queue_plan(plan, engines, until_ns, plan_now_ns, offset_ns, spacing_ns, coded) -> "
     "(queued, [(index, sport)] or None)"},
    {"draws", py_draws, METH_VARARGS,
     "draws(state, floats, shuffle_len) -> (floats, permutation, state after)"},
    {"decode", py_decode, METH_VARARGS,
     "decode(data, keys=None) -> reason or message fields (keys: send key first)"},
    {"hmac_sha256", py_hmac_sha256, METH_VARARGS, "hmac_sha256(key, data) -> 32-byte tag"},
    {"sha256", py_sha256, METH_VARARGS, "sha256(data) -> 32-byte digest"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "prober._fastpath", "The prober's compiled datagram loop.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "NCOL", NCOL);
    PyModule_AddIntConstant(m, "SLOT", SLOT);
    PyModule_AddIntConstant(m, "TAG", TAG);
    return m;
}
