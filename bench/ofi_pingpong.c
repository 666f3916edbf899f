// ofi_pingpong.c - bare libfabric ping-pong: the floor under hcomm's libfabric transport.
//
// Two processes, one RDM endpoint each (FI_TAGGED, the provider FI_PROVIDER names, e.g.
// tcp;ofi_rxm), exchange their endpoint names over a plain TCP socket, then bounce one tagged
// message of each size back and forth. Completions are read by spinning on fi_cq_read (the
// provider's progress runs in that call: nothing sleeps), which is the fastest a caller of
// the provider can go; fabtests' fi_pingpong waits differently and is slower here.
//
// usage: ofi_pingpong -s                 server (rank 1), listens on PORT
//        ofi_pingpong HOST                client (rank 0), prints the table
//   -x        (both sides) an exchange instead: each side posts its receive, sends (with
//             fi_tinject up to the provider's inject size, else fi_tsend) and waits for both,
//             as a 2-rank all-reduce's one step does; time = the whole exchange
//   -p PORT   TCP port of the name exchange (default 47611)
//   -b SIZE   smallest message (8), -e SIZE largest (16777216), doubling
//   -t SECS   timed seconds per size (0.2), at least 5 and at most 100000 round trips
//
// Output (client): "#  size  time_us" lines, time = median half round trip of individually
// timed round trips (as hcomm_perf pingpong).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHECK(what, call)                                                                \
  do {                                                                                   \
    long r_ = (long)(call);                                                              \
    if (r_ < 0) {                                                                        \
      fprintf(stderr, "ofi_pingpong: %s: %s\n", what, fi_strerror((int)-r_));          \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static struct fid_ep *ep;
static struct fid_cq *cq;
static fi_addr_t peer;
// The provider's largest injected send (tx_attr->inject_size).
static size_t inject_size;
// The providers' per-operation contexts (FI_CONTEXT2: eight words each).
static struct fi_context2 send_ctx, recv_ctx;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// Spins on the completion queue until one completion arrives.
static void wait_one(void) {
  struct fi_cq_tagged_entry e;
  for (;;) {
    ssize_t n = fi_cq_read(cq, &e, 1);
    if (n == 1) return;
    if (n == -FI_EAGAIN) continue;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(cq, &err, 0);
      fprintf(stderr, "ofi_pingpong: completion error: %s\n", fi_strerror(err.err));
      exit(1);
    }
    CHECK("fi_cq_read", n);
  }
}

static void post_send(void *buf, size_t len) {
  for (;;) {
    ssize_t r = fi_tsend(ep, buf, len, NULL, peer, 1, &send_ctx);
    if (r == 0) return;
    if (r != -FI_EAGAIN) CHECK("fi_tsend", r);
    struct fi_cq_tagged_entry e;
    ssize_t n = fi_cq_read(cq, &e, 0); // progress only
    (void)n;
  }
}

// Sends `len` bytes without a completion to wait for (the provider copied them).
static void inject(void *buf, size_t len) {
  for (;;) {
    ssize_t r = fi_tinject(ep, buf, len, peer, 1);
    if (r == 0) return;
    if (r != -FI_EAGAIN) CHECK("fi_tinject", r);
    struct fi_cq_tagged_entry e;
    ssize_t n = fi_cq_read(cq, &e, 0); // progress only
    (void)n;
  }
}

static void post_recv(void *buf, size_t len) {
  for (;;) {
    ssize_t r = fi_trecv(ep, buf, len, NULL, FI_ADDR_UNSPEC, 1, 0, &recv_ctx);
    if (r == 0) return;
    if (r != -FI_EAGAIN) CHECK("fi_trecv", r);
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// The socket of the name exchange: listen and accept (server) or connect (client).
static int exchange_socket(const char *host, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (!host) {
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    a.sin_addr.s_addr = INADDR_ANY;
    if (bind(s, (void *)&a, sizeof a) || listen(s, 1)) { perror("ofi_pingpong: listen"); exit(1); }
    int c = accept(s, NULL, NULL);
    close(s);
    return c;
  }
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) { fprintf(stderr, "ofi_pingpong: bad host %s\n", host); exit(1); }
  for (int i = 0; i < 100; i++) {
    if (connect(s, (void *)&a, sizeof a) == 0) return s;
    usleep(50000);
  }
  perror("ofi_pingpong: connect");
  exit(1);
}

int main(int argc, char **argv) {
  int server = 0, exchange = 0, port = 47611, opt;
  size_t lo = 8, hi = 16 << 20;
  double target = 0.2;
  while ((opt = getopt(argc, argv, "xsp:b:e:t:")) != -1) {
    switch (opt) {
      case 's': server = 1; break;
      case 'x': exchange = 1; break;
      case 'p': port = atoi(optarg); break;
      case 'b': lo = strtoull(optarg, NULL, 0); break;
      case 'e': hi = strtoull(optarg, NULL, 0); break;
      case 't': target = atof(optarg); break;
      default: fprintf(stderr, "usage: ofi_pingpong [-s | HOST] [-x] [-p PORT] [-b MIN] [-e MAX] [-t SECS]\n"); return 2;
    }
  }
  const char *host = server ? NULL : (optind < argc ? argv[optind] : NULL);
  if (!server && !host) { fprintf(stderr, "ofi_pingpong: client needs HOST\n"); return 2; }

  // The exchange socket first: the endpoint opens on the address it runs over.
  int s = exchange_socket(host, port);
  struct sockaddr_in me;
  socklen_t melen = sizeof me;
  char local[64];
  getsockname(s, (void *)&me, &melen);
  inet_ntop(AF_INET, &me.sin_addr, local, sizeof local);
  struct fi_info *hints = fi_allocinfo(), *info;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  CHECK("fi_getinfo", fi_getinfo(FI_VERSION(1, 17), local, NULL, FI_SOURCE, hints, &info));
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  CHECK("fi_fabric", fi_fabric(info->fabric_attr, &fabric, NULL));
  CHECK("fi_domain", fi_domain(fabric, info, &domain, NULL));
  CHECK("fi_cq_open", fi_cq_open(domain, &cq_attr, &cq, NULL));
  CHECK("fi_av_open", fi_av_open(domain, &av_attr, &av, NULL));
  CHECK("fi_endpoint", fi_endpoint(domain, info, &ep, NULL));
  CHECK("fi_ep_bind cq", fi_ep_bind(ep, &cq->fid, FI_SEND | FI_RECV));
  CHECK("fi_ep_bind av", fi_ep_bind(ep, &av->fid, 0));
  CHECK("fi_enable", fi_enable(ep));

  char name[256], theirs[256];
  size_t namelen = sizeof name;
  CHECK("fi_getname", fi_getname(&ep->fid, name, &namelen));
  uint32_t n32 = (uint32_t)namelen, t32;
  if (write(s, &n32, 4) != 4 || write(s, name, namelen) != (ssize_t)namelen ||
      read(s, &t32, 4) != 4 || t32 > sizeof theirs || read(s, theirs, t32) != (ssize_t)t32) {
    fprintf(stderr, "ofi_pingpong: name exchange failed\n");
    return 1;
  }
  if (fi_av_insert(av, theirs, 1, &peer, 0, NULL) != 1) { fprintf(stderr, "ofi_pingpong: fi_av_insert failed\n"); return 1; }

  inject_size = info->tx_attr->inject_size;
  // An exchange sends from the second half while it receives into the first.
  char *buf = aligned_alloc(4096, 2 * hi);
  memset(buf, 1, 2 * hi);
  if (!server) {
    printf("# ofi_pingpong: provider %s, fabric %s; time = median %s\n",
           info->fabric_attr->prov_name, info->fabric_attr->name,
           exchange ? "exchange (both sides send and receive at once)" : "half round trip");
    printf("#%11s %12s\n", "size", "time_us");
  }
  double *times = malloc(100000 * sizeof(double));
  for (size_t len = lo; len <= hi; len *= 2) {
    // Both sides agree on the number of round trips: the client times a few and tells.
    uint32_t iters = 0;
    for (int phase = 0; phase < 2; phase++) {
      uint32_t n = phase == 0 ? 5 : iters;
      for (uint32_t i = 0; i < n; i++) {
        double t0 = now_us();
        if (exchange) {
          post_recv(buf, len);
          if (len <= inject_size) {
            inject(buf + hi, len);
            wait_one();
          } else {
            post_send(buf + hi, len);
            wait_one();
            wait_one();
          }
          times[i] = now_us() - t0;
          continue;
        }
        if (server) {
          post_recv(buf, len);
          wait_one();
          post_send(buf, len);
          wait_one();
        } else {
          post_recv(buf, len);
          post_send(buf, len);
          wait_one();
          wait_one();
        }
        times[i] = (now_us() - t0) / 2;
      }
      if (phase == 0) {
        if (!server) {
          double rt = 0;
          for (int i = 0; i < 5; i++) rt += times[i] * (exchange ? 1 : 2) / 5;
          double want = target * 1e6 / (rt > 1 ? rt : 1);
          iters = want < 5 ? 5 : want > 100000 ? 100000 : (uint32_t)want;
          if (write(s, &iters, 4) != 4) return 1;
        } else if (read(s, &iters, 4) != 4) {
          return 1;
        }
      }
    }
    if (!server) {
      qsort(times, iters, sizeof(double), cmp);
      printf("%12zu %12.2f\n", len, times[iters / 2]);
      fflush(stdout);
    }
  }
  close(s);
  fi_close(&ep->fid);
  fi_close(&av->fid);
  fi_close(&cq->fid);
  fi_close(&domain->fid);
  fi_close(&fabric->fid);
  fi_freeinfo(info);
  fi_freeinfo(hints);
  return 0;
}
