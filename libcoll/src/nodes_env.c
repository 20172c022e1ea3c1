/*
 * nodes_env.c - the variables coll_job_create reads, as the Python package reads them
 * (hbmcoll/launch/env.py for who this rank is, hbmcoll/layout.py for where the nodes meet):
 *
 *   rank, size, local rank, local size: the first launcher whose marker is set, from the closest
 *     wrapper outwards: hbmcoll-run (HBMCOLL_RANK, HBMCOLL_SIZE, HBMCOLL_LOCAL_RANK,
 *     HBMCOLL_LOCAL_SIZE), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), MPICH hydra
 *     (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), Open MPI (OMPI_COMM_WORLD_RANK,
 *     _SIZE, _LOCAL_RANK, _LOCAL_SIZE), Slurm srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS or
 *     SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE with
 *     SLURM_NODEID); else a single process. Once a launcher is picked its other variables must be
 *     there and agree.
 *   HBMCOLL_JOB_KEY: the job's secret, needed by C programs (the Python package can draw one
 *     through torchrun's store or a private directory; C has neither).
 *   across nodes: HBMCOLL_MASTER, else MASTER_ADDR, else under srun the step's first node (an IPv6
 *     address, also in brackets, or a name with only IPv6 addresses makes the job's family IPv6); port
 *     HBMCOLL_PORTS's first (then FI_TCP_PORT_LOW_RANGE/HIGH_RANGE confine the bridge to the
 *     range's part from LO + 256, unless set), else HBMCOLL_PORT, else MASTER_PORT + 1, else
 *     29600; HBMCOLL_IFACE, else the interface toward the master; HBMCOLL_NODE, else the hostname.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nodes.h"

#define ENV_PORTS_MIN 512
#define ENV_PORTS_BRIDGE 256

static int env_int(const char *name, int *out, char *err, size_t errlen) {
  const char *s = getenv(name);
  char *end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (s == NULL || !*s || *end || v < -1 || v > (1L << 30)) {
    snprintf(err, errlen, "%s=%s%s%s is not an integer", name, s ? "'" : "", s ? s : "None", s ? "'" : "");
    return COLL_EBADARG;
  }
  *out = (int)v;
  return 0;
}

/* launcher with its four names (rank, size, local rank, local size): all must be set */
static int env_four(const char *launcher, const char *const names[4], int *v, char *err, size_t errlen) {
  char missing[160] = "", present[160] = "";
  for (int i = 0; i < 4; i++) {
    char *list = getenv(names[i]) ? present : missing;
    size_t used = strlen(list);
    snprintf(list + used, 160 - used, "%s%s", used ? ", " : "", names[i]);
  }
  if (missing[0]) {
    snprintf(err, errlen, "%s environment is incomplete: %s set but %s missing", launcher, present, missing);
    return COLL_EBADARG;
  }
  for (int i = 0; i < 4; i++)
    if (env_int(names[i], &v[i], err, errlen)) return COLL_EBADARG;
  return 0;
}

/* Slurm's compressed task counts ("2(x3),1"): the count of node `node`. */
static int env_slurm_count(const char *spec, int node, int *out) {
  int at = 0;
  for (const char *p = spec; *p;) {
    char *end;
    long c = strtol(p, &end, 10), times = 1;
    if (end == p) return -1;
    if (strncmp(end, "(x", 2) == 0) {
      times = strtol(end + 2, &end, 10);
      if (*end++ != ')') return -1;
    }
    if (node >= at && node < at + times) return *out = (int)c, 0;
    at += (int)times;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return -1;
}

static int env_who(coll__job_env_t *e, char *err, size_t errlen) {
  int v[4] = {0, 1, 0, 1}, rc = 0;
  const char *step = getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : getenv("SLURM_STEPID");
  int srun = getenv("SLURM_PROCID") && step && strtoul(step, NULL, 10) < 0xFFFFFFF0ul && *step >= '0' && *step <= '9';
  if (getenv("HBMCOLL_RANK")) {
    static const char *const n[4] = {"HBMCOLL_RANK", "HBMCOLL_SIZE", "HBMCOLL_LOCAL_RANK", "HBMCOLL_LOCAL_SIZE"};
    e->launcher = "hbmcoll-run", rc = env_four(e->launcher, n, v, err, errlen);
  } else if (getenv("RANK") || getenv("WORLD_SIZE")) {
    static const char *const n[4] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    e->launcher = "torchrun";
    if (getenv("LOCAL_RANK") || getenv("LOCAL_WORLD_SIZE")) rc = env_four(e->launcher, n, v, err, errlen);
    else if ((rc = env_int("RANK", &v[0], err, errlen)) == 0 && (rc = env_int("WORLD_SIZE", &v[1], err, errlen)) == 0)
      v[2] = v[0], v[3] = v[1]; /* torch.multiprocessing.spawn style: one node */
  } else if (getenv("PMI_RANK") && (getenv("MPI_LOCALRANKID") || !srun)) {
    static const char *const n[4] = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
    e->launcher = "mpiexec", rc = env_four("MPICH hydra", n, v, err, errlen);
  } else if (getenv("OMPI_COMM_WORLD_RANK")) {
    static const char *const n[4] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE"};
    e->launcher = "mpiexec", rc = env_four("Open MPI", n, v, err, errlen);
  } else if (srun) {
    const char *size_var = getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    const char *per_var = getenv("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    int node = 0;
    e->launcher = "srun";
    rc = env_int("SLURM_PROCID", &v[0], err, errlen);
    if (rc == 0) rc = env_int(size_var, &v[1], err, errlen);
    if (rc == 0) rc = env_int("SLURM_LOCALID", &v[2], err, errlen);
    if (rc == 0 && getenv("SLURM_NODEID")) rc = env_int("SLURM_NODEID", &node, err, errlen);
    if (rc == 0 && (getenv(per_var) == NULL || env_slurm_count(getenv(per_var), node, &v[3]) != 0))
      snprintf(err, errlen, "%s=%s is not a Slurm task count list like '2(x3),1'", per_var,
               getenv(per_var) ? getenv(per_var) : "None"), rc = COLL_EBADARG;
  } else {
    e->launcher = "single";
  }
  if (rc) return rc;
  e->rank = v[0], e->size = v[1], e->local_rank = v[2], e->local_size = v[3];
  if (e->size < 1 || e->local_size < 1 || e->local_size > e->size || e->rank < 0 || e->rank >= e->size ||
      e->local_rank < 0 || e->local_rank >= e->local_size) {
    snprintf(err, errlen, "%s: rank %d of %d, local rank %d of %d do not add up", e->launcher, e->rank, e->size,
             e->local_rank, e->local_size);
    return COLL_EBADARG;
  }
  return 0;
}

/* An address of family on interface name (ifa NULL: any interface) equal to want (NULL: any),
 * never a link-local IPv6 one; the interface's name into name_p, the address as text into out. */
static int env_find(const char *name, int family, const struct sockaddr *want, char *name_p, size_t nlen,
                    char *out, size_t len) {
  struct ifaddrs *all = NULL;
  int found = 0;
  if (getifaddrs(&all) != 0) return 0;
  for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != family || (name && strcmp(i->ifa_name, name) != 0)) continue;
    const void *a = family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                      : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
    size_t alen = family == AF_INET ? sizeof(struct in_addr) : sizeof(struct in6_addr);
    if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a)) continue;
    if (want) {
      const void *w = family == AF_INET ? (const void *)&((const struct sockaddr_in *)want)->sin_addr
                                        : (const void *)&((const struct sockaddr_in6 *)want)->sin6_addr;
      if (memcmp(a, w, alen) != 0) continue;
    }
    found = 1;
    if (name_p) snprintf(name_p, nlen, "%s", i->ifa_name);
    if (out) inet_ntop(family, a, out, (socklen_t)len);
  }
  freeifaddrs(all);
  return found;
}

void coll__iface_address(const char *name, int family, char *out, size_t len) {
  out[0] = '\0';
  if (name) env_find(name, family == AF_INET6 ? AF_INET6 : AF_INET, NULL, NULL, 0, out, len);
}

int coll__addr_resolve(const char *addr, int port, struct sockaddr_storage *sa_p, socklen_t *len_p) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL, *pick = NULL;
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  int rc = getaddrinfo(addr, service, &hints, &res);
  if (rc != 0) return rc;
  for (struct addrinfo *r = res; r; r = r->ai_next)
    if ((r->ai_family == AF_INET || r->ai_family == AF_INET6) && (!pick || (pick->ai_family == AF_INET6 &&
                                                                            r->ai_family == AF_INET)))
      pick = r;
  if (pick) {
    memcpy(sa_p, pick->ai_addr, pick->ai_addrlen);
    *len_p = pick->ai_addrlen;
  }
  freeaddrinfo(res);
  return pick ? 0 : EAI_FAMILY;
}

void coll__addr_join(const char *addr, int port, char *out, size_t len) {
  if (strchr(addr, ':')) snprintf(out, len, "[%s]:%d", addr, port);
  else snprintf(out, len, "%s:%d", addr, port);
}

/* The interface whose address this host uses to reach addr (of addr's family). */
static int env_iface_to(const char *addr, int family, char *out, size_t len, char *err, size_t errlen) {
  struct sockaddr_storage to, mine;
  socklen_t tl = sizeof to, ml = sizeof mine;
  int fd = -1, ok = coll__addr_resolve(addr, 9, &to, &tl) == 0;
  if (ok) ok = (fd = socket(to.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)) >= 0;
  if (ok) ok = connect(fd, (struct sockaddr *)&to, tl) == 0 && getsockname(fd, (struct sockaddr *)&mine, &ml) == 0;
  int sys = errno;
  if (fd >= 0) close(fd);
  if (!ok) {
    snprintf(err, errlen, "no route from this node to the rendezvous at %s (%s); check MASTER_ADDR / HBMCOLL_MASTER, "
             "or set HBMCOLL_IFACE", addr, strerror(sys));
    return COLL_EBADARG;
  }
  out[0] = '\0';
  if (env_find(NULL, family, (struct sockaddr *)&mine, out, len, NULL, 0)) return 0;
  char a[INET6_ADDRSTRLEN] = "";
  inet_ntop(family, family == AF_INET ? (void *)&((struct sockaddr_in *)&mine)->sin_addr
                                      : (void *)&((struct sockaddr_in6 *)&mine)->sin6_addr, a, sizeof a);
  snprintf(err, errlen, "no interface of this host has the address %s it reaches %s from; set HBMCOLL_IFACE", a, addr);
  return COLL_EBADARG;
}

static int env_meeting_point(coll__job_env_t *e, char *err, size_t errlen) {
  const char *addr = getenv("HBMCOLL_MASTER") && *getenv("HBMCOLL_MASTER") ? getenv("HBMCOLL_MASTER") : getenv("MASTER_ADDR");
  const char *list = getenv("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST") : getenv("SLURM_JOB_NODELIST");
  if ((addr == NULL || !*addr) && strcmp(e->launcher, "srun") == 0 && list) { /* 'kn[03-05,9],gpu1' -> 'kn03' */
    size_t head = strcspn(list, ",[");
    snprintf(e->addr, sizeof e->addr, "%.*s", (int)head, list);
    if (list[head] == '[') snprintf(e->addr + head, sizeof e->addr - head, "%.*s", (int)strcspn(list + head + 1, "-,]"),
                                    list + head + 1);
  } else if (addr && *addr) { /* "[v6]" as "v6" */
    size_t n = strlen(addr);
    if (addr[0] == '[' && addr[n - 1] == ']') snprintf(e->addr, sizeof e->addr, "%.*s", (int)(n - 2), addr + 1);
    else snprintf(e->addr, sizeof e->addr, "%s", addr);
  } else {
    snprintf(err, errlen, "the job's ranks span several nodes (%s); say where the nodes meet: set MASTER_ADDR (or "
             "HBMCOLL_MASTER) to the address of rank 0's node on every node", e->launcher);
    return COLL_EBADARG;
  }
  const char *ports = getenv("HBMCOLL_PORTS"), *port = getenv("HBMCOLL_PORT"), *master = getenv("MASTER_PORT");
  if (ports && *ports && port && *port) {
    snprintf(err, errlen, "HBMCOLL_PORTS and HBMCOLL_PORT are both set: the range's first port is the rendezvous' "
             "(HBMCOLL_PORTS alone, or HBMCOLL_PORT alone)");
    return COLL_EBADARG;
  }
  int lo = 0, hi = 0, n = 0;
  char *end = NULL;
  if (ports && *ports) {
    if (sscanf(ports, " %d - %d %n", &lo, &hi, &n) != 2 || ports[n] || lo < 1024 || hi > 65535 ||
        hi - lo + 1 < ENV_PORTS_MIN) {
      snprintf(err, errlen, "HBMCOLL_PORTS='%s': give a range LO-HI of at least %d ports within 1024-65535, e.g. "
               "30000-30999 (rings from LO, memory servers from LO+64, point-to-point from LO+128, the bridge's "
               "endpoints from LO+256)", ports, ENV_PORTS_MIN);
      return COLL_EBADARG;
    }
    char v[16];
    e->port = lo;
    snprintf(v, sizeof v, "%d", lo + ENV_PORTS_BRIDGE);
    if (!getenv("FI_TCP_PORT_LOW_RANGE") && !getenv("FI_TCP_PORT_HIGH_RANGE")) { /* before libfabric loads */
      setenv("FI_TCP_PORT_LOW_RANGE", v, 0);
      snprintf(v, sizeof v, "%d", hi);
      setenv("FI_TCP_PORT_HIGH_RANGE", v, 0);
    }
  } else if (port && *port) {
    e->port = (int)strtol(port, &end, 10);
    if (*end) e->port = -1;
  } else if (master && *master) {
    e->port = (int)strtol(master, &end, 10) + 1;
    if (*end) e->port = -1;
  } else {
    e->port = 29600;
  }
  if (e->port <= 0 || e->port >= 65536 - 256) {
    snprintf(err, errlen, "HBMCOLL_PORT=%s / MASTER_PORT=%s: give a TCP port number below 65280 (the nodes' base port "
             "is HBMCOLL_PORT, else MASTER_PORT + 1)", port ? port : "None", master ? master : "None");
    return COLL_EBADARG;
  }
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  e->family = coll__addr_resolve(e->addr, e->port, &sa, &sl) == 0 ? sa.ss_family : AF_INET; /* else: connect says */
  const char *iface = getenv("HBMCOLL_IFACE");
  if (iface && *iface) snprintf(e->iface, sizeof e->iface, "%s", iface);
  else if (env_iface_to(e->addr, e->family, e->iface, sizeof e->iface, err, errlen) != 0) return COLL_EBADARG;
  const char *name = getenv("HBMCOLL_NODE");
  if (name && *name) snprintf(e->name, sizeof e->name, "%s", name);
  else if (gethostname(e->name, sizeof e->name - 1) != 0) snprintf(e->name, sizeof e->name, "unknown");
  return 0;
}

int coll__job_env(coll__job_env_t *e, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  int rc = env_who(e, err, errlen);
  if (rc) return rc;
  const char *key = getenv("HBMCOLL_JOB_KEY");
  if (key && strlen(key) >= sizeof e->key) {
    snprintf(err, errlen, "HBMCOLL_JOB_KEY is longer than %zu characters", sizeof e->key - 1);
    return COLL_EBADARG;
  }
  if ((key == NULL || !*key) && e->size > 1) {
    snprintf(err, errlen, "a job's ranks started from C meet under a secret they share: set HBMCOLL_JOB_KEY to the "
             "same random string on every rank (hbmcoll-run sets one; across nodes e.g. `openssl rand -hex 16`)");
    return COLL_EBADARG;
  }
  snprintf(e->key, sizeof e->key, "%s", key ? key : "");
  return e->size == e->local_size ? 0 : env_meeting_point(e, err, errlen);
}
