/*
 * stranger.c - a process with no job key that finds bridge endpoints and writes into them
 * (tests/py/test_strangers.py runs it in a namespace of its own on the job's bridge).
 *
 *   stranger [--iface IF] [--span BYTES] [--notes nodes|client0] [--tagged] ADDR:PORT...
 *
 * It opens its own libfabric RDM endpoint (FI_PROVIDER as libfabric reads it; tcp;ofi_rxm
 * here), adds every ADDR:PORT given (the test finds them with `ss -tlnp` in the node's
 * namespace) and, until SIGTERM, hammers each one:
 *  - fi_senddata and fi_injectdata of forged notes, and a message of one byte;
 *  - fi_writedata of 64 KiB of 0x7f bytes at offsets 0, 64 KiB, ... below --span, with the key
 *    hbmcoll used to register every pool with (0xC011), and now and then a guess (0, 1,
 *    0xC010, 0xC012); each write carries a forged note.
 * With --tagged it sends tagged messages instead (the endpoints of point-to-point across nodes,
 * libcoll/src/nodes_p2p.c): 8 bytes of 0x7f with remote CQ data that claims a rank (0-3, and a
 * message's length above it, as the library sends), tags 0-15 (a user's tags with no token in the
 * high bits), all ones, and random ones, and injected ones.
 * Notes: "nodes" counts through the ring's data and credit notes (transfer numbers 0..4095,
 * credits with the top bit), "client0" names client 0 of a memory server (either half).
 * It prints a line at the start ("stranger: hammering N endpoints"), one every 500 operations
 * posted, and one at the end with what it posted and how the completions came back. Plain libfabric: no hbmcoll inside.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TARGETS 16
#define PIECE 65536
#define IN_FLIGHT 32

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig, stop = 1; }

static struct fid_cq *cq;
static long posted, injected, done, failed, refused_posts;

static void progress(void) {
  struct fi_cq_data_entry e[16];
  ssize_t got = fi_cq_read(cq, e, 16);
  if (got > 0) done += got;
  if (got == -FI_EAVAIL) {
    struct fi_cq_err_entry ee = {0};
    fi_cq_readerr(cq, &ee, 0);
    failed++;
  }
}

/* Post with op until the provider takes it (or refuses for good: counted, skipped); `completes`:
 * whether it has a completion to wait for (an inject has none). */
#define POST(call, completes)                                                                      \
  do {                                                                                             \
    ssize_t rc_;                                                                                   \
    unsigned tries_ = 0;                                                                           \
    while ((rc_ = (call)) == -FI_EAGAIN && !stop && ++tries_ < 100000) progress();                 \
    if (rc_ == 0 && ++posted % 500 == 0) printf("stranger: %ld posted\n", posted), fflush(stdout);  \
    if (rc_ != 0) refused_posts++;                                                                 \
    if (rc_ == 0 && !(completes)) injected++;                                                      \
    while (posted - injected - done - failed > IN_FLIGHT && !stop && ++tries_ < 200000) progress(); \
  } while (0)

static int usage(void) {
  fprintf(stderr, "usage: stranger [--iface IF] [--span BYTES] [--notes nodes|client0] [--tagged] ADDR:PORT...\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *iface = NULL, *notes = "nodes";
  int tagged = 0;
  size_t span = 4 << 20;
  struct sockaddr_in targets[MAX_TARGETS];
  int ntargets = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iface") == 0 && i + 1 < argc) iface = argv[++i];
    else if (strcmp(argv[i], "--span") == 0 && i + 1 < argc) span = strtoull(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "--notes") == 0 && i + 1 < argc) notes = argv[++i];
    else if (strcmp(argv[i], "--tagged") == 0) tagged = 1;
    else {
      char host[64];
      unsigned port;
      if (ntargets == MAX_TARGETS || sscanf(argv[i], "%63[^:]:%u", host, &port) != 2) return usage();
      struct sockaddr_in *t = &targets[ntargets++];
      memset(t, 0, sizeof *t);
      t->sin_family = AF_INET;
      t->sin_port = htons((uint16_t)port);
      if (inet_pton(AF_INET, host, &t->sin_addr) != 1) return usage();
    }
  }
  if (ntargets == 0 || span < PIECE) return usage();
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);

  struct fi_info *hints = fi_allocinfo(), *info = NULL;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = tagged ? FI_TAGGED : FI_MSG | FI_RMA;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if (iface) hints->domain_attr->name = strdup(iface);
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fid_ep *ep;
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  int rc = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info);
  if (rc || info->domain_attr->mr_mode & FI_MR_LOCAL) {
    fprintf(stderr, "stranger: no provider to write from plain memory (%s)\n", fi_strerror(-rc));
    return 1;
  }
  if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL)) || (rc = fi_domain(fabric, info, &domain, NULL)) ||
      (rc = fi_cq_open(domain, &cq_attr, &cq, NULL)) || (rc = fi_av_open(domain, &av_attr, &av, NULL)) ||
      (rc = fi_endpoint(domain, info, &ep, NULL)) || (rc = fi_ep_bind(ep, &av->fid, 0)) ||
      (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) || (rc = fi_enable(ep))) {
    fprintf(stderr, "stranger: could not open an endpoint: %s\n", fi_strerror(-rc));
    return 1;
  }
  fi_addr_t addr[MAX_TARGETS];
  for (int t = 0; t < ntargets; t++)
    if (fi_av_insert(av, &targets[t], 1, &addr[t], 0, NULL) != 1) {
      fprintf(stderr, "stranger: fi_av_insert refused target %d\n", t);
      return 1;
    }
  static uint8_t junk[PIECE];
  memset(junk, 0x7f, sizeof junk);
  printf("stranger: hammering %d endpoints\n", ntargets);
  fflush(stdout);
  static const uint64_t guesses[] = {0, 1, 0xC010, 0xC012};
  int client0 = strcmp(notes, "client0") == 0;
  for (uint32_t r = 0; tagged && !stop; r++) {
    for (int t = 0; t < ntargets && !stop; t++) {
      uint64_t rank = r % 4, data = rank | (UINT64_C(8) << 24), tag = r % 16;
      uint64_t wild = ((uint64_t)rand() << 33) ^ ((uint64_t)rand() << 2) ^ (uint64_t)rand();
      POST(fi_tsenddata(ep, junk, 8, NULL, data, addr[t], tag, NULL), 1);
      POST(fi_tsenddata(ep, junk, 8, NULL, data, addr[t], r & 1 ? ~UINT64_C(0) : wild, NULL), 1);
      POST(fi_tinjectdata(ep, junk, 8, data, addr[t], tag), 0);
    }
  }
  for (uint32_t r = 0; !tagged && !stop; r++) {
    for (int t = 0; t < ntargets && !stop; t++) {
      for (uint32_t k = 0; k < 8 && !stop; k++) {
        uint32_t step = r * 8 + k;
        uint32_t note = client0 ? (step & 1) << 16 : (step % 4096) | (k & 1 ? 0x80000000u : 0);
        uint64_t key = k == 7 ? guesses[r % 4] : 0xC011;
        uint64_t off = (uint64_t)(step % (span / PIECE)) * PIECE;
        /* messages first: a write with a wrong key makes the target drop the connection,
         * and what follows it on that connection is lost with it */
        POST(fi_senddata(ep, junk, 0, NULL, note, addr[t], NULL), 1);
        POST(fi_injectdata(ep, junk, 0, note, addr[t]), 0);
        if (k == 0) POST(fi_send(ep, junk, 1, NULL, addr[t], NULL), 1);
        POST(fi_writedata(ep, junk, PIECE, NULL, note, addr[t], off, key, NULL), 1);
      }
    }
  }
  printf("stranger: posted %ld (%ld more refused), %ld completed, %ld failed\n", posted, refused_posts, done,
         failed);
  fflush(stdout);
  /* closing under writes still in flight is the provider's business: exit without fi_close */
  return 0;
}
