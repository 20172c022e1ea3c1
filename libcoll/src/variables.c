/*
 * variables.c - the one list of every HBMCOLL_* variable a user may set, read by libcoll, by
 * the Python package or by the launchers, with what it means and its default.
 *
 * docs/reference.md's table is generated from it (`python3 -m hbmcoll.variables`), and a test
 * checks both ways: docs/reference.md shows exactly this list, and every HBMCOLL_* name the
 * sources read is in it. param.c parses the ones libcoll reads; this file only describes them.
 */
#include "coll.h"

#define V(name, scope, meaning, fallback) {"HBMCOLL_" name, scope, meaning, fallback}

static const coll_variable_t variables[] = {
    /* waiting and errors */
    V("TIMEOUT", "core", "seconds any wait may last before `TimeoutError` (a number > 0); across nodes it also "
      "bounds each wait on another node and the wait at the rendezvous", "no limit (rendezvous: 900 s)"),
    V("STALL_WARN", "core", "seconds of waiting for a live peer before a warning line (then at doubling "
      "intervals); `off` for none", "60"),
    V("LOG", "python", "`warn`, `info` (communicators as they are made) or `debug` (every call with its bytes, "
      "time and algorithm)", "warn"),
    V("TIMELINE", "python", "a file for every rank's calls in Chrome's trace format (Perfetto opens it too)",
      "unset"),
    V("QUIET", "python", "do not print the one-line placement notice", "unset"),
    /* placement */
    V("BIND", "core", "`share` (each rank its share of its cluster's cores), `core` (one core per rank), "
      "`cluster`, `none`", "share"),
    V("MEMORY", "core", "`auto`, `hbm_bind`, `hbm_preferred`, `hbm_interleave`, `ddr`", "auto"),
    V("HBM_NODES", "core", "NUMA nodes to treat as HBM (also `MEMKIND_HBW_NODES`)", "detected"),
    /* algorithms and thresholds */
    V("ALGO", "core", "forced algorithms, e.g. `allreduce=rsag,bcast=flat`; `tree` for barrier, bcast, gather, "
      "reduce and allreduce of one slot", "by size and ranks"),
    V("SMALL_MAX", "core", "allreduce: copy-in \"flat\" up to this many bytes, \"rsag\" above (2 ranks with "
      "private buffers: flat at every size); measured by the tune", "16K"),
    V("STREAM_MIN", "core", "from this many bytes of output, results are written with streaming "
      "(non-temporal) stores: an allreduce's output apart from its input, gather's root output, bcast "
      "receivers; measured by the tune; the creating rank's value holds", "half the largest CPU cache"),
    V("PUSH_MIN", "core", "allreduce with every rank's buffers from `hbmcoll.empty`: from this many bytes each "
      "rank reduces its slice and writes it into every output (\"push\"); measured by the tune",
      "0 (every size past the one-round copy)"),
    V("PUSH_STREAM_MIN", "core", "a push writes with streaming stores from this many bytes; measured by the tune",
      "half the largest CPU cache"),
    V("REP_MOVSB_MIN", "core", "ordinary copies of this many bytes or more use the CPU's `rep movsb` instead of "
      "memcpy; `off` leaves every copy to memcpy; measured by the tune", "1M on AMD Zen 5 and later, else off"),
    V("STAGE_STREAM_MIN", "core", "chunks bcast, gather, allgather and allreduce stage in a slot for a peer "
      "to read are written with streaming stores from this many bytes, so the reader loads them from memory, not from the writer's cache; `off` "
      "for never; measured when a communicator is made (`comm.staging` says what it chose)", "auto"),
    V("SLOT_BYTES", "core", "staging per rank and pipeline stage; measured by the tune", "256K"),
    V("ARENA_BYTES", "core", "shared arena per rank for `hbmcoll.empty` (virtual until used)", "1G"),
    V("CMA", "core", "`1`: large bcast and gather copy straight between the ranks' own buffers "
      "(`process_vm_readv`/`writev`) where the kernel allows it; `gather` or `bcast`: that one only; "
      "`auto`: gather's unless staging measured faster when the communicator was made (`comm.single_copy_probe` "
      "says); `0`: never; measured by the tune", "auto"),
    V("CMA_MIN", "core", "with `HBMCOLL_CMA` on, single copy from this many bytes; measured by the tune", "256K"),
    V("P2P_CELLS", "core", "point-to-point: 4 KiB cells per ordered pair of ranks (at least 2); a message of "
      "up to 4032 bytes takes one, longer ones flow through them where they cannot be read straight from "
      "the sender; only pairs that talk use memory", "8"),
    V("P2P_CMA", "core", "`0`: point-to-point never reads a large message straight from the sender's memory "
      "(`process_vm_readv`), it flows through the cells", "1 (where the kernel allows it)"),
    V("SPIN", "core", "spin iterations before yielding", "long when every rank has a core, short when "
      "oversubscribed"),
    V("TUNE", "python", "`off`: ignore this host's cache of measured thresholds (`python -m hbmcoll.tune`)",
      "the cache is used"),
    V("TUNE_FILE", "python", "where the tune's cache is", "~/.cache/hbmcoll/tuned-HOST.json"),
    /* the job and its rendezvous */
    V("JOB_KEY", "python", "the job's secret (16 bytes or more), the same on its ranks: names the rendezvous on "
      "a node and authenticates nodes to each other; set it for `torch.multiprocessing.spawn`-style jobs "
      "and across nodes", "drawn per job on one node, and across nodes under torchrun (through its store); "
      "else required across nodes (not with mpi4py)"),
    V("RENDEZVOUS_DIR", "python", "meet on a socket file in this directory instead of an abstract socket: "
      "containers sharing only a volume form one job", "unset (abstract socket)"),
    V("RANK", "launcher", "set by `hbmcoll-run` for each rank (also `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`)",
      "torchrun's, mpiexec's or srun's"),
    V("SIZE", "launcher", "the job's ranks, set by `hbmcoll-run`", "the launcher's"),
    V("LOCAL_RANK", "launcher", "the rank's number on its node, set by `hbmcoll-run`", "the launcher's"),
    V("LOCAL_SIZE", "launcher", "the ranks on the node, set by `hbmcoll-run`", "the launcher's"),
    V("KILL_GRACE", "launcher", "seconds `hbmcoll-run` waits after SIGTERM before SIGKILL", "5"),
    /* across nodes */
    V("MASTER", "nodes", "where the nodes meet: the address of rank 0's node (wins over `MASTER_ADDR`); IPv4, "
      "or IPv6 (`fd00::1` or `[fd00::1]`, also a name with only IPv6 addresses)",
      "torchrun's `MASTER_ADDR`; under srun the step's first node"),
    V("PORT", "nodes", "the first TCP port of the rendezvous on that node (one per ring: `PORT + l`)",
      "`MASTER_PORT + 1`, else 29600"),
    V("PORTS", "nodes", "every port the job listens on across nodes, `LO-HI` (at least 512): the rendezvous of "
      "ring l at LO + l, memory servers from LO + 64, point-to-point from LO + 128, the bridge's endpoints "
      "(libfabric tcp) from LO + 256; one range for a firewall to open", "unset: rendezvous at `HBMCOLL_PORT`, "
      "other ports chosen by the system"),
    V("IFACE", "nodes", "the bridge's interface (libfabric's domain: `eth0`, `ib0`, `mlx5_0`)",
      "the one that reaches the rendezvous"),
    V("NODE", "nodes", "this node's name (nodes must differ)", "the hostname"),
    V("PIPELINE_CHUNKS", "core", "chunks of a large allreduce whose node stages overlap the rings (1-255)",
      "measured per size at the first calls"),
    /* memory servers */
    V("MEMSERVERS", "memservers", "the memory servers of `RemoteBuffer` and parameter sharing, `host:port,...` "
      "(IPv6: `[addr]:port`)",
      "set by `hbmcoll-run --memservers`"),
    V("TOKEN", "memservers", "the memory servers' token (16 bytes or more)", "set by `hbmcoll-run --memservers`"),
    V("TOKEN_FILE", "memservers", "a file holding the token, readable by its owner only", "unset"),
    /* torch */
    V("TORCH_DDP_ARENA", "torch", "DDP models over hbmcoll keep their buckets in the shared arena (1) or in "
      "private memory (0)", "1"),
    V("TORCH_INLINE", "torch", "run async collectives in the caller's thread (1) or on the progress thread (0)",
      "1 when the rank may run on one CPU only"),
};

const coll_variable_t *coll_variables(size_t *count_p) {
  if (count_p) *count_p = sizeof variables / sizeof variables[0];
  return variables;
}
