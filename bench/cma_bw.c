// cma_bw: what one core moves per second on this machine, in user space and through
// cross-memory attach (process_vm_readv / process_vm_writev), over buffers of N MiB.
// Written to explain the 2-rank heap all-reduce at 256 MiB (docs/tuning.md#heap-buffers-at-256-mib):
// run it on both cores at once (cma_bw.sh) as the two ranks do. Transfers go to this process's
// own pages (the kernel pins and copies them exactly as a peer's).
//
//   cma_bw MODE MIB CHUNK_KIB PAGES REPS
//   PAGES: 4k (plain pages), thp (madvise(MADV_HUGEPAGE) before the first touch),
//          collapse (4k pages, then madvise(MADV_COLLAPSE): its time goes to stderr)
//   MODE:
//     read        sum a buffer (user loads, AVX2)
//     memcpy      glibc memcpy of a buffer into another
//     nt          copy with non-temporal stores (32 bytes each, AVX2: two per cache line)
//     nt64        the same with 64-byte stores (AVX-512F: a whole line each)
//     readv       process_vm_readv of the buffer in CHUNK pieces into one cache-sized buffer
//     readv_copy  one process_vm_readv of the whole buffer into another (memory to memory, as
//                 a large point-to-point message's share of each rank)
//     readv_hot   the readv above, each piece summed in user space first (so the kernel reads cache)
//     writev      process_vm_writev of one cache-sized buffer over the buffer in CHUNK pieces
//     writev_hot  the same, each destination piece summed in user space first
//     reduce      float sum of a buffer's pieces and a cache-sized operand into a cache-sized
//                 result (the all-reduce's reduction, its own contribution from memory)
//     allreduce   one rank's half of the heap all-reduce of hcomm (coll/onesided.rs): per piece
//                 readv the peer's contribution, reduce with its own, non-temporal stores into
//                 its result, writev into the peer's result; prints the time of each phase
//     allgather   one rank's block of the heap all-gather of hcomm: per piece non-temporal
//                 stores of its own contribution into its result, then writev of the piece into
//                 the peer's result (allgather64: the stores of nt64); readv shows as 0
//     pool        the all-reduce without the kernel: both contributions read in place, the result
//                 streamed into both results (the pool path)
// Prints the best of REPS repetitions, GB/s of the buffer (N MiB / time), and user/system shares.
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *alloc(size_t n, const char *pages) {
  char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  if (!strcmp(pages, "thp")) madvise(p, n, MADV_HUGEPAGE);
  memset(p, 1, n);
  if (!strcmp(pages, "collapse")) {
    double t = now();
    int rc = madvise(p, n, MADV_COLLAPSE);
    fprintf(stderr, "MADV_COLLAPSE of %zu MiB: rc %d, %.1f ms\n", n >> 20, rc, (now() - t) * 1e3);
  }
  return p;
}

__attribute__((target("avx2"))) static float sum(const char *p, size_t n) {
  __m256 s = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 64) s = _mm256_add_ps(s, _mm256_loadu_ps((const float *)(p + i)));
  return s[0];
}

__attribute__((target("avx2"))) static void nt_copy(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 32)
    _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
}

__attribute__((target("avx512f"))) static void nt_copy64(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 64)
    _mm512_stream_si512((void *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
}

__attribute__((target("avx2"))) static void add(char *d, const char *a, const char *b, size_t n) {
  for (size_t i = 0; i < n; i += 32)
    _mm256_storeu_ps((float *)(d + i), _mm256_add_ps(_mm256_loadu_ps((const float *)(a + i)),
                                                     _mm256_loadu_ps((const float *)(b + i))));
}

static void cma(int write, char *local, char *remote, size_t n) {
  struct iovec l = {local, n}, r = {remote, n};
  ssize_t got = write ? process_vm_writev(getpid(), &l, 1, &r, 1, 0)
                      : process_vm_readv(getpid(), &l, 1, &r, 1, 0);
  if (got != (ssize_t)n) {
    perror(write ? "process_vm_writev" : "process_vm_readv");
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: cma_bw MODE MIB CHUNK_KIB 4k|thp|collapse REPS\n");
    return 2;
  }
  const char *mode = argv[1], *pages = argv[4];
  size_t n = (size_t)atol(argv[2]) << 20, c = (size_t)atol(argv[3]) << 10;
  int reps = atoi(argv[5]);
  if (!n || !c || n % c || c % 64 || reps < 1) {
    fprintf(stderr, "MIB and CHUNK_KIB > 0, MIB a multiple of the chunk, REPS >= 1\n");
    return 2;
  }
  char *src = alloc(n, pages), *own = alloc(n, pages), *out = alloc(n, pages);
  char *peer_out = alloc(n, pages), *tmp = alloc(c, "4k"), *acc = alloc(c, "4k");
  double best = 1e30, t_read = 0, t_reduce = 0, t_write = 0;
  volatile float sink = 0;
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  for (int k = 0; k < reps; k++) {
    double t0 = now();
    if (!strcmp(mode, "read")) {
      sink += sum(src, n);
    } else if (!strcmp(mode, "memcpy")) {
      memcpy(out, src, n);
    } else if (!strcmp(mode, "nt")) {
      nt_copy(out, src, n);
      _mm_sfence();
    } else if (!strcmp(mode, "nt64")) {
      nt_copy64(out, src, n);
      _mm_sfence();
    } else if (!strcmp(mode, "allgather") || !strcmp(mode, "allgather64")) {
      for (size_t o = 0; o < n; o += c) {
        double a = now();
        if (mode[9]) nt_copy64(out + o, own + o, c);
        else nt_copy(out + o, own + o, c);
        _mm_sfence();
        double b = now();
        cma(1, own + o, peer_out + o, c);
        t_reduce += b - a;
        t_write += now() - b;
      }
    } else if (!strcmp(mode, "readv_copy")) {
      cma(0, out, src, n);
    } else if (!strcmp(mode, "readv") || !strcmp(mode, "readv_hot")) {
      for (size_t o = 0; o < n; o += c) {
        if (mode[5]) sink += sum(src + o, c);
        cma(0, tmp, src + o, c);
      }
    } else if (!strcmp(mode, "writev") || !strcmp(mode, "writev_hot")) {
      for (size_t o = 0; o < n; o += c) {
        if (mode[6]) sink += sum(peer_out + o, c);
        cma(1, acc, peer_out + o, c);
      }
    } else if (!strcmp(mode, "reduce")) {
      for (size_t o = 0; o < n; o += c) add(acc, own + o, tmp, c);
    } else if (!strcmp(mode, "allreduce")) {
      for (size_t o = 0; o < n; o += c) {
        double a = now();
        cma(0, tmp, src + o, c);
        double b = now();
        add(acc, own + o, tmp, c);
        nt_copy(out + o, acc, c);
        _mm_sfence();
        double d = now();
        cma(1, acc, peer_out + o, c);
        double e = now();
        t_read += b - a;
        t_reduce += d - b;
        t_write += e - d;
      }
    } else if (!strcmp(mode, "pool")) {
      for (size_t o = 0; o < n; o += c) {
        add(acc, own + o, src + o, c);
        nt_copy(out + o, acc, c);
        nt_copy(peer_out + o, acc, c);
      }
      _mm_sfence();
    } else {
      fprintf(stderr, "unknown mode %s\n", mode);
      return 2;
    }
    double t = now() - t0;
    if (t < best) best = t;
  }
  getrusage(RUSAGE_SELF, &r1);
  double user = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) * 1e-6;
  double sys = (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1e-6;
  printf("%-10s %5zu MiB chunk %4zu KiB %-8s best %8.2f ms %6.2f GB/s user %3.0f%% sys %3.0f%%", mode,
         n >> 20, c >> 10, pages, best * 1e3, n / best / 1e9, 100 * user / (user + sys + 1e-9),
         100 * sys / (user + sys + 1e-9));
  if (t_read > 0 || t_write > 0)
    printf(" | per call: readv %.2f reduce+stream %.2f writev %.2f ms", t_read * 1e3 / reps,
           t_reduce * 1e3 / reps, t_write * 1e3 / reps);
  printf("\n");
  return 0;
}
