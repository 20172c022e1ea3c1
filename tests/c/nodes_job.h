/*
 * nodes_job.h - a job of NODES emulated nodes x PER ranks for the C tests (header-only): each node
 * is a process that enters its network namespace (netns.h) and forks its ranks; every rank joins
 * with coll_job_create from the variables hbmcoll-run would give it (HBMCOLL_RANK..., HBMCOLL_JOB_KEY,
 * HBMCOLL_MASTER, HBMCOLL_PORT, HBMCOLL_IFACE, HBMCOLL_NODE) and runs the scenario's function.
 *
 * Include after harness.h and netns.h, with NODES, PER and SIZE defined.
 */
#ifndef HBMCOLL_TESTS_C_NODES_JOB_H
#define HBMCOLL_TESTS_C_NODES_JOB_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"

typedef int (*job_fn)(coll_comm_t *comm, int rank);
static int test_pid; /* the job's secret is made of it: the same on both nodes */

typedef struct {
  const char *name;
  job_fn fn;
  int victim;        /* the rank that kills itself, -1 none */
  int only_node0;    /* node 1 never starts: the rendezvous fails */
  const char *timeout; /* HBMCOLL_TIMEOUT (NULL: 60 s, 12 with only_node0) */
} scenario_t;

/* A rank: the variables of hbmcoll-run, then coll_job_create and the scenario. */
static int run_rank(const scenario_t *s, int node, int local, int port, char *errbuf, size_t errlen) {
  char v[64];
  int rank = node * PER + local;
  snprintf(v, sizeof v, "%d", rank), setenv("HBMCOLL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", SIZE), setenv("HBMCOLL_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", local), setenv("HBMCOLL_LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", PER), setenv("HBMCOLL_LOCAL_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", port), setenv("HBMCOLL_PORT", v, 1);
  snprintf(v, sizeof v, "node%d", node), setenv("HBMCOLL_NODE", v, 1);
  snprintf(v, sizeof v, "hbnc-job-key.%d.%d", test_pid, port), setenv("HBMCOLL_JOB_KEY", v, 1);
  setenv("HBMCOLL_MASTER", "10.77.0.1", 1);
  setenv("HBMCOLL_IFACE", "hbnet0", 1);
  setenv("FI_PROVIDER", "tcp", 1);
  setenv("HBMCOLL_TIMEOUT", s->timeout ? s->timeout : s->only_node0 ? "12" : "60", 1);
  coll_comm_t *c = NULL;
  int rc = coll_job_create(NULL, &c);
  if (rc) {
    const char *text = "";
    coll_comm_error(c, &text);
    snprintf(errbuf, errlen, "%s", text);
    fprintf(stderr, "rank %d: coll_job_create: %s: %s\n", rank, coll_err_name(rc), text);
    coll_comm_free(c);
    return s->only_node0 ? 0 : 1;
  }
  rc = s->fn(c, rank);
  coll_comm_free(c);
  return rc;
}

/* A node: enter its network, fork its ranks, exit 0 when each did as the scenario says. */
static int run_node(const scenario_t *s, const netns_t *ns, int node, int port) {
  if (netns_enter(ns, node) != 0) return 10;
  int fds[PER][2];
  pid_t pids[PER];
  for (int l = 0; l < PER; l++) {
    if (pipe(fds[l]) != 0) return 11;
    if ((pids[l] = fork()) == 0) {
      char text[1024] = "";
      close(fds[l][0]);
      int rc = run_rank(s, node, l, port, text, sizeof text);
      (void)!write(fds[l][1], text, strlen(text));
      _exit(rc);
    }
    close(fds[l][1]);
  }
  int bad = 0;
  for (int l = 0; l < PER; l++) {
    char text[1024] = "";
    ssize_t got = read(fds[l][0], text, sizeof text - 1);
    text[got > 0 ? got : 0] = '\0';
    close(fds[l][0]);
    int st = 0;
    waitpid(pids[l], &st, 0);
    int rank = node * PER + l, killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    if (rank == s->victim ? !killed : !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) bad = 1;
    if (s->only_node0 && !(strstr(text, "10.77.0.1") && strstr(text, "missing: the nodes of ranks 2-3"))) {
      fprintf(stderr, "rank %d: the error does not name the rendezvous and the missing ranks: %s\n", rank, text);
      bad = 1;
    }
  }
  return bad;
}

static void scenario(const scenario_t *s, const netns_t *ns, int port, double timeout_s) {
  double t0 = now_s();
  pid_t pids[NODES];
  int nodes = s->only_node0 ? 1 : NODES;
  fflush(stdout);
  for (int i = 0; i < nodes; i++)
    if ((pids[i] = fork()) == 0) _exit(run_node(s, ns, i, port));
  int ok = 1;
  for (int i = 0; i < nodes; i++) {
    int st = 0;
    while (waitpid(pids[i], &st, WNOHANG) == 0) {
      if (now_s() - t0 > timeout_s) {
        for (int j = 0; j < nodes; j++) kill(pids[j], SIGKILL);
        fprintf(stderr, "%s: hung, killed\n", s->name);
      }
      usleep(20000);
    }
    ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  record(ok, s->name, SIZE, now_s() - t0, ok ? NULL : "see the ranks' lines above");
}

/* The test's main: each scenario on NODES fresh-started nodes (ports from port_base on), or one
 * skip line (`what`) where namespaces cannot be made. Returns the exit status. */
static int scenarios_run(const scenario_t *all, size_t n, const char *what, int port_base) {
  netns_t ns;
  test_pid = (int)getpid();
  if (netns_up(&ns, NODES) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, what, ns.why);
    printf("0 passed, 0 failed\n");
    return 0;
  }
  int port = port_base + (int)(getpid() % 2000) * 8;
  for (size_t i = 0; i < n; i++) scenario(&all[i], &ns, port + 4 * (int)i, 240);
  netns_down(&ns);
  printf("%lu passed, %lu failed\n", test_passed, test_failed);
  return test_failed != 0;
}

#endif /* HBMCOLL_TESTS_C_NODES_JOB_H */
