/* Fault tolerance through the C API, under `hcommrun --keep-going`: the last rank exits
 * abruptly (no hcommFinalize) after a warm-up; the others all-reduce until that fails,
 * revoke COMM_WORLD, read and acknowledge the failed set, agree (the AND of their flags),
 * shrink it, all-reduce exact integers on the survivors, then shrink the result again without
 * its last rank on purpose (hcommCommShrinkExcluding), which does not call it.
 * Usage: ft (under hcommrun --keep-going, 4 ranks). */
#define _POSIX_C_SOURCE 200809L
#include "ft_common.h"

int main(int argc, char **argv) {
    lose_the_last_rank(&argc, &argv);
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
