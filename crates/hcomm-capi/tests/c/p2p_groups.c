/* Point-to-point (blocking and nonblocking), groups, split and destroy through the C API.
 * Prints "PASS p2p_groups" on success; exits 1 naming the first failure otherwise. */
#include "common.h"

static int nranks;

static unsigned char byte_of(int from, size_t i) { return (unsigned char)(from * 31 + i * 7); }

static void fill(unsigned char *p, size_t n, int from) {
    for (size_t i = 0; i < n; i++) p[i] = byte_of(from, i);
}

static void verify(const unsigned char *p, size_t n, int from) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] != byte_of(from, i)) {
            fprintf(stderr, "FAIL rank %d: byte %zu of %zu from rank %d is %u, expected %u\n",
                    my_rank, i, n, from, p[i], byte_of(from, i));
            exit(1);
        }
    }
}

/* Nonblocking ring: receive from the previous rank, send to the next, poll, then wait. */
static void ring(size_t bytes, int tag) {
    int next = (my_rank + 1) % nranks, prev = (my_rank + nranks - 1) % nranks;
    unsigned char *out = hcommMalloc(bytes), *in = malloc(bytes + 1);
    ASSERT(out && in);
    fill(out, bytes, my_rank);
    hcommRequest_t rreq, sreq;
    CHECK(hcommIrecv(in, bytes, prev, tag, COMM_WORLD, &rreq));
    CHECK(hcommIsend(out, bytes, next, tag, COMM_WORLD, &sreq));
    ASSERT(rreq != HCOMM_REQUEST_NULL && sreq != HCOMM_REQUEST_NULL);
    /* The send buffer may be reused at once: hcommIsend copied it. */
    memset(out, 0, bytes);
    int done = 0;
    for (int polls = 0; !done && polls < 1000; polls++) CHECK(hcommTest(&rreq, &done));
    if (done) {
        ASSERT(rreq == HCOMM_REQUEST_NULL);
    }
    CHECK(hcommWait(&rreq));
    CHECK(hcommWait(&sreq));
    ASSERT(rreq == HCOMM_REQUEST_NULL && sreq == HCOMM_REQUEST_NULL);
    verify(in, bytes, prev);
    hcommFree(out);
    free(in);
}

/* Blocking pairs: even ranks send first, odd ranks receive first. */
static void pairs(size_t bytes, int tag) {
    if (nranks < 2 || (nranks % 2 == 1 && my_rank == nranks - 1)) return;
    int peer = my_rank ^ 1;
    unsigned char *out = malloc(bytes + 1), *in = hcommMalloc(bytes);
    ASSERT(out && in);
    fill(out, bytes, my_rank);
    if (my_rank % 2 == 0) {
        CHECK(hcommSend(out, bytes, peer, tag, COMM_WORLD));
        CHECK(hcommRecv(in, bytes, peer, tag, COMM_WORLD));
    } else {
        CHECK(hcommRecv(in, bytes, peer, tag, COMM_WORLD));
        CHECK(hcommSend(out, bytes, peer, tag, COMM_WORLD));
    }
    verify(in, bytes, peer);
    free(out);
    hcommFree(in);
}

/* Inside a group, blocking sends around the ring cannot deadlock, and collectives are fused. */
static void group(void) {
    const size_t big = 300000, n = 1000;
    int next = (my_rank + 1) % nranks, prev = (my_rank + nranks - 1) % nranks;
    unsigned char *out = malloc(big), *in = malloc(big);
    int32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *b_out = malloc(n * sizeof *b);
    float *c = hcommMalloc(n * sizeof *c);
    double *bc = malloc(n * sizeof *bc);
    int64_t *gathered = malloc((size_t)nranks * 3 * sizeof *gathered), mine[3];
    ASSERT(out && in && a && b && b_out && c && bc && gathered);
    fill(out, big, my_rank);
    for (size_t i = 0; i < n; i++) {
        a[i] = (int32_t)(my_rank + (int)i);
        b[i] = (int32_t)(my_rank * 2);
        c[i] = (float)(my_rank == (int)(i % (size_t)nranks) ? 100 : my_rank);
        bc[i] = my_rank == 0 ? (double)i / 4 : -1;
    }
    for (int k = 0; k < 3; k++) mine[k] = my_rank * 10 + k;
    CHECK(hcommGroupStart());
    CHECK(hcommSend(out, big, next, 5, COMM_WORLD));
    CHECK(hcommGroupStart()); /* groups nest */
    CHECK(hcommAllReduce(a, a, n, HCOMM_INT32, HCOMM_SUM, COMM_WORLD));
    CHECK(hcommAllReduce(b, b_out, n, HCOMM_INT32, HCOMM_SUM, COMM_WORLD));
    CHECK(hcommGroupEnd());
    CHECK(hcommAllReduce(c, c, n, HCOMM_FLOAT32, HCOMM_MAX, COMM_WORLD));
    CHECK(hcommBroadcast(bc, n, HCOMM_FLOAT64, 0, COMM_WORLD));
    CHECK(hcommAllGather(mine, gathered, 3, HCOMM_INT64, COMM_WORLD));
    CHECK(hcommRecv(in, big, prev, 5, COMM_WORLD));
    CHECK(hcommGroupEnd());
    verify(in, big, prev);
    int32_t base = (int32_t)(nranks * (nranks - 1) / 2);
    for (size_t i = 0; i < n; i++) {
        ASSERT(a[i] == base + nranks * (int32_t)i);
        ASSERT(b_out[i] == 2 * base);
        ASSERT(b[i] == my_rank * 2);
        ASSERT(c[i] == 100.0f);
        ASSERT(bc[i] == (double)i / 4);
    }
    for (int r = 0; r < nranks; r++)
        for (int k = 0; k < 3; k++) ASSERT(gathered[r * 3 + k] == r * 10 + k);
    free(out); free(in); free(a); free(b); free(b_out); hcommFree(c); free(bc); free(gathered);
}

/* Even and odd ranks apart, ordered backwards; the last rank of an odd job joins none. */
static void split(void) {
    int color = my_rank % 2;
    if (nranks > 2 && nranks % 2 == 1 && my_rank == nranks - 1) color = -1;
    hcommComm_t sub = COMM_WORLD;
    CHECK(hcommCommSplit(COMM_WORLD, color, -my_rank, &sub));
    if (color < 0) {
        ASSERT(sub == HCOMM_COMM_NULL);
        return;
    }
    int members = 0;
    for (int r = 0; r < nranks; r++)
        if (r % 2 == color && !(nranks > 2 && nranks % 2 == 1 && r == nranks - 1)) members++;
    int srank, ssize;
    CHECK(hcommCommRank(sub, &srank));
    CHECK(hcommCommSize(sub, &ssize));
    ASSERT(ssize == members);
    /* key = -rank: the highest world rank of the color comes first. */
    ASSERT(srank == members - 1 - my_rank / 2);
    int64_t v = my_rank, sum = 0;
    CHECK(hcommAllReduce(&v, &sum, 1, HCOMM_INT64, HCOMM_SUM, sub));
    int64_t want = 0;
    for (int r = 0; r < nranks; r++)
        if (r % 2 == color && !(nranks > 2 && nranks % 2 == 1 && r == nranks - 1)) want += r;
    ASSERT(sum == want);
    CHECK(hcommBarrier(sub));
    CHECK(hcommCommDestroy(sub));
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommBarrier(sub));
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommRank(sub, &srank));
}

/* Every rank (rank 0 too) sends to rank 0, which receives from HCOMM_ANY_SOURCE, blocking
 * (hcommRecvStatus) and nonblocking (hcommIrecv, hcommWaitStatus): each sender once, its
 * bytes, its length. */
static void any_source(size_t bytes, int tag) {
    unsigned char *out = malloc(bytes + 1), *in = malloc(bytes + 1);
    int *seen = calloc((size_t)nranks, sizeof(int));
    ASSERT(out && in && seen);
    fill(out, bytes, my_rank);
    hcommRequest_t sreq;
    CHECK(hcommIsend(out, bytes, 0, tag, COMM_WORLD, &sreq));
    if (my_rank == 0) {
        for (int i = 0; i < nranks; i++) {
            int source = -2;
            size_t count = 0;
            if (i % 2 == 0) {
                CHECK(hcommRecvStatus(in, bytes, HCOMM_ANY_SOURCE, tag, COMM_WORLD, &source,
                                      &count));
            } else {
                hcommRequest_t rreq;
                CHECK(hcommIrecv(in, bytes, HCOMM_ANY_SOURCE, tag, COMM_WORLD, &rreq));
                CHECK(hcommWaitStatus(&rreq, &source, &count));
                ASSERT(rreq == HCOMM_REQUEST_NULL);
            }
            ASSERT(source >= 0 && source < nranks && count == bytes);
            ASSERT(seen[source] == 0);
            seen[source] = 1;
            verify(in, bytes, source);
        }
    }
    int source = -2;
    size_t count = 0;
    CHECK(hcommWaitStatus(&sreq, &source, &count));
    ASSERT(source == -1 && count == bytes);
    /* A specific receive reports its source too (another tag: rank 0 may still be taking
     * the messages above). */
    int next = (my_rank + 1) % nranks, prev = (my_rank + nranks - 1) % nranks;
    CHECK(hcommIsend(out, bytes, next, tag + 50, COMM_WORLD, &sreq));
    CHECK(hcommRecvStatus(in, bytes, prev, tag + 50, COMM_WORLD, &source, NULL));
    ASSERT(source == prev);
    verify(in, bytes, prev);
    CHECK(hcommWait(&sreq));
    free(out);
    free(in);
    free(seen);
}

int main(void) {
    CHECK(test_init(NULL, NULL));
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &nranks));
    const size_t sizes[] = {0, 1, 4096, 100000, 3000000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        ring(sizes[s], (int)s);
        pairs(sizes[s], 100 + (int)s);
        any_source(sizes[s], 200 + (int)s);
    }
    /* A message longer than the receive buffer: HCOMM_ERR_TRUNCATED, and it is consumed. */
    {
        int next = (my_rank + 1) % nranks, prev = (my_rank + nranks - 1) % nranks;
        char msg[16] = "0123456789abcde", got[8];
        hcommRequest_t req;
        CHECK(hcommIsend(msg, sizeof msg, next, 77, COMM_WORLD, &req));
        EXPECT(HCOMM_ERR_TRUNCATED, hcommRecv(got, sizeof got, prev, 77, COMM_WORLD));
        CHECK(hcommWait(&req));
        CHECK(hcommIsend(msg, 4, next, 77, COMM_WORLD, &req));
        CHECK(hcommRecv(got, sizeof got, prev, 77, COMM_WORLD));
        ASSERT(memcmp(got, "0123", 4) == 0);
        CHECK(hcommWait(&req));
    }
    group();
    split();
    hcommRequest_t none = HCOMM_REQUEST_NULL;
    CHECK(hcommWait(&none));
    CHECK(hcommBarrier(COMM_WORLD));
    CHECK(hcommFinalize());
    if (my_rank == 0) printf("PASS p2p_groups on %d ranks\n", nranks);
    return 0;
}
