#!/usr/bin/env bash
# tests/emulation/run.sh - the emulated KNL stage: boot QEMU guests whose NUMA layout is
# that of a Xeon Phi (KNL) or Xeon Max node in a given memory/cluster mode, run
# knl_check (libcoll + numa/, a multi-rank allreduce, move_pages checks) inside, and
# judge each mode from what the guest prints.
#
#   tests/emulation/run.sh [MODE...]     (from the repository root; default: all modes)
#   MODE: snc4-flat quad-flat cache hmat-flat snc4-hybrid
#
# Everything comes from Debian packages: qemu-system-x86, busybox-static and cpio are
# installed when missing, the kernel is Debian's (linux-image-amd64's dependency,
# fetched with `apt-get download` into $KNL_KERNEL_DIR once and reused). TCG only: no
# KVM needed. A guest that hangs is killed and its mode fails: when its console stays
# silent for KNL_IDLE seconds, or at the latest after KNL_TIMEOUT; inside, libcoll's
# HBMCOLL_TIMEOUT (30 s) and a per-run deadline for each rank turn a stuck collective into
# FAIL lines first. Ends with "N passed, N failed" (modes) and exits non-zero on any failure.
#
# Environment:
#   KNL_KERNEL_DIR  kernel cache (default /var/tmp/hbmcoll-knl-kernel)
#   KNL_KERNEL      a vmlinuz to use instead of the cached Debian one
#   KNL_CHECK       the knl_check binary (default build/emulation/knl_check, built if missing)
#   KNL_OUT         logs, initramfs (default build/emulation)
#   KNL_CPUS        guest CPUs = ranks (default 4)
#   KNL_TIMEOUT     most seconds one boot may take (default 300)
#   KNL_IDLE        seconds without console output after which a guest counts as hung (default 90)
#   KNL_DEADLINE    seconds a rank of one knl_check run may take, guest clock (default 100)
#   KNL_JOBS        guests booted at once (default 2)
#   KNL_APPEND      more kernel command line; VAR=value words reach knl_check's environment
#                   (e.g. "HBMCOLL_ALGO=allreduce=rsag", or "KNL_CHECK_STALL=1" to see a hang caught)
#   KNL_TOOLS=1     also put lstopo, numactl and memkind-hbw-nodes in the guest and show their view
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/emulation/knl_qemu.sh
. "$here/knl_qemu.sh"
root=$(cd "$here/../.." && pwd)
cd "$root"

all_modes=(snc4-flat quad-flat cache hmat-flat snc4-hybrid)
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=("${all_modes[@]}")
for m in "${modes[@]}"; do
  case " ${all_modes[*]} " in *" $m "*) ;; *) echo "run.sh: unknown mode $m (know: ${all_modes[*]})" >&2; exit 2 ;; esac
done

kdir=${KNL_KERNEL_DIR:-/var/tmp/hbmcoll-knl-kernel}
out=${KNL_OUT:-build/emulation}
check=${KNL_CHECK:-$out/knl_check}
ncpu=${KNL_CPUS:-4}
tmo=${KNL_TIMEOUT:-300}
idle=${KNL_IDLE:-90}
deadline=${KNL_DEADLINE:-100}
jobs=${KNL_JOBS:-2}
mkdir -p "$out"
say() { echo "emulation: $*"; }

# ---- 1. Debian packages --------------------------------------------------------------
need=()
for p in qemu-system-x86 busybox-static cpio gcc libc6-dev libhwloc-dev libmemkind-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
    || { say "FAIL: could not install ${need[*]}"; exit 1; }
fi
qemu=$(command -v qemu-system-x86_64) || { say "FAIL: no qemu-system-x86_64"; exit 1; }
busybox=/bin/busybox # busybox-static's; put() below would bring libraries of another one

# ---- 2. kernel: Debian's, cached -------------------------------------------------------
kernel=${KNL_KERNEL:-}
if [ -z "$kernel" ]; then
  kernel=$(ls "$kdir"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -1)
  if [ -z "$kernel" ]; then
    say "fetching Debian's kernel into $kdir"
    mkdir -p "$kdir"
    fetch_kernel() { # the package linux-image-amd64 depends on; only its vmlinuz is kept
      local dl ok=1
      pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
      [ -n "$pkg" ] || return 1
      dl=$(mktemp -d "$kdir/dl.XXXXXX")
      if (cd "$dl" && apt-get -o APT::Sandbox::User=root download -qq "$pkg" >/dev/null) &&
         dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -C "$dl" --wildcards './boot/vmlinuz-*'; then
        mkdir -p "$kdir/boot" && mv "$dl"/boot/vmlinuz-* "$kdir/boot/" && ok=0
      fi
      rm -rf "$dl"
      return $ok
    }
    fetch_kernel || { apt-get update -qq; fetch_kernel; } # no or stale package lists: update once
    kernel=$(ls "$kdir"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -1)
  fi
  [ -n "$kernel" ] || { say "FAIL: no kernel (apt-get download ${pkg:-linux-image-*-amd64} failed)"; exit 1; }
fi
say "kernel $kernel"

# ---- 3. knl_check ---------------------------------------------------------------------
if [ ! -x "$check" ]; then
  say "building $check"
  make -s build/emulation/knl_check || { say "FAIL: build"; exit 1; }
  [ "$check" = build/emulation/knl_check ] || cp build/emulation/knl_check "$check"
fi

# ---- 4. initramfs: busybox + knl_check and its libraries ------------------------------
initrd=$out/knl-initrd.cpio.gz
stage=$(mktemp -d)
rm -f "$out"/*.qpid
cleanup() { # also on Ctrl-C: stop the guests this run started (timeout has its own process group)
  local f
  for f in "$out"/*.qpid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
  rm -rf "$stage"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$stage"/{bin,sbin,proc,sys,dev,tmp,run,etc,usr/bin}
put() { # file -> same path in the guest, ELF files with every library ldd lists
  local f=$1 dst=${2:-$1}
  mkdir -p "$stage$(dirname "$dst")" && cp -L "$f" "$stage$dst" || return 1
  if [ "$(head -c4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    { ldd "$f" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r l; do
      [ -e "$stage$l" ] || { mkdir -p "$stage$(dirname "$l")" && cp -L "$l" "$stage$l"; }
    done
  fi
}
put "$busybox" /bin/busybox && put "$check" /usr/bin/knl_check || { say "FAIL: cannot stage the guest's files"; exit 1; }
if [ -n "${KNL_TOOLS:-}" ]; then # diagnostics: the guest also shows what these tools see
  for t in /usr/bin/lstopo-no-graphics /usr/bin/numactl /usr/bin/memkind-hbw-nodes; do
    [ -x "$t" ] && put "$t"
  done
fi
# guest /init: the mode and the rank deadline come on the kernel command line
cat >"$stage/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm /tmp && mount -t tmpfs tmpfs /dev/shm
mode=; deadline=
for w in $(cat /proc/cmdline); do
  case "$w" in knlmode=*) mode=${w#knlmode=} ;; knldeadline=*) deadline=${w#knldeadline=} ;; esac
done
echo "=== guest $mode: $(uname -r), $(nproc) CPUs"
for n in /sys/devices/system/node/node*; do
  bw=$(cat $n/access0/initiators/read_bandwidth 2>/dev/null)
  echo "=== $(basename $n): cpus=[$(cat $n/cpulist)] $(awk '/MemTotal/{print $4 $5}' $n/meminfo) distance=[$(cat $n/distance)]${bw:+ hmat_read_bw=${bw}MiB/s}$([ -d $n/memory_side_cache ] && echo ' memory_side_cache')"
done
if [ -x /usr/bin/lstopo-no-graphics ]; then
  echo "=== lstopo"; lstopo-no-graphics --no-io -v 2>&1 | grep -E "Machine|Group|NUMANode|MemCache|MemorySide"
fi
[ -x /usr/bin/numactl ] && { echo "=== numactl -H"; numactl -H; }
[ -x /usr/bin/memkind-hbw-nodes ] && echo "=== memkind-hbw-nodes: $(memkind-hbw-nodes) (rc=$?)"
# a rank still running at the deadline is killed; a stuck wait fails first (HBMCOLL_TIMEOUT) and says why
export KNL_CHECK_DEADLINE=${deadline:-100} HBMCOLL_TIMEOUT=30 KNL_CHECK_TALLY=/tmp/tally
: >/tmp/tally
lost=0
run() { # one knl_check run with extra settings (VAR=value ...)
  echo "=== run: ${*:-defaults} (guest time $(cut -d' ' -f1 /proc/uptime)s)"
  before=$(wc -l </tmp/tally)
  env "$@" /usr/bin/knl_check --mode "$mode"
  rc=$?
  echo "=== KNL_CHECK_EXIT=$rc"
  # died before its summary, or failed without saying so: one failure more
  if [ "$rc" != 0 ]; then
    if [ "$(wc -l </tmp/tally)" = "$before" ] || [ "$(tail -n1 /tmp/tally | cut -d' ' -f2)" = 0 ]; then lost=$((lost + 1)); fi
  fi
}
run
case "$mode" in
  snc4-flat|hmat-flat) run HBMCOLL_MEMORY=hbm_bind HBMCOLL_ARENA_BYTES=16M ;;
  quad-flat) run HBMCOLL_BIND=cluster HBMCOLL_MEMORY=ddr ;;
  cache) run HBMCOLL_MEMORY=hbm_bind ;;
esac
p=0; f=$lost
while read -r a b; do p=$((p + a)); f=$((f + b)); done </tmp/tally
echo "=== guest $mode total over $(wc -l </tmp/tally) run(s) (guest time $(cut -d' ' -f1 /proc/uptime)s)"
echo "$p passed, $f failed"
poweroff -f
EOF
chmod +x "$stage/init"
(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd" || { say "FAIL: cpio"; exit 1; }
say "initramfs $initrd ($(du -h "$initrd" | cut -f1)), $ncpu CPUs per guest, at most ${tmo}s per boot (${idle}s silent), $jobs at once"

# ---- 5. guests -------------------------------------------------------------------------
# NUMA layouts: tests/emulation/knl_qemu.sh (shared with tests/numa/capture_qemu_fsroot.sh)
qemu_args() { # mode -> the array `a`
  local mode=$1
  a=(-machine pc,hmat=on -accel tcg -m 1536M -nographic -no-reboot -nodefaults -serial stdio
     -kernel "$kernel" -initrd "$initrd"
     -append "console=ttyS0 quiet panic=-1 knlmode=$mode knldeadline=$deadline ${KNL_APPEND:-}")
  knl_numa "$mode" "$ncpu"
}

boot() { # mode name: boots mode, writes $out/<name>.log and $out/<name>.rc
  local mode=$1 log=$out/$2.log t0 rc
  qemu_args "$mode"
  t0=$(date +%s)
  timeout --kill-after=10 "$tmo" "$qemu" "${a[@]}" </dev/null >"$log.raw" 2>&1 &
  local qpid=$! size=-1 last=$t0 now cur hung=0
  echo "$qpid" >"$out/$2.qpid"
  while kill -0 "$qpid" 2>/dev/null; do # watchdog: a silent console means a hung guest
    sleep 1
    now=$(date +%s) cur=$(stat -c %s "$log.raw" 2>/dev/null || echo 0)
    if [ "$cur" != "$size" ]; then size=$cur last=$now
    elif [ $((now - last)) -ge "$idle" ]; then
      hung=1
      kill -TERM "$qpid" 2>/dev/null # timeout passes it on to qemu (and KILLs it 10 s later)
      for _ in $(seq 15); do kill -0 "$qpid" 2>/dev/null || break; sleep 1; done
      if kill -0 "$qpid" 2>/dev/null; then pkill -KILL -P "$qpid"; kill -KILL "$qpid"; fi 2>/dev/null
      break
    fi
  done
  wait "$qpid"
  rc=$?
  rm -f "$out/$2.qpid"
  [ "$hung" = 1 ] && rc=hung
  tr -d '\r' <"$log.raw" >"$log" && rm -f "$log.raw"
  echo "$rc $(($(date +%s) - t0))" >"$out/$2.rc"
}

t_start=$(date +%s)
running=0
names=() # log names: the mode, then mode.2, mode.3 ... when a mode is repeated
for m in "${modes[@]}"; do
  n=$m k=1
  while [[ " ${names[*]} " == *" $n "* ]]; do k=$((k + 1)) n=$m.$k; done
  names+=("$n")
  rm -f "$out/$n.rc" "$out/$n.log"
  boot "$m" "$n" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
# A guest whose kernel stalled before it ran our /init (seen: RCU stalls under TCG on a loaded
# 2-core host, nothing from /init for 300 s) says nothing about hbmcoll: boot it once more.
for n in "${names[@]}"; do
  if ! grep -q '^=== run: ' "$out/$n.log" 2>/dev/null; then
    say "$n: the guest kernel never ran /init (log: $out/$n.log); booting it once more"
    mv "$out/$n.log" "$out/$n.first.log" 2>/dev/null
    boot "${n%%.*}" "$n"
  fi
done

# ---- 6. verdicts: from what each guest printed -----------------------------------------
pass=0 fail=0
for m in "${names[@]}"; do
  log=$out/$m.log
  read -r rc secs <"$out/$m.rc" 2>/dev/null || { rc=255; secs=?; }
  # the guest's last word: its /init's total over every knl_check run
  summary=$(grep -A1 -E '^=== guest .* total over ' "$log" 2>/dev/null | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
  nfail=$(echo "$summary" | sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p')
  npass=$(echo "$summary" | sed -nE 's/^([0-9]+) passed, .*/\1/p')
  why=
  if [ "$rc" = hung ]; then why="guest silent for ${idle}s: hung, killed"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then why="guest still running after ${tmo}s: killed"
  elif [ -z "$summary" ]; then why="no summary line from the guest (qemu exit $rc)"
  elif [ "${nfail:-1}" != 0 ] || [ "${npass:-0}" = 0 ]; then why="checks failed"
  fi
  echo "--- $m (${secs}s): guest says: ${summary:-nothing}"
  grep -E '^(NOTICE|FAIL) ' "$log" | sed 's/^/    /'
  if [ -z "$why" ]; then
    echo "PASS $m"
    pass=$((pass + 1))
  else
    echo "FAIL $m: $why (log: $log)"
    tail -n 15 "$log" | sed 's/^/    | /'
    fail=$((fail + 1))
  fi
done
say "$(( $(date +%s) - t_start ))s for ${#modes[@]} guest(s)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
