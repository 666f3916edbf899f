/* Fault tolerance through the C API, under `hcommrun --keep-going`: the last rank exits
 * abruptly (no hcommFinalize) after a warm-up; the others all-reduce until that fails,
 * revoke COMM_WORLD, read and acknowledge the failed set, agree (the AND of their flags),
 * shrink it, all-reduce exact integers on the survivors, then shrink the result again without
 * its last rank on purpose (hcommCommShrinkExcluding), which does not call it.
 * Usage: ft (under hcommrun --keep-going, 4 ranks). */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <unistd.h>

#define COUNT 256

/* An exact all-reduce on `comm`, checked: element i of rank r is (i + 1)(r + 1) + k. */
static int allreduce_exact(hcommComm_t comm, int k) {
    int n, r;
    CHECK(hcommCommSize(comm, &n));
    CHECK(hcommCommRank(comm, &r));
    int64_t send[COUNT], recv[COUNT];
    for (int i = 0; i < COUNT; i++) send[i] = (int64_t)(i + 1) * (r + 1) + k;
    int rc = hcommAllReduce(send, recv, COUNT, HCOMM_INT64, HCOMM_SUM, comm);
    if (rc != HCOMM_SUCCESS) return rc;
    for (int i = 0; i < COUNT; i++) {
        ASSERT(recv[i] == (int64_t)(i + 1) * n * (n + 1) / 2 + (int64_t)n * k);
    }
    return HCOMM_SUCCESS;
}

int main(int argc, char **argv) {
    int size;
    CHECK(test_init(&argc, &argv));
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &size));
    ASSERT(size == 4);
    for (int k = 0; k < 10; k++) CHECK(allreduce_exact(COMM_WORLD, k));
    if (my_rank == 3) {
        fflush(stdout);
        _exit(9);
    }
    int rc = HCOMM_SUCCESS;
    for (int k = 10; k < 1000000 && rc == HCOMM_SUCCESS; k++) rc = allreduce_exact(COMM_WORLD, k);
    ASSERT(rc == HCOMM_ERR_PEER_LOST || rc == HCOMM_ERR_ABORTED || rc == HCOMM_ERR_REVOKED);
    CHECK(hcommCommRevoke(COMM_WORLD));
    EXPECT(HCOMM_ERR_REVOKED, allreduce_exact(COMM_WORLD, 0));

    hcommComm_t shrunk, half;
    CHECK(hcommCommShrink(COMM_WORLD, &shrunk));
    int count = -1, failed[4] = {-1, -1, -1, -1};
    CHECK(hcommCommGetFailed(COMM_WORLD, NULL, 0, &count));
    ASSERT(count == 1);
    CHECK(hcommCommGetFailed(COMM_WORLD, failed, 4, &count));
    ASSERT(count == 1 && failed[0] == 3);
    int flag = my_rank != 1;
    EXPECT(HCOMM_ERR_PEER_LOST, hcommCommAgree(COMM_WORLD, &flag));
    ASSERT(flag == 0);
    CHECK(hcommCommAckFailed(COMM_WORLD));
    flag = 1;
    CHECK(hcommCommAgree(COMM_WORLD, &flag));
    ASSERT(flag == 1);

    int n;
    CHECK(hcommCommSize(shrunk, &n));
    ASSERT(n == 3);
    for (int k = 0; k < 20; k++) CHECK(allreduce_exact(shrunk, k));
    int excluded = 2, r;
    CHECK(hcommCommRank(shrunk, &r));
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommShrinkExcluding(shrunk, &r, 1, &half));
    if (r != excluded) {
        CHECK(hcommCommShrinkExcluding(shrunk, &excluded, 1, &half));
        CHECK(hcommCommSize(half, &n));
        ASSERT(n == 2);
        for (int k = 0; k < 20; k++) CHECK(allreduce_exact(half, k));
        CHECK(hcommCommDestroy(half));
    }
    printf("PASS ft on rank %d: shrunk to 3, then to 2 without rank 2\n", my_rank);
    fflush(stdout);
    CHECK(hcommCommDestroy(shrunk));
    CHECK(hcommFinalize());
    return 0;
}
