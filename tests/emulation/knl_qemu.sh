# tests/emulation/knl_qemu.sh - the QEMU NUMA layouts of the emulated KNL modes, sourced by
# tests/emulation/run.sh (the emulation stage) and tests/numa/capture_qemu_fsroot.sh (fixture
# capture), so both boot exactly the same machines. The facts follow
# shared/knl-emulation/qemu-knl.sh:
#   snc4-flat   4 DDR nodes with CPUs + 4 memory-only MCDRAM nodes (node 4+i near quadrant i), KNL CPUID
#   quad-flat   1 DDR node with CPUs + 1 memory-only MCDRAM node, KNL CPUID
#   cache       1 DDR node; MCDRAM is a memory-side cache in HMAT (no HBW node)
#   hmat-flat   as snc4-flat on a generic CPU: HBM found only through HMAT bandwidth
#   snc4-hybrid snc4-flat plus a memory-side cache in front of each DDR node
# (bash; the caller's machine needs hmat=on)

KNL_CPU="qemu64,vendor=GenuineIntel,family=6,model=87,stepping=1,l3-cache=off"

knl_lb() { # initiator target bandwidth latency [hierarchy]: HMAT entries, appended to `a`
  a+=(-numa "hmat-lb,initiator=$1,target=$2,hierarchy=${5:-memory},data-type=access-bandwidth,bandwidth=$3"
      -numa "hmat-lb,initiator=$1,target=$2,hierarchy=${5:-memory},data-type=access-latency,latency=$4")
}

knl_four() { # cpu ncpu: 4 DDR+CPU nodes, 4 memory-only HBM nodes, KNL SLIT 10/21/31/41
  local cpu=$1 ncpu=$2 i t s d c v
  a+=(-cpu "$cpu" -smp "$ncpu,sockets=1,cores=$ncpu,threads=1")
  for i in 0 1 2 3; do a+=(-object "memory-backend-ram,size=256M,id=ddr$i" -numa "node,nodeid=$i,memdev=ddr$i"); done
  for i in 0 1 2 3; do a+=(-object "memory-backend-ram,size=128M,id=hbm$i" -numa "node,nodeid=$((4 + i)),memdev=hbm$i,initiator=$i"); done
  for ((c = 0; c < ncpu; c++)); do a+=(-numa "cpu,node-id=$((c * 4 / ncpu)),socket-id=0,core-id=$c,thread-id=0"); done
  for s in 0 1 2 3 4 5 6 7; do for d in 0 1 2 3 4 5 6 7; do
    [ "$s" -lt "$d" ] || continue
    if [ "$d" -lt 4 ]; then v=21; elif [ "$s" -lt 4 ] && [ "$d" -eq $((s + 4)) ]; then v=31; else v=41; fi
    a+=(-numa "dist,src=$s,dst=$d,val=$v")
  done; done
  for i in 0 1 2 3; do for t in 0 1 2 3 4 5 6 7; do
    if [ "$t" -eq "$i" ]; then knl_lb "$i" "$t" 90G 130; elif [ "$t" -eq $((i + 4)) ]; then knl_lb "$i" "$t" 400G 150
    elif [ "$t" -lt 4 ]; then knl_lb "$i" "$t" 30G 200; else knl_lb "$i" "$t" 40G 250; fi
  done; done
}

knl_numa() { # mode ncpu: append the mode's CPU, memory and NUMA arguments to `a`; 1 if unknown
  local mode=$1 ncpu=$2 i
  case "$mode" in
    snc4-flat) knl_four "$KNL_CPU" "$ncpu" ;;
    hmat-flat) knl_four "qemu64,l3-cache=off" "$ncpu" ;;
    snc4-hybrid)
      knl_four "$KNL_CPU" "$ncpu"
      for i in 0 1 2 3; do
        knl_lb "$i" "$i" 400G 150 first-level
        a+=(-numa "hmat-cache,node-id=$i,size=8M,level=1,associativity=direct,policy=write-back,line=64")
      done ;;
    quad-flat)
      a+=(-cpu "$KNL_CPU" -smp "$ncpu,sockets=1,cores=$ncpu,threads=1"
          -object memory-backend-ram,size=1024M,id=ddr0 -numa node,nodeid=0,memdev=ddr0
          -object memory-backend-ram,size=512M,id=hbm0 -numa node,nodeid=1,memdev=hbm0,initiator=0
          -numa cpu,node-id=0,socket-id=0 -numa dist,src=0,dst=1,val=31)
      knl_lb 0 0 90G 130; knl_lb 0 1 400G 150 ;;
    cache)
      a+=(-cpu "$KNL_CPU" -smp "$ncpu,sockets=1,cores=$ncpu,threads=1"
          -object memory-backend-ram,size=1536M,id=ddr0 -numa node,nodeid=0,memdev=ddr0
          -numa cpu,node-id=0,socket-id=0)
      knl_lb 0 0 90G 130; knl_lb 0 0 400G 150 first-level
      a+=(-numa "hmat-cache,node-id=0,size=16M,level=1,associativity=direct,policy=write-back,line=64") ;;
    *) return 1 ;;
  esac
}
