/* Every collective of the C API, for every type and operation, several counts and every root,
 * normal and in place, on hcommMalloc'd and on malloc'd buffers: each result is compared
 * bytewise with a reference computed locally (every rank knows every rank's input). Each
 * runs blocking, then in its nonblocking form completed by hcommWait and by polling
 * hcommTest; the v-variants too; then a duplicated communicator with nonblocking calls on
 * both in flight. Prints "PASS collectives" on success; exits 1 naming the first
 * difference otherwise. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <sched.h>
#include <time.h>

static int nranks;
static int salt;
/* 0: blocking calls; 1: nonblocking ones completed by hcommWait; 2: by polling hcommTest. */
static int mode;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Completes a nonblocking call as `mode` says (polling gives up after a minute). */
static void complete(hcommRequest_t *request) {
    if (mode == 1) {
        CHECK(hcommWait(request));
    } else {
        int done = 0;
        const double give_up = seconds() + 60;
        while (!done) {
            CHECK(hcommTest(request, &done));
            ASSERT(seconds() < give_up);
            if (!done) sched_yield();
        }
    }
    ASSERT(*request == HCOMM_REQUEST_NULL);
}

/* Runs a collective: `blocking(...)`, or `nonblocking(..., &request)` and its completion. */
#define COLL(blocking, nonblocking, ...)                                                \
    do {                                                                                \
        if (mode == 0) {                                                                \
            CHECK(blocking(__VA_ARGS__));                                               \
        } else {                                                                        \
            hcommRequest_t rq_ = HCOMM_REQUEST_NULL;                                    \
            CHECK(nonblocking(__VA_ARGS__, &rq_));                                      \
            ASSERT(rq_ != HCOMM_REQUEST_NULL);                                          \
            complete(&rq_);                                                             \
        }                                                                               \
    } while (0)

/* Input element i of rank r: a small integer, so sums and products are exact in every type. */
static int64_t input(int r, size_t i, int s) {
    return (int64_t)(((size_t)r * 7 + i * 3 + (size_t)s * 5) % 5) - 2;
}

static uint64_t trunc_bits(int t, uint64_t b) {
    return type_size[t] == 8 ? b : b & ((UINT64_C(1) << (8 * type_size[t])) - 1);
}

static int64_t signed_of(int t, uint64_t u) {
    switch (type_size[t]) {
    case 1: return (int8_t)u;
    case 2: return (int16_t)u;
    case 4: return (int32_t)u;
    default: return (int64_t)u;
    }
}

/* out[0] becomes element i of the reduction `op` over every rank's input. */
static void reference(int t, int op, size_t i, int s, void *out) {
    if (t == HCOMM_BOOL) {
        /* Inputs are -2 .. 2, stored as whether they are nonzero. */
        int any = 0, all = 1, odd = 0;
        for (int r = 0; r < nranks; r++) {
            int v = (uint8_t)input(r, i, s) != 0;
            any |= v;
            all &= v;
            odd ^= v;
        }
        int or_like = op == HCOMM_SUM || op == HCOMM_MAX || op == HCOMM_BOR;
        set_bits(t, out, 0, (uint64_t)(op == HCOMM_BXOR ? odd : or_like ? any : all));
        return;
    }
    if (!is_float(t)) {
        uint64_t sum = 0, prod = 1, best = trunc_bits(t, (uint64_t)input(0, i, s));
        uint64_t band = ~UINT64_C(0), bor = 0, bxor = 0;
        for (int r = 0; r < nranks; r++) {
            uint64_t u = trunc_bits(t, (uint64_t)input(r, i, s));
            sum += u;
            prod *= u;
            band &= u;
            bor |= u;
            bxor ^= u;
            int greater = is_signed(t) ? signed_of(t, u) > signed_of(t, best) : u > best;
            int less = is_signed(t) ? signed_of(t, u) < signed_of(t, best) : u < best;
            if ((op == HCOMM_MAX && greater) || (op == HCOMM_MIN && less)) best = u;
        }
        uint64_t res = best;
        if (op == HCOMM_SUM) res = sum;
        if (op == HCOMM_PROD) res = prod;
        if (op == HCOMM_BAND) res = band;
        if (op == HCOMM_BOR) res = bor;
        if (op == HCOMM_BXOR) res = bxor;
        if (op == HCOMM_AVG) {
            res = is_signed(t) ? (uint64_t)(signed_of(t, trunc_bits(t, sum)) / nranks)
                               : trunc_bits(t, sum) / (uint64_t)nranks;
        }
        set_bits(t, out, 0, res);
        return;
    }
    double sum = 0, prod = 1, best = (double)input(0, i, s);
    for (int r = 0; r < nranks; r++) {
        double v = (double)input(r, i, s);
        sum += v;
        prod *= v;
        if ((op == HCOMM_MAX && v > best) || (op == HCOMM_MIN && v < best)) best = v;
    }
    double res = op == HCOMM_SUM ? sum : op == HCOMM_PROD ? prod : best;
    /* Sums and products of small integers are exact (a zero times a negative is -0); an
     * average divides in float32 for the 16-bit types (then rounds to nearest even). */
    if (op == HCOMM_AVG) res = t == HCOMM_FLOAT64 ? sum / nranks : (float)sum / (float)nranks;
    set_float(t, out, 0, res);
}

/* A buffer of n elements of type t: from hcommMalloc or from malloc, alternately. */
static void *alloc(size_t n, int t) {
    size_t bytes = n * type_size[t] + 1;
    void *p = (salt & 1) ? hcommMalloc(bytes) : malloc(bytes);
    ASSERT(p != NULL);
    return p;
}

static void release(void *p) {
    if (salt & 1) hcommFree(p); else free(p);
}

static char what[200];

static void describe(const char *coll, int t, int op, size_t count, int root, int in_place) {
    static const char *const modes[] = {"", " nonblocking (wait)", " nonblocking (test)"};
    snprintf(what, sizeof what, "%s %s %s count %zu root %d%s%s", coll, type_name[t],
             op >= 0 ? op_name[op] : "-", count, root, in_place ? " in place" : "",
             modes[mode]);
}

static void allreduce(int t, int op, size_t count, int in_place) {
    salt++;
    describe("allreduce", t, op, count, 0, in_place);
    void *send = alloc(count, t), *recv = alloc(count, t), *want = alloc(count, t);
    for (size_t i = 0; i < count; i++) {
        set_value(t, send, i, input(my_rank, i, salt));
        reference(t, op, i, salt, (char *)want + i * type_size[t]);
    }
    poison(recv, count, t);
    if (in_place) {
        COLL(hcommAllReduce, hcommIallReduce, send, send, count, t, op, COMM_WORLD);
        compare(what, t, send, want, count);
    } else {
        COLL(hcommAllReduce, hcommIallReduce, send, recv, count, t, op, COMM_WORLD);
        compare(what, t, recv, want, count);
    }
    release(send); release(recv); release(want);
}

static void reduce(int t, int op, size_t count, int root, int in_place) {
    salt++;
    describe("reduce", t, op, count, root, in_place);
    void *send = alloc(count, t), *recv = alloc(count, t), *want = alloc(count, t);
    for (size_t i = 0; i < count; i++) {
        set_value(t, send, i, input(my_rank, i, salt));
        reference(t, op, i, salt, (char *)want + i * type_size[t]);
    }
    poison(recv, count, t);
    if (in_place && my_rank == root) {
        COLL(hcommReduce, hcommIreduce, send, send, count, t, op, root, COMM_WORLD);
        compare(what, t, send, want, count);
    } else {
        /* Outside the root the receive buffer is unused: NULL is fine. */
        void *r = my_rank == root ? recv : NULL;
        COLL(hcommReduce, hcommIreduce, send, r, count, t, op, root, COMM_WORLD);
        if (my_rank == root) compare(what, t, recv, want, count);
    }
    release(send); release(recv); release(want);
}

static void reduce_scatter(int t, int op, size_t count, int in_place) {
    salt++;
    describe("reduce_scatter", t, op, count, 0, in_place);
    size_t total = count * (size_t)nranks;
    void *send = alloc(total, t), *orig = alloc(total, t), *recv = alloc(count, t),
         *want = alloc(count, t);
    for (size_t i = 0; i < total; i++) set_value(t, send, i, input(my_rank, i, salt));
    memcpy(orig, send, total * type_size[t]);
    for (size_t i = 0; i < count; i++)
        reference(t, op, (size_t)my_rank * count + i, salt, (char *)want + i * type_size[t]);
    poison(recv, count, t);
    if (in_place) {
        char *mine = (char *)send + (size_t)my_rank * count * type_size[t];
        COLL(hcommReduceScatter, hcommIreduceScatter, send, mine, count, t, op, COMM_WORLD);
        compare(what, t, mine, want, count);
        /* The rest of the send buffer is left alone. */
        compare(what, t, send, orig, (size_t)my_rank * count);
        size_t after = (size_t)(my_rank + 1) * count;
        compare(what, t, (char *)send + after * type_size[t],
                (char *)orig + after * type_size[t], total - after);
    } else {
        COLL(hcommReduceScatter, hcommIreduceScatter, send, recv, count, t, op, COMM_WORLD);
        compare(what, t, recv, want, count);
        compare(what, t, send, orig, total);
    }
    release(send); release(orig); release(recv); release(want);
}

static void broadcast(int t, size_t count, int root) {
    salt++;
    describe("broadcast", t, -1, count, root, 0);
    void *buf = alloc(count, t), *want = alloc(count, t);
    for (size_t i = 0; i < count; i++) set_value(t, want, i, input(root, i, salt));
    if (my_rank == root) memcpy(buf, want, count * type_size[t]); else poison(buf, count, t);
    COLL(hcommBroadcast, hcommIbroadcast, buf, count, t, root, COMM_WORLD);
    compare(what, t, buf, want, count);
    release(buf); release(want);
}

/* send: this rank's input; want: every rank's input in rank order. */
static void gathered(int t, size_t count, void *send, void *want) {
    for (size_t i = 0; i < count; i++) set_value(t, send, i, input(my_rank, i, salt));
    for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < count; i++)
            set_value(t, want, (size_t)r * count + i, input(r, i, salt));
}

static void allgather(int t, size_t count, int in_place) {
    salt++;
    describe("allgather", t, -1, count, 0, in_place);
    size_t total = count * (size_t)nranks;
    void *send = alloc(count, t), *recv = alloc(total, t), *want = alloc(total, t);
    gathered(t, count, send, want);
    poison(recv, total, t);
    if (in_place) {
        char *mine = (char *)recv + (size_t)my_rank * count * type_size[t];
        memcpy(mine, send, count * type_size[t]);
        COLL(hcommAllGather, hcommIallGather, mine, recv, count, t, COMM_WORLD);
    } else {
        COLL(hcommAllGather, hcommIallGather, send, recv, count, t, COMM_WORLD);
    }
    compare(what, t, recv, want, total);
    release(send); release(recv); release(want);
}

static void alltoall(int t, size_t count, int in_place) {
    salt++;
    describe("alltoall", t, -1, count, 0, in_place);
    size_t total = count * (size_t)nranks;
    void *send = alloc(total, t), *recv = alloc(total, t), *want = alloc(total, t);
    for (size_t i = 0; i < total; i++) set_value(t, send, i, input(my_rank, i, salt));
    /* Block p of my result is block (my rank) of rank p's input. */
    for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < count; i++)
            set_value(t, want, (size_t)p * count + i,
                      input(p, (size_t)my_rank * count + i, salt));
    poison(recv, total, t);
    if (in_place) {
        COLL(hcommAlltoAll, hcommIalltoAll, send, send, count, t, COMM_WORLD);
        compare(what, t, send, want, total);
    } else {
        COLL(hcommAlltoAll, hcommIalltoAll, send, recv, count, t, COMM_WORLD);
        compare(what, t, recv, want, total);
    }
    release(send); release(recv); release(want);
}

static void gather(int t, size_t count, int root, int in_place) {
    salt++;
    describe("gather", t, -1, count, root, in_place);
    size_t total = count * (size_t)nranks;
    void *send = alloc(count, t), *recv = alloc(total, t), *want = alloc(total, t);
    gathered(t, count, send, want);
    poison(recv, total, t);
    if (in_place && my_rank == root) {
        char *mine = (char *)recv + (size_t)root * count * type_size[t];
        memcpy(mine, send, count * type_size[t]);
        COLL(hcommGather, hcommIgather, mine, recv, count, t, root, COMM_WORLD);
    } else {
        COLL(hcommGather, hcommIgather, send, my_rank == root ? recv : NULL, count, t, root, COMM_WORLD);
    }
    if (my_rank == root) compare(what, t, recv, want, total);
    release(send); release(recv); release(want);
}

static void scatter(int t, size_t count, int root, int in_place) {
    salt++;
    describe("scatter", t, -1, count, root, in_place);
    size_t total = count * (size_t)nranks;
    void *send = alloc(total, t), *recv = alloc(count, t), *want = alloc(count, t);
    for (size_t i = 0; i < total; i++) set_value(t, send, i, input(root, i, salt));
    for (size_t i = 0; i < count; i++)
        set_value(t, want, i, input(root, (size_t)my_rank * count + i, salt));
    poison(recv, count, t);
    if (in_place && my_rank == root) {
        char *mine = (char *)send + (size_t)root * count * type_size[t];
        COLL(hcommScatter, hcommIscatter, send, mine, count, t, root, COMM_WORLD);
        compare(what, t, mine, want, count);
    } else {
        COLL(hcommScatter, hcommIscatter, my_rank == root ? send : NULL, recv, count, t, root, COMM_WORLD);
        compare(what, t, recv, want, count);
    }
    release(send); release(recv); release(want);
}

/* Counts `base + p` from rank p (the first may be 0) at displacements with a gap of one. */
static void allgatherv(int t, size_t base, int in_place) {
    salt++;
    describe("allgatherv", t, -1, base, 0, in_place);
    size_t *counts = malloc((size_t)nranks * sizeof *counts);
    size_t *displs = malloc((size_t)nranks * sizeof *displs);
    ASSERT(counts && displs);
    size_t total = 0;
    for (int p = 0; p < nranks; p++) {
        counts[p] = base + (size_t)p;
        displs[p] = total;
        total += counts[p] + 1;
    }
    const size_t mine = counts[my_rank], sz = type_size[t];
    void *send = alloc(mine, t), *recv = alloc(total, t), *want = alloc(total, t);
    poison(recv, total, t);
    poison(want, total, t);
    for (size_t i = 0; i < mine; i++) set_value(t, send, i, input(my_rank, i, salt));
    for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < counts[p]; i++)
            set_value(t, want, displs[p] + i, input(p, i, salt));
    if (in_place) {
        char *at = (char *)recv + displs[my_rank] * sz;
        memcpy(at, send, mine * sz);
        COLL(hcommAllGatherv, hcommIallGatherv, at, mine, recv, counts, displs, t, COMM_WORLD);
    } else {
        COLL(hcommAllGatherv, hcommIallGatherv, send, mine, recv, counts, displs, t, COMM_WORLD);
    }
    compare(what, t, recv, want, total);
    release(send); release(recv); release(want);
    free(counts); free(displs);
}

/* Elements rank r sends to rank p. */
static size_t sent(size_t base, int r, int p) { return base + (size_t)(r * 2 + p) % 3; }

/* Uneven blocks (send gaps of two, receive gaps of one); element i to rank p is the input
 * at p * 97 + i. */
static void alltoallv(int t, size_t base) {
    salt++;
    describe("alltoallv", t, -1, base, 0, 0);
    const size_t n = (size_t)nranks, sz = type_size[t];
    size_t *sc = malloc(n * sizeof *sc), *sd = malloc(n * sizeof *sd);
    size_t *rc = malloc(n * sizeof *rc), *rd = malloc(n * sizeof *rd);
    ASSERT(sc && sd && rc && rd);
    size_t stotal = 0, rtotal = 0;
    for (int p = 0; p < nranks; p++) {
        sc[p] = sent(base, my_rank, p);
        sd[p] = stotal;
        stotal += sc[p] + 2;
        rc[p] = sent(base, p, my_rank);
        rd[p] = rtotal;
        rtotal += rc[p] + 1;
    }
    void *send = alloc(stotal, t), *recv = alloc(rtotal, t), *want = alloc(rtotal, t);
    poison(send, stotal, t);
    poison(recv, rtotal, t);
    poison(want, rtotal, t);
    for (int p = 0; p < nranks; p++) {
        for (size_t i = 0; i < sc[p]; i++)
            set_value(t, send, sd[p] + i, input(my_rank, (size_t)p * 97 + i, salt));
        for (size_t i = 0; i < rc[p]; i++)
            set_value(t, want, rd[p] + i, input(p, (size_t)my_rank * 97 + i, salt));
    }
    COLL(hcommAlltoAllv, hcommIalltoAllv, send, sc, sd, recv, rc, rd, t, COMM_WORLD);
    compare(what, t, recv, want, rtotal);
    (void)sz;
    release(send); release(recv); release(want);
    free(sc); free(sd); free(rc); free(rd);
}

/* A duplicate of the world, and nonblocking calls on both in flight at once, completed in
 * another order than started (the v-variant's arrays freed right after the start). */
static long dup_and_overlap(void) {
    hcommComm_t dup = HCOMM_COMM_NULL;
    CHECK(hcommCommDup(COMM_WORLD, &dup));
    ASSERT(dup != HCOMM_COMM_NULL && dup != COMM_WORLD);
    int r = -1, n = -1;
    CHECK(hcommCommRank(dup, &r));
    CHECK(hcommCommSize(dup, &n));
    ASSERT(r == my_rank && n == nranks);
    enum { N = 5000 };
    static int32_t a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = my_rank + i;
        b[i] = my_rank * 3 - i;
    }
    int64_t mine[2] = {my_rank, -my_rank};
    int64_t *all = malloc(2 * (size_t)nranks * sizeof *all);
    size_t *counts = malloc((size_t)nranks * sizeof *counts);
    size_t *displs = malloc((size_t)nranks * sizeof *displs);
    ASSERT(all && counts && displs);
    for (int p = 0; p < nranks; p++) {
        counts[p] = 2;
        displs[p] = 2 * (size_t)(nranks - 1 - p);
    }
    hcommRequest_t ra, rb, rbar, rg;
    CHECK(hcommIallReduce(a, a, N, HCOMM_INT32, HCOMM_SUM, COMM_WORLD, &ra));
    CHECK(hcommIallReduce(b, b, N, HCOMM_INT32, HCOMM_MAX, dup, &rb));
    CHECK(hcommIbarrier(dup, &rbar));
    CHECK(hcommIallGatherv(mine, 2, all, counts, displs, HCOMM_INT64, COMM_WORLD, &rg));
    free(counts);
    free(displs);
    int32_t one = 1, ranks = 0;
    CHECK(hcommAllReduce(&one, &ranks, 1, HCOMM_INT32, HCOMM_SUM, dup));
    ASSERT(ranks == nranks);
    CHECK(hcommWait(&rg));
    CHECK(hcommWait(&rbar));
    CHECK(hcommWait(&rb));
    CHECK(hcommWait(&ra));
    ASSERT(ra == HCOMM_REQUEST_NULL && rbar == HCOMM_REQUEST_NULL);
    const int32_t rank_sum = nranks * (nranks - 1) / 2;
    for (int i = 0; i < N; i++) {
        ASSERT(a[i] == rank_sum + nranks * i);
        ASSERT(b[i] == (nranks - 1) * 3 - i);
    }
    for (int p = 0; p < nranks; p++) {
        ASSERT(all[2 * (nranks - 1 - p)] == p && all[2 * (nranks - 1 - p) + 1] == -p);
    }
    free(all);
    CHECK(hcommCommDestroy(dup));
    return 6;
}

int main(int argc, char **argv) {
    CHECK(test_init(&argc, &argv));
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &nranks));
    static const size_t counts[] = {0, 1, 7, 300};
    const size_t ncounts = sizeof counts / sizeof counts[0];
    long calls = 0;
    for (mode = 0; mode < 3; mode++) {
        /* The nonblocking forms run the last count only (normal and in place). */
        for (int t = 0; t < NTYPES; t++) {
            for (size_t c = mode == 0 ? 0 : ncounts - 1; c < ncounts; c++) {
                size_t n = counts[c];
                /* In-place forms with one count per type keep the run short. */
                int with_in_place = c == ncounts - 1;
                for (int op = 0; op < NOPS; op++) {
                    if (!supported(t, op)) continue;
                    for (int ip = 0; ip <= with_in_place; ip++) {
                        allreduce(t, op, n, ip);
                        reduce_scatter(t, op, n, ip);
                        for (int root = 0; root < nranks; root++) reduce(t, op, n, root, ip);
                        calls += 2 + nranks;
                    }
                }
                for (int ip = 0; ip <= with_in_place; ip++) {
                    allgather(t, n, ip);
                    alltoall(t, n, ip);
                    calls += 2;
                    for (int root = 0; root < nranks; root++) {
                        if (!ip) broadcast(t, n, root);
                        gather(t, n, root, ip);
                        scatter(t, n, root, ip);
                        calls += 3;
                    }
                }
            }
            CHECK(hcommBarrier(COMM_WORLD));
            calls++;
        }
        for (size_t base = 0; base < 3; base += 2) {
            allgatherv(HCOMM_INT16, base, 0);
            allgatherv(HCOMM_FLOAT64, base, 1);
            alltoallv(HCOMM_BOOL, base);
            alltoallv(HCOMM_UINT32, base);
            calls += 4;
        }
        /* Messages above the eager limit (64 KiB) take the rendezvous path. */
        allreduce(HCOMM_FLOAT32, HCOMM_SUM, 40000, 0);
        allreduce(HCOMM_FLOAT64, HCOMM_AVG, 20000, 1);
        allreduce(HCOMM_BOOL, HCOMM_BXOR, 100000, 0);
        allreduce(HCOMM_UINT16, HCOMM_BAND, 50000, 1);
        broadcast(HCOMM_UINT8, 200000, nranks - 1);
        allgather(HCOMM_INT32, 20000, 0);
        allgatherv(HCOMM_INT64, 10000, 1);
        alltoall(HCOMM_INT64, 10000, 1);
        alltoallv(HCOMM_INT16, 20000);
        reduce_scatter(HCOMM_BFLOAT16, HCOMM_MAX, 40000, 1);
        reduce_scatter(HCOMM_INT16, HCOMM_BOR, 40000, 0);
        calls += 11;
    }
    mode = 0;
    calls += dup_and_overlap();
    CHECK(hcommFinalize());
    if (my_rank == 0) printf("PASS collectives: %ld calls on %d ranks\n", calls, nranks);
    return 0;
}
