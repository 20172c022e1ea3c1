/*
 * param.c - every HBMCOLL_* variable libcoll reads, parsed in one place.
 *
 *   HBMCOLL_TIMEOUT      seconds any wait may last before -ETIMEDOUT (default: no limit;
 *                        dead peers are caught by watching their processes, not by this)
 *   HBMCOLL_STALL_WARN   seconds of waiting before the first stall warning, which repeats
 *                        with doubling gaps; "off" for none (default 60)
 *   HBMCOLL_SLOT_BYTES   staging bytes per rank and parity (default 256 KiB)
 *   HBMCOLL_ARENA_BYTES  zero-copy arena per rank, virtual (default 1 GiB)
 *   HBMCOLL_SMALL_MAX    allreduce: copy-in "flat" up to here, "rsag" above (default 16 KiB;
 *                        the creating rank's value holds for all;
 *                        2 ranks with private buffers: flat at every size)
 *   HBMCOLL_STREAM_MIN   from this size, results are written with streaming stores: an
 *                        allreduce's output apart from its input, bcast's and gather's
 *                        outputs (default: half the largest CPU cache; python -m hbmcoll.tune
 *                        measures it; the creating rank's value holds for all)
 *   HBMCOLL_PUSH_MIN     allreduce with every buffer in the arena: from this size each rank
 *                        reduces its slice and writes it into every output ("push"; default
 *                        0: every size past the one-round copy; python -m hbmcoll.tune measures
 *                        it; the creating rank's value holds for all)
 *   HBMCOLL_PUSH_STREAM_MIN  a push writes with streaming stores from this size (default: half
 *                        the largest CPU cache; measured by the tune; the creator's holds)
 *   HBMCOLL_SPIN         spin iterations before yielding (default: automatic)
 *   HBMCOLL_ALGO         forced algorithms, e.g. "allreduce=rsag,bcast=flat"; "tree" for
 *                        small barrier/bcast/gather/reduce/allreduce (algo_tree.c; the
 *                        default above COLL_TREE_FANOUT ranks with a CPU each, "flat"
 *                        turns it off)
 *   HBMCOLL_CMA          1: single copy between private buffers where the kernel allows it,
 *                        for large bcast and gather; "gather" or "bcast": for that one only;
 *                        "auto" (the default): gather unless staging measured clearly
 *                        faster at creation (cma_probe.c); 0: never (python -m hbmcoll.tune
 *                        measures which pays; the creating rank's word holds for all, if every
 *                        rank allows it)
 *   HBMCOLL_CMA_MIN      bcast/gather: single copy from this size (default 256 KiB; the
 *                        creating rank's value holds for all)
 *   Every byte count above also takes "auto": its default.
 *   HBMCOLL_P2P_CELLS    point-to-point cells (4 KiB each) per ordered pair of ranks (default 8,
 *                        at least 2; p2p.h; the creating rank's value holds for all)
 *   HBMCOLL_P2P_CMA      0: point-to-point never pulls a large message straight from the
 *                        sender's memory, it goes through the cells (default 1: where the
 *                        kernel allows it)
 *   HBMCOLL_STAGE_STREAM_MIN  chunks staged for a peer (a slot it reads) are written with
 *                        streaming stores from this size; "off" for never (default "auto":
 *                        measured when the communicator is made, stage_probe.c; the
 *                        creating rank's "auto" holds for all)
 *   HBMCOLL_REP_MOVSB_MIN  copies of this many bytes and more use `rep movsb` instead of
 *                        memcpy (default 1 MiB on AMD Zen 5 and later, else off; "off"
 *                        leaves them all to memcpy; stream_copy.c)
 * A malformed value fails communicator creation with COLL_EBADARG and a
 * sentence naming the variable and the values it takes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coll_internal.h"

static const char *const param_algos[COLL_KIND_COUNT][4] = {
    [COLL_BARRIER] = {"flat", "tree", NULL},
    [COLL_BCAST] = {"flat", "arena", "tree", NULL},
    [COLL_GATHER] = {"flat", "tree", NULL},
    [COLL_SCATTER] = {"flat", NULL},
    [COLL_ALLGATHER] = {"flat", NULL},
    [COLL_REDUCE] = {"flat", "rsag", "tree", NULL},
    [COLL_ALLREDUCE] = {"flat", "rsag", "tree", NULL},
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
  for (int i = 0; i < 4 && param_algos[kind][i]; i++)
    if (strcmp(param_algos[kind][i], name) == 0) return i + 1;
  return COLL_EBADARG;
}

/* Each parser returns 0 (unset or empty: the default), or COLL_EBADARG with
 * a sentence naming the variable, its value and what it takes. */
static int param_bad(char *err, size_t errlen, const char *name, const char *value,
                     const char *takes) {
  snprintf(err, errlen, "%s='%s' is not valid: %s", name, value, takes);
  return COLL_EBADARG;
}

/* Seconds > 0 and finite; `off_word` (or NULL) means 0: none. */
static int param_seconds(const char *name, double dflt, const char *off_word, double *v_p,
                         char *err, size_t errlen) {
  const char *s = getenv(name);
  *v_p = dflt;
  if (s == NULL || *s == '\0') return 0;
  if (off_word && strcasecmp(s, off_word) == 0) {
    *v_p = 0;
    return 0;
  }
  char *end;
  double v = strtod(s, &end);
  if (*end != '\0' || !(v > 0) || v > 1e9) /* !(v > 0): NaN too */
    return param_bad(err, errlen, name, s,
                     off_word ? "give a number of seconds > 0, or 'off'"
                              : "give a number of seconds > 0 (unset: no limit)");
  *v_p = v;
  return 0;
}

/* A byte count with an optional K/M/G suffix, at least min; "auto": the default. */
static int param_size(const char *name, size_t dflt, size_t min, size_t *v_p, char *err,
                      size_t errlen) {
  const char *s = getenv(name);
  *v_p = dflt;
  if (s == NULL || *s == '\0' || strcasecmp(s, "auto") == 0) return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = 0;
  if (*end == 'k' || *end == 'K') shift = 10, end++;
  else if (*end == 'm' || *end == 'M') shift = 20, end++;
  else if (*end == 'g' || *end == 'G') shift = 30, end++;
  if (end == s || *end != '\0' || s[0] == '-' || errno == ERANGE || v > (SIZE_MAX >> shift) ||
      (v << shift) < min) {
    char takes[96];
    snprintf(takes, sizeof takes,
             "give a byte count such as 65536, 256K or 1M, at least %zu, or 'auto'", min);
    return param_bad(err, errlen, name, s, takes);
  }
  *v_p = (size_t)(v << shift);
  return 0;
}

/* A count of things (not bytes: no K/M/G): from min to max, or "auto" for dflt. */
static int param_count(const char *name, size_t dflt, size_t min, size_t max, const char *things,
                       size_t *v_p, char *err, size_t errlen) {
  const char *s = getenv(name);
  *v_p = dflt;
  if (s == NULL || *s == '\0' || strcasecmp(s, "auto") == 0) return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || *end != '\0' || s[0] == '-' || errno == ERANGE || v < min || v > max) {
    char takes[96];
    snprintf(takes, sizeof takes, "give a number of %s from %zu to %zu, or 'auto' (%zu)", things, min, max,
             dflt);
    return param_bad(err, errlen, name, s, takes);
  }
  *v_p = (size_t)v;
  return 0;
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

/* "kind=name,kind=name" */
static int param_algo_list(coll__params_t *p, char *err, size_t errlen) {
  const char *s = getenv("HBMCOLL_ALGO");
  if (s == NULL || *s == '\0') return 0;
  char buf[256];
  if (strlen(s) >= sizeof buf)
    return param_bad(err, errlen, "HBMCOLL_ALGO", "...", "at most 255 characters");
  strcpy(buf, s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    int k = COLL_KIND_COUNT, id = COLL_EBADARG;
    if (eq != NULL) {
      *eq = '\0';
      for (k = 0; k < COLL_KIND_COUNT && strcmp(tok, param_kinds[k]) != 0; k++) {}
      if (k < COLL_KIND_COUNT) id = coll__algo_id((coll_kind_t)k, eq + 1);
    }
    if (id < 0)
      return param_bad(err, errlen, "HBMCOLL_ALGO", s,
                       "give collective=algorithm pairs such as allreduce=rsag,bcast=flat "
                       "(algorithms: flat; allreduce and reduce also rsag; bcast also arena; barrier, "
                       "bcast, gather, reduce and allreduce also tree)");
    p->algo[k] = id;
  }
  return 0;
}

/* A word among `words` (NULL-terminated); *index_p gets its position. */
static int param_word(const char *name, const char *const *words, int dflt, int *index_p,
                      char *err, size_t errlen) {
  const char *s = getenv(name);
  *index_p = dflt;
  if (s == NULL || *s == '\0') return 0;
  for (int i = 0; words[i]; i++)
    if (strcasecmp(s, words[i]) == 0) {
      *index_p = i;
      return 0;
    }
  char takes[128] = "one of";
  for (int i = 0; words[i]; i++)
    snprintf(takes + strlen(takes), sizeof takes - strlen(takes), "%s %s", i ? "," : "", words[i]);
  return param_bad(err, errlen, name, s, takes);
}

int coll__params_load(coll__params_t *p, char *err, size_t errlen) {
  static const char *const cma_words[] = {"0", "1", "gather", "bcast", "auto", NULL};
  memset(p, 0, sizeof *p);
  int rc = param_seconds("HBMCOLL_TIMEOUT", 0, NULL, &p->timeout_s, err, errlen);
  if (rc == 0) rc = param_seconds("HBMCOLL_STALL_WARN", 60, "off", &p->stall_warn_s, err, errlen);
  if (rc == 0) rc = param_size("HBMCOLL_SLOT_BYTES", 256 << 10, 4096, &p->slot_bytes, err, errlen);
  p->slot_bytes &= ~(size_t)4095;
  if (rc == 0)
    rc = param_size("HBMCOLL_ARENA_BYTES", (size_t)1 << 30, 0, &p->arena_bytes, err, errlen);
  p->arena_bytes &= ~(size_t)4095;
  if (rc == 0) rc = param_size("HBMCOLL_SMALL_MAX", 16 << 10, 0, &p->small_max, err, errlen);
  /* half the last-level cache: from there a message and its result cannot both stay
   * cached, so streaming stores cost nothing even when the caller's data was warm; but on a
   * VM that cache is shared with other tenants, and the tune measures a lower one
   * (bench/README.md has the measurements) */
  size_t half_llc = param_llc_bytes() / 2; /* read from sysfs once */
  if (rc == 0) rc = param_size("HBMCOLL_STREAM_MIN", half_llc, 0, &p->stream_min, err, errlen);
  /* push reads each input once and writes each output once, where rsag's zero copy also
   * copies every peer's slice out; it won at every size tried on both hosts measured, quiet,
   * loaded and oversubscribed (bench/README.md, "Push from the smallest size") */
  if (rc == 0) rc = param_size("HBMCOLL_PUSH_MIN", 0, 0, &p->push_min, err, errlen);
  if (rc == 0)
    rc = param_size("HBMCOLL_PUSH_STREAM_MIN", half_llc, 0, &p->push_stream_min, err, errlen);
  p->spin_iters = -1;
  const char *spin = getenv("HBMCOLL_SPIN");
  if (rc == 0 && spin && *spin && strcasecmp(spin, "auto") != 0) {
    char *end;
    long v = strtol(spin, &end, 10);
    if (*end != '\0' || end == spin || v < 0)
      rc = param_bad(err, errlen, "HBMCOLL_SPIN", spin,
                     "give a number of spin iterations >= 0, or 'auto'");
    p->spin_iters = v;
  }
  const char *chunks = getenv("HBMCOLL_PIPELINE_CHUNKS");
  if (rc == 0 && chunks && *chunks) { /* the allreduce across nodes (hier_allreduce.c) */
    char *end;
    long v = strtol(chunks, &end, 10);
    if (*end != '\0' || chunks[0] < '0' || chunks[0] > '9' || v < 1 || v > 255)
      rc = param_bad(err, errlen, "HBMCOLL_PIPELINE_CHUNKS", chunks,
                     "give a chunk count from 1 to 255, or unset to choose by measurement");
    p->pipeline_chunks = (int)v;
  }
  if (rc == 0) rc = param_algo_list(p, err, errlen);
  if (rc == 0) rc = param_word("HBMCOLL_CMA", cma_words, COLL_CMA_AUTO, &p->cma, err, errlen);
  if (rc == 0) rc = param_size("HBMCOLL_CMA_MIN", 256 << 10, 0, &p->cma_min, err, errlen);
  static const char *const onoff[] = {"0", "1", NULL};
  if (rc == 0) rc = param_count("HBMCOLL_P2P_CELLS", 8, 2, 4096, "cells", &p->p2p_cells, err, errlen);
  if (rc == 0) rc = param_word("HBMCOLL_P2P_CMA", onoff, 1, &p->p2p_cma, err, errlen);
  const char *rep = getenv("HBMCOLL_REP_MOVSB_MIN");
  if (rc == 0 && rep && strcasecmp(rep, "off") == 0)
    p->rep_movsb_min = SIZE_MAX;
  else if (rc == 0)
    rc = param_size("HBMCOLL_REP_MOVSB_MIN",
                    coll__cpu_rep_movsb_fast() ? (size_t)1 << 20 : SIZE_MAX, 0,
                    &p->rep_movsb_min, err, errlen);
  const char *stage = getenv("HBMCOLL_STAGE_STREAM_MIN");
  p->stage_stream_auto = !stage || !*stage || strcasecmp(stage, "auto") == 0;
  if (rc == 0 && stage && strcasecmp(stage, "off") == 0)
    p->stage_stream_min = SIZE_MAX;
  else if (rc == 0)
    rc = param_size("HBMCOLL_STAGE_STREAM_MIN", SIZE_MAX, 0, &p->stage_stream_min, err, errlen);
  if (p->stage_stream_min == 0) p->stage_stream_min = 1; /* the same copies; 0 says "none" to callers */
  return rc;
}

int coll_env_check(double *timeout_s_p, char *text, size_t text_len) {
  coll__params_t p;
  char err[COLL_TEXT_MAX] = "";
  int rc = coll__params_load(&p, err, sizeof err);
  if (rc) {
    if (text && text_len) snprintf(text, text_len, "%s", err);
    return rc;
  }
  if (timeout_s_p) *timeout_s_p = p.timeout_s;
  return 0;
}

int coll_set_algorithm(coll_comm_t *comm, coll_kind_t kind, const char *name) {
  if (comm == NULL || (unsigned)kind >= COLL_KIND_COUNT) return COLL_EBADARG;
  comm = coll__comm_here(comm); /* across nodes: the node stages' algorithms */
  if (name == NULL || strcmp(name, "auto") == 0) {
    comm->params.algo[kind] = 0;
    return 0;
  }
  int id = coll__algo_id(kind, name);
  if (id < 0) return id;
  comm->params.algo[kind] = id;
  return 0;
}
