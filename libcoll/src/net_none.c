/*
 * net_none.c - the bridge in a build without libfabric's headers (net.h): there is no
 * endpoint to open, and the one call that would make one says what to install.
 */
#include "net.h"
#ifndef COLL_NET_OFI
#include <stdio.h>

#include "coll.h"

int coll__net_open(const char *iface, size_t pool_bytes, coll__net_t **net_p, char *err,
                   size_t errlen) {
  (void)iface, (void)pool_bytes, (void)net_p;
  snprintf(err, errlen, "this hbmcoll was built without libfabric's headers, so it has no bridge "
           "between nodes; install libfabric-dev (Debian) and rebuild");
  return COLL_ENOTSUP;
}

int coll__net_open_on(const char *iface, int family, void *pool, size_t pool_bytes, coll__net_t **net_p,
                      char *err, size_t errlen) {
  (void)pool, (void)family;
  return coll__net_open(iface, pool_bytes, net_p, err, errlen);
}

/* Nothing below is reached without an endpoint; they exist for the linker. */
void coll__net_close(coll__net_t *net) { (void)net; }
void coll__net_set_timeout(coll__net_t *net, double timeout_s) { (void)net, (void)timeout_s; }
void coll__net_watch(coll__net_t *net, int fd, const char *what) { (void)net, (void)fd, (void)what; }
void coll__net_set_interrupt(coll__net_t *net, int (*fn)(void *), void *arg) { (void)net, (void)fn, (void)arg; }
int coll__net_interrupted(coll__net_t *net) { return (void)net, 0; }
const char *coll__net_describe(const coll__net_t *net) { return (void)net, "no bridge"; }
uint8_t *coll__net_pool(coll__net_t *net) { return (void)net, NULL; }
size_t coll__net_pool_bytes(const coll__net_t *net) { return (void)net, 0; }
size_t coll__net_card(const coll__net_t *net, uint8_t *card) { return (void)net, (void)card, 0; }
int coll__net_add_peer(coll__net_t *net, const uint8_t *card, size_t len, int *peer_p, char *err,
                       size_t errlen) {
  (void)net, (void)card, (void)len, (void)peer_p, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
int coll__net_write(coll__net_t *net, int peer, size_t from, size_t to, size_t len, uint32_t note,
                    uint64_t *sent_p, char *err, size_t errlen) {
  (void)net, (void)peer, (void)from, (void)to, (void)len, (void)note, (void)sent_p, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
int coll__net_any_source(const coll__net_t *net) { return (void)net, 0; }
int coll__net_write_from(coll__net_t *net, int peer, const void *src, size_t len, size_t to, uint32_t note,
                         uint64_t *sent_p, char *err, size_t errlen) {
  (void)net, (void)peer, (void)src, (void)len, (void)to, (void)note, (void)sent_p, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
size_t coll__net_inject_max(const coll__net_t *net) { return (void)net, 0; }
int coll__net_inject(coll__net_t *net, int peer, size_t from, size_t to, size_t len, uint32_t note, char *err,
                     size_t errlen) {
  (void)net, (void)peer, (void)from, (void)to, (void)len, (void)note, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
int coll__net_flush(coll__net_t *net, char *err, size_t errlen) {
  (void)net, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
int coll__net_poll(coll__net_t *net, uint32_t *note_p, char *err, size_t errlen) {
  (void)net, (void)note_p, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
int coll__net_poll_from(coll__net_t *net, uint32_t *note_p, int *peer_p, char *err, size_t errlen) {
  (void)net, (void)note_p, (void)peer_p, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
int coll__net_write_sourced(coll__net_t *net, int peer, size_t from, size_t to, size_t len, uint32_t note,
                            uint64_t *sent_p, char *err, size_t errlen) {
  (void)net, (void)peer, (void)from, (void)to, (void)len, (void)note, (void)sent_p, (void)err, (void)errlen;
  return COLL_ENOTSUP;
}
uint64_t coll__net_dropped(const coll__net_t *net) { return (void)net, 0; }
void coll__net_wait_counts(const coll__net_t *net, uint64_t *blocks_p, uint64_t *woken_p) {
  (void)net, *blocks_p = 0, *woken_p = 0;
}
int coll__net_idle(coll__net_t *net, double *since, double until) { return (void)net, (void)since, (void)until, 0; }
int coll__net_idle_fds(coll__net_t *net, double *since, double until, struct pollfd *extra, int nextra) {
  return (void)net, (void)since, (void)until, (void)extra, (void)nextra, 0;
}
#else
typedef int coll__net_none_unused; /* ISO C wants a declaration in every file */
#endif
