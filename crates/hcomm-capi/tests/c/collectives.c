/* Every collective of the C API, for every type and operation, several counts and every root,
 * normal and in place, on hcommMalloc'd and on malloc'd buffers: each result is compared
 * bytewise with a reference computed locally (every rank knows every rank's input).
 * Prints "PASS collectives" on success; exits 1 naming the first difference otherwise. */
#include "common.h"

static int nranks;
static int salt;

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
    case 4: return (int32_t)u;
    default: return (int64_t)u;
    }
}

/* out[0] becomes element i of the reduction `op` over every rank's input. */
static void reference(int t, int op, size_t i, int s, void *out) {
    if (!is_float(t)) {
        uint64_t sum = 0, prod = 1, best = trunc_bits(t, (uint64_t)input(0, i, s));
        for (int r = 0; r < nranks; r++) {
            uint64_t u = trunc_bits(t, (uint64_t)input(r, i, s));
            sum += u;
            prod *= u;
            int greater = is_signed(t) ? signed_of(t, u) > signed_of(t, best) : u > best;
            int less = is_signed(t) ? signed_of(t, u) < signed_of(t, best) : u < best;
            if ((op == HCOMM_MAX && greater) || (op == HCOMM_MIN && less)) best = u;
        }
        uint64_t res = best;
        if (op == HCOMM_SUM) res = sum;
        if (op == HCOMM_PROD) res = prod;
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
    snprintf(what, sizeof what, "%s %s %s count %zu root %d%s", coll, type_name[t],
             op >= 0 ? op_name[op] : "-", count, root, in_place ? " in place" : "");
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
        CHECK(hcommAllReduce(send, send, count, t, op, COMM_WORLD));
        compare(what, t, send, want, count);
    } else {
        CHECK(hcommAllReduce(send, recv, count, t, op, COMM_WORLD));
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
        CHECK(hcommReduce(send, send, count, t, op, root, COMM_WORLD));
        compare(what, t, send, want, count);
    } else {
        /* Outside the root the receive buffer is unused: NULL is fine. */
        void *r = my_rank == root ? recv : NULL;
        CHECK(hcommReduce(send, r, count, t, op, root, COMM_WORLD));
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
        CHECK(hcommReduceScatter(send, mine, count, t, op, COMM_WORLD));
        compare(what, t, mine, want, count);
        /* The rest of the send buffer is left alone. */
        compare(what, t, send, orig, (size_t)my_rank * count);
        size_t after = (size_t)(my_rank + 1) * count;
        compare(what, t, (char *)send + after * type_size[t],
                (char *)orig + after * type_size[t], total - after);
    } else {
        CHECK(hcommReduceScatter(send, recv, count, t, op, COMM_WORLD));
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
    CHECK(hcommBroadcast(buf, count, t, root, COMM_WORLD));
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
        CHECK(hcommAllGather(mine, recv, count, t, COMM_WORLD));
    } else {
        CHECK(hcommAllGather(send, recv, count, t, COMM_WORLD));
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
        CHECK(hcommAlltoAll(send, send, count, t, COMM_WORLD));
        compare(what, t, send, want, total);
    } else {
        CHECK(hcommAlltoAll(send, recv, count, t, COMM_WORLD));
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
        CHECK(hcommGather(mine, recv, count, t, root, COMM_WORLD));
    } else {
        CHECK(hcommGather(send, my_rank == root ? recv : NULL, count, t, root, COMM_WORLD));
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
        CHECK(hcommScatter(send, mine, count, t, root, COMM_WORLD));
        compare(what, t, mine, want, count);
    } else {
        CHECK(hcommScatter(my_rank == root ? send : NULL, recv, count, t, root, COMM_WORLD));
        compare(what, t, recv, want, count);
    }
    release(send); release(recv); release(want);
}

int main(int argc, char **argv) {
    CHECK(test_init(&argc, &argv));
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &nranks));
    static const size_t counts[] = {0, 1, 7, 300};
    const size_t ncounts = sizeof counts / sizeof counts[0];
    long calls = 0;
    for (int t = 0; t < NTYPES; t++) {
        for (size_t c = 0; c < ncounts; c++) {
            size_t n = counts[c];
            /* In-place forms with one count per type keep the run short. */
            int with_in_place = c == ncounts - 1;
            for (int op = 0; op < NOPS; op++) {
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
    /* Messages above the eager limit (64 KiB) take the rendezvous path. */
    allreduce(HCOMM_FLOAT32, HCOMM_SUM, 40000, 0);
    allreduce(HCOMM_FLOAT64, HCOMM_AVG, 20000, 1);
    broadcast(HCOMM_UINT8, 200000, nranks - 1);
    allgather(HCOMM_INT32, 20000, 0);
    alltoall(HCOMM_INT64, 10000, 1);
    reduce_scatter(HCOMM_BFLOAT16, HCOMM_MAX, 40000, 1);
    calls += 6;
    CHECK(hcommFinalize());
    if (my_rank == 0) printf("PASS collectives: %ld calls on %d ranks\n", calls, nranks);
    return 0;
}
