/*
 * collectives.c - hbmcoll from C: allreduce, bcast and gather between the processes
 * hbmcoll-run starts.
 *
 *   cc collectives.c $(pkg-config --cflags --libs hbmcoll) -o collectives
 *   hbmcoll-run -n 3 ./collectives
 *
 * hbmcoll-run gives every rank HBMCOLL_RANK, HBMCOLL_SIZE and HBMCOLL_JOB_KEY (a secret of
 * the job that names its rendezvous). Under MPI, take rank and size from MPI and broadcast
 * a random key from rank 0 instead.
 */
#include <stdio.h>
#include <stdlib.h>

#include <hbmcoll/coll.h>

static int fail(const char *what, int rc, coll_comm_t *comm) {
  const char *text = NULL;
  if (comm != NULL)
    coll_comm_error(comm, &text);
  fprintf(stderr, "%s: %s (%s)%s%s\n", what, coll_strerror(rc), coll_err_name(rc),
          text != NULL && text[0] ? ": " : "", text != NULL ? text : "");
  coll_comm_free(comm);
  return 1;
}

int main(void) {
  const char *rank_s = getenv("HBMCOLL_RANK"), *size_s = getenv("HBMCOLL_SIZE");
  const char *key = getenv("HBMCOLL_JOB_KEY");
  if (rank_s == NULL || size_s == NULL || key == NULL) {
    fprintf(stderr, "start me with hbmcoll-run -n N\n");
    return 2;
  }
  coll_comm_config_t config = {.rank = atoi(rank_s), .size = atoi(size_s), .job_key = key};
  coll_comm_t *comm = NULL;
  int rc = coll_comm_create(&config, &comm);
  if (rc != 0)
    return fail("coll_comm_create", rc, NULL);
  int rank = coll_comm_rank(comm), size = coll_comm_size(comm);

  /* allreduce: every rank gets 1 + 2 + ... + size in every element */
  float grad[1024], sum[1024];
  for (int i = 0; i < 1024; i++)
    grad[i] = (float)(rank + 1);
  coll_args_t ar = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = 1024,
                    .send = grad, .recv = sum};
  if ((rc = coll_run(comm, &ar)) != 0)
    return fail("allreduce", rc, comm);

  /* bcast: rank 0's numbers reach everyone */
  int64_t params[4] = {0, 0, 0, 0};
  if (rank == 0)
    for (int i = 0; i < 4; i++)
      params[i] = 100 + i;
  coll_args_t bc = {.kind = COLL_BCAST, .dtype = COLL_INT64, .root = 0, .count = 4, .recv = params};
  if ((rc = coll_run(comm, &bc)) != 0)
    return fail("bcast", rc, comm);

  /* gather: rank 0 collects one number from each rank */
  int32_t mine = rank * rank, all[64];
  coll_args_t ga = {.kind = COLL_GATHER, .dtype = COLL_INT32, .root = 0, .count = 1, .send = &mine,
                    .recv = rank == 0 ? all : NULL};
  if (size > 64 || (rc = coll_run(comm, &ga)) != 0)
    return fail("gather", size > 64 ? COLL_EBADARG : rc, comm);

  int ok = sum[0] == (float)(size * (size + 1) / 2) && sum[1023] == sum[0] && params[3] == 103;
  for (int r = 0; rank == 0 && r < size; r++)
    ok &= all[r] == r * r;
  printf("rank %d of %d: allreduce %.0f, bcast %lld, %s\n", rank, size, sum[0],
         (long long)params[3], ok ? "ok" : "WRONG");
  coll_comm_free(comm);
  return ok ? 0 : 1;
}
