/*
 * test_apply.c - where the apply path of numa/ puts a segment on this machine, with real
 * system calls: mbind of a memfd segment before first touch, pre-fault and a move_pages
 * check of where the pages landed; the EPERM fallback (a real seccomp filter makes mbind
 * fail as in Docker without CAP_SYS_NICE), at the first segment and from setup on; the
 * over-capacity fallback (MPOL_BIND of more than the node has free becomes
 * MPOL_PREFERRED; checked with get_mempolicy without touching the pages), the same for
 * several mappings that fit one by one but not together, no notice for a preferred
 * mapping larger than the node; and the pure choice of a segment's cluster and nodes.
 * Setup, cpubind, scratch buffers and argument errors are test_apply_setup.c's.
 *
 * Each test runs in its own forked process with a 60 s alarm (apply_check.h).
 * HBMCOLL_HBM_NODES=0 makes the one DDR node of the dev box stand in for HBM.
 * Prints one line per test and "N passed, N failed, N skipped" last; exit 0 iff none
 * failed.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <numaif.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "apply_check.h"
#include "coll_numa.h"
#include "numa_internal.h" /* plan and context internals: segment choice, bound bytes */

/* how many of the pages of [addr, addr+len) are on node `node` (move_pages query) */
static long pages_on(void *addr, size_t len, int node) {
  size_t n = len / (size_t)page_size();
  void **pages = calloc(n, sizeof(void *));
  int *status = calloc(n, sizeof(int));
  long on = -1;
  if (pages && status) {
    for (size_t i = 0; i < n; i++)
      pages[i] = (char *)addr + i * (size_t)page_size();
    if (syscall(SYS_move_pages, 0, n, pages, NULL, status, 0) == 0) {
      on = 0;
      for (size_t i = 0; i < n; i++)
        on += status[i] == node;
    }
  }
  free(pages);
  free(status);
  return on;
}

static uint64_t node0_free(void) {
  FILE *f = fopen("/sys/devices/system/node/node0/meminfo", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof(line), f))
    if (strstr(line, "MemFree:"))
      kb = strtoull(strstr(line, "MemFree:") + 8, NULL, 10);
  if (f)
    fclose(f);
  return kb * 1024;
}

static int install_mbind_eperm_filter(void) {
#if defined(__x86_64__)
  const unsigned arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  const unsigned arch = AUDIT_ARCH_AARCH64;
#else
  return -ENOTSUP;
#endif
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mbind, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_set_mempolicy, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
  };
  struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return -errno;
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
    return -errno;
  return 0;
}

/* ---- tests ---------------------------------------------------------------- */

static int segment_case(const char *memory, int want_mode) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  setenv("HBMCOLL_MEMORY", memory, 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 2, &ctx) == 0);
  fprintf(stderr, "    %s notice: %s\n", memory, coll_numa_notice(ctx));
  CHECK(strstr(coll_numa_notice(ctx), "HBM (node 0") != NULL);
  size_t len = 4u << 20;
  char *seg = new_segment(len, 0);
  CHECK(seg != NULL);
  char notice[256] = "x";
  int users[2] = {0, 1};
  CHECK(coll_numa_bind_segment(ctx, seg, len, users, 2, notice, sizeof(notice)) == 0);
  CHECK(notice[0] == '\0');
  unsigned long mask = 0;
  CHECK(policy_of(seg, &mask) == want_mode);
  CHECK(mask == 1UL);
  CHECK(pages_on(seg, len, 0) == (long)(len / (size_t)page_size())); /* all pre-faulted on node 0 */
  seg[12345] = 7;
  CHECK(seg[12345] == 7);
  munmap(seg, len);
  coll_numa_free(ctx);
  return 0;
}

static int test_segment_hbm_preferred(void) { return segment_case("auto", MPOL_PREFERRED); }
static int test_segment_hbm_bind(void) { return segment_case("hbm_bind", MPOL_BIND); }
static int test_segment_hbm_interleave(void) { return segment_case("hbm_interleave", MPOL_INTERLEAVE); }

static int test_segment_ddr_policy(void) {
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  size_t len = 1u << 20;
  char *seg = new_segment(len, 0);
  char notice[256];
  CHECK(coll_numa_bind_segment(ctx, seg, len, NULL, 0, notice, sizeof(notice)) == 0);
  CHECK(notice[0] == '\0');
  CHECK(policy_of(seg, NULL) == MPOL_PREFERRED);
  CHECK(pages_on(seg, len, 0) == (long)(len / (size_t)page_size()));
  munmap(seg, len);
  coll_numa_free(ctx);
  return 0;
}

/* mbind refused after setup (as when a container profile changes nothing at
 * start-up but the first real segment is refused): fallback, no crash */
static int test_eperm_at_segment(void) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  int rc = install_mbind_eperm_filter();
  if (rc == -ENOTSUP)
    return SKIP;
  CHECK(rc == 0);
  CHECK(syscall(SYS_mbind, NULL, 0UL, 0UL, NULL, 0UL, 0UL) == -1 && errno == EPERM);
  size_t len = 2u << 20;
  char *seg = new_segment(len, 0);
  char notice[512];
  CHECK(coll_numa_bind_segment(ctx, seg, len, NULL, 0, notice, sizeof(notice)) == 0);
  fprintf(stderr, "    notice: %s\n", notice);
  CHECK(strstr(notice, "mbind(MPOL_PREFERRED, node 0) failed: Operation not permitted") != NULL);
  CHECK(policy_of(seg, NULL) == MPOL_DEFAULT);
  CHECK(pages_on(seg, len, 0) == (long)(len / (size_t)page_size())); /* still pre-faulted */
  /* said once: the next segment is quiet */
  char *seg2 = new_segment(len, 0);
  CHECK(coll_numa_bind_segment(ctx, seg2, len, NULL, 0, notice, sizeof(notice)) == 0);
  CHECK(notice[0] == '\0');
  char *text;
  CHECK(coll_numa_ctx_report(ctx, 1, &text) == 0);
  CHECK(strstr(text, "Operation not permitted") != NULL);
  free(text);
  coll_numa_free(ctx);
  return 0;
}

/* mbind refused from the start: setup probes it and says so in its notice */
static int test_eperm_at_setup(void) {
  int rc = install_mbind_eperm_filter();
  if (rc == -ENOTSUP)
    return SKIP;
  CHECK(rc == 0);
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  fprintf(stderr, "    notice: %s\n", coll_numa_notice(ctx));
  CHECK(strstr(coll_numa_notice(ctx), "mbind is refused") != NULL);
  size_t len = 1u << 20;
  char *seg = new_segment(len, 0);
  char notice[256];
  CHECK(coll_numa_bind_segment(ctx, seg, len, NULL, 0, notice, sizeof(notice)) == 0);
  CHECK(notice[0] == '\0'); /* already told at setup */
  CHECK(policy_of(seg, NULL) == MPOL_DEFAULT);
  void *scratch;
  CHECK(coll_numa_scratch_alloc(ctx, 100000, &scratch) == 0);
  memset(scratch, 1, 100000);
  coll_numa_scratch_free(ctx, scratch, 100000);
  coll_numa_free(ctx);
  return 0;
}

/* MPOL_BIND of more than node 0 has free would be an OOM kill once touched:
 * it must become MPOL_PREFERRED with a notice. Pages are never touched. */
static int test_over_capacity(void) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  setenv("HBMCOLL_MEMORY", "hbm_bind", 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  uint64_t fr = node0_free();
  CHECK(fr > 0);
  size_t len = (size_t)(fr + (1ull << 30)) / (size_t)page_size() * (size_t)page_size();
  char *seg = new_segment(len, 1);
  CHECK(seg != NULL);
  char notice[512];
  int mode = -1;
  CHECK(coll_numa_place_segment(ctx, seg, len, NULL, 0, notice, sizeof(notice), &mode) == 0);
  fprintf(stderr, "    notice: %s\n", notice);
  CHECK(mode == MPOL_PREFERRED);
  CHECK(policy_of(seg, NULL) == MPOL_PREFERRED);
  CHECK(strstr(notice, "does not fit") != NULL && strstr(notice, "MPOL_PREFERRED") != NULL);
  munmap(seg, len);
  /* one that fits stays strict */
  seg = new_segment(1u << 20, 0);
  CHECK(coll_numa_place_segment(ctx, seg, 1u << 20, NULL, 0, notice, sizeof(notice), &mode) == 0);
  CHECK(mode == MPOL_BIND && notice[0] == '\0');
  munmap(seg, 1u << 20);
  coll_numa_free(ctx);
  return 0;
}

/* hbm_bind capacity is checked in total: libcoll places the control+staging
 * area, then each rank's arena part as a mapping of its own (users = that
 * rank). One at a time every part fits; together they must not be strictly
 * bound beyond the node's free memory. Here 4 parts of 0.3 x free: the first
 * three stay MPOL_BIND, the fourth falls back to MPOL_PREFERRED with one
 * notice, a later small one still binds, a later big one falls back quietly.
 * Sparse MAP_NORESERVE memfd mappings never touched: nothing is allocated. */
static int test_cumulative_bind(void) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  setenv("HBMCOLL_MEMORY", "hbm_bind", 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 4, &ctx) == 0);
  CHECK(ctx->topo->nnodes >= 1 && ctx->topo->nodes[0].os_index == 0);
  uint64_t fr = ctx->topo->nodes[0].free; /* seen at setup */
  CHECK(fr > (64u << 20));
  size_t pg = (size_t)page_size();
  size_t staging = 4u << 20, part = (size_t)(fr * 3 / 10) / pg * pg;
  char notice[512];
  int mode = -1;
  char *st = new_segment(staging, 1);
  CHECK(st != NULL);
  CHECK(coll_numa_place_segment(ctx, st, staging, NULL, 0, notice, sizeof(notice), &mode) == 0);
  CHECK(mode == MPOL_BIND && notice[0] == '\0');
  char *parts[4];
  int told = 0;
  for (int r = 0; r < 4; r++) {
    parts[r] = new_segment(part, 1);
    CHECK(parts[r] != NULL);
    CHECK(coll_numa_place_segment(ctx, parts[r], part, &r, 1, notice, sizeof(notice), &mode) == 0);
    fprintf(stderr, "    part %d of %.1f MiB: %s%s%s\n", r, (double)part / 1048576.0,
            mode == MPOL_BIND ? "MPOL_BIND" : mode == MPOL_PREFERRED ? "MPOL_PREFERRED" : "other",
            notice[0] ? ": " : "", notice);
    CHECK(policy_of(parts[r], NULL) == mode);
    if (r < 3) {
      CHECK(mode == MPOL_BIND && notice[0] == '\0');
    } else {
      CHECK(mode == MPOL_PREFERRED);
      CHECK(strstr(notice, "does not fit") && strstr(notice, "already") &&
            strstr(notice, "MPOL_PREFERRED instead of MPOL_BIND"));
      told++;
    }
  }
  CHECK(told == 1);
  CHECK(ctx->bound_bytes[0] == staging + 3 * (uint64_t)part);
  /* a small one still fits next to the three parts */
  char *small = new_segment(1u << 20, 1);
  CHECK(coll_numa_place_segment(ctx, small, 1u << 20, NULL, 0, notice, sizeof(notice), &mode) == 0);
  CHECK(mode == MPOL_BIND && notice[0] == '\0' && policy_of(small, NULL) == MPOL_BIND);
  /* a big one falls back again, without repeating the notice */
  char *big = new_segment(part, 1);
  CHECK(coll_numa_place_segment(ctx, big, part, NULL, 0, notice, sizeof(notice), &mode) == 0);
  CHECK(mode == MPOL_PREFERRED && notice[0] == '\0' && policy_of(big, NULL) == MPOL_PREFERRED);
  CHECK(ctx->bound_bytes[0] == staging + 3 * (uint64_t)part + (1u << 20));
  /* the context's notices have the one line */
  char *text;
  CHECK(coll_numa_ctx_report(ctx, 1, &text) == 0);
  const char *first = strstr(text, "does not fit");
  CHECK(first != NULL && strstr(first + 1, "does not fit") == NULL);
  free(text);
  munmap(big, part);
  munmap(small, 1u << 20);
  for (int r = 0; r < 4; r++)
    munmap(parts[r], part);
  munmap(st, staging);
  coll_numa_free(ctx);
  return 0;
}

/* hbm_preferred: a mapping larger than the HBM node's free memory is normal
 * (arena parts reserved, never all touched; the rest spills to DDR): no
 * notice, no note. */
static int test_preferred_no_spill_notice(void) {
  setenv("HBMCOLL_HBM_NODES", "0", 1);
  coll_numa_ctx_t *ctx;
  CHECK(coll_numa_setup(0, 1, &ctx) == 0);
  uint64_t fr = node0_free();
  CHECK(fr > 0);
  size_t len = (size_t)(fr + (1ull << 30)) / (size_t)page_size() * (size_t)page_size();
  for (int i = 0; i < 2; i++) {
    char *seg = new_segment(len, 1);
    CHECK(seg != NULL);
    char notice[512] = "x";
    int mode = -1;
    CHECK(coll_numa_place_segment(ctx, seg, len, NULL, 0, notice, sizeof(notice), &mode) == 0);
    CHECK(mode == MPOL_PREFERRED && notice[0] == '\0');
    CHECK(policy_of(seg, NULL) == MPOL_PREFERRED);
    munmap(seg, len);
  }
  char *text;
  CHECK(coll_numa_ctx_report(ctx, 1, &text) == 0);
  CHECK(strstr(text, "spill") == NULL && strstr(text, "larger than") == NULL &&
        strstr(text, "does not fit") == NULL);
  free(text);
  coll_numa_free(ctx);
  return 0;
}

/* Pure plan: a segment goes to the HBM node of the cluster most of its users
 * are in (ties: the lowest cluster); per policy bind/preferred/interleave. */
static int test_segment_cluster_choice(void) {
  const char *xml = "tests/numa/fixtures/knl-snc4-flat.xml";
  if (access(xml, R_OK) != 0)
    return SKIP;
  coll_numa_topo_t *topo;
  coll_numa_plan_t *plan;
  coll_numa_policy_t pol;
  coll_numa_place_t pl;
  CHECK(coll_numa_topo_load(xml, &topo) == 0);
  CHECK(coll_numa_policy_parse("hbm_bind", NULL, NULL, &pol) == 0);
  CHECK(coll_numa_plan_make(topo, 8, &pol, &plan) == 0); /* 2 ranks per cluster */
  int u1[] = {2, 3, 4}, u2[] = {1, 6}, u3[] = {7};
  CHECK(coll__numa_segment_cluster(plan, u1, 3) == 1);
  CHECK(coll__numa_segment_cluster(plan, u2, 2) == 0);
  CHECK(coll__numa_segment_cluster(plan, u3, 1) == 3);
  CHECK(coll__numa_segment_cluster(plan, NULL, 0) == 0);
  CHECK(coll__numa_place_for(topo, plan, 1, &pl) == 0);
  CHECK(pl.mode == MPOL_BIND && pl.nnodes == 1 && pl.nodes[0] == 3 && pl.is_hbm);
  coll_numa_plan_free(plan);
  CHECK(coll_numa_policy_parse("hbm_interleave", NULL, NULL, &pol) == 0);
  CHECK(coll_numa_plan_make(topo, 8, &pol, &plan) == 0);
  CHECK(coll__numa_place_for(topo, plan, 3, &pl) == 0);
  CHECK(pl.mode == MPOL_INTERLEAVE && pl.nnodes == 4 && pl.nodes[3] == 7);
  coll_numa_plan_free(plan);
  CHECK(coll_numa_policy_parse("ddr", NULL, NULL, &pol) == 0);
  CHECK(coll_numa_plan_make(topo, 8, &pol, &plan) == 0);
  CHECK(coll__numa_place_for(topo, plan, 2, &pl) == 0);
  CHECK(pl.mode == MPOL_PREFERRED && pl.nodes[0] == 4 && !pl.is_hbm);
  coll_numa_plan_free(plan);
  coll_numa_topo_free(topo);
  return 0;
}

int main(void) {
  const test_t tests[] = {
      {"segment_hbm_preferred", test_segment_hbm_preferred},
      {"segment_hbm_bind", test_segment_hbm_bind},
      {"segment_hbm_interleave", test_segment_hbm_interleave},
      {"segment_ddr_policy", test_segment_ddr_policy},
      {"eperm_at_segment", test_eperm_at_segment},
      {"eperm_at_setup", test_eperm_at_setup},
      {"over_capacity", test_over_capacity},
      {"cumulative_bind", test_cumulative_bind},
      {"preferred_no_spill_notice", test_preferred_no_spill_notice},
      {"segment_cluster_choice", test_segment_cluster_choice},
  };
  return run_tests(tests, sizeof(tests) / sizeof(tests[0]));
}
