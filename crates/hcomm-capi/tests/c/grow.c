/* Growing a communicator through the C API. Under `hcommrun --keep-going` (4 ranks): the last
 * rank exits abruptly after a warm-up; the others revoke COMM_WORLD and shrink it to 3; rank 0
 * of the 3 makes a join token (hcommCommJoinToken), hands it to the others with a broadcast
 * and writes it to the file `token` in the working directory; the 3 grow by one
 * (hcommCommGrow), all-reduce exact integers on 4, and find the token refused a second time
 * and on COMM_WORLD (another communicator). A buffer too small for a token is refused before
 * anything starts (no descriptor, no thread). Started alone as `grow join` (no launcher, no job
 * secret): waits for the file, joins with the token (hcommJoin, before hcommInit: the grown
 * communicator becomes COMM_WORLD) as rank 3 and all-reduces with them.
 * Usage: grow (under hcommrun --keep-going, 4 ranks) | grow join. */
#define _POSIX_C_SOURCE 200809L
#include "ft_common.h"

#include <dirent.h>
#include <time.h>

/* Entries of the directory `path` (this process's descriptors or threads under /proc). */
static int entries(const char *path) {
    DIR *d = opendir(path);
    ASSERT(d != NULL);
    int n = 0;
    while (readdir(d) != NULL) n++;
    closedir(d);
    return n;
}

/* The new process: reads the token once rank 0 has written it (at most 60 s), joins. */
static int join(void) {
    char token[HCOMM_JOIN_TOKEN_MAX] = {0};
    FILE *f = NULL;
    for (int tries = 0; tries < 6000 && f == NULL; tries++) {
        f = fopen("token", "r");
        if (f == NULL) {
            struct timespec ten_ms = {0, 10 * 1000 * 1000};
            nanosleep(&ten_ms, NULL);
        }
    }
    ASSERT(f != NULL);
    ASSERT(fgets(token, sizeof token, f) != NULL);
    fclose(f);
    hcommComm_t grown = HCOMM_COMM_NULL;
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommJoin(NULL, &grown));
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommJoin("hcomm-join/0/nothing", &grown));
    CHECK(hcommJoin(token, &grown));
    ASSERT(grown == COMM_WORLD);
    int n, r;
    CHECK(hcommCommSize(grown, &n));
    CHECK(hcommCommRank(grown, &r));
    my_rank = r;
    ASSERT(n == 4 && r == 3);
    for (int k = 0; k < 20; k++) CHECK(allreduce_exact(grown, k));
    printf("PASS grow: joined as rank %d of %d\n", r, n);
    fflush(stdout);
    CHECK(hcommFinalize());
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "join") == 0) return join();
    lose_the_last_rank(&argc, &argv);
    hcommComm_t shrunk, grown;
    CHECK(hcommCommShrink(COMM_WORLD, &shrunk));
    int r;
    CHECK(hcommCommRank(shrunk, &r));

    char token[HCOMM_JOIN_TOKEN_MAX] = {0};
    if (r == 0) {
        char small[8], tight[128];
        int fds = entries("/proc/self/fd"), threads = entries("/proc/self/task");
        EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommJoinToken(shrunk, small, sizeof small));
        EXPECT(HCOMM_ERR_INVALID_ARGUMENT,
               hcommCommJoinToken(shrunk, tight, sizeof tight));
        ASSERT(strstr(hcommGetLastErrorMessage(), "nothing was started") != NULL);
        ASSERT(entries("/proc/self/fd") == fds && entries("/proc/self/task") == threads);
        EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommJoinToken(shrunk, NULL, sizeof token));
        CHECK(hcommCommJoinToken(shrunk, token, sizeof token));
        ASSERT(strlen(token) > 0 && strlen(token) < sizeof token);
    }
    CHECK(hcommBroadcast(token, sizeof token, HCOMM_UINT8, 0, shrunk));
    if (r == 0) {
        FILE *f = fopen("token.tmp", "w");
        ASSERT(f != NULL);
        ASSERT(fputs(token, f) >= 0);
        ASSERT(fclose(f) == 0);
        ASSERT(rename("token.tmp", "token") == 0);
    }
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommGrow(COMM_WORLD, token, 1, &grown));
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommGrow(shrunk, token, 0, &grown));
    CHECK(hcommCommGrow(shrunk, token, 1, &grown));
    int n, g;
    CHECK(hcommCommSize(grown, &n));
    CHECK(hcommCommRank(grown, &g));
    ASSERT(n == 4 && g == r);
    for (int k = 0; k < 20; k++) CHECK(allreduce_exact(grown, k));
    EXPECT(HCOMM_ERR_INVALID_ARGUMENT, hcommCommGrow(shrunk, token, 1, &grown));
    ASSERT(grown == HCOMM_COMM_NULL);
    printf("PASS grow on rank %d: shrunk to 3, grown to %d\n", my_rank, n);
    fflush(stdout);
    CHECK(hcommFinalize());
    return 0;
}
