/*
 * mpi_small.c - MPICH's side of bench/many_ranks.py: one small collective in the OSU loop.
 *
 *   mpiexec -n P build/mpi_small barrier|allreduce|bcast|gather|reduce ITERS
 *
 * 8 bytes (two float32, sum, root 0; barrier none), 10% warm-up, barrier, timed loop. Prints
 * the mean microseconds per call of the slowest rank, as coll_bench does.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void one(const char *coll, const float *in, float *out) {
  if (!strcmp(coll, "barrier")) MPI_Barrier(MPI_COMM_WORLD);
  else if (!strcmp(coll, "allreduce")) MPI_Allreduce(in, out, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(coll, "reduce")) MPI_Reduce(in, out, 2, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  else if (!strcmp(coll, "bcast")) MPI_Bcast(out, 2, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else MPI_Gather(in, 2, MPI_FLOAT, out, 2, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size, iters = argc > 2 ? atoi(argv[2]) : 100;
  const char *coll = argc > 1 ? argv[1] : "allreduce";
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  float in[2] = {1.0f, (float)rank}, *out = calloc((size_t)size * 2, sizeof *out);
  for (int i = 0; i < iters / 10 + 1; i++) one(coll, in, out);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) one(coll, in, out);
  double us = (MPI_Wtime() - t0) / iters * 1e6, worst;
  MPI_Reduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("%s 8 B x %d ranks: %.2f us\n", coll, size, worst);
  free(out);
  MPI_Finalize();
  return 0;
}
