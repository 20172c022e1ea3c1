/*
 * bootstrap.c - ranks of one node meet, share the segment's fd and pidfds.
 *
 * The key holds a secret of the job (from the launcher, its store, or for a
 * split the random secret in the parent's segment), so the socket's name
 * cannot be guessed from outside the job and squatted.
 *
 * Rank 0 listens on a Unix socket named from the uid and a hash of the key:
 * abstract ("\0hbmcoll.<uid>.<hash>": no file, but it lives in the network
 * namespace), or, with HBMCOLL_RENDEZVOUS_DIR, a file in that directory, so
 * containers that share only a volume can meet; rank 0 unlinks it whatever
 * happens (a stale one from a killed job is replaced). The others connect,
 * retrying until the deadline because rank 0 may not be listening yet. Each
 * side checks the other's uid with SO_PEERCRED; the hello carries the full
 * key, the size and the rank so two jobs, or ranks that disagree, never mix.
 *
 * Peers are watched for death with pidfds: a pid means nothing in another PID
 * namespace, a pidfd passed over the socket does. Each member attaches a
 * pidfd of itself to its hello; when all size-1 have come, rank 0 sends each
 * the segment fd, then every other rank's pidfd, and waits for its ack
 * before the next one (fds in flight count against RLIMIT_NOFILE). Where
 * pidfd_open is missing the entry is -1 and sync.c falls back to kill(pid, 0)
 * within one PID namespace.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "coll_internal.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define BOOT_MAGIC 0x68626f6f74303032ull /* "boot002": hello with a pidfd, pidfd tables */
#define BOOT_KEY_MAX 200
#define BOOT_FDS_MAX 128 /* fds per message (the kernel takes at most 253) */

typedef struct {
  uint64_t magic;
  int32_t size, rank;
  char key[BOOT_KEY_MAX];
} boot_hello_t; /* + the member's pidfd, if it has one */

typedef struct {
  int32_t status; /* 0, or a negative code; text explains */
  char text[COLL_TEXT_MAX];
} boot_reply_t; /* + the segment fd on success */

typedef struct {
  int32_t first, n;          /* pidfds of ranks first .. first+n-1 */
  uint8_t has[BOOT_FDS_MAX]; /* 1: attached, in rank order */
} boot_pids_t;

typedef struct {
  double deadline; /* INFINITY without HBMCOLL_TIMEOUT */
  double start, next_warn;
  coll_comm_t *c;  /* rank, size, interrupt check, warn callback */
  const char *dir; /* HBMCOLL_RENDEZVOUS_DIR, or NULL: abstract socket */
} boot_t;

#define BOOT_SLICE_MS 50
#define BOOT_HELLO_S 10 /* seconds a connection to rank 0 has to say its hello */

static double boot_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 0 when the path does not fit in sun_path */
static socklen_t boot_address(const char *key, const boot_t *b, struct sockaddr_un *addr) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a: keys may be longer than sun_path */
  for (const char *p = key; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  size_t room = sizeof addr->sun_path - 1;
  int n = b->dir ? snprintf(addr->sun_path, room, "%s/hbmcoll.%u.%016llx", b->dir,
                            (unsigned)getuid(), (unsigned long long)h)
                 : snprintf(addr->sun_path + 1, room, "hbmcoll.%u.%016llx", (unsigned)getuid(),
                            (unsigned long long)h);
  if (n < 0 || (size_t)n >= room) return 0;
  /* abstract: the leading NUL and the name; a file: the path and its NUL */
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* The key as errors show it: a key from HBMCOLL_JOB_KEY holds the secret that joins nodes
 * ("u<uid>.key.<secret>/..."), which must not reach logs: its characters are counted, not shown. */
static const char *boot_key_shown(const char *key, char *out, size_t len) {
  const char *at = strstr(key, ".key.");
  if (at == NULL) return key;
  const char *secret = at + 5, *end = strrchr(secret, '/'); /* the suffixes have no '/'; a secret may */
  size_t n = end ? (size_t)(end - secret) : strlen(secret);
  snprintf(out, len, "%.*s<HBMCOLL_JOB_KEY, %zu characters>%s", (int)(secret - key), key, n, end ? end : "");
  return out;
}

static int boot_same_user(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
  return cred.uid == getuid() ? 0 : -EACCES;
}

/* 0, COLL_EINTERRUPTED (Ctrl-C), or the failure of the communicator being
 * split (a rank of it gave up on this split, or died): no reason to wait on. */
static int boot_interrupted(const boot_t *b) {
  if (b->c->interrupt_fn && b->c->interrupt_fn(b->c->interrupt_arg)) return COLL_EINTERRUPTED;
  return b->c->parent ? coll__aborted(b->c->parent) : 0;
}

/* Past HBMCOLL_STALL_WARN (then at doubling intervals): one line saying who
 * waits for whom. A job whose ranks start slowly (imports) is not an error. */
static void boot_maybe_warn(boot_t *b, const char *waiting_for) {
  double now = boot_now();
  if (now < b->next_warn) return;
  coll__warn(b->c, "rank %d has waited %.0f s for %s to start the communicator (%d ranks)%s",
             b->c->rank, now - b->start, waiting_for, b->c->size,
             b->c->params.timeout_s > 0 ? "" : "; HBMCOLL_TIMEOUT=S makes this an error");
  b->next_warn = b->start + 2 * (now - b->start);
}

/* Wait for `events` on fd in short slices: >0 ready, -ETIMEDOUT at the
 * deadline, COLL_EINTERRUPTED when the interrupt check says so. */
static int boot_poll(int fd, short events, const boot_t *b) {
  for (;;) {
    double left_ms = (b->deadline - boot_now()) * 1000;
    if (left_ms <= 0) return -ETIMEDOUT;
    struct pollfd pfd = {fd, events, 0};
    int rc = poll(&pfd, 1, left_ms < BOOT_SLICE_MS ? (int)left_ms : BOOT_SLICE_MS);
    if (rc > 0) return rc;
    if (rc < 0 && errno != EINTR) return -errno;
    int why = boot_interrupted(b);
    if (why) return why;
    if (rc == 0) return 0; /* a slice passed: the caller may warn, then poll again */
  }
}

/* Read or write exactly n bytes before the deadline. */
static int boot_io(int fd, void *buf, size_t n, int writing, const boot_t *b) {
  size_t done = 0;
  while (done < n) {
    int rc = boot_poll(fd, writing ? POLLOUT : POLLIN, b);
    if (rc < 0) return rc;
    if (rc == 0) continue;
    ssize_t k = writing ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return -errno;
    if (k == 0) return -ECONNRESET;
    done += (size_t)k;
  }
  return 0;
}

typedef union {
  char buf[CMSG_SPACE(sizeof(int) * BOOT_FDS_MAX)];
  struct cmsghdr align;
} boot_cbuf_t;

/* One message of len bytes with nfds (<= BOOT_FDS_MAX) fds attached. */
static int boot_sendmsg(int sock, const void *buf, size_t len, const int *fds, int nfds) {
  boot_cbuf_t cbuf;
  memset(&cbuf, 0, sizeof cbuf);
  struct iovec iov = {(void *)buf, len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    msg.msg_control = cbuf.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t k = sendmsg(sock, &msg, MSG_NOSIGNAL);
  return k == (ssize_t)len ? 0 : k < 0 ? -errno : -EIO;
}

/* One message of exactly len bytes; the fds that came with it go to fds[]
 * (*nfds_p of them; extra ones are closed). */
static int boot_recvmsg(int sock, void *buf, size_t len, int *fds, int maxfds, int *nfds_p,
                        const boot_t *b) {
  int rc;
  while ((rc = boot_poll(sock, POLLIN, b)) == 0) {}
  if (rc < 0) return rc;
  boot_cbuf_t cbuf;
  struct iovec iov = {buf, len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                       .msg_controllen = sizeof cbuf};
  ssize_t k = recvmsg(sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  rc = k < 0 ? -errno : k != (ssize_t)len ? -ECONNRESET : 0;
  int n = 0;
  for (struct cmsghdr *cm = k < 0 ? NULL : CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t cnt = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < cnt; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      if (rc == 0 && n < maxfds) fds[n++] = fd;
      else close(fd);
    }
  }
  if (rc != 0)
    while (n > 0) close(fds[--n]);
  *nfds_p = n;
  return rc;
}

/* Rank 0 to member `to`: the segment fd, then the pidfds of all other ranks
 * (table pids[], -1 where unknown), then wait for its ack. */
static int boot_hand_over(int sock, int to, int size, int seg_fd, const int *pids, const boot_t *b) {
  boot_reply_t reply = {0, ""};
  int rc = boot_sendmsg(sock, &reply, sizeof reply, &seg_fd, 1);
  for (int first = 0; rc == 0 && first < size; first += BOOT_FDS_MAX) {
    boot_pids_t t;
    int fds[BOOT_FDS_MAX], nfds = 0;
    memset(&t, 0, sizeof t);
    t.first = first;
    t.n = size - first < BOOT_FDS_MAX ? size - first : BOOT_FDS_MAX;
    for (int i = 0; i < t.n; i++)
      if (first + i != to && pids[first + i] >= 0) {
        t.has[i] = 1;
        fds[nfds++] = pids[first + i];
      }
    rc = boot_sendmsg(sock, &t, sizeof t, fds, nfds);
  }
  int32_t ack = -1;
  if (rc == 0) rc = boot_io(sock, &ack, sizeof ack, 0, b);
  return rc == 0 && ack != 0 ? -EPROTO : rc;
}

/* The member's side of boot_hand_over, after the reply: fill pids[]. */
static int boot_take_pids(int sock, int size, int *pids, const boot_t *b) {
  for (int first = 0; first < size;) {
    boot_pids_t t;
    int fds[BOOT_FDS_MAX], nfds = 0, want = 0;
    int rc = boot_recvmsg(sock, &t, sizeof t, fds, BOOT_FDS_MAX, &nfds, b);
    if (rc != 0) return rc;
    if (t.first != first || t.n <= 0 || t.n > BOOT_FDS_MAX || first + t.n > size) rc = -EPROTO;
    for (int i = 0; rc == 0 && i < t.n; i++) want += t.has[i] != 0;
    if (rc == 0 && want != nfds) rc = -EPROTO;
    if (rc != 0) {
      while (nfds > 0) close(fds[--nfds]);
      return rc;
    }
    for (int i = 0, k = 0; i < t.n; i++)
      if (t.has[i]) pids[first + i] = fds[k++];
    first += t.n;
  }
  int32_t ack = 0;
  return boot_io(sock, &ack, sizeof ack, 1, b);
}

/* Listen; a socket file left by a killed job (nobody accepts on it) is replaced. */
static int boot_listen(int lsock, const struct sockaddr_un *addr, socklen_t alen, int size,
                       const boot_t *b) {
  if (bind(lsock, (const struct sockaddr *)addr, alen) != 0) {
    int e = errno;
    if (e != EADDRINUSE || b->dir == NULL) return -e;
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return -errno;
    int live = connect(probe, (const struct sockaddr *)addr, alen) == 0 || errno != ECONNREFUSED;
    close(probe);
    if (live || unlink(addr->sun_path) != 0 ||
        bind(lsock, (const struct sockaddr *)addr, alen) != 0)
      return -EADDRINUSE;
  }
  if (listen(lsock, size) != 0) {
    int e = errno;
    if (b->dir) unlink(addr->sun_path);
    return -e;
  }
  return 0;
}

/* " 1, 3" style list of the ranks that have not connected yet. */
static void boot_missing(const int *conns, int size, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int r = 1; r < size && used + 12 < len; r++)
    if (conns[r] < 0)
      used += (size_t)snprintf(out + used, len - used, "%s%d", used ? ", " : "", r);
}

static int boot_leader(const char *key, int size, boot_t *b, int fd, int *pids_out,
                       char *err, size_t errlen) {
  struct sockaddr_un addr;
  socklen_t alen = boot_address(key, b, &addr);
  int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lsock < 0) return -errno;
  int rc = 0, *conns = NULL, *pids = NULL, nconn = 0, listening = 0;
  if ((rc = boot_listen(lsock, &addr, alen, size, b)) != 0) {
    char shown[160];
    snprintf(err, errlen, "rank 0 could not listen for job key '%s'%s%s: %s%s", boot_key_shown(key, shown, sizeof shown),
             b->dir ? " in " : "", b->dir ? b->dir : "", strerror(-rc),
             rc == -EADDRINUSE ? " (another job with the same key is starting)" : "");
    goto out_close_listener;
  }
  listening = b->dir != NULL;
  conns = calloc((size_t)size, sizeof(int));
  pids = calloc((size_t)size, sizeof(int));
  if (conns == NULL || pids == NULL) {
    rc = -ENOMEM;
    goto out_close_conns;
  }
  for (int i = 0; i < size; i++) conns[i] = pids[i] = -1;
  pids[0] = (int)syscall(SYS_pidfd_open, getpid(), 0);
  while (nconn < size - 1) {
    int prc = boot_poll(lsock, POLLIN, b);
    if (prc == 0) {
      char missing[96] = "rank(s) ";
      boot_missing(conns, size, missing + 8, sizeof missing - 8);
      boot_maybe_warn(b, missing);
      continue;
    }
    if (prc == COLL_EINTERRUPTED) {
      snprintf(err, errlen, "rank 0 was interrupted while waiting for the other ranks");
      rc = prc;
      goto out_close_conns;
    }
    if (prc < 0) {
      char missing[96] = "";
      boot_missing(conns, size, missing, sizeof missing);
      snprintf(err, errlen, "rank 0 waited for the other ranks; %d of %d came (missing: %s)%s%s",
               nconn + 1, size, missing, prc == -ETIMEDOUT ? "" : ": ",
               prc == -ETIMEDOUT ? "" : b->c->parent && coll__aborted(b->c->parent)
                                            ? b->c->parent->error_text : coll_strerror(prc));
      rc = prc == -ETIMEDOUT ? -ETIMEDOUT : COLL_EBOOTSTRAP;
      goto out_close_conns;
    }
    int s = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) {
      int e = errno;
      if (e == EINTR || e == EAGAIN || e == ECONNABORTED || e == EPROTO) continue;
      /* out of fds or memory: waiting on would spin on the same error */
      snprintf(err, errlen, "rank 0 could not accept the other ranks' connections: accept: %s%s",
               strerror(e), (e == EMFILE || e == ENFILE) ? " (raise `ulimit -n`)" : "");
      rc = COLL_EBOOTSTRAP;
      goto out_close_conns;
    }
    /* a connection that stays silent, or sends part of a hello, holds the others this long at
     * most (members send the hello as soon as they connect) */
    boot_t hb = *b;
    if (hb.deadline > boot_now() + BOOT_HELLO_S) hb.deadline = boot_now() + BOOT_HELLO_S;
    struct timeval tv = {BOOT_HELLO_S, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); /* MSG_WAITALL after a first byte */
    boot_hello_t hello;
    int pidfd = -1, npid = 0;
    if (boot_same_user(s) != 0 || boot_recvmsg(s, &hello, sizeof hello, &pidfd, 1, &npid, &hb) != 0 ||
        hello.magic != BOOT_MAGIC || strncmp(hello.key, key, BOOT_KEY_MAX) != 0) {
      if (npid > 0) close(pidfd);
      close(s); /* a stranger or a half-open connection: not one of ours */
      continue;
    }
    if (hello.size != size || hello.rank <= 0 || hello.rank >= size || conns[hello.rank] >= 0) {
      boot_reply_t reply = {COLL_EBOOTSTRAP, ""};
      snprintf(reply.text, sizeof reply.text,
               "ranks disagree: rank 0 has size %d, a peer says rank %d of size %d%s", size,
               hello.rank, hello.size,
               (hello.rank > 0 && hello.rank < size && conns[hello.rank] >= 0) ? " (twice)" : "");
      snprintf(err, errlen, "%s", reply.text);
      boot_io(s, &reply, sizeof reply, 1, b);
      if (npid > 0) close(pidfd);
      close(s);
      rc = COLL_EBOOTSTRAP;
      goto out_close_conns;
    }
    tv.tv_sec = 0;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); /* one of ours: the job's deadline */
    conns[hello.rank] = s;
    pids[hello.rank] = npid > 0 ? pidfd : -1;
    nconn++;
  }
  if (listening) unlink(addr.sun_path); /* all came: nothing more to find there */
  listening = 0;
  for (int r = 1; r < size && rc == 0; r++) {
    rc = boot_hand_over(conns[r], r, size, fd, pids, b);
    if (rc != 0)
      snprintf(err, errlen, "rank 0 could not hand the segment to rank %d: %s", r,
               coll_strerror(rc));
  }
out_close_conns:
  for (int r = 1; conns && r < size; r++) {
    if (conns[r] < 0) continue;
    if (rc != 0) { /* tell the ones that came why the job cannot start */
      boot_reply_t reply = {rc, ""};
      snprintf(reply.text, sizeof reply.text, "%s", err);
      boot_sendmsg(conns[r], &reply, sizeof reply, NULL, 0);
    }
    close(conns[r]);
  }
  for (int r = 0; pids && r < size; r++) {
    if (pids[r] < 0) continue;
    if (rc == 0 && r > 0) pids_out[r] = pids[r];
    else close(pids[r]);
  }
  free(conns);
  free(pids);
out_close_listener:
  if (listening) unlink(addr.sun_path);
  close(lsock);
  return rc;
}

static int boot_member(const char *key, int rank, int size, boot_t *b, int *fd_p,
                       int *pids_out, char *err, size_t errlen) {
  struct sockaddr_un addr;
  socklen_t alen = boot_address(key, b, &addr);
  int s = -1, rc = 0;
  useconds_t nap = 1000;
  for (;;) { /* rank 0 may not be listening yet */
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
      rc = -errno;
      snprintf(err, errlen, "rank %d could not open a socket to reach rank 0: %s", rank,
               strerror(-rc));
      return COLL_EBOOTSTRAP;
    }
    if (connect(s, (struct sockaddr *)&addr, alen) == 0) break;
    rc = -errno;
    close(s);
    if (rc != -ECONNREFUSED && rc != -ENOENT && rc != -EAGAIN) {
      snprintf(err, errlen, "rank %d could not connect to rank 0: %s", rank, strerror(-rc));
      return rc;
    }
    if (boot_now() >= b->deadline) {
      char shown[160];
      snprintf(err, errlen, "rank %d found no rank 0 listening for job key '%s'%s%s in time", rank,
               boot_key_shown(key, shown, sizeof shown), b->dir ? " in " : "", b->dir ? b->dir : "");
      return -ETIMEDOUT;
    }
    int why = boot_interrupted(b);
    if (why == COLL_EINTERRUPTED) {
      snprintf(err, errlen, "rank %d was interrupted while looking for rank 0", rank);
      return why;
    }
    if (why) {
      snprintf(err, errlen, "rank %d stopped looking for rank 0: %s", rank,
               b->c->parent->error_text);
      return COLL_EBOOTSTRAP;
    }
    boot_maybe_warn(b, "rank 0");
    usleep(nap);
    if (nap < 50000) nap *= 2;
  }
  rc = boot_same_user(s);
  if (rc != 0) {
    snprintf(err, errlen, "rank %d: the process listening as rank 0 is another user", rank);
    goto out;
  }
  boot_hello_t hello;
  memset(&hello, 0, sizeof hello);
  hello.magic = BOOT_MAGIC;
  hello.size = size;
  hello.rank = rank;
  snprintf(hello.key, sizeof hello.key, "%s", key);
  int me = (int)syscall(SYS_pidfd_open, getpid(), 0); /* -1: the kernel has none */
  while ((rc = boot_poll(s, POLLOUT, b)) == 0) {}
  if (rc > 0) rc = boot_sendmsg(s, &hello, sizeof hello, &me, me >= 0);
  if (me >= 0) close(me);
  boot_reply_t reply;
  int fd = -1, nfd = 0;
  if (rc == 0) rc = boot_recvmsg(s, &reply, sizeof reply, &fd, 1, &nfd, b);
  if (rc != 0) { /* e.g. rank 0 gave up (another rank disagreed) before accepting us */
    snprintf(err, errlen, "rank %d lost rank 0 while joining: %s", rank, coll_strerror(rc));
    if (rc != COLL_EINTERRUPTED) rc = COLL_EBOOTSTRAP;
    goto out;
  }
  if (reply.status != 0 || nfd == 0) {
    if (nfd > 0) close(fd);
    rc = reply.status ? reply.status : COLL_EBOOTSTRAP;
    snprintf(err, errlen, "%s", reply.text);
    goto out;
  }
  if ((rc = boot_take_pids(s, size, pids_out, b)) != 0) {
    for (int r = 0; r < size; r++)
      if (pids_out[r] >= 0) close(pids_out[r]), pids_out[r] = -1;
    close(fd);
    snprintf(err, errlen, "rank %d lost rank 0 while joining: %s", rank, coll_strerror(rc));
    if (rc != COLL_EINTERRUPTED) rc = COLL_EBOOTSTRAP;
    goto out;
  }
  *fd_p = fd;
out:
  close(s);
  return rc;
}

int coll__bootstrap(coll_comm_t *c, int *fd_inout, char *err, size_t errlen) {
  const char *key = c->key;
  if (strlen(key) >= BOOT_KEY_MAX) return COLL_EBADARG;
  const char *dir = getenv("HBMCOLL_RENDEZVOUS_DIR");
  double now = boot_now(), stall = c->params.stall_warn_s;
  boot_t b = {c->params.timeout_s > 0 ? now + c->params.timeout_s : INFINITY, now,
              stall > 0 ? now + stall : INFINITY, c, dir && *dir ? dir : NULL};
  if (c->size == 1) return 0;
  struct sockaddr_un addr;
  struct stat st;
  if (b.dir) {
    int e = stat(b.dir, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (e == 0 && boot_address(key, &b, &addr) == 0) e = ENAMETOOLONG; /* sun_path: 108 bytes */
    if (e != 0) {
      snprintf(err, errlen, "rank %d: HBMCOLL_RENDEZVOUS_DIR '%s': %s", c->rank, b.dir,
               strerror(e));
      return COLL_EBOOTSTRAP;
    }
  }
  if (c->rank == 0) return boot_leader(key, c->size, &b, *fd_inout, c->pidfd, err, errlen);
  return boot_member(key, c->rank, c->size, &b, fd_inout, c->pidfd, err, errlen);
}
