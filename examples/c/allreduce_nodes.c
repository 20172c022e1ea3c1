/*
 * allreduce_nodes.c - hbmcoll from C across nodes: one communicator over every rank of every node
 * (shared memory in each node, the bridge's rings between them), joined from the launcher's
 * variables as Python's hbmcoll.init() joins, split in groups that span the nodes, and messages
 * between ranks (send/recv: to the next rank and from the previous, on this node or another).
 *
 *   cc allreduce_nodes.c $(pkg-config --cflags --libs hbmcoll) -o allreduce_nodes
 *   # on each of 2 nodes, the same secret everywhere, node 0's address as the master:
 *   export HBMCOLL_JOB_KEY=$(openssl rand -hex 16)      # (shared with the other node)
 *   hbmcoll-run -n 2 --nnodes 2 --node-rank R --master 10.0.0.1 ./allreduce_nodes
 *
 * hbmcoll-run gives every rank HBMCOLL_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE and, across nodes,
 * HBMCOLL_MASTER and MASTER_PORT (the nodes meet at MASTER_PORT + 1); coll_job_create reads them
 * (and torchrun's, mpiexec's or srun's variables the same way). HBMCOLL_IFACE picks the bridge's
 * interface, HBMCOLL_NODE the node's name (both optional). `make example-c` runs it on 2 emulated
 * nodes (network namespaces) x 2 ranks.
 */
#include <stdio.h>
#include <stdlib.h>

#include <hbmcoll/coll.h>

#define N 300000 /* 1.2 MB of float32: the rings carry it in chunks */

static int fail(const char *what, int rc, coll_comm_t *comm) {
  const char *text = NULL;
  coll_comm_error(comm, &text);
  fprintf(stderr, "%s: %s (%s)%s%s\n", what, coll_strerror(rc), coll_err_name(rc), text && text[0] ? ": " : "",
          text ? text : "");
  coll_comm_free(comm);
  return 1;
}

int main(void) {
  coll_comm_t *comm = NULL;
  int rc = coll_job_create(NULL, &comm); /* every default: HBMCOLL_TIMEOUT, stderr for warnings */
  if (rc != 0)
    return fail("coll_job_create", rc, comm);
  int rank = coll_comm_rank(comm), size = coll_comm_size(comm);

  /* allreduce: every element becomes 1 + 2 + ... + size */
  float *grad = malloc(N * sizeof *grad);
  for (int i = 0; i < N; i++)
    grad[i] = (float)(rank + 1);
  coll_args_t ar = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = N, .send = grad,
                    .recv = grad};
  if ((rc = coll_run(comm, &ar)) != 0)
    return fail("allreduce", rc, comm);

  /* bcast from the last rank (on the last node), started and waited for */
  int64_t step = rank == size - 1 ? 4242 : 0;
  coll_args_t bc = {.kind = COLL_BCAST, .dtype = COLL_INT64, .root = size - 1, .count = 1, .recv = &step};
  coll_req_t *req = NULL;
  if ((rc = coll_start(comm, &bc, &req)) != 0 || (rc = coll_req_wait(req, -1)) != 0)
    return coll_req_free(req), fail("bcast", rc, comm);
  coll_req_free(req);

  /* allgather: every rank learns every rank's number */
  int32_t mine = rank, all[256];
  coll_args_t ag = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 1, .send = &mine, .recv = all};
  if (size > 256 || (rc = coll_run(comm, &ag)) != 0)
    return fail("allgather", size > 256 ? COLL_EBADARG : rc, comm);

  /* allgatherv: rank r gives r + 1 copies of r; counts NULL: each rank's own, gathered with the call */
  static int32_t many[256], every[256 * 257 / 2];
  for (int i = 0; i <= rank; i++) many[i] = rank;
  coll_vargs_t agv = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .send = many, .send_count = (size_t)rank + 1,
                      .recv = every, .recv_count = (size_t)size * (size_t)(size + 1) / 2};
  if ((rc = coll_run_v(comm, &agv)) != 0) return fail("allgatherv", rc, comm);

  /* split: ranks of the same parity form a group across the nodes (as data-parallel groups are);
   * a group gets rings of its own, found over comm */
  coll_comm_t *group = NULL;
  int32_t one = 1, members = 0;
  coll_args_t count = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &one,
                       .recv = &members};
  if ((rc = coll_comm_split(comm, rank % 2, rank, &group)) != 0 || (rc = coll_run(group, &count)) != 0)
    return coll_comm_free(group), fail("split", rc, comm);

  /* send/recv around the ranks: 1 MB to the next rank, from the previous (a receive started first, so
   * every rank may send at once) */
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  float *from_prev = malloc(N * sizeof *from_prev);
  coll_req_t *recv_req = NULL;
  coll_status_t st = {0};
  if ((rc = coll_irecv(comm, from_prev, N * sizeof *from_prev, prev, 7, &recv_req)) != 0 ||
      (rc = coll_send(comm, grad, N * sizeof *grad, next, 7)) != 0 || (rc = coll_req_wait(recv_req, -1)) != 0 ||
      (rc = coll_req_status(recv_req, &st)) != 0)
    return coll_req_free(recv_req), fail("send/recv", rc, comm);
  coll_req_free(recv_req);

  int ok = grad[0] == (float)(size * (size + 1) / 2) && grad[N - 1] == grad[0] && step == 4242;
  ok &= st.source == prev && st.bytes == N * sizeof *grad && from_prev[N - 1] == grad[0];
  for (int r = 0; r < size; r++) {
    ok &= all[r] == r;
    for (int i = 0; i <= r; i++) ok &= every[r * (r + 1) / 2 + i] == r;
  }
  ok &= members == (size + 1 - rank % 2) / 2 && coll_comm_rank(group) == rank / 2;
  printf("rank %d of %d: allreduce %.0f, bcast %lld (%s), allgatherv, group of %d, recv from %d: %s\n", rank, size, grad[0],
         (long long)step, coll_comm_algorithm(comm), (int)members, st.source, ok ? "ok" : "WRONG");
  coll_comm_free(group); /* collective in the group, before its parent */
  free(grad), free(from_prev);
  coll_comm_free(comm); /* collective between the nodes: waits for their goodbye */
  return ok ? 0 : 1;
}
