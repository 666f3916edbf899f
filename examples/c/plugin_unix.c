/* A transport plug-in over Unix domain sockets: with HCOMM_TRANSPORT=unix every byte
 * of the job, point-to-point messages and collectives alike, goes through the stream sockets
 * this file opens between the ranks of one host, not through hcomm's TCP or shared memory.
 *
 *   gcc plugin_unix.c -o plugin_unix -lhcomm
 *   HCOMM_TRANSPORT=unix hcommrun -n 4 ./plugin_unix
 *
 * plugin_unix_register() registers the plug-in as "unix"; call it before hcommInit, as the
 * main at the end does. Built with -DPLUGIN_UNIX_NO_MAIN, this file leaves its main out, to be
 * linked into another program.
 *
 * init: rank r listens at DIR/r, connects to every lower rank (saying its rank first) and
 * accepts every higher one, within HCOMM_TIMEOUT. DIR, made with mode 0700, is
 * $TMPDIR/hcomm-unix-<uid>-<hash of HCOMM_JOB_SECRET and HCOMM_ROOT_ADDR> (TMPDIR defaults to
 * /tmp): every job has its own. Once connected, each rank removes its socket file and the last
 * one the directory, so nothing is left behind even if the job dies later.
 * send/recv: loop until all bytes went, through EINTR and partial transfers (MSG_NOSIGNAL: a
 * peer that has gone is an error, not a SIGPIPE).
 * finalize: shuts every socket down, which makes calls still blocked on other threads return,
 * waits for them, then closes the sockets; later calls fail at once.
 * HCOMM_UNIX_STATS=1 prints at finalize what went through the plug-in. */
#define _GNU_SOURCE
#include <hcomm/hcomm.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct unix_plugin {
    pthread_mutex_t lock;
    pthread_cond_t idle;   /* signalled when the last call in progress returns */
    int rank, size;
    int *fds;              /* fds[peer]: the socket to each peer; -1 for this rank */
    int finalized;
    int active;            /* send and recv calls in progress */
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    unsigned long long sends, sent_bytes, recvs, received_bytes;
};

static struct unix_plugin plugin = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER, .rank = -1};

static void complain(const char *what, int err) {
    fprintf(stderr, "plugin_unix: rank %d: %s: %s\n", plugin.rank, what, strerror(err));
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The job's directory, from the job's secret and store address (FNV-1a). */
static int job_dir(char *out, size_t cap) {
    const char *parts[] = {getenv("HCOMM_JOB_SECRET"), "\n", getenv("HCOMM_ROOT_ADDR")};
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i] ? parts[i] : ""; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3u;
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(out, cap, "%s/hcomm-unix-%u-%016llx", tmp && *tmp ? tmp : "/tmp",
                     (unsigned)getuid(), (unsigned long long)h);
    if (n < 0 || (size_t)n + 12 >= cap) {
        fprintf(stderr, "plugin_unix: the socket directory under TMPDIR is too long a path\n");
        return -1;
    }
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        complain(out, errno);
        return -1;
    }
    struct stat st;
    if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)) {
        fprintf(stderr, "plugin_unix: %s is not a private directory of this user\n", out);
        return -1;
    }
    return 0;
}

/* The socket address of `rank` (job_dir left room for it). */
static struct sockaddr_un address(int rank) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (snprintf(a.sun_path, sizeof a.sun_path, "%s/%d", plugin.dir, rank) >= (int)sizeof a.sun_path)
        a.sun_path[0] = 0;
    return a;
}

/* Writes or reads all `count` bytes. */
static int transfer(int fd, void *buf, size_t count, int sending) {
    char *p = buf;
    while (count > 0) {
        ssize_t n = sending ? send(fd, p, count, MSG_NOSIGNAL) : recv(fd, p, count, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1; /* an error, or the peer closed its end */
        p += n;
        count -= (size_t)n;
    }
    return 0;
}

/* Connects to `peer`'s socket, retrying while it does not exist yet, until `deadline`. */
static int connect_to(int peer, double deadline) {
    struct sockaddr_un a = address(peer);
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            int32_t me = plugin.rank;
            if (transfer(fd, &me, sizeof me, 1) == 0) return fd;
        }
        int err = errno;
        close(fd);
        if ((err != ENOENT && err != ECONNREFUSED) || now() > deadline) {
            complain("connecting to a lower rank", err);
            return -1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
    }
}

/* Accepts the connection of one higher rank, which says who it is. */
static int accept_one(int listener, double deadline) {
    struct pollfd p = {.fd = listener, .events = POLLIN};
    int ready;
    do {
        double left = deadline - now();
        ready = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) {
        fprintf(stderr, "plugin_unix: rank %d: a higher rank did not connect in time\n", plugin.rank);
        return -1;
    }
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    int32_t who = -1;
    if (fd < 0 || transfer(fd, &who, sizeof who, 0) != 0 || who <= plugin.rank || who >= plugin.size ||
        plugin.fds[who] != -1) {
        fprintf(stderr, "plugin_unix: rank %d: a bad connection (rank %d)\n", plugin.rank, (int)who);
        if (fd >= 0) close(fd);
        return -1;
    }
    plugin.fds[who] = fd;
    return 0;
}

static int unix_finalize(void *ctx);

static int unix_init(int rank, int size, void *ctx) {
    struct unix_plugin *up = ctx;
    const char *t = getenv("HCOMM_TIMEOUT");
    double deadline = now() + (t && atof(t) > 0 ? atof(t) : 300.0);
    up->rank = rank;
    up->size = size;
    up->fds = malloc((size_t)size * sizeof *up->fds);
    if (!up->fds) return -1;
    for (int r = 0; r < size; r++) up->fds[r] = -1;
    if (size == 1) return 0;
    if (job_dir(up->dir, sizeof up->dir) != 0) return -1;
    int listener = -1, failed = 0;
    struct sockaddr_un me = address(rank);
    if (rank < size - 1) { /* the highest rank accepts nobody */
        listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        unlink(me.sun_path);
        if (listener < 0 || bind(listener, (struct sockaddr *)&me, sizeof me) != 0 ||
            listen(listener, size) != 0) {
            complain("listening", errno);
            failed = 1;
        }
    }
    for (int r = 0; r < rank && !failed; r++) failed = (up->fds[r] = connect_to(r, deadline)) < 0;
    for (int r = rank + 1; r < size && !failed; r++) failed = accept_one(listener, deadline) != 0;
    if (listener >= 0) {
        close(listener);
        unlink(me.sun_path);
    }
    rmdir(up->dir); /* fails while other ranks' sockets are there: the last one removes it */
    if (failed) {
        unix_finalize(up);
        return -1;
    }
    return 0;
}

/* The socket to `peer`, with the call counted as in progress; -1 after finalize. */
static int enter(int peer) {
    pthread_mutex_lock(&plugin.lock);
    int fd = -1;
    if (!plugin.finalized && plugin.fds && peer >= 0 && peer < plugin.size) fd = plugin.fds[peer];
    if (fd >= 0) plugin.active++;
    pthread_mutex_unlock(&plugin.lock);
    return fd;
}

static void leave(int sending, size_t bytes) {
    pthread_mutex_lock(&plugin.lock);
    if (sending) {
        plugin.sends++;
        plugin.sent_bytes += bytes;
    } else {
        plugin.recvs++;
        plugin.received_bytes += bytes;
    }
    if (--plugin.active == 0) pthread_cond_broadcast(&plugin.idle);
    pthread_mutex_unlock(&plugin.lock);
}

/* Sends or receives all `count` bytes to or from `peer`. */
static int unix_transfer(int peer, void *buf, size_t count, int sending) {
    int fd = enter(peer);
    if (fd < 0) return -1;
    int rc = transfer(fd, buf, count, sending);
    leave(sending, rc == 0 ? count : 0);
    return rc;
}

static int unix_send(void *buf, size_t count, int dest) { return unix_transfer(dest, buf, count, 1); }

static int unix_recv(void *buf, size_t count, int src) { return unix_transfer(src, buf, count, 0); }

static int unix_finalize(void *ctx) {
    struct unix_plugin *up = ctx;
    pthread_mutex_lock(&up->lock);
    up->finalized = 1;
    for (int r = 0; up->fds && r < up->size; r++)
        if (up->fds[r] >= 0) shutdown(up->fds[r], SHUT_RDWR);
    while (up->active > 0) pthread_cond_wait(&up->idle, &up->lock);
    for (int r = 0; up->fds && r < up->size; r++)
        if (up->fds[r] >= 0) close(up->fds[r]);
    free(up->fds);
    up->fds = NULL;
    const char *stats = getenv("HCOMM_UNIX_STATS");
    if (stats && strcmp(stats, "1") == 0) {
        printf("plugin_unix: rank %d of %d: sent %llu messages (%llu bytes), received %llu "
               "messages (%llu bytes)\n",
               up->rank, up->size, up->sends, up->sent_bytes, up->recvs, up->received_bytes);
        fflush(stdout);
    }
    pthread_mutex_unlock(&up->lock);
    return 0;
}

/* Registers the plug-in as "unix": HCOMM_TRANSPORT=unix then selects it at hcommInit. */
int plugin_unix_register(void) {
    struct hcomm_transport_ops ops = {
        .send = unix_send,
        .recv = unix_recv,
        .init = unix_init,
        .finalize = unix_finalize,
        .ctx = &plugin,
    };
    return hcommTransportRegister("unix", &ops);
}

#ifndef PLUGIN_UNIX_NO_MAIN
/* Each rank greets its right neighbour and all ranks sum their ranks, through the plug-in. */
int main(int argc, char **argv) {
    int rank, size;
    if (plugin_unix_register() != HCOMM_SUCCESS || hcommInit(&argc, &argv) != HCOMM_SUCCESS ||
        hcommCommRank(COMM_WORLD, &rank) != HCOMM_SUCCESS ||
        hcommCommSize(COMM_WORLD, &size) != HCOMM_SUCCESS) {
        fprintf(stderr, "plugin_unix: %s\n", hcommGetLastErrorMessage());
        return 1;
    }
    char hello[64], got[64];
    snprintf(hello, sizeof hello, "hello from rank %d", rank);
    hcommRequest_t req;
    long long mine = rank, sum = 0;
    if (hcommIsend(hello, sizeof hello, (rank + 1) % size, 0, COMM_WORLD, &req) != HCOMM_SUCCESS ||
        hcommRecv(got, sizeof got, (rank + size - 1) % size, 0, COMM_WORLD) != HCOMM_SUCCESS ||
        hcommWait(&req) != HCOMM_SUCCESS ||
        hcommAllReduce(&mine, &sum, 1, HCOMM_INT64, HCOMM_SUM, COMM_WORLD) != HCOMM_SUCCESS) {
        fprintf(stderr, "plugin_unix: rank %d: %s\n", rank, hcommGetLastErrorMessage());
        return 1;
    }
    printf("rank %d of %d: got \"%s\"; the ranks sum to %lld\n", rank, size, got, sum);
    return hcommFinalize() == HCOMM_SUCCESS && sum == (long long)size * (size - 1) / 2 ? 0 : 1;
}
#endif
