/*
 * bootstrap.c - ranks of one node meet and share the segment's fd.
 *
 * Rank 0 listens on an abstract Unix socket "\0hbmcoll.<uid>.<hash(key)>"
 * (no file to clean up; gone when closed), the others connect, retrying
 * until the deadline because rank 0 may not be listening yet. Each side
 * checks the other's uid with SO_PEERCRED; the hello carries the full key,
 * the size and the rank so two jobs, or ranks that disagree, never mix. When
 * all size-1 peers have said hello, rank 0 sends each the fd (SCM_RIGHTS)
 * and closes everything.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define BOOT_MAGIC 0x68626f6f74303031ull
#define BOOT_KEY_MAX 200

typedef struct {
  uint64_t magic;
  int32_t size, rank;
  char key[BOOT_KEY_MAX];
} boot_hello_t;

typedef struct {
  int32_t status; /* 0, or a negative code; text explains */
  char text[COLL_TEXT_MAX];
} boot_reply_t;

typedef struct {
  double deadline;
  coll_interrupt_fn interrupt; /* Ctrl-C during init/split: checked every slice */
  void *arg;
} boot_t;

#define BOOT_SLICE_MS 50

static double boot_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static socklen_t boot_address(const char *key, struct sockaddr_un *addr) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a: keys may be longer than sun_path */
  for (const char *p = key; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "hbmcoll.%u.%016llx",
                   (unsigned)getuid(), (unsigned long long)h);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int boot_same_user(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -errno;
  return cred.uid == getuid() ? 0 : -EACCES;
}

/* Wait for `events` on fd in short slices: >0 ready, -ETIMEDOUT at the
 * deadline, COLL_EINTERRUPTED when the interrupt check says so. */
static int boot_poll(int fd, short events, const boot_t *b) {
  for (;;) {
    int ms = (int)((b->deadline - boot_now()) * 1000);
    if (ms <= 0) return -ETIMEDOUT;
    struct pollfd pfd = {fd, events, 0};
    int rc = poll(&pfd, 1, ms < BOOT_SLICE_MS ? ms : BOOT_SLICE_MS);
    if (rc > 0) return rc;
    if (rc < 0 && errno != EINTR) return -errno;
    if (b->interrupt && b->interrupt(b->arg)) return COLL_EINTERRUPTED;
  }
}

/* Read or write exactly n bytes before the deadline. */
static int boot_io(int fd, void *buf, size_t n, int writing, const boot_t *b) {
  size_t done = 0;
  while (done < n) {
    int rc = boot_poll(fd, writing ? POLLOUT : POLLIN, b);
    if (rc < 0) return rc;
    ssize_t k = writing ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return -errno;
    if (k == 0) return -ECONNRESET;
    done += (size_t)k;
  }
  return 0;
}

static int boot_send_fd(int sock, const boot_reply_t *reply, int fd) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  memset(cbuf, 0, sizeof cbuf);
  struct iovec iov = {(void *)reply, sizeof *reply};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof *reply ? 0 : -errno;
}

static int boot_recv_fd(int sock, boot_reply_t *reply, int *fd_p, const boot_t *b) {
  int rc = boot_poll(sock, POLLIN, b);
  if (rc < 0) return rc;
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {reply, sizeof *reply};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof cbuf};
  ssize_t k = recvmsg(sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  if (k < 0) return -errno;
  if (k != (ssize_t)sizeof *reply) return -ECONNRESET;
  *fd_p = -1;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
      memcpy(fd_p, CMSG_DATA(cm), sizeof(int));
  return 0;
}

static int boot_leader(const char *key, int size, const boot_t *b, int fd, char *err,
                       size_t errlen) {
  struct sockaddr_un addr;
  socklen_t alen = boot_address(key, &addr);
  int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lsock < 0) return -errno;
  int rc = 0, *conns = NULL, nconn = 0;
  if (bind(lsock, (struct sockaddr *)&addr, alen) != 0 || listen(lsock, size) != 0) {
    rc = -errno;
    snprintf(err, errlen, "rank 0 could not listen for job key '%s': %s%s", key, strerror(-rc),
             rc == -EADDRINUSE ? " (another job with the same key is starting)" : "");
    goto out_close_listener;
  }
  conns = calloc((size_t)size, sizeof(int));
  if (conns == NULL) {
    rc = -ENOMEM;
    goto out_close_listener;
  }
  for (int i = 0; i < size; i++) conns[i] = -1;
  while (nconn < size - 1) {
    int prc = boot_poll(lsock, POLLIN, b);
    if (prc == COLL_EINTERRUPTED) {
      snprintf(err, errlen, "rank 0 was interrupted while waiting for the other ranks");
      rc = prc;
      goto out_close_conns;
    }
    if (prc <= 0) {
      char missing[96] = "";
      size_t used = 0;
      for (int r = 1; r < size && used + 12 < sizeof missing; r++)
        if (conns[r] < 0) used += (size_t)snprintf(missing + used, sizeof missing - used, " %d", r);
      snprintf(err, errlen, "rank 0 waited for the other ranks; %d of %d came (missing:%s)",
               nconn + 1, size, missing);
      rc = -ETIMEDOUT;
      goto out_close_conns;
    }
    int s = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) continue;
    boot_hello_t hello;
    if (boot_same_user(s) != 0 || boot_io(s, &hello, sizeof hello, 0, b) != 0 ||
        hello.magic != BOOT_MAGIC || strncmp(hello.key, key, BOOT_KEY_MAX) != 0) {
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
      close(s);
      rc = COLL_EBOOTSTRAP;
      goto out_close_conns;
    }
    conns[hello.rank] = s;
    nconn++;
  }
  for (int r = 1; r < size; r++) {
    boot_reply_t reply = {0, ""};
    int src = boot_send_fd(conns[r], &reply, fd);
    if (src != 0 && rc == 0) {
      rc = src;
      snprintf(err, errlen, "rank 0 could not hand the segment to rank %d: %s", r, strerror(-src));
    }
  }
out_close_conns:
  for (int r = 1; r < size; r++) {
    if (conns[r] < 0) continue;
    if (rc != 0) { /* tell the ones that came why the job cannot start */
      boot_reply_t reply = {rc, ""};
      snprintf(reply.text, sizeof reply.text, "%s", err);
      boot_send_fd(conns[r], &reply, -1);
    }
    close(conns[r]);
  }
  free(conns);
out_close_listener:
  close(lsock);
  return rc;
}

static int boot_member(const char *key, int rank, int size, const boot_t *b, int *fd_p, char *err,
                       size_t errlen) {
  struct sockaddr_un addr;
  socklen_t alen = boot_address(key, &addr);
  int s = -1, rc = 0;
  useconds_t nap = 1000;
  for (;;) { /* rank 0 may not be listening yet */
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -errno;
    if (connect(s, (struct sockaddr *)&addr, alen) == 0) break;
    rc = -errno;
    close(s);
    if (rc != -ECONNREFUSED && rc != -ENOENT && rc != -EAGAIN) {
      snprintf(err, errlen, "rank %d could not connect to rank 0: %s", rank, strerror(-rc));
      return rc;
    }
    if (boot_now() >= b->deadline) {
      snprintf(err, errlen, "rank %d found no rank 0 listening for job key '%s' in time", rank, key);
      return -ETIMEDOUT;
    }
    if (b->interrupt && b->interrupt(b->arg)) {
      snprintf(err, errlen, "rank %d was interrupted while looking for rank 0", rank);
      return COLL_EINTERRUPTED;
    }
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
  rc = boot_io(s, &hello, sizeof hello, 1, b);
  boot_reply_t reply;
  int fd = -1;
  if (rc == 0) rc = boot_recv_fd(s, &reply, &fd, b);
  if (rc != 0) {
    snprintf(err, errlen, "rank %d lost rank 0 while joining: %s", rank, coll_strerror(rc));
    goto out;
  }
  if (reply.status != 0 || fd < 0) {
    if (fd >= 0) close(fd);
    rc = reply.status ? reply.status : COLL_EBOOTSTRAP;
    snprintf(err, errlen, "%s", reply.text);
    goto out;
  }
  *fd_p = fd;
out:
  close(s);
  return rc;
}

int coll__bootstrap(const char *key, int rank, int size, double timeout_s, int *fd_inout,
                    coll_interrupt_fn interrupt, void *arg, char *err, size_t errlen) {
  if (strlen(key) >= BOOT_KEY_MAX) return COLL_EBADARG;
  boot_t b = {boot_now() + timeout_s, interrupt, arg};
  if (size == 1) return 0;
  if (rank == 0) return boot_leader(key, size, &b, *fd_inout, err, errlen);
  return boot_member(key, rank, size, &b, fd_inout, err, errlen);
}
