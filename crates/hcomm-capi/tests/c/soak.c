/* A soak of the C API: a random sequence of collectives and point-to-point messages that every
 * rank draws alike from the seed (argv[1]; argv[2] calls, 200 by default). Message and block
 * sizes straddle 4 KiB and 1 MiB (the thresholds of hcomm's protocols); buffers come from
 * hcommMalloc (the shared-memory pool) or malloc, at random; half the calls are nonblocking.
 * Every rank computes every rank's input, so each result is compared bytewise with a
 * reference computed locally. Prints "PASS soak seed S: N calls on R ranks (B bytes)" from
 * rank 0 on success; exits 1 naming the first difference otherwise. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

static int nranks;
static uint64_t rng;
/* Bits drawn for the call in progress: which of its buffers come from the pool. */
static uint64_t pool_bits;

/* splitmix64: the same sequence on every rank. */
static uint64_t next(void) {
    uint64_t z = (rng += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

/* Element i of rank r's input to call c. */
static uint32_t input(int c, int r, size_t i) {
    uint64_t z = (uint64_t)c * UINT64_C(0x100000001b3) ^ (uint64_t)r << 40 ^ (uint64_t)i;
    z *= UINT64_C(0x9e3779b97f4a7c15);
    return (uint32_t)(z >> 32);
}

/* A size in bytes around the thresholds: one of a few exact ones, or any up to 2 MiB. */
static size_t draw_bytes(void) {
    static const size_t edges[] = {4, 4092, 4096, 4100, 65536, 1048572, 1048576, 1048580};
    switch (below(4)) {
    case 0: return edges[below(sizeof edges / sizeof edges[0])];
    case 1: return 4 * (1 + below(1024));          /* up to 4 KiB */
    case 2: return 4 * (1024 + below(255 * 1024)); /* 4 KiB .. 1 MiB */
    default: return 4 * (256 * 1024 + below(256 * 1024)); /* 1 .. 2 MiB */
    }
}

/* A buffer of `bytes` from the pool or the heap (the next of `pool_bits`); freed by
 * `release` as it came. */
typedef struct {
    void *p;
    int pool;
} buf_t;

static buf_t get(size_t bytes) {
    buf_t b = {NULL, (int)(pool_bits & 1)};
    pool_bits >>= 1;
    b.p = b.pool ? hcommMalloc(bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
    ASSERT(b.p != NULL);
    memset(b.p, 0x5a, bytes);
    return b;
}

static void release(buf_t b) {
    if (b.pool) hcommFree(b.p);
    else free(b.p);
}

/* Fills n elements with rank r's input to call c, from element `from` of it. */
static void fill(uint32_t *v, size_t n, int c, int r, size_t from) {
    for (size_t i = 0; i < n; i++) v[i] = input(c, r, from + i);
}

static void expect(const char *what, int c, const void *got, const void *want, size_t n) {
    if (n && memcmp(got, want, n * 4) != 0) {
        const uint32_t *g = got, *w = want;
        for (size_t i = 0; i < n; i++) {
            if (g[i] != w[i]) {
                fprintf(stderr, "FAIL rank %d: call %d (%s, %zu elements): element %zu is "
                                "%08x, expected %08x\n",
                        my_rank, c, what, n, i, (unsigned)g[i], (unsigned)w[i]);
                exit(1);
            }
        }
    }
}

/* Runs a call blocking or nonblocking, as drawn. */
#define RUN(nb, blocking, nonblocking, ...)                                             \
    do {                                                                                \
        if (nb) {                                                                       \
            hcommRequest_t rq_ = HCOMM_REQUEST_NULL;                                    \
            CHECK(nonblocking(__VA_ARGS__, &rq_));                                      \
            CHECK(hcommWait(&rq_));                                                     \
        } else {                                                                        \
            CHECK(blocking(__VA_ARGS__));                                               \
        }                                                                               \
    } while (0)

/* One call: returns the bytes this rank sent. Every rank draws the same numbers from `rng`,
 * all of them here. */
static size_t one(int c) {
    const int kind = (int)below(9), nb = (int)below(2);
    const int root = (int)below((size_t)nranks);
    const size_t n = draw_bytes() / 4, total = n * (size_t)nranks;
    const int o = (int)below(3), tag = (int)below(1000);
    const int shift = 1 + (int)below((size_t)(nranks > 1 ? nranks - 1 : 1));
    pool_bits = next();
    uint32_t *want = malloc((total ? total : 1) * 4);
    ASSERT(want != NULL);
    size_t sent = n * 4;
    switch (kind) {
    case 0: { /* all-reduce: uint32 sum (wrapping), max or bxor */
        static const hcommReduceOp_t ops[] = {HCOMM_SUM, HCOMM_MAX, HCOMM_BXOR};
        buf_t s = get(n * 4), r = get(n * 4);
        fill(s.p, n, c, my_rank, 0);
        for (size_t i = 0; i < n; i++) {
            uint32_t acc = input(c, 0, i);
            for (int q = 1; q < nranks; q++) {
                uint32_t v = input(c, q, i);
                acc = o == 0 ? acc + v : o == 1 ? (v > acc ? v : acc) : acc ^ v;
            }
            want[i] = acc;
        }
        RUN(nb, hcommAllReduce, hcommIallReduce, s.p, r.p, n, HCOMM_UINT32, ops[o],
            COMM_WORLD);
        expect("allreduce", c, r.p, want, n);
        release(s);
        release(r);
        break;
    }
    case 1: { /* broadcast */
        buf_t b = get(n * 4);
        fill(want, n, c, root, 0);
        if (my_rank == root) memcpy(b.p, want, n * 4);
        RUN(nb, hcommBroadcast, hcommIbroadcast, b.p, n, HCOMM_UINT32, root, COMM_WORLD);
        expect("broadcast", c, b.p, want, n);
        release(b);
        break;
    }
    case 2: { /* all-gather */
        buf_t s = get(n * 4), r = get(total * 4);
        fill(s.p, n, c, my_rank, 0);
        for (int q = 0; q < nranks; q++) fill(want + (size_t)q * n, n, c, q, 0);
        RUN(nb, hcommAllGather, hcommIallGather, s.p, r.p, n, HCOMM_UINT32, COMM_WORLD);
        expect("allgather", c, r.p, want, total);
        release(s);
        release(r);
        break;
    }
    case 3: { /* reduce-scatter (sum): this rank's block of the sum */
        buf_t s = get(total * 4), r = get(n * 4);
        fill(s.p, total, c, my_rank, 0);
        for (size_t i = 0; i < n; i++) {
            uint32_t acc = 0;
            for (int q = 0; q < nranks; q++) acc += input(c, q, (size_t)my_rank * n + i);
            want[i] = acc;
        }
        RUN(nb, hcommReduceScatter, hcommIreduceScatter, s.p, r.p, n, HCOMM_UINT32,
            HCOMM_SUM, COMM_WORLD);
        expect("reducescatter", c, r.p, want, n);
        sent = total * 4;
        release(s);
        release(r);
        break;
    }
    case 4: { /* all-to-all: block q of rank p's input goes to rank q */
        buf_t s = get(total * 4), r = get(total * 4);
        fill(s.p, total, c, my_rank, 0);
        for (int q = 0; q < nranks; q++)
            fill(want + (size_t)q * n, n, c, q, (size_t)my_rank * n);
        RUN(nb, hcommAlltoAll, hcommIalltoAll, s.p, r.p, n, HCOMM_UINT32, COMM_WORLD);
        expect("alltoall", c, r.p, want, total);
        sent = total * 4;
        release(s);
        release(r);
        break;
    }
    case 5: { /* reduce (sum) to the root */
        buf_t s = get(n * 4), r = get(n * 4);
        fill(s.p, n, c, my_rank, 0);
        for (size_t i = 0; i < n; i++) {
            uint32_t acc = 0;
            for (int q = 0; q < nranks; q++) acc += input(c, q, i);
            want[i] = acc;
        }
        RUN(nb, hcommReduce, hcommIreduce, s.p, r.p, n, HCOMM_UINT32, HCOMM_SUM, root,
            COMM_WORLD);
        if (my_rank == root) expect("reduce", c, r.p, want, n);
        release(s);
        release(r);
        break;
    }
    case 6: { /* gather to the root, then scatter back from it */
        buf_t s = get(n * 4), r = get(total * 4), back = get(n * 4);
        fill(s.p, n, c, my_rank, 0);
        for (int q = 0; q < nranks; q++) fill(want + (size_t)q * n, n, c, q, 0);
        RUN(nb, hcommGather, hcommIgather, s.p, r.p, n, HCOMM_UINT32, root, COMM_WORLD);
        if (my_rank == root) expect("gather", c, r.p, want, total);
        RUN(nb, hcommScatter, hcommIscatter, r.p, back.p, n, HCOMM_UINT32, root, COMM_WORLD);
        expect("scatter", c, back.p, s.p, n);
        release(s);
        release(r);
        release(back);
        break;
    }
    case 7: { /* a ring shifted by a random distance, nonblocking both ways */
        const int to = (my_rank + shift) % nranks, from = (my_rank + nranks - shift) % nranks;
        buf_t s = get(n * 4), r = get(n * 4);
        fill(s.p, n, c, my_rank, 0);
        fill(want, n, c, from, 0);
        hcommRequest_t rq, sq;
        CHECK(hcommIrecv(r.p, n * 4, from, tag, COMM_WORLD, &rq));
        CHECK(hcommIsend(s.p, n * 4, to, tag, COMM_WORLD, &sq));
        CHECK(hcommWait(&sq));
        CHECK(hcommWait(&rq));
        expect("ring", c, r.p, want, n);
        release(s);
        release(r);
        break;
    }
    default: { /* pairs: even ranks send first, blocking */
        const int peer = my_rank ^ 1;
        if (peer >= nranks) {
            sent = 0;
            break;
        }
        buf_t s = get(n * 4), r = get(n * 4);
        fill(s.p, n, c, my_rank, 0);
        fill(want, n, c, peer, 0);
        if (my_rank % 2 == 0) {
            CHECK(hcommSend(s.p, n * 4, peer, 7, COMM_WORLD));
            CHECK(hcommRecv(r.p, n * 4, peer, 7, COMM_WORLD));
        } else {
            CHECK(hcommRecv(r.p, n * 4, peer, 7, COMM_WORLD));
            CHECK(hcommSend(s.p, n * 4, peer, 7, COMM_WORLD));
        }
        expect("pairs", c, r.p, want, n);
        release(s);
        release(r);
        break;
    }
    }
    free(want);
    return sent;
}

int main(int argc, char **argv) {
    ASSERT(argc >= 2);
    const uint64_t seed = strtoull(argv[1], NULL, 10);
    const int calls = argc >= 3 ? atoi(argv[2]) : 200;
    CHECK(test_init(&argc, &argv));
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &nranks));
    rng = seed;
    size_t bytes = 0;
    for (int c = 0; c < calls; c++) bytes += one(c);
    CHECK(hcommBarrier(COMM_WORLD));
    CHECK(hcommFinalize());
    printf("soak: rank %d sent %zu bytes\n", my_rank, bytes);
    if (my_rank == 0)
        printf("PASS soak seed %llu: %d calls on %d ranks\n", (unsigned long long)seed, calls,
               nranks);
    return 0;
}
