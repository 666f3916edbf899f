/* Helpers of the C test programs: checked calls, element values of every hcomm type. */
#ifndef HCOMM_TEST_COMMON_H
#define HCOMM_TEST_COMMON_H

#include <hcomm/hcomm.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int my_rank __attribute__((unused)) = -1;

/* A call that must succeed. */
#define CHECK(call)                                                                     \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != HCOMM_SUCCESS) {                                                     \
            fprintf(stderr, "FAIL %s:%d rank %d: %s returned %d (%s): %s\n", __FILE__,  \
                    __LINE__, my_rank, #call, rc_, hcommGetErrorString(rc_),            \
                    hcommGetLastErrorMessage());                                        \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* A call that must fail with `code`. */
#define EXPECT(code, call)                                                              \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != (code)) {                                                            \
            fprintf(stderr, "FAIL %s:%d rank %d: %s returned %d, expected %s (%d): %s\n",  \
                    __FILE__, __LINE__, my_rank, #call, rc_, #code, (code),             \
                    hcommGetLastErrorMessage());                                        \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* A condition that must hold. */
#define ASSERT(cond)                                                                    \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "FAIL %s:%d rank %d: %s\n", __FILE__, __LINE__, my_rank, #cond); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* hcommInit, after registering the transport plug-in the program was built with, if any:
 * -DTEST_TRANSPORT_PLUGIN=f links a plug-in whose `int f(void)` registers it (and the test
 * selects it with HCOMM_TRANSPORT). */
#ifdef TEST_TRANSPORT_PLUGIN
int TEST_TRANSPORT_PLUGIN(void);
#endif
static inline int test_init(int *argc, char ***argv) {
#ifdef TEST_TRANSPORT_PLUGIN
    int rc = TEST_TRANSPORT_PLUGIN();
    if (rc != HCOMM_SUCCESS) return rc;
#endif
    return hcommInit(argc, argv);
}

#define NTYPES 13
#define NOPS 8

static const size_t type_size[NTYPES] __attribute__((unused)) = {1, 1, 4, 4, 8, 8, 2,
                                                                 2, 4, 8, 1, 2, 2};
static const char *const type_name[NTYPES] __attribute__((unused)) = {
    "int8",    "uint8",   "int32", "uint32", "int64", "uint64", "float16",
    "bfloat16", "float32", "float64", "bool", "int16", "uint16"};
static const char *const op_name[NOPS] __attribute__((unused)) = {"sum", "prod", "max", "min",
                                                                  "avg", "band", "bor", "bxor"};

static inline int is_float(int t) { return t >= HCOMM_FLOAT16 && t <= HCOMM_FLOAT64; }
static inline int is_signed(int t) {
    return t == HCOMM_INT8 || t == HCOMM_INT16 || t == HCOMM_INT32 || t == HCOMM_INT64;
}
static inline int is_bitwise(int op) { return op == HCOMM_BAND || op == HCOMM_BOR || op == HCOMM_BXOR; }
/* Whether hcomm defines `op` on `t`: no bitwise operation on floats, no average of bool. */
static inline int supported(int t, int op) {
    if (is_float(t)) return !is_bitwise(op);
    return !(t == HCOMM_BOOL && op == HCOMM_AVG);
}

/* bfloat16 from float, rounded to nearest even (what hcomm does). */
static inline uint16_t bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Stores the low bits of `bits` as element i of an integer buffer. */
static inline void set_bits(int t, void *buf, size_t i, uint64_t bits) {
    unsigned char *p = (unsigned char *)buf + i * type_size[t];
    uint8_t b8 = (uint8_t)bits;
    uint16_t b16 = (uint16_t)bits;
    uint32_t b32 = (uint32_t)bits;
    switch (type_size[t]) {
    case 1: memcpy(p, &b8, 1); break;
    case 2: memcpy(p, &b16, 2); break;
    case 4: memcpy(p, &b32, 4); break;
    default: memcpy(p, &bits, 8); break;
    }
}

/* Element i of a float buffer of type t becomes v (rounded to nearest even). */
static inline void set_float(int t, void *buf, size_t i, double v) {
    unsigned char *p = (unsigned char *)buf + i * type_size[t];
    if (t == HCOMM_FLOAT16) {
        _Float16 h = (_Float16)v;
        memcpy(p, &h, 2);
    } else if (t == HCOMM_BFLOAT16) {
        uint16_t b = bf16_from_float((float)v);
        memcpy(p, &b, 2);
    } else if (t == HCOMM_FLOAT32) {
        float f = (float)v;
        memcpy(p, &f, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

/* Element i of buffer `buf` of type t becomes the small integer v (exact in every type; for
 * bool, whether it is nonzero). */
static inline void set_value(int t, void *buf, size_t i, int64_t v) {
    if (is_float(t)) set_float(t, buf, i, (double)v);
    else if (t == HCOMM_BOOL) set_bits(t, buf, i, v != 0);
    else set_bits(t, buf, i, (uint64_t)v);
}

/* Fills n elements with a value no test expects, so that untouched output shows. */
static inline void poison(void *buf, size_t n, int t) { memset(buf, 0x5a, n * type_size[t]); }

/* Prints element i of two buffers and exits. */
static inline void mismatch(const char *what, int t, size_t i, const void *got, const void *want) {
    const unsigned char *g = (const unsigned char *)got + i * type_size[t];
    const unsigned char *w = (const unsigned char *)want + i * type_size[t];
    fprintf(stderr, "FAIL rank %d: %s, %s element %zu: got", my_rank, what, type_name[t], i);
    for (size_t b = 0; b < type_size[t]; b++) fprintf(stderr, " %02x", g[b]);
    fprintf(stderr, ", expected");
    for (size_t b = 0; b < type_size[t]; b++) fprintf(stderr, " %02x", w[b]);
    fprintf(stderr, "\n");
    exit(1);
}

/* Compares n elements of type t. */
static inline void compare(const char *what, int t, const void *got, const void *want, size_t n) {
    if (n && memcmp(got, want, n * type_size[t]) != 0) {
        for (size_t i = 0; i < n; i++) {
            const size_t s = type_size[t];
            if (memcmp((const char *)got + i * s, (const char *)want + i * s, s) != 0)
                mismatch(what, t, i, got, want);
        }
    }
}

#endif
