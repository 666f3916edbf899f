/* hcommCommAbort: the last rank aborts COMM_WORLD while rank 0 waits in a receive from it and
 * the other ranks wait in an all-reduce it never joins. Every waiter must get
 * HCOMM_ERR_ABORTED promptly (run with a long HCOMM_TIMEOUT: a timeout fails the test), and
 * every later call on the communicator too. The aborting rank lingers a second, so that the
 * others report before hcommrun stops them, then exits with status 3 for hcommrun to name.
 * The aborting rank also dumps its flight recorder (hcommCommDumpTrace) into HCOMM_TRACE_DIR.
 * Usage: abort (under hcommrun, 3 ranks or more). */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <time.h>

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    int size;
    CHECK(test_init(&argc, &argv));
    CHECK(hcommCommRank(COMM_WORLD, &my_rank));
    CHECK(hcommCommSize(COMM_WORLD, &size));
    ASSERT(size >= 3);
    int aborter = size - 1;
    CHECK(hcommBarrier(COMM_WORLD));
    float buf[1024];
    for (int i = 0; i < 1024; i++) buf[i] = 1.0f;
    if (my_rank == aborter) {
        sleep_ms(300);
        EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommAbort(HCOMM_COMM_NULL));
        printf("aborting\n");
        fflush(stdout);
        CHECK(hcommCommAbort(COMM_WORLD));
        CHECK(hcommCommAbort(COMM_WORLD));
        /* The abort dumped the flight recorder; the API dumps again, the call aborted or not. */
        EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommDumpTrace(HCOMM_COMM_NULL));
        CHECK(hcommCommDumpTrace(COMM_WORLD));
        EXPECT(HCOMM_ERR_ABORTED, hcommBarrier(COMM_WORLD));
        EXPECT(HCOMM_ERR_ABORTED, hcommSend(buf, 4, 0, 1, COMM_WORLD));
        sleep_ms(1000);
        CHECK(hcommFinalize());
        return 3;
    }
    double t0 = now_ms();
    if (my_rank == 0) {
        EXPECT(HCOMM_ERR_ABORTED, hcommRecv(buf, sizeof buf, aborter, 7, COMM_WORLD));
    } else {
        EXPECT(HCOMM_ERR_ABORTED,
               hcommAllReduce(buf, buf, 1024, HCOMM_FLOAT32, HCOMM_SUM, COMM_WORLD));
    }
    double waited = now_ms() - t0;
    ASSERT(strstr(hcommGetLastErrorMessage(), "aborted") != NULL);
    /* Later calls on the communicator fail the same way, without waiting. */
    EXPECT(HCOMM_ERR_ABORTED, hcommBarrier(COMM_WORLD));
    EXPECT(HCOMM_ERR_ABORTED, hcommRecv(buf, sizeof buf, 0, 8, COMM_WORLD));
    printf("PASS abort on rank %d: aborted after %.0f ms of waiting: %s\n", my_rank, waited,
           hcommGetLastErrorMessage());
    fflush(stdout);
    CHECK(hcommFinalize());
    return 0;
}
