/*
 * net_wait.c - how a wait on another node spends the time between polls (net_wait.h, and
 * coll__net_idle in net.h): a short spin, then a block in the kernel on the completion queue's
 * wait object.
 *
 * Why block. A rank that polls for ever holds its core. With a busy process per core beside the
 * job, a poller that yields (sched_yield) still competes for the core with the very processes it
 * waits for (a rank of its node, the kernel's network work, the busy neighbours), and under CFS
 * a yield hands over almost nothing: 8 B allreduce over 2 emulated nodes x 2 ranks took 2.10 ms
 * against gloo's 1.21, gloo blocking in its socket reads (issue 31). A rank asleep in the kernel
 * takes no core, and the scheduler runs it as soon as its bytes arrive (a sleeper is owed time).
 *
 * How long to spin first. Blocking costs a sleep and a wake-up; a wait that would have ended
 * sooner than that is better spun (spinning that long before blocking is within twice the best
 * choice made knowing the future, the classic competitive-spinning bound). What a wake-up costs
 * is measured when the endpoint opens: a helper thread woken through a pipe, which wakes us
 * back, the least of a few round trips, halved. That least is the cost on a warm core; a waiter
 * that slept through a transfer wakes on a halted vCPU, tens of us later (bench/README.md,
 * "Waits that share the core"). So where the machine has cores to spare the spin lasts up to
 * COLL_NET_SPIN_S, as the node's point-to-point waits' do (p2p.c). Where it has not (as many
 * other runnable tasks as cores we may run on: /proc/loadavg, looked at no more than every
 * COLL_NET_LOOK_S, once a wait is past the measured wake-up), where the node's waits found the
 * core wanted (core_share.c), or where a cgroup caps the CPU time, the spin is the measured
 * wake-up: a spinner there takes the core from the ranks it waits for, the scheduler owes time
 * to a sleeper, not to a spinner (bench/README.md has both measured), and a quota spent
 * spinning stops the whole job. A caller that spun on its own (nodes_p2p.c) passes a stretch
 * that began long ago, and the wait blocks at once.
 *
 * How to block. The CQ is opened with FI_WAIT_FD and fi_control(FI_GETWAIT) gives its fd. Then
 * fi_trywait (it says -FI_EAGAIN where completions are already queued: we poll again) and
 * poll(2) on that fd, on the watched fd (POLLRDHUP: its closing wakes us, not data left for its
 * owner), and on the caller's own fds (the memory server's control sockets), for at most most_s
 * (the interrupt callback's period: Ctrl-C) or until the caller's deadline.
 *
 * Progress. tcp has manual progress only: the provider moves bytes when it is called. Blocking
 * is still sound because, in libfabric 1.17 with tcp;ofi_rxm, the CQ's fd is an epoll set that
 * holds the endpoint's sockets: bytes arriving from a peer make it readable, and the next
 * fi_cq_read drives the progress that turns them into completions. Checked, not assumed:
 * tests/c/test_net_wait.c has a waiter block with no time limit and no interrupt for a peer
 * that writes 300 ms late, and the write wakes it (also 3 MiB rings whose writes outrun the
 * socket buffers, so a sender waits for its socket to drain).
 *
 * Connections. rxm connects to a peer on the first transfer, and in libfabric 1.17 the steps of
 * that handshake do not stir the CQ's fd (measured in test_net_wait.c: a first contact 300 ms
 * late ended 146 ms after the peer's write, each side sleeping through the steps). So until a
 * completion came after the last peer was added (net_ofi.c, `settled`), a block lasts at most
 * 1 ms, the least poll(2) takes: the wait still sleeps, and a handshake step costs a millisecond.
 *
 * A provider that gives no wait object: the waits spin as above, then yield the core after each
 * empty poll past the spin; coll__net_describe says "waits yield (no wait object)".
 */
#include "net_wait.h"
#ifdef COLL_NET_OFI
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fi_domain.h>

#include "core_share.h"

#define WAIT_ROUNDS 8 /* round trips measured at open: the least is the cost */

static double wait_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 when the machine's runnable tasks besides this one (/proc/loadavg's fourth field, "R/T")
 * are at least the cores this thread may run on (the whole machine's tasks against our share of
 * it: on a shared host that says busy more often than not, and then the waits act as before); 1
 * too when that cannot be read (then spinning is not known to be free). */
static int wait_machine_busy(void) {
  char line[128];
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, line, sizeof line - 1) : -1;
  if (fd >= 0) close(fd);
  if (got <= 0) return 1;
  line[got] = '\0';
  int running = 0;
  if (sscanf(line, "%*s %*s %*s %d/", &running) != 1 || running < 1) return 1; /* (we run: at least 1) */
  cpu_set_t mine;
  int cores = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : 0;
  return cores < 1 || running - 1 >= cores;
}

/* 1 when the process's cgroup caps its CPU time (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us): a
 * spin there spends a quota that, once gone, stops every thread of the job until the next period,
 * however idle the machine looks. */
static int wait_cpu_quota(void) {
  char text[64] = "";
  int fd = open("/sys/fs/cgroup/cpu.max", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    return got > 0 && strncmp(text, "max", 3) != 0;
  }
  if ((fd = open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", O_RDONLY | O_CLOEXEC)) < 0) return 0;
  ssize_t got = read(fd, text, sizeof text - 1);
  close(fd);
  return got > 0 && atol(text) > 0;
}

/* The helper: wakes on to_helper, answers on to_main, until the pipe closes. */
static void *wait_echo(void *arg) {
  const int *fds = arg; /* [0] read from the main thread, [1] write back */
  char c;
  while (read(fds[0], &c, 1) == 1)
    if (write(fds[1], &c, 1) != 1) break;
  return NULL;
}

/* What a sleep and a wake-up cost here: half the least round trip with a thread that blocks in
 * read(2) as we do in poll(2); 0 where no thread or pipe could be made. */
static double wait_wake_cost(void) {
  int to_helper[2], to_main[2];
  if (pipe(to_helper) != 0) return 0;
  if (pipe(to_main) != 0) {
    close(to_helper[0]), close(to_helper[1]);
    return 0;
  }
  int helper_fds[2] = {to_helper[0], to_main[1]};
  pthread_t helper;
  double best = 0;
  if (pthread_create(&helper, NULL, wait_echo, helper_fds) == 0) {
    for (int k = 0; k < WAIT_ROUNDS; k++) {
      char c = 'w';
      double t0 = wait_now();
      struct pollfd p = {.fd = to_main[0], .events = POLLIN};
      if (write(to_helper[1], &c, 1) != 1 || poll(&p, 1, 1000) != 1 || read(to_main[0], &c, 1) != 1) break;
      double rt = wait_now() - t0;
      if (best == 0 || rt < best) best = rt;
    }
    close(to_helper[1]); /* the helper's read sees the end and it returns */
    pthread_join(helper, NULL);
  } else {
    close(to_helper[1]);
  }
  close(to_helper[0]), close(to_main[0]), close(to_main[1]);
  return best / 2;
}

void coll__net_waiter_open(coll__net_waiter_t *w, struct fid_fabric *fabric, struct fid_cq *cq,
                           enum fi_wait_obj wait_obj) {
  w->fabric = fabric, w->cq = cq, w->fd = -1;
  int fd = -1, rc = wait_obj == FI_WAIT_FD ? fi_control(&cq->fid, FI_GETWAIT, &fd) : -FI_ENOSYS;
  double wake = wait_wake_cost();
  /* no thread to measure with (rare): the spin of the yielding waits before, 64 polls of about 1 us */
  w->spin_s = wake > 0 ? wake : 64e-6;
  w->quota = wait_cpu_quota();
  if (rc == 0 && fd >= 0) {
    w->fd = fd;
    if (w->quota)
      snprintf(w->how, sizeof w->how, "waits block on the CQ's fd after %.0f us (a CPU quota: no longer spin)",
               1e6 * w->spin_s);
    else
      snprintf(w->how, sizeof w->how, "waits block on the CQ's fd after %.0f us (%.0f on an idle machine)",
               1e6 * w->spin_s, 1e6 * (w->spin_s > COLL_NET_SPIN_S ? w->spin_s : COLL_NET_SPIN_S));
  } else {
    snprintf(w->how, sizeof w->how, "waits yield (no wait object: %s)",
             wait_obj == FI_WAIT_FD ? "fi_control(FI_GETWAIT) gave no fd" : "the provider refused FI_WAIT_FD");
  }
}

void coll__net_waiter_stir(coll__net_waiter_t *w) {
  atomic_fetch_add(&w->stirs, 1); /* before the signal: a waiter that missed the signal sees this */
  (void)fi_cq_signal(w->cq);
}

int coll__net_waiter_idle(coll__net_waiter_t *w, double *since, double until, double most_s, int watch_fd,
                          struct pollfd *extra, int nextra, const unsigned *seen) {
  double now = wait_now();
  if (*since == 0) *since = now;
  if (now - *since < w->spin_s) return 0;
  /* past the measured wake-up: look at the machine now and then (not on the first empty poll,
   * when an answer is likeliest) */
  if (now >= atomic_load_explicit(&w->next_look, memory_order_relaxed)) {
    atomic_store_explicit(&w->next_look, now + COLL_NET_LOOK_S, memory_order_relaxed);
    atomic_store_explicit(&w->busy, w->quota || wait_machine_busy(), memory_order_relaxed);
  }
  int spare = !atomic_load_explicit(&w->busy, memory_order_relaxed) && !coll__core_wanted(now);
  if (spare && now - *since < COLL_NET_SPIN_S) return 0;
  if (w->fd < 0) {
    sched_yield();
    return 1;
  }
  struct fid *fids[1] = {&w->cq->fid};
  if (fi_trywait(w->fabric, fids, 1) != FI_SUCCESS) return 0; /* completions waiting: read them */
  if (seen && atomic_load(&w->stirs) != *seen) return 0; /* stirred before the trywait: look again */
  double left = until > 0 && until - now < most_s ? until - now : most_s;
  int ms = left > 0 ? (int)ceil(left * 1e3 - 1e-6) : 0; /* rounded up: 1 ms asked is 1 ms */
  if (left > 0 && ms < 1) ms = 1;
  struct pollfd fds[2 + (nextra > 0 ? nextra : 0)];
  int nfds = 0, at_watch = -1;
  fds[nfds++] = (struct pollfd){.fd = w->fd, .events = POLLIN};
  if (watch_fd >= 0) at_watch = nfds, fds[nfds++] = (struct pollfd){.fd = watch_fd, .events = POLLRDHUP};
  int first_extra = nfds;
  for (int k = 0; k < nextra; k++) fds[nfds++] = extra[k];
  int got = poll(fds, (nfds_t)nfds, ms);
  w->blocks++;
  if (got > 0 && fds[0].revents) w->woken++;
  for (int k = 0; k < nextra; k++) extra[k].revents = got > 0 ? fds[first_extra + k].revents : 0;
  return at_watch >= 0 && got > 0 && fds[at_watch].revents ? 2 : 1;
}
#else
typedef int coll__net_wait_unused; /* ISO C wants a declaration in every file */
#endif /* COLL_NET_OFI */
