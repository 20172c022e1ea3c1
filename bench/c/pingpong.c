/*
 * pingpong.c - point-to-point latency between ranks 0 and 1 (one way: the round trip / 2), the
 * OSU way: warm-up, then a timed loop of blocking send and receive, for bench/p2p_nodes.py. One
 * source, two builds: against libhbmcoll (coll_job_create, coll_send, coll_recv) and, with -DWITH_MPI,
 * against MPI (MPI_Send, MPI_Recv).
 *
 *   pingpong SIZES SECONDS      e.g. pingpong 8,1048576 1
 *
 * Prints one line per size on rank 0: "size us".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef WITH_MPI
#include <mpi.h>
typedef MPI_Comm comm_t;
static int comm_open(int *argc, char ***argv, comm_t *c) { *c = MPI_COMM_WORLD; return MPI_Init(argc, argv); }
static int rank_of(comm_t c) { int r; MPI_Comm_rank(c, &r); return r; }
static int put(comm_t c, void *b, size_t n, int peer) { return MPI_Send(b, (int)n, MPI_BYTE, peer, 1, c); }
static int get(comm_t c, void *b, size_t n, int peer) { return MPI_Recv(b, (int)n, MPI_BYTE, peer, 1, c, MPI_STATUS_IGNORE); }
static void sync_all(comm_t c) { MPI_Barrier(c); }
static void comm_close(comm_t c) { (void)c, MPI_Finalize(); }
#else
#include <hbmcoll/coll.h>
typedef coll_comm_t *comm_t;
static int comm_open(int *argc, char ***argv, comm_t *c) { (void)argc, (void)argv; return coll_job_create(NULL, c); }
static int rank_of(comm_t c) { return coll_comm_rank(c); }
static int put(comm_t c, void *b, size_t n, int peer) { return coll_send(c, b, n, peer, 1); }
static int get(comm_t c, void *b, size_t n, int peer) { return coll_recv(c, b, n, peer, 1, NULL); }
static void sync_all(comm_t c) { coll_args_t a = {.kind = COLL_BARRIER}; coll_run(c, &a); }
static void comm_close(comm_t c) { coll_comm_free(c); }
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* iters round trips between ranks 0 and 1 (a job of 2 ranks). */
static int trips(comm_t c, int rank, char *buf, size_t n, long iters) {
  for (long i = 0; i < iters; i++) {
    if (rank == 0 && (put(c, buf, n, 1) || get(c, buf, n, 1))) return 1;
    if (rank == 1 && (get(c, buf, n, 0) || put(c, buf, n, 0))) return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  comm_t c;
  if (comm_open(&argc, &argv, &c) != 0) return fprintf(stderr, "pingpong: could not join the job\n"), 1;
  int rank = rank_of(c);
  double seconds = argc > 2 ? atof(argv[2]) : 1.0;
  char *sizes = strdup(argc > 1 ? argv[1] : "8,1048576"), *save = NULL;
  for (char *s = strtok_r(sizes, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
    size_t n = strtoul(s, NULL, 10);
    char *buf = calloc(n + 1, 1);
    long iters = 8; /* grown until a timed loop lasts about `seconds`: rank 0 decides and tells rank 1 */
    sync_all(c);
    for (;;) {
      double t = now();
      if (trips(c, rank, buf, n, iters)) return fprintf(stderr, "pingpong: rank %d failed\n", rank), 1;
      double took = now() - t;
      long next = took >= seconds * 0.5 || iters >= (1L << 24) ? 0 : iters * (took < seconds * 0.05 ? 8 : 2);
      if (rank == 0 && put(c, &next, sizeof next, 1)) return 1;
      if (rank == 1 && get(c, &next, sizeof next, 0)) return 1;
      if (next == 0) {
        if (rank == 0) printf("%zu %.2f\n", n, 1e6 * took / (double)iters / 2);
        break;
      }
      iters = next;
    }
    free(buf);
  }
  free(sizes);
  fflush(stdout);
  comm_close(c);
  return 0;
}
