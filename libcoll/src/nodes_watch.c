/*
 * nodes_watch.c - the connections of a rendezvous of nodes, kept open after it:
 * how a lost node is noticed and how members leave.
 *
 * A thread polls the connections (member 0: one per other member; member k: the one to member 0)
 * and `theirs`, one end of a socket pair whose other end, `mine`, is what the bridge watches
 * (coll__net_watch) and what the layer across nodes shuts when a call failed (hier.c). End of
 * file on a connection without a goodbye is a lost node: the thread shuts every connection (so
 * member 0's loss reaches every member) and closes `theirs`, so every wait on the bridge ends.
 *
 * A guard (the communicator's, nodes_comm.c) is asked every 100 ms of quiet whether this node lost a
 * rank: so a death ends the job's communicator on every node even while no rank is in a call.
 *
 * Exit is a message: member k says BYE with the number of calls it made; member 0
 * tells every member (LEFT, with that number) and, once all said it or were lost, ALL. A member in
 * a later call than one that left will never see it there: its watch fires at once. Messages: 'B'
 * or 'L' and a 64-bit big-endian count; 'A' alone.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nodes.h"

struct coll__nodes_watch {
  int *socks, n, relay;
  uint8_t *bye, *gone; /* per connection: said goodbye (member 0), reached end of file */
  uint8_t (*held)[16]; /* per connection: the start of a message not yet whole */
  size_t *held_len;
  int mine;
  _Atomic int theirs;
  pthread_t thread;
  _Atomic int stop, running, answered;
  pthread_mutex_t lock, sending;
  uint64_t calls;
  int64_t left; /* fewest calls of a member that left, -1 while none has */
  int (*guard)(void *); /* coll__nodes_watch_guard's, called under lock */
  void *guard_arg;
};

static void watch_close_theirs(coll__nodes_watch_t *w) {
  int fd = atomic_exchange(&w->theirs, -1);
  if (fd >= 0) close(fd);
}

static void watch_drop(coll__nodes_watch_t *w) {
  for (int i = 0; i < w->n; i++) shutdown(w->socks[i], SHUT_RDWR);
  watch_close_theirs(w);
}

static void watch_send_all(coll__nodes_watch_t *w, const uint8_t *msg, size_t len) {
  pthread_mutex_lock(&w->sending);
  for (int i = 0; i < w->n; i++)
    if (!w->gone[i]) (void)!send(w->socks[i], msg, len, MSG_NOSIGNAL);
  pthread_mutex_unlock(&w->sending);
}

static void watch_leave(coll__nodes_watch_t *w, uint64_t n) {
  pthread_mutex_lock(&w->lock);
  if (w->left < 0 || (uint64_t)w->left > n) w->left = (int64_t)n;
  int fire = w->calls > n;
  pthread_mutex_unlock(&w->lock);
  if (fire) watch_close_theirs(w);
}

static void watch_count(uint8_t *msg, char kind, uint64_t n) {
  msg[0] = (uint8_t)kind;
  for (int i = 0; i < 8; i++) msg[1 + i] = (uint8_t)(n >> (56 - 8 * i));
}

/* Act on the whole messages of connection i. */
static void watch_take(coll__nodes_watch_t *w, int i, const uint8_t *data, size_t len) {
  for (size_t k = 0; k < len; k++) {
    uint8_t *h = w->held[i];
    h[w->held_len[i]++] = data[k];
    if (h[0] == 'A') {
      atomic_store(&w->answered, 1);
      w->held_len[i] = 0;
    } else if (w->held_len[i] == 9) {
      uint64_t n = 0;
      for (int b = 1; b < 9; b++) n = n << 8 | h[b];
      w->held_len[i] = 0;
      if (h[0] == 'B' && w->relay) { /* member k leaves: tell the others */
        uint8_t msg[9];
        w->bye[i] = 1;
        watch_count(msg, 'L', n);
        watch_send_all(w, msg, sizeof msg);
      }
      watch_leave(w, n);
    }
  }
}

static void *watch_main(void *arg) {
  coll__nodes_watch_t *w = arg;
  struct pollfd *p = calloc((size_t)w->n + 1, sizeof *p);
  int *at = calloc((size_t)w->n + 1, sizeof *at);
  while (p && at && !atomic_load(&w->stop)) {
    /* theirs closed (a member left before this rank's call): the connections are still served */
    int m = 0, theirs = atomic_load(&w->theirs), first = theirs >= 0;
    if (first) p[m++] = (struct pollfd){.fd = theirs, .events = POLLIN | POLLRDHUP};
    for (int i = 0; i < w->n; i++)
      if (!w->gone[i]) at[m] = i, p[m++] = (struct pollfd){.fd = w->socks[i], .events = POLLIN | POLLRDHUP};
    if (m == first) break;
    if (poll(p, (nfds_t)m, 100) <= 0) {
      pthread_mutex_lock(&w->lock); /* a failure it finds shuts `mine`: theirs stirs at the next poll */
      if (w->guard) w->guard(w->guard_arg);
      pthread_mutex_unlock(&w->lock);
      continue;
    }
    if (first && p[0].revents) { /* this node ended the job's communicator: the others learn it */
      if (!atomic_load(&w->stop)) watch_drop(w);
      break;
    }
    int lost = 0;
    for (int j = first; j < m && !lost; j++) {
      if (!p[j].revents) continue;
      int i = at[j];
      uint8_t buf[512];
      ssize_t got = recv(w->socks[i], buf, sizeof buf, MSG_DONTWAIT);
      if (got > 0) {
        watch_take(w, i, buf, (size_t)got);
        continue;
      }
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      w->gone[i] = 1;
      lost = !w->bye[i] && !atomic_load(&w->answered) && !atomic_load(&w->stop); /* a lost node */
    }
    if (lost) {
      watch_drop(w);
      break;
    }
  }
  free(p);
  free(at);
  atomic_store(&w->running, 0);
  return NULL;
}

int coll__nodes_watch_start(const int *socks, int n, int relay, coll__nodes_watch_t **w_p) {
  coll__nodes_watch_t *w = calloc(1, sizeof *w);
  int pair[2] = {-1, -1}, rc = 0;
  if (w) {
    w->socks = malloc((size_t)n * sizeof(int) + 1);
    w->bye = calloc((size_t)n + 1, 1), w->gone = calloc((size_t)n + 1, 1);
    w->held = calloc((size_t)n + 1, sizeof *w->held), w->held_len = calloc((size_t)n + 1, sizeof(size_t));
  }
  if (!w || !w->socks || !w->bye || !w->gone || !w->held || !w->held_len) rc = -ENOMEM;
  else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) rc = -errno;
  if (rc == 0) {
    if (n > 0) memcpy(w->socks, socks, (size_t)n * sizeof(int));
    w->n = n, w->relay = relay, w->left = -1;
    w->mine = pair[0];
    atomic_store(&w->theirs, pair[1]);
    atomic_store(&w->running, 1);
    pthread_mutex_init(&w->lock, NULL);
    pthread_mutex_init(&w->sending, NULL);
    rc = -pthread_create(&w->thread, NULL, watch_main, w);
    if (rc) pthread_mutex_destroy(&w->lock), pthread_mutex_destroy(&w->sending);
  }
  if (rc) {
    for (int i = 0; i < n; i++) close(socks[i]);
    if (pair[0] >= 0) close(pair[0]), close(pair[1]);
    if (w) free(w->socks), free(w->bye), free(w->gone), free(w->held), free(w->held_len);
    free(w);
    return rc;
  }
  *w_p = w;
  return 0;
}

int coll__nodes_watch_fd(const coll__nodes_watch_t *w) { return w ? w->mine : -1; }

void coll__nodes_watch_guard(coll__nodes_watch_t *w, int (*fn)(void *), void *arg) {
  if (w == NULL) return;
  pthread_mutex_lock(&w->lock);
  w->guard = fn, w->guard_arg = arg;
  pthread_mutex_unlock(&w->lock);
}

int coll__nodes_watch_why(coll__nodes_watch_t *w, char *err, size_t errlen) {
  if (w == NULL) return 0;
  pthread_mutex_lock(&w->lock);
  int64_t left = w->left;
  uint64_t calls = w->calls;
  pthread_mutex_unlock(&w->lock);
  if (left < 0 || (uint64_t)left >= calls) return 0;
  snprintf(err, errlen, "another node's ranks closed the communicator while this rank is in a collective they "
           "never made (%llu more than they did): every rank must make the same collectives",
           (unsigned long long)(calls - (uint64_t)left));
  return 1;
}

int coll__nodes_watch_began(coll__nodes_watch_t *w, char *err, size_t errlen) {
  if (w == NULL) return 0;
  pthread_mutex_lock(&w->lock);
  w->calls++;
  pthread_mutex_unlock(&w->lock);
  if (!coll__nodes_watch_why(w, err, errlen)) return 0;
  watch_close_theirs(w);
  return COLL_EPEERLOST;
}

static double watch_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int watch_all_said(coll__nodes_watch_t *w) {
  int k = 0;
  for (int i = 0; i < w->n; i++) k += w->bye[i] || w->gone[i];
  return k >= w->n;
}

static void watch_finish(coll__nodes_watch_t *w, int graceful, double timeout_s) {
  if (w == NULL) return;
  if (graceful) {
    uint8_t msg[9];
    double end = watch_now() + timeout_s;
    pthread_mutex_lock(&w->lock);
    uint64_t calls = w->calls;
    pthread_mutex_unlock(&w->lock);
    watch_count(msg, w->relay ? 'L' : 'B', calls);
    watch_send_all(w, msg, sizeof msg);
    struct timespec nap = {0, 10000000};
    if (w->relay) { /* everyone's goodbye (or end), then the answer */
      while (!watch_all_said(w) && atomic_load(&w->running) && watch_now() < end) nanosleep(&nap, NULL);
      uint8_t all = 'A';
      watch_send_all(w, &all, 1);
    } else {
      while (!atomic_load(&w->answered) && atomic_load(&w->running) && watch_now() < end) nanosleep(&nap, NULL);
    }
  }
  atomic_store(&w->stop, 1);
  pthread_join(w->thread, NULL);
  for (int i = 0; i < w->n; i++) close(w->socks[i]);
  close(w->mine);
  watch_close_theirs(w);
  pthread_mutex_destroy(&w->lock);
  pthread_mutex_destroy(&w->sending);
  free(w->socks), free(w->bye), free(w->gone), free(w->held), free(w->held_len);
  free(w);
}

void coll__nodes_watch_close(coll__nodes_watch_t *w, double timeout_s) { watch_finish(w, 1, timeout_s); }
void coll__nodes_watch_abort(coll__nodes_watch_t *w) { watch_finish(w, 0, 0); }
