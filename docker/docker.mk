# Container images (docker/README.md). Included from the top Makefile:  include docker/docker.mk
# Each target uses docker when a Docker daemon answers (`docker info`), else podman (installed
# with runc and debootstrap when missing); the base image is built with debootstrap where no
# registry is reachable (docker/build-base.sh).
#   make docker        build hbmcoll:latest (runtime), hbmcoll:torch, hbmcoll:dev
#   make docker-test   build them, then test inside containers (tests/docker/run.sh)
#   make bench-docker  the benchmark suite (--quick) in hbmcoll:dev -> bench/results/docker-<time>/

.PHONY: docker docker-test bench-docker

docker:
	bash docker/build.sh

docker-test:
	bash tests/docker/run.sh

bench-docker:
	bash docker/bench.sh $(BENCH_ARGS)
