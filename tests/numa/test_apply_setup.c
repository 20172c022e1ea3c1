/*
 * test_apply_setup.c - setting up the apply path of numa/ on this machine, with real
 * system calls: the notice and report without HBM, cpubind to one core and none, a
 * foreign topology that must never bind, scratch buffers (memkind's kinds and our
 * mmap + mbind path, a strictly bound one counted against the node until freed), the
 * report API, and argument errors. Where segments land is test_apply.c's.
 *
 * Each test runs in its own forked process with a 60 s alarm (apply_check.h).
 * HBMCOLL_HBM_NODES=0 makes the one DDR node of the dev box stand in for HBM.
 * Prints one line per test and "N passed, N failed, N skipped" last; exit 0 iff none
 * failed.
 */
#include <errno.h>
#include <numaif.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "apply_check.h"
#include "coll_numa.h"
#include "numa_internal.h" /* context internals: scratch way, bound bytes */

/* ---- tests ---------------------------------------------------------------- */

static int test_no_hbm_says_ddr(void) {
  coll_numa_ctx_t *ctx;
  char *text;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  const char *n = coll_numa_notice(ctx);
  fprintf(stderr, "    notice: %s\n", n);
  CHECK(strstr(n, "no HBM") != NULL && strstr(n, "DDR") != NULL);
  CHECK(coll_numa_ctx_report(ctx, 1, &text) == 0);
  CHECK(strstr(text, "\"memory_mode\": \"none\"") && strstr(text, "\"hbm_nodes\": []"));
  CHECK(strstr(text, "\"notices\": [\"no HBM on this machine"));
  free(text);
  CHECK(coll_numa_ctx_report(ctx, 0, &text) == 0);
  CHECK(strstr(text, "no high-bandwidth memory; buffers use DDR") != NULL);
  free(text);
  coll_numa_free(ctx);
  return 0;
}

static int test_cpubind_core(void) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  coll_numa_ctx_t *ctx;
  setenv("HBMCOLL_BIND", "core", 1);
  CHECK(coll_numa_setup(1, 2, &ctx) == 0);
  int pu = coll_numa_rank_pu(ctx, 1);
  CHECK(pu >= 0);
  CHECK(coll_numa_rank_pu(ctx, 2) == -EINVAL);
  CHECK(coll_numa_rank_pu(ctx, -1) == -EINVAL);
  cpu_set_t set;
  CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
  CHECK(CPU_ISSET(pu, &set));
  if (ncpu >= 2)
    CHECK(CPU_COUNT(&set) < ncpu); /* bound to one core, not the machine */
  coll_numa_free(ctx);
  return 0;
}

static int test_bind_none_has_no_pu(void) {
  coll_numa_ctx_t *ctx;
  setenv("HBMCOLL_BIND", "none", 1);
  CHECK(coll_numa_setup(0, 2, &ctx) == 0);
  CHECK(coll_numa_rank_pu(ctx, 0) == -ENOENT);
  coll_numa_free(ctx);
  return 0;
}

/* A strictly bound scratch buffer (mbind path: HBM named by HBMCOLL_HBM_NODES
 * only) counts in the node's total until it is freed. */
static int test_scratch_bind_counts(void) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  setenv("HBMCOLL_MEMORY", "hbm_bind", 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  size_t size = (8u << 20) + 100;
  size_t len = (size + (size_t)page_size() - 1) / (size_t)page_size() * (size_t)page_size();
  void *p;
  CHECK(coll_numa_scratch_alloc(ctx, size, &p) == 0);
  if (ctx->scratch_way_ == 1) { /* memkind sees HBW memory here: not the mbind path */
    coll_numa_scratch_free(ctx, p, size);
    coll_numa_free(ctx);
    return SKIP;
  }
  CHECK(policy_of(p, NULL) == MPOL_BIND);
  CHECK(ctx->bound_bytes[0] == len);
  memset(p, 1, size);
  coll_numa_scratch_free(ctx, p, size);
  CHECK(ctx->bound_bytes[0] == 0);
  coll_numa_free(ctx);
  return 0;
}

static int scratch_case(int want_mode) {
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  void *p = NULL;
  CHECK(coll_numa_scratch_alloc(ctx, 0, &p) == -EINVAL && p == NULL);
  for (size_t size = 1; size <= (8u << 20); size *= 8) {
    CHECK(coll_numa_scratch_alloc(ctx, size, &p) == 0);
    CHECK(((uintptr_t)p & 63) == 0);
    memset(p, 0xab, size);
    if (size >= (1u << 20))
      CHECK(policy_of(p, NULL) == want_mode);
    coll_numa_scratch_free(ctx, p, size);
  }
  coll_numa_free(ctx);
  return 0;
}

/* DDR: memkind's default kind, no policy */
static int test_scratch_ddr(void) { return scratch_case(MPOL_DEFAULT); }
static int test_scratch_memkind_hbw(void) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  setenv("MEMKIND_HBW_NODES", "0", 1);
  return scratch_case(MPOL_PREFERRED); /* memkind's HBW_PREFERRED kind */
}
static int test_scratch_mbind_path(void) { /* HBM per hbmcoll, not per memkind */
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  return scratch_case(MPOL_PREFERRED); /* our mmap + mbind */
}

static int test_bad_arguments(void) {
  coll_numa_ctx_t *ctx = (coll_numa_ctx_t *)0x1;
  CHECK(coll_numa_setup(2, 2, &ctx) == -EINVAL && ctx == (coll_numa_ctx_t *)0x1);
  CHECK(coll_numa_setup(-1, 2, &ctx) == -EINVAL);
  setenv("HBMCOLL_MEMORY", "fast", 1);
  CHECK(coll_numa_setup(0, 1, &ctx) == -EINVAL);
  unsetenv("HBMCOLL_MEMORY");
  setenv("HBMCOLL_HBM_NODES", "7", 1); /* no such node here */
  CHECK(coll_numa_setup(0, 1, &ctx) == -EINVAL);
  setenv("HBMCOLL_HBM_NODES", "0-", 1);
  CHECK(coll_numa_setup(0, 1, &ctx) == -EINVAL);
  unsetenv("HBMCOLL_HBM_NODES");
  CHECK(coll_numa_setup(0, 2, &ctx) == 0);
  char *seg = new_segment(1u << 20, 0);
  char notice[64];
  int bad_user = 2;
  CHECK(coll_numa_bind_segment(ctx, seg + 1, 4096, NULL, 0, notice, sizeof(notice)) == -EINVAL);
  CHECK(coll_numa_bind_segment(ctx, seg, 0, NULL, 0, notice, sizeof(notice)) == -EINVAL);
  CHECK(coll_numa_bind_segment(ctx, seg, 4096, &bad_user, 1, notice, sizeof(notice)) == -EINVAL);
  CHECK(coll_numa_prefault(seg + 1, 10) == -EINVAL);
  coll_numa_free(ctx);
  coll_numa_free(NULL);
  coll_numa_policy_t pol;
  CHECK(coll_numa_policy_parse("hbm_interleave", "cluster", "1-3,8", &pol) == 0);
  CHECK(pol.memory == COLL_NUMA_MEM_HBM_INTERLEAVE && pol.bind == COLL_NUMA_BIND_CLUSTER);
  CHECK(coll_numa_policy_parse("auto", "socket", NULL, &pol) == -EINVAL);
  CHECK(coll_numa_policy_parse("auto", "core", "a", &pol) == -EINVAL);
  coll_numa_topo_t *topo = (coll_numa_topo_t *)0x1;
  CHECK(coll_numa_topo_load("/nonexistent.xml", &topo) == -ENOENT && topo == (coll_numa_topo_t *)0x1);
  CHECK(coll_numa_topo_load("/etc/hostname", &topo) == -EINVAL);
  return 0;
}

/* A foreign topology (HWLOC_XMLFILE) must never bind this machine. The
 * process calls no memkind HBW function in that case. */
static int test_foreign_topology_never_binds(void) {
  const char *xml = getenv("NUMA_FIXTURE_XML");
  if (xml == NULL)
    xml = "tests/numa/fixtures/knl-snc4-flat.xml";
  if (access(xml, R_OK) != 0)
    return SKIP;
  cpu_set_t before, after;
  CHECK(sched_getaffinity(0, sizeof(before), &before) == 0);
  setenv("HWLOC_XMLFILE", xml, 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(5, 8, &ctx) == 0);
  CHECK(sched_getaffinity(0, sizeof(after), &after) == 0);
  CHECK(CPU_EQUAL(&before, &after));
  char *text;
  CHECK(coll_numa_ctx_report(ctx, 0, &text) == 0);
  CHECK(strstr(text, "not binding") != NULL);
  free(text);
  char *seg = new_segment(1u << 20, 0), notice[256];
  CHECK(coll_numa_bind_segment(ctx, seg, 1u << 20, NULL, 0, notice, sizeof(notice)) == 0);
  CHECK(policy_of(seg, NULL) == MPOL_DEFAULT);
  coll_numa_free(ctx);
  return 0;
}

static int test_report_api(void) {
  char *text = NULL;
  CHECK(coll_numa_report(NULL, 3, "ddr", "cluster", 1, &text) == 0);
  CHECK(strstr(text, "\"rank\": 2") != NULL);
  free(text);
  text = (char *)0x1;
  CHECK(coll_numa_report(NULL, 3, "bogus", NULL, 1, &text) == -EINVAL && text == (char *)0x1);
  return 0;
}

int main(void) {
  const test_t tests[] = {
      {"no_hbm_says_ddr", test_no_hbm_says_ddr},
      {"cpubind_core", test_cpubind_core},
      {"bind_none_has_no_pu", test_bind_none_has_no_pu},
      {"scratch_bind_counts", test_scratch_bind_counts},
      {"scratch_ddr", test_scratch_ddr},
      {"scratch_memkind_hbw", test_scratch_memkind_hbw},
      {"scratch_mbind_path", test_scratch_mbind_path},
      {"bad_arguments", test_bad_arguments},
      {"foreign_topology_never_binds", test_foreign_topology_never_binds},
      {"report_api", test_report_api},
  };
  return run_tests(tests, sizeof(tests) / sizeof(tests[0]));
}
