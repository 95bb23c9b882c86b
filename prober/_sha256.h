/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for the prober's engine (prober/_fastpath.c):
 * header-only (static functions), no library. An HMAC key's inner and outer padded blocks are
 * compressed once (`hmac_key`), so a tag of a 48-byte probe costs two compressions. Checked
 * against RFC 4231 and FIPS vectors and hashlib in tests/test_prober_compiled_auth.py. */
#ifndef QPMESH_SHA256_H
#define QPMESH_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t sha_rd32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void sha_wr32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void sha_wr64(uint8_t *p, uint64_t v) {
    sha_wr32(p, (uint32_t)(v >> 32)); sha_wr32(p + 4, (uint32_t)v);
}

static const uint32_t SHA_IV[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* One compression of the 64-byte block p into state s. */
static void sha256_block(uint32_t s[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = sha_rd32(p + 4 * i);
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR32(w[i - 15], 7) ^ ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR32(w[i - 2], 17) ^ ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s[0], b = s[1], c = s[2], d = s[3], x = s[4], f = s[5], g = s[6], h = s[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR32(x, 6) ^ ROR32(x, 11) ^ ROR32(x, 25)) + ((x & f) ^ (~x & g)) +
                      SHA_K[i] + w[i];
        uint32_t t2 = (ROR32(a, 2) ^ ROR32(a, 13) ^ ROR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = x; x = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s[0] += a; s[1] += b; s[2] += c; s[3] += d; s[4] += x; s[5] += f; s[6] += g; s[7] += h;
}

/* The SHA-256 digest of (`prior` bytes already compressed into `st`, a multiple of 64) + d[:n]. */
static void sha256_finish(const uint32_t st[8], uint64_t prior, const uint8_t *d, size_t n,
                          uint8_t out[32]) {
    uint32_t s[8];
    uint8_t b[128];
    uint64_t bits = (prior + n) * 8;
    memcpy(s, st, sizeof(s));
    for (; n >= 64; d += 64, n -= 64) sha256_block(s, d);
    memset(b, 0, sizeof(b));
    memcpy(b, d, n);
    b[n] = 0x80;
    size_t len = n + 9 <= 64 ? 64 : 128;
    sha_wr64(b + len - 8, bits);
    sha256_block(s, b);
    if (len == 128) sha256_block(s, b + 64);
    for (int i = 0; i < 8; i++) sha_wr32(out + 4 * i, s[i]);
}

/* One HMAC key: the states after compressing its inner (key ^ 0x36..) and outer (key ^ 0x5c..)
 * padded blocks, computed once (`hmac_key`), so a tag costs only the message's blocks + 1. */
typedef struct {
    uint32_t in[8], out[8];
} HmacKey;

static void hmac_key(HmacKey *k, const uint8_t *key, size_t n) {
    uint8_t kb[64], blk[64];
    memset(kb, 0, sizeof(kb));
    if (n > 64) sha256_finish(SHA_IV, 0, key, n, kb); /* RFC 2104: a long key is hashed first */
    else memcpy(kb, key, n);
    for (int i = 0; i < 64; i++) blk[i] = kb[i] ^ 0x36;
    memcpy(k->in, SHA_IV, sizeof(k->in));
    sha256_block(k->in, blk);
    for (int i = 0; i < 64; i++) blk[i] = kb[i] ^ 0x5c;
    memcpy(k->out, SHA_IV, sizeof(k->out));
    sha256_block(k->out, blk);
    explicit_bzero(kb, sizeof(kb));
    explicit_bzero(blk, sizeof(blk));
}

static void hmac_sha256(const HmacKey *k, const uint8_t *d, size_t n, uint8_t out[32]) {
    uint8_t inner[32];
    sha256_finish(k->in, 64, d, n, inner);
    sha256_finish(k->out, 64, inner, 32, out);
}

#endif /* QPMESH_SHA256_H */
