/*
 * nodes_job.c - coll_job_create: join the job a launcher started, on one node or across nodes,
 * from the variables the Python package reads (nodes_env.c). On one node it is coll_comm_create
 * with the launcher's rank and size; across nodes, the node's ranks make their communicator first,
 * then the nodes meet and the rings are built (nodes_join.c).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coll_internal.h"
#include "nodes.h"

#define JOB_RENDEZVOUS_S 900 /* the nodes' wait for each other without HBMCOLL_TIMEOUT (torchrun's) */

static _Atomic int job_generation; /* a second job of the same process meets under another name */

int coll_job_create(const coll_job_config_t *config, coll_comm_t **comm_p) {
  if (comm_p == NULL) return COLL_EBADARG;
  coll_job_config_t none = {0};
  const coll_job_config_t *cfg = config ? config : &none;
  char err[COLL__NODES_TEXT] = "";
  coll__job_env_t env;
  double env_timeout = 0;
  int rc = coll_env_check(&env_timeout, err, sizeof err);
  if (rc == 0) rc = coll__job_env(&env, err, sizeof err);
  if (rc) {
    *comm_p = coll__comm_failed(-1, -1, rc, err);
    return rc;
  }
  double timeout = cfg->timeout_s > 0 ? cfg->timeout_s : env_timeout;
  int across = env.size != env.local_size, gen = atomic_fetch_add(&job_generation, 1) + 1;
  char key[400];
  if (env.key[0])
    snprintf(key, sizeof key, "u%d.key.%s/c%s%d", (int)getuid(), env.key, across ? "node." : "", gen);
  else /* one process alone: nobody to meet */
    snprintf(key, sizeof key, "u%d.single.%d/c%d", (int)getuid(), (int)getpid(), gen);
  coll_comm_config_t cc = {.rank = across ? env.local_rank : env.rank, .size = across ? env.local_size : env.size,
                           .job_key = key, .timeout_s = timeout, .warn = cfg->warn, .warn_arg = cfg->warn_arg,
                           .place = cfg->place, .place_arg = cfg->place_arg, .interrupt = cfg->interrupt,
                           .interrupt_arg = cfg->interrupt_arg};
  coll_comm_t *node = NULL;
  rc = coll_comm_create(&cc, &node);
  if (rc || !across) {
    *comm_p = node;
    return rc;
  }
  coll__nodes_join_t join = {.rank = env.rank, .size = env.size, .name = env.name, .secret = env.key,
                             .addr = env.addr, .port = env.port, .iface = env.iface, .family = env.family,
                             .timeout_s = timeout > 0 ? timeout : JOB_RENDEZVOUS_S, .wait_s = timeout};
  coll_comm_t *job = NULL;
  rc = coll__nodes_join(node, &join, &job, err, sizeof err); /* takes node */
  *comm_p = rc ? coll__comm_failed(env.rank, env.size, rc, err) : job;
  return rc;
}
