/*
 * apply_check.h - what the tests of the numa/ apply path share (header-only): CHECK and
 * SKIP, a cleared environment, fresh memfd segments never touched, the memory policy of
 * an address, and run_tests(), which runs each test in its own forked process with a 60 s
 * alarm (environment changes and seccomp filters stay in that child) and prints one line
 * per test and "N passed, N failed, N skipped" last. Used by test_apply.c (segments) and
 * test_apply_setup.c (setup, cpubind, scratch, arguments).
 */
#ifndef HBMCOLL_TESTS_NUMA_APPLY_CHECK_H
#define HBMCOLL_TESTS_NUMA_APPLY_CHECK_H

#include <errno.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* In a test function (returns int): on !cond, says which check failed and returns 1. */
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "    %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);  \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

/* A test's exit status when the machine cannot run it. */
#define SKIP 77

/* every variable a test may set: each test starts without them */
static inline void clear_env(void) {
  unsetenv("HBMCOLL_HBM_NODES");
  unsetenv("MEMKIND_HBW_NODES");
  unsetenv("HBMCOLL_MEMORY");
  unsetenv("HBMCOLL_BIND");
  unsetenv("HWLOC_XMLFILE");
  unsetenv("HWLOC_FSROOT");
}

static inline long page_size(void) { return sysconf(_SC_PAGESIZE); }

/* a fresh shared mapping of a memfd, never touched */
static inline void *new_segment(size_t len, int noreserve) {
  int fd = (int)syscall(SYS_memfd_create, "test-numa", 0u);
  if (fd < 0 || ftruncate(fd, (off_t)len) != 0)
    return NULL;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | (noreserve ? MAP_NORESERVE : 0),
                 fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}

/* the policy mode of the page at addr (and its node mask's first word), or -errno */
static inline int policy_of(void *addr, unsigned long *mask) {
  int mode = -1;
  unsigned long m[16] = {0};
  if (syscall(SYS_get_mempolicy, &mode, m, 16 * 64UL, addr, (unsigned long)MPOL_F_ADDR) != 0)
    return -errno;
  if (mask)
    *mask = m[0];
  return mode;
}

/* one test: returns 0 (passed), SKIP or anything else (failed) */
typedef struct {
  const char *name;
  int (*fn)(void);
} test_t;

/* Runs each of the n tests in a forked child with a 60 s alarm and a cleared
 * environment; a test passes on exit 0 and is skipped on SKIP. Returns main's exit
 * status: 1 if any failed. */
static inline int run_tests(const test_t *tests, size_t n) {
  int passed = 0, failed = 0, skipped = 0;
  for (size_t i = 0; i < n; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(60);
      clear_env();
      _exit(tests[i].fn());
    }
    int st = 0;
    waitpid(pid, &st, 0);
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    int skip = WIFEXITED(st) && WEXITSTATUS(st) == SKIP;
    printf("%s %s", ok ? "ok  " : skip ? "skip" : "FAIL", tests[i].name);
    if (WIFSIGNALED(st))
      printf(" (killed by signal %d)", WTERMSIG(st));
    printf("\n");
    passed += ok;
    skipped += skip;
    failed += !ok && !skip;
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}

#endif
