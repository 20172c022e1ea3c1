/*
 * discover.c - step 1: copy the facts the plan needs out of hwloc.
 *
 * Clusters: the smallest distinct localities (cpusets) of the NUMA nodes.
 * On KNL SNC-4 and Xeon Max SNC-4 each SNC domain is one; in quadrant/
 * all-to-all mode, or on a plain one-node box, the whole package is one. PUs
 * no node claims (rare) form one more cluster per package. Each core belongs
 * to the cluster holding its first PU. Clusters are sorted by package, then
 * by the logical index of their first core.
 *
 * Nothing here decides what is HBM: that is the plan's job. We record the
 * subtype and the hwloc Bandwidth attribute as seen from the node's own
 * locality.
 *
 * Memory-side caches: hwloc's MemCache objects (and KNL's L3 subtype
 * MemorySideCache). When hwloc shows none, the kernel's own description is
 * read as well: /sys/devices/system/node/nodeN/memory_side_cache (from the
 * ACPI HMAT), under the fsroot when one is used. hwloc 2.9 skips it on a KNL
 * CPU: its KNL quirk takes the modes from the SMBIOS dump (or guesses
 * MemoryMode=Flat without one) and creates no MemCache, so a hybrid KNL, or
 * a VM laid out like one, would look flat.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include <hwloc.h>

#include "numa_internal.h"

static int discover_errno(void) {
  return errno > 0 ? -errno : -EIO;
}

uint64_t coll__numa_node_free_now(unsigned os_index) {
  char path[96], line[256];
  snprintf(path, sizeof(path), "/sys/devices/system/node/node%u/meminfo", os_index);
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return 0;
  uint64_t kb = 0;
  while (fgets(line, sizeof(line), f) != NULL) {
    const char *p = strstr(line, "MemFree:");
    if (p != NULL) {
      kb = strtoull(p + strlen("MemFree:"), NULL, 10);
      break;
    }
  }
  fclose(f);
  return kb * 1024;
}

/* Bandwidth of `node` from its own locality (exact initiator first, else the
 * initiator that covers most of its cpuset). */
static uint64_t discover_bandwidth(hwloc_topology_t t, hwloc_obj_t node) {
  struct hwloc_location loc;
  hwloc_uint64_t v = 0;
  loc.type = HWLOC_LOCATION_TYPE_CPUSET;
  loc.location.cpuset = node->cpuset;
  if (hwloc_memattr_get_value(t, HWLOC_MEMATTR_ID_BANDWIDTH, node, &loc, 0, &v) == 0)
    return v;
  unsigned nr = 0;
  if (hwloc_memattr_get_initiators(t, HWLOC_MEMATTR_ID_BANDWIDTH, node, 0, &nr, NULL, NULL) != 0 ||
      nr == 0)
    return 0;
  struct hwloc_location *inits = calloc(nr, sizeof(*inits));
  hwloc_uint64_t *vals = calloc(nr, sizeof(*vals));
  uint64_t best = 0;
  int best_w = 0;
  if (inits != NULL && vals != NULL &&
      hwloc_memattr_get_initiators(t, HWLOC_MEMATTR_ID_BANDWIDTH, node, 0, &nr, inits, vals) == 0) {
    for (unsigned i = 0; i < nr; i++) {
      if (inits[i].type != HWLOC_LOCATION_TYPE_CPUSET)
        continue;
      hwloc_bitmap_t x = hwloc_bitmap_alloc();
      if (x == NULL)
        break;
      hwloc_bitmap_and(x, inits[i].location.cpuset, node->cpuset);
      int w = hwloc_bitmap_weight(x);
      hwloc_bitmap_free(x);
      if (w > best_w) {
        best_w = w;
        best = vals[i];
      }
    }
  }
  free(inits);
  free(vals);
  return best;
}

static int discover_package_of(hwloc_topology_t t, hwloc_const_cpuset_t set) {
  int first = hwloc_bitmap_first(set);
  if (first < 0)
    return -1;
  hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t, (unsigned)first);
  hwloc_obj_t pkg = pu ? hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, pu) : NULL;
  return pkg ? (int)pkg->logical_index : -1;
}

typedef struct {
  hwloc_bitmap_t set;
  int package;
  int first_core; /* logical index of its first core, for sorting */
} discover_cl_t;

static int discover_cl_cmp(const void *a, const void *b) {
  const discover_cl_t *x = a, *y = b;
  if (x->package != y->package)
    return x->package < y->package ? -1 : 1;
  return (x->first_core > y->first_core) - (x->first_core < y->first_core);
}

static int discover_node_cmp(const void *a, const void *b) {
  const coll_numa_node_t *x = a, *y = b;
  return (x->os_index > y->os_index) - (x->os_index < y->os_index);
}

/* The unit planned on: a Core, or a PU where hwloc has no cores. */
static hwloc_obj_type_t discover_core_type(hwloc_topology_t t) {
  return hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

static int discover_fill(hwloc_topology_t t, coll_numa_topo_t *topo) {
  hwloc_obj_t root = hwloc_get_root_obj(t);
  const char *s;
  if ((s = hwloc_obj_get_info_by_name(root, "MemoryMode")) != NULL)
    snprintf(topo->memory_mode, sizeof(topo->memory_mode), "%s", s);
  if ((s = hwloc_obj_get_info_by_name(root, "ClusterMode")) != NULL)
    snprintf(topo->cluster_mode, sizeof(topo->cluster_mode), "%s", s);
  topo->npackages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);

  /* memory-side caches: MemCache objects, and KNL's L3 "MemorySideCache" */
  for (hwloc_obj_t o = NULL; (o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_MEMCACHE, o)) != NULL;) {
    topo->nmemcaches++;
    topo->memcache_bytes += o->attr->cache.size;
  }
  for (hwloc_obj_t o = NULL; (o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_L3CACHE, o)) != NULL;) {
    if (o->subtype != NULL && strcmp(o->subtype, "MemorySideCache") == 0) {
      topo->nmemcaches++;
      topo->memcache_bytes += o->attr->cache.size;
    }
  }

  int nn = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  int ncores = hwloc_get_nbobjs_by_type(t, discover_core_type(t));
  if (nn <= 0 || ncores <= 0)
    return -EINVAL;

  /* clusters: minimal distinct non-empty node localities */
  discover_cl_t *cl = calloc((size_t)nn + (size_t)(topo->npackages > 0 ? topo->npackages : 1) + 1,
                             sizeof(*cl));
  int ncl = 0, rc = 0;
  if (cl == NULL)
    return -ENOMEM;
  for (int i = 0; i < nn; i++) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
    if (hwloc_bitmap_iszero(n->cpuset))
      continue;
    int keep = 1;
    for (int j = 0; j < nn && keep; j++) {
      hwloc_obj_t m = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)j);
      if (!hwloc_bitmap_iszero(m->cpuset) && hwloc_bitmap_isincluded(m->cpuset, n->cpuset) &&
          !hwloc_bitmap_isequal(m->cpuset, n->cpuset))
        keep = 0; /* a smaller locality exists inside */
    }
    for (int c = 0; c < ncl && keep; c++)
      if (hwloc_bitmap_isequal(cl[c].set, n->cpuset))
        keep = 0;
    if (!keep)
      continue;
    if ((cl[ncl].set = hwloc_bitmap_dup(n->cpuset)) == NULL) {
      rc = -ENOMEM;
      goto out_cl;
    }
    ncl++;
  }
  /* PUs of no cluster: one extra cluster per package */
  {
    hwloc_bitmap_t rest = hwloc_bitmap_dup(hwloc_topology_get_topology_cpuset(t));
    if (rest == NULL) {
      rc = -ENOMEM;
      goto out_cl;
    }
    for (int c = 0; c < ncl; c++)
      hwloc_bitmap_andnot(rest, rest, cl[c].set);
    while (!hwloc_bitmap_iszero(rest)) {
      int pkg = discover_package_of(t, rest);
      hwloc_obj_t p = pkg >= 0 ? hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, (unsigned)pkg) : NULL;
      cl[ncl].set = hwloc_bitmap_dup(rest);
      if (cl[ncl].set == NULL) {
        hwloc_bitmap_free(rest);
        rc = -ENOMEM;
        goto out_cl;
      }
      if (p != NULL)
        hwloc_bitmap_and(cl[ncl].set, cl[ncl].set, p->cpuset);
      hwloc_bitmap_andnot(rest, rest, cl[ncl].set);
      ncl++;
    }
    hwloc_bitmap_free(rest);
  }
  for (int c = 0; c < ncl; c++) {
    cl[c].package = discover_package_of(t, cl[c].set);
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t, (unsigned)hwloc_bitmap_first(cl[c].set));
    cl[c].first_core = pu ? (int)pu->logical_index : 0;
  }
  qsort(cl, (size_t)ncl, sizeof(*cl), discover_cl_cmp);

  topo->nclusters = ncl;
  topo->clusters = calloc((size_t)ncl, sizeof(*topo->clusters));
  topo->nnodes = nn;
  topo->nodes = calloc((size_t)nn, sizeof(*topo->nodes));
  if (topo->clusters == NULL || topo->nodes == NULL) {
    rc = -ENOMEM;
    goto out_cl;
  }

  /* cores into clusters */
  hwloc_obj_type_t ct = discover_core_type(t);
  for (int c = 0; c < ncl; c++) {
    coll_numa_cluster_t *k = &topo->clusters[c];
    k->package = cl[c].package;
    k->cores = calloc((size_t)ncores, sizeof(*k->cores));
    if (k->cores == NULL) {
      rc = -ENOMEM;
      goto out_cl;
    }
  }
  for (int i = 0; i < ncores; i++) {
    hwloc_obj_t co = hwloc_get_obj_by_type(t, ct, (unsigned)i);
    int first = hwloc_bitmap_first(co->cpuset);
    if (first < 0)
      continue;
    int c = 0;
    while (c < ncl && !hwloc_bitmap_isset(cl[c].set, (unsigned)first))
      c++;
    if (c == ncl)
      continue;
    coll_numa_cluster_t *k = &topo->clusters[c];
    coll_numa_core_t *core = &k->cores[k->ncores];
    int w = hwloc_bitmap_weight(co->cpuset);
    core->pus = calloc((size_t)(w > 0 ? w : 1), sizeof(unsigned));
    if (core->pus == NULL) {
      rc = -ENOMEM;
      goto out_cl;
    }
    hwloc_obj_t l2 = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_L2CACHE, co);
    core->tile = l2 != NULL ? hwloc_bitmap_first(l2->cpuset) : -1;
    for (hwloc_obj_t pu = hwloc_get_next_obj_inside_cpuset_by_type(t, co->cpuset, HWLOC_OBJ_PU, NULL);
         pu != NULL; pu = hwloc_get_next_obj_inside_cpuset_by_type(t, co->cpuset, HWLOC_OBJ_PU, pu))
      core->pus[core->npus++] = pu->os_index;
    k->ncores++;
  }

  /* nodes */
  for (int i = 0; i < nn; i++) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
    coll_numa_node_t *d = &topo->nodes[i];
    d->os_index = n->os_index;
    d->size = n->attr->numanode.local_memory;
    d->free = topo->thissystem ? coll__numa_node_free_now(n->os_index) : 0;
    d->bandwidth = discover_bandwidth(t, n);
    if (n->subtype != NULL)
      snprintf(d->subtype, sizeof(d->subtype), "%s", n->subtype);
    d->package = discover_package_of(t, n->cpuset);
    for (hwloc_obj_t p = n->parent; p != NULL; p = p->parent)
      if (p->type == HWLOC_OBJ_MEMCACHE ||
          (p->type == HWLOC_OBJ_L3CACHE && p->subtype && !strcmp(p->subtype, "MemorySideCache")))
        d->behind_memcache = 1;
    if (hwloc_bitmap_list_snprintf(d->cpus, sizeof(d->cpus), n->cpuset) >= (int)sizeof(d->cpus))
      snprintf(d->cpus + sizeof(d->cpus) - 4, 4, "...");
    d->loc = calloc((size_t)ncl, 1);
    if (d->loc == NULL) {
      rc = -ENOMEM;
      goto out_cl;
    }
    for (int c = 0; c < ncl; c++) {
      if (hwloc_bitmap_isequal(n->cpuset, cl[c].set))
        d->loc[c] = COLL_NUMA_LOC_SAME;
      else if (!hwloc_bitmap_iszero(n->cpuset) && hwloc_bitmap_isincluded(cl[c].set, n->cpuset))
        d->loc[c] = COLL_NUMA_LOC_WIDER;
    }
  }
  /* sort nodes by OS index, keeping loc with them */
  qsort(topo->nodes, (size_t)nn, sizeof(*topo->nodes), discover_node_cmp);

out_cl:
  for (int c = 0; c < ncl; c++)
    hwloc_bitmap_free(cl[c].set);
  free(cl);
  return rc;
}

/* Memory-side caches the kernel describes in sysfs under root ("" or "/":
 * this machine), for topologies where hwloc shows none: each node with a
 * memory_side_cache directory is behind one cache per indexN entry (at least
 * one), of indexN/size bytes. Facts only: the plan decides what they mean. */
static void discover_sysfs_memcaches(coll_numa_topo_t *topo, const char *root) {
  char path[4096], line[64];
  size_t rl = strlen(root);
  while (rl > 0 && root[rl - 1] == '/')
    rl--;
  for (int i = 0; i < topo->nnodes; i++) {
    coll_numa_node_t *n = &topo->nodes[i];
    struct stat st;
    snprintf(path, sizeof(path), "%.*s/sys/devices/system/node/node%u/memory_side_cache", (int)rl,
             root, n->os_index);
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
      continue;
    int levels = 0;
    DIR *d = opendir(path);
    for (struct dirent *e = d ? readdir(d) : NULL; e != NULL; e = readdir(d)) {
      if (strncmp(e->d_name, "index", 5) != 0)
        continue;
      char sz[sizeof(path) + sizeof(e->d_name) + 8];
      snprintf(sz, sizeof(sz), "%s/%s/size", path, e->d_name);
      FILE *f = fopen(sz, "re");
      if (f != NULL && fgets(line, sizeof(line), f) != NULL)
        topo->memcache_bytes += strtoull(line, NULL, 10);
      if (f != NULL)
        fclose(f);
      levels++;
    }
    if (d != NULL)
      closedir(d);
    topo->nmemcaches += levels > 0 ? levels : 1;
    topo->memcache_sysfs = 1;
    n->behind_memcache = 1;
  }
}

/* Where this load's sysfs lives: the directory given, this machine's "/" (or
 * the user's HWLOC_FSROOT), or NULL when hwloc read no sysfs (XML, synthetic). */
static const char *discover_sysfs_root(const char *path, int is_dir) {
  if (path != NULL)
    return is_dir ? path : NULL;
  const char *x = getenv("HWLOC_XMLFILE"), *y = getenv("HWLOC_SYNTHETIC");
  if ((x != NULL && *x != '\0') || (y != NULL && *y != '\0'))
    return NULL;
  const char *r = getenv("HWLOC_FSROOT");
  return r != NULL && *r != '\0' ? r : "/";
}

/* Containers on cgroup v1: hwloc looks for this process's cpuset under its
 * host path below the cpuset mount, but the container has its own cgroup
 * mounted there, so hwloc finds nothing and allows every CPU of the host; a
 * rank planned outside --cpuset-cpus then cannot be bound. The file at the
 * mount's root is the container's cpuset (on a host: every CPU), so the
 * topology of this machine is restricted to it. Not the affinity mask: a
 * launcher may have pinned each rank already, and every rank must plan the
 * same topology. */
static void discover_restrict_to_cgroup(hwloc_topology_t t, coll_numa_topo_t *topo) {
  static const char *const files[] = {"/sys/fs/cgroup/cpuset/cpuset.effective_cpus",
                                      "/sys/fs/cgroup/cpuset/cpuset.cpus",
                                      "/sys/fs/cgroup/cpuset.cpus.effective"};
  char line[4096] = "";
  const char *from = NULL;
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]) && from == NULL; i++) {
    FILE *f = fopen(files[i], "re");
    if (f == NULL)
      continue;
    if (fgets(line, sizeof(line), f) != NULL && line[0] >= '0' && line[0] <= '9')
      from = files[i];
    fclose(f);
  }
  hwloc_bitmap_t set = from ? hwloc_bitmap_alloc() : NULL;
  if (set == NULL)
    return;
  hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(t);
  char before[96], after[96];
  hwloc_bitmap_list_snprintf(before, sizeof(before), all);
  line[strcspn(line, " \n")] = '\0'; /* hwloc parses "0\n" as an empty set */
  if (hwloc_bitmap_list_sscanf(set, line) == 0) {
    hwloc_bitmap_and(set, set, all);
    hwloc_bitmap_list_snprintf(after, sizeof(after), set);
    if (!hwloc_bitmap_iszero(set) && !hwloc_bitmap_isequal(set, all) &&
        hwloc_topology_restrict(t, set, 0) == 0)
      snprintf(topo->note, sizeof(topo->note),
               "hwloc saw PUs %s, the cgroup cpuset (%s) allows %s: planning on those", before,
               from, after);
  }
  hwloc_bitmap_free(set);
}

void coll_numa_topo_free(coll_numa_topo_t *topo) {
  if (topo == NULL)
    return;
  for (int c = 0; topo->clusters != NULL && c < topo->nclusters; c++) {
    for (int i = 0; i < topo->clusters[c].ncores; i++)
      free(topo->clusters[c].cores[i].pus);
    free(topo->clusters[c].cores);
  }
  free(topo->clusters);
  for (int i = 0; topo->nodes != NULL && i < topo->nnodes; i++)
    free(topo->nodes[i].loc);
  free(topo->nodes);
  if (topo->hwloc != NULL)
    hwloc_topology_destroy((hwloc_topology_t)topo->hwloc);
  free(topo);
}

int coll_numa_topo_ncores(const coll_numa_topo_t *topo) {
  int n = 0;
  for (int c = 0; c < topo->nclusters; c++)
    n += topo->clusters[c].ncores;
  return n;
}

/* set or unset an environment variable, remembering the old value */
typedef struct {
  const char *name;
  char *old; /* NULL: was unset */
} discover_env_t;

static int discover_env_set(discover_env_t *e, const char *name, const char *value) {
  const char *o = getenv(name);
  e->name = name;
  e->old = o ? strdup(o) : NULL;
  if (o != NULL && e->old == NULL)
    return -ENOMEM;
  return setenv(name, value, 1) == 0 ? 0 : -errno;
}

static void discover_env_restore(discover_env_t *e) {
  if (e->name == NULL)
    return;
  if (e->old != NULL)
    setenv(e->name, e->old, 1);
  else
    unsetenv(e->name);
  free(e->old);
  e->name = NULL;
  e->old = NULL;
}

int coll_numa_topo_load(const char *path, coll_numa_topo_t **topo_p) {
  struct stat st;
  int is_dir = 0, rc;
  if (path != NULL) {
    if (stat(path, &st) != 0)
      return -errno;
    is_dir = S_ISDIR(st.st_mode);
  }
  coll_numa_topo_t *topo = calloc(1, sizeof(*topo));
  if (topo == NULL)
    return -ENOMEM;
  snprintf(topo->source, sizeof(topo->source), "%s", path ? path : "this machine");

  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) {
    rc = discover_errno();
    goto out_topo;
  }
  hwloc_topology_set_type_filter(t, HWLOC_OBJ_MEMCACHE, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);

  discover_env_t env[3] = {{0}};
  if (path != NULL && !is_dir) {
    if (hwloc_topology_set_xml(t, path) != 0) {
      rc = errno == ENOENT ? -ENOENT : -EINVAL;
      goto out_hwloc;
    }
  } else if (path != NULL) {
    /* hwloc 2 reads the fsroot only from the environment */
    char hw[4096];
    snprintf(hw, sizeof(hw), "%s/var/run/hwloc", path);
    if ((rc = discover_env_set(&env[0], "HWLOC_FSROOT", path)) != 0 ||
        (rc = discover_env_set(&env[1], "HWLOC_COMPONENTS", "linux,stop")) != 0)
      goto out_env;
    if (stat(hw, &st) == 0 && (rc = discover_env_set(&env[2], "HWLOC_DUMPED_HWDATA_DIR", "/var/run/hwloc")) != 0)
      goto out_env;
  }
  if (hwloc_topology_load(t) != 0) {
    rc = path != NULL ? -EINVAL : discover_errno();
    goto out_env;
  }
  for (int i = 0; i < 3; i++)
    discover_env_restore(&env[i]);
  /* a foreign directory is "this system" for hwloc only if it is "/" */
  topo->thissystem = path == NULL && hwloc_topology_is_thissystem(t);
  if (topo->thissystem)
    discover_restrict_to_cgroup(t, topo);
  if ((rc = discover_fill(t, topo)) != 0)
    goto out_hwloc;
  const char *sysroot = discover_sysfs_root(path, is_dir);
  if (topo->nmemcaches == 0 && sysroot != NULL)
    discover_sysfs_memcaches(topo, sysroot);
  if (path == NULL)
    topo->hwloc = t;
  else
    hwloc_topology_destroy(t);
  *topo_p = topo;
  return 0;

out_env:
  for (int i = 0; i < 3; i++)
    discover_env_restore(&env[i]);
out_hwloc:
  hwloc_topology_destroy(t);
out_topo:
  coll_numa_topo_free(topo);
  return rc;
}
