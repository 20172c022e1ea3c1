/*
 * coll_topo_main.c - build/coll-topo: the same thing as `python -m hbmcoll.topo`.
 *
 *   coll-topo [--topology FILE|DIR] [--ranks N] [--memory P] [--bind B] [--json] [--tree]
 *
 * Plans only (applies nothing). --tree prints the tree the small collectives would run on
 * (which PU each rank waits on) instead of the placement. FILE is an hwloc XML file, DIR a directory
 * usable as HWLOC_FSROOT. Exit status: 0 ok, 1 error, 2 usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_numa.h"

static int usage(FILE *f) {
  fprintf(f, "usage: coll-topo [--topology FILE|DIR] [--ranks N] [--memory "
             "auto|hbm_bind|hbm_preferred|hbm_interleave|ddr] [--bind core|cluster|none] [--json] [--tree]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *topology = NULL, *memory = NULL, *bind = NULL;
  int nranks = 0, json = 0, tree = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--tree")) {
      tree = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      return usage(stdout) - 2;
    } else if (v != NULL && !strcmp(a, "--topology")) {
      topology = v;
      i++;
    } else if (v != NULL && !strcmp(a, "--memory")) {
      memory = v;
      i++;
    } else if (v != NULL && !strcmp(a, "--bind")) {
      bind = v;
      i++;
    } else if (v != NULL && !strcmp(a, "--ranks")) {
      char *end;
      long n = strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || n < 1 || n > COLL_NUMA_RANKS_MAX) {
        fprintf(stderr, "coll-topo: --ranks wants a number from 1 to %d, not '%s'\n", COLL_NUMA_RANKS_MAX, v);
        return 2;
      }
      nranks = (int)n;
      i++;
    } else {
      fprintf(stderr, "coll-topo: unknown or incomplete option '%s'\n", a);
      return usage(stderr);
    }
  }
  char *text = NULL;
  int rc = (tree ? coll_numa_tree_report : coll_numa_report)(topology, nranks, memory, bind, json, &text);
  if (rc != 0) {
    if (rc == -EINVAL && coll_numa_policy_parse(memory, bind, NULL, &(coll_numa_policy_t){0}) != 0)
      fprintf(stderr, "coll-topo: unknown memory or bind policy (memory '%s', bind '%s')\n",
              memory ? memory : "(HBMCOLL_MEMORY)", bind ? bind : "(HBMCOLL_BIND)");
    else if (rc == -EINVAL && (getenv("HBMCOLL_HBM_NODES") || getenv("MEMKIND_HBW_NODES")))
      fprintf(stderr, "coll-topo: %s: HBMCOLL_HBM_NODES/MEMKIND_HBW_NODES is not a node list or "
                      "names no NUMA node of this topology\n", topology ? topology : "this machine");
    else
      fprintf(stderr, "coll-topo: %s: %s\n", topology ? topology : "this machine", strerror(-rc));
    return 1;
  }
  fputs(text, stdout);
  free(text);
  return 0;
}
