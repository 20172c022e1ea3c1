#!/usr/bin/env bash
# tests/numa/capture_qemu_fsroot.sh - make an HWLOC_FSROOT fixture from a QEMU guest.
#
#   tests/numa/capture_qemu_fsroot.sh MODE OUT.tar.bz2     (from the repository root)
#   MODE: any layout of tests/emulation/knl_qemu.sh (only snc4-hybrid is kept as a fixture so far)
#
# Boots Debian's kernel (the one tests/emulation/run.sh caches in $KNL_KERNEL_DIR,
# default /var/tmp/hbmcoll-knl-kernel) with the NUMA/HMAT layout run.sh builds for
# MODE, copies the files hwloc's Linux backend reads (/proc/cpuinfo, /proc/meminfo,
# /sys/devices/system/{cpu,node}: topology, caches, node meminfo/distance/cpumap, HMAT
# access0/access1 and memory_side_cache; uname in /proc/hwloc-nofile-info) into a
# directory named after OUT, and packs it like hwloc-gather-topology would (a tar.bz2
# holding that one directory). tests/numa/fixtures/qemu-knl-snc4-hybrid.tar.bz2 was
# made so: a KNL CPUID (family 6 model 87) with memory-side caches that only sysfs
# shows, since hwloc 2.9's KNL quirk creates no MemCache without the SMBIOS dump.
# The guest layouts are the emulation stage's own (tests/emulation/knl_qemu.sh).
# Needs qemu-system-x86, busybox-static, cpio (what run.sh installs); ~1 min (TCG).
set -euo pipefail
mode=${1:?mode}; out=${2:?output .tar.bz2}
name=$(basename "$out" .tar.bz2)
kernel=${KNL_KERNEL:-$(ls "${KNL_KERNEL_DIR:-/var/tmp/hbmcoll-knl-kernel}"/boot/vmlinuz-* | sort -V | tail -1)}
work=$(mktemp -d) # CAPTURE_KEEP=1 keeps it (console log, initramfs) for a look
trap '[ -n "${CAPTURE_KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
mkdir -p "$work"/stage/{bin,proc,sys,dev,tmp}
cp /bin/busybox "$work/stage/bin/busybox"
cat >"$work/stage/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys
r=/tmp/$name
cp_tree() { # files (by content) and relative symlinks under \$1, minus device plumbing
  find "\$1" \\( -name power -o -name uevent -o -name subsystem -o -name driver -o -name 'memory[0-9]*' \\
              -o -name 'cpu[0-9]*' -path '/sys/devices/system/node/*' \\) -prune -o -print | while read -r f; do
    if [ -L "\$f" ]; then l=\$(readlink "\$f"); case "\$l" in /*) ;; *) mkdir -p "\$r\$(dirname "\$f")"; ln -s "\$l" "\$r\$f" ;; esac
    elif [ -d "\$f" ]; then mkdir -p "\$r\$f"
    elif [ -r "\$f" ]; then mkdir -p "\$r\$(dirname "\$f")"; cat "\$f" >"\$r\$f" 2>/dev/null || rm -f "\$r\$f"; fi
  done
}
mkdir -p \$r/proc
cat /proc/cpuinfo >\$r/proc/cpuinfo; cat /proc/meminfo >\$r/proc/meminfo
# what hwloc-gather-topology records: without Architecture hwloc knows no arch for a foreign fsroot (no KNL quirk)
printf 'OSName: %s\nOSRelease: %s\nOSVersion: %s\nHostName: %s\nArchitecture: %s\n' "\$(uname -s)" "\$(uname -r)" \
  "\$(uname -v)" "\$(uname -n)" "\$(uname -m)" >\$r/proc/hwloc-nofile-info
for f in online possible present kernel_max; do mkdir -p \$r/sys/devices/system/cpu; cat /sys/devices/system/cpu/\$f >\$r/sys/devices/system/cpu/\$f 2>/dev/null; done
for c in /sys/devices/system/cpu/cpu[0-9]*; do cp_tree \$c/topology; cp_tree \$c/cache; done
cp_tree /sys/devices/system/node
echo CAPTURE-BEGIN; tar -C /tmp -cf - $name | gzip -9 | base64; echo CAPTURE-END
poweroff -f
INIT
chmod +x "$work/stage/init"
(cd "$work/stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd"
a=(-machine pc,hmat=on -accel tcg -m 1536M -nographic -no-reboot -nodefaults -serial stdio
   -kernel "$kernel" -initrd "$work/initrd" -append "console=ttyS0 quiet panic=-1")
# shellcheck source=tests/emulation/knl_qemu.sh
. "$(dirname "$0")/../emulation/knl_qemu.sh"
knl_numa "$mode" 4 || { echo "capture_qemu_fsroot.sh: unknown mode $mode" >&2; exit 2; }
timeout 600 qemu-system-x86_64 "${a[@]}" </dev/null | tr -d '\r' >"$work/console"
sed -n '/CAPTURE-BEGIN$/,/^CAPTURE-END$/p' "$work/console" | sed '1d;$d' | base64 -d | gunzip >"$work/fs.tar"
mkdir "$work/x" && tar -C "$work/x" -xf "$work/fs.tar"
tar -C "$work/x" --owner=0 --group=0 --sort=name --mtime=@0 -cjf "$out" "$name"
echo "wrote $out ($(tar tjf "$out" | wc -l) entries)"
