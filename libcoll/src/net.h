/*
 * net.h - the bridge between nodes: one endpoint per rank, a pool of memory registered
 * with the NIC once, and notified one-sided writes into the peers' pools.
 *
 * The model is Soft Memory Box's: every rank registers one pool when the job starts and
 * hands its card (address, key, base) to the ranks of other nodes out of band; from then on
 * a rank writes straight into a peer's pool, and the write carries a 32-bit note that the
 * peer sees once the bytes are in place (RDMA write with immediate data on verbs, remote CQ
 * data in libfabric). 32 bits because verbs carries no more. Nothing else crosses: no
 * atomics (rxm emulates them on the CPU), no reads on the data path (a round trip).
 *
 * Keys are secrets (DESIGN.md, Security model): where we pick the pool's key it is drawn with
 * getrandom(2) (mr_key_size bytes), and it leaves only in the card, which the callers send over
 * authenticated channels only. There is no random base: libfabric 1.17 ignores fi_mr_reg's
 * offset (its man page: "reserved for future use and must be 0"; the util MR map overwrites
 * it), so without FI_MR_VIRT_ADDR remote addresses are offsets from 0 and the key alone guards.
 * A write with a wrong key is refused by the target's provider, which drops the connection.
 * Notes and their senders (checked here with tcp;ofi_rxm): with FI_SOURCE, a message's
 * completion names its sender (or FI_ADDR_NOTAVAIL for an address never added), but a remote
 * write's carries no source (rxm writes it without one; fi_cq_readfrom says 0, a real peer's
 * number). So a note that came with a write is vouched for by the key only (poll says
 * "peer unknown"), and where the sender matters it travels as a message after the bytes
 * (coll__net_write_sourced, FI_ORDER_SAW); a message from an address that is no peer is
 * dropped and counted, and so is any message with bytes (ours carry none).
 *
 * net_ofi.c implements it over libfabric RDM endpoints: `verbs;ofi_rxm` on InfiniBand and
 * RoCE, `tcp;ofi_rxm` elsewhere, `shm` inside a node (the virtual-address path), the same
 * calls on each. Progress is driven by the caller: every wait polls the completion queue
 * (tcp has manual progress only).
 */
#ifndef COLL_NET_H
#define COLL_NET_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

/* Built without libfabric's headers (pip on a machine without libfabric-dev) or with
 * -DCOLL_NET_NO_OFI, the bridge is net_none.c: every open says so. */
#if defined(__has_include) && !defined(COLL_NET_NO_OFI)
#if __has_include(<rdma/fabric.h>)
#define COLL_NET_OFI 1
#endif
#endif

typedef struct coll__net coll__net_t;

/* A rank's card: what a peer needs to reach its endpoint and write into its pool (its address,
 * and the pool's key, drawn at random: a secret, to send over an authenticated channel only). */
#define COLL_NET_CARD_MAX 256

/* Open an endpoint and register a pool of pool_bytes (page aligned, zeroed) for remote
 * writes. iface: the interface (libfabric's domain name for tcp and verbs, e.g. "eth0" or
 * "mlx5_0"), NULL for the first the provider offers. FI_PROVIDER chooses the provider as
 * libfabric reads it. Returns 0 and *net_p, or COLL_ENOTSUP (no provider offers RDM
 * endpoints with RMA here, or none on iface: the text names what was asked and what
 * exists), -ENOMEM, or another code with a sentence in err. */
int coll__net_open(const char *iface, size_t pool_bytes, coll__net_t **net_p, char *err,
                   size_t errlen);
/* The same with the caller's pool (at least 64 KiB, kept until coll__net_close): memory placed
 * as the caller wants it, e.g. in HBM from the node's shared arena (NULL: its own), and the
 * family of the job's addresses: AF_INET6 takes the interface's IPv6 address (COLL_ENOTSUP
 * with a sentence if no provider offers one but link-local), AF_INET or AF_UNSPEC IPv4 first. */
int coll__net_open_on(const char *iface, int family, void *pool, size_t pool_bytes, coll__net_t **net_p,
                      char *err, size_t errlen);
void coll__net_close(coll__net_t *net); /* NULL is fine */

/* Bound a write's retries and a flush to timeout_s (<= 0: no bound, the default). A peer
 * whose process went away is retried for ever by rxm: without a bound such a write hangs. */
void coll__net_set_timeout(coll__net_t *net, double timeout_s);

/* Watch fd (a socket to the job's other nodes, -1: none): once it reaches end of file or
 * fails, writes, flushes and polls return COLL_EPEERLOST with a sentence naming `what`, so a
 * node that goes away ends every wait without a time limit. The caller owns fd. */
void coll__net_watch(coll__net_t *net, int fd, const char *what);

/* Waits that find nothing call fn(arg) every few tens of ms; nonzero ends the wait with
 * COLL_EINTERRUPTED (the Python layer checks for Ctrl-C here). NULL: none (the default). */
void coll__net_set_interrupt(coll__net_t *net, int (*fn)(void *), void *arg);
/* Whether a wait that found nothing for a while should stop: 1 once fn said so. */
int coll__net_interrupted(coll__net_t *net);

/* One line: "provider tcp;ofi_rxm, fabric 10.9.0.0/24, interface hbnet0, waits block on the
 * CQ's fd after 12 us (200 on an idle machine)" (or "waits yield (no wait object: ...)"). */
const char *coll__net_describe(const coll__net_t *net);
/* This rank's pool (the bytes peers write; also the source of its own writes). */
uint8_t *coll__net_pool(coll__net_t *net);
size_t coll__net_pool_bytes(const coll__net_t *net);

/* My card into card[0..COLL_NET_CARD_MAX); returns its length. */
size_t coll__net_card(const coll__net_t *net, uint8_t *card);
/* Add a peer from its card: 0 and *peer_p (0, 1, ... in the order added), or COLL_EBADARG
 * (not a card of this provider) or a libfabric failure with a sentence in err. */
int coll__net_add_peer(coll__net_t *net, const uint8_t *card, size_t len, int *peer_p,
                       char *err, size_t errlen);

/* Write len bytes at my pool's offset `from` into peer's pool at offset `to`, with `note`:
 * the peer's coll__net_poll returns the note once the bytes are there. Returns 0 once the
 * write is posted (retrying while the provider says again), or a failure with a sentence.
 * My bytes [from, from+len) must stay unchanged until the write completed: coll__net_flush,
 * or *sent_p (if not NULL) grown by one, which the polls do when it completes. */
int coll__net_write(coll__net_t *net, int peer, size_t from, size_t to, size_t len, uint32_t note,
                    uint64_t *sent_p, char *err, size_t errlen);
/* 1 where writes may come from any of my memory (tcp: no FI_MR_LOCAL), 0 where only from my
 * registered pool (verbs). Then coll__net_write_from writes len bytes at src, which must stay
 * unchanged until the write completed, as above; COLL_EBADARG where the provider cannot. */
int coll__net_any_source(const coll__net_t *net);
int coll__net_write_from(coll__net_t *net, int peer, const void *src, size_t len, size_t to, uint32_t note,
                         uint64_t *sent_p, char *err, size_t errlen);
/* The most bytes coll__net_inject takes here (the provider's inject size; 0: none). */
size_t coll__net_inject_max(const coll__net_t *net);
/* coll__net_write of at most coll__net_inject_max bytes, injected: my bytes may be reused as soon
 * as it returns, and no completion follows (no flush waits for it). The eager path of small
 * messages: one transfer, nothing to reap. COLL_EBADARG where len is over the limit. */
int coll__net_inject(coll__net_t *net, int peer, size_t from, size_t to, size_t len, uint32_t note, char *err,
                     size_t errlen);
/* Until every write I posted completed (my pool may be reused). */
int coll__net_flush(coll__net_t *net, char *err, size_t errlen);
/* Drive progress once: 1 and *note_p when a peer's write arrived, 0 when nothing did, or a
 * failure (a peer's endpoint went away, the link failed) with a sentence in err. A note from an
 * address that is no peer added here is dropped (coll__net_dropped counts it), never returned. */
int coll__net_poll(coll__net_t *net, uint32_t *note_p, char *err, size_t errlen);
/* The same, with *peer_p the note's sender: its peer number for a note sent with
 * coll__net_write_sourced, -1 for one that came with a write (the pool's key vouches that a
 * peer sent it, but providers do not say which: rxm reports no source for remote writes). */
int coll__net_poll_from(coll__net_t *net, uint32_t *note_p, int *peer_p, char *err, size_t errlen);
/* coll__net_write, with the note sent as a message behind the bytes (ordered after them, or sent
 * once the write completed where the provider does not order them), so that the peer's
 * coll__net_poll_from names this endpoint: one message more than coll__net_write. */
int coll__net_write_sourced(coll__net_t *net, int peer, size_t from, size_t to, size_t len, uint32_t note,
                            uint64_t *sent_p, char *err, size_t errlen);
/* Notes dropped so far: from addresses that are no peers, or messages that were no notes (the
 * first one is also said once on stderr). */
uint64_t coll__net_dropped(const coll__net_t *net);

/* What a wait does after a poll that brought nothing (net_wait.c says why and how). *since is
 * when the stretch of empty polls began (0: it begins now; the caller sets it back to 0 when
 * something arrives). While the stretch is shorter than a sleep and a wake-up cost here
 * (measured at open) this returns 0 at once: poll again. After that it blocks in the kernel
 * until the provider's wait object stirs (a peer's bytes arrived), the watched fd closes (the
 * next poll says COLL_EPEERLOST), one of extra[0..nextra) has its events (revents set), `until`
 * (CLOCK_MONOTONIC seconds, 0: none) or a few tens of ms pass, and returns 1: the caller checks
 * its deadline and coll__net_interrupted now. Where the provider has no wait object it yields
 * the core instead (1 too); coll__net_describe says which. */
int coll__net_idle(coll__net_t *net, double *since, double until);
int coll__net_idle_fds(coll__net_t *net, double *since, double until, struct pollfd *extra, int nextra);
/* How often waits blocked so far, and how many of those blocks the provider's wait object ended
 * (a peer's bytes arrived) rather than the watch, the caller's fds or the clock. */
void coll__net_wait_counts(const coll__net_t *net, uint64_t *blocks_p, uint64_t *woken_p);

#endif /* COLL_NET_H */
