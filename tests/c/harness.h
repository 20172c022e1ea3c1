/*
 * harness.h - the multi-process harness the C tests share (header-only).
 *
 * Forks `size` ranks with a job key of their own, runs a rank function in
 * each, waits with a timeout and kills stragglers; records one line per case
 * and counts passes and failures for the last line "N passed, N failed".
 * Everything here is static, so each test stays a single source file.
 *
 * Before including it, a test defines
 *   HARNESS_KEY_PREFIX  the job key prefix, e.g. "hbct" (keys are
 *                       "<prefix>.<pid>.<n>", one per spawn)
 * and may define
 *   MAX_RANKS           the most ranks one spawn forks (default 16)
 *   HARNESS_NAME_WIDTH  the width of the case name column record() prints
 *                       (default 48)
 */
#ifndef HBMCOLL_TESTS_C_HARNESS_H
#define HBMCOLL_TESTS_C_HARNESS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"

#ifndef HARNESS_KEY_PREFIX
#error "define HARNESS_KEY_PREFIX before including harness.h"
#endif
#ifndef MAX_RANKS
#define MAX_RANKS 16
#endif
#ifndef HARNESS_NAME_WIDTH
#define HARNESS_NAME_WIDTH 48
#endif

/* ---- harness: fork P ranks, wait with a timeout, kill stragglers ------------ */

typedef int (*rank_fn)(int rank, int size, const char *key, void *arg);

static unsigned long test_passed, test_failed;
static unsigned test_job;

/* The rest is `static inline` so that a test need not use all of it. */

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Counts a case and prints its line: "ok  " or "FAIL", name, P, seconds and,
 * if why is not NULL, ": why". */
static inline void record(int ok, const char *name, int size, double dt, const char *why) {
  if (ok) test_passed++;
  else test_failed++;
  printf("%s %-*s P=%d  %.1f s%s%s\n", ok ? "ok  " : "FAIL", HARNESS_NAME_WIDTH, name, size, dt,
         why ? ": " : "", why ? why : "");
  fflush(stdout);
}

/* Runs fn in `size` forked ranks with the "NAME=VALUE" strings of env set;
 * status[r] gets each wait status. Returns 1 if it had to kill stragglers. */
static inline int spawn_raw(int size, double timeout_s, const char *const *env, rank_fn fn, void *arg,
                            int *status) {
  pid_t pids[MAX_RANKS];
  int alive[MAX_RANKS];
  char key[96];
  snprintf(key, sizeof key, "%s.%d.%u", HARNESS_KEY_PREFIX, (int)getpid(), ++test_job);
  double t0 = now_s();
  fflush(NULL);
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      exit(2);
    }
    if (pids[r] == 0) {
      for (const char *const *e = env; e && *e; e++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", *e);
        char *eq = strchr(buf, '=');
        if (eq) *eq = '\0', setenv(buf, eq + 1, 1);
      }
      int rc = fn(r, size, key, arg);
      fflush(NULL);
      exit(rc ? 1 : 0); /* exit, not _exit: LeakSanitizer runs at exit */
    }
    alive[r] = 1;
    status[r] = 0;
  }
  int left = size, timed_out = 0;
  while (left > 0) {
    for (int r = 0; r < size; r++) {
      int st;
      if (alive[r] && waitpid(pids[r], &st, WNOHANG) == pids[r]) alive[r] = 0, status[r] = st, left--;
    }
    if (left == 0) break;
    if (now_s() - t0 > timeout_s) {
      timed_out = 1;
      for (int r = 0; r < size; r++)
        if (alive[r]) kill(pids[r], SIGKILL);
      for (int r = 0; r < size; r++)
        if (alive[r]) waitpid(pids[r], &status[r], 0), alive[r] = 0;
      break;
    }
    usleep(2000);
  }
  return timed_out;
}

/* Runs fn in `size` ranks (spawn_raw) and records the case: every rank must
 * exit 0, except `victim` (if >= 0), which must die of SIGKILL. Returns 0 if
 * the case passed. */
static inline int spawn_expect(const char *name, int size, double timeout_s, const char *const *env,
                               rank_fn fn, void *arg, int victim) {
  int status[MAX_RANKS];
  double t0 = now_s();
  int timed_out = spawn_raw(size, timeout_s, env, fn, arg, status);
  char why[256] = "";
  size_t used = 0;
  int ok = !timed_out;
  if (timed_out) used += (size_t)snprintf(why + used, sizeof why - used, "timed out, killed;");
  for (int r = 0; r < size && used < sizeof why - 32; r++) {
    int st = status[r];
    int good = r == victim ? WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL : WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (good) continue;
    ok = 0;
    if (WIFSIGNALED(st)) used += (size_t)snprintf(why + used, sizeof why - used, " r%d=sig%d", r, WTERMSIG(st));
    else used += (size_t)snprintf(why + used, sizeof why - used, " r%d=exit%d", r, WEXITSTATUS(st));
  }
  record(ok, name, size, now_s() - t0, ok ? NULL : why);
  return ok ? 0 : 1;
}

/* coll_comm_create for one rank; on failure says why on stderr and returns
 * the code. */
static inline int comm_open(int rank, int size, const char *key, double timeout_s, coll_comm_t **comm_p) {
  coll_comm_config_t cfg = {.rank = rank, .size = size, .job_key = key, .timeout_s = timeout_s};
  coll_comm_t *c = NULL;
  int rc = coll_comm_create(&cfg, &c);
  if (rc) {
    const char *text = "";
    if (c) coll_comm_error(c, &text);
    fprintf(stderr, "rank %d: coll_comm_create: %s: %s\n", rank, coll_err_name(rc), text);
    coll_comm_free(c);
    return rc;
  }
  *comm_p = c;
  return 0;
}

/* In a function with a local `int bad`: on !cond, says where and what on
 * stderr and sets bad = 1. */
#define EXPECT(cond, ...)                                                                   \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                       \
      fprintf(stderr, __VA_ARGS__);                                                         \
      fputc('\n', stderr);                                                                  \
      bad = 1;                                                                              \
    }                                                                                       \
  } while (0)

/* In main, with a local `const char *only` (argv[1] or NULL): whether to run
 * the case `label`. */
#define CASE(label) (only == NULL || strstr(label, only) != NULL)

/* The last line, "N passed, N failed"; returns main's exit status. */
static inline int harness_finish(void) {
  printf("%lu passed, %lu failed\n", test_passed, test_failed);
  return test_failed ? 1 : 0;
}

#endif
