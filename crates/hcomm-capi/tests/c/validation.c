/* Feeds the C API every kind of bad input and checks each documented error code: calls before
 * hcommInit and after hcommFinalize, NULL pointers, sizes that overflow, ranks, roots and tags
 * out of range, unknown types and operations, NULL, forged and destroyed communicators,
 * completed requests, foreign pointers to hcommFree, bad transport plug-in registrations,
 * the fault-tolerance calls' bad arguments,
 * a truncated message, a timeout
 * (HCOMM_TIMEOUT must be small), and with two or more ranks a mismatch and a lost peer.
 * Prints "PASS validation" on success; exits 1 naming the first wrong code otherwise. */
#include "common.h"

#include <limits.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define INVALID HCOMM_ERR_INVALID_ARGUMENT
#define BAD_TYPE ((hcommDataType_t)13)
#define BAD_OP ((hcommReduceOp_t)8)

static const char *const code_names[] = {
    "HCOMM_SUCCESS",       "HCOMM_ERR_INIT",      "HCOMM_ERR_NO_MEM",
    "HCOMM_ERR_TIMEOUT",   "HCOMM_ERR_INVALID_ARGUMENT", "HCOMM_ERR_PEER_LOST",
    "HCOMM_ERR_MISMATCH",  "HCOMM_ERR_TRUNCATED", "HCOMM_ERR_TRANSPORT",
    "HCOMM_ERR_NOT_SUPPORTED", "HCOMM_ERR_ABORTED", "HCOMM_ERR_INTERNAL",
    "HCOMM_ERR_REVOKED",   "HCOMM_ERR_QUORUM"};

static void last_error_mentions(int code, const char *a, const char *b) {
    const char *m = hcommGetLastErrorMessage();
    if (hcommGetLastError() != code || !strstr(m, a) || !strstr(m, b)) {
        fprintf(stderr, "FAIL rank %d: last error %d \"%s\", expected code %d naming %s and %s\n",
                my_rank, hcommGetLastError(), m, code, a, b);
        exit(1);
    }
}

/* Every call that needs hcommInit gives HCOMM_ERR_INIT (before init and after finalize). */
static void not_initialized(void) {
    int r = -1, done = -1;
    char buf[8] = {0};
    hcommComm_t sub = COMM_WORLD;
    hcommRequest_t req = (hcommRequest_t)7, none = HCOMM_REQUEST_NULL;
    EXPECT(HCOMM_ERR_INIT, hcommCommRank(COMM_WORLD, &r));
    EXPECT(HCOMM_ERR_INIT, hcommCommSize(COMM_WORLD, &r));
    ASSERT(r == -1);
    EXPECT(HCOMM_ERR_INIT, hcommSend(buf, 1, 0, 0, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommRecv(buf, 1, 0, 0, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommIsend(buf, 1, 0, 0, COMM_WORLD, &req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    EXPECT(HCOMM_ERR_INIT, hcommIrecv(buf, 1, 0, 0, COMM_WORLD, &req));
    EXPECT(HCOMM_ERR_INIT, hcommWait(&none));
    EXPECT(HCOMM_ERR_INIT, hcommTest(&none, &done));
    EXPECT(HCOMM_ERR_INIT, hcommAllReduce(buf, buf, 1, HCOMM_INT8, HCOMM_SUM, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommBroadcast(buf, 1, HCOMM_INT8, 0, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommReduce(buf, buf, 1, HCOMM_INT8, HCOMM_SUM, 0, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommAllGather(buf, buf, 1, HCOMM_INT8, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommReduceScatter(buf, buf, 1, HCOMM_INT8, HCOMM_SUM, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommAlltoAll(buf, buf, 1, HCOMM_INT8, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommGather(buf, buf, 1, HCOMM_INT8, 0, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommScatter(buf, buf, 1, HCOMM_INT8, 0, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommBarrier(COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommCommSplit(COMM_WORLD, 0, 0, &sub));
    EXPECT(HCOMM_ERR_INIT, hcommCommDup(COMM_WORLD, &sub));
    req = (hcommRequest_t)7;
    EXPECT(HCOMM_ERR_INIT, hcommIallReduce(buf, buf, 1, HCOMM_INT8, HCOMM_SUM, COMM_WORLD, &req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    EXPECT(HCOMM_ERR_INIT, hcommIbarrier(COMM_WORLD, &req));
    size_t one = 1, zero = 0;
    EXPECT(HCOMM_ERR_INIT, hcommAllGatherv(buf, 1, buf, &one, &zero, HCOMM_INT8, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT,
           hcommAlltoAllv(buf, &one, &zero, buf, &one, &zero, HCOMM_INT8, COMM_WORLD));
    EXPECT(HCOMM_ERR_INIT, hcommCommDestroy((hcommComm_t)2));
    EXPECT(HCOMM_ERR_INIT, hcommGroupStart());
    EXPECT(HCOMM_ERR_INIT, hcommGroupEnd());
    EXPECT(HCOMM_ERR_INIT, hcommFinalize());
}

static void error_strings(void) {
    for (int c = 0; c <= HCOMM_ERR_QUORUM; c++) {
        const char *m = hcommGetErrorString(c);
        ASSERT(m != NULL && strstr(m, code_names[c]) == m && strlen(m) > strlen(code_names[c]) + 20);
        for (int d = 0; d < c; d++) ASSERT(strcmp(m, hcommGetErrorString(d)) != 0);
    }
    const int unknown[] = {-1, HCOMM_ERR_QUORUM + 1, 1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *m = hcommGetErrorString(unknown[i]);
        ASSERT(m != NULL && strstr(m, "unknown") != NULL);
    }
}

static void memory(void) {
    void *z = hcommMalloc(0);
    ASSERT(z != NULL && (uintptr_t)z % HCOMM_MALLOC_ALIGNMENT == 0);
    void *z2 = hcommMalloc(0);
    ASSERT(z2 != NULL && z2 != z);
    hcommFree(z);
    hcommFree(z2);
    ASSERT(hcommMalloc(SIZE_MAX) == NULL);
    last_error_mentions(INVALID, "hcommMalloc", "bytes");
    ASSERT(hcommMalloc((size_t)1 << 60) == NULL);
    last_error_mentions(HCOMM_ERR_NO_MEM, "hcommMalloc", "bytes");
    /* Foreign pointers are left alone: a stack variable, malloc'd memory, a double free. */
    int local = 42;
    hcommFree(&local);
    last_error_mentions(INVALID, "hcommFree", "hcommMalloc");
    ASSERT(local == 42);
    char *m = malloc(32);
    ASSERT(m != NULL);
    strcpy(m, "still mine");
    hcommFree(m);
    last_error_mentions(INVALID, "hcommFree", "hcommMalloc");
    ASSERT(strcmp(m, "still mine") == 0);
    free(m);
    char *p = hcommMalloc(100);
    hcommFree(p + 1);
    last_error_mentions(INVALID, "hcommFree", "hcommMalloc");
    hcommFree(p);
    hcommFree(p);
    last_error_mentions(INVALID, "hcommFree", "already freed");
    hcommFree(NULL);
}

static void null_pointers(int size) {
    char buf[64] = {0};
    float f[8] = {0};
    int done;
    hcommRequest_t req = (hcommRequest_t)7;
    EXPECT(INVALID, hcommCommRank(COMM_WORLD, NULL));
    EXPECT(INVALID, hcommCommSize(COMM_WORLD, NULL));
    EXPECT(INVALID, hcommCommSplit(COMM_WORLD, 0, 0, NULL));
    EXPECT(INVALID, hcommIsend(buf, 1, 0, 0, COMM_WORLD, NULL));
    EXPECT(INVALID, hcommIrecv(buf, 1, 0, 0, COMM_WORLD, NULL));
    EXPECT(INVALID, hcommWait(NULL));
    EXPECT(INVALID, hcommTest(NULL, &done));
    EXPECT(INVALID, hcommTest(&req, NULL));
    EXPECT(INVALID, hcommSend(NULL, 8, 0, 0, COMM_WORLD));
    last_error_mentions(INVALID, "hcommSend", "NULL");
    EXPECT(INVALID, hcommRecv(NULL, 8, 0, 0, COMM_WORLD));
    EXPECT(INVALID, hcommIsend(NULL, 8, 0, 0, COMM_WORLD, &req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    EXPECT(INVALID, hcommIrecv(NULL, 8, 0, 0, COMM_WORLD, &req));
    EXPECT(INVALID, hcommAllReduce(NULL, f, 8, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "sendbuf");
    EXPECT(INVALID, hcommAllReduce(f, NULL, 8, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "recvbuf");
    EXPECT(INVALID, hcommBroadcast(NULL, 8, HCOMM_FLOAT32, 0, COMM_WORLD));
    EXPECT(INVALID, hcommReduce(NULL, f, 8, HCOMM_FLOAT32, HCOMM_SUM, 0, COMM_WORLD));
    EXPECT(INVALID, hcommReduce(f, NULL, 8, HCOMM_FLOAT32, HCOMM_SUM, my_rank, COMM_WORLD));
    EXPECT(INVALID, hcommAllGather(NULL, f, 1, HCOMM_FLOAT32, COMM_WORLD));
    EXPECT(INVALID, hcommAllGather(f, NULL, 1, HCOMM_FLOAT32, COMM_WORLD));
    EXPECT(INVALID, hcommReduceScatter(NULL, f, 1, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD));
    EXPECT(INVALID, hcommReduceScatter(f, NULL, 1, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD));
    EXPECT(INVALID, hcommAlltoAll(NULL, f, 1, HCOMM_FLOAT32, COMM_WORLD));
    EXPECT(INVALID, hcommAlltoAll(f, NULL, 1, HCOMM_FLOAT32, COMM_WORLD));
    EXPECT(INVALID, hcommGather(NULL, f, 1, HCOMM_FLOAT32, 0, COMM_WORLD));
    EXPECT(INVALID, hcommGather(f, NULL, 1, HCOMM_FLOAT32, my_rank, COMM_WORLD));
    EXPECT(INVALID, hcommScatter(NULL, f, 1, HCOMM_FLOAT32, my_rank, COMM_WORLD));
    EXPECT(INVALID, hcommScatter(f, NULL, 1, HCOMM_FLOAT32, 0, COMM_WORLD));
    (void)size;
}

static void sizes_and_ranges(int size) {
    char buf[64] = {0};
    float f[8] = {0};
    hcommRequest_t req;
    /* Byte sizes beyond the address space, and counts whose byte size overflows. */
    EXPECT(INVALID, hcommSend(buf, SIZE_MAX, 0, 0, COMM_WORLD));
    EXPECT(INVALID, hcommRecv(buf, SIZE_MAX, 0, 0, COMM_WORLD));
    EXPECT(INVALID, hcommIsend(buf, (size_t)PTRDIFF_MAX + 1, 0, 0, COMM_WORLD, &req));
    EXPECT(INVALID, hcommIrecv(buf, SIZE_MAX, 0, 0, COMM_WORLD, &req));
    EXPECT(INVALID, hcommAllReduce(f, f, SIZE_MAX / 2, HCOMM_FLOAT64, HCOMM_SUM, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "count");
    EXPECT(INVALID, hcommBroadcast(f, SIZE_MAX, HCOMM_UINT8, 0, COMM_WORLD));
    EXPECT(INVALID, hcommAllGather(f, f, SIZE_MAX / 4, HCOMM_FLOAT32, COMM_WORLD));
    EXPECT(INVALID, hcommAlltoAll(f, f, (size_t)PTRDIFF_MAX + 1, HCOMM_INT8, COMM_WORLD));
    EXPECT(INVALID, hcommGather(f, f, SIZE_MAX / 8 + 1, HCOMM_INT64, 0, COMM_WORLD));
    EXPECT(INVALID, hcommScatter(f, f, SIZE_MAX / 3, HCOMM_UINT32, 0, COMM_WORLD));
    EXPECT(INVALID, hcommReduceScatter(f, f, SIZE_MAX / 2, HCOMM_FLOAT16, HCOMM_SUM, COMM_WORLD));
    EXPECT(INVALID, hcommReduce(f, f, SIZE_MAX / 2, HCOMM_BFLOAT16, HCOMM_MIN, 0, COMM_WORLD));
    /* A size that fits the address space but not the memory: HCOMM_ERR_NO_MEM. */
    EXPECT(HCOMM_ERR_NO_MEM, hcommIrecv(buf, (size_t)1 << 60, 0, 0, COMM_WORLD, &req));
    /* Ranks, roots and tags out of range. */
    EXPECT(INVALID, hcommSend(buf, 1, -1, 0, COMM_WORLD));
    EXPECT(INVALID, hcommSend(buf, 1, size, 0, COMM_WORLD));
    last_error_mentions(INVALID, "hcommSend", "dest");
    EXPECT(INVALID, hcommRecv(buf, 1, size, 0, COMM_WORLD));
    EXPECT(INVALID, hcommRecv(buf, 1, INT_MIN, 0, COMM_WORLD));
    EXPECT(INVALID, hcommIsend(buf, 1, size + 5, 0, COMM_WORLD, &req));
    EXPECT(INVALID, hcommIrecv(buf, 1, -2, 0, COMM_WORLD, &req));
    EXPECT(INVALID, hcommSend(buf, 1, 0, -1, COMM_WORLD));
    last_error_mentions(INVALID, "hcommSend", "tag");
    EXPECT(INVALID, hcommRecv(buf, 1, 0, INT_MIN, COMM_WORLD));
    EXPECT(INVALID, hcommIsend(buf, 1, 0, -7, COMM_WORLD, &req));
    EXPECT(INVALID, hcommBroadcast(f, 1, HCOMM_FLOAT32, -1, COMM_WORLD));
    EXPECT(INVALID, hcommBroadcast(f, 1, HCOMM_FLOAT32, size, COMM_WORLD));
    last_error_mentions(INVALID, "hcommBroadcast", "root");
    EXPECT(INVALID, hcommReduce(f, f, 1, HCOMM_FLOAT32, HCOMM_SUM, size, COMM_WORLD));
    EXPECT(INVALID, hcommGather(f, f, 1, HCOMM_FLOAT32, -1, COMM_WORLD));
    EXPECT(INVALID, hcommScatter(f, f, 1, HCOMM_FLOAT32, INT_MAX, COMM_WORLD));
    /* Unknown types and operations. */
    EXPECT(INVALID, hcommAllReduce(f, f, 1, BAD_TYPE, HCOMM_SUM, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "dtype");
    EXPECT(INVALID, hcommAllReduce(f, f, 1, (hcommDataType_t)-1, HCOMM_SUM, COMM_WORLD));
    EXPECT(INVALID, hcommAllReduce(f, f, 1, HCOMM_FLOAT32, BAD_OP, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "op");
    EXPECT(INVALID, hcommAllReduce(f, f, 1, HCOMM_FLOAT32, (hcommReduceOp_t)-1, COMM_WORLD));
    EXPECT(INVALID, hcommBroadcast(f, 1, (hcommDataType_t)99, 0, COMM_WORLD));
    EXPECT(INVALID, hcommReduce(f, f, 1, HCOMM_INT8, BAD_OP, 0, COMM_WORLD));
    EXPECT(INVALID, hcommReduce(f, f, 1, BAD_TYPE, HCOMM_SUM, 0, COMM_WORLD));
    EXPECT(INVALID, hcommAllGather(f, f, 1, BAD_TYPE, COMM_WORLD));
    EXPECT(INVALID, hcommReduceScatter(f, f, 1, HCOMM_UINT64, (hcommReduceOp_t)70, COMM_WORLD));
    EXPECT(INVALID, hcommAlltoAll(f, f, 1, (hcommDataType_t)-3, COMM_WORLD));
    EXPECT(INVALID, hcommGather(f, f, 1, BAD_TYPE, 0, COMM_WORLD));
    EXPECT(INVALID, hcommScatter(f, f, 1, BAD_TYPE, 0, COMM_WORLD));
    /* Zero elements need no buffer: this one runs (every rank calls it). */
    CHECK(hcommAllReduce(NULL, NULL, 0, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD));
    CHECK(hcommSend(NULL, 0, my_rank, 3, COMM_WORLD));
    CHECK(hcommRecv(NULL, 0, my_rank, 3, COMM_WORLD));
}

static void communicators(void) {
    int r;
    hcommComm_t sub;
    EXPECT(INVALID, hcommCommRank(HCOMM_COMM_NULL, &r));
    last_error_mentions(INVALID, "hcommCommRank", "HCOMM_COMM_NULL");
    EXPECT(INVALID, hcommBarrier((hcommComm_t)12345));
    last_error_mentions(INVALID, "hcommBarrier", "not a live communicator");
    EXPECT(INVALID, hcommSend(&r, sizeof r, 0, 0, (hcommComm_t)-1));
    EXPECT(INVALID, hcommCommDestroy(COMM_WORLD));
    last_error_mentions(INVALID, "hcommCommDestroy", "hcommFinalize");
    EXPECT(INVALID, hcommCommDestroy(HCOMM_COMM_NULL));
    CHECK(hcommCommSplit(COMM_WORLD, 1, 0, &sub));
    CHECK(hcommCommDestroy(sub));
    EXPECT(INVALID, hcommCommDestroy(sub));
    EXPECT(INVALID, hcommBarrier(sub));
    EXPECT(INVALID, hcommCommSize(sub, &r));
    EXPECT(INVALID, hcommAllReduce(&r, &r, 1, HCOMM_INT32, HCOMM_SUM, sub));
    EXPECT(INVALID, hcommCommSplit(sub, 0, 0, &sub));
    /* The world still works. */
    CHECK(hcommBarrier(COMM_WORLD));
}

static void requests(void) {
    char msg[8] = "abcdefg", got[8];
    int done = 5;
    hcommRequest_t forged = (hcommRequest_t)999999, req, copy;
    EXPECT(INVALID, hcommWait(&forged));
    last_error_mentions(INVALID, "hcommWait", "not a pending request");
    EXPECT(INVALID, hcommTest(&forged, &done));
    ASSERT(forged == (hcommRequest_t)999999);
    CHECK(hcommIsend(msg, sizeof msg, my_rank, 9, COMM_WORLD, &req));
    copy = req;
    CHECK(hcommRecv(got, sizeof got, my_rank, 9, COMM_WORLD));
    CHECK(hcommWait(&req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    EXPECT(INVALID, hcommWait(&copy));
    EXPECT(INVALID, hcommTest(&copy, &done));
    req = HCOMM_REQUEST_NULL;
    CHECK(hcommTest(&req, &done));
    ASSERT(done == 1);
    /* A message longer than the receive buffer. */
    CHECK(hcommIsend(msg, sizeof msg, my_rank, 10, COMM_WORLD, &req));
    EXPECT(HCOMM_ERR_TRUNCATED, hcommRecv(got, 4, my_rank, 10, COMM_WORLD));
    last_error_mentions(HCOMM_ERR_TRUNCATED, "hcommRecv", "8");
    CHECK(hcommWait(&req));
    CHECK(hcommIsend(msg, sizeof msg, my_rank, 11, COMM_WORLD, &req));
    hcommRequest_t rreq;
    CHECK(hcommIrecv(got, 2, my_rank, 11, COMM_WORLD, &rreq));
    EXPECT(HCOMM_ERR_TRUNCATED, hcommWait(&rreq));
    ASSERT(rreq == HCOMM_REQUEST_NULL);
    CHECK(hcommWait(&req));
}

static void groups(void) {
    float f[4] = {1, 2, 3, 4};
    EXPECT(INVALID, hcommGroupEnd());
    last_error_mentions(INVALID, "hcommGroupEnd", "hcommGroupStart");
    CHECK(hcommGroupStart());
    EXPECT(INVALID, hcommAllReduce(f, f, 4, BAD_TYPE, HCOMM_SUM, COMM_WORLD));
    EXPECT(INVALID, hcommBroadcast(f, 4, HCOMM_FLOAT32, -1, COMM_WORLD));
    EXPECT(INVALID, hcommSend(f, sizeof f, -1, 0, COMM_WORLD));
    CHECK(hcommAllReduce(f, f, 4, HCOMM_FLOAT32, HCOMM_MAX, COMM_WORLD));
    CHECK(hcommGroupEnd());
    ASSERT(f[3] == 4);
    EXPECT(INVALID, hcommGroupEnd());
}

/* The fault-tolerance calls' bad arguments, refused before anything is sent or revoked:
 * forged and NULL communicators, NULL outputs, a negative capacity or count, a NULL rank list,
 * ranks out of range or this rank. Each leaves HCOMM_COMM_NULL in the output of a shrink. The
 * world is neither revoked nor shrunk by any of them. */
static void fault_tolerance(int size) {
    int failed[4] = {-1, -1, -1, -1}, count = -1, flag = 1, n = -1;
    int bad[2] = {size, -1};
    hcommComm_t out = (hcommComm_t)7, forged = (hcommComm_t)12345;
    EXPECT(INVALID, hcommCommRevoke(forged));
    last_error_mentions(INVALID, "hcommCommRevoke", "not a live communicator");
    EXPECT(INVALID, hcommCommRevoke(HCOMM_COMM_NULL));
    EXPECT(INVALID, hcommCommAckFailed(forged));
    EXPECT(INVALID, hcommCommGetFailed(forged, failed, 4, &count));
    EXPECT(INVALID, hcommCommGetFailed(COMM_WORLD, failed, 4, NULL));
    last_error_mentions(INVALID, "hcommCommGetFailed", "count");
    EXPECT(INVALID, hcommCommGetFailed(COMM_WORLD, failed, -1, &count));
    last_error_mentions(INVALID, "hcommCommGetFailed", "negative");
    EXPECT(INVALID, hcommCommGetFailed(COMM_WORLD, NULL, 4, &count));
    last_error_mentions(INVALID, "hcommCommGetFailed", "ranks");
    ASSERT(count == -1 && failed[0] == -1);
    CHECK(hcommCommGetFailed(COMM_WORLD, NULL, 0, &count));
    ASSERT(count == 0);
    EXPECT(INVALID, hcommCommAgree(COMM_WORLD, NULL));
    last_error_mentions(INVALID, "hcommCommAgree", "flag");
    EXPECT(INVALID, hcommCommAgree(forged, &flag));
    EXPECT(INVALID, hcommCommShrink(COMM_WORLD, NULL));
    last_error_mentions(INVALID, "hcommCommShrink", "newcomm");
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommShrink(forged, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommShrinkExcluding(COMM_WORLD, bad, -1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    last_error_mentions(INVALID, "hcommCommShrinkExcluding", "negative");
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommShrinkExcluding(COMM_WORLD, NULL, 1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommShrinkExcluding(COMM_WORLD, &bad[0], 1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    last_error_mentions(INVALID, "hcommCommShrinkExcluding", "excluded rank");
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommShrinkExcluding(COMM_WORLD, &bad[1], 1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommShrinkExcluding(COMM_WORLD, &my_rank, 1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    last_error_mentions(INVALID, "hcommCommShrinkExcluding", "this rank");
    EXPECT(INVALID, hcommCommShrinkExcluding(COMM_WORLD, &my_rank, 1, NULL));
    /* Grow's bad arguments, refused before anything is made or sent. */
    char token[HCOMM_JOIN_TOKEN_MAX];
    EXPECT(INVALID, hcommCommJoinToken(forged, token, sizeof token));
    EXPECT(INVALID, hcommCommJoinToken(COMM_WORLD, NULL, sizeof token));
    last_error_mentions(INVALID, "hcommCommJoinToken", "buf");
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommGrow(forged, "hcomm-join/1/x", 1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommGrow(COMM_WORLD, NULL, 1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    last_error_mentions(INVALID, "hcommCommGrow", "token is NULL");
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommCommGrow(COMM_WORLD, "hcomm-join/1/x", -1, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    last_error_mentions(INVALID, "hcommCommGrow", "negative");
    EXPECT(INVALID, hcommCommGrow(COMM_WORLD, "hcomm-join/1/x", 1, NULL));
    out = (hcommComm_t)7;
    EXPECT(INVALID, hcommJoin(NULL, &out));
    ASSERT(out == HCOMM_COMM_NULL);
    last_error_mentions(INVALID, "hcommJoin", "token is NULL");
    /* The world still works. */
    n = my_rank;
    CHECK(hcommAllReduce(&n, &n, 1, HCOMM_INT32, HCOMM_SUM, COMM_WORLD));
    ASSERT(n == size * (size - 1) / 2);
}

/* The calls added with the new types: refused pairs (bitwise operations on floats, the
 * average of bool), bad counts and displacements of the v-variants, NULL request pointers,
 * nonblocking collectives inside a group, hcommCommDup's output. Each fails on every rank
 * before anything is sent: the calls after them still match, and compute right. */
static void new_calls(int size) {
    float f[4] = {1, 2, 3, 4};
    uint8_t flags[4] = {1, 0, 1, 0};
    hcommRequest_t req = (hcommRequest_t)7;
    EXPECT(INVALID, hcommAllReduce(f, f, 4, HCOMM_FLOAT32, HCOMM_BAND, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "band");
    EXPECT(INVALID, hcommReduce(f, f, 4, HCOMM_BFLOAT16, HCOMM_BXOR, 0, COMM_WORLD));
    EXPECT(INVALID, hcommReduceScatter(f, f, 1, HCOMM_FLOAT64, HCOMM_BOR, COMM_WORLD));
    EXPECT(INVALID, hcommAllReduce(flags, flags, 4, HCOMM_BOOL, HCOMM_AVG, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllReduce", "avg");
    EXPECT(INVALID, hcommIallReduce(f, f, 4, HCOMM_FLOAT16, HCOMM_BAND, COMM_WORLD, &req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    req = (hcommRequest_t)7;
    EXPECT(INVALID, hcommIallReduce(f, f, 4, BAD_TYPE, HCOMM_SUM, COMM_WORLD, &req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    EXPECT(INVALID, hcommIreduce(f, f, 4, HCOMM_FLOAT32, BAD_OP, 0, COMM_WORLD, &req));
    last_error_mentions(INVALID, "hcommIreduce", "op");
    EXPECT(INVALID, hcommIbroadcast(f, 4, HCOMM_FLOAT32, size, COMM_WORLD, &req));
    EXPECT(INVALID, hcommIallGather(NULL, f, 1, HCOMM_FLOAT32, COMM_WORLD, &req));
    EXPECT(INVALID, hcommIallReduce(f, f, 4, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD, NULL));
    last_error_mentions(INVALID, "hcommIallReduce", "request");
    EXPECT(INVALID, hcommIbarrier(COMM_WORLD, NULL));
    EXPECT(INVALID, hcommIbarrier((hcommComm_t)12345, &req));
    EXPECT(INVALID, hcommCommDup(COMM_WORLD, NULL));
    hcommComm_t copy = COMM_WORLD;
    EXPECT(INVALID, hcommCommDup(HCOMM_COMM_NULL, &copy));
    ASSERT(copy == HCOMM_COMM_NULL);

    /* v-variants: one count and displacement per rank. */
    size_t *counts = calloc((size_t)size, sizeof *counts);
    size_t *displs = calloc((size_t)size, sizeof *displs);
    ASSERT(counts && displs);
    for (int p = 0; p < size; p++) {
        counts[p] = 1;
        displs[p] = (size_t)p;
    }
    float *all = calloc((size_t)size, sizeof *all);
    ASSERT(all);
    float mine = (float)my_rank + 0.5f;
    EXPECT(INVALID, hcommAllGatherv(&mine, 1, all, NULL, displs, HCOMM_FLOAT32, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllGatherv", "recvcounts");
    EXPECT(INVALID, hcommAllGatherv(&mine, 1, all, counts, NULL, HCOMM_FLOAT32, COMM_WORLD));
    EXPECT(INVALID, hcommAllGatherv(&mine, 2, all, counts, displs, HCOMM_FLOAT32, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllGatherv", "sendcount");
    EXPECT(INVALID, hcommAllGatherv(&mine, 1, all, counts, displs, BAD_TYPE, COMM_WORLD));
    EXPECT(INVALID, hcommAllGatherv(&mine, 1, NULL, counts, displs, HCOMM_FLOAT32, COMM_WORLD));
    displs[size - 1] = SIZE_MAX - 1;
    EXPECT(INVALID, hcommAllGatherv(&mine, 1, all, counts, displs, HCOMM_FLOAT32, COMM_WORLD));
    last_error_mentions(INVALID, "hcommAllGatherv", "too large");
    EXPECT(INVALID, hcommIallGatherv(&mine, 1, all, counts, displs, HCOMM_FLOAT32, COMM_WORLD,
                                     &req));
    ASSERT(req == HCOMM_REQUEST_NULL);
    displs[size - 1] = (size_t)(size - 1);
    EXPECT(INVALID, hcommAlltoAllv(f, counts, displs, all, counts, NULL, HCOMM_FLOAT32,
                                   COMM_WORLD));
    last_error_mentions(INVALID, "hcommAlltoAllv", "rdispls");
    EXPECT(INVALID, hcommAlltoAllv(f, NULL, displs, all, counts, displs, HCOMM_FLOAT32,
                                   COMM_WORLD));
    EXPECT(INVALID, hcommAlltoAllv(f, counts, displs, all, counts, displs, BAD_TYPE,
                                   COMM_WORLD));
    EXPECT(INVALID, hcommIalltoAllv(f, counts, displs, all, counts, displs, HCOMM_FLOAT32,
                                    COMM_WORLD, NULL));

    /* Nonblocking collectives are refused inside a group; the group's own calls still run. */
    float g[4] = {1, 2, 3, 4};
    CHECK(hcommGroupStart());
    EXPECT(INVALID, hcommIallReduce(g, g, 4, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD, &req));
    last_error_mentions(INVALID, "hcommIallReduce", "hcommGroupStart");
    ASSERT(req == HCOMM_REQUEST_NULL);
    EXPECT(INVALID, hcommIbarrier(COMM_WORLD, &req));
    CHECK(hcommAllReduce(g, g, 4, HCOMM_FLOAT32, HCOMM_MAX, COMM_WORLD));
    CHECK(hcommAllGatherv(&mine, 1, all, counts, displs, HCOMM_FLOAT32, COMM_WORLD));
    CHECK(hcommGroupEnd());
    ASSERT(g[3] == 4);
    for (int p = 0; p < size; p++) ASSERT(all[p] == (float)p + 0.5f);

    /* Nothing of the refused calls reached the peers: these match and compute right. */
    uint8_t any[4];
    CHECK(hcommIallReduce(flags, any, 4, HCOMM_BOOL, HCOMM_BOR, COMM_WORLD, &req));
    CHECK(hcommWait(&req));
    ASSERT(any[0] == 1 && any[1] == 0 && any[2] == 1 && any[3] == 0);
    int16_t x[2] = {(int16_t)(my_rank + 1), -1}, y[2];
    CHECK(hcommAllReduce(x, y, 2, HCOMM_INT16, HCOMM_BXOR, COMM_WORLD));
    int16_t want = 0;
    for (int p = 0; p < size; p++) want ^= (int16_t)(p + 1);
    ASSERT(y[0] == want && y[1] == (size % 2 ? -1 : 0));
    hcommComm_t dup = HCOMM_COMM_NULL;
    CHECK(hcommCommDup(COMM_WORLD, &dup));
    CHECK(hcommIbarrier(dup, &req));
    CHECK(hcommWait(&req));
    CHECK(hcommCommDestroy(dup));
    EXPECT(INVALID, hcommIbarrier(dup, &req));
    free(counts);
    free(displs);
    free(all);
}

/* With HCOMM_TIMEOUT=2, a receive nobody sends to gives HCOMM_ERR_TIMEOUT. */
static void timeout(void) {
    char b;
    time_t t0 = time(NULL);
    EXPECT(HCOMM_ERR_TIMEOUT, hcommRecv(&b, 1, my_rank, 12345, COMM_WORLD));
    ASSERT(time(NULL) - t0 < 30);
}

static int never_send(void *buf, size_t count, int dest) { (void)buf; (void)count; (void)dest; return 1; }
static int never_recv(void *buf, size_t count, int src) { (void)buf; (void)count; (void)src; return 1; }

/* hcommTransportRegister: NULLs, missing functions, bad, built-in and taken names. */
static void transport_registration(void) {
    struct hcomm_transport_ops ops = {.send = never_send, .recv = never_recv};
    struct hcomm_transport_ops no_send = {.recv = never_recv}, no_recv = {.send = never_send};
    char long_name[66];
    memset(long_name, 'n', 65);
    long_name[65] = 0;
    EXPECT(INVALID, hcommTransportRegister(NULL, &ops));
    last_error_mentions(INVALID, "hcommTransportRegister", "name");
    EXPECT(INVALID, hcommTransportRegister("validation", NULL));
    EXPECT(INVALID, hcommTransportRegister("validation", &no_send));
    last_error_mentions(INVALID, "send", "recv");
    EXPECT(INVALID, hcommTransportRegister("validation", &no_recv));
    EXPECT(INVALID, hcommTransportRegister("", &ops));
    EXPECT(INVALID, hcommTransportRegister("two words", &ops));
    EXPECT(INVALID, hcommTransportRegister(long_name, &ops));
    EXPECT(INVALID, hcommTransportRegister("tcp", &ops));
    last_error_mentions(INVALID, "tcp", "built-in");
    EXPECT(INVALID, hcommTransportRegister("shm", &ops));
    CHECK(hcommTransportRegister(long_name + 1, &ops)); /* 64 characters */
    CHECK(hcommTransportRegister("validation", &ops));
    EXPECT(INVALID, hcommTransportRegister("validation", &ops));
    last_error_mentions(INVALID, "validation", "already registered");
}

/* Two or more ranks: rank 0 calls an all-reduce of 4 elements, the others of 5. */
static void mismatched_calls(void) {
    int32_t v[5] = {1, 2, 3, 4, 5};
    int rc = hcommAllReduce(v, v, my_rank == 0 ? 4 : 5, HCOMM_INT32, HCOMM_SUM, COMM_WORLD);
    if (rc != HCOMM_ERR_MISMATCH) {
        fprintf(stderr, "FAIL rank %d: mismatched all-reduce returned %d: %s\n", my_rank, rc,
                hcommGetLastErrorMessage());
        exit(1);
    }
}

/* Two or more ranks: the last rank leaves without a word; rank 0 learns it. */
static void peer_lost(int size) {
    char b = 1;
    /* Everyone is here before the last rank leaves. */
    if (my_rank == size - 1) {
        for (int r = 0; r < size - 1; r++) CHECK(hcommRecv(&b, 1, r, 500, COMM_WORLD));
        fflush(stdout);
        _exit(0);
    }
    CHECK(hcommSend(&b, 1, size - 1, 500, COMM_WORLD));
    EXPECT(HCOMM_ERR_PEER_LOST, hcommRecv(&b, 1, size - 1, 501, COMM_WORLD));
    last_error_mentions(HCOMM_ERR_PEER_LOST, "hcommRecv", "rank");
}

int main(int argc, char **argv) {
    ASSERT(hcommGetLastError() == HCOMM_SUCCESS);
    ASSERT(strcmp(hcommGetLastErrorMessage(), "") == 0);
    error_strings();
    not_initialized();
    /* Registered, never chosen (HCOMM_TRANSPORT is unset). */
    transport_registration();
    /* Memory works before hcommInit. */
    void *early = hcommMalloc(1000);
    ASSERT(early != NULL && (uintptr_t)early % 64 == 0);
    CHECK(hcommInit(&argc, &argv));
    CHECK(hcommInit(NULL, NULL)); /* again: nothing happens */
    int size;
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &size));
    if (argc > 1) ASSERT(size == atoi(argv[1]));
    memory();
    null_pointers(size);
    sizes_and_ranges(size);
    communicators();
    requests();
    groups();
    new_calls(size);
    fault_tolerance(size);
    timeout();
    if (size > 1) {
        mismatched_calls();
        peer_lost(size);
    }
    CHECK(hcommFinalize());
    not_initialized();
    EXPECT(HCOMM_ERR_INIT, hcommInit(&argc, &argv));
    last_error_mentions(HCOMM_ERR_INIT, "hcommInit", "hcommFinalize");
    /* Memory still works after hcommFinalize. */
    hcommFree(early);
    ASSERT(hcommGetLastError() == HCOMM_ERR_INIT);
    void *late = hcommMalloc(10);
    ASSERT(late != NULL);
    hcommFree(late);
    printf("PASS validation on rank %d of %d\n", my_rank, size);
    return 0;
}
