/*
 * test_net.c - the bridge's endpoint (libcoll/src/net_ofi.c) between two real processes.
 *
 * Two forked ranks open endpoints on the provider under test, swap cards over a pipe (the
 * out-of-band exchange a job does through its rendezvous), and write into each other's
 * pools with notes:
 *  - writes of 1 B, 4 KiB and 1 MiB land byte for byte, each seen through its note;
 *  - 2,000 small notified writes in a row arrive, every note once, while the writer
 *    flushes (notes that come in during a flush are kept for the next poll);
 *  - a card that is not one is refused; a provider that does not exist is one sentence;
 *  - the pool's key is not the fixed 0xC011 of old; a note sent with coll__net_write_sourced
 *    arrives after its byte and names its sender (coll__net_poll_from), nothing dropped.
 * Providers: shm (virtual addresses and provider keys: the verbs-like path) and
 * tcp;ofi_rxm (offsets and keys we choose: the tcp path), on the loopback interface and
 * between two emulated nodes (network namespaces on a bridge, tests/c/netns.h), there
 * also with 1% of the frames dropped. A provider this machine lacks, or a machine where
 * namespaces cannot be made, is reported as a skip, never as a pass.
 *
 * Prints one line per case and a last line "N passed, N failed"; exits 1 on any failure.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "net.h"

#define HARNESS_KEY_PREFIX "hbnt"
#define MAX_RANKS 2
#define HARNESS_NAME_WIDTH 48
#include "harness.h"
#include "netns.h"

enum { SMALL_WRITES = 2000, BIG = 1 << 20, POOL = 4 << 20 };

typedef struct {
  const char *provider, *iface;
  int virtual_addresses; /* the path the provider must take: base in the card or 0 */
  int callers_pool;      /* the pool is the caller's (coll__net_open_on), shared memory */
} net_case_t;

/* The byte at offset i of a message from `rank`, so a byte in the wrong place shows. */
static uint8_t pattern(int rank, size_t i) { return (uint8_t)(i * 131 + (size_t)rank * 7 + (i >> 12)); }

static int poll_note(coll__net_t *n, uint32_t *note, char *err) {
  for (long spins = 0; spins < 2000000000L; spins++) {
    int r = coll__net_poll(n, note, err, 256);
    if (r) return r < 0 ? r : 0;
  }
  return -ETIMEDOUT;
}

static int fail(int rank, const char *what, int rc, const char *err) {
  fprintf(stderr, "rank %d: %s: %d (%s) %s\n", rank, what, rc, coll_strerror(rc), err);
  return 1;
}

/* Each rank: a pipe pair to the other (fd_out, fd_in), cards swapped over them. */
static int rank_main(int rank, int fd_out, int fd_in, const net_case_t *nc) {
  char err[256] = "";
  coll__net_t *n = NULL;
  setenv("FI_PROVIDER", nc->provider, 1);
  if (nc->iface) setenv("FI_TCP_IFACE", nc->iface, 1);
  uint8_t *mine_pool = NULL;
  if (nc->callers_pool &&
      (mine_pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
    return fail(rank, "mmap", -errno, "");
  int rc = coll__net_open_on(nc->iface, AF_UNSPEC, mine_pool, POOL, &n, err, sizeof err);
  if (rc) return fail(rank, "open", rc, err);
  if (mine_pool && coll__net_pool(n) != mine_pool) return fail(rank, "the pool is not the caller's", 0, "");
  uint8_t card[COLL_NET_CARD_MAX], theirs[COLL_NET_CARD_MAX];
  uint32_t len = (uint32_t)coll__net_card(n, card), tlen = 0;
  if (write(fd_out, &len, sizeof len) != sizeof len || write(fd_out, card, len) != (ssize_t)len ||
      read(fd_in, &tlen, sizeof tlen) != sizeof tlen || tlen > sizeof theirs ||
      read(fd_in, theirs, tlen) != (ssize_t)tlen)
    return fail(rank, "card exchange", -EIO, "");
  uint64_t base; /* the card's head: magic, address length, base, key */
  memcpy(&base, card + 8, sizeof base);
  if ((base != 0) != nc->virtual_addresses)
    return fail(rank, "the card's base says the other addressing path", (int)(base != 0), "");
  int peer = -1;
  uint8_t junk[32] = {0};
  if (coll__net_add_peer(n, junk, sizeof junk, &peer, err, sizeof err) != COLL_EBADARG)
    return fail(rank, "a malformed card was taken", 0, "");
  if ((rc = coll__net_add_peer(n, theirs, tlen, &peer, err, sizeof err)) != 0 || peer != 0)
    return fail(rank, "add_peer", rc, err);
  uint8_t *pool = coll__net_pool(n);
  static const size_t sizes[] = {1, 4096, BIG};
  /* rank 0 writes first, rank 1 answers with its own bytes: both directions, both roles */
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t sz = sizes[s], mine = 0, into = 2 * (size_t)BIG; /* send from [0, BIG), receive above */
    for (int turn = 0; turn < 2; turn++) {
      if (turn == rank) {
        for (size_t i = 0; i < sz; i++) pool[mine + i] = pattern(rank, i);
        if ((rc = coll__net_write(n, peer, mine, into, sz, (uint32_t)(0xA0000000u | s), NULL, err,
                                  sizeof err)) != 0 ||
            (rc = coll__net_flush(n, err, sizeof err)) != 0)
          return fail(rank, "write", rc, err);
      } else {
        uint32_t note = 0;
        if ((rc = poll_note(n, &note, err)) != 0) return fail(rank, "poll", rc, err);
        if (note != (0xA0000000u | s)) return fail(rank, "wrong note", (int)note, "");
        for (size_t i = 0; i < sz; i++)
          if (pool[into + i] != pattern(1 - rank, i)) return fail(rank, "bytes differ", (int)i, "");
      }
    }
  }
  /* many small writes each way at once: every note arrives once, in any order */
  static uint8_t seen[SMALL_WRITES];
  memset(seen, 0, sizeof seen);
  int got = 0;
  for (uint32_t k = 0; k < SMALL_WRITES; k++) {
    pool[k % 64] = (uint8_t)k;
    if ((rc = coll__net_write(n, peer, k % 64, 3 * (size_t)BIG + k, 1, k, NULL, err, sizeof err)) != 0)
      return fail(rank, "small write", rc, err);
    if (k % 64 == 63 && (rc = coll__net_flush(n, err, sizeof err)) != 0)
      return fail(rank, "flush", rc, err);
    uint32_t note;
    while ((rc = coll__net_poll(n, &note, err, sizeof err)) == 1) {
      if (note >= SMALL_WRITES || seen[note]++) return fail(rank, "note twice or unknown", (int)note, "");
      got++;
    }
    if (rc < 0) return fail(rank, "poll", rc, err);
  }
  if ((rc = coll__net_flush(n, err, sizeof err)) != 0) return fail(rank, "flush", rc, err);
  while (got < SMALL_WRITES) {
    uint32_t note;
    if ((rc = poll_note(n, &note, err)) != 0) return fail(rank, "poll", rc, err);
    if (note >= SMALL_WRITES || seen[note]++) return fail(rank, "note twice or unknown", (int)note, "");
    got++;
  }
  for (uint32_t k = 0; k < SMALL_WRITES; k++)
    if (pool[3 * (size_t)BIG + k] != (uint8_t)k) return fail(rank, "small write's byte", (int)k, "");
  /* both done before either closes: a close under a peer's writes is another test */
  /* the pool's key is drawn, not the fixed one every pool once had; a sourced note names its
   * sender (the note as a message behind the bytes: coll__net_poll_from) */
  uint64_t key;
  memcpy(&key, card + 16, sizeof key);
  if (key == 0xC011) return fail(rank, "the pool's key is the old fixed one", 0, "");
  for (int turn = 0; turn < 2; turn++) {
    size_t at = (size_t)POOL - 1;
    if (turn == rank) {
      pool[0] = (uint8_t)(0x5A + rank);
      if ((rc = coll__net_write_sourced(n, peer, 0, at, 1, 0xB0u + (uint32_t)rank, NULL, err, sizeof err)) != 0 ||
          (rc = coll__net_flush(n, err, sizeof err)) != 0)
        return fail(rank, "sourced write", rc, err);
    } else {
      uint32_t note = 0;
      int from = -2;
      for (long spins = 0; (rc = coll__net_poll_from(n, &note, &from, err, sizeof err)) == 0 && spins < 2000000000L;
           spins++) {
      }
      if (rc != 1) return fail(rank, "poll_from", rc, err);
      if (note != 0xB0u + (uint32_t)(1 - rank) || from != peer) return fail(rank, "sourced note or sender", from, "");
      if (pool[at] != (uint8_t)(0x5A + 1 - rank)) return fail(rank, "a sourced note came before its byte", 0, "");
      if (coll__net_dropped(n) != 0) return fail(rank, "a note of a peer was dropped", 0, "");
    }
  }
  char done = 'd';
  if (write(fd_out, &done, 1) != 1 || read(fd_in, &done, 1) != 1) return fail(rank, "last exchange", -EIO, "");
  coll__net_close(n);
  if (mine_pool) { /* still the caller's, still mapped */
    if (mine_pool[3 * (size_t)BIG + 5] != 5) return fail(rank, "the caller's pool after close", 0, "");
    munmap(mine_pool, POOL);
  }
  return 0;
}

/* 1 when the provider exists here, with the interface environment the case uses. */
static int provider_here(const net_case_t *nc) {
  pid_t pid = fork();
  if (pid == 0) {
    char err[256];
    coll__net_t *n = NULL;
    setenv("FI_PROVIDER", nc->provider, 1);
    if (nc->iface) setenv("FI_TCP_IFACE", nc->iface, 1);
    int rc = coll__net_open(nc->iface, 4096, &n, err, sizeof err);
    coll__net_close(n);
    _exit(rc == 0 ? 0 : rc == COLL_ENOTSUP ? 3 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The two ranks, in node 0 and node 1 of ns when it is given. */
static void run_pair(const char *name, const net_case_t *nc, const netns_t *ns) {
  if (!ns && !provider_here(nc)) {
    printf("skip %-*s (no %s provider here)\n", HARNESS_NAME_WIDTH, name, nc->provider);
    return;
  }
  int a[2], b[2];
  if (pipe(a) || pipe(b)) {
    record(0, name, 2, 0, "pipe");
    return;
  }
  double t0 = now_s();
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(60);
      if (ns && netns_enter(ns, r) != 0) _exit(fail(r, "setns", -errno, ns->node[r]));
      _exit(r == 0 ? rank_main(0, a[1], b[0], nc) : rank_main(1, b[1], a[0], nc));
    }
  }
  close(a[0]), close(a[1]), close(b[0]), close(b[1]);
  int ok = 1;
  for (int r = 0; r < 2; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  record(ok, name, 2, now_s() - t0, ok ? NULL : "a rank failed (its line is above)");
}

/* Asked for a provider this machine lacks, or an interface it does not have (libfabric's
 * tcp provider would answer with its other interfaces): COLL_ENOTSUP and one sentence. */
static void check_missing(const char *name, const char *provider, const char *iface, const char *says) {
  pid_t pid = fork();
  if (pid == 0) {
    char err[256] = "";
    coll__net_t *n = NULL;
    if (provider) setenv("FI_PROVIDER", provider, 1);
    int rc = coll__net_open(iface, 4096, &n, err, sizeof err);
    _exit(rc == COLL_ENOTSUP && n == NULL && strstr(err, says) ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  record(ok, name, 1, 0, ok ? NULL : "wrong code or text");
}

static void run_nodes(const char *name, int loss_pct) {
  static const net_case_t tcp = {"tcp", "hbnet0", 0, 0};
  netns_t ns;
  if (netns_up(&ns, 2) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, name, ns.why);
    return;
  }
  if (loss_pct && netns_loss(&ns, loss_pct) != 0) {
    record(0, name, 2, 0, "nft could not add the loss rule");
  } else {
    run_pair(name, &tcp, &ns);
    long seen = 0, dropped = 0;
    if (loss_pct) { /* the case means something only if frames were lost */
      int ok = netns_counts(&ns, &seen, &dropped) == 0 && dropped > 0;
      char why[96];
      snprintf(why, sizeof why, "the bridge dropped %ld of %ld frames", dropped, seen);
      record(ok, "net: ... and the bridge did drop frames", 2, 0, ok ? NULL : why);
      if (getenv("HBMCOLL_TEST_VERBOSE")) printf("     %s\n", why);
    }
  }
  netns_down(&ns);
}

/* Opening an endpoint leaves the process's signal handlers as it found them (libfabric's
 * providers would put their own on SIGINT, SIGTERM, SIGSEGV ...). */
static int kept_seen;
static void kept_handler(int sig) { kept_seen = sig; }

static void check_signals_kept(void) {
  pid_t pid = fork();
  if (pid == 0) {
    char err[256] = "";
    coll__net_t *n = NULL;
    setenv("FI_PROVIDER", "tcp", 1);
    signal(SIGINT, kept_handler);
    signal(SIGTERM, SIG_DFL);
    if (coll__net_open(NULL, 65536, &n, err, sizeof err) != 0) _exit(2);
    struct sigaction a, b;
    sigaction(SIGINT, NULL, &a);
    sigaction(SIGTERM, NULL, &b);
    coll__net_close(n);
    _exit(a.sa_handler == kept_handler && b.sa_handler == SIG_DFL ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  record(ok, "net: opening keeps the signal handlers", 1, 0,
         ok ? NULL : WIFEXITED(st) && WEXITSTATUS(st) == 2 ? "open failed" : "a handler was replaced");
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  static const net_case_t shm = {"shm", NULL, 1, 0}, tcp = {"tcp", "lo", 0, 0}, tcp_pool = {"tcp", "lo", 0, 1};
  if (CASE("net: shm")) run_pair("net: shm, virtual addresses and provider keys", &shm, NULL);
  if (CASE("net: tcp")) run_pair("net: tcp;ofi_rxm on lo, offsets and our keys", &tcp, NULL);
  if (CASE("net: the caller's pool")) run_pair("net: the caller's pool (shared memory)", &tcp_pool, NULL);
  if (CASE("net: two nodes")) run_nodes("net: two nodes (namespaces), tcp;ofi_rxm", 0);
  if (CASE("net: two nodes, 1% loss")) run_nodes("net: two nodes, 1% of frames dropped", 1);
  if (CASE("net: opening keeps")) check_signals_kept();
  if (CASE("net: a missing provider"))
    check_missing("net: a missing provider is one sentence", "nosuchprovider", NULL, "FI_PROVIDER=nosuchprovider");
  if (CASE("net: a missing interface"))
    check_missing("net: a missing interface is one sentence", "tcp", "nosuch0", "on interface nosuch0");
  return harness_finish();
}
