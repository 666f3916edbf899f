# hcomm - build, test, lint and install.
#
#   make                 release build of the whole workspace (= make build)
#   make run             build, then the main job: a local 4-rank job that exchanges and verifies
#                        data, then latency/bandwidth and collective tables, then DDP
#                        training step times through torch.distributed, hcomm next to gloo (the
#                        first run sets up $(VENV) as make test does)
#   make test            all tests: installs what is missing (scripts/test-env.sh: system packages,
#                        cargo-nextest, a Python venv in $(VENV) with torch), then the Rust tests
#                        (cargo nextest run --workspace) and the Python tests (pytest python/tests)
#   make lint            rustfmt --check and clippy -D warnings
#   make install         install the release binaries into $(PREFIX)/bin (PREFIX=/usr/local) and
#                        the C library: libhcomm.so/.a, <hcomm/hcomm.h>, hcomm.pc
#   make uninstall       remove what `make install` put there
#   make bench           bench/p2p_tcp.sh: hcomm vs Open MPI over TCP (root: network namespaces)
#   make bench-local     the same on loopback, no namespaces
#   make bench-coll      bench/coll_tcp.sh: hcomm vs Open MPI collectives over TCP (root)
#   make bench-coll-local  the same on loopback, no namespaces
#   make bench-shm       bench/shm.sh: hcomm vs Open MPI (shared memory) on one host, 2 pinned
#                        ranks, then 8 oversubscribed ones
#
# `make install` does not build: run `make` first (as the user who owns the build), then
# `sudo make install`. DESTDIR is honoured for staged installs.

CARGO      ?= cargo
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install
# The Python virtual environment of the tests and the main job (created by scripts/test-env.sh).
VENV       ?= .venv

# Where cargo puts the release build (CARGO_TARGET_DIR moves it).
RELEASE_DIR := $(or $(CARGO_TARGET_DIR),target)/release
# Binaries `make install` installs, each only if it was built.
BINARIES := hcommrun hcomm_perf hcomm_check hcomm_test hcomm_profiler

.PHONY: all build run test test-rust test-python lint fmt-check clippy install install-bin install-capi uninstall \
	bench bench-local bench-coll bench-coll-local bench-shm help

all: build

build:
	$(CARGO) build --release --workspace

# The main job on this machine: verified exchanges on 4 local ranks, every link's check, then
# point-to-point latency/bandwidth and collective tables (2 and 4 ranks).
run: build
	$(RELEASE_DIR)/hcommrun -n 4 -- $(RELEASE_DIR)/hcomm_test --all
	$(RELEASE_DIR)/hcommrun -n 4 -- $(RELEASE_DIR)/hcomm_check all-pairs --max-size 16777216
	$(RELEASE_DIR)/hcommrun -n 4 -- $(RELEASE_DIR)/hcomm_check collectives --max-count 100000
	$(RELEASE_DIR)/hcommrun -n 2 -- $(RELEASE_DIR)/hcomm_perf pingpong -b 8 -e 16M -f 4
	$(RELEASE_DIR)/hcommrun -n 2 -- $(RELEASE_DIR)/hcomm_perf stream -b 8 -e 16M -f 4
	$(RELEASE_DIR)/hcommrun -n 4 -- $(RELEASE_DIR)/hcomm_perf allreduce -b 8 -e 16M -f 4
	HCOMM_VENV=$(VENV) scripts/test-env.sh true
	OMP_NUM_THREADS=1 $(VENV)/bin/python -m torch.distributed.run --nproc-per-node 4 \
		--standalone bench/torch_bench.py --parts ddp --steps 10

test:
	HCOMM_VENV=$(VENV) HCOMM_PREBUILD=1 HCOMM_PY_PROFILE=dev scripts/test-env.sh $(MAKE) --no-print-directory test-rust test-python

test-rust:
	$(CARGO) nextest run --workspace

# The Python tests launch jobs with the tools of the Rust tests' build (target/debug). The whole
# workspace resolves the features as the tests do, so after test-rust this compiles nothing
# (`-p hcomm-tools` alone would build hcomm again with other features). Python writes the
# bytecode of what it imports (PYTHONDONTWRITEBYTECODE, which some images set, is dropped):
# the virtual environment is installed without it (pip --no-compile), and without it every
# process of a torch job compiled torch's modules again (`import torch` 2.7 s against 1.5 s).
test-python:
	$(CARGO) build --workspace --bins
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest python/tests

lint: fmt-check clippy

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

install: install-bin install-capi

install-bin:
	@found=0; \
	for b in $(BINARIES); do \
	  if [ -x "$(RELEASE_DIR)/$$b" ]; then \
	    $(INSTALL) -D -m 0755 "$(RELEASE_DIR)/$$b" "$(DESTDIR)$(BINDIR)/$$b" || exit 1; \
	    echo "installed $(DESTDIR)$(BINDIR)/$$b"; \
	    found=1; \
	  fi; \
	done; \
	if [ $$found = 0 ]; then \
	  echo "make install: none of $(BINARIES) in $(RELEASE_DIR): run 'make' first" >&2; \
	  exit 1; \
	fi

# ---- C API: libhcomm.so / libhcomm.a, <hcomm/hcomm.h>, hcomm.pc --------------
# libhcomm.so.X.Y.Z with the soname libhcomm.so.X (set by crates/hcomm-capi/build.rs) and the
# links libhcomm.so.X and libhcomm.so; libhcomm.a; the header; hcomm.pc for pkg-config. Without
# DESTDIR, as root, ldconfig runs when LIBDIR is a directory the dynamic linker searches (so
# that `gcc example.c -o example -lhcomm` then runs as is); otherwise a note says what to do.
CAPI_HEADER    := crates/hcomm-capi/include/hcomm/hcomm.h
CAPI_PC_IN     := crates/hcomm-capi/hcomm.pc.in
CAPI_VERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
CAPI_SOVERSION := $(firstword $(subst ., ,$(CAPI_VERSION)))
LDCONFIG       ?= ldconfig

install-capi:
	@for f in libhcomm.so libhcomm.a; do \
	  if [ ! -f "$(RELEASE_DIR)/$$f" ]; then \
	    echo "make install: $(RELEASE_DIR)/$$f is missing: run 'make' first" >&2; exit 1; \
	  fi; \
	done
	$(INSTALL) -D -m 0755 "$(RELEASE_DIR)/libhcomm.so" "$(DESTDIR)$(LIBDIR)/libhcomm.so.$(CAPI_VERSION)"
	ln -sf "libhcomm.so.$(CAPI_VERSION)" "$(DESTDIR)$(LIBDIR)/libhcomm.so.$(CAPI_SOVERSION)"
	ln -sf "libhcomm.so.$(CAPI_SOVERSION)" "$(DESTDIR)$(LIBDIR)/libhcomm.so"
	$(INSTALL) -D -m 0644 "$(RELEASE_DIR)/libhcomm.a" "$(DESTDIR)$(LIBDIR)/libhcomm.a"
	$(INSTALL) -D -m 0644 "$(CAPI_HEADER)" "$(DESTDIR)$(INCLUDEDIR)/hcomm/hcomm.h"
	mkdir -p "$(DESTDIR)$(PKGCONFIGDIR)"
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(CAPI_VERSION)|g' \
	    "$(CAPI_PC_IN)" >"$(DESTDIR)$(PKGCONFIGDIR)/hcomm.pc"
	@if [ -n "$(DESTDIR)" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v $(LDCONFIG) >/dev/null 2>&1 && \
	   $(LDCONFIG) -v -N 2>/dev/null | grep -q "^$(LIBDIR):"; then \
	  $(LDCONFIG) && echo "ran $(LDCONFIG): programs linked with -lhcomm find libhcomm.so.$(CAPI_SOVERSION)"; \
	else \
	  echo "note: $(LIBDIR) is not in the dynamic linker's cache: run programs with"; \
	  echo "      LD_LIBRARY_PATH=$(LIBDIR), or add it to /etc/ld.so.conf.d/ and run ldconfig"; \
	fi

uninstall:
	rm -f $(foreach b,$(BINARIES),"$(DESTDIR)$(BINDIR)/$(b)")
	rm -f "$(DESTDIR)$(LIBDIR)/libhcomm.so" "$(DESTDIR)$(LIBDIR)/libhcomm.so.$(CAPI_SOVERSION)" \
	  "$(DESTDIR)$(LIBDIR)/libhcomm.so.$(CAPI_VERSION)" "$(DESTDIR)$(LIBDIR)/libhcomm.a" \
	  "$(DESTDIR)$(INCLUDEDIR)/hcomm/hcomm.h" "$(DESTDIR)$(PKGCONFIGDIR)/hcomm.pc"
	@rmdir "$(DESTDIR)$(INCLUDEDIR)/hcomm" 2>/dev/null || true

bench: build
	bench/p2p_tcp.sh --no-build

bench-local: build
	bench/p2p_tcp.sh --local --no-build

bench-coll: build
	bench/coll_tcp.sh --no-build

bench-coll-local: build
	bench/coll_tcp.sh --local --no-build

bench-shm: build
	bench/shm.sh --no-build

help:
	@sed -n '3,20p' Makefile | sed 's/^# \{0,1\}//'
