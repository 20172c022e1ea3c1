/*
 * param.c - every HBMCOLL_* variable libcoll reads, parsed in one place.
 *
 *   HBMCOLL_TIMEOUT      seconds any wait may last (default 60)
 *   HBMCOLL_SLOT_BYTES   staging bytes per rank and parity (default 256 KiB)
 *   HBMCOLL_ARENA_BYTES  zero-copy arena per rank, virtual (default 1 GiB)
 *   HBMCOLL_SMALL_MAX    allreduce: copy-in "flat" up to here, "rsag" above (default 16 KiB;
 *                        2 ranks with private buffers: flat up to HBMCOLL_STREAM_MIN)
 *   HBMCOLL_STREAM_MIN   allreduce with every buffer in the arena: from this size each rank
 *                        writes its reduced slice into every output with streaming stores
 *                        and gather/bcast write large outputs so (default: half the
 *                        largest CPU cache; the creating rank's value holds for all)
 *   HBMCOLL_SPIN         spin iterations before yielding (default: automatic)
 *   HBMCOLL_ALGO         forced algorithms, e.g. "allreduce=rsag,bcast=flat"
 *   HBMCOLL_CMA          1: single copy between private buffers where the kernel allows it
 *                        (cma.c; default 0: staging was faster on the machines we measured)
 *   HBMCOLL_CMA_MIN      bcast/gather: single copy from this size (default 256 KiB)
 *   HBMCOLL_REP_MOVSB_MIN  copies of this many bytes and more use `rep movsb` instead of
 *                        memcpy (default 1 MiB on AMD Zen 5 and later, else off; "off"
 *                        leaves them all to memcpy; stream_copy.c)
 * Malformed values are ignored in favour of the default; the Python layer
 * validates and reports them (hbmcoll.topology()).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

static const char *const param_algos[COLL_KIND_COUNT][3] = {
    [COLL_BARRIER] = {"flat", NULL},
    [COLL_BCAST] = {"flat", "arena", NULL},
    [COLL_GATHER] = {"flat", NULL},
    [COLL_SCATTER] = {"flat", NULL},
    [COLL_ALLGATHER] = {"flat", NULL},
    [COLL_REDUCE] = {"flat", "rsag", NULL},
    [COLL_ALLREDUCE] = {"flat", "rsag", NULL},
    [COLL_REDUCE_SCATTER] = {"flat", NULL},
    [COLL_ALLTOALL] = {"flat", NULL},
};

static const char *const param_kinds[COLL_KIND_COUNT] = {
    "barrier", "bcast", "gather", "scatter", "allgather",
    "reduce", "allreduce", "reduce_scatter", "alltoall"};

const char *coll_kind_name(coll_kind_t kind) {
  return (unsigned)kind < COLL_KIND_COUNT ? param_kinds[kind] : "unknown";
}

int coll__algo_id(coll_kind_t kind, const char *name) {
  if ((unsigned)kind >= COLL_KIND_COUNT || name == NULL) return COLL_EBADARG;
  for (int i = 0; i < 3 && param_algos[kind][i]; i++)
    if (strcmp(param_algos[kind][i], name) == 0) return i + 1;
  return COLL_EBADARG;
}

static double param_double(const char *name, double dflt) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return dflt;
  char *end;
  double v = strtod(s, &end);
  return (*end == '\0' && v > 0) ? v : dflt;
}

static size_t param_size(const char *name, size_t dflt, size_t min) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return dflt;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end == 'k' || *end == 'K') v <<= 10, end++;
  else if (*end == 'm' || *end == 'M') v <<= 20, end++;
  else if (*end == 'g' || *end == 'G') v <<= 30, end++;
  return (*end == '\0' && v >= min) ? (size_t)v : dflt;
}

/* The largest cache of CPU 0 (sysfs), or 32 MiB if it cannot be read. */
static size_t param_llc_bytes(void) {
  size_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    unsigned long v = 0;
    char unit = 0;
    if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
      size_t bytes = unit == 'K' ? (size_t)v << 10 : unit == 'M' ? (size_t)v << 20 : (size_t)v;
      if (bytes > best) best = bytes;
    }
    fclose(f);
  }
  return best ? best : (size_t)32 << 20;
}

static void param_algo_list(coll__params_t *p, const char *s) {
  /* "kind=name,kind=name" */
  char buf[256];
  if (s == NULL || strlen(s) >= sizeof buf) return;
  strcpy(buf, s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (eq == NULL) continue;
    *eq = '\0';
    for (int k = 0; k < COLL_KIND_COUNT; k++) {
      if (strcmp(tok, param_kinds[k]) != 0) continue;
      int id = coll__algo_id((coll_kind_t)k, eq + 1);
      if (id > 0) p->algo[k] = id;
    }
  }
}

void coll__params_load(coll__params_t *p) {
  memset(p, 0, sizeof *p);
  p->timeout_s = param_double("HBMCOLL_TIMEOUT", 60.0);
  p->slot_bytes = param_size("HBMCOLL_SLOT_BYTES", 256 << 10, 4096) & ~(size_t)4095;
  p->arena_bytes = param_size("HBMCOLL_ARENA_BYTES", (size_t)1 << 30, 0) & ~(size_t)4095;
  p->small_max = param_size("HBMCOLL_SMALL_MAX", 16 << 10, 0);
  /* half the last-level cache: from there a message and its result cannot
   * both stay cached, so streaming stores cost nothing even when the caller's
   * data was warm (2 ranks, 8 MiB warm: 348 -> 465 us; 16 MiB: even) */
  p->stream_min = param_size("HBMCOLL_STREAM_MIN", param_llc_bytes() / 2, 0);
  const char *spin = getenv("HBMCOLL_SPIN");
  p->spin_iters = (spin && *spin) ? strtol(spin, NULL, 10) : -1;
  param_algo_list(p, getenv("HBMCOLL_ALGO"));
  const char *cma = getenv("HBMCOLL_CMA");
  p->cma = cma && strcmp(cma, "1") == 0;
  p->cma_min = param_size("HBMCOLL_CMA_MIN", 256 << 10, 0);
  const char *rep = getenv("HBMCOLL_REP_MOVSB_MIN");
  p->rep_movsb_min = rep && strcasecmp(rep, "off") == 0 ? SIZE_MAX
                     : param_size("HBMCOLL_REP_MOVSB_MIN",
                                  coll__cpu_rep_movsb_fast() ? (size_t)1 << 20 : SIZE_MAX, 0);
}

int coll_set_algorithm(coll_comm_t *comm, coll_kind_t kind, const char *name) {
  if (comm == NULL || (unsigned)kind >= COLL_KIND_COUNT) return COLL_EBADARG;
  if (name == NULL || strcmp(name, "auto") == 0) {
    comm->params.algo[kind] = 0;
    return 0;
  }
  int id = coll__algo_id(kind, name);
  if (id < 0) return id;
  comm->params.algo[kind] = id;
  return 0;
}
