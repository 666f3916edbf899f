/* What the fault-tolerance programs share: exact all-reduces, and losing the last of 4 ranks
 * under `hcommrun --keep-going`. */
#ifndef HCOMM_TEST_FT_COMMON_H
#define HCOMM_TEST_FT_COMMON_H

#include "common.h"

#include <unistd.h>

#define FT_COUNT 256

/* An exact all-reduce on `comm`, checked: element i of rank r is (i + 1)(r + 1) + k. */
static int allreduce_exact(hcommComm_t comm, int k) {
    int n, r;
    CHECK(hcommCommSize(comm, &n));
    CHECK(hcommCommRank(comm, &r));
    int64_t send[FT_COUNT], recv[FT_COUNT];
    for (int i = 0; i < FT_COUNT; i++) send[i] = (int64_t)(i + 1) * (r + 1) + k;
    int rc = hcommAllReduce(send, recv, FT_COUNT, HCOMM_INT64, HCOMM_SUM, comm);
    if (rc != HCOMM_SUCCESS) return rc;
    for (int i = 0; i < FT_COUNT; i++) {
        ASSERT(recv[i] == (int64_t)(i + 1) * n * (n + 1) / 2 + (int64_t)n * k);
    }
    return HCOMM_SUCCESS;
}

/* Initializes hcomm on 4 ranks; after a warm-up the last rank exits abruptly (status 9, no
 * hcommFinalize); the others all-reduce until that fails, then revoke COMM_WORLD. */
static void lose_the_last_rank(int *argc, char ***argv) {
    int size;
    CHECK(test_init(argc, argv));
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
}

#endif
